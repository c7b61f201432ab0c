"""Batched generation: concurrent episodes decode together, sample what each would alone, batch the
same way whatever the timing (so seeded episodes repeat), and never stall on a session that stays
away, a cancelled request or a failing model."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from transformers import AutoModelForCausalLM

from envforge.server import Fleet, load_env
from envforge.trainer import (
    BatchRequest,
    FleetRolloutEnv,
    HFBackend,
    LockstepBatcher,
    RolloutConfig,
    bandit_corpus,
    bandit_tasks,
    build_tiny_model,
    collect,
    load_tokenizer,
    token_logprobs,
    write_bandit_env,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m"), bandit_corpus(), hidden_size=64, layers=2, seed=7)


def prompts(model_dir: Path, n: int) -> list[list[int]]:
    """`n` prompts of different lengths (so a batch is padded)."""
    tok = load_tokenizer(model_dir)
    words = "press the green button then the red one and say which you pressed".split()
    return [tok.encode(" ".join(words[: 3 + (5 * i) % len(words)])) for i in range(n)]


def backend(model_dir: Path, **kw: object) -> HFBackend:
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return HFBackend(model, eos_id=tok.eos_token_id, **kw)  # type: ignore[arg-type]


async def generate_all(
    b: HFBackend, items: list[list[int]], *, max_new: int, seeds: list[int | None]
) -> list:
    out: list = [None] * len(items)

    async def one(i: int) -> None:
        async with b.session() as s:
            out[i] = await b.generate(items[i], max_new_tokens=max_new, seed=seeds[i], session=s)

    async with anyio.create_task_group() as tg:
        for i in range(len(items)):
            tg.start_soon(one, i)
    return out


async def test_concurrent_requests_decode_as_one_batch_and_match_each_alone(model_dir: Path) -> None:
    items = prompts(model_dir, 6)
    batched = backend(model_dir, temperature=0.0)
    together = await generate_all(batched, items, max_new=12, seeds=[None] * 6)
    assert batched.batcher.chunks == [6]  # one forward loop for all six, not six
    alone = backend(model_dir, temperature=0.0)
    for item, got in zip(items, together, strict=True):
        want = await alone.generate(item, max_new_tokens=12)
        assert got.token_ids == want.token_ids  # greedy: padding changes nothing
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    assert alone.batcher.chunks == [1] * 6


async def test_a_shared_prompt_prefix_runs_once_and_changes_nothing(model_dir: Path) -> None:
    """Episodes open with the same system prompt: it is run once for the chunk, and each row still
    samples what it would alone."""
    tok = load_tokenizer(model_dir)
    system = tok.encode(" ".join(["press the green button"] * 12))
    items = [system + p for p in prompts(model_dir, 5)]
    b = backend(model_dir, temperature=0.0)
    shapes: list[tuple[int, ...]] = []
    b.model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    together = await generate_all(b, items, max_new=8, seeds=[None] * 5)
    assert shapes[0][0] == 1 and len(system) <= shapes[0][1] < len(system) + 8  # the common prefix, once
    assert shapes[1][0] == 5 and shapes[1][1] < max(len(i) for i in items) - len(system)
    alone = backend(model_dir, temperature=0.0)
    for item, got in zip(items, together, strict=True):
        want = await alone.generate(item, max_new_tokens=8)
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)


async def test_sampled_logprobs_are_the_models_own(model_dir: Path) -> None:
    """A padded row's stored logprobs are what the learner computes for the unpadded sequence."""
    items = prompts(model_dir, 5)
    b = backend(model_dir, temperature=1.0)
    gens = await generate_all(b, items, max_new=10, seeds=list(range(5)))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    for item, g in zip(items, gens, strict=True):
        ids = torch.tensor([item + g.token_ids])
        lp = token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0][len(item) - 1 :]
        assert lp.tolist() == pytest.approx(g.logprobs, abs=1e-4)


async def test_rows_that_finish_early_leave_the_batch(model_dir: Path) -> None:
    items = prompts(model_dir, 4)
    b = backend(model_dir, temperature=0.0)
    out: list = [None] * 4

    async def one(i: int) -> None:
        async with b.session() as s:
            out[i] = await b.generate(items[i], max_new_tokens=2 + 4 * i, session=s)

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(one, i)
    assert [len(g.token_ids) for g in out] == [2, 6, 10, 14] or any(g.finish_reason == "stop" for g in out)
    alone = backend(model_dir, temperature=0.0)
    assert out[3].token_ids == (await alone.generate(items[3], max_new_tokens=14)).token_ids


async def episodes(b: HFBackend, items: list[list[int]], jitter_seed: int) -> list[list[int]]:
    """Three-turn episodes whose 'tool calls' take random time: the tokens must not depend on it."""
    rng = random.Random(jitter_seed)
    delays = [[rng.uniform(0, 0.05) for _ in range(3)] for _ in items]
    out: list[list[int]] = [[] for _ in items]

    async def one(i: int) -> None:
        async with b.session() as s:
            context = list(items[i])
            for turn in range(3):
                g = await b.generate(context, max_new_tokens=4, seed=100 * i + turn, session=s)
                out[i] += g.token_ids
                await anyio.sleep(delays[i][turn])  # a tool call
                context += g.token_ids + items[(i + turn) % len(items)][:3]

    async with anyio.create_task_group() as tg:
        for i in range(len(items)):
            tg.start_soon(one, i)
    return out


async def test_same_seeds_same_tokens_and_batches_whatever_the_timing(model_dir: Path) -> None:
    items = prompts(model_dir, 7)
    first, second = backend(model_dir), backend(model_dir)
    a = await episodes(first, items, jitter_seed=1)
    b = await episodes(second, items, jitter_seed=2)
    assert a == b
    assert first.batcher.chunks == second.batcher.chunks == [7, 7, 7]


def echo_chunks(log: list[list[int]]):
    def run(chunk: Sequence[BatchRequest[str]]) -> list[str]:
        log.append([r.session for r in chunk])
        time.sleep(0.01)
        return [f"done {r.prompt_ids}" for r in chunk]

    return run


async def test_a_round_takes_every_waiting_session_in_order_in_even_chunks() -> None:
    log: list[list[int]] = []
    batcher: LockstepBatcher[str] = LockstepBatcher(echo_chunks(log), max_batch=4)
    results: dict[int, str] = {}

    async def one(i: int) -> None:
        async with batcher.session() as s:
            await anyio.sleep(0.001 * ((7 * i) % 5))  # arrive out of order
            results[i] = await batcher.submit([i], 1, None, s)

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)
    assert log == [[0, 1, 2], [3, 4, 5]]  # six at most four a chunk: 3 + 3, in session order
    assert results == {i: f"done [{i}]" for i in range(6)}


async def test_a_session_that_stays_away_does_not_stall_the_others() -> None:
    log: list[list[int]] = []
    batcher: LockstepBatcher[str] = LockstepBatcher(echo_chunks(log), max_batch=8, max_wait=0.2)
    finished: dict[str, float] = {}
    start = time.monotonic()

    async def slow() -> None:
        async with batcher.session():
            await anyio.sleep(3)  # e.g. an LLM user thinking, holding its session open

    async def fast() -> None:
        async with batcher.session() as s:
            await batcher.submit([1], 1, None, s)
            finished["fast"] = time.monotonic() - start

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow)
        tg.start_soon(fast)
        with anyio.fail_after(2):
            while "fast" not in finished:
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert finished["fast"] < 1.0


async def test_a_cancelled_request_is_dropped_and_the_rest_run() -> None:
    log: list[list[int]] = []
    batcher: LockstepBatcher[str] = LockstepBatcher(echo_chunks(log), max_batch=8, max_wait=5)
    got: dict[int, str] = {}

    async def one(i: int) -> None:
        async with batcher.session() as s:
            if i == 0:  # waits for a round that needs the third episode, then gives up
                with anyio.move_on_after(0.1):
                    await batcher.submit([0], 1, None, s)
                return
            if i == 2:
                await anyio.sleep(0.3)
            got[i] = await batcher.submit([i], 1, None, s)

    with anyio.fail_after(3):
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(one, i)
    assert got == {1: "done [1]", 2: "done [2]"}
    assert all(0 not in chunk for chunk in log)


async def test_a_model_error_fails_its_chunk_and_the_batcher_goes_on() -> None:
    calls = 0

    def flaky(chunk: Sequence[BatchRequest[str]]) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("out of memory")
        return ["ok" for _ in chunk]

    batcher: LockstepBatcher[str] = LockstepBatcher(flaky, max_batch=8)
    errors: list[str] = []

    async def one(i: int) -> None:
        try:
            await batcher.submit([i], 1, None)
        except RuntimeError as exc:
            errors.append(str(exc))

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(one, i)
    assert errors and set(errors) == {"out of memory"}
    assert await batcher.submit([9], 1, None) == "ok"


class JitteryEnv:
    """A real bandit env whose episodes take random time to answer a call, hear the user, score and
    close (up to `most` seconds each): the delays a slow tool, a database or a loaded machine add,
    which must not change what is sampled. The user asks once more, so the groups of both
    collectors end in the same round, and whose next group starts first is a matter of timing."""

    def __init__(self, inner: FleetRolloutEnv, seed: int, most: float) -> None:
        self.inner, self.name = inner, inner.name
        self.rng, self.most = random.Random(seed), most
        self.asks = dict.fromkeys(inner.task_ids(), 1)

    def task_ids(self) -> list[str]:
        return self.inner.task_ids()

    def tool_names(self) -> list[str]:
        return self.inner.tool_names()

    def system_prompt(self) -> str:
        return self.inner.system_prompt()

    async def pause(self) -> None:
        await anyio.sleep(self.rng.uniform(0, self.most))

    @asynccontextmanager
    async def episode(self, task_id: str) -> AsyncIterator[Any]:
        async with self.inner.episode(task_id) as ep:
            env = self
            asks_left = self.asks[task_id]

            class Episode:
                def initial_messages(self) -> list[dict[str, str]]:
                    return ep.initial_messages()

                async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
                    await env.pause()
                    return await ep.call_tool(name, arguments)

                async def user_reply(self, text: str) -> str | None:
                    nonlocal asks_left
                    await env.pause()
                    asks_left -= 1
                    return "Press a button." if asks_left >= 0 else None

                async def finish(self, agent_messages: list[str]) -> Any:
                    await env.pause()
                    return await ep.finish(agent_messages)

            yield Episode()
        await self.pause()


async def test_collectors_sample_the_same_whatever_their_episodes_cost(
    model_dir: Path, tmp_path: Path
) -> None:
    """Two collectors, several groups each: which requests share a batch (and so every sampled token)
    must not depend on when a collector's episodes end and its next group begins. (With collectors
    that each took their next job when free, the jittery runs batched 6, 6, 6, 6, 3, 6, 3 and
    6, 6, 3, 6, 3, 3, 6, 3 where the calm one batched 6 six times.)"""
    env_dir = write_bandit_env(tmp_path)
    tok = load_tokenizer(model_dir)
    fleet = Fleet([load_env(env_dir)])
    try:
        tasks = await bandit_tasks(fleet, "bandit", n=3)
        runs = []
        for jitter, most in ((0, 0.0), (1, 0.1), (2, 0.1)):
            b = backend(model_dir, seed=0, temperature=5.0)
            env = JitteryEnv(FleetRolloutEnv(fleet, "bandit", tasks, use_mcp=False), jitter, most)
            trajs = await collect(
                [env],  # type: ignore[list-item]
                b,
                tok,
                groups=6,
                rollouts_per_task=3,
                rollout_config=RolloutConfig(max_turns=3, max_new_tokens=3),
                concurrency=2,
            )
            played = sorted((t.group, t.task_id, t.token_ids) for t in trajs)
            runs.append((b.batcher.chunks, played))
    finally:
        await fleet.aclose()
    assert runs[0] == runs[1] == runs[2]
