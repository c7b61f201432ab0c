"""Batched against one-at-a-time generation: a held-out evaluation with the packaged 0.5B model.

Plays the same episodes (single-lookup tasks of car_rental's held-out side, fixed seeds, the real
`local/qwen2.5-coder-0.5b` weights through `HFBackend`) once per arm: `max_batch=1` in float32 (each
request alone, as the backend ran before batching), concurrent episodes decoding together, and
the same in bfloat16; arms alternate round by round. It prints wall time, process CPU-seconds,
generated tokens per CPU-second and the ratio. CPU time is the measure that survives a shared
machine; wall time is printed beside it.

    python benchmarks/bench_batching.py --samples 2 --rounds 1 --arms 1:float32,16:float32,16:bfloat16
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio

REPO = Path(__file__).resolve().parents[1]


async def play(args: argparse.Namespace, max_batch: int, precision: str) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from envforge.server import Fleet, load_env
    from envforge.trainer import (
        FleetRolloutEnv,
        HFBackend,
        RolloutConfig,
        load_tokenizer,
        lookup_tasks,
        resolve_model,
        run_rollout,
        split_tasks,
    )

    fleet = Fleet([load_env(REPO / "envs" / args.env)])
    _, held = split_tasks(await lookup_tasks(fleet, args.env))
    env = FleetRolloutEnv(fleet, args.env, held)
    model_dir = resolve_model(args.model)
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    backend = HFBackend(
        model,
        eos_id=tok.eos_token_id,
        temperature=0.7,
        copy_model=False,
        max_batch=max_batch,
        precision=precision,
    )
    config = RolloutConfig(max_turns=2, max_new_tokens=48)
    episodes = [(t, 1000 * i + 97 * k) for i, t in enumerate(env.task_ids()) for k in range(args.samples)]
    tokens = rewards = 0.0

    async def one(task_id: str, seed: int) -> None:
        nonlocal tokens, rewards
        traj = await run_rollout(env, task_id, backend, tok, config, seed=seed)
        tokens += sum(traj.loss_mask)
        rewards += traj.reward

    cpu, wall = time.process_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for task_id, seed in episodes:
            tg.start_soon(one, task_id, seed)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "episodes": len(episodes),
        "tokens": tokens,
        "cpu_s": cpu,
        "wall_s": wall,
        "reward": rewards / len(episodes),
        "chunks": float(len(backend.batcher.chunks)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="local/qwen2.5-coder-0.5b")
    p.add_argument("--env", default="car_rental")
    p.add_argument("--samples", type=int, default=2, help="episodes per held-out task")
    p.add_argument(
        "--arms",
        default="1:float32,16:float32,16:bfloat16",
        help="max_batch:precision, ...; the first is the baseline",
    )
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    arms = [(int(a.split(":")[0]), a.split(":")[1]) for a in args.arms.split(",")]
    results: dict[tuple[int, str], list[dict[str, float]]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            row = anyio.run(play, args, *arm)
            results[arm].append(row)
            print(
                f"max_batch {arm[0]:>2} {arm[1]:<8}: {row['episodes']:.0f} episodes, "
                f"{row['tokens']:.0f} tokens in "
                f"{row['chunks']:.0f} chunks, {row['cpu_s']:.1f} CPU-s, {row['wall_s']:.1f} s wall, "
                f"{row['tokens'] / row['cpu_s']:.2f} tokens/CPU-s, reward {row['reward']:.3f}",
                flush=True,
            )
    per_cpu = {
        a: sum(r["tokens"] for r in rows) / sum(r["cpu_s"] for r in rows) for a, rows in results.items()
    }
    per_wall = {
        a: sum(r["tokens"] for r in rows) / sum(r["wall_s"] for r in rows) for a, rows in results.items()
    }
    base = arms[0]
    for arm in arms[1:]:
        print(
            f"{arm[0]}:{arm[1]} / {base[0]}:{base[1]}: {per_cpu[arm] / per_cpu[base]:.2f}x tokens per CPU-s, "
            f"{per_wall[arm] / per_wall[base]:.2f}x tokens per wall-s"
        )


if __name__ == "__main__":
    main()
