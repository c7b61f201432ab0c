"""A confined env behaves exactly like the same env trusted: same tools, results, refusals, states.

The library env is loaded twice, as shipped (confined: tools in a sandboxed worker) and as a
trusted copy (imported in-process); the same calls must give the same text, error flag and final
state hash. The worker outlives an event loop (one per test here) instead of restarting.
"""

from __future__ import annotations

import asyncio
import gc
import shutil
from pathlib import Path

import pytest

from envforge.server import Environment, Fleet, load_env, run_inline

from support.paths import REPO

CALLS = [
    ("get_member", {"member_id": "M-1001"}),
    ("get_member", {"member_id": 5}),
    ("get_member", {"member_id": "M-0000"}),
    ("get_member", {}),
    ("get_member", {"member_id": "M-1001", "extra": 1}),
    ("search_books", {}),
    ("search_books", {"genre": "poetry"}),
    ("search_books", {"genre": "cooking"}),
    ("checkout_book", {"member_id": "M-1001", "book_id": "B-2001"}),
    ("checkout_book", {"member_id": "M-1001", "book_id": "B-2001"}),
    ("list_member_loans", {"member_id": "M-1001"}),
    ("no_such_tool", {}),
]


def _trusted_copy(tmp_path: Path) -> Environment:
    root = tmp_path / "library"
    shutil.copytree(REPO / "envs" / "library", root)
    manifest = (root / "env.toml").read_text().replace('trust = "confined"\n', "")
    (root / "env.toml").write_text(manifest)
    return load_env(root)


async def _play(env: Environment) -> tuple[list[tuple[str, bool]], str]:
    fleet = Fleet([env])
    try:
        ep = await fleet.create_episode(env.name)
        seen = []
        for name, args in CALLS:
            res = await fleet.call(ep.id, name, args)
            seen.append((res.text, res.is_error))
        return seen, (await fleet.export(ep.id))[1]
    finally:
        await fleet.aclose()


async def test_confined_and_trusted_give_the_same_answers(tmp_path: Path) -> None:
    confined = load_env(REPO / "envs" / "library")
    trusted = _trusted_copy(tmp_path)
    assert confined.manifest.trust == "confined" and trusted.manifest.trust == "trusted"
    assert {n: s.input_schema for n, s in confined.tools.items()} == {
        n: s.input_schema for n, s in trusted.tools.items()
    }
    assert {n: (s.writes, s.required, s.source_line) for n, s in confined.tools.items()} == {
        n: (s.writes, s.required, s.source_line) for n, s in trusted.tools.items()
    }
    assert await _play(confined) == await _play(trusted)


def test_the_worker_outlives_an_event_loop() -> None:
    env = load_env(REPO / "envs" / "library")
    first = asyncio.run(_play(env))
    second = asyncio.run(_play(env))
    assert first == second
    worker = env.tools["get_member"].fn.__closure__  # the forwarding function holds its worker
    starts = {c.cell_contents.starts for c in worker or () if hasattr(c.cell_contents, "starts")}
    assert starts == {1}


async def test_a_closed_fleet_leaves_no_pump_pending_in_a_loop_that_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`make demo` ran three evals in one loop, each loading the envs afresh: every dropped confined
    worker left its pump task pending, and asyncio logged "Task was destroyed but it is pending!"."""
    for _ in range(3):
        env = load_env(REPO / "envs" / "library")
        fleet = Fleet([env])
        episode = await fleet.create_episode(env.name)
        assert not (await fleet.call(episode.id, "get_member", {"member_id": "M-1001"})).is_error
        await fleet.aclose()
        del env, fleet, episode
        gc.collect()
        await asyncio.sleep(0.05)
    gc.collect()
    assert "Task was destroyed" not in caplog.text


async def test_synthesis_inline_connections_give_the_same_answers(tmp_path: Path) -> None:
    """Synthesis runs episodes on inline connections (SQL on the event loop's thread, no SQLite
    thread): a confined env's writes there must work as on pooled ones, without restarting the
    worker."""
    trusted = await _play(_trusted_copy(tmp_path))
    env = load_env(REPO / "envs" / "library")
    fleet = Fleet([env])
    run_inline(fleet)
    episode = await fleet.create_episode(env.name)
    played = [(r.text, r.is_error) for r in [await fleet.call(episode.id, n, a) for n, a in CALLS]]
    _, digest = await fleet.export(episode.id)
    await fleet.aclose()
    assert (played, digest) == trusted
    worker = env.tools["get_member"].fn.__closure__ or ()
    assert {c.cell_contents.starts for c in worker if hasattr(c.cell_contents, "starts")} == {1}
