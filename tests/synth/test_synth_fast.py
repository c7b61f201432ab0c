"""The shortcuts that make synthesis fast give what the long ways give, on real SQLite.

Reused connections (`inline.py`), the walk's state mirror (`mirror.py`), hashes from row texts
(`hashing.py`), rewards computed part by part, table-by-table replay comparison and the JSON
helpers: each is compared with the plain computation it replaces.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envforge.server import Environment, Fleet, ScratchPool, execute, export_state, load_env
from envforge.synth import (
    BuildFailed,
    Evidence,
    SynthConfig,
    SynthContext,
    build_graph,
    build_task,
    checkpoint_rows,
    compose_reward,
    diff_states,
    load_tasks,
    oracle_messages,
    primary_keys,
    score_episode,
    state_hashes,
    states_match,
    synthesize,
    write_indices,
)
from envforge.synth.checks.verify import adversary_rewards
from envforge.synth.task.hashing import StateHasher, loose_columns, same_row
from envforge.synth.task.statediff import _table_json, json_key

from support.paths import REPO


async def _export(env: Environment, episode) -> dict:  # type: ignore[no-untyped-def]
    return export_state(episode.conn.raw, env.tables, env.manifest.volatile_columns)


async def test_reused_connections_start_clean_and_still_track_writes(unlucky_shop: Environment) -> None:
    pool = ScratchPool(unlucky_shop, size=1)
    first = pool.open(unlucky_shop.seed_db)
    res = await execute(first, "cancel_order", {"order_id": "O-1"})
    assert not res.is_error
    assert first.conn.take_written() == {"orders", "customers"} <= first.tracker.written
    raw = first.conn.raw
    pool.close(first)
    second = pool.open(unlucky_shop.seed_db)
    assert second.conn.raw is raw  # the same connection, with its statements prepared
    # but the seed's rows, not the last ones
    assert await _export(unlucky_shop, second) == unlucky_shop.seed_state()
    # The statement comes from the cache, so SQLite does not authorize it again: its writes are
    # still recorded, from what its text was seen to write before.
    assert not (await execute(second, "cancel_order", {"order_id": "O-1"})).is_error
    assert second.conn.take_written() == {"orders", "customers"} <= second.tracker.written
    assert (await execute(second, "get_order", {"order_id": "O-1"})).is_error is False
    assert second.conn.take_written() == set()
    pool.close(second)
    pool.close_all()


async def test_connections_left_altered_are_closed_not_reused(unlucky_shop: Environment) -> None:
    """`deserialize` resets the database, not the connection: one left with foreign keys off or
    objects in its temp schema must not serve the next episode."""
    pool = ScratchPool(unlucky_shop, size=2)
    clean = pool.open(unlucky_shop.seed_db)
    raw = clean.conn.raw
    pool.close(clean)
    for leftover in ("PRAGMA foreign_keys = OFF", "CREATE TEMP TABLE left_behind (x)"):
        episode = pool.open(unlucky_shop.seed_db)
        assert episode.conn.raw is raw  # the clean one, reused
        raw.set_authorizer(None)  # the SQL guard denies both; the pool must still not trust a leftover
        raw.execute(leftover)
        episode.guard.install(raw)
        pool.close(episode)
        again = pool.open(unlucky_shop.seed_db)
        assert again.conn.raw is not raw
        assert again.conn.raw.execute("PRAGMA foreign_keys").fetchone() == (1,)
        raw = again.conn.raw
        pool.close(again)
    pool.close_all()


async def test_try_instead_compares_with_the_tuples_the_caller_holds(retail_orders: Environment) -> None:
    """A walk's mirror stands in for a second copy of the database: same verdicts, one episode."""
    fleet = Fleet([retail_orders])
    try:
        ctx = SynthContext.create(retail_orders, await build_graph(retail_orders, fleet), fleet)
        database, initial, _ = ctx.states.initial("", {})
        mirror = ctx.states.mirror("", initial)
        calls = {
            json.dumps(c.model_dump(), sort_keys=True): c
            for t in load_tasks(REPO / "envs" / "retail_orders")
            for c in t.golden_calls
            if not retail_orders.tools[c.name].read_only
        }

        def opened() -> int:  # scratch episodes opened so far
            return ctx.replayer.scratch._opened

        verdicts = []
        for call in calls.values():
            start = opened()
            plain = await ctx.replayer.try_instead(database, call)
            with_copy = opened() - start
            assert await ctx.replayer.try_instead(database, call, before=mirror.tuples_of) == plain
            assert opened() - start - with_copy == 1
            verdicts.append((plain, with_copy))
        # calls that changed the state were compared with a second copy, or with the mirror
        assert (True, 2) in verdicts and (False, 1) in verdicts
    finally:
        await fleet.aclose()


async def test_mirror_diffs_and_state_are_the_exports(retail_orders: Environment) -> None:
    """Replay bundled tasks' calls; after every write the mirror's diff is `diff_states` of full
    exports and its state is the export, rows for rows."""
    fleet = Fleet([retail_orders])
    try:
        ctx = SynthContext.create(retail_orders, await build_graph(retail_orders, fleet), fleet)
        pks = primary_keys(retail_orders.tables)
        checked = columns_only = 0
        for task in load_tasks(REPO / "envs" / "retail_orders")[:25]:
            database, initial, _ = ctx.states.task_initial(task)
            episode = await ctx.replayer.open_episode(database)
            mirror = ctx.states.mirror("", initial)
            before = await _export(retail_orders, episode)
            for n, call in enumerate(task.golden_calls):
                res = await execute(episode, call.name, call.arguments)
                written = episode.conn.take_written()
                if res.is_error or retail_orders.tools[call.name].read_only:
                    continue
                tables = sorted(t for t in written if t != "*")
                # Every other write reads only the columns its statements update, as walks do.
                updated = episode.conn.taken_columns if n % 2 else None
                diff = await mirror.refresh(episode, tables, updated)
                after = await _export(retail_orders, episode)
                assert diff == diff_states(pks, {t: before[t] for t in tables}, {t: after[t] for t in tables})
                assert mirror.state == after and state_hashes(mirror.state) == state_hashes(after)
                before = after
                checked += 1
                columns_only += sum(1 for t in tables if updated and "" not in updated.get(t, {""}))
            assert mirror.diff_from_initial() == diff_states(pks, initial, before)
            await ctx.replayer.close_episode(episode)
        assert checked >= 25 and columns_only >= 10  # tables read by their updated columns only
    finally:
        await fleet.aclose()


def _loose_env(root: Path) -> Environment:
    """An env with an untyped column, where SQLite keeps 1 and 1.0 apart (they hash apart too)."""
    root.mkdir(parents=True)
    (root / "env.toml").write_text('name = "loose"\ndescription = "Untyped values."\n')
    (root / "policy.md").write_text("None.\n")
    (root / "schema.sql").write_text(
        "CREATE TABLE items (item_id TEXT PRIMARY KEY, amount, price REAL NOT NULL, note TEXT);\n"
    )
    rows = [{"item_id": f"I-{i}", "amount": 1, "price": 2.5, "note": "x"} for i in range(5)]
    (root / "seed.json").write_text(json.dumps({"items": rows}))
    (root / "tools.py").write_text(
        textwrap.dedent(
            """
            from envforge.server import tool

            @tool
            async def get_item(db, item_id: str) -> dict:
                \"\"\"Get an item.

                Args:
                    item_id: The item.
                \"\"\"
                async with db.execute("SELECT * FROM items WHERE item_id = ?", (item_id,)) as cur:
                    row = await cur.fetchone()
                return {"item_id": row[0]}
            """
        )
    )
    return load_env(root)


def test_state_hasher_gives_state_hashes_and_tells_1_from_1_0(
    tmp_path: Path, retail_orders: Environment
) -> None:
    seed = retail_orders.seed_state()
    pks = primary_keys(retail_orders.tables)
    hasher = StateHasher(seed, pks, loose_columns(retail_orders))
    changed = dict(seed)
    changed["orders"] = [dict(r, status="cancelled") if i == 3 else r for i, r in enumerate(seed["orders"])]
    changed["payments"] = [dict(r) for r in seed["payments"]] + [
        dict(seed["payments"][0], payment_id="PAY-9999")
    ]
    changed["variants"] = [dict(r, price=r["price"] + 0.001) for r in seed["variants"]]  # cents-equal floats
    for state in (seed, changed, {t: [dict(r) for r in rows] for t, rows in seed.items()}):
        assert hasher.hashes(state) == state_hashes(state)

    env = _loose_env(tmp_path / "loose")
    base = env.seed_state()
    assert loose_columns(env) == {"items": ("amount",)}
    hasher = StateHasher(base, primary_keys(env.tables), loose_columns(env))
    row = base["items"][0]
    as_float = dict(row, amount=1.0)
    assert as_float == row and not same_row(as_float, row, ("amount",))
    state = {"items": [as_float, *base["items"][1:]]}
    assert hasher.hashes(state) == state_hashes(state) != state_hashes(base)


async def test_basis_only_rewards_and_replay_differs_match_the_full_computations(
    unlucky_shop: Environment,
) -> None:
    fleet = Fleet([unlucky_shop])
    try:
        graph = await build_graph(unlucky_shop, fleet)
        ctx = SynthContext.create(unlucky_shop, graph, fleet)
        report = await synthesize(unlucky_shop, 10, 3, SynthConfig(min_calls=2, max_calls=6), graph=graph)
        tools = unlucky_shop.tools
        compared = found_by_rows = 0
        for task in report.tasks:
            database, initial, _ = ctx.states.task_initial(task)
            golden, _ = await ctx.replayer.replay(database, task.golden_calls, hashed=False)
            said = oracle_messages(task)
            for basis in (["state", "outputs"], ["checkpoints"], ["state", "checkpoints", "outputs"]):
                t = task.model_copy(update={"reward_basis": basis})
                for state, messages in ((golden, said), (initial, said), (golden, []), (initial, [])):
                    for given in (None, golden):
                        full = score_episode(t, state, messages, golden_state=given).reward
                        assert compose_reward(t, Evidence(state, messages, golden_state=given)).value == full
            changed = checkpoint_rows(task)
            for rows in changed.values():  # the full replay holds every golden row
                assert not await ctx.replayer.replay_differs(
                    database, task.golden_calls, golden, [], rows=rows
                )
            for i in write_indices(ctx, task):
                calls = task.golden_calls[:i] + [
                    c for c in task.golden_calls[i + 1 :] if not tools[c.name].read_only
                ]
                tables = sorted(golden)
                differs = await ctx.replayer.replay_differs(database, calls, golden, tables)
                dropped, _ = await ctx.replayer.replay(database, calls, hashed=False)
                assert differs == (not states_match(dropped, golden))
                # The dropped write's checkpoint rows, looked up first, never change the verdict
                # (nor do another write's); looked up alone, they find a difference only where
                # there is one, and find it for most dropped writes.
                for rows in changed.values():
                    assert (
                        await ctx.replayer.replay_differs(database, calls, golden, tables, rows=rows)
                        == differs
                    )
                by_rows = await ctx.replayer.replay_differs(database, calls, golden, [], rows=changed[i])
                assert not by_rows or differs
                found_by_rows += by_rows
                compared += 1
        assert compared >= 10
        assert found_by_rows >= compared // 2
        # Right after a build the golden state's mirror holds its tables as tuples, and replays
        # are compared with those (only rows that differ become dicts).
        for k in range(8):
            try:
                built = await build_task(ctx, f"t{k}", f"3:{k}", SynthConfig(min_calls=2, max_calls=6))
            except BuildFailed:
                continue
            task, golden = built.task, built.golden.state
            database, _, _ = ctx.states.task_initial(task)
            assert ctx.replayer.golden_db(golden) is not None
            for i in write_indices(ctx, task):
                calls = task.golden_calls[:i] + task.golden_calls[i + 1 :]
                for tables in (sorted(golden), sorted(golden, reverse=True)):
                    differs = await ctx.replayer.replay_differs(database, calls, golden, tables)
                    dropped, _ = await ctx.replayer.replay(database, calls, hashed=False)
                    assert differs == (not states_match(dropped, golden))
                compared += 1
        assert compared >= 15
    finally:
        await fleet.aclose()


@pytest.mark.parametrize("name", ["retail_orders", "it_tickets"])
async def test_golden_run_holds_what_replays_find_and_adversaries_score_the_same(name: str) -> None:
    """What a build keeps of its golden run (`GoldenRun`) is what replaying the golden calls finds,
    and the adversaries' rewards from it are those of their real runs (`envforge check`'s way)."""
    env = load_env(REPO / "envs" / name)
    fleet = Fleet([env])
    try:
        ctx = SynthContext.create(env, await build_graph(env, fleet), fleet)
        built = prefixes = 0
        for k in range(60):
            try:
                made = await build_task(ctx, f"t{k}", f"5:{k}", SynthConfig())
            except BuildFailed:
                continue
            task, golden = made.task, made.golden
            built += 1
            database, _, _ = ctx.states.task_initial(task)
            episode = await ctx.replayer.open_episode(database)
            try:
                texts = [(await execute(episode, c.name, c.arguments)).text for c in task.golden_calls]
                assert await episode.export() == golden.state
            finally:
                await ctx.replayer.close_episode(episode)
            assert list(golden.texts) == texts
            writes = write_indices(ctx, task)
            if len(writes) > 1 and golden.after_first_write is not None:
                prefix, _ = await ctx.replayer.replay(
                    database, task.golden_calls[: writes[0] + 1], hashed=False
                )
                assert golden.after_first_write == prefix
                prefixes += 1
            fast = await adversary_rewards(ctx, task, golden=golden)
            full = await adversary_rewards(ctx, task)
            for adversary in ("spray", "read_all", "golden_prefix"):
                assert fast[adversary] == full[adversary], (task.id, adversary)
            # Skipped where the state is rewarded: a judged double writer left the golden state.
            assert fast["double_write"] == 0.0 and full["double_write"] in (None, 0.0)
        assert built >= 20 and prefixes >= 5
    finally:
        await fleet.aclose()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_json_helpers_write_what_json_dumps_writes(value: object) -> None:
    assert json_key(value) == json.dumps(value, sort_keys=True)
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert _table_json(value) == canonical
    assert json_key([value, float("inf")]) == json.dumps([value, float("inf")], sort_keys=True)
    with pytest.raises(ValueError):
        _table_json([value, float("inf")])  # as json.dumps(..., allow_nan=False) refuses it


def test_hashes_resumed_from_frozen_prefixes_equal_plain_sha256(retail_orders: Environment) -> None:
    """`state_hash` and `cents_hash` resume the leading frozen tables from a remembered midstate;
    whichever tables an episode wrote (first, middle, last, none, all), and across states sharing
    some frozen tables, each digest is sha256 over the whole canonical JSON."""
    from envforge.server import canonical_json, freeze, state_hash
    from envforge.synth import cents_hash
    from envforge.synth.task.statediff import to_cents

    def plain(state: dict) -> tuple[str, str]:
        return (
            hashlib.sha256(canonical_json(state).encode()).hexdigest(),
            hashlib.sha256(canonical_json(to_cents(state)).encode()).hexdigest(),
        )

    def changed(rows: list[dict]) -> list[dict]:
        """A fresh copy of a table with its first row's first column changed."""
        rows = [dict(r) for r in rows]
        if rows:
            key = next(iter(rows[0]))
            rows[0][key] = f"{rows[0][key]}-changed" if isinstance(rows[0][key], str) else 0.001
        return rows

    seed = freeze(retail_orders.seed_state())
    tables = sorted(seed)
    assert len(tables) >= 3
    # frozen too, with the same table names as the seed but other rows first and last
    other = freeze({t: changed(rows) if t in (tables[0], tables[-1]) else rows for t, rows in seed.items()})
    states = [seed, dict(seed), other]
    for written in ([], [tables[0]], [tables[1]], [tables[-1]], [tables[0], tables[-1]], tables):
        states.append({t: changed(rows) if t in written else rows for t, rows in seed.items()})
    mixed = dict(other)
    mixed[tables[0]] = seed[tables[0]]  # frozen tables of two states: a prefix seen in neither
    states.append(mixed)
    for _ in range(2):  # the second pass is served from the remembered midstates
        for state in states:
            assert (state_hash(state), cents_hash(state)) == plain(state)


def test_checkpoints_on_frozen_tables_find_the_rows_a_scan_finds() -> None:
    """A frozen table's rows are looked up through an index; each lookup finds the row (the first
    of equal keys, 1 == 1.0, multi-column keys, missing rows) that a scan of the table finds."""
    from envforge.server import freeze
    from envforge.synth import Checkpoint, RowCheck
    from envforge.synth.task.scoring import checkpoint_passed

    rows = [
        {"id": 1, "k": "a", "v": 10},
        {"id": 2, "k": "b", "v": 20},
        {"id": 2, "k": "c", "v": 21},  # a second row with id 2: the first is the one found
        {"id": 3.0, "k": "d", "v": None},
        {"id": 4, "k": "e"},
    ]
    frozen = freeze({"t": rows})
    plain = {"t": [dict(r) for r in rows]}  # not frozen: scanned
    checks = [
        ({"id": 1}, {"id": 1, "k": "a", "v": 10}),
        ({"id": 2}, {"id": 2, "k": "b", "v": 20}),
        ({"id": 2}, {"id": 2, "k": "c", "v": 21}),
        ({"id": 3}, {"id": 3.0, "k": "d", "v": None}),
        ({"id": 2, "k": "c"}, {"id": 2, "k": "c", "v": 21}),
        ({"id": 9}, None),
        ({"id": 9}, {"id": 9}),
        ({"v": None}, {"id": 3.0, "k": "d", "v": None}),  # v is None in row 3 before the v-less row 4
        ({"id": [1]}, None),  # an unhashable wanted value
        ({"id": float("nan")}, None),
    ]
    for key, row in checks:
        checkpoint = Checkpoint(node="n", tool="t", rows=[RowCheck(table="t", key=key, row=row)])
        for _ in range(2):  # the second time the index is reused
            assert checkpoint_passed(checkpoint, frozen) == checkpoint_passed(checkpoint, plain), (key, row)
    assert checkpoint_passed(
        Checkpoint(node="n", tool="t", rows=[RowCheck(table="t", key={"id": 2}, row=rows[1])]), frozen
    )
