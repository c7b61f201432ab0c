"""trl's GRPOTrainer through `envforge.integrations.trl` next to envforge's own trainer (CPU or GPU).

Both train `local/qwen2.5-coder-0.5b` with ERPO on the lookup tasks of "ERPO on a real pretrained
LM" (docs/benchmarks/training.md): the same train / held-out split, completions per step, learning
rate, sampling temperature, tokens per turn, turns and step count. Each side runs in a child
process of its own (one model in memory at a time), which records per step the mean envforge
reward of the step's episodes, the CPU-seconds of the process (user + system, every thread,
its children included) and the wall time. Then each trained model, and the base model, play the
same 60 seeded held-out episodes through envforge's evaluation (`envforge.trainer.evaluate_held_out`,
the one `envforge train --eval-every` runs). A learning rate of 0 never changes the weights, so
the lr-0 control's held-out evaluation is the base model's, with the same sampling. Each trained
model is paired with the control episode by episode and with each other, with the exact sign test
of `erpo_vs_control.py`.

    MALLOC_ARENA_MAX=2 OMP_NUM_THREADS=2 python benchmarks/trl_vs_envforge.py --out RUNS/trl_vs_envforge
    python benchmarks/trl_vs_envforge.py --smoke --out /tmp/smoke   # a tiny random model, 1 step
    PARTS=trl benchmarks/gpu_train_check.sh OUT   # on a GPU: --device cuda --micro-batch 32

Writes OUT/results.json, OUT/reward_per_step.png and OUT/table.md, and prints the ratio of the
steps per CPU-hour (envforge's over trl's). `--trl-max-minutes` stops trl after the step that
passes it; envforge then trains for as many steps as trl took, so the two stay step for step.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
from erpo_vs_control import sign_test

REPO = Path(__file__).resolve().parents[1]
ENVS = ("car_rental", "library", "gym", "pharmacy")
SMOKE_ENVS = ("car_rental", "gym")


def cpu_seconds() -> float:
    """User + system CPU of this process (all its threads) and its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def env_dirs(args: argparse.Namespace) -> list[Path]:
    return [REPO / "envs" / name for name in args.envs]


async def lookup_split(dirs: list[Path]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """Per env, (train, held-out) lookup tasks: the split `envforge train --tasks lookup` makes."""
    from envforge.server import Fleet, load_env
    from envforge.trainer import lookup_tasks, split_tasks

    envs = [load_env(d) for d in dirs]
    train: dict[str, list[Any]] = {}
    held: dict[str, list[Any]] = {}
    async with Fleet(envs) as fleet:
        for env in envs:
            train[env.name], held[env.name] = split_tasks(await lookup_tasks(fleet, env.name))
    return train, held


# ---------------------------------------------------------------- children (one model each)


def part_eval(args: argparse.Namespace) -> dict[str, Any]:
    """The held-out evaluation `envforge train --eval-every` runs, of the weights in `--weights`."""
    import torch
    from transformers import AutoModelForCausalLM

    from envforge.server import Fleet, load_env
    from envforge.trainer import (
        FleetRolloutEnv,
        HFBackend,
        RolloutConfig,
        evaluate_held_out,
        load_tokenizer,
    )

    dirs = env_dirs(args)
    _, held_tasks = anyio.run(lookup_split, dirs)

    async def run() -> dict[str, Any]:
        torch.manual_seed(args.seed)
        tok = load_tokenizer(args.model)
        model = AutoModelForCausalLM.from_pretrained(str(args.weights))
        # trl saves `use_cache: false` (its activation checkpointing); every model is sampled here
        # as the base model is, with the KV cache
        model.config.use_cache = True
        backend = HFBackend(
            model,
            eos_id=tok.eos_token_id,
            temperature=args.temperature,
            seed=args.seed,
            precision=args.precision,
            max_batch=16,
            device=args.device,
        )
        envs = [load_env(d) for d in dirs]
        try:
            async with Fleet(envs) as fleet:
                held = [FleetRolloutEnv(fleet, e.name, held_tasks[e.name], use_mcp=True) for e in envs]
                config = RolloutConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
                score = await evaluate_held_out(held, backend, tok, config, samples=1, seed=args.seed)
        finally:
            await backend.aclose()
        return dict(score)

    started, wall = cpu_seconds(), time.time()
    score = anyio.run(run)
    return {**score, "cpu_s": cpu_seconds() - started, "wall_s": time.time() - wall}


def part_envforge(args: argparse.Namespace) -> dict[str, Any]:
    """`envforge train --tasks lookup` of the figure, in this process, timed per step."""
    import envforge
    from envforge.trainer import LearnerConfig, RolloutConfig, RunOptions, StepMetrics, TrainConfig

    out = args.out / "envforge_run"
    opts = RunOptions(
        model=args.model,
        envs=env_dirs(args),
        out=out,
        temperature=args.temperature,
        seed=args.seed,
        env_kind="fleet",
        tasks="lookup",
        precision=args.precision,
        device=args.device,
    )
    config = TrainConfig(
        steps=args.steps,
        tasks_per_step=args.tasks_per_step,
        rollouts_per_task=args.rollouts_per_task,
        staleness=args.staleness,
        collectors=args.collectors,
        seed=args.seed,
        rollout=RolloutConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens),
    )
    steps: list[dict[str, Any]] = []
    mark = [cpu_seconds(), time.time()]

    def on_step(m: StepMetrics) -> None:
        cpu, wall = cpu_seconds(), time.time()
        steps.append(
            {"step": m.step + 1, "reward": m.reward_mean, "cpu_s": cpu - mark[0], "wall_s": wall - mark[1]}
        )
        mark[:] = [cpu, wall]
        progress(
            args, f"envforge step {m.step + 1}: reward {m.reward_mean:.3f}, {steps[-1]['cpu_s']:.0f} CPU-s"
        )

    envforge.train(opts, config, LearnerConfig(lr=args.lr), on_step=on_step)
    final = out / "checkpoints" / f"step_{len(steps)}"
    return {"steps": steps, "weights": str(final) if final.is_dir() else None}


def part_trl(args: argparse.Namespace) -> dict[str, Any]:
    """trl's GRPOTrainer on `environments(..., tasks=<lookup train side>, erpo=True)`, timed per step."""
    import trl
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envforge.integrations.trl import environments, read_tool_calls_as_envforge
    from envforge.trainer import load_tokenizer

    train_tasks, _ = anyio.run(lookup_split, env_dirs(args))
    steps: list[dict[str, Any]] = []
    batches: list[list[float]] = []
    budget = args.trl_max_minutes * 60
    started = time.time()

    class Timer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.cpu, self.wall = cpu_seconds(), time.time()

        def on_step_end(self, _args: Any, _state: Any, control: Any, **__: Any) -> None:
            rewards = batches[-1] if batches else []
            steps.append(
                {
                    "step": len(steps) + 1,
                    "reward": sum(rewards) / len(rewards) if rewards else float("nan"),
                    "cpu_s": cpu_seconds() - self.cpu,
                    "wall_s": time.time() - self.wall,
                }
            )
            progress(
                args,
                f"trl step {len(steps)}: reward {steps[-1]['reward']:.3f}, {steps[-1]['cpu_s']:.0f} CPU-s",
            )
            if budget and time.time() - started > budget:
                control.should_training_stop = True

    batch = args.tasks_per_step * args.rollouts_per_task
    micro = min(args.micro_batch, batch)
    with environments(env_dirs(args), tasks=train_tasks, erpo=True) as envs:
        reward = envs.reward_funcs[0]

        def envforge_erpo_reward(**kwargs: Any) -> list[float | None]:
            out = reward(**kwargs)  # ERPO-scaled; the step's figure is envforge's own reward
            batches.append([e.verdict.reward for e in kwargs["environments"]])
            return out

        tok = load_tokenizer(args.model)
        if args.smoke:  # the tiny model's own template renders no tool calls; trl ships Qwen2.5's
            tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
        config = GRPOConfig(
            output_dir=str(args.out / "trl_run"),
            max_steps=args.steps,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=batch // micro,
            steps_per_generation=batch // micro,
            num_generations=args.rollouts_per_task,
            max_completion_length=args.trl_completion_len,
            max_tool_calling_iterations=args.max_turns - 1,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            temperature=args.temperature,
            beta=0.0,
            scale_rewards="none",
            use_cpu=args.device == "cpu",
            bf16=args.precision == "bfloat16",
            gradient_checkpointing=True,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=args.seed,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(str(args.model)),
            args=config,
            train_dataset=envs.dataset,
            processing_class=read_tool_calls_as_envforge(tok),
            environment_factory=envs.environment_factory,
            reward_funcs=[envforge_erpo_reward],
            callbacks=[Timer()],
        )
        trainer.train()
        final = args.out / "trl_final"
        trainer.save_model(str(final))
        lengths = [
            row["completions/mean_length"]
            for row in trainer.state.log_history
            if "completions/mean_length" in row
        ]
    return {"steps": steps, "weights": str(final), "completion_tokens_mean": lengths}


def progress(args: argparse.Namespace, line: str) -> None:
    with (args.out / "progress.log").open("a") as f:
        f.write(f"{time.strftime('%H:%M:%S')} {line}\n")


# ---------------------------------------------------------------- the orchestrating parent


def child(args: argparse.Namespace, part: str, label: str, *extra: str) -> dict[str, Any]:
    """Run one part in a fresh process; its result JSON (OUT/<label>.json), with its whole-process
    CPU and wall. With `--resume` a part whose result is already there is not run again."""
    result = args.out / f"{label}.json"
    if args.resume and result.is_file():
        return dict(json.loads(result.read_text()))
    cmd = [sys.executable, __file__, "--part", part, "--result", str(result), *forwarded(args), *extra]
    progress(args, f"start {label}")
    cpu, wall = cpu_seconds(), time.time()
    done = subprocess.run(cmd, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"{part} failed (exit {done.returncode}): see {args.out / 'progress.log'}")
    data: dict[str, Any] = json.loads(result.read_text())
    data["process_cpu_s"], data["process_wall_s"] = cpu_seconds() - cpu, time.time() - wall
    result.write_text(json.dumps(data, indent=1))
    progress(args, f"done {label}: {data['process_cpu_s']:.0f} CPU-s, {data['process_wall_s']:.0f} s")
    return data


def forwarded(args: argparse.Namespace) -> list[str]:
    out = ["--out", str(args.out), "--model", str(args.model), "--envs", *args.envs]
    for name in ("steps", "tasks_per_step", "rollouts_per_task", "max_turns", "max_new_tokens"):
        out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    for name in (
        "temperature",
        "lr",
        "seed",
        "precision",
        "trl_completion_len",
        "micro_batch",
        "trl_max_minutes",
        "device",
        "staleness",
        "collectors",
    ):
        out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return out + (["--smoke"] if args.smoke else [])


def per_step(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Mean CPU-seconds and wall per step after the first (its warm-up), and steps per CPU-hour."""
    timed = steps[1:] or steps
    cpu = sum(s["cpu_s"] for s in timed) / len(timed)
    wall = sum(s["wall_s"] for s in timed) / len(timed)
    return {"cpu_s_per_step": cpu, "wall_s_per_step": wall, "steps_per_cpu_hour": 3600 / cpu}


def paired(a: list[float], b: list[float]) -> dict[str, Any]:
    wins = sum(x > y for x, y in zip(a, b, strict=True))
    losses = sum(x < y for x, y in zip(a, b, strict=True))
    return {"better": wins, "worse": losses, "episodes": len(a), "p": sign_test(wins, losses)}


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.resume:
        (args.out / "progress.log").write_text("")
    if args.smoke:
        args.model = tiny_model(args)
    else:
        from envforge.trainer import resolve_model

        args.model = resolve_model(str(args.model))
    base = child(args, "eval", "eval_base", "--weights", str(args.model))
    trl_run = child(args, "trl", "trl")
    trained = len(trl_run["steps"])
    if trained < args.steps:
        progress(
            args,
            f"trl stopped at step {trained} of {args.steps} (--trl-max-minutes): envforge trains as many",
        )
        args.steps = trained
    ours = child(args, "envforge", "envforge")
    trl_eval = child(args, "eval", "eval_trl", "--weights", trl_run["weights"])
    ours_eval = (
        child(args, "eval", "eval_envforge", "--weights", ours["weights"]) if ours["weights"] else base
    )
    sides = {
        "trl GRPOTrainer": {**trl_run, **per_step(trl_run["steps"]), "held_out": trl_eval},
        "envforge": {**ours, **per_step(ours["steps"]), "held_out": ours_eval},
    }
    results = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "control (lr 0) = base model": base,
        "sides": sides,
        "ratio_steps_per_cpu_hour": sides["envforge"]["steps_per_cpu_hour"]
        / sides["trl GRPOTrainer"]["steps_per_cpu_hour"],
        "paired": {
            "trl vs control": paired(trl_eval["rewards"], base["rewards"]),
            "envforge vs control": paired(ours_eval["rewards"], base["rewards"]),
            "envforge vs trl": paired(ours_eval["rewards"], trl_eval["rewards"]),
        },
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "table.md").write_text(table(results))
    figure(results, args.out / "reward_per_step.png")
    return results


def tiny_model(args: argparse.Namespace) -> Path:
    from envforge.server import load_env
    from envforge.trainer import build_tiny_model

    train, held = anyio.run(lookup_split, env_dirs(args))
    corpus = [load_env(d).policy for d in env_dirs(args)]
    corpus += [t.scenario.instruction for tasks in (*train.values(), *held.values()) for t in tasks]
    return build_tiny_model(args.out / "tiny_model", corpus)


def table(results: dict[str, Any]) -> str:
    """The markdown table of docs/benchmarks/training.md, the paired tests and the ratio."""
    base = results["control (lr 0) = base model"]
    rows = [
        "| | train reward per step | held-out reward, step 0 → end | CPU-s per step "
        "| wall per step | steps per CPU-hour |",
        "|---|---|---|---|---|---|",
    ]
    for label, side in results["sides"].items():
        rewards = ", ".join(f"{s['reward']:.2f}" for s in side["steps"])
        held = f"{base['reward_mean']:.3f} → **{side['held_out']['reward_mean']:.3f}**"
        cpu, wall, rate = side["cpu_s_per_step"], side["wall_s_per_step"], side["steps_per_cpu_hour"]
        speed = f"{cpu:.0f} | {wall:.0f} s | {rate:.1f}"
        rows.append(f"| {label} | {rewards} | {held} | {speed} |")
    rows.append(f"| control (lr 0: the base model) | | {base['reward_mean']:.3f} | | | |")
    lines = [
        f"- {k}: better on {v['better']}, worse on {v['worse']} of {v['episodes']} paired episodes, "
        f"p = {v['p']:.2g}"
        for k, v in results["paired"].items()
    ]
    ratio = f"envforge's steps per CPU-hour ÷ trl's: **{results['ratio_steps_per_cpu_hour']:.2f}×**"
    return "\n".join([*rows, "", *lines, "", ratio, ""])


def figure(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    for label, side in results["sides"].items():
        xs = [s["step"] for s in side["steps"]]
        left.plot(xs, [s["reward"] for s in side["steps"]], marker="o", label=label)
        right.plot(xs, [s["cpu_s"] / 60 for s in side["steps"]], marker="o", label=label)
    left.set(title="train reward per step (32 episodes)", xlabel="step", ylim=(-0.05, 1.05))
    right.set(title="CPU-minutes per step", xlabel="step")
    right.set_ylim(bottom=0)
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default="local/qwen2.5-coder-0.5b")
    p.add_argument("--envs", nargs="+", default=None)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--tasks-per-step", type=int, default=8)
    p.add_argument("--rollouts-per-task", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--device", default="cpu", help="cpu or cuda: both trainers and the evaluations")
    p.add_argument(
        "--trl-completion-len",
        type=int,
        default=256,
        help="trl caps a whole completion (both turns and the tool result between), not each turn",
    )
    p.add_argument("--micro-batch", type=int, default=4, help="trl's rows per forward and backward")
    p.add_argument("--staleness", type=int, default=1, help="envforge's collection ahead of its update")
    p.add_argument("--collectors", type=int, default=2, help="envforge's concurrent collectors")
    p.add_argument("--trl-max-minutes", type=float, default=0.0, help="stop trl after the step passing it")
    p.add_argument("--smoke", action="store_true", help="a tiny random model, 1 step, 2 envs")
    p.add_argument("--resume", action="store_true", help="keep the parts whose results are in OUT")
    p.add_argument("--part", choices=["eval", "envforge", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--weights", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.envs is None:
        args.envs = list(SMOKE_ENVS if args.smoke else ENVS)
    if args.smoke and args.part is None:
        args.steps, args.tasks_per_step, args.rollouts_per_task = 1, 4, 2
        args.max_new_tokens, args.trl_completion_len, args.micro_batch = 8, 24, 4
        args.precision = "float32"
    args.model = Path(args.model) if args.part else args.model
    if args.part:
        parts = {"eval": part_eval, "envforge": part_envforge, "trl": part_trl}
        args.result.write_text(json.dumps(parts[args.part](args)))
        return 0
    results = orchestrate(args)
    print((args.out / "table.md").read_text())
    print(f"wrote {args.out / 'results.json'}, {args.out / 'reward_per_step.png'}")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
