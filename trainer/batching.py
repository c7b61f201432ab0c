"""Lockstep batching of generation requests: concurrent episodes decode together, reproducibly.

On a CPU, decoding one token of a small model reads every weight once whatever the batch, so
episodes that decode together cost little more than one alone (Qwen2.5-0.5B on 2 cores: four rows
per step at ~2.8× the tokens/s of one). The episodes of a group, of several collectors and of a
held-out evaluation all run concurrently, so their requests are there to batch.

Which requests share a batch must not depend on timing, or the same seeds would sample different
tokens from one run to the next (a padded row's logits differ from an unpadded one's in the last
bits). So batches are formed in *rounds*: an episode opens a session, and a round starts only when
every open session is waiting for a generation; it takes all of them, in session order, in chunks
of `max_batch`. Episodes started in the same order then batch the same way, whatever their tool
calls cost. A session that stays away longer than `max_wait` (an LLM user thinking, a slow tool)
is not waited for past that: the round starts without it, and only then does timing matter.
A request made outside any session is a session of its own for its duration.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import anyio

Result = TypeVar("Result")


@dataclass
class BatchRequest(Generic[Result]):
    """One generation request; `result` or `error` is set when its chunk has run."""

    session: int
    prompt_ids: list[int]
    max_new_tokens: int
    seed: int | None
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Result | None = None
    error: BaseException | None = None


class LockstepBatcher(Generic[Result]):
    """Collects requests from sessions and runs them as rounds of chunks through `run_chunk`.

    `run_chunk` is blocking (a model forward loop); it runs in a worker thread, one chunk at a time,
    and returns one result per request, in order. All methods are called from one event loop.
    """

    def __init__(
        self,
        run_chunk: Callable[[Sequence[BatchRequest[Result]]], list[Result]],
        *,
        max_batch: int = 16,
        max_wait: float = 2.0,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run_chunk = run_chunk
        self.max_batch = max_batch
        self.max_wait = max_wait
        self._open: set[int] = set()
        self._pending: list[BatchRequest[Result]] = []
        self._next_session = 0
        self._running = False
        self._changed: anyio.Event | None = None  # made in the event loop, on first use
        self.rounds = 0
        self.chunks: list[int] = []
        """The size of every chunk run so far, in order (what the tests and benchmarks read)."""

    @asynccontextmanager
    async def session(self) -> AsyncIterator[int]:
        """Registers an episode: until it ends, no round starts without its next request (or
        `max_wait`). Registration happens before the first await, so sessions opened by tasks
        started together are numbered in the order the tasks were started."""
        sid = self._open_session()
        try:
            yield sid
        finally:
            self._open.discard(sid)
            self._notify()

    async def submit(
        self, prompt_ids: list[int], max_new_tokens: int, seed: int | None, session: int | None = None
    ) -> Result:
        """The result of one request, once its round has run it."""
        if session is None:
            async with self.session() as own:
                return await self.submit(prompt_ids, max_new_tokens, seed, own)
        req: BatchRequest[Result] = BatchRequest(session, list(prompt_ids), max_new_tokens, seed)
        self._pending.append(req)
        self._notify()
        try:
            # one turn of the event loop first: tasks started together register their sessions
            # in their first steps, which may come after this one's submit
            await anyio.lowlevel.checkpoint()
            while not req.done.is_set():
                if not self._running and self._round_ready():
                    await self._run_round()
                    continue
                changed = self._changed = self._changed or anyio.Event()
                with anyio.move_on_after(self.max_wait) as waited:
                    await changed.wait()
                if waited.cancelled_caught and not self._running and req in self._pending:
                    await self._run_round()  # a session stayed away too long: go without it
        finally:
            if req in self._pending:  # cancelled while waiting: nobody will run it
                self._pending.remove(req)
                self._notify()
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def _open_session(self) -> int:
        sid = self._next_session
        self._next_session += 1
        self._open.add(sid)
        return sid

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _round_ready(self) -> bool:
        if not self._pending:
            return False
        waiting = {r.session for r in self._pending}
        return self._open <= waiting

    async def _run_round(self) -> None:
        """Runs every pending request, in session order, in chunks of at most `max_batch` (sized
        evenly: 20 requests at a maximum of 16 run as 10 + 10, not 16 + 4)."""
        self._running = True
        batch = sorted(self._pending, key=lambda r: r.session)
        self._pending.clear()
        n_chunks = math.ceil(len(batch) / self.max_batch)
        size = math.ceil(len(batch) / n_chunks)
        chunks = [batch[i : i + size] for i in range(0, len(batch), size)]
        self.rounds += 1
        try:
            while chunks:
                chunk = chunks.pop(0)
                self.chunks.append(len(chunk))
                try:
                    results = await anyio.to_thread.run_sync(self._run_chunk, chunk)
                except Exception as exc:  # every request of the chunk fails with the model's error
                    for req in chunk:
                        req.error = exc
                        req.done.set()
                    continue
                for req, result in zip(chunk, results, strict=True):
                    req.result = result
                    req.done.set()
        finally:  # cancelled between chunks: what did not run goes back to wait for the next round
            self._pending[:0] = [r for c in chunks for r in c]
            self._running = False
            self._notify()
