"""Task construction: random walks on the tool graph, merged into a DAG, executed for real.

A task is built inside one episode started from its initial state. Each step extends the DAG from
any node already in it (so every new walk shares an entity with what came before): an edge of the
tool graph says which earlier result can feed which parameter of the next tool, and the value is
taken from that result, chosen by a reasoning node (argmax/argmin/filter over a list, or a branch
on a compared figure) where a list offers several. Every call is executed as it is added; a call
that fails is dropped and another is tried, so the DAG in the end is exactly what ran, in
topological order, and the episode's final state is the golden state.
"""

from __future__ import annotations

import random
import re
from operator import itemgetter
from typing import Any

from ..task.golden import BuiltTask, GoldenRun
from ..task.models import ANSWERS_LINE, KNOWN_FACTS_LINE, Checkpoint, Dag, Difficulty, Row, RowCheck, Task
from ..task.policy_rules import identity_facts, load_policy_rules
from ..task.statediff import json_key
from ..walk.context import SynthContext
from ..walk.replayer import scratch_connection
from ..walk.roles import STAFF, Roles
from ..walk.states import setup_key
from ..wording.render import VagueReference, render_scenario
from .branching import summarise
from .config import BuildFailed, SynthConfig
from .pruning import prune_dead_reads
from .state import Builder
from .walking import start, step

# Steps in which every try failed that a walk survives, before and after its first write.
STALLS_BEFORE_WRITE = 1
STALLS_AFTER_WRITE = 3


class _RowFinder:
    """The first row whose key columns equal a key's values (`==`): a scan, in C, for one-column
    keys; an index per column set for the others. Given the rows as the tuples a `Mirror` holds
    (aligned with them), a column's values are taken from the tuples, in C."""

    def __init__(self, rows: list[Row], tuples: list[tuple[Any, ...]] | None = None, cols: Any = ()) -> None:
        self.rows = rows
        self.tuples = tuples
        self.at = {c: i for i, c in enumerate(cols)}
        self.columns: dict[str, list[Any]] = {}
        self.indexes: dict[tuple[str, ...], dict[tuple[Any, ...], Row] | None] = {}

    def _column(self, col: str) -> list[Any]:
        values = self.columns.get(col)
        if values is None:
            if self.tuples is not None and col in self.at:
                values = list(map(itemgetter(self.at[col]), self.tuples))
            else:
                values = [r.get(col) for r in self.rows]
            self.columns[col] = values
        return values

    def __call__(self, key: Row) -> Row | None:
        if len(key) == 1:
            ((col, want),) = key.items()
            try:
                return self.rows[self._column(col).index(want)]
            except ValueError:
                return None
        cols = tuple(key)
        if cols not in self.indexes:  # the first row of each key, as the scan would find it
            keys = list(zip(*(self._column(c) for c in cols), strict=True))
            index: dict[tuple[Any, ...], Row] | None
            try:
                index = dict(zip(reversed(keys), reversed(self.rows), strict=True))
            except TypeError:  # an unhashable value: scan instead
                index = None
            self.indexes[cols] = index
        index = self.indexes[cols]
        if index is None:
            return next((r for r in self.rows if all(r.get(c) == v for c, v in key.items())), None)
        try:
            return index.get(tuple(key.values()))
        except TypeError:
            return None


_QUOTED = re.compile(r'"[^"\n]*"')
_AN_ID = re.compile(r"\b[A-Z]+-\d+\b")


def described_twice(instruction: str) -> list[str]:
    """Runs of seven words starting with "the" that the wishes say twice with no id named between
    ("the reservation of the one whose status is confirmed among your …" three times in one
    sentence reads as three reservations): such a scenario is not shipped. What the user knows,
    what they must be told and quoted words do not count."""
    lines = [
        ln
        for ln in instruction.splitlines()
        if not ln.startswith(KNOWN_FACTS_LINE) and not ln.startswith(ANSWERS_LINE)
    ]
    said = _QUOTED.sub('""', " ".join(lines))
    words = said.split()
    out: list[str] = []
    for i, word in enumerate(words[:-6]):
        run = " ".join(words[i : i + 7])
        if word.lower() != "the" or '""' in run or run in out:
            continue
        first = said.find(run)
        again = said.find(run, first + 1)
        if again > first and not _AN_ID.search(said[first + len(run) : again]):
            out.append(run)
    return out


def _draw_role(roles: Roles, seed: str) -> str:
    """A role for a walk that aims at no write: each role as likely as the writes it may ask for."""
    choices = [roles.role_of_write(t) for t in sorted(roles.principal_writes | roles.staff_writes)]
    return random.Random(seed).choice(choices) if choices else STAFF


def dag_depth(dag: Dag) -> int:
    """Nodes on the longest path (the DAG's nodes are stored in topological order)."""
    depth: dict[str, int] = {}
    preds: dict[str, list[str]] = {}
    for e in dag.edges:
        preds.setdefault(e.target, []).append(e.source)
    for n in dag.nodes:
        depth[n.id] = 1 + max((depth[p] for p in preds.get(n.id, [])), default=0)
    return max(depth.values(), default=0)


async def build_task(
    ctx: SynthContext, task_id: str, seed: str, cfg: SynthConfig, *, aim: str | None = None
) -> BuiltTask:
    """Build and execute one task, with what its golden run showed. Raises `BuildFailed` when the
    walk cannot finish. `aim` is the write tool the walk leans towards (`mix.py`): its user is
    cast in the role that may ask for it (`roles.py`); without one the role is drawn."""
    rng = random.Random(seed)
    setup = None
    setup_rng = random.Random(f"{seed}:setup")
    if setup_rng.random() < cfg.p_setup and ctx.setups.tables:
        setup = ctx.setups.fresh_entity(setup_rng)
        if setup is None:
            raise BuildFailed("setup_rejected")
    key = setup_key(setup.diff if setup else {})
    database, initial_state, initial_cents = ctx.states.initial(
        key, setup.diff if setup else {}, database=setup.database if setup else None
    )
    b = Builder(ctx=ctx, rng=rng, cfg=cfg, initial_state=initial_state, history=(key,))
    b.fresh = setup.fresh if setup else None
    b.aim = aim
    ownership = ctx.ownership
    roles = ctx.roles
    if setup is not None:
        b.principal = ownership.principal_of(key, initial_state, setup.fresh.table, setup.fresh.value)
    if b.principal is not None:  # a setup's fresh entity is its owner's to act on
        b.role = roles.role_of(b.principal)
    else:
        b.role = roles.role_of_write(aim) if aim is not None else _draw_role(roles, f"{seed}:role")
        if b.role != STAFF:
            b.principal = ownership.pick(
                random.Random(f"{seed}:principal"), key, initial_state, steer=cfg.steer
            )
    target = rng.randint(cfg.min_calls, cfg.max_calls)
    episode = await ctx.replayer.open_episode(database)
    b.episode = episode
    b.conn = scratch_connection(episode)
    b.mirror = ctx.states.mirror(key, initial_state)
    try:
        await start(b)
        stalls = 0
        # A walk's length counts the calls that stay (`live_calls`); reads that feed nothing yet
        # may still, and the walk stops at twice its longest length whatever it counts.
        while b.calls < 2 * cfg.max_calls and (
            (live := b.live_calls()) < target or (b.writes == 0 and b.calls < cfg.max_calls)
        ):
            if not await step(b, target - live):
                stalls += 1
                # A walk that has written is a task already and may try harder to grow; one that
                # could not extend itself before writing seldom writes later (it is discarded).
                if stalls >= (STALLS_AFTER_WRITE if b.writes else STALLS_BEFORE_WRITE):
                    break
        if b.nodes:
            first = b.nodes[0]  # the start call
            assert first.kind == "call"
            ctx.outcomes.record_walk(first.call.name, b.writes > 0)
            if cfg.steer and b.writes == 0:
                ownership.record(b.principal, False)  # a walk that writes counts once judged
        # A walk that is rejected anyway is rejected before the full export it would not use.
        if b.writes == 0:
            raise BuildFailed("no_write")
        if b.calls < cfg.min_calls:
            raise BuildFailed("too_short")
        if b.fresh is not None and not b.acts_on_fresh():
            raise BuildFailed("setup_unused")
        golden = await b.golden_state()
        ctx.replayer.note_golden_db(golden, await episode.snapshot(), b.mirror)
    finally:
        await ctx.replayer.close_episode(episode)
    if rng.random() < cfg.p_summary or not b.reasoned:
        summarise(b)
    prune_dead_reads(b)
    if b.calls < cfg.min_calls:
        raise BuildFailed("too_short")
    if b.calls > cfg.max_calls:  # reads that fed something late made it longer than asked
        raise BuildFailed("too_long")
    dag = Dag(nodes=b.nodes, edges=b.edges, principal=b.principal)
    checkpoints = []
    finders: dict[str, _RowFinder] = {}
    for node in b.nodes:
        diff = b.write_diffs.get(node.id)
        if not diff or node.kind != "call":  # only call nodes write
            continue
        rows = []
        for table, d in diff.items():
            pk = ctx.pks[table]
            keys = [{c: r[c] for c in pk} for r in d.inserted + d.deleted] + [u.key for u in d.updated]
            find = finders.get(table)
            if find is None:
                tuples = b.mirror.tuples_of(table)
                find = finders[table] = _RowFinder(golden[table], tuples, ctx.states.readers[table].cols)
            for row_key in keys:
                rows.append(RowCheck(table=table, key=row_key, row=find(row_key)))
        checkpoints.append(Checkpoint(node=node.id, tool=node.call.name, rows=rows))
    executed = [n for n in b.nodes if n.kind == "call" and n.executed]
    tables = set()
    for n in executed:
        t = ctx.graph.tool(n.call.name)
        tables |= set(t.reads) | set(t.writes)
    created: dict[str, tuple[str, str]] = {}  # what each write made: only that is "the new …"
    for node_id, diff in b.write_diffs.items():
        for table, d in diff.items():
            pk = ctx.pks[table]
            if len(pk) == 1:
                for row in d.inserted:
                    created[json_key(row[pk[0]])] = (node_id, table)
    # What the user must know to be verified as the env's identity rule asks (their email where
    # the walk gave them only their customer id): facts of the principal's own row, drawn by no rng.
    schemas = {name: spec.input_schema for name, spec in ctx.env.tools.items()}
    calls = [n.call for n in executed]
    facts = b.facts + identity_facts(
        load_policy_rules(ctx.env), schemas, calls, b.principal, initial_state, b.facts
    )
    try:
        scenario = render_scenario(
            ctx.env.name,
            dag,
            facts,
            b.outputs,
            b.data,
            b.output_labels,
            ctx.phrases,
            ctx.references,
            created,
            staff=b.role == STAFF and b.principal is None and roles.principal_role is not None,
        )
    except VagueReference:
        raise BuildFailed("vague_reference") from None
    if described_twice(scenario.instruction):
        raise BuildFailed("described_twice")
    golden_hash, golden_cents = ctx.states.hasher.hashes(golden)
    if golden_cents == initial_cents:
        raise BuildFailed("no_change")
    task = Task(
        id=task_id,
        env=ctx.env.name,
        seed=seed,
        dag=dag,
        setup=setup.diff if setup else {},
        scenario=scenario,
        golden_calls=[n.call for n in executed],
        golden_hash=golden_hash,
        golden_cents_hash=golden_cents,
        golden_diff=b.mirror.diff_from_initial(),
        required_outputs=list(b.outputs),
        checkpoints=checkpoints,
        difficulty=Difficulty(
            calls=len(executed),
            writes=sum(1 for n in executed if n.write and not n.expect_error),
            reasoning=sum(1 for n in b.nodes if n.kind == "reason"),
            depth=dag_depth(dag),
            tables=len(tables),
        ),
    )
    run = GoldenRun(
        state=golden,
        texts=tuple(b.texts[n.id] for n in executed),
        after_first_write=b.after_first_write,
    )
    return BuiltTask(task=task, golden=run)
