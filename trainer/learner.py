"""The policy update: a GRPO-style clipped policy gradient with ERPO advantages, in plain torch.

Written by hand rather than through trl so the trainer controls exactly which tokens carry loss,
which advantage each token gets, and how the mean is taken: the mean is over the policy tokens of
kept trajectories only (user-error trajectories have an all-zero mask and add nothing to the token
count). `old_logprobs` are the sampling logprobs stored with each trajectory (the behaviour policy),
so samples that are one version stale are corrected by the clipped ratio.

Under `torchrun` the same step runs data-parallel (see `distributed.py`): rank 0 broadcasts the
batch, each rank takes a shard of the kept trajectories, and one all-reduce of the gradients makes
the update equal to the single-process one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel

from .distributed import DataParallel
from .erpo import AdvantageKind, Baseline, erpo_advantages
from .memory import release_freed_memory
from .prefix import MIN_SHARED_PREFIX, common_prefix
from .trajectory import Trajectory

Precision = Literal["float32", "bfloat16"]


class LearnerConfig(BaseModel):
    lr: float = 1e-3
    clip_low: float = 0.2
    clip_high: float = 0.2
    temperature: float = 1.0
    eps: float = 1e-6
    baseline: Baseline = "task"
    advantage: AdvantageKind = "erpo"
    mask_user_errors: bool = True
    """ERPO's MEU mask: a trajectory the detector blames on the simulated user gets advantage 0 and
    no loss tokens. False trains on it like any other (the ablation's arm without the mask); an
    infrastructure failure (`infra_failure: ...`) stays masked either way, being no episode at all."""
    max_grad_norm: float = 1.0
    micro_batch: int = 16
    micro_batch_tokens: int = 1024
    """Most padded tokens in one forward and backward pass (a row more only while under it): a
    0.5B model's activations for eight 1,000-token episodes at once outgrew 24 GB of RAM."""
    weight_decay: float = 0.0
    gradient_checkpointing: bool = True
    """Recompute each layer's activations in the backward pass instead of keeping them (where the
    model supports it): a third less memory for a 0.5B model's update, ~15 % more time. Not with
    `share_prompt_prefix` (a checkpointed layer drops the shared cache)."""
    share_prompt_prefix: bool = True
    """Run the prefix a micro-batch's rows have in common (the system prompt, a group's task) once:
    the same gradient for a fraction of the compute, and activations kept for the rest only."""
    precision: Precision = "float32"
    """`bfloat16`: forward and backward under bf16 autocast (the weights and AdamW's state stay
    float32). On a CPU with AVX512-BF16 a bf16 matmul runs ~4x the float32 one per CPU-second."""


class StepResult(BaseModel):
    loss: float
    tokens: int
    kept: int
    masked: int
    advantages: list[float]
    token_advantages: list[list[float]]
    clip_fraction: float
    ratio_mean: float
    grad_norm: float
    skipped: bool = False
    """No update ran: every kept trajectory's advantage was 0 (the weights and version are unchanged)."""
    nonfinite: bool = False
    """The gradient was not finite (inf or NaN), so no optimizer step was taken: the weights, AdamW's
    moments and the version are unchanged. One such step, applied, turns every weight into NaN."""


LOG_RATIO_LIMIT = 20.0
"""The most `log(new / old)` a token's importance ratio is computed from. A ratio past e^20 is far
outside any trust region (the clip takes over at 1.2), but left alone a recorded logprob of -inf,
or one a broken sampler reports, makes the ratio inf, and the unselected branch of the clipped
objective then backpropagates 0 x inf = NaN into every weight."""


@contextmanager
def attention_without_cudnn() -> Iterator[None]:
    """Scaled-dot-product attention on every backend but cuDNN while the learner's graph is built.

    cuDNN's SDPA backward (the default on H100/H200 since torch 2.11) returns NaN gradients for
    some masked inputs (pytorch/pytorch#196678; trl#7181 hit it through Qwen2.5's attention). It
    did here: Qwen2.5-Coder-0.5B on an H200, bf16, the second update of a lookup run went NaN in
    `ScaledDotProductCudnnAttentionBackward0` (anomaly mode), while float32, which never uses cuDNN
    attention, was clean on the same batch. The backward kernel is fixed when the forward runs, so
    only the learner's forward is steered; a sampler only runs forwards and keeps cuDNN.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


def clipped_pg_loss(
    new_lp: Any, old_lp: Any, adv: Any, mask: Any, n_tokens: int, clip_low: float, clip_high: float
) -> tuple[Any, Any, Any]:
    """Sum over masked tokens of -min(r A, clip(r) A), divided by `n_tokens` (the batch's kept tokens).

    Returns (loss, clipped-token count). At r == 1 the gradient w.r.t. `new_lp` is exactly
    `-adv * mask / n_tokens`: that is how tests read back the advantages the loss applied.
    """
    import torch

    ratio = torch.exp(torch.clamp(new_lp - old_lp, max=LOG_RATIO_LIMIT))
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = (per_token * mask).sum() / max(n_tokens, 1)
    n_clipped = ((clipped < unclipped).float() * mask).sum()
    return loss, n_clipped, (ratio * mask).sum()


def token_logprobs(
    model: Any, input_ids: Any, attention_mask: Any, temperature: float, start: int = 0, shared: int = 0
) -> Any:
    """log p(token_t | tokens_<t) for t >= 1, shape [B, T-1]; entries before `start` read 0.

    The loss reads only the generated tokens, which come after the prompt: logits over the whole
    vocabulary (151,936 entries a position for Qwen2.5) for every prompt position were most of an
    update's memory (a 0.5B model's step on eight 1,000-token episodes grew past 20 GB), so they are
    not computed (`logits_to_keep`), and each kept position's log-probability is its logit less the
    log-sum-exp, without a second vocabulary-sized tensor from `log_softmax`.

    With `shared` > 0 the first `shared` tokens are the same in every row and are run once
    (`_shared_prefix_logits`); it must not exceed `start + 1`.
    """
    import torch

    if shared > 0:
        logits = _shared_prefix_logits(model, input_ids, attention_mask, start, shared)
    else:
        keep = input_ids.shape[1] - start
        try:
            out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep)
        except TypeError:  # a model without `logits_to_keep`: all positions, the first ones dropped
            out = model(input_ids=input_ids, attention_mask=attention_mask)
        logits = out.logits[:, -keep:-1, :]
    logits = logits.float() / temperature
    targets = input_ids[:, start + 1 :]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if start == 0:
        return picked
    return torch.cat([picked.new_zeros((picked.shape[0], start)), picked], dim=1)


def _shared_prefix_logits(model: Any, input_ids: Any, attention_mask: Any, start: int, shared: int) -> Any:
    """The logits at positions `start` .. T-2, the common prefix run once.

    The episodes of a batch open with the same system prompt (and a group's with the same task):
    most of each sequence, and the same activations in every row, because attention is causal.
    So the prefix runs once, its cache (with its autograd history) is repeated for every row, and
    only each row's rest runs per row: the same values and the same gradient, since the repeated
    cache's gradient is the sum over rows. Gradient checkpointing drops a cache, so the learner
    does not checkpoint when it shares prefixes.
    """
    import torch

    if start + 1 < shared:
        raise ValueError(f"a shared prefix of {shared} tokens covers scored positions (from {start})")
    rows, width = input_ids.shape
    head = model(input_ids=input_ids[:1, :shared], use_cache=True, logits_to_keep=1)
    past = head.past_key_values
    past.batch_repeat_interleave(rows)
    first = max(start, shared)
    positions = torch.arange(shared, width, device=input_ids.device).expand(rows, -1)
    tail = model(
        input_ids=input_ids[:, shared:],
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=past,
        use_cache=True,
        logits_to_keep=width - first,
    )
    logits = tail.logits[:, :-1, :]
    if start < shared:  # the prefix's last position predicts the first token after it
        logits = torch.cat([head.logits[:, -1:, :].expand(rows, -1, -1), logits], dim=1)
    return logits


def micro_batches(
    rows: Sequence[tuple[Trajectory, float]], most_rows: int, most_tokens: int, *, share_prefix: bool = False
) -> list[list[tuple[Trajectory, float]]]:
    """`rows` in order, cut into runs of at most `most_rows` rows whose padded size stays within
    `most_tokens`; a row longer than that alone is a run of its own. With `share_prefix` the size
    counts only what each row runs beyond the prefix the run's rows share."""
    out: list[list[tuple[Trajectory, float]]] = []
    current: list[tuple[Trajectory, float]] = []
    width = 0
    shared = 0
    for row in rows:
        ids = row[0].token_ids
        longest = max(width, len(ids))
        common = common_prefix([current[0][0].token_ids, ids], shared) if current and share_prefix else 0
        if current and (len(current) >= most_rows or (longest - common) * (len(current) + 1) > most_tokens):
            out.append(current)
            current, longest, common = [], len(ids), 0
        if not current:
            common = len(ids)
        current.append(row)
        width, shared = longest, common
    if current:
        out.append(current)
    return out


class Learner:
    """Owns the trained model and its optimizer; `step` is synchronous (run it in a worker thread).

    With `dp` (several ranks under torchrun), rank 0 calls `step` and finally `close`; every other
    rank calls `follow`, which runs the same steps on the batches rank 0 broadcasts.
    """

    def __init__(
        self,
        model: Any,
        config: LearnerConfig | None = None,
        *,
        pad_id: int = 0,
        dp: DataParallel | None = None,
    ) -> None:
        import torch

        self.model = model
        self.config = config or LearnerConfig()
        self.pad_id = pad_id
        self.dp = dp
        self.device = next(model.parameters()).device
        checkpointing = self.config.gradient_checkpointing and not self.config.share_prompt_prefix
        if checkpointing and getattr(model, "supports_gradient_checkpointing", False):
            # transformers 5 renamed it (the old name warns that it goes in v6)
            enable = getattr(model, "activation_checkpointing_enable", None)
            (enable or model.gradient_checkpointing_enable)()
        self.version = 0
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay
        )

    def masked(self, t: Trajectory) -> bool:
        """Whether `t` is left out of this update (see `LearnerConfig.mask_user_errors`)."""
        if not t.user_error:
            return False
        return self.config.mask_user_errors or (t.user_error_reason or "").startswith("infra_failure")

    def advantages(self, trajs: Sequence[Trajectory]) -> list[float]:
        c = self.config
        return erpo_advantages(
            [t.reward for t in trajs],
            [t.env for t in trajs],
            [t.task_id for t in trajs],
            [self.masked(t) for t in trajs],
            baseline=c.baseline,
            eps=c.eps,
            advantage=c.advantage,
        )

    def step(self, trajs: Sequence[Trajectory]) -> StepResult:
        """One update on `trajs` (on rank 0 under torchrun: the followers get the batch first)."""
        if self.dp is not None:
            if not self.dp.is_leader:
                raise RuntimeError("only rank 0 calls Learner.step; the other ranks call follow()")
            self.dp.broadcast(list(trajs))
        return self._step(trajs)

    def follow(self) -> int:
        """A follower rank: run rank 0's steps until it calls `close`; returns the steps taken."""
        if self.dp is None or self.dp.is_leader:
            raise RuntimeError("follow() is for ranks other than 0 under torchrun")
        steps = 0
        while (batch := self.dp.broadcast()) is not None:
            self._step(batch)
            steps += 1
        return steps

    def close(self) -> None:
        """Rank 0: release the followers (each `follow()` returns)."""
        if self.dp is not None and self.dp.is_leader:
            self.dp.broadcast(None)

    def _step(self, trajs: Sequence[Trajectory]) -> StepResult:
        import torch

        c = self.config
        adv = self.advantages(trajs)
        kept = [(t, a) for t, a in zip(trajs, adv, strict=True) if not self.masked(t)]
        n_tokens = sum(sum(t.loss_mask) for t, _ in kept)  # over the whole batch, on every rank
        # Per token, the advantage the loss applies: read back from the tensors for this rank's rows
        # below; the other ranks' rows (data-parallel) get the same product computed here.
        token_adv = [
            [a * m * (not self.masked(t)) for m in t.loss_mask] for t, a in zip(trajs, adv, strict=True)
        ]
        if all(a == 0.0 for _, a in kept) and self._zero_gradient_moves_nothing():
            return self._skipped(trajs, adv, token_adv, len(kept), n_tokens)
        index = {id(t): i for i, t in enumerate(trajs)}
        local = self.dp.shard(kept) if self.dp is not None else kept
        # a row whose advantage is 0 adds exactly 0 to the loss and every gradient (the loss is
        # normalised by the whole batch's tokens, `n_tokens`, not by the rows run): not run
        local = [(t, a) for t, a in local if a != 0.0]
        if c.share_prompt_prefix:  # rows with the same prompt side by side (the sum is the same)
            local.sort(key=lambda row: (row[0].env, row[0].task_id))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total_loss = 0.0
        n_clipped = 0.0
        ratio_sum = 0.0
        tokens_run = 0.0  # the ratio is measured on the rows run
        for chunk in micro_batches(
            local, c.micro_batch, c.micro_batch_tokens, share_prefix=c.share_prompt_prefix
        ):
            width = max(len(t.token_ids) for t, _ in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            attn = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.float32)
            old = torch.zeros((len(chunk), width), dtype=torch.float32)
            a = torch.zeros((len(chunk), width), dtype=torch.float32)
            for row, (t, adv_t) in enumerate(chunk):
                n = len(t.token_ids)
                ids[row, :n] = torch.tensor(t.token_ids)
                attn[row, :n] = 1
                mask[row, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
                old[row, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
                a[row, :n] = adv_t * mask[row, :n]
                token_adv[index[id(t)]] = a[row, :n].tolist()
            ids, attn, mask, old, a = (x.to(self.device) for x in (ids, attn, mask, old, a))
            # the first position any row's loss reads (lp index t predicts token t + 1)
            first = int(mask[:, 1:].sum(dim=0).nonzero()[0].item()) if bool(mask[:, 1:].any()) else 0
            shared = 0
            if c.share_prompt_prefix and len(chunk) > 1:
                rows_ids = [t.token_ids for t, _ in chunk]
                shared = min(common_prefix(rows_ids, first + 1), min(len(r) for r in rows_ids) - 1)
                shared = shared if shared >= MIN_SHARED_PREFIX else 0
            with (
                attention_without_cudnn(),
                torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=c.precision == "bfloat16"),
            ):
                new_lp = token_logprobs(self.model, ids, attn, c.temperature, start=first, shared=shared)
            loss, clipped, ratios = clipped_pg_loss(
                new_lp, old[:, 1:], a[:, 1:], mask[:, 1:], n_tokens, c.clip_low, c.clip_high
            )
            if n_tokens:
                loss.backward()
            total_loss += float(loss.detach())
            n_clipped += float(clipped.detach())
            ratio_sum += float(ratios.detach())
            tokens_run += float(mask[:, 1:].sum())
        for p in self.model.parameters():  # no row ran (all advantages 0): the gradient is 0, and
            if p.requires_grad and p.grad is None:  # AdamW's moments still move, as before
                p.grad = torch.zeros_like(p)
        if self.dp is not None:
            self.dp.all_reduce_grads([p for p in self.model.parameters() if p.requires_grad])
            total_loss, n_clipped, ratio_sum, tokens_run = self.dp.all_reduce_sums(
                [total_loss, n_clipped, ratio_sum, tokens_run], self.device
            )
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.max_grad_norm))
        nonfinite = not math.isfinite(grad_norm)  # every rank holds the same all-reduced gradient
        if nonfinite:
            self.optimizer.zero_grad(set_to_none=True)  # a NaN step would poison every weight
        elif n_tokens:
            self.optimizer.step()
        if not nonfinite:
            self.version += 1
        release_freed_memory()  # the activations' blocks, before collection allocates beside us
        return StepResult(
            loss=total_loss,
            tokens=n_tokens,
            kept=len(kept),
            masked=len(trajs) - len(kept),
            advantages=adv,
            token_advantages=token_adv,
            clip_fraction=n_clipped / max(n_tokens, 1),
            ratio_mean=ratio_sum / tokens_run if tokens_run else 1.0,
            grad_norm=grad_norm,
            nonfinite=nonfinite,
        )

    def _zero_gradient_moves_nothing(self) -> bool:
        """Whether an optimizer step on all-zero gradients leaves every weight as it is: no weight
        decay (it shrinks weights whatever the gradient) and no moments from earlier steps (Adam's
        momentum keeps moving them). Only then may a step without signal be skipped."""
        return self.config.weight_decay == 0.0 and not self.optimizer.state

    def _skipped(
        self,
        trajs: Sequence[Trajectory],
        adv: list[float],
        token_adv: list[list[float]],
        kept: int,
        tokens: int,
    ) -> StepResult:
        """A batch with no signal: all-zero advantages make the loss and every gradient exactly 0,
        so the forward, backward and optimizer step (most of a step's time on CPU) would change
        nothing but AdamW's step count; they are skipped, and so is the version bump, so samples
        collected meanwhile are not counted stale against weights that did not change. Every rank
        under torchrun sees the same batch and skips alike."""
        return StepResult(
            loss=0.0,
            tokens=tokens,
            kept=kept,
            masked=len(trajs) - kept,
            advantages=adv,
            token_advantages=token_adv,
            clip_fraction=0.0,
            ratio_mean=1.0,
            grad_norm=0.0,
            skipped=True,
        )

    def weights(self) -> dict[str, Any]:
        """The live weights (no copy), for a sync awaited before the next step: every source copies
        them (an HF backend into its own model, Ray with `ray.put`). A clone here held a second
        float32 model (2 GB for 0.5B) through the whole next update; a run was killed for memory."""
        return dict(self.model.state_dict())
