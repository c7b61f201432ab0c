"""What an update costs must not change what it computes: rows without advantage are not run yet
the gradient is the full batch's, and a bf16 update keeps float32 weights and the same direction."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from envforge.trainer import (
    HFBackend,
    Learner,
    LearnerConfig,
    Trajectory,
    bandit_corpus,
    build_tiny_model,
    clipped_pg_loss,
    load_tokenizer,
    token_logprobs,
)

from support.trajectories import on_policy_trajectories


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m"), bandit_corpus(), hidden_size=64, layers=2, seed=5)


def trajs(model_dir: Path, rewards: list[tuple[str, float]]) -> list[Trajectory]:
    return on_policy_trajectories(model_dir, rewards, seed=1, growing=True)


def full_batch_gradient(
    model: torch.nn.Module, batch: list[Trajectory], adv: list[float]
) -> dict[str, torch.Tensor]:
    """The loss's gradient computed row by row over every row, advantage 0 or not: the reference."""
    n_tokens = sum(sum(t.loss_mask) for t in batch)
    model.zero_grad(set_to_none=True)
    for t, a in zip(batch, adv, strict=True):
        ids = torch.tensor([t.token_ids])
        mask = torch.tensor([t.loss_mask], dtype=torch.float32)
        new = token_logprobs(model, ids, torch.ones_like(ids), 1.0)
        old = torch.tensor([t.logprobs])
        loss, _, _ = clipped_pg_loss(new, old[:, 1:], a * mask[:, 1:], mask[:, 1:], n_tokens, 0.2, 0.2)
        loss.backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def test_rows_without_advantage_are_not_run_and_the_gradient_is_the_full_batchs(model_dir: Path) -> None:
    # t1's group has no variance (advantage 0 for both rows); t2's has
    batch = trajs(model_dir, [("t1", 1.0), ("t1", 1.0), ("t2", 1.0), ("t2", 0.0)])
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    reference = copy.deepcopy(model)
    learner = Learner(model, LearnerConfig(lr=0.0, max_grad_norm=1e9, gradient_checkpointing=False), pad_id=0)
    rows_run: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, args, kwargs: rows_run.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    result = learner.step(batch)
    assert result.advantages[:2] == [0.0, 0.0] and result.advantages[2] != 0.0
    assert sum(rows_run) == 2  # only t2's rows went through the model
    want = full_batch_gradient(reference, batch, result.advantages)
    got = {k: p.grad for k, p in model.named_parameters() if k in want}
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-6, rtol=1e-4), k


def test_adam_moments_still_move_when_no_row_has_advantage(model_dir: Path) -> None:
    """After a real step AdamW has moments, so a batch without signal is a real (momentum) step,
    not a skip; with no row run, every parameter must still get its zero gradient."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    learner = Learner(model, LearnerConfig(lr=0.05, gradient_checkpointing=False), pad_id=0)
    learner.step(trajs(model_dir, [("t1", 1.0), ("t1", 0.0)]))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = learner.step(trajs(model_dir, [("t1", 1.0), ("t1", 1.0)]))
    assert not result.skipped
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bf16_update_keeps_float32_weights_and_the_gradient_direction(model_dir: Path) -> None:
    batch = trajs(model_dir, [("t1", 1.0), ("t1", 0.0), ("t2", 0.0), ("t2", 1.0)])
    grads = {}
    for precision in ("float32", "bfloat16"):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        learner = Learner(
            model,
            LearnerConfig(lr=0.0, max_grad_norm=1e9, gradient_checkpointing=False, precision=precision),
            pad_id=0,
        )
        learner.step(batch)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        grads[precision] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    cosine = torch.nn.functional.cosine_similarity(grads["float32"], grads["bfloat16"], dim=0)
    assert cosine > 0.98


async def test_bf16_sampler_is_a_copy_and_takes_float32_weights(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    backend = HFBackend(model, eos_id=tok.eos_token_id, precision="bfloat16", temperature=0.0)
    assert next(model.parameters()).dtype == torch.float32  # the learner's weights untouched
    assert next(backend.model.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    await backend.sync_weights(model.state_dict(), 1)
    assert next(backend.model.parameters()).dtype == torch.bfloat16 and backend.version == 1
    first = next(backend.model.parameters())
    assert torch.allclose(first.float(), next(model.parameters()), atol=1e-2)
    g = await backend.generate(tok.encode("press the green button"), max_new_tokens=4)
    assert len(g.token_ids) >= 1 and all(lp <= 0 for lp in g.logprobs)
    with pytest.raises(ValueError, match="precision"):
        HFBackend(model, eos_id=tok.eos_token_id, precision="float16")


def prefixed(model_dir: Path, prefix_len: int, rewards: list[tuple[str, float]]) -> list[Trajectory]:
    """Trajectories that open with the same `prefix_len` tokens (a system prompt), then differ."""
    out = trajs(model_dir, rewards)
    g = torch.Generator().manual_seed(9)
    tok = load_tokenizer(model_dir)
    head = torch.randint(4, len(tok), (prefix_len,), generator=g).tolist()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    fixed = []
    for t in out:
        ids = head + t.token_ids
        mask = [0] * prefix_len + t.loss_mask
        x = torch.tensor([ids])
        with torch.no_grad():
            lp = [0.0, *token_logprobs(model, x, torch.ones_like(x), 1.0)[0].tolist()]
        lps = [v if m else 0.0 for v, m in zip(lp, mask, strict=True)]
        fixed.append(t.model_copy(update={"token_ids": ids, "loss_mask": mask, "logprobs": lps}))
    return fixed


def test_a_shared_system_prompt_runs_once_and_the_gradient_is_unchanged(model_dir: Path) -> None:
    batch = prefixed(model_dir, 40, [("t1", 1.0), ("t1", 0.0), ("t2", 0.0), ("t2", 1.0), ("t2", 0.0)])
    grads, shapes = {}, {}
    for share in (True, False):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        seen: list[tuple[int, ...]] = []
        model.register_forward_pre_hook(
            lambda _m, _a, kw, seen=seen: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
        )
        config = LearnerConfig(
            lr=0.0, max_grad_norm=1e9, share_prompt_prefix=share, gradient_checkpointing=False
        )
        Learner(model, config, pad_id=0).step(batch)
        grads[share] = {k: p.grad.clone() for k, p in model.named_parameters()}
        shapes[share] = seen
    assert shapes[True][0][0] == 1 and shapes[True][0][1] >= 40  # the prefix, once for all five rows
    assert sum(rows * width for rows, width in shapes[True]) < 0.6 * sum(r * w for r, w in shapes[False])
    for k in grads[False]:
        assert torch.allclose(grads[True][k], grads[False][k], atol=1e-6, rtol=1e-4), k


def test_a_prefix_is_never_shared_over_scored_tokens(model_dir: Path) -> None:
    """Rows whose generated tokens begin alike share more than their prompt; the shared run must
    stop where the first scored token is predicted, or those tokens would lose their logprobs."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = torch.randint(4, 10, (3, 30), generator=torch.Generator().manual_seed(2))
    ids[:, :25] = ids[0, :25]  # 25 tokens alike, scored from position 20 on
    attn = torch.ones_like(ids)
    full = token_logprobs(model, ids, attn, 1.0, start=19)
    shared = token_logprobs(model, ids, attn, 1.0, start=19, shared=20)
    assert torch.allclose(full, shared, atol=1e-5)
    with pytest.raises(ValueError, match="covers scored positions"):
        token_logprobs(model, ids, attn, 1.0, start=19, shared=25)


def test_the_weights_handed_to_a_sync_are_the_models_own_not_a_copy(model_dir: Path) -> None:
    """A float32 clone per sync lived through the whole next update (2 GB for 0.5B) and got a run
    killed for memory; every source copies what it is handed, so the learner hands its own."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    learner = Learner(model, LearnerConfig(lr=0.05, gradient_checkpointing=False), pad_id=0)
    learner.step(trajs(model_dir, [("t1", 1.0), ("t1", 0.0)]))
    weights = learner.weights()
    params = dict(model.named_parameters())
    shared = [k for k, v in weights.items() if k in params and v.data_ptr() == params[k].data_ptr()]
    assert shared and len(shared) == len([k for k in weights if k in params])
