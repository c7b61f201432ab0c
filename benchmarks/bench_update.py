"""What one ERPO update costs on real episodes: float32 whole rows against a shared prompt prefix and
bfloat16 autocast, from the same weights on the same batch.

Reads a `trajectories.jsonl` written by `envforge train --save-trajectories` (the first `--rows`
of it), loads the packaged model once per arm, takes one `Learner.step` at learning rate 0 and
prints process CPU-seconds, wall time, the gradient norm (the arms must agree) and the ratio to
the first arm. Every row of the batch is run, advantage or not, by giving each its own reward.

    python benchmarks/bench_update.py RUN/trajectories.jsonl --rows 16
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ARMS = {
    "float32": {"precision": "float32", "share_prompt_prefix": False, "gradient_checkpointing": True},
    "float32 + shared prefix": {"precision": "float32", "share_prompt_prefix": True},
    "bfloat16 + shared prefix": {"precision": "bfloat16", "share_prompt_prefix": True},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trajectories", type=Path)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--model", default="local/qwen2.5-coder-0.5b")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated; the first is the baseline")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from envforge.trainer import Learner, LearnerConfig, Trajectory, resolve_model

    torch.set_num_threads(args.threads)
    lines = args.trajectories.read_text().splitlines()[: args.rows]
    # rewards 0, 1, 2, ... within each task: every row has an advantage, so every row is run
    seen: dict[str, int] = {}
    batch = []
    for line in lines:
        t = Trajectory(**json.loads(line))
        seen[t.task_id] = seen.get(t.task_id, -1) + 1
        batch.append(t.model_copy(update={"reward": float(seen[t.task_id]), "user_error": False}))
    model_dir = resolve_model(args.model)
    base = None
    for name in args.arms.split(","):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        learner = Learner(model, LearnerConfig(lr=0.0, **ARMS[name]), pad_id=0)
        cpu, wall = time.process_time(), time.perf_counter()
        result = learner.step(batch)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        base = base or cpu
        tokens = sum(len(t.token_ids) for t in batch)
        print(
            f"{name:<26} {len(batch)} rows, {tokens} tokens: {cpu:7.1f} CPU-s, {wall:6.1f} s wall, "
            f"grad norm {result.grad_norm:.4f}, {base / cpu:.2f}x the first arm per CPU-s",
            flush=True,
        )
        del learner, model


if __name__ == "__main__":
    main()
