"""Running an evaluation: every (task, trial) on its own episode and MCP session, concurrently.

A trial: create an episode at the task's initial state → open an MCP session bound to it → the
user opens → agent steps (tool calls executed through MCP) alternate with user replies until a
control token, a limit, or the wall-clock timeout → export the final state → score → append one
`TrialRecord` to the run directory. The fleet is in-process by default; with `server` it is a
running `envforge serve` reached through its control plane and per-episode MCP URLs. In a
dual-control env the user also acts on its own side of the episode through a `UserToolbox`
(`user_tools.py`): its calls run on the user's side, are recorded in the trial's messages, and are
hidden from the agent.

Every ending is charged to one side (`records.Fault`). The agent's: its context overflowing, an
answer that is not a usable message, calls to tools that do not exist or with arguments that are
not a JSON object (each answered with a tool error it can recover from, and counted against
`max_tool_errors`), the step/turn/error limits, and the wall-clock limit running out while the
agent itself was working. The infrastructure's: model calls that still fail after retries, a
model server still not answering when the wall-clock limit runs out, and a fleet that errors or
disappears (`infra_failure`: excluded from pass^k and re-run by `resume`). The env's: a trial
that did not succeed after a tool answered with an internal env error (`env_failure`). A
conversation that goes nowhere (both sides only thanking, closing, refusing or repeating
themselves, no tool called, for three exchanges) is ended and charged to neither side: it is
scored on its end state as if the user had stopped (`idle_loop`; the reasons in
`harness/idle_loop.py`).

A run directory is held under `RunDir.lock()` for the whole run, and `resume` needs the run's
manifest to match (see `runs.MANIFEST_IGNORED`), so two processes never write one run and a run
never adopts records another agent wrote.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Container, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, cast

import anyio
import httpx
from pydantic import BaseModel, ConfigDict, Field

from envforge.server import (
    EnvClients,
    EpisodeClient,
    Fleet,
    State,
    episode_client,
    http_episode_client,
    state_hash,
)
from envforge.synth import AnswersMode, Task, with_answers

from .agents import BUILTIN_AGENTS, Agent, as_reply, build_agent, openai_tools
from .eval_procs import fold_shards, run_in_processes
from .idle_loop import IdleLoop
from .llm import (
    ContextOverflow,
    InfraError,
    LLMConfig,
    MalformedOutput,
    add_usage,
    http_sessions,
    model_waits,
)
from .records import (
    FAULT_OF_STATUS,
    Message,
    RunManifest,
    ToolCall,
    TrialRecord,
    Usage,
    harness_call_id,
    recordable,
)
from .runs import RunConfigMismatch, RunDir, check_resumable, dump_diff, records_for, score_trial, trial_key
from .tasks import EnvTasks, TaskSelectionError, load_env_tasks, select_tasks
from .user_errors import detect_user_error
from .user_tools import FleetUserCaller, SoloClient, UserCaller, UserToolbox, agent_view, user_tool_specs
from .users import User, UserReply, bind_toolbox, build_user, request_text
from .vocab import ControlToken, Termination, TrialStatus, UserName


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(30, description="user/agent exchanges")
    max_steps: int = Field(30, description="agent messages (tool-call rounds) within one exchange")
    max_tool_errors: int = Field(10, description="failed tool calls tolerated in one trial")
    trial_timeout_s: float = 600.0


class EvalConfig(BaseModel):
    """Everything that decides what a run measures (the manifest is derived from it)."""

    model_config = ConfigDict(extra="forbid")

    agent: str
    user: str = UserName.SCRIPTED
    agent_llm: LLMConfig | None = None
    user_llm: LLMConfig | None = None
    judge_llm: LLMConfig | None = None
    judge: str | None = None
    """The judge as the command named it (`local/NAME` for a packaged model whose server's route is
    `openai/NAME`), for the manifest; default: the judge's model."""
    trials: int = 1
    concurrency: int = 4
    procs: int = Field(
        1,
        ge=1,
        description="processes the trials are spread over (`eval_procs`); `concurrency` is the total "
        "in flight, shared among them",
    )
    seed: int = 0
    limits: Limits = Field(default_factory=Limits)
    server: str | None = None
    server_token: str | None = None
    task_ids: list[str] | None = None
    split: str | None = Field(None, description="only the tasks of this split (τ²'s train or test)")
    limit: int | None = Field(
        None, ge=1, description="the first N tasks of each env (after task ids and split)"
    )
    answers: AnswersMode = "task"
    solo: bool = Field(
        False,
        description="τ²'s solo mode: the agent gets the user's tools beside its own and the task as "
        "its ticket; the user is a dummy (envs with user tools only)",
    )

    def agent_cfg(self) -> LLMConfig | None:
        if self.agent in BUILTIN_AGENTS:
            return None
        return self.agent_llm or LLMConfig(model=self.agent)

    def user_cfg(self) -> LLMConfig | None:
        if self.user == UserName.SCRIPTED:
            return None
        return self.user_llm or LLMConfig(model=self.user)


class SoloUser:
    """The user of τ²'s solo mode: a dummy that hands the agent the task (its ticket) and ends the
    conversation at the agent's first message to it; the agent acts on both sides alone."""

    def __init__(self, task: Task) -> None:
        self.ticket = request_text(task)

    async def start(self) -> UserReply:
        return UserReply(self.ticket)

    async def reply(self, messages: list[Message]) -> UserReply:
        return UserReply(f"Thank you. {ControlToken.STOP}")


# --------------------------------------------------------------------------- backends


class Backend(Protocol):
    async def create(self, env: str, state: State | None) -> str: ...
    def client(self, env: str, episode_id: str) -> AbstractAsyncContextManager[EpisodeClient]: ...
    async def export(self, episode_id: str) -> State: ...
    async def close(self, episode_id: str) -> None: ...


async def offered_tools(backend: Backend, env: str, client: EpisodeClient) -> list[dict[str, Any]]:
    """The tools a trial offers its agent, in OpenAI form: a fresh list of fresh objects per
    trial, so an agent that changes its own changes no other trial's."""
    if isinstance(backend, InProcessBackend):
        return await backend.offered_tools(env, client)
    return openai_tools(await client.list_tools())


@dataclass
class InProcessBackend:
    fleet: Fleet
    clients: EnvClients | None = None
    """Shared per-env MCP clients (`open_backend` opens them); without, a client per episode."""
    _tools_json: dict[str, str] = field(default_factory=dict)
    """Per env, its tools in OpenAI form as JSON (an in-process env server's tools never change)."""

    async def offered_tools(self, env: str, client: EpisodeClient) -> list[dict[str, Any]]:
        """`env`'s tools in OpenAI form, listed through `client` once and then decoded from their
        JSON per trial: about half the CPU of validating a listing into MCP `Tool` models and
        converting them (~30 of ~55 us), with no `Tool` models made only to be dropped. Listings
        are JSON, so decoding the JSON of the converted listing gives back equal objects of the
        same types in the same key order."""
        text = self._tools_json.get(env)
        if text is None:
            text = self._tools_json[env] = json.dumps(openai_tools(await client.list_tools()))
        tools: list[dict[str, Any]] = json.loads(text)
        return tools

    async def create(self, env: str, state: State | None) -> str:
        return (await self.fleet.create_episode(env, state=state)).id

    def user_client(self, env: str, episode_id: str) -> AbstractAsyncContextManager[UserCaller | None]:
        """The episode's user side (dual control): calls straight into the fleet, side "user"."""
        return nullcontext(FleetUserCaller(self.fleet.call, episode_id))

    def client(self, env: str, episode_id: str) -> AbstractAsyncContextManager[EpisodeClient]:
        if self.clients is not None:
            return self.clients.episode(env, episode_id)
        return episode_client(self.fleet, env, episode_id)

    async def export(self, episode_id: str) -> State:
        return await self.fleet.export_state(episode_id)

    async def close(self, episode_id: str) -> None:
        await self.fleet.close_episode(episode_id)


class HTTPBackend:
    """A fleet behind `envforge serve`: control plane for episodes, per-episode MCP URLs for agents."""

    def __init__(self, base_url: str, token: str | None = None) -> None:
        self.base = base_url.rstrip("/")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=self.base, headers=headers, timeout=60.0)
        self.paths: dict[str, str] = {}
        self.user_paths: dict[str, str] = {}

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise InfraError(f"env server {self.base}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise InfraError(
                f"env server {method} {path}: HTTP {response.status_code}: {response.text[:200]}"
            )
        return response.json()

    async def create(self, env: str, state: State | None) -> str:
        body: dict[str, Any] = {"env": env}
        if state is not None:
            body["state"] = state
        data = await self._request("POST", "/control/episodes", json=body)
        self.paths[data["episode_id"]] = data["mcp_path"]
        if isinstance(data.get("user_mcp_path"), str):
            self.user_paths[data["episode_id"]] = data["user_mcp_path"]
        return str(data["episode_id"])

    def client(self, env: str, episode_id: str) -> AbstractAsyncContextManager[EpisodeClient]:
        return http_episode_client(self.base + self.paths[episode_id], episode_id)

    def user_client(self, env: str, episode_id: str) -> AbstractAsyncContextManager[UserCaller | None]:
        """The episode's user endpoint (dual control), as the control plane gave it; None without."""
        path = self.user_paths.get(episode_id)
        return http_episode_client(self.base + path, episode_id) if path else nullcontext(None)

    async def export(self, episode_id: str) -> State:
        state: State = (await self._request("GET", f"/control/episodes/{episode_id}/state"))["state"]
        return state

    async def close(self, episode_id: str) -> None:
        self.paths.pop(episode_id, None)
        self.user_paths.pop(episode_id, None)
        await self._request("DELETE", f"/control/episodes/{episode_id}")

    async def aclose(self) -> None:
        await self.http.aclose()


# --------------------------------------------------------------------------- one trial


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _classify(exc: BaseException) -> tuple[TrialStatus, str]:
    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, ContextOverflow):
            return TrialStatus.CONTEXT_OVERFLOW, f"context window exceeded: {leaf}"
        if isinstance(leaf, MalformedOutput):
            return TrialStatus.MALFORMED_OUTPUT, f"unusable model output: {leaf}"
    leaf = next((e for e in leaves if isinstance(e, InfraError)), leaves[0])
    return TrialStatus.INFRA_FAILURE, f"{type(leaf).__name__}: {leaf}"


ENV_ERROR_META = "envforge/error"
"""The `_meta` key of a tool result the env reports as its own internal error (kind `env_error`)."""


def is_env_error(result: Any) -> bool:
    """Whether a tool result says the env itself failed (not the agent's call): its kind is
    `env_error` (the runtime's `ToolResult.kind`, carried over MCP in `_meta["envforge/error"]`)."""
    if getattr(result, "kind", None) == "env_error" or getattr(result, "env_error", False):
        return True
    meta = getattr(result, "meta", None)
    return isinstance(meta, dict) and meta.get(ENV_ERROR_META) == "env_error"


def _call_problem(call: Any, tool_names: set[str]) -> str | None:
    """Why a call must not reach the env (answered to the agent as a tool error), or None."""
    if call.name not in tool_names:
        return f"Error: unknown tool {call.name!r}; available tools: {', '.join(sorted(tool_names))}"
    if "__unparsed__" in call.arguments:
        raw = str(call.arguments["__unparsed__"])[:200]
        return f"Error: the arguments of {call.name} are not a JSON object: {raw}"
    return None


class Recorded(NamedTuple):
    """An agent's message as the trial records it, and per call why it cannot run (None: it can)."""

    message: Message
    unusable: list[str | None]


def as_recorded(message: Message, turn: int, first: int) -> Recorded:
    """The agent's message as the trial keeps it: its calls named by the harness (`first`, `first +
    1`, ...: `records.harness_call_id`), never by the ids the agent or its server chose, and its text
    and arguments writable (`records.recordable`). A call whose arguments had to change (invalid
    Unicode, binary content, nesting too deep to record) never reaches the env: the agent is
    answered with a tool error, its own fault, and the trial goes on and is written."""
    content = message.content
    if content is not None:
        content = recordable(content).value
    calls: list[ToolCall] = []
    unusable: list[str | None] = []
    for i, call in enumerate(message.tool_calls):
        arguments, problem = recordable(call.arguments)
        name = recordable(call.name).value
        calls.append(ToolCall(id=harness_call_id(first + i), name=name, arguments=arguments))
        unusable.append(
            None if problem is None else f"Error: the arguments of {name} are unusable: {problem}"
        )
    update = {"role": "assistant", "turn": turn, "content": content, "tool_calls": calls}
    return Recorded(message.model_copy(update=update), unusable)


def trial_seed(run_seed: int, key: str) -> int:
    return int(hashlib.sha256(f"{run_seed}:{key}".encode()).hexdigest()[:8], 16)


class Ending(NamedTuple):
    """How a conversation ended: the trial's status and, in detail, why."""

    status: TrialStatus
    termination: Termination


async def converse(
    agent: Agent,
    user: User,
    client: EpisodeClient,
    tools: list[dict[str, Any]],
    messages: list[Message],
    usage: dict[str, Usage],
    limits: Limits,
    env_errors: list[str] | None = None,
    toolbox: UserToolbox | None = None,
) -> Ending:
    """The conversation loop; fills `messages` and `usage`, returns how it ended.

    A call to a tool the env does not have, or with arguments that are not a JSON object or cannot
    be recorded (`as_recorded`), never reaches the env: the agent gets a tool error saying so.
    Calls carry the harness's ids, so results pair with calls whatever ids the agent sent. Tool
    results the env reports as its own internal errors are appended to `env_errors`. With a
    `toolbox` (dual control) the user's own calls land in `messages` as it makes them, and the
    agent is shown the conversation without them (`agent_view`).
    """
    tool_names = {t["function"]["name"] for t in tools}
    idle = IdleLoop()
    first = await user.start()
    add_usage(usage, "user", first.usage)
    messages.append(Message(role="user", content=first.text, turn=0))
    if first.stop or first.transfer:
        return Ending(TrialStatus.COMPLETED, Termination.USER_STOP if first.stop else Termination.TRANSFER)
    errors = made = 0
    for turn in range(1, limits.max_turns + 1):
        start = len(messages)
        for _ in range(limits.max_steps):
            shown = list(messages) if toolbox is None else agent_view(messages)
            reply = as_reply(await agent.respond(shown, tools, client))
            add_usage(usage, "agent", reply.usage)
            said, unusable = as_recorded(reply.message, turn, made)
            made += len(said.tool_calls)
            messages.append(said)
            if not said.tool_calls:
                break
            for call, bad in zip(said.tool_calls, unusable, strict=True):
                problem = _call_problem(call, tool_names) if bad is None else bad
                if problem is not None:
                    text, is_error = problem, True
                else:
                    result = await client.call_tool(call.name, call.arguments)
                    text, is_error = result.text, result.is_error
                    if env_errors is not None and is_env_error(result):
                        env_errors.append(f"{call.name}: {text[:200]}")
                messages.append(
                    Message(role="tool", content=text, tool_call_id=call.id, is_error=is_error, turn=turn)
                )
                errors += is_error
                if errors > limits.max_tool_errors:
                    return Ending(TrialStatus.MAX_ERRORS, Termination.MAX_TOOL_ERRORS)
        else:
            return Ending(TrialStatus.MAX_TURNS, Termination.MAX_STEPS)
        if said.content and ControlToken.STOP in said.content:
            return Ending(TrialStatus.COMPLETED, Termination.AGENT_STOP)
        if toolbox is not None:
            toolbox.turn = turn
        answer = await user.reply(list(messages))
        add_usage(usage, "user", answer.usage)
        messages.append(Message(role="user", content=answer.text, turn=turn))
        if answer.agent_silent:  # nudged and still nothing said: the agent's failure, not a user stop
            return Ending(TrialStatus.NO_RESPONSE, Termination.AGENT_EMPTY)
        if answer.stop:
            return Ending(TrialStatus.COMPLETED, Termination.USER_STOP)
        if answer.transfer:
            return Ending(TrialStatus.COMPLETED, Termination.TRANSFER)
        acted = any(m.role == "tool" for m in messages[start:])  # either side's calls
        if idle.see(said.content or "", acted, answer.text):
            # going nowhere: ended for the user, scored on the state as it stands (`idle_loop`)
            return Ending(TrialStatus.COMPLETED, Termination.IDLE_LOOP)
    return Ending(TrialStatus.MAX_TURNS, Termination.MAX_TURNS)


@dataclass
class TrialJob:
    et: EnvTasks
    task: Task
    trial: int

    @property
    def key(self) -> str:
        return trial_key(self.et.env.name, self.task.id, self.trial)


async def run_trial(
    job: TrialJob,
    backend: Backend,
    config: EvalConfig,
    run_id: str,
    *,
    make_agent: Callable[[Task, int], Agent] | None = None,
    make_user: Callable[[Task], User] | None = None,
) -> TrialRecord:
    """One trial end to end; never raises for the trial's own failures (they become its status)."""
    env, task = job.et.env, job.task
    seed = trial_seed(config.seed, job.key)
    agent = (make_agent or _default_agent(config, job.et))(task, seed)
    # the scripted user outlasts the run's own exchange limit: an agent that asks forever ends at
    # `max_turns` (its failure), never with a user stopping mid-question (a user error, masked)
    user: User
    if make_user:
        user = make_user(task)
    elif config.solo:
        user = SoloUser(task)
    else:
        user = build_user(config.user, task, llm=config.user_cfg(), max_turns=config.limits.max_turns + 1)
    started, t0 = time.time(), time.perf_counter()
    messages: list[Message] = []
    usage: dict[str, Usage] = {}
    status, error = TrialStatus.COMPLETED, None
    termination: Termination  # set by the conversation, or by the failure that ended it
    final: State | None = None
    episode_id: str | None = None
    env_errors: list[str] = []
    try:
        episode_id = await backend.create(env.name, job.et.initial_state(task) if task.setup else None)
        async with (
            backend.client(env.name, episode_id) as client,
            _user_client(backend, env.name, episode_id, user, config.solo) as user_caller,
        ):
            tools = await offered_tools(backend, env.name, client)
            toolbox = None
            if config.solo:  # the agent drives both sides: the user's tools join its own
                if user_caller is None:
                    raise InfraError(f"solo mode: no way to {env.name}'s user side for episode {episode_id}")
                solo_tools = user_tool_specs(env)
                tools = [*tools, *solo_tools]
                names = frozenset(t["function"]["name"] for t in solo_tools)
                client = cast(EpisodeClient, SoloClient(client, user_caller, names))
            elif user_caller is not None:
                toolbox = UserToolbox(user_tool_specs(env), user_caller, messages, env_errors)
                bind_toolbox(user, toolbox)
            with model_waits() as waits, anyio.move_on_after(config.limits.trial_timeout_s) as scope:
                status, termination = await converse(
                    agent, user, client, tools, messages, usage, config.limits, env_errors, toolbox
                )
            if scope.cancelled_caught and waits.interrupted:
                # The clock ran out while a model server was still answering: the server's delay,
                # not the agent's doing.
                status, termination = TrialStatus.INFRA_FAILURE, Termination.TIMEOUT
                limit = config.limits.trial_timeout_s
                error = f"model server did not answer within the trial timeout ({limit:g} s)"
            elif scope.cancelled_caught:
                status, termination = TrialStatus.TIMEOUT, Termination.TIMEOUT
        final = await backend.export(episode_id)
    except Exception as exc:
        status, error = _classify(exc)
        termination = Termination(status)
        if status in (TrialStatus.CONTEXT_OVERFLOW, TrialStatus.MALFORMED_OUTPUT) and episode_id is not None:
            try:
                final = await backend.export(episode_id)
            except Exception as export_exc:
                status, error = _classify(export_exc)
    finally:
        if episode_id is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                try:
                    await backend.close(episode_id)
                except Exception:
                    pass  # the episode expires on its own; a dead server has nothing to close
    record = TrialRecord(
        run_id=run_id,
        trial_key=job.key,
        env=env.name,
        task_id=task.id,
        trial=job.trial,
        seed=seed,
        status=status,
        termination=termination,
        error=error,
        env_errors=len(env_errors),
        messages=messages,
        usage=usage,
        difficulty=task.difficulty.model_dump(),
        started_at=started,
        duration_s=0.0,
        agent=config.agent,
        user=config.user,
    )
    if final is not None and status != TrialStatus.INFRA_FAILURE:
        try:
            ts = await score_trial(
                task,
                final,
                messages,
                status=status,
                judge=config.judge_llm,
                keys=job.et.pks,
                policy=job.et.policy_rules,
                env=env,
            )
            # `record.usage`, not `usage`: the record was validated from a copy of that dict.
            if ts.judge_usage:
                add_usage(record.usage, "judge", ts.judge_usage)
            user_error, reason, judge_usage = await detect_user_error(
                task, messages, config.judge_llm if ts.score.reward < 1.0 else None
            )
            if judge_usage:
                add_usage(record.usage, "judge", judge_usage)
        except InfraError as exc:
            record.status, record.error = TrialStatus.INFRA_FAILURE, f"judge: {exc}"
        else:
            record.final_state_hash = state_hash(final)
            record.final_diff = dump_diff(job.et.diff_from_initial(task, final))
            record.score, record.reward = ts.score, ts.score.reward
            record.parts, record.not_judged = ts.parts, ts.not_judged
            record.user_error, record.user_error_reason = user_error, reason
    if env_errors and record.status != TrialStatus.INFRA_FAILURE and record.reward < 1.0:
        record.status, record.error = TrialStatus.ENV_FAILURE, f"env error: {env_errors[0]}"
    record.fault = FAULT_OF_STATUS[TrialStatus(record.status)]
    record.duration_s = time.perf_counter() - t0
    return record


def _user_client(
    backend: Backend, env: str, episode_id: str, user: User, solo: bool = False
) -> AbstractAsyncContextManager[UserCaller | None]:
    """The way to the episode's user side in a dual-control env, where the backend and the user
    (or, `solo`, the agent) have one (a backend without `user_client`, an env without user tools,
    a user that calls no tools: None)."""
    opener = getattr(backend, "user_client", None)
    if opener is None or not (solo or hasattr(user, "toolbox")) or not _has_user_tools(backend, env):
        return nullcontext(None)
    caller: AbstractAsyncContextManager[UserCaller | None] = opener(env, episode_id)
    return caller


def _has_user_tools(backend: Backend, env: str) -> bool:
    if isinstance(backend, InProcessBackend):
        return bool(backend.fleet.env(env).tools_of("user"))
    return True  # over HTTP, the control plane says (`user_mcp_path`)


def _default_agent(config: EvalConfig, et: EnvTasks) -> Callable[[Task, int], Agent]:
    def make(task: Task, seed: int) -> Agent:
        return build_agent(
            config.agent,
            task,
            seed=seed,
            policy=et.env.policy,
            llm=config.agent_cfg(),
            rules=et.policy_rules,
            solo=config.solo,
        )

    return make


# --------------------------------------------------------------------------- a run


def build_manifest(config: EvalConfig, envs: Sequence[EnvTasks], run_id: str) -> RunManifest:
    agent_cfg, user_cfg = config.agent_cfg(), config.user_cfg()
    return RunManifest(
        run_id=run_id,
        created_at=time.time(),
        envs=[et.env.name for et in envs],
        env_dirs=[str(et.env_dir.resolve()) for et in envs],
        task_ids={et.env.name: [t.id for t in et.tasks] for et in envs},
        trials=config.trials,
        agent=config.agent,
        agent_api_base=agent_cfg.api_base if agent_cfg else None,
        user=config.user,
        user_api_base=user_cfg.api_base if user_cfg else None,
        agent_temperature=agent_cfg.temperature if agent_cfg else None,
        user_temperature=user_cfg.temperature if user_cfg else None,
        concurrency=config.concurrency,
        seed=config.seed,
        limits={k: float(v) for k, v in config.limits.model_dump().items()},
        judge=(config.judge or config.judge_llm.model) if config.judge_llm else None,
        answers=config.answers,
        solo=config.solo,
        versions={"envforge": _version(), "litellm": _version("litellm")},
    )


def _version(dist: str = "envforge") -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


class RunExists(FileExistsError):
    """The output directory already holds a run and `resume` was not asked for."""


@asynccontextmanager
async def open_backend(config: EvalConfig, envs: Sequence[EnvTasks]) -> AsyncIterator[Backend]:
    if config.server:
        http = HTTPBackend(config.server, config.server_token)
        try:
            yield http
        finally:
            await http.aclose()
        return
    fleet = Fleet([et.env for et in envs], max_episodes=max(64, config.concurrency * 4))
    try:
        async with EnvClients(fleet) as clients:
            yield InProcessBackend(fleet, clients)
    finally:
        await fleet.aclose()


async def run_eval(
    env_dirs: Sequence[str | Path],
    config: EvalConfig,
    out_dir: str | Path,
    *,
    resume: bool = False,
    on_start: Callable[[int, int], None] | None = None,
    on_record: Callable[[TrialRecord], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    make_agent: Callable[[Task, int], Agent] | None = None,
    make_user: Callable[[Task], User] | None = None,
) -> tuple[RunManifest, list[TrialRecord]]:
    """Run (or resume) an evaluation into `out_dir`; returns the manifest and the latest record per key.

    `on_start(total, already_done)` and `on_record(record)` drive progress displays; `on_notice`
    gets one-line notices (unreadable lines of trials.jsonl that will be run again);
    `make_agent` / `make_user` replace the configured agent or user (custom Python agents).
    The run directory is locked for the whole call (`RunLocked` if another process has it).
    """
    envs = selected_envs(env_dirs, config)
    rd = RunDir(out_dir)
    with rd.lock():
        manifest, jobs = _plan(rd, config, envs, resume, on_notice)
        total = sum(len(et.tasks) for et in envs) * config.trials
        if on_start:
            on_start(total, total - len(jobs))
        if config.procs > 1 and len(jobs) > 1:
            if make_agent is not None or make_user is not None:
                raise ValueError("custom Python agents and users run in one process: leave procs at 1")
            dirs = [str(et.env_dir) for et in envs]
            keys = [j.key for j in jobs]
            await run_in_processes(
                rd, config, config.procs, config.concurrency, dirs, manifest.run_id, keys, on_record
            )
            return manifest, records_for(manifest, rd.read_records())
        with quiet_collector(config.concurrency):
            await run_jobs(
                envs,
                jobs,
                config,
                manifest.run_id,
                rd.append,
                on_record,
                make_agent=make_agent,
                make_user=make_user,
            )
            # read back under the same arrangement: thousands of new records would otherwise
            # set off collections that walk the whole heap, unfrozen just then
            read = rd.read_records()
        return manifest, records_for(manifest, read)


def selected_envs(env_dirs: Sequence[str | Path], config: EvalConfig) -> list[EnvTasks]:
    """The envs of `env_dirs` with the tasks `config` selects (ids, split, limit, answer rule)."""
    envs = [load_env_tasks(d) for d in env_dirs]
    check_task_ids(config.task_ids, envs)
    if config.solo:
        single = [et.env.name for et in envs if not et.env.tools_of("user")]
        if single:
            raise TaskSelectionError(
                f"--solo: {', '.join(single)} has no user tools (τ²'s solo mode is for dual-control envs)"
            )
    for et in envs:
        et.tasks = select_tasks(
            et.env.name, et.tasks, task_ids=config.task_ids, split=config.split, limit=config.limit
        )
    for et in envs:
        et.tasks = with_answers(et.tasks, config.answers)
    return envs


def plan_jobs(envs: Sequence[EnvTasks], trials: int, skip: Container[str] = ()) -> list[TrialJob]:
    """Every (task, trial) of `envs` in plan order (env, task, trial), less the keys in `skip`."""
    return [
        job
        for et in envs
        for task in et.tasks
        for trial in range(trials)
        if (job := TrialJob(et, task, trial)).key not in skip
    ]


async def run_jobs(
    envs: Sequence[EnvTasks],
    jobs: Sequence[TrialJob],
    config: EvalConfig,
    run_id: str,
    append: Callable[[TrialRecord], None],
    on_record: Callable[[TrialRecord], None] | None = None,
    *,
    make_agent: Callable[[Task, int], Agent] | None = None,
    make_user: Callable[[Task], User] | None = None,
) -> None:
    """Run `jobs` in this process, `config.concurrency` at once, handing each record to `append`
    (the run log: durable before `on_record` hears of it)."""
    limiter = anyio.CapacityLimiter(max(1, config.concurrency))
    async with http_sessions(), open_backend(config, envs) as backend:

        async def one(job: TrialJob) -> None:
            async with limiter:
                record = await run_trial(
                    job, backend, config, run_id, make_agent=make_agent, make_user=make_user
                )
            append(record)
            if on_record:
                on_record(record)

        for et in envs:
            et.env.seed_state()  # made now, so `quiet_collector` sets it aside with the rest
        async with _loop_lag_probe(os.environ.get(LOOP_LAG_ENV)), anyio.create_task_group() as tg:
            for job in jobs:
                tg.start_soon(one, job)


LOOP_LAG_ENV = "ENVFORGE_LOOP_LAG"
"""Set to a file path, `run_eval` measures the event loop's lag while trials run and writes it there."""
LOOP_LAG_PERIOD_S = 0.01


@asynccontextmanager
async def _loop_lag_probe(path: str | None) -> AsyncIterator[None]:
    """With a `path` (`ENVFORGE_LOOP_LAG`), a task that sleeps 10 ms over and over while the body
    runs, each time noting how late it woke: how long a ready callback waits for the one event
    loop that runs every trial. Writes `{"samples", "p50_ms", "p99_ms", "max_ms"}` as JSON to
    `path` on the way out. Off by default (one wake-up per 10 ms when on: nothing to measure)."""
    if not path:
        yield
        return
    lags: list[float] = []

    async def sample() -> None:
        while True:
            start = time.perf_counter()
            await anyio.sleep(LOOP_LAG_PERIOD_S)
            lags.append(max(0.0, time.perf_counter() - start - LOOP_LAG_PERIOD_S))  # never early

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
    finally:
        ranked = sorted(lags)

        def ms(q: float) -> float | None:
            return round(1000 * ranked[min(len(ranked) - 1, int(q * len(ranked)))], 3) if ranked else None

        summary = {"samples": len(ranked), "p50_ms": ms(0.5), "p99_ms": ms(0.99), "max_ms": ms(1.0)}
        Path(path).write_text(json.dumps(summary) + "\n", encoding="utf-8")


GC_THRESHOLD = (50_000, 10, 10)
"""The collector's thresholds while trials run (CPython's default: 700, 10, 10), at up to 500
trials in flight; more in flight raise the first one (`gc_threshold`)."""
GC_YOUNG_PER_TRIAL = 100


def gc_threshold(concurrency: int) -> tuple[int, int, int]:
    """The collector's thresholds for a run with `concurrency` trials in flight.

    A young collection walks every object allocated since the last one that is still alive, and
    what a trial holds lives as long as the trial: the more trials in flight, the longer each
    lasts and the more of what they allocate a collection finds alive, to walk now and again in
    the next generation. The first threshold grows with the trials in flight (100 allocations
    each, from 500 trials on), so collections come after about as much of each trial's work
    whatever the concurrency: at 2,048 in flight (204,800) the collector's share of a run's CPU
    fell from ~1.6 to ~0.65 s. Cyclic garbage waits longer for its collection, but trials make
    little (model-call retries as a loop, not tenacity, keep it so)."""
    young = max(GC_THRESHOLD[0], GC_YOUNG_PER_TRIAL * concurrency)
    return (young, *GC_THRESHOLD[1:])


@contextmanager
def quiet_collector(concurrency: int) -> Iterator[None]:
    """Keep the cyclic garbage collector from re-walking what the run set up, while trials run.

    Everything alive when trials start (modules, envs, their seed states, tasks) lives as long
    as the run, yet every older-generation collection walked it again: ~0.5 CPU-s of the trials
    of a 296-trial run at 256 in flight, ~0.1 s with this. `gc.freeze` sets it aside, and a
    higher first threshold makes collections rarer (`gc_threshold`: at 2,048 in flight, where
    most of what a trial allocates lives as long as the trial, 50,000 cut collection time by a
    fifth from 20,000) (trials allocate fast, and most of it is freed by reference counting
    anyway); both are undone on the way out, so a caller that runs several evaluations leaks
    nothing. A process that froze objects itself keeps its own arrangement (then only the
    thresholds change).
    """
    frozen_here = gc.get_freeze_count() == 0
    threshold = gc.get_threshold()
    if frozen_here:
        gc.freeze()
    gc.set_threshold(*gc_threshold(concurrency))
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if frozen_here:
            gc.unfreeze()


class UnknownTasks(TaskSelectionError):
    """`--tasks` names ids that no selected env has."""


def check_task_ids(task_ids: list[str] | None, envs: Sequence[EnvTasks]) -> None:
    """Fail before running anything when a requested task id exists in none of the envs."""
    if task_ids is None:
        return
    known = {t.id for et in envs for t in et.tasks}
    unknown = [t for t in task_ids if t not in known]
    if unknown:
        names = ", ".join(et.env.name for et in envs)
        raise UnknownTasks(f"unknown task id(s) {', '.join(unknown)}: not in the tasks of {names}")


def _plan(
    rd: RunDir,
    config: EvalConfig,
    envs: Sequence[EnvTasks],
    resume: bool,
    on_notice: Callable[[str], None] | None,
) -> tuple[RunManifest, list[TrialJob]]:
    """The run's manifest (new, or the resumed one after checking it) and the trials still to run."""
    old = rd.read_manifest()
    if old is None and resume:
        what = "records but no manifest.json" if rd.trials_path.exists() else "no run to resume"
        raise RunConfigMismatch(
            f"refusing to resume {rd.path}: it holds {what}; start a new run in another --out directory"
        )
    if old is None and rd.trials_path.exists():
        raise RunExists(f"{rd.path} already holds trials.jsonl without a manifest: choose another --out")
    if old is not None and not resume:
        raise RunExists(f"{rd.path} already holds run {old.run_id}: pass --resume, or choose another --out")
    manifest = build_manifest(
        config, envs, old.run_id if old else f"run-{int(time.time())}-{secrets.token_hex(3)}"
    )
    if old is not None:
        check_resumable(old, manifest)
        manifest = old
    else:
        rd.write_manifest(manifest)
    fold_shards(rd, [j.key for j in plan_jobs(envs, config.trials)])  # a multi-process run cut short
    read = rd.read()
    if read.skipped and on_notice:
        on_notice(read.describe_skipped(rd.trials_path) + "; those trials run again")
    done = {r.trial_key for r in records_for(manifest, read.records) if not r.rerun_on_resume}
    return manifest, plan_jobs(envs, config.trials, done)
