"""Training-loop benchmark: envforge's ERPO loop (hf backend) next to trl's GRPOTrainer, same config.

Both train the same model on the same one-call tasks of the bandit env, with the same prompts
(the env's system prompt and a task's instruction, through the model's chat template), the same
reward (1 when the reply is a call the env accepts, `press_green` with no arguments, read by
envforge's tool-call parser; a call with invented arguments is refused by the env), group
size, completion length, learning rate, precision and micro-batch. envforge plays each episode
over MCP against the env's SQLite state and scores the end state; trl scores the text. Reported
per side: mean step time and generated tokens/s over the steps after the first (warm-up), peak
memory, mean reward; then the ratios. envforge runs once per `--staleness` value.

CPU with a tiny random model (the default):

    python benchmarks/bench_train.py --steps 5 --hidden 64 --layers 2

A real model on a GPU (`local/<name>` is a packaged GGUF, dequantized once; or an HF folder):

    python benchmarks/bench_train.py --model local/qwen2.5-coder-0.5b --device cuda \\
        --precision bfloat16 --tasks 8 --group 8 --completion-len 128 --lr 0 --staleness 0,1

`--lr 0` keeps both sides sampling the same policy, so both decode the same amount of text; with a
learning rate each side's policy drifts its own way and with it the length of what it writes.

`--json PATH` appends one line of figures per side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio

TARGET = "press_green"


def peak_memory_mb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def load_model(model_dir: Path, device: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)


async def bandit_env(tmp: Path, n: int) -> Any:
    from envforge.server import Fleet, load_env
    from envforge.trainer import FleetRolloutEnv, bandit_tasks, write_bandit_env

    fleet = Fleet([load_env(write_bandit_env(tmp))])
    return FleetRolloutEnv(fleet, "bandit", await bandit_tasks(fleet, "bandit", n=max(2, n), target="green"))


async def bench_envforge(
    args: argparse.Namespace, model_dir: Path, tmp: Path, staleness: int
) -> dict[str, float]:
    from envforge.trainer import (
        HFBackend,
        Learner,
        LearnerConfig,
        RolloutConfig,
        TrainConfig,
        load_tokenizer,
        train,
    )

    env = await bandit_env(tmp / f"envforge-{staleness}", args.tasks)
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, args.device)
    batch = args.tasks * args.group
    backend = HFBackend(model, eos_id=tok.eos_token_id, seed=0, precision=args.precision, max_batch=batch)
    learner = Learner(
        model,
        LearnerConfig(
            lr=args.lr,
            precision=args.precision,
            micro_batch=args.micro_batch,
            micro_batch_tokens=1 << 30,  # rows, not tokens, size a micro-batch, as in trl
            gradient_checkpointing=args.checkpointing,
        ),
        pad_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    config = TrainConfig(
        steps=args.steps + 1,
        tasks_per_step=args.tasks,
        rollouts_per_task=args.group,
        staleness=staleness,
        collectors=args.tasks,  # every episode of a step in flight: one decode batch
        rollout=RolloutConfig(max_turns=1, max_new_tokens=args.completion_len),
    )
    reset_peak(args.device)
    metrics = await train([env], backend, learner, tok, config)
    timed = metrics[1:]  # the first step includes warm-up
    wall = sum(m.step_time_s for m in timed)
    return {
        "step_s": wall / len(timed),
        "tokens_per_s": sum(m.tokens for m in timed) / wall,
        "tokens_per_completion": sum(m.tokens for m in timed) / (len(timed) * batch),
        "peak_mb": peak_memory_mb(args.device),
        "reward": sum(m.reward_mean for m in metrics) / len(metrics),
    }


def bench_trl(args: argparse.Namespace, model_dir: Path, tmp: Path) -> dict[str, float]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envforge.trainer import load_tokenizer, parse_tool_call

    env = anyio.run(bandit_env, tmp / "trl", args.tasks)
    tools = env.tool_names()
    tok = load_tokenizer(model_dir)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = load_model(model_dir, args.device)
    system = env.system_prompt()
    prompts = [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": env.tasks[t].scenario.instruction},
        ]
        for t in env.task_ids()
    ]
    rows = args.tasks * (args.steps + 2)
    dataset = Dataset.from_list([{"prompt": prompts[i % len(prompts)]} for i in range(rows)])

    def reward(completions: list[Any], **_: object) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        calls = [parse_tool_call(text.strip(), tools) for text in texts]
        # what the env pays: the tools take no arguments, so a call with invented ones is refused
        return [1.0 if call is not None and call[0] == TARGET and not call[1] else 0.0 for call in calls]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: object, **k: object) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, *a: object, **k: object) -> None:
            times.append(time.perf_counter() - self.t)

    batch = args.tasks * args.group
    micro = min(args.micro_batch, batch)
    if batch % micro:
        raise ValueError(f"--micro-batch {micro} must divide tasks x group = {batch} for trl")
    cuda = args.device.startswith("cuda")
    config = GRPOConfig(  # one generation of `batch` completions, then one optimizer step over them
        output_dir=str(tmp / "trl"),
        max_steps=args.steps + 1,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch // micro,
        steps_per_generation=batch // micro,
        num_generations=args.group,
        max_completion_length=args.completion_len,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        temperature=1.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=not cuda,
        bf16=cuda and args.precision == "bfloat16",
        gradient_checkpointing=args.checkpointing,
        scale_rewards="none",
        beta=0.0,
        seed=0,
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
    logged = [row for row in trainer.state.log_history if "completions/mean_length" in row]
    tokens = [row["completions/mean_length"] * batch for row in logged]
    rewards = [row.get("reward", float("nan")) for row in logged]
    timed = times[1:]
    return {
        "step_s": sum(timed) / len(timed),
        "tokens_per_s": sum(tokens[1:]) / sum(timed) if tokens[1:] else float("nan"),
        "tokens_per_completion": sum(tokens[1:]) / (len(tokens[1:]) * batch) if tokens[1:] else float("nan"),
        "peak_mb": peak_memory_mb(args.device),
        "reward": sum(rewards) / len(rewards) if rewards else float("nan"),
    }


def model_folder(args: argparse.Namespace, tmp: Path) -> Path:
    from envforge.trainer import bandit_corpus, build_tiny_model, resolve_model

    if args.model != "tiny":
        return resolve_model(args.model)
    return build_tiny_model(
        tmp / "model",
        bandit_corpus(),
        arch=args.arch,
        hidden_size=args.hidden,
        layers=args.layers,
        heads=max(2, args.hidden // 32),
        base_corpus=True,
    )


def report(name: str, figures: dict[str, float], args: argparse.Namespace) -> None:
    print(
        f"{name:<22} step {figures['step_s']:.3f}s  tokens/s {figures['tokens_per_s']:.1f} "
        f"({figures['tokens_per_completion']:.1f} a completion)  "
        f"peak {figures['peak_mb']:.0f} MB  reward {figures['reward']:.3f}",
        flush=True,
    )
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"side": name, "model": args.model, "device": args.device, **figures}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny (random, sized below), local/<name> or an HF folder")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--steps", type=int, default=5, help="timed steps (one more runs first as warm-up)")
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--completion-len", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--staleness", default="1", help="envforge runs, comma-separated: 0,1")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--arch", default="qwen2", choices=["qwen2", "llama"])
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model_dir = model_folder(args, tmp)
        ours: dict[int, dict[str, float]] = {}
        for s in (int(x) for x in args.staleness.split(",")):
            ours[s] = anyio.run(bench_envforge, args, model_dir, tmp, s)
            report(f"envforge staleness {s}", ours[s], args)
        if args.skip_trl:
            return
        try:
            theirs = bench_trl(args, model_dir, tmp)
        except Exception as exc:  # trl's API moves; report instead of hiding our numbers
            print(f"trl GRPOTrainer failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            sys.exit(1)
        report("trl GRPOTrainer", theirs, args)
        for s, figures in ours.items():
            print(
                f"envforge staleness {s} / trl: step time {figures['step_s'] / theirs['step_s']:.2f}x  "
                f"tokens/s {figures['tokens_per_s'] / theirs['tokens_per_s']:.2f}x"
            )


if __name__ == "__main__":
    main()
