"""τ²'s 114 retail tasks imported as envforge tasks, checked against τ²'s own recorded gold.

The data comes from shared/tau2/retail beside the repository (never copied into it). The env's
tracked files are copied to a temporary folder and imported once per module; golden states there
come from replaying τ²'s gold actions in envforge, and are checked here against τ²'s own hashes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from envforge.cli.import_commands import register
from envforge.server import Environment, Fleet, load_env, state_hash
from envforge.synth import (
    SynthContext,
    Task,
    Tau2ImportError,
    ToolGraph,
    VerifyReport,
    golden_end_state,
    import_tau2_env,
    load_tasks,
    offline_view,
    oracle_messages,
    primary_keys,
    score_episode,
    state_to_tau2_db,
    tau2_db_hash,
    tau2_tasks_to_envforge,
    verify_report,
)

from support.paths import TAU2_RETAIL
from support.skips import TAU2_NO_DATA, tau2_data_missing

RETAIL = TAU2_RETAIL
#: τ²-bench's retail folder as published (no tools.json).
DATA_FILES = ("db.json", "policy.md", "tasks.json", "split_tasks.json")
WRITTEN = ("env.toml", "schema.sql", "tools.py", "seed.json", "policy.md", "tasks.jsonl")
#: The README's "gold leaves the DB unchanged" list.
UNCHANGED = ["10", "12", "24", "25", "50", "57", "62", "65", "67", "68", "105"]

pytestmark = pytest.mark.skipif(tau2_data_missing("tasks.json"), reason=TAU2_NO_DATA)


def _read(name: str) -> Any:
    return json.loads((RETAIL / name).read_text(encoding="utf-8"))


def _gold() -> dict[str, dict[str, Any]]:
    lines = (RETAIL / "gold_replays_train.jsonl").read_text(encoding="utf-8").splitlines()
    return {row["task_id"]: row for row in map(json.loads, filter(str.strip, lines))}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Environment, list[Task]]:
    env_dir = tmp_path_factory.mktemp("tau2tasks") / "tau2_retail"
    tasks = import_tau2_env(RETAIL, env_dir).tasks
    assert tasks is not None
    return load_env(env_dir), tasks


@pytest.fixture(scope="module")
def report(imported: tuple[Environment, list[Task]]) -> VerifyReport:
    env, tasks = imported
    return verify_report(env, tasks)


def test_all_tasks_imported_with_splits(imported: tuple[Environment, list[Task]]) -> None:
    env, tasks = imported
    raw = _read("tasks.json")
    splits = _read("split_tasks.json")
    assert [t.id for t in tasks] == [str(r["id"]) for r in raw]
    assert len(tasks) == 114
    assert load_tasks(env.root) == tasks  # tasks.jsonl holds exactly what was returned
    train = [t.id for t in tasks if "train" in t.split]
    test = [t.id for t in tasks if "test" in t.split]
    assert (len(train), len(test)) == (74, 40)
    assert sorted(train) == sorted(splits["train"]) and sorted(test) == sorted(splits["test"])
    assert all(t.split == [s for s in splits if t.id in splits[s]] for t in tasks)
    assert {t.source for t in tasks} == {"tau2"} and {t.env for t in tasks} == {"tau2_retail"}


def test_fields_are_mapped(imported: tuple[Environment, list[Task]]) -> None:
    _, tasks = imported
    basis = {"DB": "state", "COMMUNICATE": "outputs", "ACTION": "actions", "NL_ASSERTION": "nl_assertions"}
    for task, raw in zip(tasks, _read("tasks.json"), strict=True):
        crit = raw["evaluation_criteria"]
        actions = crit["actions"] or []
        assert [c.model_dump() for c in task.golden_calls] == [
            {"name": a["name"], "arguments": a["arguments"]} for a in actions
        ]
        assert [c.compare_args for c in task.action_checks] == [a.get("compare_args") for a in actions]
        assert [n.call for n in task.dag.nodes] == task.golden_calls
        assert [(e.source, e.target) for e in task.dag.edges] == [
            (f"n{i}", f"n{i + 1}") for i in range(len(actions) - 1)
        ]
        assert task.required_outputs == crit["communicate_info"] == task.scenario.must_be_told
        assert task.nl_assertions == (crit["nl_assertions"] or [])
        assert task.reward_basis == [basis[b] for b in crit["reward_basis"]]
        instructions = raw["user_scenario"]["instructions"]
        for key in ("reason_for_call", "known_info", "unknown_info", "task_instructions"):
            for line in (instructions[key] or "").splitlines():
                assert line in task.scenario.instruction, (task.id, key)
        for fact in task.scenario.known_facts:
            assert fact.value in instructions["known_info"] + instructions["reason_for_call"], task.id
    by_id = {t.id: t for t in tasks}
    assert {(f.name, f.value) for f in by_id["0"].scenario.known_facts} >= {
        ("first_name", "Yusuf"),
        ("last_name", "Rossi"),
        ("zip", "19122"),
        ("order_id", "#W2378156"),
    }
    assert ("email", "mia.garcia2723@example.com") in {
        (f.name, f.value) for f in by_id["10"].scenario.known_facts
    }
    assert [c.compare_args for c in by_id["10"].action_checks if c.name == "transfer_to_human_agents"] == [[]]


def test_errored_gold_calls_are_kept(imported: tuple[Environment, list[Task]]) -> None:
    """τ² keeps gold calls that fail: they stay in golden_calls, flagged as expected errors."""
    _, tasks = imported
    by_id = {t.id: t for t in tasks}
    for task_id, row in _gold().items():
        assert [n.expect_error for n in by_id[task_id].dag.nodes] == row["output_is_error"], task_id
    assert by_id["64"].dag.nodes[6].expect_error and by_id["64"].dag.nodes[6].write
    assert by_id["105"].dag.nodes[0].expect_error and by_id["105"].checkpoints == []
    assert by_id["24"].golden_calls == [] and by_id["57"].golden_calls == []
    for task in tasks:
        ok_writes = [n.id for n in task.dag.nodes if n.write and not n.expect_error]
        assert [c.node for c in task.checkpoints] == ok_writes, task.id
        assert task.difficulty.writes == len(ok_writes) and task.difficulty.calls == len(task.golden_calls)


async def test_golden_replay_matches_state_for_all_tasks(imported: tuple[Environment, list[Task]]) -> None:
    """Each task's own golden replay, scored by the scorer against the stored hash: all 114 match."""
    env, tasks = imported
    fleet = Fleet([env])
    graph = ToolGraph(env=env.name, tools=[], edges=[], state_edges=[])
    ctx = SynthContext(env=env, graph=graph, fleet=fleet, pks=primary_keys(env.tables))
    mismatched = []
    try:
        for task in tasks:
            database, _, _ = ctx.states.task_initial(task)
            state, _ = await ctx.replayer.replay(database, task.golden_calls, hashed=False)
            score = score_episode(offline_view(task), state, oracle_messages(task))
            if not (score.state_match and score.reward == 1.0 and score.checkpoints == 1.0):
                mismatched.append(task.id)
    finally:
        await fleet.aclose()
    assert mismatched == []


def test_golden_hashes_equal_tau2s(imported: tuple[Environment, list[Task]]) -> None:
    """The stored golden diff rebuilds τ²'s own final DB (its hash) for every train task."""
    env, tasks = imported
    by_id = {t.id: t for t in tasks}
    gold = _gold()
    assert len(gold) == 74
    for task_id, row in gold.items():
        golden = golden_end_state(env, by_id[task_id])
        assert state_hash(golden) == by_id[task_id].golden_hash, task_id
        assert tau2_db_hash(state_to_tau2_db(golden)) == row["final_db_hash"], task_id


def test_self_check_failures_are_reported(report: VerifyReport) -> None:
    """Failing tasks are kept and reported; each failure is a known property of τ²'s gold."""
    by_check = report.by_check()
    assert report.total == 114
    assert by_check["not_presatisfied"] == UNCHANGED
    assert by_check["do_nothing"] == UNCHANGED
    assert by_check["golden_replay"] == [] and by_check["deterministic"] == []
    # 22 changes the user's address and changes it back; 110 sets it to the address it already has.
    assert by_check["drop_write"] == ["22", "110"]


def _cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps `import` a subcommand group
    return app


def test_cli_import_is_idempotent(tmp_path: Path) -> None:
    """`envforge import tau2` twice on a few tasks (two of them failing self-checks by design):
    the second run leaves every generated file byte-identical and does not even rewrite it."""
    src = _src_without(tmp_path, "tasks.json")
    (src / "split_tasks.json").unlink()
    keep = ["0", "22", "24", "33"]
    raw = [t for t in _read("tasks.json") if t["id"] in keep]
    (src / "tasks.json").write_text(json.dumps(raw), encoding="utf-8")
    splits = {name: [i for i in ids if i in keep] for name, ids in _read("split_tasks.json").items()}
    (src / "split_tasks.json").write_text(json.dumps(splits), encoding="utf-8")
    env_dir = tmp_path / "out" / "tau2_retail"
    args = ["import", "tau2", str(src), "-o", str(env_dir)]
    first = CliRunner().invoke(_cli(), args)
    assert first.exit_code == 0, first.output
    before = {n: ((env_dir / n).read_bytes(), (env_dir / n).stat().st_mtime_ns) for n in WRITTEN}
    second = CliRunner().invoke(_cli(), args)
    assert second.exit_code == 0, second.output
    assert {n: ((env_dir / n).read_bytes(), (env_dir / n).stat().st_mtime_ns) for n in WRITTEN} == before
    assert [t.id for t in load_tasks(env_dir)] == keep
    out = " ".join(second.output.split())
    assert "│ train │ 3 │" in out and "│ test │ 1 │" in out and "│ base │ 4 │" in out
    assert "│ not_presatisfied │ 1 │ 24 │ initial state already equals golden" in out
    assert "│ drop_write │ 1 │ 22 │" in out and "│ golden_replay │ 0 │ - │" in out


def _src_without(tmp_path: Path, missing: str) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in DATA_FILES:
        if name != missing:
            (src / name).symlink_to(RETAIL / name)
    return src


@pytest.mark.parametrize("missing", ["tasks.json", "split_tasks.json"])
def test_missing_task_file_is_named(tmp_path: Path, missing: str) -> None:
    env_dir = tmp_path / "tau2_retail"
    with pytest.raises(Tau2ImportError, match=rf"{missing}: missing"):
        import_tau2_env(_src_without(tmp_path, missing), env_dir)
    assert not env_dir.exists()  # nothing written


def test_wrong_task_files_are_named(tmp_path: Path) -> None:
    env_dir = tmp_path / "tau2_retail"
    src = _src_without(tmp_path, "tasks.json")
    (src / "tasks.json").write_text("[{not json", encoding="utf-8")
    with pytest.raises(Tau2ImportError, match=r"tasks\.json: invalid JSON"):
        import_tau2_env(src, env_dir)
    raw = _read("tasks.json")[:2]
    raw[1]["evaluation_criteria"]["reward_basis"] = ["DB", "ENV_ASSERTION"]
    (src / "tasks.json").write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(Tau2ImportError, match=r"tasks\.json: task 1: reward basis 'ENV_ASSERTION'"):
        import_tau2_env(src, env_dir)
    raw = _read("tasks.json")[:2]
    raw[1]["evaluation_criteria"]["actions"][0]["name"] = "book_reservation"
    (src / "tasks.json").write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(Tau2ImportError, match=r"task 1: gold action 'book_reservation' is not a tool of"):
        import_tau2_env(src, env_dir)
    assert not env_dir.exists()


def test_wrong_split_file_is_named(imported: tuple[Environment, list[Task]]) -> None:
    env, _ = imported
    raw = _read("tasks.json")[:1]
    with pytest.raises(
        Tau2ImportError, match=r"split_tasks\.json: splits name task ids that tasks\.json lacks"
    ):
        tau2_tasks_to_envforge(raw, RETAIL / "split_tasks.json", env)
    with pytest.raises(Tau2ImportError, match=r"split_tasks\.json: expected an object"):
        tau2_tasks_to_envforge(raw, {"train": "0"}, env)  # type: ignore[dict-item]
    with pytest.raises(Tau2ImportError, match=r"nope\.json: missing"):
        tau2_tasks_to_envforge(RETAIL / "nope.json", RETAIL / "split_tasks.json", env)
