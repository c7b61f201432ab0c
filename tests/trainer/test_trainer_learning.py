"""Learning: a tiny random model learns which of four buttons the bandit env rewards.

Real parts end to end: an env folder in tmp, SQLite episodes, tool calls over in-process MCP, the
reward from `score_episode`, a tiny Qwen2 model with a locally built tokenizer, the async loop.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from envforge.server import Fleet, load_env
from envforge.trainer import (
    FleetRolloutEnv,
    HFBackend,
    Learner,
    LearnerConfig,
    RolloutConfig,
    TrainConfig,
    bandit_corpus,
    bandit_tasks,
    build_tiny_model,
    load_tokenizer,
    train,
    write_bandit_env,
)


async def test_bandit_reward_rises_from_chance_to_08(tmp_path: Path) -> None:
    fleet = Fleet([load_env(write_bandit_env(tmp_path))])
    tasks = await bandit_tasks(fleet, "bandit", n=2)
    model_dir = build_tiny_model(tmp_path / "model", bandit_corpus(), base_corpus=False, seed=0)
    tok = load_tokenizer(model_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    backend = HFBackend(model, eos_id=tok.eos_token_id, seed=0)
    learner = Learner(model, LearnerConfig(lr=0.01), pad_id=tok.pad_token_id)
    env = FleetRolloutEnv(fleet, "bandit", tasks)
    config = TrainConfig(
        steps=30,
        tasks_per_step=2,
        rollouts_per_task=8,
        staleness=1,
        seed=0,
        rollout=RolloutConfig(max_turns=1, max_new_tokens=1),
    )
    metrics = await train([env], backend, learner, tok, config)
    curve = [round(m.reward_mean, 3) for m in metrics]
    print("reward per step:", curve)
    # chance: one of ~14 vocabulary tokens is `press_green`
    assert sum(curve[:2]) / 2 <= 0.35, curve
    assert sum(curve[-5:]) / 5 >= 0.8, curve
    first_hit = next(i for i, r in enumerate(curve) if r >= 0.8)
    assert first_hit <= 25, curve
    assert all(m.staleness_max <= 1 for m in metrics)
    assert all(set(m.per_env) == {"bandit"} and m.per_env["bandit"].groups == 2 for m in metrics)
