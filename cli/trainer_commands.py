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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, get_args

import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from envforge.harness import UserName

from .common import choice, console, fail, fail_setting, load_envs
from .harness_commands import check_model_keys
from .preflight import check_model_dir, check_served_envs
from .progress import work_progress

if TYPE_CHECKING:
    from envforge.trainer import RunOptions, StepMetrics, Trajectory

# Options shared by `train` and `collect` (one definition, one help text).
EnvKindOption = Annotated[
    str,
    typer.Option(
        "--env-kind",
        help="harness (simulated user + harness scorer) or fleet (single turn; what --tasks lookup "
        "always plays). run.json's `ran` records the kind that ran and why.",
    ),
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
MaxSeqLenOption = Annotated[
    int,
    typer.Option(
        "--max-seq-len",
        help="Most tokens in one episode (prompt included): a task whose opening leaves no room for a "
        "turn is an error (τ² telecom's policy and manual take ~6,500 tokens: 8192 plays them).",
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
        "(one read call, one figure to state); steps: its tasks of 2-3 calls with one write; "
        "lookup+steps: both, each set its own env; told: 2-3-call tasks with one write "
        "synthesized from the env at --seed, the user stating its facts in the request; "
        "lookup+told: lookups and those; pair: those cut to one read then the write; lookup+pair. "
        "All but `all` split into train and held-out.",
    ),
]


def _model_dir(spec: str) -> Path:
    from envforge.harness import LocalModelError
    from envforge.trainer import resolve_model

    try:
        return resolve_model(spec)
    except (LocalModelError, FileNotFoundError) as exc:
        fail(str(exc))


def _run_options(
    model: str,
    envs: list[Path],
    out: Path,
    *,
    backend: str,
    vllm_url: str | None,
    device: str,
    temperature: float,
    seed: int,
    mcp: bool,
    env_kind: str,
    user: str,
    user_api_base: str | None,
    judge: str | None,
    ray_workers: int,
    ray_address: str | None,
    fleet_url: str | None,
    token: str | None,
    tasks: str,
    precision: str,
    max_batch: int,
    checkpoint_every: int = 0,
    save_trajectories: bool = False,
    eval_every: int = 0,
    eval_samples: int = 2,
    user_error_rate: float = 0.0,
) -> RunOptions:
    """The flags as the trainer's `RunOptions`, each mistake an `error:` line before any model loads:
    the model folder, each choice (from `RunOptions`' own fields), the options as a whole
    (`envforge.checked_run_options`), the envs and the user's and judge's API keys; a packaged
    model is resolved last (dequantized on first use)."""
    import envforge
    from envforge.harness import is_local_spec
    from envforge.trainer import RunOptions

    def choices(field: str) -> tuple[str, ...]:
        return get_args(RunOptions.model_fields[field].annotation)

    if not is_local_spec(model):
        check_model_dir(Path(model))
    backend = choice("--backend", backend, choices("backend"))
    env_kind = choice("--env-kind", env_kind, choices("env_kind"))
    tasks = choice("--tasks", tasks, choices("tasks"))
    precision = choice("--precision", precision, choices("precision"))
    if max_batch < 1:
        fail("--max-batch must be at least 1")
    if not 0.0 <= user_error_rate <= 1.0:
        fail("--user-error-rate must be between 0 and 1")
    try:
        options = envforge.checked_run_options(
            RunOptions(
                model=Path(model),
                envs=envs,
                backend=backend,
                vllm_url=vllm_url,
                out=out,
                device=device,
                temperature=temperature,
                seed=seed,
                use_mcp=mcp,
                checkpoint_every=checkpoint_every,
                save_trajectories=save_trajectories,
                env_kind=env_kind,
                user=user,
                user_api_base=user_api_base,
                judge=judge,
                fleet_url=fleet_url,
                fleet_token=token,
                ray_workers=ray_workers,
                ray_address=ray_address,
                tasks=tasks,
                eval_every=eval_every,
                eval_samples=eval_samples,
                precision=precision,
                max_batch=max_batch,
                user_error_rate=user_error_rate,
            )
        )
    except envforge.SettingError as exc:
        fail_setting(exc)
    check_envs(envs, fleet_url, token)
    check_model_keys(
        {"user": (None if user == UserName.SCRIPTED else user, user_api_base), "judge": (judge, None)}
    )
    return options.model_copy(update={"model": _model_dir(model)})


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


@dataclass
class TrainBar:
    """`envforge.train`'s step hook drawn as a bar (off a terminal, a line per step): each step's
    mean reward and staleness, and how many updates so far were skipped (zero reward variance in
    every group: nothing to learn from) or dropped for a non-finite gradient."""

    progress: Progress
    bar: TaskID
    nonfinite: int = 0
    skipped: int = 0

    def on_step(self, m: StepMetrics) -> None:
        self.nonfinite += m.update_nonfinite
        self.skipped += m.update_skipped
        shown = f" {self.skipped} update(s) skipped (zero variance)" if self.skipped else ""
        shown += f" {self.nonfinite} non-finite update(s) not applied" if self.nonfinite else ""
        info = f"reward {m.reward_mean:.3f} stale<={m.staleness_max}{shown}"
        self.progress.update(self.bar, advance=1, info=info)


@contextmanager
def train_progress(steps: int) -> Iterator[TrainBar]:
    """A bar over the steps; under torchrun only rank 0 shows one."""
    columns = (
        TextColumn("train"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} {task.fields[info]}"),
    )
    hidden = os.environ.get("RANK", "0") != "0"
    bar = work_progress(*columns, TimeRemainingColumn(), console=console, label="train", disable=hidden)
    with bar as progress:
        yield TrainBar(progress, progress.add_task("train", total=steps, info=""))


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
    mask_user_errors: bool = typer.Option(
        True,
        "--mask-user-errors/--no-mask-user-errors",
        help="ERPO's MEU mask: leave episodes the detector blames on the simulated user out of the update.",
    ),
    user_error_rate: float = typer.Option(
        0.0,
        "--user-error-rate",
        help="Share of training episodes whose scripted user makes one user error on purpose (the kind "
        "is recorded on the trajectory; metrics.jsonl scores the mask against it). With --tasks lookup "
        "it plays lookups with the scripted user.",
    ),
    max_turns: int = typer.Option(8, "--max-turns"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    max_seq_len: MaxSeqLenOption = 4096,
    collectors: int = typer.Option(
        2, "--collectors", help="Task groups collected concurrently (per worker with --ray-workers)."
    ),
    checkpoint_every: int = typer.Option(
        0,
        "--checkpoint-every",
        help="Save every N steps; 0: only at the end, and only if an update was applied.",
    ),
    device: str = typer.Option("cpu", "--device"),
    temperature: float = typer.Option(1.0, "--temperature"),
    seed: int = typer.Option(0, "--seed"),
    mcp: bool = typer.Option(True, "--mcp/--no-mcp", help="Call tools over in-process MCP or directly."),
    save_trajectories: bool = typer.Option(
        False,
        "--save-trajectories",
        help="Write the training episodes to trajectories.jsonl and each held-out evaluation's to "
        "eval_trajectories/step_<n>.jsonl.",
    ),
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
        0,
        "--eval-every",
        help="Evaluate the held-out tasks (--tasks other than all) every N steps; 0: never.",
    ),
    eval_samples: int = typer.Option(2, "--eval-samples", help="Seeded episodes per held-out task."),
    max_minutes: float = typer.Option(
        0.0, "--max-minutes", help="Stop after the step that passes it; 0: none."
    ),
    precision: PrecisionOption = "float32",
    max_batch: MaxBatchOption = 16,
) -> None:
    """Train a policy with asynchronous ERPO on env tasks; writes metrics, checkpoints and plots."""
    import envforge
    from envforge.trainer import LearnerConfig, RolloutConfig, TrainConfig

    try:
        envforge.check_tasks_per_step(envs, tasks_per_step)
    except envforge.SettingError as exc:
        fail_setting(exc)
    except ValueError as exc:
        fail(str(exc))
    opts = _run_options(
        model,
        envs,
        out,
        backend=backend,
        vllm_url=vllm_url,
        device=device,
        temperature=temperature,
        seed=seed,
        mcp=mcp,
        checkpoint_every=checkpoint_every,
        save_trajectories=save_trajectories,
        env_kind=env_kind,
        user=user,
        user_api_base=user_api_base,
        judge=judge,
        ray_workers=ray_workers,
        ray_address=ray_address,
        fleet_url=fleet_url,
        token=token,
        tasks=tasks,
        eval_every=eval_every,
        eval_samples=eval_samples,
        precision=precision,
        max_batch=max_batch,
        user_error_rate=user_error_rate,
    )
    try:
        config = TrainConfig(
            steps=steps,
            tasks_per_step=tasks_per_step,
            rollouts_per_task=rollouts_per_task,
            staleness=staleness,
            collectors=collectors,
            seed=seed,
            max_seconds=max_minutes * 60,
            rollout=RolloutConfig(
                max_turns=max_turns, max_new_tokens=max_new_tokens, max_seq_len=max_seq_len
            ),
        )
        learner_config = LearnerConfig(
            lr=lr, baseline=baseline, advantage=advantage, mask_user_errors=mask_user_errors
        )
    except ValueError as exc:
        fail(str(exc))
    with train_progress(steps) as bar:
        try:
            metrics = envforge.train(opts, config, learner_config, on_step=bar.on_step)
        except (ValueError, FileNotFoundError, ImportError, TimeoutError) as exc:
            fail(str(exc))
    if not metrics:  # a torchrun rank other than 0: it only followed rank 0's updates
        return
    from envforge.trainer import summarize

    summary = summarize(metrics, out)
    updates = f"{summary.updates_applied} of {summary.steps} updates applied"
    if summary.updates_skipped:
        updates += f", {summary.updates_skipped} skipped (zero reward variance in every group)"
    if summary.updates_nonfinite:
        updates += f", {summary.updates_nonfinite} with a non-finite gradient not applied"
    console.print(
        f"done: {len(metrics)} steps, reward {metrics[0].reward_mean:.3f} -> {metrics[-1].reward_mean:.3f}; "
        f"{updates}; outputs in {out}",
        highlight=False,
    )
    for kind, line in summary.lines(metrics):
        label = f"[yellow]{kind}:[/]" if kind == "warning" else f"{kind}:"
        console.print(f"{label} {line}", highlight=False)


def collect_cmd(
    model: ModelOption,
    envs: list[Path] = typer.Option(..., "--envs", help="Env dirs: --envs envs/a envs/b (or repeat --envs)."),
    backend: str = typer.Option("hf", "--backend"),
    vllm_url: str | None = typer.Option(None, "--vllm-url"),
    groups: int = typer.Option(4, "--groups", help="Task groups to collect (round-robin over envs)."),
    rollouts_per_task: int = typer.Option(4, "--rollouts-per-task"),
    max_turns: int = typer.Option(8, "--max-turns"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    max_seq_len: MaxSeqLenOption = 4096,
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
    import envforge
    from envforge.trainer import RolloutConfig

    opts = _run_options(
        model,
        envs,
        out,
        backend=backend,
        vllm_url=vllm_url,
        device=device,
        temperature=temperature,
        seed=seed,
        mcp=mcp,
        env_kind=env_kind,
        user=user,
        user_api_base=user_api_base,
        judge=judge,
        ray_workers=ray_workers,
        ray_address=ray_address,
        fleet_url=fleet_url,
        token=token,
        tasks=tasks,
        precision=precision,
        max_batch=max_batch,
    )
    landed = 0

    def on_group(trajs: list[Trajectory]) -> None:
        nonlocal landed
        landed += 1
        console.print(
            f"group {landed}/{groups}: {trajs[0].env}/{trajs[0].task_id} "
            f"rewards {[round(t.reward, 2) for t in trajs]} "
            f"user errors {sum(t.user_error for t in trajs)}"
        )

    try:
        path = envforge.collect_trajectories(
            opts,
            groups=groups,
            rollouts_per_task=rollouts_per_task,
            rollout_config=RolloutConfig(
                max_turns=max_turns, max_new_tokens=max_new_tokens, max_seq_len=max_seq_len
            ),
            concurrency=concurrency,
            on_group=on_group,
        )
    except (ValueError, FileNotFoundError, ImportError, TimeoutError) as exc:
        fail(str(exc))
    console.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("collect")(collect_cmd)
