"""Commands for RL: `train` (async ERPO training) and `collect` (rollouts only, written as JSONL).

Wired into the root app by `register(app)`; torch/transformers are imported only when a command runs,
so the rest of the CLI works without the `train` extra.

Episodes are played with the evaluation harness's simulated user and scorer by default
(`--env-kind harness`, `--user scripted|MODEL [--user-api-base URL]`), so rewards and user-error
masks mean what they mean in `envforge eval`; `--env-kind fleet` is the single-turn env without a user.

`--ray-workers N` plays the episodes on N Ray actors (the `ray` extra) instead of in this process,
on a local Ray instance or the cluster at `--ray-address`; `--fleet-url` runs the episodes on an
`envforge serve` fleet instead of an in-process one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import typer

from envforge.harness import UserName

from .common import console, fail, load_envs
from .harness_commands import check_model_keys
from .preflight import check_model_dir, check_served_envs

if TYPE_CHECKING:
    from envforge.trainer import RunOptions, StepMetrics, Trajectory

# Options shared by `train` and `collect` (one definition, one help text).
EnvKindOption = Annotated[
    str, typer.Option("--env-kind", help="harness (simulated user + harness scorer) or fleet (single turn).")
]
UserOption = Annotated[str, typer.Option("--user", help="Simulated user: scripted, or a litellm model.")]
UserApiBaseOption = Annotated[str | None, typer.Option("--user-api-base", help="API base of the user model.")]
JudgeOption = Annotated[
    str | None,
    typer.Option("--judge", help="litellm model judging nl_assertions and user errors (optional)."),
]
RayWorkersOption = Annotated[
    int,
    typer.Option(
        "--ray-workers",
        help="Play episodes on N Ray actors (each builds its own envs and backend); 0: in this process.",
    ),
]
RayAddressOption = Annotated[
    str | None,
    typer.Option("--ray-address", help="Ray cluster to join (default: start a local Ray instance)."),
]
FleetUrlOption = Annotated[
    str | None,
    typer.Option("--fleet-url", help="Run episodes on this `envforge serve` fleet instead of in-process."),
]
FleetTokenOption = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="ENVFORGE_TOKEN", help="Bearer token of the --fleet-url server's control plane."
    ),
]


ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        help="HF model dir (weights + tokenizer), or local / local/NAME: a packaged GGUF model, "
        "dequantized once into a folder beside it.",
    ),
]
MaxBatchOption = Annotated[
    int,
    typer.Option(
        "--max-batch",
        help="Most sequences the hf sampler decodes as one batch (16 suits a CPU; on a GPU raise it to "
        "the episodes in flight: collectors x rollouts per task).",
    ),
]
PrecisionOption = Annotated[
    str,
    typer.Option(
        "--precision",
        help="float32, or bfloat16: sample in bf16 (and in `train`, update under bf16 autocast; the "
        "weights stay float32).",
    ),
]

TasksOption = Annotated[
    str,
    typer.Option(
        "--tasks",
        help="all: each env's tasks.jsonl; lookup: single-lookup tasks made from the env "
        "(one read call, one figure to state), split into train and held-out.",
    ),
]


def _model_dir(spec: str) -> Path:
    from envforge.harness import LocalModelError
    from envforge.trainer import resolve_model

    try:
        return resolve_model(spec)
    except (LocalModelError, FileNotFoundError) as exc:
        fail(str(exc))


def _opts(
    model: str,
    envs: list[Path],
    backend: str,
    vllm_url: str | None,
    out: Path,
    device: str,
    temperature: float,
    seed: int,
    mcp: bool,
    **extra: Any,
) -> RunOptions:
    from envforge.harness import is_local_spec
    from envforge.trainer import RunOptions

    if not is_local_spec(model):
        check_model_dir(Path(model))
    if backend not in ("hf", "vllm"):
        fail("--backend must be hf or vllm")
    if extra.get("env_kind", "harness") not in ("harness", "fleet"):
        fail("--env-kind must be harness or fleet")
    if backend == "vllm" and not vllm_url:
        fail("--backend vllm needs --vllm-url")
    if extra.get("ray_workers", 0) < 0:
        fail("--ray-workers must be >= 0")
    if extra.get("ray_address") and not extra.get("ray_workers"):
        fail("--ray-address needs --ray-workers N")
    if extra.get("tasks", "all") not in ("all", "lookup"):
        fail("--tasks must be all or lookup")
    if extra.get("precision", "float32") not in ("float32", "bfloat16"):
        fail("--precision must be float32 or bfloat16")
    if extra.get("max_batch", 16) < 1:
        fail("--max-batch must be at least 1")
    if extra.get("tasks") == "lookup" and extra.get("env_kind") == "harness":
        extra["env_kind"] = "fleet"  # a lookup is one question: no simulated user to talk to
    check_envs(envs, extra.get("fleet_url"), extra.get("fleet_token"))
    user = extra.get("user")
    check_model_keys(
        {
            "user": (None if user == UserName.SCRIPTED else user, extra.get("user_api_base")),
            "judge": (extra.get("judge"), None),
        }
    )
    return RunOptions(
        model=_model_dir(model),
        envs=envs,
        backend=backend,
        vllm_url=vllm_url,
        out=out,
        device=device,
        temperature=temperature,
        seed=seed,
        use_mcp=mcp,
        **extra,
    )


def check_envs(envs: list[Path], fleet_url: str | None, token: str | None = None) -> None:
    """The env folders load and, with `--fleet-url`, that fleet serves every one of them."""
    loaded = load_envs(envs)
    if fleet_url:
        check_served_envs(
            fleet_url,
            token,
            {e.name: d for e, d in zip(loaded, envs, strict=True)},
            "--fleet-url",
        )


def check_tasks_per_step(envs: list[Path], tasks_per_step: int) -> None:
    """ERPO compares two tasks per env each step: checked here, before the model loads."""
    if tasks_per_step < 2 * len(envs):
        fail(
            f"--tasks-per-step {tasks_per_step} is too small: ERPO needs >= 2 per env "
            f"(>= {2 * len(envs)} for {len(envs)} env(s))"
        )
    for d in envs:
        path = d / "tasks.jsonl"
        count = (
            sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
            if path.exists()
            else 0
        )
        if count < 2:
            fail(
                f"{d} has {count} task(s); ERPO needs >= 2 per env "
                f"(make some with `envforge synth tasks {d}`)"
            )


def train_cmd(
    model: ModelOption,
    envs: list[Path] = typer.Option(
        ..., "--envs", help="Env dirs, each with tasks.jsonl: --envs envs/a envs/b (or repeat --envs)."
    ),
    backend: str = typer.Option("hf", "--backend", help="hf (local transformers) or vllm (HTTP)."),
    vllm_url: str | None = typer.Option(None, "--vllm-url", help="OpenAI-compatible vLLM server URL."),
    steps: int = typer.Option(10, "--steps"),
    tasks_per_step: int = typer.Option(4, "--tasks-per-step", help=">= 2 per env."),
    rollouts_per_task: int = typer.Option(4, "--rollouts-per-task"),
    staleness: int = typer.Option(
        1,
        "--staleness",
        help="Max policy versions a sample may lag; collection runs at most this many batches ahead.",
    ),
    out: Path = typer.Option(..., "--out"),
    lr: float = typer.Option(1e-5, "--lr"),
    baseline: str = typer.Option("task", "--baseline", help="task or env"),
    advantage: str = typer.Option("erpo", "--advantage", help="erpo or grpo"),
    max_turns: int = typer.Option(8, "--max-turns"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    collectors: int = typer.Option(
        2, "--collectors", help="Task groups collected concurrently (per worker with --ray-workers)."
    ),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="0: only the last step."),
    device: str = typer.Option("cpu", "--device"),
    temperature: float = typer.Option(1.0, "--temperature"),
    seed: int = typer.Option(0, "--seed"),
    mcp: bool = typer.Option(True, "--mcp/--no-mcp", help="Call tools over in-process MCP or directly."),
    save_trajectories: bool = typer.Option(False, "--save-trajectories"),
    env_kind: EnvKindOption = "harness",
    user: UserOption = UserName.SCRIPTED,
    user_api_base: UserApiBaseOption = None,
    judge: JudgeOption = None,
    ray_workers: RayWorkersOption = 0,
    ray_address: RayAddressOption = None,
    fleet_url: FleetUrlOption = None,
    token: FleetTokenOption = None,
    tasks: TasksOption = "all",
    eval_every: int = typer.Option(
        0, "--eval-every", help="Evaluate the held-out tasks (--tasks lookup) every N steps; 0: never."
    ),
    eval_samples: int = typer.Option(2, "--eval-samples", help="Seeded episodes per held-out task."),
    max_minutes: float = typer.Option(
        0.0, "--max-minutes", help="Stop after the step that passes it; 0: none."
    ),
    precision: PrecisionOption = "float32",
    max_batch: MaxBatchOption = 16,
) -> None:
    """Train a policy with asynchronous ERPO on env tasks; writes metrics, checkpoints and plots."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from envforge.trainer import LearnerConfig, RolloutConfig, TrainConfig, run_training

    check_tasks_per_step(envs, tasks_per_step)
    opts = _opts(
        model,
        envs,
        backend,
        vllm_url,
        out,
        device,
        temperature,
        seed,
        mcp,
        checkpoint_every=checkpoint_every,
        save_trajectories=save_trajectories,
        env_kind=env_kind,
        user=user,
        user_api_base=user_api_base,
        judge=judge,
        ray_workers=ray_workers,
        ray_address=ray_address,
        fleet_url=fleet_url,
        fleet_token=token,
        tasks=tasks,
        eval_every=eval_every,
        eval_samples=eval_samples,
        precision=precision,
        max_batch=max_batch,
    )
    if eval_every and tasks != "lookup":
        fail("--eval-every evaluates held-out tasks: use it with --tasks lookup")
    try:
        config = TrainConfig(
            steps=steps,
            tasks_per_step=tasks_per_step,
            rollouts_per_task=rollouts_per_task,
            staleness=staleness,
            collectors=collectors,
            seed=seed,
            max_seconds=max_minutes * 60,
            rollout=RolloutConfig(max_turns=max_turns, max_new_tokens=max_new_tokens),
        )
        learner_config = LearnerConfig(lr=lr, baseline=baseline, advantage=advantage)
    except ValueError as exc:
        fail(str(exc))
    with Progress(
        TextColumn("train"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} {task.fields[info]}"),
        TimeRemainingColumn(),
        console=console,
        disable=os.environ.get("RANK", "0") != "0",  # under torchrun only rank 0 shows progress
    ) as bar:
        task = bar.add_task("train", total=steps, info="")

        nonfinite = 0

        def progress(m: StepMetrics) -> None:
            nonlocal nonfinite
            nonfinite += m.update_nonfinite
            shown = f" {nonfinite} non-finite update(s) not applied" if nonfinite else ""
            bar.update(task, advance=1, info=f"reward {m.reward_mean:.3f} stale<={m.staleness_max}{shown}")

        try:
            metrics = anyio.run(lambda: run_training(opts, config, learner_config, progress=progress))
        except (ValueError, FileNotFoundError, ImportError, TimeoutError) as exc:
            fail(str(exc))
    if not metrics:  # a torchrun rank other than 0: it only followed rank 0's updates
        return
    dropped = sum(m.update_nonfinite for m in metrics)
    note = f"; {dropped} update(s) had a non-finite gradient and were not applied" if dropped else ""
    console.print(
        f"done: {len(metrics)} steps, reward {metrics[0].reward_mean:.3f} -> {metrics[-1].reward_mean:.3f}"
        f"{note}; outputs in {out}"
    )


def collect_cmd(
    model: ModelOption,
    envs: list[Path] = typer.Option(..., "--envs", help="Env dirs: --envs envs/a envs/b (or repeat --envs)."),
    backend: str = typer.Option("hf", "--backend"),
    vllm_url: str | None = typer.Option(None, "--vllm-url"),
    groups: int = typer.Option(4, "--groups", help="Task groups to collect (round-robin over envs)."),
    rollouts_per_task: int = typer.Option(4, "--rollouts-per-task"),
    max_turns: int = typer.Option(8, "--max-turns"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    concurrency: int = typer.Option(
        2, "--concurrency", help="Task groups collected concurrently (per worker with --ray-workers)."
    ),
    out: Path = typer.Option(..., "--out"),
    device: str = typer.Option("cpu", "--device"),
    temperature: float = typer.Option(1.0, "--temperature"),
    seed: int = typer.Option(0, "--seed"),
    mcp: bool = typer.Option(True, "--mcp/--no-mcp"),
    env_kind: EnvKindOption = "harness",
    user: UserOption = UserName.SCRIPTED,
    user_api_base: UserApiBaseOption = None,
    judge: JudgeOption = None,
    ray_workers: RayWorkersOption = 0,
    ray_address: RayAddressOption = None,
    fleet_url: FleetUrlOption = None,
    token: FleetTokenOption = None,
    tasks: TasksOption = "all",
    precision: PrecisionOption = "float32",
    max_batch: MaxBatchOption = 16,
) -> None:
    """Collect rollouts only (no updates) and write them to OUT/trajectories.jsonl."""
    from envforge.trainer import RolloutConfig, run_collection

    opts = _opts(
        model,
        envs,
        backend,
        vllm_url,
        out,
        device,
        temperature,
        seed,
        mcp,
        env_kind=env_kind,
        user=user,
        user_api_base=user_api_base,
        judge=judge,
        ray_workers=ray_workers,
        ray_address=ray_address,
        fleet_url=fleet_url,
        fleet_token=token,
        tasks=tasks,
        precision=precision,
        max_batch=max_batch,
    )
    rc = RolloutConfig(max_turns=max_turns, max_new_tokens=max_new_tokens)
    done = {"n": 0}

    def progress(trajs: list[Trajectory]) -> None:
        done["n"] += 1
        console.print(
            f"group {done['n']}/{groups}: {trajs[0].env}/{trajs[0].task_id} "
            f"rewards {[round(t.reward, 2) for t in trajs]} "
            f"user errors {sum(t.user_error for t in trajs)}"
        )

    try:
        path = anyio.run(
            lambda: run_collection(
                opts,
                groups=groups,
                rollouts_per_task=rollouts_per_task,
                rollout_config=rc,
                concurrency=concurrency,
                progress=progress,
            )
        )
    except (ValueError, FileNotFoundError, ImportError, TimeoutError) as exc:
        fail(str(exc))
    console.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("collect")(collect_cmd)
