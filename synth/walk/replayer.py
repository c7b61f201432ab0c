"""Running calls for synthesis and its checks: scratch episodes, the call memo, replays.

Episodes are always created from serialised bytes (the seed database, or a task's initial state
built once), on pooled connections outside the fleet's store (`inline.py`), and calls go
straight to `runtime.execute`, with no MCP framing: this is the hot path of synthesis and
self-verification.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from envforge.server import (
    CallSide,
    Environment,
    Episode,
    Fleet,
    ScratchConnection,
    ScratchPool,
    State,
    ToolResult,
    execute,
    export_state,
    on_db_thread,
    state_hash,
)

from ..graph.footprint import parse_result
from ..task.models import Call, Row, RowCheck
from ..task.statediff import cents_row, json_key, states_match
from .memo import BoundedMemo
from .mirror import Mirror, TableReader
from .states import StateCache


def side_of(call: Call) -> CallSide:
    """The side a golden call runs on: the simulated user's tools for a user's call (dual
    control), else the agent's."""
    return "user" if call.requestor == "user" else "agent"


# Memoised tool results (and parsed results, and `try_instead` verdicts) kept per run.
MEMO_LIMIT = 50_000


def call_key(call: Call) -> str | None:
    """The identity of a call for memoisation (None when its arguments are not plain JSON)."""
    try:
        return call.name + "\0" + json_key(call.arguments)
    except (TypeError, ValueError):
        return None


def scratch_connection(episode: Episode) -> ScratchConnection:
    """The connection of a scratch episode (`Replayer.open_episode`): it reports what each call wrote."""
    conn = episode.conn
    assert isinstance(conn, ScratchConnection), "not a scratch episode"
    return conn


class Replayer:
    """Scratch episodes for one env, and every way synthesis runs calls in them."""

    def __init__(self, env: Environment, fleet: Fleet, states: StateCache) -> None:
        self.env = env
        self.fleet = fleet
        self.states = states
        self.scratch = ScratchPool(env)
        self._memo: BoundedMemo[tuple[Any, ...], ToolResult] = BoundedMemo(MEMO_LIMIT)
        self._tried: BoundedMemo[tuple[Any, ...], bool] = BoundedMemo(MEMO_LIMIT)  # `try_instead` verdicts
        self._parsed: BoundedMemo[int, tuple[ToolResult, Any]] = BoundedMemo(MEMO_LIMIT)
        self._golden_db: tuple[State, bytes] | None = None
        self._golden_mirror: Mirror | None = None

    async def export_tables(self, episode: str | Episode, tables: list[str] | None) -> State:
        """The canonical export of some tables only (all when None): cheap state for write diffs."""
        if isinstance(episode, str):
            episode = self.fleet.store.get(episode)
        if tables is None:
            return await episode.export()
        infos = [t for t in self.env.tables if t.name in tables]
        async with episode.lock:
            return await on_db_thread(
                episode.conn, export_state, episode.conn.raw, infos, self.env.manifest.volatile_columns
            )

    def note_golden_db(self, golden: State, database: bytes, mirror: Mirror | None = None) -> None:
        """Remember the serialised database whose export is `golden` (only the latest task's), and
        the `Mirror` that holds `golden` (its rows as tuples)."""
        self._golden_db = (golden, database)
        self._golden_mirror = mirror

    def golden_db(self, golden: State | None) -> bytes | None:
        """The database noted for exactly this `golden` object, if any."""
        if golden is None or self._golden_db is None or self._golden_db[0] is not golden:
            return None
        return self._golden_db[1]

    async def open_episode(self, database: bytes) -> Episode:
        """A private episode on `database` for a walk or a replay, on a reused connection (`inline.py`)."""
        return self.scratch.open(database)

    async def close_episode(self, episode: Episode) -> None:
        self.scratch.close(episode)

    def close(self) -> None:
        """Close the pooled connections (the fleet's episodes are the fleet's to close)."""
        self.scratch.close_all()

    # ------------------------------------------------------------------ calls
    async def call(
        self, episode: Episode, history: tuple[Any, ...], call: Call, key: str | None = None
    ) -> ToolResult:
        """`Fleet.call`, answered from memory when executing it could not change the episode.

        `history` names the episode's state: its initial state and the successful writes made
        since (tools are deterministic functions of state and arguments: the 'deterministic'
        self-check holds every shipped task to that). A read call, or a call that failed (the
        runtime rolls failed calls back), leaves the state as it was, so the same call on the same
        history gives the same result without running; walks retry the same refused writes and
        lookups many times. A call that changed state is always executed for real.
        """
        ck = key if key is not None else call_key(call)
        if ck is not None:
            hit = self._memo.get((history, ck))
            if hit is not None:
                return hit
        res = await execute(episode, call.name, call.arguments, side_of(call))
        if ck is not None and (res.is_error or self.env.all_tools[call.name].read_only):
            self._remember((history, ck), res)
        return res

    def _remember(self, key: tuple[Any, ...], res: ToolResult) -> None:
        self._memo.put(key, res)

    def parsed(self, res: ToolResult) -> Any:
        """`parse_result(res.text)`, parsed once per remembered result (walks only read the data)."""
        hit = self._parsed.get(id(res))
        if hit is not None and hit[0] is res:
            return hit[1]
        data = parse_result(res.text)
        self._parsed.put(id(res), (res, data))
        return data

    def reads_only(self, call: Call) -> bool:
        """Whether `call` is to a read-only tool of the env: replays that compare states skip it."""
        spec = self.env.all_tools.get(call.name)
        return spec is not None and spec.read_only

    async def replay(
        self, database: bytes, calls: list[Call], *, tables: list[str] | None = None, hashed: bool = True
    ) -> tuple[State, str]:
        """Run `calls` (reads skipped, as in `replay_snapshots`) in a fresh episode on `database`; the
        exported end state (of `tables`) and its hash."""
        episode = await self.open_episode(database)
        try:
            for call in calls:
                if self.reads_only(call):
                    continue
                await execute(episode, call.name, call.arguments, side_of(call))
            state = await self.export_tables(episode, tables)
        finally:
            await self.close_episode(episode)
        return state, state_hash(state) if hashed else ""

    async def run_all(
        self, database: bytes, calls: list[Call], *, export: bool = True
    ) -> tuple[State | None, list[str]]:
        """Run every call, reads included (their results are what the caller saw), in a fresh
        episode on `database`: the end state (when `export`) and each result's text."""
        episode = await self.open_episode(database)
        try:
            texts = [(await execute(episode, c.name, c.arguments, side_of(c))).text for c in calls]
            state = await episode.export() if export else None
        finally:
            await self.close_episode(episode)
        return state, texts

    async def replay_differs(
        self,
        database: bytes,
        calls: list[Call],
        golden: State,
        tables: list[str],
        *,
        rows: Sequence[RowCheck] = (),
    ) -> bool:
        """Whether replaying `calls` on `database` ends with one of `tables` unlike `golden`'s (to cents).

        `rows`, golden rows by key (a dropped write's checkpoint: the rows it changed), are looked
        up first: one that the replay does not hold as `golden` does (to cents) settles it in a
        few reads. Otherwise tables are read and compared one at a time, in the order given, and
        the first difference ends the check: when a replay is expected to differ (a dropped
        write), the tables that write touches are usually the only ones read. Where the golden
        state's `Mirror` has a table as tuples, the table is read as tuples too and only rows that
        differ exactly become dicts, to be compared to cents as `states_match` compares them.
        """
        episode = await self.open_episode(database)
        try:
            for call in calls:
                await execute(episode, call.name, call.arguments, side_of(call))
            raw = episode.conn.raw
            for check in rows:
                reader = self.states.readers[check.table]
                if not reader.by_key or set(check.key) != set(reader.pk):
                    continue
                found = raw.execute(reader.by_key, [check.key[c] for c in reader.pk]).fetchone()
                if (found is None) != (check.row is None):
                    return True
                if found is not None and check.row is not None:
                    row = dict(zip(reader.cols, found, strict=True))
                    if row != check.row and cents_row(row) != cents_row(check.row):
                        return True
            for t in tables:
                want = None
                if self._golden_mirror is not None and self.golden_db(golden) is not None:
                    want = self._golden_mirror.tuples_of(t)
                if want is None:
                    part = await self.export_tables(episode, [t])
                    if not states_match(part, {t: golden[t]}):
                        return True
                elif _tuples_differ(
                    self.states.readers[t],
                    await _read_tuples(episode, self.states.readers[t]),
                    want,
                    golden[t],
                ):
                    return True
        finally:
            await self.close_episode(episode)
        return False

    def tried(self, history: tuple[Any, ...], key: str) -> bool | None:
        """`try_instead`'s verdict for a call on the episode state `history` names, if known: a call
        that failed there (`call`'s memo) fails again."""
        verdict = self._tried.get((history, key))
        if verdict is None and (hit := self._memo.get((history, key))) is not None and hit.is_error:
            verdict = False
        return verdict

    async def try_instead(
        self,
        database: bytes,
        call: Call,
        *,
        refused: bool = False,
        history: tuple[Any, ...] | None = None,
        key: str | None = None,
        before: Callable[[str], list[tuple[Any, ...]] | None] | None = None,
    ) -> bool:
        """Whether `call`, run on `database`, is refused (when `refused`) or succeeds and changes it.

        The tables its statements wrote are compared with those of `database`: as `before(table)`
        gives them, read as `Mirror` tuples, where the caller holds them (a walk's mirror of the
        episode `database` is a snapshot of), else from a second copy of `database`. Given the
        `history` that names `database`'s state (see `call`) and the call's `key`, the verdict is
        kept for `tried`, and a failure also goes to `call`'s memo.
        """
        episode = await self.open_episode(database)
        try:
            conn = scratch_connection(episode)
            conn.take_written()
            res = await execute(episode, call.name, call.arguments, side_of(call))
            written = conn.take_written()
            if res.is_error and history is not None and key is not None:
                self._remember((history, key), res)
            if refused or res.is_error:
                verdict = refused and res.kind == "refused"  # an env error is no refusal
            elif "*" in written:
                verdict = await self.export_tables(episode, None) != (await self.replay(database, []))[0]
            else:
                verdict = False
                other = None
                try:
                    # The first table that differs settles it: the smaller ones are read first.
                    seed = self.env.seed_state()
                    for t in sorted(written, key=lambda t: (len(seed.get(t, ())), t)):
                        reader = self.states.readers[t]
                        was = before(t) if before is not None else None
                        if was is None:
                            other = other or await self.open_episode(database)
                            was = await _read_tuples(other, reader)
                        if await _read_tuples(episode, reader) != was:
                            verdict = True
                            break
                finally:
                    if other is not None:
                        await self.close_episode(other)
        finally:
            await self.close_episode(episode)
        if history is not None and key is not None:
            self._tried.put((history, key), verdict)
        return verdict

    async def replay_snapshots(
        self,
        database: bytes,
        calls: list[Call],
        at: list[int],
        *,
        unless_equal: bytes | None = None,
        kinds: dict[int, str] | None = None,
    ) -> tuple[State | None, dict[int, bytes]]:
        """`replay` (full export, unhashed), also serialising the database just before each call in `at`.

        Read calls are skipped: they cannot change the state (the runtime refuses, and rolls back,
        a read tool that tries), and only the state is compared.

        A snapshot taken before call i is exactly the state a fresh replay of `calls[:i]` reaches,
        so replays that differ from this one only from call i on can start there. When the end
        database is byte for byte `unless_equal`, its export would be that database's export:
        None is returned instead of exporting again. Given `kinds`, the result kind of each write
        call (`ToolResult.kind`) is put there by position.
        """
        wanted = set(at)
        snapshots: dict[int, bytes] = {}
        episode = await self.open_episode(database)
        try:
            for i, call in enumerate(calls):
                if i in wanted:
                    snapshots[i] = await episode.snapshot()
                if self.reads_only(call):
                    continue
                result = await execute(episode, call.name, call.arguments, side_of(call))
                if kinds is not None:
                    kinds[i] = result.kind
            if unless_equal is not None and await episode.snapshot() == unless_equal:
                state = None
            else:
                state = await episode.export()
        finally:
            await self.close_episode(episode)
        return state, snapshots


async def _read_tuples(episode: Episode, reader: TableReader) -> list[tuple[Any, ...]]:
    async with episode.lock:
        return await on_db_thread(episode.conn, lambda: episode.conn.raw.execute(reader.sql).fetchall())


def _tuples_differ(
    reader: TableReader, got: list[tuple[Any, ...]], want: list[tuple[Any, ...]], rows: list[Row]
) -> bool:
    """`not states_match` for one table: `got` (read as tuples) against `want`, the tuples of `rows`."""
    if got == want:
        return False
    if len(got) != len(want):
        return True
    cols = reader.cols
    return any(
        a != b and cents_row(dict(zip(cols, a, strict=True))) != cents_row(row)
        for a, b, row in zip(got, want, rows, strict=True)
    )
