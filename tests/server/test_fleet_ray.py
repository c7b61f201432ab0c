"""`envforge serve --ray ADDRESS --workers 2`: one URL, the workers in Ray actors on two nodes.

A real local multi-node Ray cluster (`ray.cluster_utils.Cluster`: a head with no CPU and two nodes
with one CPU each, so the two one-CPU actors must land on different nodes), the real CLI as the
front in its own process (a Ray driver), the stock MCP client over streamable HTTP. `ray` is
imported unconditionally: CI installs the extra, so a missing ray is a failure, not a skip."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import anyio
import httpx
import pytest
from mcp import Client
from ray.cluster_utils import Cluster

from support.paths import BANK_DIR, ENVS
from support.serving import envforge_serve, free_port, run_envforge


def _text(result: object) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(2):
            nodes.add_node(num_cpus=1)
        nodes.wait_for_nodes()
        yield nodes
    finally:
        nodes.shutdown()


@pytest.fixture(scope="module")
def front(cluster: Cluster) -> Iterator[str]:
    args = ["--workers", "2", "--ray", cluster.address]
    with envforge_serve([str(BANK_DIR), str(ENVS / "library")], args=args, timeout_s=120) as url:
        yield url


async def _create(http: httpx.AsyncClient, n: int) -> list[dict]:
    made = []
    for _ in range(n):
        answer = await http.post("/control/episodes", json={"env": "bank"})
        assert answer.status_code == 201, answer.text
        made.append(answer.json())
    return made


async def _balance(http: httpx.AsyncClient, episode_id: str, account: str) -> float:
    state = await http.get(f"/control/episodes/{episode_id}/state")
    assert state.status_code == 200, state.text
    return {a["account_id"]: a["balance"] for a in state.json()["state"]["accounts"]}[account]


async def test_episodes_on_actors_on_two_nodes_each_reached_through_the_one_url(front):
    async with httpx.AsyncClient(base_url=front, timeout=60) as http:
        stats = (await http.get("/control/stats")).json()
        assert stats["workers"] == 2 and len(set(stats["worker_nodes"]) - {None}) == 2, stats
        made = await _create(http, 8)
        assert {ep["episode_id"][:5] for ep in made} == {"w0g0-", "w1g0-"}

        async def play(i: int, ep: dict) -> None:
            async with Client(front + ep["mcp_path"]) as client:  # a real MCP session per episode
                moved = await client.call_tool("transfer", {"src": "A-1", "dst": "A-2", "amount": 1 + i})
                assert not moved.is_error, _text(moved)

        async with anyio.create_task_group() as tg:
            for i, ep in enumerate(made):
                tg.start_soon(play, i, ep)
        for i, ep in enumerate(made):  # each episode's own transfer, read back from its owner
            assert await _balance(http, ep["episode_id"], "A-2") == 50.0 + 1 + i, ep["episode_id"]
        # the workers listen on their nodes' addresses, but answer only the front: a client that
        # finds one cannot go round the front's token, guard and caps, even with a capability URL
        for address in stats["worker_addresses"]:
            direct = httpx.post(f"http://{address}/control/episodes", json={"env": "bank"}, timeout=10)
            assert direct.status_code == 403, direct.text
        owner = stats["worker_addresses"][int(made[0]["episode_id"][1])]
        assert httpx.post(f"http://{owner}{made[0]['mcp_path']}", json={}, timeout=10).status_code == 403
        for ep in made:
            assert (await http.delete(f"/control/episodes/{ep['episode_id']}")).json() == {"closed": True}


def test_envforge_eval_plays_on_the_cluster_through_the_one_url(front, tmp_path) -> None:
    args = ["eval", str(ENVS / "library"), "--agent", "oracle", "--limit", "4", "--concurrency", "4"]
    done = run_envforge(*args, "--server", front, "--out", str(tmp_path / "run"), "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    trials = [json.loads(line) for line in (tmp_path / "run" / "trials.jsonl").read_text().splitlines()]
    assert len(trials) == 4 and all(t["reward"] == 1.0 for t in trials), done.stdout


def test_bad_ray_settings_are_one_line_errors(cluster: Cluster) -> None:
    """Each fails fast: an address where nothing listens would have ray retry it for minutes."""
    cases = {
        ("--ray", f"127.0.0.1:{free_port()}"): "cannot reach the Ray cluster at '127.0.0.1:",
        ("--ray", cluster.address, "--workers", "3"): "has 2 CPUs; --workers 3 needs 3",
        ("--ray", cluster.address, "--transport", "stdio"): "--ray is for HTTP",
    }
    for args, message in cases.items():
        done = run_envforge("serve", str(BANK_DIR), "--port", "0", *args, timeout=60)
        said = done.stdout + done.stderr
        assert done.returncode == 2 and message in said and "Traceback" not in said, said


async def test_a_killed_actor_loses_only_its_episodes_and_comes_back(front):
    """Last in the module: it kills worker 0's actor (a crashed node process, as Ray sees it)."""
    async with httpx.AsyncClient(base_url=front, timeout=60) as http:
        made = await _create(http, 4)
        stats = (await http.get("/control/stats")).json()
        gen = {ep["episode_id"][:5] for ep in made}
        assert gen == {"w0g0-", "w1g0-"}, gen
        os.kill(stats["worker_pids"][0], signal.SIGKILL)
        deadline = time.monotonic() + 90
        while True:
            now = (await http.get("/control/stats")).json()
            if now["worker_restarts"] >= 1 and (await http.get("/healthz")).json()["up"] == 2:
                break
            assert time.monotonic() < deadline, "the actor did not come back"
            await anyio.sleep(0.3)
        assert now["worker_pids"][0] != stats["worker_pids"][0]
        assert len(set(now["worker_nodes"]) - {None}) == 2, now  # placed again on the freed node
        for ep in made:
            if ep["episode_id"].startswith("w0g0-"):
                gone = await http.get(f"/control/episodes/{ep['episode_id']}/state")
                assert gone.status_code == 410 and "episode lost: its worker exited" in gone.json()["error"]
                assert (await http.post(ep["mcp_path"], json={})).status_code == 410
            else:
                async with Client(front + ep["mcp_path"]) as client:
                    moved = await client.call_tool("transfer", {"src": "A-1", "dst": "A-2", "amount": 5})
                    assert not moved.is_error, _text(moved)
                assert await _balance(http, ep["episode_id"], "A-2") == 55.0
        # the dead actor's worker went with it: nothing listens at its old address any more
        old = stats["worker_addresses"][0]
        while True:
            try:
                httpx.get(f"http://{old}/healthz", timeout=2)
            except httpx.TransportError:
                break
            assert time.monotonic() < deadline, f"the dead actor's worker still listens at {old}"
            await anyio.sleep(0.3)
        fresh = await _create(http, 2)
        assert {ep["episode_id"][:5] for ep in fresh} == {"w0g1-", "w1g0-"}
        for ep in fresh:
            async with Client(front + ep["mcp_path"]) as client:
                assert not (await client.call_tool("get_account", {"account_id": "A-1"})).is_error
