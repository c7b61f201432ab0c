"""A gradient that is not finite never reaches the weights.

On an H200 the packaged 0.5B model's second bf16 update came back NaN from cuDNN's attention
backward, and the step was applied: every weight became NaN, the next sample tripped a CUDA assert
(or, at staleness 0, held-out reward went 0.60 -> 0.00). These tests attack the three defences on a
CPU with a real model: a recorded logprob of -inf (an inf importance ratio), a kernel that hands
back NaN gradients (a backward hook stands in for the broken cuDNN kernel, which a CPU never runs),
and the attention backend the learner's forward may use.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from envforge.trainer import Learner, LearnerConfig, Trajectory, bandit_corpus, build_tiny_model

from support.trajectories import on_policy_trajectories


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m"), bandit_corpus(), hidden_size=64, layers=2, seed=3)


def batch(model_dir: Path) -> list[Trajectory]:
    return on_policy_trajectories(model_dir, [("t1", 1.0), ("t1", 0.0), ("t2", 0.0), ("t2", 1.0)], seed=2)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def all_finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_a_recorded_logprob_of_minus_inf_cannot_blow_up_the_update(model_dir: Path) -> None:
    rows = batch(model_dir)
    poisoned = rows[0]
    first = poisoned.loss_mask.index(1)
    poisoned.logprobs[first] = float("-inf")  # what a broken sampler could report; advantage > 0
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    learner = Learner(model, LearnerConfig(lr=1e-3, gradient_checkpointing=False), pad_id=0)

    result = learner.step(rows)

    assert result.nonfinite is False and math.isfinite(result.grad_norm)
    assert all_finite(model)
    assert learner.version == 1


def test_nan_gradients_are_not_applied_and_the_next_step_is(model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    learner = Learner(model, LearnerConfig(lr=1e-3, gradient_checkpointing=False), pad_id=0)
    learner.step(batch(model_dir))  # AdamW has moments now: a NaN step would also poison those
    before = weights(model)
    moments = copy.deepcopy(learner.optimizer.state_dict())

    layer = model.model.layers[0]
    hook = layer.register_full_backward_hook(
        lambda _m, grad_in, _out: tuple(g * float("nan") for g in grad_in)
    )
    result = learner.step(batch(model_dir))
    hook.remove()

    assert result.nonfinite is True
    assert learner.version == 1, "weights that did not change keep their version"
    assert all_finite(model)
    after = weights(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    state = learner.optimizer.state_dict()["state"]
    assert all(torch.equal(state[i]["exp_avg"], moments["state"][i]["exp_avg"]) for i in moments["state"]), (
        "AdamW's moments moved on a step that was not taken"
    )

    healthy = learner.step(batch(model_dir))
    assert healthy.nonfinite is False and learner.version == 2
    assert any(not torch.equal(before[k], v) for k, v in weights(model).items())
    assert all_finite(model)


def test_the_learners_attention_never_runs_on_cudnn(model_dir: Path) -> None:
    """The backward kernel is chosen by the forward: the learner's forward runs with cuDNN's SDPA
    switched off, and the switch is restored afterwards (a sampler keeps it)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    learner = Learner(model, LearnerConfig(lr=1e-3, gradient_checkpointing=False), pad_id=0)
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    assert torch.backends.cuda.cudnn_sdp_enabled()

    learner.step(batch(model_dir))

    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()
