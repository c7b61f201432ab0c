"""The top-level Python API (`import envforge`) on the bundled envs, used as a script would use it
and as a reward-hunting caller would try to bend it: episodes that leak into each other, a
tampered task slipping through `check_tasks`, a run that silently overwrites another, an agent
that does nothing and still scores."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

import envforge
from envforge.harness import RunExists

from support.paths import REPO

RETAIL = REPO / "envs" / "retail_orders"


@pytest.fixture(scope="module")
def retail() -> envforge.Environment:
    return envforge.load_env(RETAIL)


def _seed_write_task(retail: envforge.Environment) -> envforge.Task:
    """A shipped task that starts from the seed state and writes, every golden call succeeding (no
    write the task expects to be refused)."""
    return next(
        t
        for t in envforge.load_tasks(RETAIL)
        if not t.setup
        and t.golden_diff
        and len(t.golden_calls) >= 2
        and not any(n.kind == "call" and n.expect_error for n in t.dag.nodes)
    )


def test_an_episode_of_golden_calls_reaches_the_golden_state_and_leaks_into_no_other(
    retail: envforge.Environment,
) -> None:
    task = _seed_write_task(retail)
    seed_hash = envforge.run_episode(retail, []).state_hash
    played = envforge.run_episode(RETAIL, task.golden_calls)  # a folder path works as well as an env
    assert played.env == "retail_orders"
    assert all(r.kind == "ok" for r in played.results), [r.text for r in played.results]
    assert played.state_hash == task.golden_hash != seed_hash
    assert envforge.run_episode(retail, []).state_hash == seed_hash  # the writes stayed in their episode


def test_bad_calls_are_answered_as_the_agent_would_see_them_and_the_episode_goes_on(
    retail: envforge.Environment,
) -> None:
    task = _seed_write_task(retail)
    bad = [
        envforge.Call(name="drop_all_tables", arguments={}),
        envforge.Call(name="get_order", arguments={"order_id": 7, "extra": "x"}),
        envforge.Call(name="get_order", arguments={"order_id": "O-0000"}),
    ]
    played = envforge.run_episode(retail, [*bad, *task.golden_calls])
    assert [r.kind for r in played.results[:3]] == ["invalid", "invalid", "refused"]
    assert all(r.is_error for r in played.results[:3])
    assert played.state_hash == task.golden_hash  # nothing the bad calls did survived


async def test_the_fleet_ends_its_episodes_with_the_async_with_block(retail: envforge.Environment) -> None:
    async with envforge.Fleet([retail]) as fleet:
        episode = await fleet.create_episode("retail_orders")
        assert (await fleet.call(episode.id, "get_product", {"product_id": "P-104"})).kind == "ok"
    with pytest.raises(KeyError):
        fleet.store.get(episode.id)


def test_check_tasks_fails_a_tampered_task_and_passes_the_shipped_ones(retail: envforge.Environment) -> None:
    shipped = envforge.load_tasks(RETAIL)[:2]
    # a hand edit that drops the calls after the first: they no longer reach the task's golden state
    forged = shipped[0].model_copy(update={"id": "forged", "golden_calls": shipped[0].golden_calls[:1]})
    checks = envforge.check_tasks(retail, [*shipped, forged])
    assert [c.task_id for c in checks] == [shipped[0].id, shipped[1].id, "forged"]
    assert [c.passed for c in checks] == [True, True, False]
    # its calls neither earn the reward nor reach the golden end state the task stores
    assert checks[2].failures == ["golden_replay", "stored_golden"]
    adversaries = {"spray", "read_all", "double_write", "golden_prefix", "skip_policy", "copy_result"}
    assert set(checks[0].adversary_rewards) == adversaries


def test_check_tasks_without_tasks_reads_the_env_folder_and_refuses_one_without_them(tmp_path: Path) -> None:
    assert len(envforge.check_tasks(RETAIL)) == len(envforge.load_tasks(RETAIL))
    bare = tmp_path / "retail_orders"
    bare.mkdir()
    for f in RETAIL.iterdir():
        if f.is_file() and f.name != "tasks.jsonl":
            (bare / f.name).write_bytes(f.read_bytes())
    with pytest.raises(FileNotFoundError, match="envforge synth tasks"):
        envforge.check_tasks(bare)


def test_synthesized_tasks_are_the_shipped_ones_and_pass_their_checks(retail: envforge.Environment) -> None:
    report = envforge.synthesize_tasks(retail, 2, seed=0)
    assert [t.model_dump() for t in report.tasks] == [t.model_dump() for t in envforge.load_tasks(RETAIL)[:2]]
    assert all(c.passed for c in envforge.check_tasks(retail, report.tasks))
    with pytest.raises(ValueError, match="at least 1"):
        envforge.synthesize_tasks(retail, 0)


def test_evaluate_scores_the_oracle_1_and_a_do_nothing_agent_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a run without out= goes
    oracle = envforge.evaluate([RETAIL], envforge.EvalConfig(agent="oracle", limit=2))
    noop = envforge.evaluate([RETAIL], "noop")
    assert oracle.run_dir is None and list(tmp_path.iterdir()) == []  # the temporary run is gone
    assert len(oracle.records) == 2 and oracle.pass_hat_k(1) == oracle.pass_hat_k(1, "retail_orders") == 1.0
    assert len(noop.records) == len(envforge.load_tasks(RETAIL)) and noop.pass_hat_k(1) == 0.0
    with pytest.raises(ValueError, match="between 1 and"):
        oracle.pass_hat_k(2)
    with pytest.raises(ValueError, match="no env 'gym'"):
        oracle.pass_hat_k(1, "gym")


def test_a_kept_run_is_readable_and_never_silently_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = envforge.EvalConfig(agent="oracle", limit=1, trials=2)
    first = envforge.evaluate([RETAIL], config, out=out)
    assert first.run_dir == out and first.pass_hat_k(2) == 1.0
    assert [r.trial_key for r in envforge.read_run(out).records] == [r.trial_key for r in first.records]
    with pytest.raises(RunExists):
        envforge.evaluate([RETAIL], config, out=out)
    resumed = envforge.evaluate([RETAIL], config, out=out, resume=True)  # nothing left to run
    assert resumed.summary == first.summary
    with pytest.raises(ValueError, match="out="):
        envforge.evaluate([RETAIL], config, resume=True)


def test_score_calls_rewards_the_golden_calls_and_not_a_run_that_stops_before_the_writes(
    retail: envforge.Environment,
) -> None:
    """What `envforge score` computes, from Python: each task from its own initial state."""
    task = _seed_write_task(retail)
    golden = envforge.score_calls(retail, task, task.golden_calls, [])
    reads_only = [c for c in task.golden_calls if retail.tools[c.name].read_only]
    partial = envforge.score_calls(RETAIL, task, reads_only, [])
    assert golden.state_match and not partial.state_match and partial.reward < 1.0
