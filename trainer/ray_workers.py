"""Rollout workers as Ray actors: collection scaled out to other processes or machines.

Optional (`pip install envforge[ray]`): ray is imported inside functions only, so the trainer works
without it. Each actor builds its own envs (an in-process fleet from the env dirs, or a remote fleet
at a URL) and its own generation backend from a `WorkerSpec`, and plays whole task groups
(`rollout_group`) for jobs the driver takes from the loop's job stream. `RayWorkers` is a
`GroupSource`, so `train()` and `collect()` use actors exactly as they use local collectors: same
jobs, same group indices, same consumer.

Weight sync after each update (`RayWorkers.sync_weights`, awaited before the loop goes on):

- hf workers: the driver `ray.put`s the new state dict once and every actor loads that one object;
  its backend's `version` becomes the learner's. A generation in flight finishes on the old weights
  under the backend's lock and is labelled with the old version, so `Trajectory.policy_version` stays
  the oldest version that generated any of its tokens.
- vllm workers: the driver's own `VLLMBackend` pushes the weights to the server as it does without
  Ray, then the actors learn the new version number. In between, a token may be labelled one version
  older than the weights that made it, never newer, so the staleness bound is never exceeded.

Ray object refs are asyncio awaitables, so this source runs on anyio's asyncio backend (its default).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from envforge.harness import UserName

from .backends import GenerationBackend
from .harness_env import EpisodeVerdict, HarnessRolloutEnv
from .loop import Group, Jobs, make_group
from .remote_fleet import EpisodeFleet
from .rollout import RolloutConfig, RolloutEnv, rollout_group

# Environment variables an actor gets from the driver (a remote cluster does not inherit them).
FORWARDED_ENV = ("LITELLM_LOCAL_MODEL_COST_MAP",)


class BackendSpec(BaseModel):
    """How an actor samples: its own transformers model (`hf`) or a shared vLLM server (`vllm`)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["hf", "vllm"] = "hf"
    model: str = Field(description="HF model dir (tokenizer; weights for hf), as seen on the worker")
    device: str = "cpu"
    temperature: float = 1.0
    seed: int = Field(0, description="actor i samples with seed + i, so actors do not repeat each other")
    vllm_url: str | None = None
    vllm_model: str | None = None
    torch_threads: int = Field(1, description="per actor, so actors sharing a machine do not oversubscribe")
    precision: Literal["float32", "bfloat16"] = Field(
        "float32", description="what an hf actor samples in (`--precision`): bf16 reads half the bytes"
    )
    max_batch: int = Field(
        16, ge=1, description="most sequences an hf actor decodes together (`--max-batch`)"
    )


class EnvSpec(BaseModel):
    """Which envs an actor plays and how (the fields `envs.build_envs` takes)."""

    model_config = ConfigDict(extra="forbid")

    envs: list[str] = Field(description="env dirs with tasks.jsonl, as seen on the worker")
    env_kind: Literal["harness", "fleet"] = "harness"
    use_mcp: bool = True
    user: str = UserName.SCRIPTED
    user_api_base: str | None = None
    judge: str | None = None
    fleet_url: str | None = Field(None, description="an `envforge serve` URL; None: in-process fleet")
    fleet_token: SecretStr | None = Field(None, description="that server's control-plane bearer token")


class RunLike(Protocol):
    """What `WorkerSpec.from_options` reads of a `run.RunOptions` (which imports this module)."""

    backend: Literal["hf", "vllm"]
    model: Path
    device: str
    temperature: float
    seed: int
    vllm_url: str | None
    vllm_model: str | None
    precision: Literal["float32", "bfloat16"]
    max_batch: int
    envs: list[Path]
    env_kind: Literal["harness", "fleet"]
    use_mcp: bool
    user: str
    user_api_base: str | None
    judge: str | None
    fleet_url: str | None
    fleet_token: SecretStr | None


class WorkerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: BackendSpec
    env: EnvSpec

    @classmethod
    def from_options(cls, opts: RunLike) -> WorkerSpec:
        """The spec that makes actors play what a local `run.RunOptions` run would play."""
        return cls(
            backend=BackendSpec(
                kind=opts.backend,
                model=str(opts.model),
                device=opts.device,
                temperature=opts.temperature,
                seed=opts.seed,
                vllm_url=opts.vllm_url,
                vllm_model=opts.vllm_model,
                precision=opts.precision,
                max_batch=opts.max_batch,
            ),
            env=EnvSpec(
                envs=[str(d) for d in opts.envs],
                env_kind=opts.env_kind,
                use_mcp=opts.use_mcp,
                user=opts.user,
                user_api_base=opts.user_api_base,
                judge=opts.judge,
                fleet_url=opts.fleet_url,
                fleet_token=opts.fleet_token,
            ),
        )


def state_checksum(state_dict: Mapping[str, Any]) -> str:
    """sha256 over names, dtypes and raw bytes of every tensor: equal iff two models hold the same weights."""
    import torch

    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}:{t.dtype}:".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class WorkerInfo(TypedDict):
    """One actor's report (`RayWorkers.info`): what a test or a run log compares across actors."""

    index: int
    version: int
    checksum: str | None
    """`state_checksum` of an hf actor's weights; None for vllm."""
    groups: int
    dtype: str | None
    """What an hf actor samples in (`float32`, `bfloat16`); None for vllm."""


class RolloutWorker:
    """An actor's body (wrapped by `ray.remote` in `RayWorkers.start`): own envs, backend, tokenizer."""

    def __init__(self, spec: dict[str, Any], index: int) -> None:
        self.spec = WorkerSpec.model_validate(spec)
        self.index = index
        self.groups_played = 0
        self.envs: dict[str, RolloutEnv] = {}
        self.fleet: EpisodeFleet | None = None
        self._backend: GenerationBackend | None = None
        self.tokenizer: Any = None

    @property
    def backend(self) -> GenerationBackend:
        if self._backend is None:
            raise RuntimeError("the worker has no backend before setup()")
        return self._backend

    async def setup(self) -> dict[str, list[str]]:
        """Build everything in the actor's event loop; returns {env name: task ids} for the driver."""
        import torch

        from envforge.server import Fleet, load_env

        from .backends import HFBackend, VLLMBackend, load_tokenizer
        from .envs import build_envs
        from .remote_fleet import RemoteFleet

        b, e = self.spec.backend, self.spec.env
        torch.set_num_threads(b.torch_threads)
        dirs = [Path(d) for d in e.envs]
        loaded = [load_env(d) for d in dirs]
        token = None if e.fleet_token is None else e.fleet_token.get_secret_value()
        fleet: EpisodeFleet = RemoteFleet(e.fleet_url, loaded, token=token) if e.fleet_url else Fleet(loaded)
        self.fleet = fleet
        envs = build_envs(
            fleet,
            dirs,
            e.use_mcp,
            env_kind=e.env_kind,
            user=e.user,
            user_api_base=e.user_api_base,
            judge=e.judge,
        )
        self.envs = {env.name: env for env in envs}
        self.tokenizer = load_tokenizer(b.model)
        eos = self.tokenizer.eos_token_id
        if b.kind == "hf":
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(b.model).to(b.device)
            self._backend = HFBackend(
                model,
                eos_id=eos,
                temperature=b.temperature,
                seed=b.seed + self.index,
                copy_model=False,
                precision=b.precision,
                max_batch=b.max_batch,
            )
        else:
            if not b.vllm_url:
                raise ValueError("a vllm worker needs vllm_url")
            self._backend = VLLMBackend(
                b.vllm_url,
                model=b.vllm_model or b.model,
                eos_id=eos,
                temperature=b.temperature,
                sync_hook=None,
            )
        return {name: env.task_ids() for name, env in self.envs.items()}

    async def run_group(
        self, env: str, task_id: str, index: int, n: int, rollout: dict[str, Any]
    ) -> dict[str, Any]:
        started = time.time()
        trajs = await rollout_group(
            self.envs[env],
            task_id,
            self.backend,
            self.tokenizer,
            RolloutConfig.model_validate(rollout),
            n,
            group=index,
        )
        self.groups_played += 1
        return make_group(env, task_id, index, trajs, started).model_dump()

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> int:
        await self.backend.sync_weights(state_dict, version)
        return int(self.backend.version)

    async def set_version(self, version: int) -> int:
        """vllm workers: the server already has the weights (the driver pushed them)."""
        await self.backend.sync_weights({}, version)
        return int(self.backend.version)

    async def info(self) -> WorkerInfo:
        model = getattr(self.backend, "model", None)
        return {
            "index": self.index,
            "version": int(self.backend.version),
            "checksum": state_checksum(model.state_dict())
            if model is not None and hasattr(model, "state_dict")
            else None,
            "groups": self.groups_played,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch.")
            if model is not None and hasattr(model, "parameters")
            else None,
        }

    async def verdicts(self) -> list[EpisodeVerdict]:
        """The harness's per-episode verdicts (for the driver's `user_errors.jsonl`)."""
        return [v for env in self.envs.values() if isinstance(env, HarnessRolloutEnv) for v in env.verdicts]

    async def close(self) -> None:
        from envforge.harness import aclose_http_sessions

        await aclose_http_sessions()  # an LLM user's pooled connections
        if self._backend is not None:
            await self._backend.aclose()
        if self.fleet is not None:
            await self.fleet.aclose()


def init_ray(address: str | None = None, *, num_cpus: int | None = None) -> bool:
    """Connect to the cluster at `address`, or start a local instance; True if this call started it."""
    import logging

    try:
        import ray
    except ImportError as exc:
        raise ImportError("Ray workers need the ray extra: pip install 'envforge[ray]'") from exc

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING)
    return True


class RayWorkers:
    """`n` rollout actors as a `GroupSource`; make one with `await RayWorkers.start(spec, n)`.

    Each actor has `groups_per_worker` groups in flight; `driver_backend` (vllm workers only) is the
    driver's `VLLMBackend`, which pushes new weights to the server.
    """

    def __init__(
        self,
        actors: list[Any],
        spec: WorkerSpec,
        tasks: dict[str, list[str]],
        *,
        driver_backend: GenerationBackend | None = None,
        groups_per_worker: int = 1,
    ) -> None:
        self.actors = actors
        self.spec = spec
        self.tasks = tasks
        self.driver_backend = driver_backend
        self.groups_per_worker = groups_per_worker
        self.version = 0

    @classmethod
    async def start(
        cls,
        spec: WorkerSpec,
        n: int,
        *,
        driver_backend: GenerationBackend | None = None,
        groups_per_worker: int = 1,
        cpus_per_worker: float = 1.0,
        start_timeout_s: float | None = 600.0,
    ) -> RayWorkers:
        """Start the actors and wait until each has built its envs and backend (needs `init_ray`).

        Ray keeps an actor pending while no node has `cpus_per_worker` free CPUs; `start_timeout_s`
        turns that silent wait into an error.
        """
        import ray

        if n < 1:
            raise ValueError("need at least one Ray worker")
        if spec.backend.kind == "vllm" and driver_backend is None:
            raise ValueError("vllm workers need the driver's VLLMBackend to push weights to the server")
        env_vars = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        options: dict[str, Any] = {"num_cpus": cpus_per_worker}
        if env_vars:
            options["runtime_env"] = {"env_vars": env_vars}
        remote = ray.remote(RolloutWorker).options(**options)
        actors = [remote.remote(spec.model_dump(mode="json"), i) for i in range(n)]
        try:
            with anyio.fail_after(start_timeout_s):
                found = await asyncio.gather(*(a.setup.remote() for a in actors))
        except TimeoutError:
            for a in actors:
                ray.kill(a)
            raise TimeoutError(
                f"{n} Ray workers were not ready after {start_timeout_s}s: does the cluster have "
                f"{n * cpus_per_worker:g} free CPUs? ({ray.available_resources().get('CPU', 0):g} now)"
            ) from None
        except BaseException:
            for a in actors:
                ray.kill(a)
            raise
        if any(f != found[0] for f in found):
            for a in actors:
                ray.kill(a)
            raise RuntimeError(f"Ray workers loaded different envs/tasks: {found}")
        return cls(actors, spec, found[0], driver_backend=driver_backend, groups_per_worker=groups_per_worker)

    async def produce(
        self,
        jobs: Jobs,
        rollouts_per_task: int,
        rollout: RolloutConfig,
        send: MemoryObjectSendStream[Group],
    ) -> None:
        """Keep every actor busy with jobs from the shared iterator; cancelling also cancels the actors'."""
        import ray

        config = rollout.model_dump()

        async def drive(actor: Any, out: MemoryObjectSendStream[Group]) -> None:
            async with out:
                async for env, task_id, index in jobs:
                    if env.name not in self.tasks or task_id not in self.tasks[env.name]:
                        raise KeyError(f"Ray workers have no task {env.name}/{task_id}")
                    ref = actor.run_group.remote(env.name, task_id, index, rollouts_per_task, config)
                    try:
                        data = await ref
                    except anyio.get_cancelled_exc_class():
                        ray.cancel(ref)
                        raise
                    await out.send(Group.model_validate(data))

        async with send, anyio.create_task_group() as tg:
            for actor in self.actors:
                for _ in range(self.groups_per_worker):
                    tg.start_soon(drive, actor, send.clone())

    async def sync_weights(self, state_dict: Mapping[str, Any], version: int, model: Any = None) -> None:
        import ray

        if self.spec.backend.kind == "hf":
            ref = ray.put(dict(state_dict))
            await asyncio.gather(*(a.load_weights.remote(ref, version) for a in self.actors))
        else:
            assert self.driver_backend is not None
            await self.driver_backend.sync_weights(state_dict, version, model)
            await asyncio.gather(*(a.set_version.remote(version) for a in self.actors))
        self.version = version

    async def info(self) -> list[WorkerInfo]:
        """Per actor: its index, backend version, weights checksum (hf) and groups played."""
        return list(await asyncio.gather(*(a.info.remote() for a in self.actors)))

    async def verdicts(self) -> list[EpisodeVerdict]:
        rows = await asyncio.gather(*(a.verdicts.remote() for a in self.actors))
        return [v for r in rows for v in r]

    async def aclose(self) -> None:
        import ray

        try:
            with anyio.move_on_after(30):
                await asyncio.gather(*(a.close.remote() for a in self.actors), return_exceptions=True)
        finally:
            for a in self.actors:
                ray.kill(a)
