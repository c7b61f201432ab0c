"""One story per task: each task stays on one principal, keeps no read that feeds nothing, and
undoes none of its own writes; synthesis stays byte-deterministic; `--n` beyond what an env
supports stops and says how many.

Written as the attacks a task set must hold against: a task that reads a stranger's order, a read
a policy can skip for free, a booking made and cancelled in one breath. Ownership is recomputed
here from the database itself (SQLite's own foreign-key list), not taken from the walker.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envforge.server import Environment, Fleet, load_env, open_database
from envforge.synth import Task, apply_diff, diff_states, load_tasks, primary_keys, synthesize, tasks_jsonl

from support.paths import REPO, bundled_env_dirs

STOCKED = [p for p in bundled_env_dirs() if (p / "tasks.jsonl").exists()]
REAL_MODEL_ENV = REPO / "envs" / "slack"


def _links(env: Environment, owner_table: str) -> dict[str, tuple[str, str, str]]:
    """Per table that leads to `owner_table` by foreign keys: its first such column (schema
    order) with the table and column it references."""
    conn = open_database(env.seed_db)
    try:
        fks: dict[str, list[tuple[str, str, str]]] = {}
        for t in env.tables:
            for row in conn.execute(f'PRAGMA foreign_key_list("{t.name}")'):
                fks.setdefault(t.name, []).append((row[3], row[2], row[4] or t.primary_key[0]))
    finally:
        conn.close()
    leads = {owner_table}
    while True:
        more = {t for t, refs in fks.items() if t not in leads and any(p in leads for _, p, _ in refs)}
        if not more:
            break
        leads |= more
    columns = {t.name: t.columns for t in env.tables}
    out = {}
    for t in leads - {owner_table}:
        by_col = {c: (c, p, pc) for c, p, pc in reversed(fks[t]) if p in leads}
        out[t] = next(by_col[c] for c in columns[t] if c in by_col)
    return out


def _owner(
    state: dict[str, list[dict[str, Any]]],
    links: dict[str, tuple[str, str, str]],
    owner_table: str,
    owner_key: str,
    table: str,
    row: dict[str, Any],
) -> Any:
    for _ in range(len(links) + 1):
        if table == owner_table:
            return row.get(owner_key)
        col, parent, parent_col = links[table]
        if row.get(col) is None:
            return None
        if parent == owner_table and parent_col == owner_key:
            return row[col]
        found = next((r for r in state.get(parent, []) if r.get(parent_col) == row[col]), None)
        if found is None:
            return None
        table, row = parent, found
    return None


def _strangers_touched(env: Environment, task: Task) -> list[str]:
    """Rows of another principal that a task's golden calls name or its golden run changes."""
    principal = task.dag.principal
    assert principal is not None, f"{task.id}: no principal"
    ((owner_key, me),) = principal.key.items()
    pks = primary_keys(env.tables)
    initial = apply_diff(pks, env.seed_state(), task.setup)
    after = apply_diff(pks, initial, task.golden_diff)
    links = _links(env, principal.table)
    owned_tables = [principal.table, *links]
    owners: dict[Any, tuple[str, Any]] = {}
    for table in owned_tables:
        if len(pks[table]) == 1:
            for row in initial[table]:
                owners[row[pks[table][0]]] = (
                    table,
                    _owner(initial, links, principal.table, owner_key, table, row),
                )
    bad = []
    for call in task.golden_calls:
        for param, value in call.arguments.items():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and item in owners and owners[item][1] not in (None, me):
                    bad.append(f"{call.name}({param}={item!r}): a row of {owners[item][1]}")
    for table, d in task.golden_diff.items():
        if table not in owned_tables:
            continue
        keys = [{c: r[c] for c in pks[table]} for r in d.inserted] + [u.key for u in d.updated]
        for key in keys:
            row = next((r for r in after[table] if all(r.get(c) == v for c, v in key.items())), None)
            if row is not None:
                owner = _owner(after, links, principal.table, owner_key, table, row)
                if owner not in (None, me):
                    bad.append(f"changed {table} {key}: a row of {owner}")
    return bad


def _dead_reads(task: Task) -> list[str]:
    feeds = {e.source for e in task.dag.edges if e.kind == "data"}
    return [
        f"{n.id} {n.call.name}"
        for n in task.dag.nodes
        if n.kind == "call" and n.executed and not n.write and n.id not in feeds
    ]


async def _undone_writes(env: Environment, task: Task) -> list[str]:
    """Replays the golden calls; a write that deletes or changes a row an earlier write inserted,
    or sets a column back to its value before an earlier write, undoes it."""
    pks = primary_keys(env.tables)
    initial = apply_diff(pks, env.seed_state(), task.setup)
    fleet = Fleet([env])
    try:
        episode = await fleet.create_episode(env.name, state=initial)
        state = (await fleet.export(episode.id)).state
        inserted: set[tuple[str, str]] = set()
        first_before: dict[tuple[str, str, str], Any] = {}
        bad = []
        for call in task.golden_calls:
            res = await fleet.call(episode.id, call.name, call.arguments)
            if env.tools[call.name].read_only or res.is_error:
                continue
            now = (await fleet.export(episode.id)).state
            for table, d in diff_states(pks, state, now).items():
                for r in d.deleted:
                    if (table, repr({c: r[c] for c in pks[table]})) in inserted:
                        bad.append(f"{call.name} deletes a {table} row the task inserted")
                for u in d.updated:
                    key = repr(u.key)
                    if (table, key) in inserted:
                        bad.append(f"{call.name} changes the {table} row {u.key} the task inserted")
                    for col, value in u.after.items():
                        old = first_before.get((table, key, col), first_before)
                        if old is not first_before and old == value:
                            bad.append(f"{call.name} sets {table} {u.key} {col} back to {value!r}")
                        first_before.setdefault((table, key, col), u.before[col])
                inserted |= {(table, repr({c: r[c] for c in pks[table]})) for r in d.inserted}
            state = now
        return bad
    finally:
        await fleet.aclose()


@pytest.mark.parametrize("env_dir", STOCKED, ids=lambda p: p.name)
def test_every_bundled_task_is_one_principals_story(env_dir: Path) -> None:
    env = load_env(env_dir)
    tasks = load_tasks(env_dir)
    assert len(tasks) >= 50, f"{env.name} ships {len(tasks)} tasks"
    stories = [t for t in tasks if t.dag.principal]
    bad = {t.id: _strangers_touched(env, t) for t in stories}
    assert not {k: v for k, v in bad.items() if v}
    principals = {t.dag.principal.table for t in stories if t.dag.principal}
    assert len(principals) == 1, principals
    assert all(t.dag.principal and t.dag.principal.name for t in stories)
    # A task without a principal is a member of staff's (a restock): it changes no one's rows.
    (owner,) = principals
    owned = {owner, *_links(env, owner)}
    assert not {
        t.id: sorted(owned & set(t.golden_diff))
        for t in tasks
        if not t.dag.principal and owned & set(t.golden_diff)
    }
    assert len(stories) >= len(tasks) // 2


@pytest.mark.parametrize("env_dir", STOCKED, ids=lambda p: p.name)
def test_no_bundled_task_keeps_a_dead_read_or_undoes_a_write(env_dir: Path) -> None:
    env = load_env(env_dir)
    tasks = load_tasks(env_dir)
    dead = {t.id: d for t in tasks if (d := _dead_reads(t))}
    assert not dead
    undone = {t.id: u for t in tasks if (u := asyncio.run(_undone_writes(env, t)))}
    assert not undone


@pytest.mark.parametrize("name", ["gym", "retail_orders"])
def test_fresh_synthesis_emits_no_dead_read_and_stays_on_one_principal(name: str) -> None:
    env = load_env(REPO / "envs" / name)
    report = asyncio.run(synthesize(env, 25, seed=7))
    assert len(report.tasks) == 25
    assert not {t.id: d for t in report.tasks if (d := _dead_reads(t))}
    assert not {t.id: b for t in report.tasks if (b := _strangers_touched(env, t))}


def test_a_tool_that_writes_under_another_principal_breaks_no_story() -> None:
    """The attack a model-written tool makes without meaning to: Qwen2.5-Coder-1.5B's Slack reply
    takes the channel and the thread's timestamp, and finds the thread by its timestamp in every
    channel. Every argument a walk gives it is the channel's own, yet the reply lands under
    another channel's message: 35 of 60 tasks wrote into a stranger's story before a walk's writes
    were judged by the rows they changed, not only by the arguments they were given."""
    env = load_env(REAL_MODEL_ENV)
    report = asyncio.run(synthesize(env, 60, seed=0))
    assert len(report.tasks) == 60
    assert any(t.dag.principal for t in report.tasks)
    assert not {t.id: b for t in report.tasks if t.dag.principal and (b := _strangers_touched(env, t))}
    assert report.discarded["build:write_off_story"] > 0  # the tool did write off the story


def test_synthesis_is_byte_deterministic_with_principals() -> None:
    env = load_env(REPO / "envs" / "library")
    first = asyncio.run(synthesize(env, 12, seed=3))
    again = asyncio.run(synthesize(env, 12, seed=3))
    assert tasks_jsonl(first.tasks) == tasks_jsonl(again.tasks)
    assert all(t.dag.principal for t in first.tasks)


def test_n_beyond_what_an_env_supports_stops_with_the_count(tmp_path: Path) -> None:
    # Two-call pharmacy tasks (one principal's read, then a write) run out in under a hundred.
    out = tmp_path / "tasks.jsonl"
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "envforge"),
            "synth",
            "tasks",
            str(REPO / "envs" / "pharmacy"),
            "--n",
            "300",
            "--min-calls",
            "2",
            "--max-calls",
            "2",
            "--seed",
            "0",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    shipped = len(out.read_text().splitlines())
    assert 0 < shipped < 300
    assert f"pharmacy supports {shipped} distinct tasks at this seed" in " ".join(
        (proc.stdout + proc.stderr).split()
    )
