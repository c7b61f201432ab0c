"""envforge environments served under OpenEnv's contract, so OpenEnv's stock client plays an episode.

    from envforge.integrations.openenv import openenv_app
    app = openenv_app(["envs/car_rental", "envs/library"])   # OpenEnv's own FastAPI app
    # uvicorn.run(app, host="127.0.0.1", port=8000, proxy_headers=False); then, with OpenEnv's
    # EnvClient typed with this module's types (`EnvforgeEnv`), or its untyped GenericEnvClient:
    from envforge.integrations.openenv import EnvforgeAction, EnvforgeEnv
    with EnvforgeEnv(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(task_id="library-0-00003")   # the user's opening message, the tools
        result = env.step(EnvforgeAction(tool="get_book", arguments={"book_id": "B-1"}))  # the result
        result = env.step(EnvforgeAction(message="Done: B-1 is on hold for you."))  # the user's reply
        result.done, result.reward                       # True, envforge's reward, once the user stops

What OpenEnv sees (openenv-core 0.3.0, `openenv.core.env_server`): an `Environment` subclass
(`EnvforgeEnvironment`) with `reset`, `step` and `state`, served by OpenEnv's own `create_app`
(its `/ws` WebSocket session, one instance per session, and its stateless HTTP routes), with
`EnvforgeAction`, `EnvforgeObservation` and `EnvforgeState` as its pydantic types.

- `reset(task_id=..., env=..., seed=..., episode_id=...)` opens a fresh envforge episode of the task
  at its initial state (the previous one of the session is closed) and returns the simulated
  user's opening message, the env's policy (`system`) and its tools (OpenAI function schemas).
  Without `task_id`, `seed` picks a task (the sorted ids, `seed` modulo their number), else the
  first. `episode_id` is the client's label for the episode, nothing more: it never names
  another session's episode.
- `step(action)`: an action is a tool call (`tool` with `arguments`, an object or its JSON text)
  or a message to the user (`message`). The observation is the tool's result (`role="tool"`,
  `is_error` as envforge's runtime says) or the user's reply (`role="user"`).
- The episode ends when the user stops (or the agent says nothing, or `max_steps` actions were
  taken): then `done` is true and `reward` is envforge's verdict with its `parts`; before that the
  reward is `None`. A step after the end, or before a reset, is refused with a one-line error.

The episode is the one `envforge train --env-kind harness` plays (the trainer's
`HarnessRolloutEnv`): envforge's simulated user (`ScriptedUser` by default, a model's with a
litellm string), tool calls into an episode of an in-process `Fleet`, and the harness's scorer,
which composes the reward with synth's `compose_reward` (state match, required outputs, the
env's declared policy judged on the conversation), as an `envforge eval` trial is scored. With a
user in the loop, tasks whose writes need the user's yes are playable here, unlike in trl.

Each OpenEnv session has its own `EnvforgeEnvironment`, whose episode only it can reach: an action
names no episode. All sessions share one fleet, running on an event loop in a thread of its own
(OpenEnv calls `reset` and `step` from a worker thread per session). One client may hold at most
`max_sessions_per_client` of the `max_concurrent_envs` sessions (`openenv_sessions`).
"""

from __future__ import annotations

import json
import queue
import threading
import uuid
import weakref
from collections.abc import Sequence
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import anyio.from_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openenv.core.env_server import Environment, create_app
from openenv.core.env_server.types import EnvironmentMetadata

from envforge.harness import EnvTasks, LLMConfig, UserName, load_env_tasks
from envforge.server import Fleet
from envforge.trainer import HarnessRolloutEnv, RewardInfo

from .openenv_client import EnvforgeEnv
from .openenv_models import EnvforgeAction, EnvforgeObservation, EnvforgeState
from .openenv_sessions import SessionsPerClient, default_per_client

__all__ = [
    "ActionError",
    "EnvforgeAction",
    "EnvforgeEnv",
    "EnvforgeEnvironment",
    "EnvforgeObservation",
    "EnvforgeState",
    "EpisodeStateError",
    "openenv_app",
]

DEFAULT_MAX_STEPS = 30
"""Actions per episode before it is cut (then scored as the harness scores a trial cut by its
turn limit: 0): `envforge eval`'s default of 30 exchanges."""


class EpisodeStateError(RuntimeError):
    """A step with no open episode (no reset yet, or the episode is over)."""


class ActionError(ValueError):
    """An action that is neither one tool call nor one message, or a reset argument OpenEnv's
    contract does not know."""


class _Runtime:
    """The fleet every session shares, and its harness envs, on an event loop in a daemon thread
    of its own: OpenEnv calls an environment from a worker thread per session, and the episodes'
    databases belong to one loop. A daemon, so that an app built and never served (or never shut
    down) does not keep its process alive; serving it closes the fleet on shutdown."""

    def __init__(self, env_tasks: Sequence[EnvTasks], make_env: Any, max_steps: int) -> None:
        self.max_steps = max_steps
        self._thread, self.portal = _portal_thread()
        self._stack = ExitStack()
        try:
            self.fleet = self._stack.enter_context(
                self.portal.wrap_async_context_manager(Fleet([et.env for et in env_tasks]))
            )
            self.envs: dict[str, HarnessRolloutEnv] = {
                et.env.name: make_env(self.fleet, et) for et in env_tasks
            }
        except BaseException:
            self._stop()
            raise
        self.env_tasks = {et.env.name: et for et in env_tasks}
        self.owner: dict[str, str] = {}  # task id -> env name, for ids no two envs share
        shared: set[str] = set()
        for et in env_tasks:
            for task in et.tasks:
                if task.id in self.owner:
                    shared.add(task.id)
                self.owner[task.id] = et.env.name
        for task_id in shared:
            del self.owner[task_id]
        self.task_ids = sorted({t.id for et in env_tasks for t in et.tasks})
        self.tools = {et.env.name: _openai_tools(et) for et in env_tasks}
        self._lock = threading.Lock()
        self.closed = False
        self.open: weakref.WeakSet[EnvforgeEnvironment] = weakref.WeakSet()

    def close(self) -> None:
        """Close the episodes still open, then the fleet and its loop."""
        with self._lock:
            if not self.closed:
                for session in list(self.open):
                    session.close()
                self.closed = True
                self._stop()

    def _stop(self) -> None:
        try:
            self._stack.close()
        finally:
            self.portal.call(self.portal.stop)
            self._thread.join()


def _portal_thread() -> tuple[threading.Thread, anyio.from_thread.BlockingPortal]:
    """A blocking portal to an event loop running in a new daemon thread."""
    started: queue.Queue[anyio.from_thread.BlockingPortal | BaseException] = queue.Queue()

    async def serve() -> None:
        async with anyio.from_thread.BlockingPortal() as portal:
            started.put(portal)
            await portal.sleep_until_stopped()

    def run() -> None:
        try:
            anyio.run(serve)
        except BaseException as exc:  # the loop could not start: say so to the waiting thread
            started.put(exc)

    thread = threading.Thread(target=run, name="envforge-openenv-fleet", daemon=True)
    thread.start()
    got = started.get()
    if isinstance(got, BaseException):
        raise got
    return thread, got


def _openai_tools(et: EnvTasks) -> list[dict[str, Any]]:
    """The env's tools the agent may call (not a dual-control env's user-side ones), as the
    OpenAI function schemas chat templates render: the env's own names, descriptions and schemas."""
    return [
        {
            "type": "function",
            "function": {"name": spec.name, "description": spec.description, "parameters": spec.input_schema},
        }
        for spec in sorted(et.env.tools.values(), key=lambda s: s.name)
        if getattr(spec, "side", "agent") == "agent"
    ]


class EnvforgeEnvironment(Environment):  # type: ignore[misc]
    """One OpenEnv session's envforge episode (module docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, runtime: _Runtime) -> None:
        super().__init__()
        self._runtime = runtime
        self._scope: AbstractContextManager[Any] | None = None
        self._episode: Any = None
        self._state = EnvforgeState()
        self._said: list[str] = []

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        env: str | None = None,
        **unknown: Any,
    ) -> EnvforgeObservation:
        if unknown:
            raise ActionError(
                f"reset takes task_id, env, seed and episode_id, not {', '.join(sorted(unknown))}"
            )
        env_name, task_id = self._pick(task_id, env, seed)
        self.close()
        if self._runtime.closed:
            raise EpisodeStateError("the server is shutting down: no new episode")
        harness_env = self._runtime.envs[env_name]
        scope = self._runtime.portal.wrap_async_context_manager(harness_env.episode(task_id))
        self._episode = scope.__enter__()
        self._scope = scope
        self._runtime.open.add(self)
        self._said = []
        self._state = EnvforgeState(episode_id=episode_id or uuid.uuid4().hex, env=env_name, task_id=task_id)
        opening = self._episode.messages[0].content or ""
        observation = EnvforgeObservation(
            role="user",
            content=opening,
            env=env_name,
            task_id=task_id,
            system=self._runtime.env_tasks[env_name].env.policy.strip(),
            tools=self._runtime.tools[env_name],
        )
        if self._episode.termination is not None:  # the user's opening already ends it
            return self._end(observation)
        return observation

    def _pick(self, task_id: str | None, env: str | None, seed: int | None) -> tuple[str, str]:
        """(env, task) a reset asks for; ActionError, one line, for one this server does not hold."""
        runtime = self._runtime
        if env is not None and env not in runtime.envs:
            raise ActionError(f"no env {env!r} here (served: {', '.join(sorted(runtime.envs))})")
        if task_id is None:
            ids = [t.id for t in runtime.env_tasks[env].tasks] if env else runtime.task_ids
            task_id = sorted(ids)[(seed or 0) % len(ids)]
        if env is None:
            if task_id not in runtime.owner:
                held = [
                    name for name, et in runtime.env_tasks.items() if any(t.id == task_id for t in et.tasks)
                ]
                if held:
                    raise ActionError(f"task {task_id!r} is in several envs ({', '.join(held)}): give env=")
                raise ActionError(f"no task {task_id!r} here")
            env = runtime.owner[task_id]
        if task_id not in runtime.envs[env].tasks:
            raise ActionError(f"env {env!r} has no task {task_id!r}")
        return env, task_id

    def step(self, action: EnvforgeAction, timeout_s: float | None = None, **_: Any) -> EnvforgeObservation:
        episode = self._open_episode()
        if (action.tool is None) == (action.message is None):
            raise ActionError(
                "an action is one tool call ({'tool': ..., 'arguments': {...}}) "
                "or one message to the user ({'message': ...})"
            )
        self._state.step_count += 1
        if action.tool is not None:
            observation = self._call(episode, action.tool, action.arguments)
            if self._state.step_count >= self._runtime.max_steps:
                return self._end(observation)
            return observation
        text = action.message or ""
        self._said.append(text)
        reply = self._runtime.portal.call(episode.user_reply, text)
        if reply is not None and self._state.step_count < self._runtime.max_steps:
            return self._observation(role="user", content=reply)
        last = episode.messages[-1]
        said = (last.content or "") if last.role == "user" else ""
        return self._end(self._observation(role="user", content=said))

    def _call(self, episode: Any, tool: str, arguments: dict[str, Any] | str) -> EnvforgeObservation:
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                return self._observation(
                    role="tool", tool=tool, is_error=True, content=f"Error: the arguments are not JSON: {exc}"
                )
            if not isinstance(parsed, dict):
                return self._observation(
                    role="tool",
                    tool=tool,
                    is_error=True,
                    content="Error: the arguments are not a JSON object",
                )
            arguments = parsed
        outcome = self._runtime.portal.call(episode.call_tool, tool, arguments)
        return self._observation(role="tool", tool=tool, is_error=outcome.is_error, content=outcome.text)

    def _observation(self, **fields: Any) -> EnvforgeObservation:
        return EnvforgeObservation(env=self._state.env or "", task_id=self._state.task_id or "", **fields)

    def _open_episode(self) -> Any:
        if self._state.done:
            raise EpisodeStateError(f"the episode of {self._state.task_id} is over: reset() starts the next")
        if self._episode is None:
            raise EpisodeStateError(
                "no episode is open: reset(task_id=...) first, in the same session "
                "(OpenEnv's WebSocket session; its stateless HTTP /step has none)"
            )
        return self._episode

    def _end(self, observation: EnvforgeObservation) -> EnvforgeObservation:
        """Score the episode with envforge's composer, close it, and put the verdict on `observation`."""
        info, status = self._runtime.portal.call(self._finish, self._episode, list(self._said))
        self.close()
        self._state.done = True
        self._state.reward, self._state.parts = info.reward, dict(info.parts)
        self._state.user_error, self._state.status = info.user_error, status
        observation.done, observation.reward, observation.parts = True, info.reward, dict(info.parts)
        observation.user_error, observation.status = info.user_error, status
        return observation

    async def _finish(self, episode: Any, said: list[str]) -> tuple[RewardInfo, str]:
        """The harness episode's verdict, and its record taken back off the env's list (it is
        appended with no await between, and one server would otherwise grow it forever)."""
        info: RewardInfo = await episode.finish(said)
        verdict = episode.env.verdicts.pop()
        return info, str(verdict.status)

    @property
    def state(self) -> EnvforgeState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        names = ", ".join(sorted(self._runtime.envs))
        return EnvironmentMetadata(
            name="envforge",
            description=f"envforge environments ({names}): tools, a simulated user, envforge's reward",
        )

    def close(self) -> None:
        """Close the session's episode (its database goes with it); the verdict, if any, stays."""
        scope, self._scope, self._episode = self._scope, None, None
        self._runtime.open.discard(self)
        if scope is not None and not self._runtime.closed:
            scope.__exit__(None, None, None)


def openenv_app(
    env_dirs: Sequence[str | Path],
    *,
    user: str = UserName.SCRIPTED,
    user_api_base: str | None = None,
    judge: str | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_concurrent_envs: int = 64,
    max_sessions_per_client: int | None = None,
) -> FastAPI:
    """OpenEnv's FastAPI app (`openenv.core.env_server.create_app`) serving the tasks of the envs in
    `env_dirs` (each folder's `tasks.jsonl`). `user` is `"scripted"` or a litellm model string
    (`user_api_base` to reach it); `judge`, a litellm model string, adds the nl_assertions part
    and the user-error judge. `max_concurrent_envs` caps the sessions (OpenEnv's cap),
    `max_sessions_per_client` one client's share of them (default half; `openenv_sessions`).
    The fleet closes with the app (its shutdown event). Raises ValueError, one line, for a
    folder with no tasks, two envs of one name, or a cap under 1."""
    dirs = [Path(d) for d in env_dirs]
    if not dirs:
        raise ValueError("no env folders given")
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, not {max_steps}")
    if max_concurrent_envs < 1:
        raise ValueError(f"max_concurrent_envs must be at least 1, not {max_concurrent_envs}")
    per_client = max_sessions_per_client
    if per_client is None:
        per_client = default_per_client(max_concurrent_envs)
    if per_client < 1:
        raise ValueError(f"max_sessions_per_client must be at least 1, not {per_client}")
    loaded = []
    for d in dirs:
        if not (d / "tasks.jsonl").exists():
            raise ValueError(f"{d / 'tasks.jsonl'} is missing: synthesize tasks first (envforge synth tasks)")
        et = load_env_tasks(d)
        if not et.tasks:
            raise ValueError(f"{d / 'tasks.jsonl'} holds no task of env {et.env.name!r}")
        loaded.append(et)
    names = [et.env.name for et in loaded]
    if len(set(names)) != len(names):
        raise ValueError(f"two env folders hold an env of one name: {sorted(names)}")
    user_llm = None if user == UserName.SCRIPTED else LLMConfig(model=user, api_base=user_api_base)
    judge_llm = LLMConfig(model=judge) if judge else None

    def make_env(fleet: Fleet, et: EnvTasks) -> HarnessRolloutEnv:
        return HarnessRolloutEnv(fleet, et, user=user, user_llm=user_llm, judge=judge_llm, use_mcp=False)

    runtime = _Runtime(loaded, make_env, max_steps)
    try:
        app: FastAPI = create_app(
            lambda: EnvforgeEnvironment(runtime),
            EnvforgeAction,
            EnvforgeObservation,
            env_name="envforge",
            max_concurrent_envs=max_concurrent_envs,
        )
    except BaseException:
        runtime.close()
        raise
    app.router.on_shutdown.append(_closer(runtime))
    app.add_middleware(SessionsPerClient, per_client=per_client)
    app.add_exception_handler(EpisodeStateError, _refused(409))
    app.add_exception_handler(ActionError, _refused(422))
    app.state.envforge_runtime = runtime
    return app


def _closer(runtime: _Runtime) -> Any:
    async def close() -> None:
        await anyio.to_thread.run_sync(runtime.close)

    return close


def _refused(status: int) -> Any:
    """The stateless HTTP routes' answer to a refused step or reset: the status and the one-line
    reason (over the WebSocket, OpenEnv sends the reason as its error message)."""

    async def handler(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status)

    return handler
