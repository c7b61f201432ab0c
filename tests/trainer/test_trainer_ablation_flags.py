"""The ablation's arms are one config apart: `--advantage grpo` is trl's GRPO, `--no-mask-user-errors`
changes only what the detector flagged.

GRPO (group-level std, no mask) must be exactly what trl's `GRPOTrainer` computes with its default
`scale_rewards="group"` (its std epsilon is 1e-4) on the same batch, flagged trajectories included
as ordinary ones: one real trl step gives the reference (`support/trl_grpo.py`). Turning the mask
off must change the learner's inputs only on the flagged rows: its advantages equal those of the
same batch with nothing flagged, a group (GRPO) or env (ERPO) holding no flagged row keeps every
advantage it had with the mask on, and an infrastructure failure stays masked either way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from envforge.trainer import Learner, LearnerConfig, Trajectory, build_tiny_model, load_tokenizer

from support.trajectories import on_policy_rows
from support.trl_grpo import trl_advantages

G = 4
TRL_EPS = 1e-4
# (env, task) -> (reward, flagged by the detector) of its G generations; two envs, two scales.
BATCH: dict[tuple[str, str], list[tuple[float, bool]]] = {
    ("alpha", "a1"): [(1.0, False), (0.0, False), (0.5, False), (0.0, True)],
    ("alpha", "a2"): [(0.2, False), (0.2, False), (0.2, False), (0.2, False)],
    ("alpha", "a3"): [(1.0, False), (0.0, False), (0.0, False), (0.0, False)],
    ("beta", "b1"): [(3.0, False), (1.0, False), (2.0, False), (2.0, False)],
    ("beta", "b2"): [(0.0, False), (4.0, True), (4.0, False), (1.0, False)],
}
ROWS = [(e, t, j, r, f) for (e, t), rs in BATCH.items() for j, (r, f) in enumerate(rs)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m") / "model", ["solve the task"])


def trajectories(
    model_dir: Path, *, flagged: bool = True, reason: str = "user message 2 says X"
) -> list[Trajectory]:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trajs = on_policy_rows(
        model, load_tokenizer(model_dir), [(e, t, r, f and flagged) for e, t, _, r, f in ROWS]
    )
    for t in trajs:
        if t.user_error:
            t.user_error_reason = reason
    return trajs


def learner(model_dir: Path, **config: object) -> Learner:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return Learner(model, LearnerConfig(lr=0.0, **config), pad_id=0)  # type: ignore[arg-type]


def test_grpo_arm_equals_trls_grpo_on_the_same_batch(tmp_path: Path, model_dir: Path) -> None:
    ours = learner(model_dir, advantage="grpo", mask_user_errors=False, eps=TRL_EPS).advantages(
        trajectories(model_dir)
    )
    rewards: dict[tuple[str, str, int], float | None] = {(e, t, j): r for e, t, j, r, _ in ROWS}
    theirs = trl_advantages(tmp_path, list(BATCH), rewards, G, scale_rewards="group", name="grpo")
    for (e, t, j, _, _), value in zip(ROWS, ours, strict=True):
        assert theirs[(e, t, j)] == pytest.approx(value, abs=1e-5), (e, t, j)
    # The flagged rows are trained on like any other (not the 0.0 a mask gives) ...
    assert ours[3] != 0.0 and ours[17] != 0.0
    # ... and ERPO's env-level std would not have given trl's GRPO numbers.
    erpo = learner(model_dir, advantage="erpo", mask_user_errors=False, eps=TRL_EPS).advantages(
        trajectories(model_dir)
    )
    assert erpo[12] != pytest.approx(ours[12], abs=1e-3)


@pytest.mark.parametrize("advantage", ["grpo", "erpo"])
def test_mask_off_changes_only_what_the_flagged_rows_feed(model_dir: Path, advantage: str) -> None:
    trajs = trajectories(model_dir)
    on = learner(model_dir, advantage=advantage).step(trajs)
    off = learner(model_dir, advantage=advantage, mask_user_errors=False).step(trajs)
    clean = learner(model_dir, advantage=advantage).step(trajectories(model_dir, flagged=False))
    flagged = [i for i, row in enumerate(ROWS) if row[4]]
    assert flagged == [3, 17]
    # With the mask: flagged rows carry no advantage and no loss token; without it, exactly what a
    # batch with nothing flagged gets, token for token.
    assert all(on.advantages[i] == 0.0 and not any(on.token_advantages[i]) for i in flagged)
    assert off.advantages == pytest.approx(clean.advantages)
    assert off.token_advantages == clean.token_advantages
    assert (on.masked, off.masked) == (2, 0) and off.tokens == clean.tokens > on.tokens
    # Rows whose normalising set holds no flagged row are untouched by the flag.
    scope = {"grpo": lambda r: (r[0], r[1]), "erpo": lambda r: r[0]}[advantage]
    touched = {scope(ROWS[i]) for i in flagged}
    untouched = [i for i, r in enumerate(ROWS) if scope(r) not in touched]
    assert bool(untouched) == (advantage == "grpo")  # a2, a3, b1; under ERPO both envs hold a flag
    for i in untouched:
        assert off.advantages[i] == on.advantages[i]
        assert off.token_advantages[i] == on.token_advantages[i]
    changed = [i for i, (a, b) in enumerate(zip(on.advantages, off.advantages, strict=True)) if a != b]
    assert set(flagged) <= set(changed)


def test_erpo_mask_off_leaves_an_env_without_flags_alone(model_dir: Path) -> None:
    trajs = trajectories(model_dir)
    for t in trajs:  # only alpha's row stays flagged
        if t.env == "beta":
            t.user_error, t.user_error_reason = False, None
    on = learner(model_dir).advantages(trajs)
    off = learner(model_dir, mask_user_errors=False).advantages(trajs)
    assert all(off[i] == on[i] for i, row in enumerate(ROWS) if row[0] == "beta")
    # alpha: the flagged row now counts, and its env's std (ERPO's scale) moved every non-zero one
    assert on[3] == 0.0 != off[3]
    assert all(off[i] != on[i] for i, row in enumerate(ROWS) if row[1] == "a3")


def test_infrastructure_failures_stay_masked_without_the_mask(model_dir: Path) -> None:
    trajs = trajectories(model_dir, reason="infra_failure: user model timed out")
    off = learner(model_dir, mask_user_errors=False).step(trajs)
    assert off.masked == 2
    assert off.advantages[3] == 0.0 and not any(off.token_advantages[3])
