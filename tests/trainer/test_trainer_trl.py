"""ERPO is trl's GRPO with `scale_rewards="none"` on rewards divided by the env-level std.

The claim: for env e with kept-reward std s_e (unbiased, as `erpo_advantages`), feeding trl the
rewards R / (s_e + eps) makes trl's advantage R/(s_e+eps) - mean_group(R)/(s_e+eps), which is ERPO's
(R - mean_group(R)) / (s_e + eps). A user-error trajectory can be given to trl two ways: as
"unscorable" (the reward function returns None: trl makes it NaN, leaves it out of the group mean
and forces its advantage to 0), or as carrying its group's kept mean (which leaves the mean as it is,
so its advantage is exactly 0); an all-zero loss mask then keeps it out of the token count, which
trl's advantage path does not see.

How trl is exercised: one real `GRPOTrainer` step on a tiny local model, its advantages read back
(`tests/support/trl_grpo.py`). The batch has 2 envs on different reward scales, 5 tasks x 4
generations, masked trajectories and a zero-variance group.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from envforge.trainer import erpo_advantages, unbiased_std

from support.trl_grpo import trl_advantages

G = 4
EPS = 1e-6
# (env, task) -> rewards of its G generations; None marks a user-error (masked) trajectory.
BATCH: dict[tuple[str, str], list[float | None]] = {
    ("alpha", "a1"): [1.0, 0.0, 0.5, None],
    ("alpha", "a2"): [0.2, 0.2, 0.2, 0.2],  # zero variance: no signal under a task baseline
    ("alpha", "a3"): [1.0, 0.0, 0.0, 0.0],
    ("beta", "b1"): [3.0, 1.0, 2.0, 2.0],  # another reward scale
    ("beta", "b2"): [0.0, None, 4.0, 1.0],
}


def erpo_reference() -> dict[tuple[str, str, int], float]:
    rows = [(e, t, j, r) for (e, t), rs in BATCH.items() for j, r in enumerate(rs)]
    adv = erpo_advantages(
        [r if r is not None else 0.0 for *_, r in rows],
        [e for e, *_ in rows],
        [t for _, t, *_ in rows],
        [r is None for *_, r in rows],
        eps=EPS,
    )
    return {(e, t, j): a for (e, t, j, _), a in zip(rows, adv, strict=True)}


def trl_rewards(masked_as: str) -> dict[tuple[str, str, int], float | None]:
    """What trl gets: kept rewards over (env std + eps); masked ones as None or the kept group mean."""
    kept_by_env: dict[str, list[float]] = defaultdict(list)
    for (e, _), rs in BATCH.items():
        kept_by_env[e] += [r for r in rs if r is not None]
    scale = {e: unbiased_std(xs) + EPS for e, xs in kept_by_env.items()}
    out: dict[tuple[str, str, int], float | None] = {}
    for (e, t), rs in BATCH.items():
        kept = [r for r in rs if r is not None]
        for j, r in enumerate(rs):
            if r is None:
                out[(e, t, j)] = None if masked_as == "none" else sum(kept) / len(kept) / scale[e]
            else:
                out[(e, t, j)] = r / scale[e]
    return out


def run_trl_step(tmp_path: Path, masked_as: str) -> dict[tuple[str, str, int], float]:
    """One GRPOTrainer step; returns the advantages trl hands to its loss, keyed like `erpo_reference`."""
    theirs = trl_advantages(
        tmp_path, list(BATCH), trl_rewards(masked_as), G, scale_rewards="none", name=masked_as
    )
    assert sorted(theirs) == sorted(erpo_reference())
    return theirs


@pytest.mark.parametrize("masked_as", ["none", "kept_mean"])
def test_erpo_equals_trl_grpo_without_std_scaling(tmp_path: Path, masked_as: str) -> None:
    ours = erpo_reference()
    theirs = run_trl_step(tmp_path, masked_as)
    for key, value in ours.items():
        assert theirs[key] == pytest.approx(value, abs=1e-5), key
    # The cases that make the comparison mean something are really in the batch:
    assert ours[("alpha", "a1", 3)] == 0.0 and ours[("beta", "b2", 1)] == 0.0
    assert all(ours[("alpha", "a2", j)] == 0.0 for j in range(G))
    assert ours[("beta", "b1", 0)] != pytest.approx(ours[("alpha", "a3", 0)])
    # ... and GRPO's own per-group std would not have given ERPO's numbers.
    group = [r for r in BATCH[("alpha", "a3")] if r is not None]
    grpo_a3 = (1.0 - sum(group) / len(group)) / (unbiased_std(group) + EPS)
    assert grpo_a3 != pytest.approx(ours[("alpha", "a3", 0)], abs=1e-3)
