"""On-policy trajectories of random tokens for learner tests: what a batch looks like to `Learner.step`
without playing episodes."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from envforge.trainer import Trajectory, load_tokenizer, token_logprobs


def on_policy_trajectories(
    model_dir: Path, rewards: list[tuple[str, float]], *, seed: int = 0, growing: bool = False
) -> list[Trajectory]:
    """One trajectory per (task, reward): random prompt tokens then five policy tokens, with the
    model's own logprobs. `growing`: the n-th prompt is n tokens longer (so a batch is padded)."""
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, (task, reward) in enumerate(rewards):
        extra = n if growing else 0
        ids = torch.randint(4, len(tok), (10 + extra,), generator=g).tolist()
        mask = [0] * (5 + extra) + [1] * 5
        t = torch.tensor([ids])
        with torch.no_grad():
            lp = [0.0, *token_logprobs(model, t, torch.ones_like(t), 1.0)[0].tolist()]
        out.append(
            Trajectory(
                env="e",
                task_id=task,
                token_ids=ids,
                logprobs=[x if m else 0.0 for x, m in zip(lp, mask, strict=True)],
                loss_mask=mask,
                reward=reward,
                policy_version=0,
            )
        )
    return out


def on_policy_rows(model, tok, rows: list[tuple[str, str, float, bool]]) -> list[Trajectory]:
    """Trajectories whose stored logprobs equal the model's current ones (ratio == 1)."""
    out = []
    g = torch.Generator().manual_seed(0)
    for env, task, reward, user_error in rows:
        ids = torch.randint(4, len(tok), (10,), generator=g).tolist()
        mask = [0] * 5 + [1] * 5
        t = torch.tensor([ids])
        with torch.no_grad():
            lp = [0.0, *token_logprobs(model, t, torch.ones_like(t), 1.0)[0].tolist()]
        logprobs = [x if m else 0.0 for x, m in zip(lp, mask, strict=True)]
        out.append(
            Trajectory(
                env=env,
                task_id=task,
                token_ids=ids,
                logprobs=logprobs,
                loss_mask=mask,
                reward=reward,
                user_error=user_error,
                policy_version=0,
            )
        )
    return out


ROWS = [
    ("a", "t1", 1.0, False),
    ("a", "t1", 0.0, False),
    ("a", "t2", 1.0, False),
    ("a", "t2", 0.0, True),
    ("a", "t2", 0.5, False),
    ("b", "u1", 0.2, False),
    ("b", "u1", 0.0, False),
    ("b", "u2", 1.0, False),
]
"""(env, task, reward, user error) rows for `on_policy_rows`: two envs, one masked, uneven groups."""
