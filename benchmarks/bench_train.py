"""Training-loop benchmark: envforge's async ERPO loop (hf backend) vs trl's plain GRPOTrainer.

Both train the same randomly initialised model config on the same bandit prompt with the same group
size and completion length; reported: mean step time, generated tokens/s, peak memory, and the ratio.
CPU by default with a tiny config; on a GPU machine pass `--device cuda` and a larger `--hidden`.

    python benchmarks/bench_train.py --steps 5 --hidden 64 --layers 2 --device cpu
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio


def peak_memory_mb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


async def bench_envforge(args: argparse.Namespace, model_dir: Path, tmp: Path) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from envforge.server import Fleet, load_env
    from envforge.trainer import (
        FleetRolloutEnv,
        HFBackend,
        Learner,
        LearnerConfig,
        RolloutConfig,
        TrainConfig,
        bandit_tasks,
        load_tokenizer,
        train,
        write_bandit_env,
    )

    fleet = Fleet([load_env(write_bandit_env(tmp))])
    env = FleetRolloutEnv(fleet, "bandit", await bandit_tasks(fleet, "bandit", n=max(2, args.tasks)))
    tok = load_tokenizer(model_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir).to(args.device)
    backend = HFBackend(model, eos_id=tok.eos_token_id, seed=0)
    learner = Learner(model, LearnerConfig(lr=1e-3), pad_id=tok.pad_token_id)
    config = TrainConfig(
        steps=args.steps + 1,
        tasks_per_step=args.tasks,
        rollouts_per_task=args.group,
        rollout=RolloutConfig(max_turns=1, max_new_tokens=args.completion_len),
    )
    reset_peak(args.device)
    metrics = await train([env], backend, learner, tok, config)
    timed = metrics[1:]  # the first step includes warm-up
    step_time = sum(m.step_time_s for m in timed) / len(timed)
    gen_tokens = sum(m.tokens for m in timed)
    return {
        "step_s": step_time,
        "tokens_per_s": gen_tokens / sum(m.step_time_s for m in timed),
        "peak_mb": peak_memory_mb(args.device),
    }


def bench_trl(args: argparse.Namespace, model_dir: Path, tmp: Path) -> dict[str, float]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envforge.trainer import INSTRUCTIONS, load_tokenizer

    tok = load_tokenizer(model_dir)
    tok.padding_side = "left"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompts = [
        f"<|im_start|>user\n{INSTRUCTIONS[i % 4]}<|im_end|>\n<|im_start|>assistant\n" for i in range(64)
    ]
    dataset = Dataset.from_list([{"prompt": p} for p in prompts])

    def reward(completions: list[str], **_: object) -> list[float]:
        return [1.0 if c.strip().startswith("press_green") else 0.0 for c in completions]

    times: list[float] = []
    tokens: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: object, **k: object) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, *a: object, **k: object) -> None:
            times.append(time.perf_counter() - self.t)

    batch = args.tasks * args.group
    config = GRPOConfig(
        output_dir=str(tmp / "trl"),
        max_steps=args.steps + 1,
        per_device_train_batch_size=batch,
        num_generations=args.group,
        max_completion_length=args.completion_len,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=not args.device.startswith("cuda"),
        bf16=False,
        scale_rewards="none",
        beta=0.0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[Timer()],
    )
    reset_peak(args.device)
    trainer.train()
    for row in trainer.state.log_history:
        if "completions/mean_length" in row:
            tokens.append(row["completions/mean_length"] * batch)
    timed = times[1:]
    return {
        "step_s": sum(timed) / len(timed),
        "tokens_per_s": sum(tokens[1:]) / sum(timed) if tokens[1:] else float("nan"),
        "peak_mb": peak_memory_mb(args.device),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--completion-len", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--arch", default="qwen2", choices=["qwen2", "llama"])
    p.add_argument("--skip-trl", action="store_true")
    args = p.parse_args()

    from envforge.trainer import bandit_corpus, build_tiny_model

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model_dir = build_tiny_model(
            tmp / "model",
            bandit_corpus(),
            arch=args.arch,
            hidden_size=args.hidden,
            layers=args.layers,
            heads=max(2, args.hidden // 32),
            base_corpus=True,
        )
        ours = anyio.run(bench_envforge, args, model_dir, tmp)
        print(
            f"envforge: step {ours['step_s']:.3f}s  tokens/s {ours['tokens_per_s']:.1f}  "
            f"peak {ours['peak_mb']:.0f} MB"
        )
        if args.skip_trl:
            return
        try:
            theirs = bench_trl(args, model_dir, tmp)
        except Exception as exc:  # trl's API moves; report instead of hiding our numbers
            print(f"trl GRPOTrainer failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            sys.exit(1)
        print(
            f"trl:      step {theirs['step_s']:.3f}s  tokens/s {theirs['tokens_per_s']:.1f}  "
            f"peak {theirs['peak_mb']:.0f} MB"
        )
        print(
            f"ratio envforge/trl: step time {ours['step_s'] / theirs['step_s']:.2f}x  "
            f"tokens/s {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
