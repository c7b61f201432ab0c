"""One τ² telecom episode driven by two outside MCP clients, the agent's and the user's.

The imported env is served over streamable HTTP on 127.0.0.1 (an ephemeral port). The control
plane creates an episode from a train task's initial state (its `state`, as τ²'s initialization
leaves it), a stock MCP client on the agent URL plays the gold's assistant calls and another on
the user URL (`user_mcp_path`) the user's, in τ²'s order: every output is τ²'s, and the episode's
export has both of τ²'s final hashes. Attacks: a user call into another episode, through that
episode's id with this episode's key, this episode's id with that episode's key, or the user
endpoint naming that episode in `_meta`; each is refused and the other episode keeps its state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import Client

from envforge.server import EPISODE_META_KEY, Environment, Fleet, State, build_app, load_env
from envforge.synth import (
    Task,
    apply_diff,
    import_tau2_env,
    primary_keys,
    tau2_db_hash,
    telecom_state_to_tau2_db,
    telecom_state_to_tau2_user_db,
)

from support.paths import TAU2_RETAIL
from support.serving import ServerThread

TELECOM = TAU2_RETAIL.parent / "telecom"
NO_DATA = f"τ²-bench telecom reference data (outside the repo, not copyable into it) not found at {TELECOM}"
# A user and an agent taking turns, and a payment: the user's call reaches the carrier's bill.
TASK = "[service_issue]airplane_mode_on|overdue_bill_suspension|unseat_sim_card[PERSONA:Easy]"

pytestmark = pytest.mark.skipif(not (TELECOM / "gold_replays_train.jsonl").is_file(), reason=NO_DATA)


def _gold() -> dict[str, Any]:
    path = TELECOM / "gold_replays_train.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return next(r for r in rows if r["task_id"] == TASK)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Environment, Task]:
    env_dir: Path = tmp_path_factory.mktemp("tau2mcp") / "tau2_telecom"
    tasks = import_tau2_env(TELECOM, env_dir).tasks
    assert tasks is not None
    return load_env(env_dir), next(t for t in tasks if t.id == TASK)


@pytest.fixture(scope="module")
def served(imported: tuple[Environment, Task]):  # type: ignore[no-untyped-def]
    env, _ = imported
    with ServerThread(build_app(Fleet([env], ttl_seconds=600))) as server:
        yield server


def _text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _hashes(state: State) -> tuple[str, str]:
    return tau2_db_hash(telecom_state_to_tau2_db(state)), tau2_db_hash(telecom_state_to_tau2_user_db(state))


def _key(episode: dict[str, str]) -> str:
    return episode["user_mcp_path"].split("/user/")[1].split("/")[0]


async def _state(http: httpx.AsyncClient, episode_id: str) -> State:
    answer = await http.get(f"/control/episodes/{episode_id}/state")
    assert answer.status_code == 200, answer.text
    state: State = answer.json()["state"]
    return state


async def test_two_outside_clients_play_a_telecom_gold(
    imported: tuple[Environment, Task], served: ServerThread
) -> None:
    env, task = imported
    gold = _gold()
    initial = apply_diff(primary_keys(env.tables), env.seed_state(), task.setup)
    assert _hashes(initial) == (gold["post_init_db_hash"], gold["post_init_user_db_hash"])
    async with httpx.AsyncClient(base_url=served.url) as http:
        made = [
            await http.post("/control/episodes", json={"env": env.name, "state": initial}) for _ in range(2)
        ]
        assert [m.status_code for m in made] == [201, 201], [m.text for m in made]
        ep, other = (m.json() for m in made)
        async with (
            Client(served.url + ep["mcp_path"]) as agent,
            Client(served.url + ep["user_mcp_path"]) as user,
        ):
            assert len((await agent.list_tools()).tools) == 13 and len((await user.list_tools()).tools) == 30
            for i, action in enumerate(gold["actions"]):
                client = user if action["requestor"] == "user" else agent
                result = await client.call_tool(action["name"], action["arguments"])
                where = f"action {i} {action['requestor']} {action['name']}"
                assert bool(result.is_error) == gold["output_is_error"][i], (where, _text(result))
                assert _text(result) == gold["outputs"][i], where
            # the user's URL reaches no other episode, whichever way it names one
            r = await user.call_tool("toggle_airplane_mode", {}, meta={EPISODE_META_KEY: other["episode_id"]})
            assert r.is_error and "bound to episode" in _text(r)
        final = await _state(http, ep["episode_id"])
        assert _hashes(final) == (gold["final_db_hash"], gold["final_user_db_hash"])
        assert telecom_state_to_tau2_user_db(final) == gold["final_user_db"]

        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        for path in (
            f"/envs/{env.name}/episodes/{other['episode_id']}/user/{_key(ep)}/mcp",
            f"/envs/{env.name}/episodes/{ep['episode_id']}/user/{_key(other)}/mcp",
            f"/envs/{env.name}/episodes/{other['episode_id']}/user/mcp",
        ):
            answer = await http.post(path, content=json.dumps(body), headers=headers)
            assert answer.status_code == 404, (path, answer.status_code)
        untouched = await _state(http, other["episode_id"])
        assert _hashes(untouched) == (gold["post_init_db_hash"], gold["post_init_user_db_hash"])
