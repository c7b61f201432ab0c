"""An env that crashes must not pass for one that refuses: a KeyError in a write tool is an internal
error of the env — to the client, in run records, to task synthesis and to `envforge check`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import mcp_types as types
from mcp import Client
from typer.testing import CliRunner

from envforge.cli.main import app
from envforge.harness import EvalConfig, run_eval
from envforge.server import ERROR_META_KEY, Fleet, build_app, load_env
from envforge.synth import SynthConfig, synthesize, tasks_jsonl

from support.paths import FIXTURES
from support.serving import ServerThread
from support.shop import write_shop_env

ATTACK_SHOP = FIXTURES / "attack_shop"
REFUSAL = 'raise ToolError("only pending orders can be cancelled")'
CRASH = 'raise KeyError("boom")  # a bug where a refusal belongs'


def _text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_keyerror_in_a_write_tool_is_an_env_error_over_http_not_a_refusal() -> None:
    fleet = Fleet([load_env(ATTACK_SHOP)], ttl_seconds=600)
    with ServerThread(build_app(fleet)) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            ep = (await http.post("/control/episodes", json={"env": "attack_shop"})).json()
            async with Client(server.url + ep["mcp_path"]) as client:
                crashed = await client.call_tool("crash_on_lookup", {"text": "lost"})
                refused = await client.call_tool("count_rows", {"table": "secrets"})
            state = (await http.get(f"/control/episodes/{ep['episode_id']}/state")).json()["state"]
    assert crashed.is_error and (crashed.meta or {}).get(ERROR_META_KEY) == "env_error"
    assert "internal error of the environment" in _text(crashed) and "KeyError" in _text(crashed)
    assert _text(crashed) != "Error: 'boom'" and "'boom'" not in _text(crashed)
    assert refused.is_error and (refused.meta or {}).get(ERROR_META_KEY) == "refused"
    assert _text(refused) == "Error: unknown table secrets"
    assert [n["text"] for n in state["notes"]] == ["first"]


def _crashing_shop(root: Path) -> Path:
    """The synthesis tests' shop, whose cancel_order crashes where it should refuse."""
    write_shop_env(root, lucky=False)
    tools = root / "tools.py"
    text = tools.read_text()
    assert REFUSAL in text
    tools.write_text(text.replace(REFUSAL, CRASH))
    return root


def test_synthesis_never_ships_an_env_error_as_an_expected_refusal(tmp_path: Path) -> None:
    env = load_env(_crashing_shop(tmp_path / "shop"))
    report = asyncio.run(synthesize(env, 6, 3, SynthConfig(min_calls=2, max_calls=6, p_refusal=1.0)))
    assert report.tasks
    refusals = [n for t in report.tasks for n in t.dag.nodes if n.kind == "call" and n.expect_error]
    assert not refusals, [n.call for n in refusals]


def test_check_fails_a_task_whose_expected_refusal_is_an_env_error(tmp_path: Path) -> None:
    """Tasks synthesized where cancel_order refuses, then checked against an env where it crashes."""
    root = write_shop_env(tmp_path / "shop", lucky=False)
    env = load_env(root)
    report = asyncio.run(synthesize(env, 8, 3, SynthConfig(min_calls=2, max_calls=6, p_refusal=1.0)))
    with_refusal = [
        t
        for t in report.tasks
        if any(n.kind == "call" and n.expect_error and n.call.name == "cancel_order" for n in t.dag.nodes)
    ]
    assert with_refusal, "the synthesis should have kept a task with an expected refusal"
    (root / "tasks.jsonl").write_text(tasks_jsonl(with_refusal))
    passed = CliRunner().invoke(app, ["check", str(root)])
    assert passed.exit_code == 0, passed.output
    _crashing_shop(root)  # same tasks, but the refusal is now a crash
    failed = CliRunner().invoke(app, ["check", str(root)])
    assert failed.exit_code == 1, failed.output
    assert "refusals" in failed.output
    # the harness counts them: the oracle replaying those tasks meets the crash once per task
    ids = [t.id for t in with_refusal]
    _, records = asyncio.run(run_eval([root], EvalConfig(agent="oracle", task_ids=ids), tmp_path / "run"))
    assert [r.env_errors for r in records] == [1] * len(with_refusal)


def test_old_run_records_without_the_count_still_read() -> None:
    from envforge.harness import TrialRecord

    new = TrialRecord(
        run_id="r",
        trial_key="e/t/0",
        env="e",
        task_id="t",
        trial=0,
        seed=1,
        status="completed",
        termination="user_stop",
        messages=[],
        started_at=0.0,
        duration_s=0.0,
        agent="oracle",
        user="scripted",
    )
    old = new.model_dump(mode="json")
    del old["env_errors"]
    assert TrialRecord.model_validate(old).env_errors == 0
