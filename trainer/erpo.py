"""ERPO advantages: task-mean baseline, environment-level standard deviation, user errors masked out.

For environment e, task i, trajectory j with reward R_ij, over trajectories kept (no user error):

    A_ij = (R_ij - mean_j R_ij) / (std over all kept R of env e + eps)

Why the env-level std: GRPO divides by each group's own std, which blows a tiny within-task spread
up to unit scale and gives easy/solved tasks the same weight as informative ones. Dividing by one
std per environment keeps rewards comparable across the tasks of an env while still normalising
envs whose reward scales differ. Trajectories spoiled by the simulated user carry no signal about
the policy, so they are excluded from every mean, std and token count and get advantage 0.

This module is pure Python (no torch) so the harness, the CLI and tests can use it anywhere; the
std is the unbiased one (torch's default), 0 when fewer than two trajectories are kept.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

Baseline = Literal["task", "env"]
AdvantageKind = Literal["erpo", "grpo"]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def unbiased_std(xs: Sequence[float]) -> float:
    """Sample std (n - 1 denominator, as `torch.std`); 0 when fewer than two values."""
    n = len(xs)
    if n < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def erpo_advantages(
    rewards: Sequence[float],
    env_ids: Sequence[str],
    task_ids: Sequence[str],
    masked: Sequence[bool],
    baseline: Baseline = "task",
    eps: float = 1e-6,
    advantage: AdvantageKind = "erpo",
) -> list[float]:
    """One advantage per trajectory; masked entries get 0.0.

    `baseline="task"`: subtract the mean of the kept trajectories of the same (env, task);
    `baseline="env"`: subtract the mean of the env's kept trajectories.
    `advantage="grpo"`: divide by the std of the trajectory's own group (same baseline grouping)
    instead of the env-level std, for comparison.
    """
    n = len(rewards)
    if not (len(env_ids) == len(task_ids) == len(masked) == n):
        raise ValueError("rewards, env_ids, task_ids and masked must have the same length")
    if baseline not in ("task", "env"):
        raise ValueError(f"unknown baseline {baseline!r}")
    if advantage not in ("erpo", "grpo"):
        raise ValueError(f"unknown advantage {advantage!r}")
    by_env: dict[str, list[float]] = defaultdict(list)
    by_group: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r, e, t, m in zip(rewards, env_ids, task_ids, masked, strict=True):
        if m:
            continue
        by_env[e].append(float(r))
        by_group[(e, t if baseline == "task" else "")].append(float(r))
    env_std = {e: unbiased_std(xs) for e, xs in by_env.items()}
    group_mean = {g: _mean(xs) for g, xs in by_group.items()}
    group_std = {g: unbiased_std(xs) for g, xs in by_group.items()}
    out: list[float] = []
    for r, e, t, m in zip(rewards, env_ids, task_ids, masked, strict=True):
        if m:
            out.append(0.0)
            continue
        g = (e, t if baseline == "task" else "")
        std = env_std[e] if advantage == "erpo" else group_std[g]
        out.append((float(r) - group_mean[g]) / (std + eps))
    return out


class EnvBatchStats(BaseModel):
    """What one step saw of one env: logged so a collapsing env or a noisy user is visible."""

    kept: int
    masked: int
    reward_mean: float
    reward_std: float
    groups: int
    zero_variance_groups: int


def env_batch_stats(
    rewards: Sequence[float], env_ids: Sequence[str], task_ids: Sequence[str], masked: Sequence[bool]
) -> dict[str, EnvBatchStats]:
    """Per env: kept/masked counts, kept reward mean/std, and task groups whose kept rewards are all equal
    (those contribute no gradient under a task baseline)."""
    envs: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    masked_count: dict[str, int] = defaultdict(int)
    for r, e, t, m in zip(rewards, env_ids, task_ids, masked, strict=True):
        envs[e]
        if m:
            masked_count[e] += 1
        else:
            envs[e][t].append(float(r))
    out: dict[str, EnvBatchStats] = {}
    for e, groups in envs.items():
        kept = [r for xs in groups.values() for r in xs]
        out[e] = EnvBatchStats(
            kept=len(kept),
            masked=masked_count[e],
            reward_mean=_mean(kept),
            reward_std=unbiased_std(kept),
            groups=len(groups),
            zero_variance_groups=sum(1 for xs in groups.values() if max(xs) == min(xs)),
        )
    return out
