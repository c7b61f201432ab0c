"""What `envforge train` and `envforge collect` do, as functions: build the pieces, run, write the outputs.

Outputs of a training run in `out/`: `metrics.jsonl` (one StepMetrics per line), `trajectories.jsonl`
(optional), `checkpoints/step_<n>/` (HF model + tokenizer) and `plots/`. With the harness env (the
default) `user_errors.jsonl` lists every masked episode with the detector's reason, because a
`Trajectory` only carries the flag.

`env_kind="harness"` plays episodes with the evaluation harness's simulated user and scorer
(`HarnessRolloutEnv`); `env_kind="fleet"` keeps the single-turn `FleetRolloutEnv` (the bandit smoke
tests use it: a one-press task has no user to talk to).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from envforge.harness.llm import LLMConfig
from envforge.harness.tasks import load_env_tasks
from envforge.server import Fleet, load_env
from envforge.synth.pipeline import load_tasks

from .backends import GenerationBackend, HFBackend, VLLMBackend, load_tokenizer
from .harness_env import HarnessRolloutEnv
from .learner import Learner, LearnerConfig
from .loop import StepMetrics, TrainConfig, collect, train
from .plots import write_plots
from .rollout import FleetRolloutEnv, RolloutConfig, RolloutEnv
from .trajectory import Trajectory


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
    user: str = "scripted"
    user_api_base: str | None = None
    judge: str | None = None


def build_envs(
    fleet: Fleet,
    dirs: Sequence[Path],
    use_mcp: bool,
    *,
    env_kind: Literal["harness", "fleet"] = "fleet",
    user: str = "scripted",
    user_api_base: str | None = None,
    judge: str | None = None,
) -> list[RolloutEnv]:
    envs: list[RolloutEnv] = []
    for d in dirs:
        tasks_file = Path(d) / "tasks.jsonl"
        if not tasks_file.exists():
            raise FileNotFoundError(f"{tasks_file} is missing: synthesize tasks first (envforge synth tasks)")
        if env_kind == "harness":
            user_llm = None if user == "scripted" else LLMConfig(model=user, api_base=user_api_base)
            envs.append(
                HarnessRolloutEnv(
                    fleet,
                    load_env_tasks(d),
                    user=user,
                    user_llm=user_llm,
                    judge=LLMConfig(model=judge) if judge else None,
                    use_mcp=use_mcp,
                )
            )
        else:
            name = load_env(d).name
            envs.append(FleetRolloutEnv(fleet, name, load_tasks(Path(d)), use_mcp=use_mcp))
    return envs


def _build(fleet: Fleet, opts: RunOptions) -> list[RolloutEnv]:
    return build_envs(
        fleet,
        opts.envs,
        opts.use_mcp,
        env_kind=opts.env_kind,
        user=opts.user,
        user_api_base=opts.user_api_base,
        judge=opts.judge,
    )


def write_user_errors(envs: Sequence[RolloutEnv], path: Path) -> int:
    """`path` gets one JSON line per masked harness episode (env, task, reason, user messages)."""
    rows = [v for e in envs if isinstance(e, HarnessRolloutEnv) for v in e.verdicts if v.user_error]
    path.write_text("".join(json.dumps(asdict(v)) + "\n" for v in rows))
    return len(rows)


def _load(opts: RunOptions) -> tuple[Any, Any, GenerationBackend]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(opts.seed)
    tok = load_tokenizer(opts.model)
    model = AutoModelForCausalLM.from_pretrained(str(opts.model)).to(opts.device)
    eos = tok.eos_token_id
    backend: GenerationBackend
    if opts.backend == "hf":
        backend = HFBackend(model, eos_id=eos, temperature=opts.temperature, seed=opts.seed)
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


async def run_training(
    opts: RunOptions,
    config: TrainConfig,
    learner_config: LearnerConfig,
    *,
    progress: Callable[[StepMetrics], Any] | None = None,
) -> list[StepMetrics]:
    opts.out.mkdir(parents=True, exist_ok=True)
    fleet = Fleet([load_env(d) for d in opts.envs])
    envs = _build(fleet, opts)
    tok, model, backend = _load(opts)
    learner = Learner(
        model,
        learner_config.model_copy(update={"temperature": opts.temperature}),
        pad_id=tok.pad_token_id or 0,
    )
    metrics_path = opts.out / "metrics.jsonl"
    metrics_path.write_text("")
    traj_path = opts.out / "trajectories.jsonl"
    if opts.save_trajectories:
        traj_path.write_text("")

    def on_step(m: StepMetrics, trajs: list[Trajectory]) -> None:
        with metrics_path.open("a") as f:
            f.write(m.model_dump_json() + "\n")
        if opts.save_trajectories:
            with traj_path.open("a") as f:
                f.writelines(t.model_dump_json() + "\n" for t in trajs)
        last = m.step + 1 == config.steps
        if last or (opts.checkpoint_every and (m.step + 1) % opts.checkpoint_every == 0):
            ckpt = opts.out / "checkpoints" / f"step_{m.step + 1}"
            model.save_pretrained(ckpt)
            tok.save_pretrained(ckpt)
        if progress is not None:
            progress(m)

    try:
        metrics = await train(envs, backend, learner, tok, config, on_step=on_step)
    finally:
        await backend.aclose()
        await fleet.aclose()
    write_user_errors(envs, opts.out / "user_errors.jsonl")
    write_plots(metrics_path, opts.out / "plots")
    (opts.out / "run.json").write_text(
        json.dumps(
            {
                "options": opts.model_dump(mode="json"),
                "train": config.model_dump(),
                "learner": learner_config.model_dump(),
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
    progress: Callable[[list[Trajectory]], Any] | None = None,
) -> Path:
    opts.out.mkdir(parents=True, exist_ok=True)
    fleet = Fleet([load_env(d) for d in opts.envs])
    envs = _build(fleet, opts)
    tok, _, backend = _load(opts)
    path = opts.out / "trajectories.jsonl"
    path.write_text("")

    def on_group(trajs: list[Trajectory]) -> None:
        with path.open("a") as f:
            f.writelines(t.model_dump_json() + "\n" for t in trajs)
        if progress is not None:
            progress(trajs)

    try:
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
        )
    finally:
        await backend.aclose()
        await fleet.aclose()
    write_user_errors(envs, opts.out / "user_errors.jsonl")
    return path
