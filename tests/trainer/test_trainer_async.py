"""Async collection: generation keeps running while the learner updates, within the staleness bound."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from transformers import AutoModelForCausalLM

from envforge.server import Fleet, load_env
from envforge.trainer import (
    FleetRolloutEnv,
    Group,
    HFBackend,
    Learner,
    LearnerConfig,
    RolloutConfig,
    TrainConfig,
    bandit_corpus,
    bandit_tasks,
    build_tiny_model,
    load_tokenizer,
    select_batch,
    train,
    write_bandit_env,
)


class Slow:
    """Wraps a backend: each generation sleeps first and its wall time is recorded."""

    def __init__(self, inner: HFBackend, delay: float) -> None:
        self.inner, self.delay = inner, delay
        self.eos_id = inner.eos_id
        self.calls: list[tuple[float, float]] = []

    @property
    def version(self) -> int:
        return self.inner.version

    def session(self):
        return self.inner.session()

    async def generate(self, prompt_ids, *, max_new_tokens, seed=None, session=None):
        start = time.time()
        await anyio.sleep(self.delay)
        g = await self.inner.generate(prompt_ids, max_new_tokens=max_new_tokens, session=session)
        self.calls.append((start, time.time()))
        return g

    async def sync_weights(self, state_dict, version, model=None):
        await self.inner.sync_weights(state_dict, version, model)


class SlowLearner(Learner):
    def step(self, trajs):
        time.sleep(0.15)  # a slow update, so overlap is measurable
        return super().step(trajs)


@pytest.mark.parametrize("staleness", [0, 1])
async def test_collection_overlaps_updates_within_staleness(tmp_path: Path, staleness: int) -> None:
    envs_dirs = [write_bandit_env(tmp_path, "bandit_a"), write_bandit_env(tmp_path, "bandit_b")]
    fleet = Fleet([load_env(d) for d in envs_dirs])
    envs = [
        FleetRolloutEnv(fleet, name, await bandit_tasks(fleet, name, n=3), use_mcp=False)
        for name in ("bandit_a", "bandit_b")
    ]
    model_dir = build_tiny_model(tmp_path / "model", bandit_corpus(), base_corpus=False)
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    backend = Slow(HFBackend(model, eos_id=tok.eos_token_id, seed=0), delay=0.03)
    learner = SlowLearner(model, LearnerConfig(lr=0.01), pad_id=tok.pad_token_id)
    config = TrainConfig(
        steps=4,
        tasks_per_step=4,
        rollouts_per_task=2,
        staleness=staleness,
        collectors=3,
        rollout=RolloutConfig(max_turns=1, max_new_tokens=1),
    )
    metrics = await train(envs, backend, learner, tok, config)
    assert len(metrics) == 4
    updates = [(m.update_started, m.update_finished) for m in metrics]
    overlapping = [c for c in backend.calls if any(c[0] < u1 and c[1] > u0 for u0, u1 in updates)]
    for m in metrics:
        assert m.staleness_max <= staleness and len(m.staleness) == 8
        assert set(m.per_env) == {"bandit_a", "bandit_b"}
        assert all(s.groups >= 2 for s in m.per_env.values())
    # no group is played only to be dropped as stale: generation waits for the weights it needs
    assert metrics[-1].dropped_stale_total == 0
    if staleness == 0:
        # synchronous: every generation used, none during an update (it would be one version behind)
        assert not overlapping, "staleness 0 generated during an update"
    else:
        assert overlapping, "no generation ran while an update was running"
        # at most one batch ahead: what the steps used plus the next batch (and the groups in flight)
        assert len(backend.calls) <= (len(metrics) + 1) * 8 + config.collectors * 2


def _g(env: str, task: str, i: int) -> Group:
    return Group(env=env, task_id=task, index=i, trajectories=[], version=0, started_at=0, finished_at=0)


def test_select_batch_needs_two_distinct_tasks_per_env() -> None:
    pool = [_g("a", "t1", 0), _g("a", "t1", 1), _g("b", "u1", 2), _g("a", "t2", 3)]
    assert select_batch(pool, ["a", "b"], 4) is None  # b has one task only
    pool.append(_g("b", "u2", 4))
    batch = select_batch(pool, ["a", "b"], 4)
    assert batch is not None and [g.index for g in batch] == [0, 3, 2, 4]
    assert select_batch(pool, ["a", "b"], 5) is None  # no fifth distinct (env, task)


async def test_staleness_0_gets_past_a_repeated_task(tmp_path: Path) -> None:
    """With two tasks, one shuffled cycle can end on the task the next begins with, so the groups
    granted for a batch hold one task twice: the loop must let one more group start, not wait."""
    fleet = Fleet([load_env(write_bandit_env(tmp_path))])
    env = FleetRolloutEnv(fleet, "bandit", await bandit_tasks(fleet, "bandit", n=2), use_mcp=False)
    model_dir = build_tiny_model(tmp_path / "model", bandit_corpus(), base_corpus=False)
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    backend = HFBackend(model, eos_id=tok.eos_token_id, seed=0)
    learner = Learner(model, LearnerConfig(lr=0.01), pad_id=tok.pad_token_id)
    config = TrainConfig(
        steps=8,
        tasks_per_step=2,
        rollouts_per_task=2,
        staleness=0,
        collectors=2,
        seed=1,
        rollout=RolloutConfig(max_turns=1, max_new_tokens=1),
    )
    with anyio.fail_after(120):
        metrics = await train([env], backend, learner, tok, config)
    assert len(metrics) == 8 and all(m.staleness_max == 0 for m in metrics)
