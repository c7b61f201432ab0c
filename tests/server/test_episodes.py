"""Episodes are isolated, bounded, expire when idle, and free their threads."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from envforge.server import EpisodeLimitReached, EpisodeNotFound, Fleet, on_db_thread


async def test_concurrent_episodes_never_see_each_others_writes(bank_env):
    fleet = Fleet([bank_env])
    eps = [await fleet.create_episode("bank") for _ in range(8)]

    async def work(i: int, ep_id: str) -> None:
        for _ in range(5):
            r = await fleet.call(ep_id, "transfer", {"src": "A-1", "dst": "A-2", "amount": i + 1})
            assert not r.is_error, r.text

    async with anyio.create_task_group() as tg:
        for i, ep in enumerate(eps):
            tg.start_soon(work, i, ep.id)
    for i, ep in enumerate(eps):
        state, _ = await fleet.export(ep.id)
        balances = {a["account_id"]: a["balance"] for a in state["accounts"]}
        assert balances["A-1"] == 100.0 - 5 * (i + 1)
        assert balances["A-2"] == 50.0 + 5 * (i + 1)
        assert len(state["transfers"]) == 5
    await fleet.aclose()


async def test_calls_within_one_episode_are_serialised(bank_env):
    fleet = Fleet([bank_env])
    ep = await fleet.create_episode("bank")
    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(fleet.call, ep.id, "transfer", {"src": "A-1", "dst": "A-2", "amount": 5})
    state, _ = await fleet.export(ep.id)
    assert {a["account_id"]: a["balance"] for a in state["accounts"]}["A-1"] == 0.0
    assert len(state["transfers"]) == 20
    await fleet.aclose()


async def test_episode_from_given_state_and_volatile_columns(bank_env):
    fleet = Fleet([bank_env])
    seed = bank_env.seed_state()
    state = {k: [dict(r) for r in v] for k, v in seed.items()}
    state["accounts"][0]["balance"] = 1.25
    ep = await fleet.create_episode("bank", state=state)
    exported, _ = await fleet.export(ep.id)
    assert exported["accounts"][0]["balance"] == 1.25
    # memo is volatile: two transfers differing only in memo export identically
    a = await fleet.create_episode("bank")
    b = await fleet.create_episode("bank")
    await fleet.call(a.id, "transfer", {"src": "A-1", "dst": "A-2", "amount": 1, "memo": "x"})
    await fleet.call(b.id, "transfer", {"src": "A-1", "dst": "A-2", "amount": 1, "memo": "y"})
    assert (await fleet.export(a.id))[1] == (await fleet.export(b.id))[1]
    with pytest.raises(ValueError, match="unknown table 'nope'"):
        await fleet.create_episode("bank", state={"nope": []})
    await fleet.aclose()


async def test_limit_and_ttl_expiry_free_episodes_and_connections(bank_env):
    fleet = Fleet([bank_env], max_episodes=5, ttl_seconds=0.2)
    eps = [await fleet.create_episode("bank") for _ in range(5)]
    with pytest.raises(EpisodeLimitReached):
        await fleet.create_episode("bank")
    await anyio.sleep(0.3)
    fresh = await fleet.create_episode("bank")  # creation reaps the expired ones first
    assert fleet.store.ids() == [fresh.id] and fleet.store.expired == 5
    with pytest.raises(EpisodeNotFound):
        fleet.store.get(eps[0].id)
    assert all(ep.closed and ep.conn.closed for ep in eps)  # sqlite connections released
    await fleet.close_episode(fresh.id)
    with pytest.raises(EpisodeNotFound):
        await fleet.close_episode(fresh.id)
    await fleet.aclose()


async def test_thread_count_does_not_grow_with_episodes(bank_env):
    fleet = Fleet([bank_env], max_episodes=300)
    await fleet.create_episode("bank")  # starts the shared workers if no test has yet
    threads_before = threading.active_count()
    eps = [await fleet.create_episode("bank") for _ in range(200)]
    async with anyio.create_task_group() as tg:
        for ep in eps:
            tg.start_soon(fleet.call, ep.id, "transfer", {"src": "A-1", "dst": "A-2", "amount": 1})
    assert threading.active_count() <= threads_before + fleet.store.pool.size
    for ep in eps[:5]:
        assert len((await fleet.export(ep.id))[0]["transfers"]) == 1
    await fleet.aclose()
    assert len(fleet.store) == 0


async def test_reaper_task_expires_idle_episodes(bank_env):
    fleet = Fleet([bank_env], ttl_seconds=0.1)
    ep = await fleet.create_episode("bank")
    async with anyio.create_task_group() as tg:
        tg.start_soon(fleet.store.run_reaper, 0.02)
        await anyio.sleep(0.3)
        tg.cancel_scope.cancel()
    assert fleet.store.find(ep.id) is None
    assert ep.closed


async def test_episode_creation_is_fast_for_a_megabyte(bank_env):
    """Functional guard only (the benchmark measures properly): a 1 MB clone takes well under 50 ms."""
    seed = bank_env.seed_state()
    state = {k: [dict(r) for r in v] for k, v in seed.items()}
    state["transfers"] = [
        {"transfer_id": i, "src": "A-1", "dst": "A-2", "amount": 1.0, "memo": "x" * 200}
        for i in range(1, 4500)
    ]
    data = bank_env.database_from_state(state)
    assert len(data) > 1_000_000
    fleet = Fleet([bank_env])
    t0 = time.perf_counter()
    ep = await fleet.store.create(bank_env, data)
    assert time.perf_counter() - t0 < 0.05
    assert len((await fleet.export(ep.id))[0]["transfers"]) == 4499
    await fleet.aclose()


async def test_export_rereads_only_written_tables_and_stays_exact(bank_env):
    from envforge.server import export_state

    fleet = Fleet([bank_env])
    ep = await fleet.create_episode("bank")

    async def full() -> dict:
        return await on_db_thread(
            ep.conn, export_state, ep.conn.raw, bank_env.tables, bank_env.manifest.volatile_columns
        )

    assert ep.tracker.written == set() and await ep.export() == await full()
    await fleet.call(ep.id, "freeze_accounts", {"account_ids": ["A-2"]})
    assert ep.tracker.written == {"accounts"}
    state = await ep.export()
    assert state == await full()
    assert state["customers"] is bank_env.seed_state()["customers"]  # unwritten: shared, not re-read
    # a probe (the synthesiser's footprint) rides on the tracker without blinding it
    seen: list[int] = []
    await ep.set_probe(lambda action, *rest: seen.append(action) or 0)
    await fleet.call(ep.id, "transfer", {"src": "A-1", "dst": "A-2", "amount": 5})
    await ep.set_probe(None)
    assert seen and ep.tracker.written == {"accounts", "transfers"}
    assert await ep.export() == await full()
    await fleet.aclose()
