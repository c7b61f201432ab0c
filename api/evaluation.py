"""An evaluation from Python: an agent on a set of tasks, its trials and its pass^k.

`run_eval` (the harness) is the engine and writes a run directory; this adds what a script
wants around it: a synchronous entry point, a temporary run directory when the caller keeps
none, and the summary `envforge eval --json` prints, computed from the same records.

It also settles what a run needs before its first trial. `EvalConfig` names its roles (the
agent, the simulated user, the judge) as a built-in, a packaged local model or a litellm model
string; a model role also needs its `LLMConfig` (API base, temperature, transport). These are the
rules `envforge eval` applies to its flags, kept here so that a script building an `EvalConfig`
from its own settings gets the same checks and errors, at the same time: before any trial, not
as an infrastructure failure in each of them.
"""

from __future__ import annotations

import difflib
import gc
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import anyio

from envforge.harness import (
    BUILTIN_AGENTS,
    Agent,
    EvalConfig,
    Fault,
    LLMConfig,
    LocalModelError,
    LocalServer,
    RunManifest,
    TrialRecord,
    User,
    UserName,
    is_local_spec,
    model_for_spec,
    routable_model,
    run_eval,
    running_local_server,
    summarize,
)
from envforge.synth import Task

Role = Literal["agent", "user", "judge"]
"""A role an evaluation gives a model: the agent under test, the simulated user, the judge."""

LLMTransport = Literal["auto", "http", "litellm"]
"""How a model is called (`LLMConfig.transport`): `auto` calls an OpenAI-compatible server given an
API base directly over HTTP and every other model through litellm."""


def llm_config(
    model: str,
    api_base: str | None = None,
    temperature: float | None = None,
    transport: LLMTransport = "auto",
) -> LLMConfig:
    """How to reach `model`; raises `ValueError` now for a forced `http` transport that cannot apply
    (a model that is not OpenAI-compatible, or one without an API base), instead of mid-run."""
    config = LLMConfig(model=model, api_base=api_base, temperature=temperature, transport=transport)
    config.uses_http()
    return config


def check_agent_name(agent: str) -> None:
    """Raise `ValueError` for an agent that is neither a built-in, a packaged local model nor a model
    string litellm can route: a typo like `oracl` would otherwise make every trial an infra failure."""
    if is_local_spec(agent):
        try:
            model_for_spec(agent)
        except LocalModelError as exc:
            raise ValueError(str(exc)) from exc
        return
    if agent in BUILTIN_AGENTS or "/" in agent or routable_model(agent):
        return
    close = difflib.get_close_matches(agent, BUILTIN_AGENTS, n=1)
    hint = f" (did you mean {str(close[0])!r}?)" if close else ""  # a StrEnum member: its value
    raise ValueError(
        f"unknown agent {agent!r}{hint}: not a built-in ({', '.join(BUILTIN_AGENTS)}) "
        "and not a model string (use provider/model, e.g. openai/gpt-4o)"
    )


def model_roles(config: EvalConfig) -> dict[Role, str]:
    """The roles `config` gives a model (not a built-in agent, not the scripted user), by role."""
    roles: dict[Role, str] = {}
    if config.agent not in BUILTIN_AGENTS:
        roles["agent"] = config.agent
    if config.user != UserName.SCRIPTED:
        roles["user"] = config.user
    if config.judge:
        roles["judge"] = config.judge
    return roles


def with_models(
    config: EvalConfig,
    *,
    api_bases: Mapping[Role, str | None] | None = None,
    temperatures: Mapping[Role, float | None] | None = None,
    transport: LLMTransport = "auto",
    local: Mapping[Role, LLMConfig] | None = None,
) -> EvalConfig:
    """`config` with an `LLMConfig` for each role it gives a model (`model_roles`).

    A role in `local` is reached through its running local server (`local_model_servers`);
    any other from its model string, its API base and its temperature. Raises `ValueError` as
    `llm_config` does."""
    api_bases = api_bases or {}
    temperatures = temperatures or {}
    local = local or {}
    llms: dict[Role, LLMConfig] = {}
    for role, model in model_roles(config).items():
        llms[role] = local.get(role) or llm_config(
            model, api_bases.get(role), temperatures.get(role), transport
        )
    return config.model_copy(
        update={"agent_llm": llms.get("agent"), "user_llm": llms.get("user"), "judge_llm": llms.get("judge")}
    )


R = TypeVar("R", bound=str)


class LocalServerWatch(Protocol):
    """What `local_model_servers` reports about one server while it starts: assembling and
    hash-checking the weights (`progress`, in bytes), each step (`notice`), and the server once it
    answers (`ready`)."""

    def progress(self, done: int, total: int) -> None: ...

    def notice(self, message: str) -> None: ...

    def ready(self, server: LocalServer) -> None: ...


@contextmanager
def local_model_servers(
    specs: Mapping[R, str | None],
    temperatures: Mapping[R, float | None] | None = None,
    *,
    shared: bool = False,
    watch: Callable[[Sequence[R], str], LocalServerWatch] | None = None,
) -> Iterator[dict[R, LLMConfig]]:
    """role -> how to reach its server, for every role whose spec names a packaged local model
    (`local`, `local/NAME`): pass it to `with_models(local=...)`. The servers stop when the block
    ends, normally, on an error or on Ctrl-C.

    Each role gets its own server by default, so the agent's long policy-and-tools prefix stays in
    its server's prompt cache; `shared=True` starts one server per model for the roles naming it
    (less loading and memory, but the roles evict each other's cached prefix). `watch(roles,
    spec)` is called as each server starts and reports on it. Raises `LocalModelError` (an unknown
    model, missing packages, weights that do not match) or `LocalServerError` (the runtime)."""
    temperatures = temperatures or {}
    wanted = {role: spec for role, spec in specs.items() if spec is not None and is_local_spec(spec)}
    models = {role: model_for_spec(spec).name for role, spec in wanted.items()}  # all known before any starts
    groups: dict[str, list[R]] = {}  # server key -> the roles it serves
    for role in wanted:
        groups.setdefault(models[role] if shared else role, []).append(role)
    configs: dict[R, LLMConfig] = {}
    with ExitStack() as servers:
        for roles in groups.values():
            spec = wanted[roles[0]]
            seen = watch(roles, spec) if watch is not None else None
            server = servers.enter_context(
                running_local_server(
                    spec,
                    on_progress=seen.progress if seen is not None else None,
                    on_notice=seen.notice if seen is not None else None,
                )
            )
            for role in roles:
                configs[role] = server.llm_config(temperatures.get(role))
            if seen is not None:
                seen.ready(server)
        yield configs


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze every object alive now out of the collector's walks for the block, and undo it on the
    way out.

    After a long evaluation the process holds every record and env of the run; what is left to
    do (summarize, write the report, print) makes little garbage, yet each older-generation
    collection would walk that whole heap again (~1 ms a trial at 2,048 trials). Thawed on the
    way out, so a caller that runs several evaluations in one process leaks nothing. A process that
    froze objects itself keeps its own arrangement (the block then changes nothing)."""
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


@dataclass(frozen=True)
class Evaluation:
    """A finished run: its manifest, the latest record of each trial, and their summary."""

    manifest: RunManifest
    records: list[TrialRecord]
    summary: dict[str, Any]
    """`{"overall": part, "envs": {env: part}}`, as `envforge eval --json` prints it."""
    run_dir: Path | None
    """Where the run was written (`report`, `rescore` and `--resume` read it); None when temporary."""

    @property
    def infra_failures(self) -> list[TrialRecord]:
        """The trials that failed for infrastructure reasons (a model or server unreachable): no
        measure of the agent, and what `resume=True` runs again."""
        return [r for r in self.records if r.fault == Fault.INFRA]

    def pass_hat_k(self, k: int = 1, env: str | None = None) -> float | None:
        """pass^k over all envs, or over one: the chance that k trials of a task all succeed
        (None when no task has k trials that count, e.g. all were infrastructure failures)."""
        if env is not None and env not in self.summary["envs"]:
            raise ValueError(f"no env {env!r} in this run (it has {', '.join(sorted(self.summary['envs']))})")
        values: list[float | None] = (self.summary["overall"] if env is None else self.summary["envs"][env])[
            "pass_hat_k"
        ]
        if not 1 <= k <= len(values):
            raise ValueError(f"k must be between 1 and the run's trials per task ({len(values)}), got {k}")
        return values[k - 1]


async def evaluate_async(
    env_dirs: Sequence[str | Path],
    config: EvalConfig | str,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    make_agent: Callable[[Task, int], Agent] | None = None,
    make_user: Callable[[Task], User] | None = None,
    on_record: Callable[[TrialRecord], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
) -> Evaluation:
    """Evaluate an agent on the tasks of `env_dirs` (each an env folder with `tasks.jsonl`).

    `config` is an `EvalConfig` (agent, user, trials, task selection, limits: what the CLI's
    flags set), or just the agent's name with every default. `out` keeps the run directory;
    without it the run goes to a temporary one, removed on return. `make_agent(task, seed)`
    plays your own Python `Agent` instead of the configured one.

    Progress hooks: `on_start(total, done)` once the trials are known (`done`: those a resumed
    run already has), `on_record(record)` as each trial lands, `on_notice(message)` for what the
    run reports in one line (unreadable lines of `trials.jsonl`, to be run again).
    """
    cfg = config if isinstance(config, EvalConfig) else EvalConfig(agent=config)
    if resume and out is None:
        raise ValueError("resume needs the run directory to resume: pass out=")

    async def run(run_dir: str | Path) -> tuple[RunManifest, list[TrialRecord]]:
        return await run_eval(
            env_dirs,
            cfg,
            run_dir,
            resume=resume,
            on_start=on_start,
            on_record=on_record,
            on_notice=on_notice,
            make_agent=make_agent,
            make_user=make_user,
        )

    if out is not None:
        manifest, records = await run(out)
        with frozen_heap():
            return Evaluation(manifest, records, summarize(records, manifest.trials), Path(out))
    with tempfile.TemporaryDirectory(prefix="envforge-eval-") as tmp:
        manifest, records = await run(Path(tmp) / "run")
    with frozen_heap():
        return Evaluation(manifest, records, summarize(records, manifest.trials), None)


def evaluate(
    env_dirs: Sequence[str | Path],
    config: EvalConfig | str,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    make_agent: Callable[[Task, int], Agent] | None = None,
    make_user: Callable[[Task], User] | None = None,
    on_record: Callable[[TrialRecord], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
) -> Evaluation:
    """`evaluate_async` from synchronous code."""
    return anyio.run(
        lambda: evaluate_async(
            env_dirs,
            config,
            out=out,
            resume=resume,
            make_agent=make_agent,
            make_user=make_user,
            on_record=on_record,
            on_start=on_start,
            on_notice=on_notice,
        )
    )
