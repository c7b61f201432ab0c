"""ERPO advantages against hand-computed values: masking, single-trajectory env, zero variance, baselines."""

from __future__ import annotations

import math
import statistics

import pytest

from envforge.trainer import env_batch_stats, erpo_advantages, unbiased_std

EPS = 1e-6


def test_task_baseline_env_std_by_hand() -> None:
    # env a: task t1 rewards [1, 0], task t2 rewards [1, 1]; env b: task u1 [0.5, 0.0]
    rewards = [1.0, 0.0, 1.0, 1.0, 0.5, 0.0]
    envs = ["a", "a", "a", "a", "b", "b"]
    tasks = ["t1", "t1", "t2", "t2", "u1", "u1"]
    adv = erpo_advantages(rewards, envs, tasks, [False] * 6)
    std_a = statistics.stdev([1.0, 0.0, 1.0, 1.0])  # 0.5 (unbiased)
    std_b = statistics.stdev([0.5, 0.0])
    assert std_a == pytest.approx(0.5)
    want = [0.5 / (std_a + EPS), -0.5 / (std_a + EPS), 0.0, 0.0, 0.25 / (std_b + EPS), -0.25 / (std_b + EPS)]
    assert adv == pytest.approx(want, rel=1e-9)


def test_masked_excluded_from_means_and_std() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0]
    envs = ["a"] * 5
    tasks = ["t1", "t1", "t1", "t2", "t2"]
    masked = [False, False, True, False, True]  # a masked 0 in t1 would pull its mean to 1/3
    adv = erpo_advantages(rewards, envs, tasks, masked)
    std = statistics.stdev([1.0, 0.0, 1.0])
    assert adv == pytest.approx([0.5 / (std + EPS), -0.5 / (std + EPS), 0.0, 0.0, 0.0])
    assert adv[2] == 0.0 and adv[4] == 0.0


def test_single_kept_trajectory_env_has_zero_std_and_zero_advantage() -> None:
    adv = erpo_advantages([0.7, 0.2], ["a", "a"], ["t", "t"], [False, True])
    assert unbiased_std([0.7]) == 0.0
    assert adv == [0.0, 0.0]
    # env baseline with one kept trajectory: still R - mean = 0
    assert erpo_advantages([0.7], ["a"], ["t"], [False], baseline="env") == [0.0]


def test_zero_variance_group_gets_zero_but_others_use_env_std() -> None:
    rewards = [1.0, 1.0, 1.0, 0.0]
    envs = ["a"] * 4
    tasks = ["t1", "t1", "t2", "t2"]
    adv = erpo_advantages(rewards, envs, tasks, [False] * 4)
    std = statistics.stdev(rewards)
    assert adv[:2] == [0.0, 0.0]
    assert adv[2:] == pytest.approx([0.5 / (std + EPS), -0.5 / (std + EPS)])
    stats = env_batch_stats(rewards, envs, tasks, [False] * 4)["a"]
    assert stats.zero_variance_groups == 1 and stats.groups == 2 and stats.kept == 4
    assert stats.reward_std == pytest.approx(std)


def test_env_baseline_vs_task_baseline() -> None:
    rewards = [1.0, 0.0, 1.0, 1.0]
    envs = ["a"] * 4
    tasks = ["t1", "t1", "t2", "t2"]
    std = statistics.stdev(rewards)
    env_adv = erpo_advantages(rewards, envs, tasks, [False] * 4, baseline="env")
    mean = 0.75
    assert env_adv == pytest.approx([(r - mean) / (std + EPS) for r in rewards])
    task_adv = erpo_advantages(rewards, envs, tasks, [False] * 4, baseline="task")
    assert task_adv != pytest.approx(env_adv)


def test_grpo_variant_uses_group_std() -> None:
    rewards = [1.0, 0.0, 0.2, 0.0]
    envs = ["a"] * 4
    tasks = ["t1", "t1", "t2", "t2"]
    grpo = erpo_advantages(rewards, envs, tasks, [False] * 4, advantage="grpo")
    s1, s2 = statistics.stdev([1.0, 0.0]), statistics.stdev([0.2, 0.0])
    assert grpo == pytest.approx([0.5 / (s1 + EPS), -0.5 / (s1 + EPS), 0.1 / (s2 + EPS), -0.1 / (s2 + EPS)])
    # GRPO blows the small t2 spread up to the same scale as t1; ERPO keeps it 5x smaller
    erpo = erpo_advantages(rewards, envs, tasks, [False] * 4)
    assert grpo[2] == pytest.approx(grpo[0], rel=1e-4) and erpo[2] == pytest.approx(erpo[0] / 5)


def test_matches_torch_std_and_masked_stats() -> None:
    import torch  # installed by `make` (the train extra): missing it is a failure, not a skip

    rewards = [0.3, 0.9, 0.1, 0.4, 0.8]
    assert unbiased_std(rewards) == pytest.approx(float(torch.tensor(rewards).std()))
    stats = env_batch_stats([1.0, 0.0, 5.0], ["a", "a", "b"], ["t", "t", "u"], [False, False, True])
    assert stats["b"].kept == 0 and stats["b"].masked == 1 and stats["a"].masked == 0
    assert not math.isnan(stats["b"].reward_std)


def test_length_mismatch_raises() -> None:
    with pytest.raises(ValueError):
        erpo_advantages([1.0], ["a", "b"], ["t"], [False])
