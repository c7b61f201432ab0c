"""The shared SQLite thread outlives an event loop that closes with a job still queued.

Episodes of every run in a process share one SQLite worker thread (`server.dbthreads`). A run
that ends (its loop closed) while a job of it is still on that thread used to kill the thread when
the result was handed back to the dead loop, and every later episode in the process, on any
loop, then waited forever: the next pytest test hung, as would a second `train()` or `run_eval()`
in one process. The attack: close a loop with a slow job queued, then use a fresh loop.
"""

from __future__ import annotations

import asyncio
import threading
import time

import anyio

from envforge.server import Fleet, load_env, on_db_thread

from support.paths import REPO


def test_a_job_left_behind_by_a_closed_loop_does_not_kill_the_db_thread() -> None:
    env = load_env(REPO / "envs" / "library")
    started = threading.Event()

    async def leave_a_job_behind() -> None:
        fleet = Fleet([env])
        episode = await fleet.create_episode(env.name)

        def slow() -> int:
            started.set()
            time.sleep(0.5)
            return 1

        job = asyncio.ensure_future(on_db_thread(episode.conn, slow))
        while not started.is_set():
            await asyncio.sleep(0.01)
        job.cancel()  # the loop ends now; the thread finishes `slow` after it is closed

    asyncio.run(leave_a_job_behind())
    time.sleep(0.8)  # the result is handed back to the closed loop

    async def use_a_fresh_loop() -> int:
        fleet = Fleet([env])
        with anyio.fail_after(10):
            episode = await fleet.create_episode(env.name)
            return await on_db_thread(episode.conn, lambda: 2)

    assert asyncio.run(use_a_fresh_loop()) == 2
