"""Does what the ablation trained transfer? A checkpoint and its base model on τ²-bench retail's test split.

Both models play the same episodes with the same agent settings: every task of the split once,
seeded by task (`evaluate_held_out`, as the training runs' held-out evaluations), the scripted user
opening with the task's request (the harness env `envforge train` plays τ² tasks with), the reward
τ²'s basis (`DB`, `COMMUNICATE`, ...). A task passes when its reward is 1, so pass^1 is the share
of tasks passed. Per model: pass^1 with a 95 % Wilson interval (which stays honest at 0 of 40,
where a bootstrap over tasks collapses to [0, 0]); then the two paired by task, an exact two-sided
sign test on the tasks one passed and the other did not. A do-nothing agent's pass^1 on the same
tasks (`envforge eval --agent noop`) is the floor to read both against: 4 of the 40 test tasks pass
when nothing changes, so a model that learned only to stop early would gain there; each model's
passes on the tasks doing nothing fails are counted apart. The agent gets 12 turns of 256 tokens by
default: a retail call carrying item lists and a summary runs past 100 tokens, and 96 cut the base
model's calls short, which then read as text to the user.

A model's episodes go to `OUT/<label>.json` (rewards by task, seconds) and
`OUT/<label>_trajectories.jsonl`; a label whose file exists is not played again, so a stopped run
resumes. Writes `OUT/transfer.md`.

    envforge import tau2 ../shared/tau2/retail -o envs/tau2_retail     # once: τ²'s data stays out of git
    python benchmarks/erpo_transfer.py RUNS/transfer --checkpoint RUNS/ablation/ARM/seedK/checkpoints/step_6
    python benchmarks/erpo_transfer.py RUNS/transfer-smoke --smoke     # a tiny model, 2 tasks, minutes
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from erpo_ablation import tiny_model  # the ablation's smoke model
from erpo_vs_control import sign_test  # the same exact test as the ERPO figures

REPO = Path(__file__).resolve().parents[1]
BASE = "local/qwen2.5-coder-0.5b"
PASS = 1.0 - 1e-6
"""τ²'s success: a reward of 1 (its rewards are products of 0/1 checks)."""


def wilson(passed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial share: defined at 0 and at n, unlike the normal one."""
    if n == 0:
        return (0.0, 1.0)
    p = passed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_line(base: list[float], trained: list[float]) -> str:
    """The paired comparison of two models' per-task rewards (the same tasks, in the same order)."""
    if len(base) != len(trained):
        raise ValueError(f"unpaired: {len(base)} base rewards against {len(trained)} trained")
    won = sum(t >= PASS > b for b, t in zip(base, trained, strict=True))
    lost = sum(b >= PASS > t for b, t in zip(base, trained, strict=True))
    p = sign_test(won, lost)
    return (
        f"the checkpoint passed {won} task(s) the base model failed and failed {lost} it passed (p = {p:.2g})"
    )


def report(results: dict[str, dict[str, Any]], settings: dict[str, Any]) -> str:
    lines = [
        "# Transfer to τ²-bench retail",
        "",
        f"Split `{settings['split']}` of `{settings['env']}`, one seeded episode per task, scripted user;",
        f"agent settings: max turns {settings['max_turns']}, max new tokens {settings['max_new_tokens']},",
        f"max sequence {settings['max_seq_len']}, temperature {settings['temperature']},",
        f"seed {settings['seed']}.",
        "",
        "| model | weights | tasks | passed | pass^1 | 95 % CI (Wilson) | passed where doing nothing fails "
        "| mean reward | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    floor = results.get("do nothing", {}).get("rewards")
    for label, r in results.items():
        rewards = r["rewards"]
        passed = sum(x >= PASS for x in rewards)
        lo, hi = wilson(passed, len(rewards))
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        beyond = (
            "-" if floor is None else str(sum(x >= PASS > f for x, f in zip(rewards, floor, strict=True)))
        )
        lines.append(
            f"| {label} | `{r['model']}` | {len(rewards)} | {passed} | {passed / max(1, len(rewards)):.3f} | "
            f"[{lo:.3f}, {hi:.3f}] | {beyond} | {mean:.3f} | {r['seconds']:.0f} s |"
        )
    if {"base", "trained"} <= results.keys():
        lines += [
            "",
            f"Paired by task: {paired_line(results['base']['rewards'], results['trained']['rewards'])}.",
        ]
    return "\n".join(lines) + "\n"


async def play(model_spec: str, tasks: list[Any], args: argparse.Namespace) -> tuple[list[float], list[Any]]:
    """Every task once with `model_spec`'s weights; the rewards in task order and the episodes."""
    import torch
    from transformers import AutoModelForCausalLM

    from envforge.harness import EnvTasks, http_sessions
    from envforge.server import Fleet, load_env
    from envforge.synth import load_policy_rules
    from envforge.trainer import (
        HarnessRolloutEnv,
        HFBackend,
        RolloutConfig,
        evaluate_held_out,
        load_tokenizer,
        resolve_model,
    )

    torch.manual_seed(args.seed)
    path = resolve_model(model_spec)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path))
    backend = HFBackend(
        model,
        eos_id=tok.eos_token_id,
        temperature=args.temperature,
        seed=args.seed,
        copy_model=False,  # nothing trains here
        precision=args.precision,
        max_batch=args.max_batch,
    )
    env = load_env(args.env)
    env_tasks = EnvTasks(env_dir=args.env, env=env, tasks=tasks, policy_rules=load_policy_rules(env))
    held = [HarnessRolloutEnv(Fleet([env]), env_tasks, name=env.name)]
    config = RolloutConfig(
        max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, max_seq_len=args.max_seq_len
    )
    played: list[Any] = []
    async with http_sessions():
        await evaluate_held_out(held, backend, tok, config, samples=1, seed=args.seed, played=played)
    # the env plays its tasks in its own order (sorted ids: "12" before "5"), not the split's
    by_task = {t.task_id: t for t in played}
    if sorted(by_task) != sorted(t.id for t in tasks) or len(played) != len(tasks):
        raise RuntimeError(f"played {sorted(by_task)}, asked for {sorted(t.id for t in tasks)}")
    episodes = [by_task[t.id] for t in tasks]
    return [e.reward for e in episodes], episodes


def kept_for(kept: dict[str, Any], spec: str | None, settings: dict[str, Any], tasks: list[Any]) -> bool:
    """Whether a model's kept episodes are this run's: the same weights, settings and tasks (a
    checkpoint's results must never be reported under another's name)."""
    same_tasks = kept.get("tasks") == [t.id for t in tasks]
    return kept.get("model") == str(spec) and kept.get("settings") == settings and same_tasks


def split_tasks_of(env_dir: Path, split: str, limit: int | None) -> list[Any]:
    from envforge.synth import load_tasks

    tasks = [t for t in load_tasks(env_dir) if split in (t.split or [])]
    if not tasks:
        sys.exit(f"{env_dir}: no task in split {split!r}")
    return tasks[:limit] if limit else tasks


def do_nothing(env_dir: Path, tasks: list[Any]) -> dict[str, Any]:
    """The noop agent on the same tasks: the share that passes when the DB is left as it was."""
    import envforge

    started = time.time()
    config = envforge.EvalConfig(agent="noop", task_ids=[t.id for t in tasks])
    with tempfile.TemporaryDirectory() as run_dir:  # a second of work: played again each time
        evaluation = envforge.evaluate([env_dir], config, out=Path(run_dir) / "noop")
    reward = {r.task_id: r.reward for r in evaluation.records}
    return {
        "model": "noop (no tool call, no answer)",
        "tasks": [t.id for t in tasks],
        "rewards": [reward[t.id] for t in tasks],
        "seconds": round(time.time() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--checkpoint", help="the trained model folder (an ablation run's checkpoints/step_N)"
    )
    parser.add_argument("--base", default=BASE, help=f"the model it was trained from (default {BASE})")
    parser.add_argument("--env", type=Path, default=REPO / "envs" / "tau2_retail")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=None, help="the split's first N tasks only")
    parser.add_argument("--max-turns", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="a tiny random model as both, 2 tasks, 2 turns")
    parser.add_argument(
        "--only",
        choices=["base", "trained"],
        help="play this model alone (the base can be played before any checkpoint exists); the other's "
        "kept episodes are reported if there are any",
    )
    args = parser.parse_args()
    if not (args.env / "env.toml").is_file():
        parser.error(f"no env at {args.env}: envforge import tau2 ../shared/tau2/retail -o {args.env}")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        args.base = args.checkpoint = tiny_model(args.out, [args.env.name])
        args.limit, args.max_turns, args.max_new_tokens = args.limit or 2, 2, 16
    if not args.checkpoint and args.only != "base":
        parser.error("--checkpoint is required (or --smoke, or --only base)")
    if args.checkpoint and not args.smoke and not Path(args.checkpoint).is_dir():
        parser.error(f"--checkpoint {args.checkpoint}: no such folder")
    tasks = split_tasks_of(args.env, args.split, args.limit)
    settings = {
        k: getattr(args, k)
        for k in ("split", "max_turns", "max_new_tokens", "max_seq_len", "temperature", "seed")
    }
    settings["env"] = str(args.env.name)
    results: dict[str, dict[str, Any]] = {"do nothing": do_nothing(args.env, tasks)}
    for label, spec in (("base", args.base), ("trained", args.checkpoint)):
        done = args.out / f"{label}.json"
        kept = json.loads(done.read_text()) if done.is_file() else None
        same = kept is not None and kept_for(kept, spec, settings, tasks)
        if args.only and label != args.only:
            if same:
                results[label] = kept
            continue
        if same:
            print(f"{label}: played before, kept", flush=True)
            results[label] = kept
            continue
        print(f"{label}: {spec} on {len(tasks)} {args.split} task(s) of {args.env.name}", flush=True)
        started = time.time()
        rewards, played = anyio.run(play, spec, tasks, args)
        results[label] = {
            "model": str(spec),
            "tasks": [t.id for t in tasks],
            "rewards": rewards,
            "seconds": round(time.time() - started, 1),
            "settings": settings,
        }
        (args.out / f"{label}_trajectories.jsonl").write_text(
            "".join(t.model_dump_json() + "\n" for t in played)
        )
        done.write_text(json.dumps(results[label], indent=1) + "\n")
        passed = sum(r >= PASS for r in rewards)
        print(f"{label}: {passed} of {len(rewards)} passed, {time.time() - started:.0f} s", flush=True)
    md = report(results, settings)
    (args.out / "transfer.md").write_text(md)
    print(md)
    print(f"wrote {args.out / 'transfer.md'}")


if __name__ == "__main__":
    main()
