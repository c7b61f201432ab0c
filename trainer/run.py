"""What `envforge train` and `envforge collect` do, as functions: build the pieces, run, write the outputs.

Outputs of a training run in `out/`: `metrics.jsonl` (one StepMetrics per line), `trajectories.jsonl`
(optional), `eval.jsonl` and, with `save_trajectories`, `eval_trajectories/step_<n>.jsonl` (each
held-out evaluation's episodes, in `eval.jsonl`'s order), `checkpoints/step_<n>/` (HF model +
tokenizer) and `plots/`. With the harness env (the
default) `user_errors.jsonl` lists every masked episode with the detector's verdict (the reason is
also on each `Trajectory`; the file adds termination and the user's messages).

`env_kind="harness"` plays episodes with the evaluation harness's simulated user and scorer
(`HarnessRolloutEnv`); `env_kind="fleet"` keeps the single-turn `FleetRolloutEnv` (the bandit smoke
tests use it: a one-press task has no user to talk to).

`fleet_url` plays episodes on a running `envforge serve` instead of an in-process fleet;
`ray_workers > 0` plays them on that many Ray actors (`ray_workers.RayWorkers`), on a local Ray
instance started here unless `ray_address` names a cluster.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import anyio
from pydantic import BaseModel, Field, SecretStr

from envforge.harness import EnvTasks, UserName, http_sessions
from envforge.server import Fleet, load_env
from envforge.synth import Task, load_policy_rules, load_tasks

from .backends import GenerationBackend, HFBackend, VLLMBackend, load_tokenizer
from .distributed import DataParallel, init_from_env, rank_device, shutdown
from .envs import build_envs
from .harness_env import EpisodeVerdict, HarnessRolloutEnv
from .learner import Learner, LearnerConfig, Precision
from .lookup import lookup_tasks, split_tasks
from .loop import StepMetrics, TrainConfig, collect, train
from .plots import write_plots
from .remote_fleet import EpisodeFleet, RemoteFleet
from .rollout import FleetRolloutEnv, RolloutConfig, RolloutEnv, rollout
from .short_tasks import pair_tasks, split_steps, step_tasks, told_tasks
from .summary import peak_memory_mib, summarize
from .trajectory import TokenizerLike, Trajectory

if TYPE_CHECKING:
    from .ray_workers import RayWorkers


ENV_KIND_WHY = {
    ("all", "harness"): "multi-turn episodes with the simulated user and the harness scorer",
    ("all", "fleet"): "single-turn episodes (--env-kind fleet)",
    ("lookup", "fleet"): "--tasks lookup plays single-turn lookups: no user to talk to",
    ("lookup", "harness"): "multi-turn lookups with a simulated user that errs (--user-error-rate)",
    ("steps", "harness"): "2-3-call tasks with a write: the simulated user gives facts and consent",
    ("lookup+steps", "harness"): "lookups and 2-3-call tasks with a write, each set its own env, "
    "with the simulated user",
    ("told", "harness"): "synthesized 2-3-call tasks with a write whose user states its facts in the request",
    ("lookup+told", "harness"): "lookups and synthesized 2-3-call tasks with a write, each set its own env, "
    "with the simulated user",
    ("pair", "harness"): "synthesized tasks of one read then one write whose user states its facts "
    "in the request",
    ("lookup+pair", "harness"): "lookups and synthesized read-then-write tasks, each set its own env, "
    "with the simulated user",
}
"""Why a run's episodes took the shape `run.json` records (`--tasks lookup` turns the harness
default into the single-turn env: `envforge.checked_run_options`)."""


class RunOptions(BaseModel):
    model: Path
    envs: list[Path]
    backend: Literal["hf", "vllm"] = "hf"
    vllm_url: str | None = None
    vllm_model: str | None = None
    out: Path
    device: str = "cpu"
    temperature: float = 1.0
    seed: int = 0
    use_mcp: bool = True
    checkpoint_every: int = 0
    save_trajectories: bool = False
    env_kind: Literal["harness", "fleet"] = "harness"
    user: str = UserName.SCRIPTED
    user_api_base: str | None = None
    judge: str | None = None
    fleet_url: str | None = None
    fleet_token: SecretStr | None = None
    """The bearer token of `fleet_url`'s control plane; written to no file (`options` shows stars)."""
    ray_workers: int = 0
    ray_address: str | None = None
    tasks: Literal["all", "lookup", "steps", "lookup+steps", "told", "lookup+told", "pair", "lookup+pair"] = (
        "all"
    )
    eval_every: int = 0
    eval_samples: int = 2
    precision: Precision = "float32"
    """`bfloat16`: the sampler's copy of the weights in bf16, the learner under bf16 autocast."""
    user_error_rate: float = Field(0.0, ge=0.0, le=1.0)
    """The share of training episodes whose scripted user is made to err (`ErringUser`); held-out
    evaluations always play the user that does not."""
    max_batch: int = Field(16, ge=1)
    """Most sequences the hf sampler decodes together: a CPU gains little past 16, a GPU wants every
    episode in flight in one batch."""


def secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def _fleet(opts: RunOptions) -> EpisodeFleet:
    """The in-process fleet, or a `RemoteFleet` (same surface) when episodes run on a server."""
    loaded = [load_env(d) for d in opts.envs]
    if opts.fleet_url:
        return RemoteFleet(opts.fleet_url, loaded, token=secret(opts.fleet_token))
    return Fleet(loaded)


async def _build_split(fleet: EpisodeFleet, opts: RunOptions) -> tuple[list[RolloutEnv], list[RolloutEnv]]:
    """(train envs, held-out envs) of the task sets `opts.tasks` names, one pair per env folder and set.

    Lookups play single-turn, or with the scripted user when the run has one (`env_kind="harness"`,
    which a user that errs needs); step tasks (`steps`: the env's own; `told`: synthesized at the
    run's seed, `short_tasks.told_tasks`; `pair`: those cut to a read and a write,
    `short_tasks.pair_tasks`) always with it (a write needs its facts and consent).
    With both sets an env's step tasks are their own env for ERPO (`<env>/steps`, `<env>/told`):
    their reward spread is another env's. The held-out side's user never errs."""
    if opts.ray_workers or opts.fleet_url:
        raise ValueError(f"--tasks {opts.tasks} runs in this process (no --ray-workers, no --fleet-url)")
    sets = opts.tasks.split("+")
    train_envs: list[RolloutEnv] = []
    held: list[RolloutEnv] = []
    for d in opts.envs:
        name = load_env(d).name
        if "lookup" in sets:
            train_tasks, held_tasks = split_tasks(await lookup_tasks(fleet, name))
            _enough(name, "lookup", train_tasks)
            if opts.env_kind == "harness":
                train_envs.append(_harness(fleet, d, train_tasks, opts, opts.user_error_rate, name))
                held.append(_harness(fleet, d, held_tasks, opts, 0.0, name))
            else:
                train_envs.append(FleetRolloutEnv(fleet, name, train_tasks, use_mcp=opts.use_mcp))
                held.append(FleetRolloutEnv(fleet, name, held_tasks, use_mcp=opts.use_mcp))
        for kind in ("steps", "told", "pair"):
            if kind not in sets:
                continue
            label = f"{name}/{kind}" if len(sets) > 1 else name
            if kind == "steps":
                made = step_tasks(load_tasks(Path(d)))
            else:
                made = await (told_tasks if kind == "told" else pair_tasks)(load_env(d), opts.seed)
            train_tasks, held_tasks = split_steps(made)
            _enough(name, kind, train_tasks)
            train_envs.append(_harness(fleet, d, train_tasks, opts, opts.user_error_rate, label))
            held.append(_harness(fleet, d, held_tasks, opts, 0.0, label))
    return train_envs, held


def _enough(name: str, kind: str, tasks: list[Task]) -> None:
    if len(tasks) < 2:
        raise ValueError(f"env {name!r} has {len(tasks)} {kind} task(s) to train on; 2 are needed")


def _harness(
    fleet: EpisodeFleet, env_dir: Path, tasks: list[Task], opts: RunOptions, rate: float, label: str
) -> HarnessRolloutEnv:
    env = load_env(env_dir)
    env_tasks = EnvTasks(env_dir=env_dir, env=env, tasks=tasks, policy_rules=load_policy_rules(env))
    return HarnessRolloutEnv(
        fleet, env_tasks, use_mcp=opts.use_mcp, user_error_rate=rate, user_error_seed=opts.seed, name=label
    )


async def _build_all(fleet: EpisodeFleet, opts: RunOptions) -> tuple[list[RolloutEnv], list[RolloutEnv]]:
    if opts.tasks != "all":
        return await _build_split(fleet, opts)
    return _build(fleet, opts), []


def _build(fleet: EpisodeFleet, opts: RunOptions) -> list[RolloutEnv]:
    return build_envs(
        fleet,
        opts.envs,
        opts.use_mcp,
        env_kind=opts.env_kind,
        user=opts.user,
        user_api_base=opts.user_api_base,
        judge=opts.judge,
        user_error_rate=opts.user_error_rate,
        user_error_seed=opts.seed,
    )


def write_user_errors(envs: Sequence[RolloutEnv], path: Path, verdicts: Sequence[EpisodeVerdict] = ()) -> int:
    """`path` gets one JSON line per masked harness episode (env, task, reason, user messages).

    `verdicts` adds episodes played elsewhere (by Ray workers).
    """
    local = [v for e in envs if isinstance(e, HarnessRolloutEnv) for v in e.verdicts]
    rows = [asdict(v) for v in [*local, *verdicts] if v.user_error]
    path.write_text("".join(json.dumps(v) + "\n" for v in rows))
    return len(rows)


def _load(opts: RunOptions, *, training: bool = True) -> tuple[Any, Any, GenerationBackend | None]:
    """Tokenizer, model (None when nothing on the driver needs it) and the driver's backend."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(opts.seed)
    tok = load_tokenizer(opts.model)
    local_hf = opts.backend == "hf" and not opts.ray_workers
    model = None
    if training or local_hf:
        model = AutoModelForCausalLM.from_pretrained(str(opts.model)).to(opts.device)
    eos = tok.eos_token_id
    backend: GenerationBackend | None
    if opts.backend == "hf" and opts.ray_workers:
        backend = None  # the actors sample; the driver only trains
    elif opts.backend == "hf":
        backend = HFBackend(
            model,
            eos_id=eos,
            temperature=opts.temperature,
            seed=opts.seed,
            precision=opts.precision,
            max_batch=opts.max_batch,
        )
    else:
        if not opts.vllm_url:
            raise ValueError("--vllm-url is required with --backend vllm")
        backend = VLLMBackend(
            opts.vllm_url,
            model=opts.vllm_model or str(opts.model),
            eos_id=eos,
            temperature=opts.temperature,
            sync_dir=opts.out / "sync",
        )
    return tok, model, backend


class _Ray:
    """Ray workers for one run: started (with a local Ray instance if needed) and torn down here."""

    def __init__(self, opts: RunOptions, driver_backend: GenerationBackend | None, per_worker: int) -> None:
        self.opts, self.driver_backend, self.per_worker = opts, driver_backend, per_worker
        self.workers: RayWorkers | None = None
        self.started_ray = False

    async def __aenter__(self) -> RayWorkers | None:
        if self.opts.ray_workers < 1:
            return None
        from .ray_workers import RayWorkers, WorkerSpec, init_ray

        cpus = max(self.opts.ray_workers, os.cpu_count() or 1)
        self.started_ray = init_ray(self.opts.ray_address, num_cpus=cpus)
        try:
            self.workers = await RayWorkers.start(
                WorkerSpec.from_options(self.opts),
                self.opts.ray_workers,
                driver_backend=self.driver_backend,
                groups_per_worker=self.per_worker,
            )
        except BaseException:
            await self.__aexit__()
            raise
        return self.workers

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self.workers is not None:
                await self.workers.aclose()
        finally:
            if self.started_ray:
                import ray

                ray.shutdown()


async def run_training(
    opts: RunOptions,
    config: TrainConfig,
    learner_config: LearnerConfig,
    *,
    progress: Callable[[StepMetrics], object] | None = None,
) -> list[StepMetrics]:
    dp = init_from_env(opts.device)
    if dp is not None:
        opts = opts.model_copy(update={"device": rank_device(opts.device, dp)})
        if not dp.is_leader:
            try:
                await anyio.to_thread.run_sync(_follow, opts, learner_config, dp)
            finally:
                shutdown()
            return []
    try:
        return await _train_leader(opts, config, learner_config, dp, progress)
    finally:
        if dp is not None:
            shutdown()


def _follow(opts: RunOptions, learner_config: LearnerConfig, dp: DataParallel) -> None:
    """A torchrun rank other than 0: the same model and optimizer, stepping on rank 0's batches.

    It writes `ranks/rank<N>.json` (steps taken, final weights version and checksum) so a run can
    show that every rank ended with rank 0's weights.
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(opts.seed)
    model = AutoModelForCausalLM.from_pretrained(str(opts.model)).to(opts.device)
    tok = load_tokenizer(opts.model)
    learner = Learner(model, _learner_config(opts, learner_config), pad_id=tok.pad_token_id or 0, dp=dp)
    steps = learner.follow()
    _write_rank(opts.out, dp.rank, steps, model)


def _write_rank(out: Path, rank: int, steps: int, model: Any) -> None:
    from .ray_workers import state_checksum

    (out / "ranks").mkdir(parents=True, exist_ok=True)
    row = {"rank": rank, "steps": steps, "checksum": state_checksum(model.state_dict())}
    (out / "ranks" / f"rank{rank}.json").write_text(json.dumps(row) + "\n")


def _learner_config(opts: RunOptions, learner_config: LearnerConfig) -> LearnerConfig:
    # greedy sampling (temperature 0) is scored at temperature 1, as its logprobs were taken
    return learner_config.model_copy(
        update={"temperature": opts.temperature or 1.0, "precision": opts.precision}
    )


class HeldOutScore(TypedDict):
    """A held-out evaluation: a line of `eval.jsonl`, less the step, version and time it adds."""

    episodes: int
    reward_mean: float
    rewards: list[float]
    """In a fixed episode order, so two runs' evaluations pair up."""


async def evaluate_held_out(
    held: Sequence[RolloutEnv],
    backend: GenerationBackend,
    tok: TokenizerLike,
    rollout_config: RolloutConfig,
    *,
    samples: int,
    seed: int,
    played: list[Trajectory] | None = None,
) -> HeldOutScore:
    """Mean reward of the current weights on every held-out task, `samples` episodes each, with
    seeds fixed by task and sample: two runs from the same weights score the same episodes, so a
    learning run and its learning-rate-0 control differ only by what was learned. `played`, when
    given, gets the episodes themselves, in the order of `rewards`: a reward of 0 says nothing of
    how the episode went wrong."""
    episodes = [
        (env, task_id, seed + 1000 * i + 97 * k)
        for env in held
        for i, task_id in enumerate(env.task_ids())
        for k in range(samples)
    ]
    rewards: list[float] = [0.0] * len(episodes)
    trajectories: list[Trajectory | None] = [None] * len(episodes)

    async def play(n: int) -> None:
        env, task_id, episode_seed = episodes[n]
        t = await rollout(env, task_id, backend, tok, rollout_config, seed=episode_seed)
        rewards[n], trajectories[n] = t.reward, t

    async with anyio.create_task_group() as tg:  # all at once, so the backend can batch them
        for n in range(len(episodes)):
            tg.start_soon(play, n)
    if played is not None:
        played.extend(t for t in trajectories if t is not None)
    return {
        "episodes": len(rewards),
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "rewards": rewards,
    }


async def _train_leader(
    opts: RunOptions,
    config: TrainConfig,
    learner_config: LearnerConfig,
    dp: DataParallel | None,
    progress: Callable[[StepMetrics], object] | None,
) -> list[StepMetrics]:
    opts.out.mkdir(parents=True, exist_ok=True)
    fleet = _fleet(opts)
    envs, held = await _build_all(fleet, opts)
    tok, model, backend = _load(opts)
    learner = Learner(model, _learner_config(opts, learner_config), pad_id=tok.pad_token_id or 0, dp=dp)
    metrics_path = opts.out / "metrics.jsonl"
    metrics_path.write_text("")
    eval_path = opts.out / "eval.jsonl"
    eval_path.write_text("")

    async def run_eval(step: int) -> None:
        if backend is None or not held:
            return
        started = time.time()
        played: list[Trajectory] | None = [] if opts.save_trajectories else None
        score = await evaluate_held_out(
            held, backend, tok, config.rollout, samples=opts.eval_samples, seed=opts.seed, played=played
        )
        if played is not None:
            (opts.out / "eval_trajectories").mkdir(exist_ok=True)
            path = opts.out / "eval_trajectories" / f"step_{step}.jsonl"
            path.write_text("".join(t.model_dump_json() + "\n" for t in played))
        row = {
            **score,
            "step": step,
            "policy_version": backend.version,
            "seconds": round(time.time() - started, 1),
        }
        with eval_path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    async def after_step(m: StepMetrics) -> None:
        if opts.eval_every and ((m.step + 1) % opts.eval_every == 0 or m.step + 1 == config.steps):
            await run_eval(m.step + 1)

    traj_path = opts.out / "trajectories.jsonl"
    if opts.save_trajectories:
        traj_path.write_text("")

    checkpoints: list[str] = []

    def checkpoint(step: int) -> None:
        ckpt = opts.out / "checkpoints" / f"step_{step}"
        model.save_pretrained(ckpt)
        tok.save_pretrained(ckpt)
        checkpoints.append(str(ckpt.relative_to(opts.out)))

    def on_step(m: StepMetrics, trajs: list[Trajectory]) -> None:
        m.peak_memory_mib, m.peak_gpu_mib = peak_memory_mib(opts.device)
        with metrics_path.open("a") as f:
            f.write(m.model_dump_json() + "\n")
        if opts.save_trajectories:
            with traj_path.open("a") as f:
                f.writelines(t.model_dump_json() + "\n" for t in trajs)
        if opts.checkpoint_every and (m.step + 1) % opts.checkpoint_every == 0:
            checkpoint(m.step + 1)  # asked for: written whether or not this stretch updated
        if progress is not None:
            progress(m)

    verdicts: list[EpisodeVerdict] = []
    try:
        async with http_sessions(), _Ray(opts, backend, config.collectors) as workers:
            if opts.eval_every:
                await run_eval(0)
            metrics = await train(
                envs, backend, learner, tok, config, on_step=on_step, source=workers, after_step=after_step
            )
            if opts.eval_every and metrics and len(metrics) % opts.eval_every and len(metrics) < config.steps:
                await run_eval(len(metrics))  # stopped by --max-minutes: the weights it ended with
            if workers is not None:
                verdicts = await workers.verdicts()
            summary = summarize(metrics, opts.out)
            final = f"checkpoints/step_{len(metrics)}"
            if summary.updates_applied and final not in checkpoints:
                checkpoint(len(metrics))  # the end of a run that updated; unchanged weights are not saved
    finally:
        learner.close()  # releases the other torchrun ranks (a no-op in a single process)
        if backend is not None:
            await backend.aclose()
        await fleet.aclose()
    if dp is not None:
        _write_rank(opts.out, dp.rank, len(metrics), model)
    write_user_errors(envs, opts.out / "user_errors.jsonl", verdicts)
    write_plots(metrics_path, opts.out / "plots", eval_path=eval_path)
    (opts.out / "run.json").write_text(
        json.dumps(
            {
                "options": opts.model_dump(mode="json"),
                "train": config.model_dump(),
                "learner": learner.config.model_dump(),  # as applied: precision, temperature
                "ran": {
                    "env_kind": opts.env_kind,
                    "env_kind_why": ENV_KIND_WHY[opts.tasks, opts.env_kind],
                    **summary.ran(),
                    "checkpoints": checkpoints,
                },
            },
            indent=2,
        )
    )
    return metrics


async def run_collection(
    opts: RunOptions,
    *,
    groups: int,
    rollouts_per_task: int,
    rollout_config: RolloutConfig,
    concurrency: int = 2,
    progress: Callable[[list[Trajectory]], object] | None = None,
) -> Path:
    opts.out.mkdir(parents=True, exist_ok=True)
    fleet = _fleet(opts)
    envs, _ = await _build_all(fleet, opts)
    tok, _, backend = _load(opts, training=False)
    path = opts.out / "trajectories.jsonl"
    path.write_text("")

    def on_group(trajs: list[Trajectory]) -> None:
        with path.open("a") as f:
            f.writelines(t.model_dump_json() + "\n" for t in trajs)
        if progress is not None:
            progress(trajs)

    verdicts: list[EpisodeVerdict] = []
    try:
        async with http_sessions(), _Ray(opts, backend, concurrency) as workers:
            await collect(
                envs,
                backend,
                tok,
                groups=groups,
                rollouts_per_task=rollouts_per_task,
                rollout_config=rollout_config,
                concurrency=concurrency,
                seed=opts.seed,
                on_group=on_group,
                source=workers,
            )
            if workers is not None:
                verdicts = await workers.verdicts()
    finally:
        if backend is not None:
            await backend.aclose()
        await fleet.aclose()
    write_user_errors(envs, opts.out / "user_errors.jsonl", verdicts)
    return path
