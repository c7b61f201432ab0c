"""envforge environments inside `verifiers` (0.4, its `verifiers.v1` stack): `vf-eval` and prime-rl.

    from envforge.integrations.verifiers import load_environment
    env = load_environment(["envs/car_rental"], split=None, limit=None, user="scripted")

What verifiers sees (its contract, `verifiers/v1/env.py`, `taskset.py`, `task.py`, `harness.py`):

- a **taskset** (`EnvforgeTaskset`): one `EnvforgeTask` per envforge task, its data the env's policy
  as the system prompt, the user's opening request as the prompt, and which env and task it is;
- an **env** (`EnvforgeEnv`): one episode of a task is a conversation between the policy (the
  env's one `agent` seat) and envforge's simulated user (`ScriptedUser` by default, an `LLMUser`
  for a litellm model string), driven through verifiers' `Agent.interaction`, the turn-by-turn
  surface verifiers' own user-sim env is written on: the user opens, each of the policy's turns
  that ends in text goes to the user, and the user's answer is the next turn, until the user ends
  the conversation (or gives up, or the turn cap is reached);
- a **harness** (`EnvforgeHarness`): the policy's program, run in-process, as verifiers allows
  ("a harness may run its loop in-process instead of launching a program, as long as every model
  call goes through `endpoint`"): a chat-completions loop whose every model call goes through
  verifiers' interception server (so the trace, limits and `@stop`s are verifiers' own), with the
  env's tools as function tools (each tool's own name, description and JSON schema), each call
  run on the rollout's own envforge episode; a text-only reply ends the segment;
- a **reward** (`EnvforgeTask.envforge`, a `@vf.reward`): envforge's verdict of the finished
  episode, composed once by the trainer's `HarnessRolloutEnv` (the rollout env `envforge train
  --env-kind harness` plays, scored by `score_trial` with `compose_reward`, as `envforge eval`
  scores a trial): state match, required outputs, the env's declared policy; its parts are
  recorded as metrics (`envforge/<part>`), and `envforge/user_error` says whether the simulated
  user spoiled the conversation (ERPO's mask).

Isolation: each rollout opens its own envforge episode of one shared in-process `Fleet` (the
runtime synthesis, scoring and envforge's trainer use), bound to the rollout's trace id; the
harness reaches only the episode bound to the trace it runs, and a tool call names no episode. A
confined (model-written) env's tools run in its sandboxed worker, as when served.

The stock harnesses (`null`, `bash`) are not used: they install their chat program with `uv` at
run time (from the network) and pin `mcp==2.0.0`, while envforge needs mcp 2.3; the same pin is
why the `verifiers` extra lists verifiers' other dependencies and verifiers itself is installed
with `--no-deps` (docs/integrations.md).

verifiers resolves a taskset, an env and a harness by a module name without dots, so this module
is also importable as `envforge_verifiers` once imported (and `examples/envforge_verifiers.py` is
that module for `vf-eval`, which imports it by name).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, cast

import openai
import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.runtimes import ProgramResult, SubprocessConfig

from envforge.harness import EnvTasks, load_env_tasks, request_text
from envforge.server import Fleet
from envforge.synth import Task
from envforge.trainer import HarnessRolloutEnv, RewardInfo, RolloutEpisode

MODULE_ID = "envforge_verifiers"
"""The name verifiers resolves this module by (`--env.taskset.id`, the harness id)."""


class EpisodeStateError(RuntimeError):
    """A tool call or a reward asked of a rollout whose envforge episode is not open, or not done."""


class _Rollout:
    """One rollout's envforge episode, bound to the verifiers trace the rollout records."""

    def __init__(
        self, env_name: str, task_id: str, episode: RolloutEpisode, tools: list[dict[str, Any]]
    ) -> None:
        self.env_name, self.task_id, self.episode, self.tools = env_name, task_id, episode, tools
        self.verdict: RewardInfo | None = None
        self.agent_messages: list[str] = []
        self._client: openai.AsyncOpenAI | None = None

    def client(self, endpoint: str, secret: str) -> openai.AsyncOpenAI:
        """The rollout's model client (one per rollout: each costs a TLS context to build)."""
        if self._client is None or str(self._client.base_url).rstrip("/") != endpoint.rstrip("/"):
            self._client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def call(self, name: str, raw_arguments: str | None) -> str:
        """Run one tool call of the model on this rollout's episode; what the model reads back.
        Arguments that are not a JSON object are refused here, with the reason, and run nothing
        (envforge's runtime validates the rest and words its own errors, as over MCP)."""
        if self.verdict is not None:
            raise EpisodeStateError(f"the episode of {self.task_id} was scored: no call runs after it")
        try:
            arguments = json.loads(raw_arguments or "{}")
        except ValueError as exc:
            return f"Error: the arguments of {name} are not JSON ({exc}); send them as a JSON object"
        if not isinstance(arguments, dict):
            return f"Error: the arguments of {name} must be a JSON object, not {type(arguments).__name__}"
        outcome = await self.episode.call_tool(name, arguments)
        return outcome.text


_LIVE: dict[str, _Rollout] = {}
"""trace id -> the rollout it records, while its conversation runs: what the harness reaches."""


class EnvforgeTaskData(vf.TaskData):  # type: ignore[misc]
    """A task's wire data: verifiers' fields (`prompt`: the user's opening; `system_prompt`: the
    env's policy) and which envforge env folder and task it is."""

    env: str
    task_id: str
    env_dir: str


class EnvforgeTask(vf.Task[EnvforgeTaskData]):  # type: ignore[misc]
    """One envforge task; its reward is envforge's verdict of the rollout's episode."""

    _rollout: _Rollout | None = None

    @vf.reward  # type: ignore[untyped-decorator]
    async def envforge(self, trace: vf.Trace) -> float:
        """envforge's composed reward of the finished episode; refused while it has not ended."""
        rollout = self._rollout
        if rollout is None or rollout.verdict is None:
            raise EpisodeStateError(
                f"reward asked of {self.data.env}/{self.data.task_id} before its episode ended"
            )
        return rollout.verdict.reward

    @vf.metric  # type: ignore[untyped-decorator]
    async def envforge_parts(self, trace: vf.Trace) -> dict[str, float]:
        """The verdict's parts (state, outputs, policy, ...) and whether the user spoiled it; none
        before the episode ended (the reward refuses that case)."""
        rollout = self._rollout
        if rollout is None or rollout.verdict is None:
            return {}
        parts = {f"envforge/{k}": v for k, v in rollout.verdict.parts.items()}
        parts["envforge/user_error"] = float(rollout.verdict.user_error)
        return parts


class EnvforgeTasksetConfig(vf.TasksetConfig):  # type: ignore[misc]
    """Which envforge tasks load (`--env.taskset.env-dirs`, `.split`, `.limit`)."""

    id: str = MODULE_ID
    env_dirs: list[str] = Field(default_factory=list)
    """Env folders, each with its `tasks.jsonl`."""
    split: str | None = None
    """Only the tasks in this split (τ²'s `split_tasks.json` names)."""
    limit: int | None = Field(None, ge=1)
    """The first `limit` tasks of each env."""


class EnvforgeTaskset(vf.Taskset[EnvforgeTask, EnvforgeTasksetConfig]):  # type: ignore[misc]
    """The tasks of the env folders in the config, in each folder's order."""

    def __init__(self, config: EnvforgeTasksetConfig) -> None:
        super().__init__(config)
        if not config.env_dirs:
            raise ValueError("no env folders given (--env.taskset.env-dirs)")
        self.env_tasks: dict[str, EnvTasks] = {}
        for root in config.env_dirs:
            loaded = _load(root, config.split, config.limit)
            if loaded.env.name in self.env_tasks:
                raise ValueError(f"two env folders hold an env named {loaded.env.name!r}")
            self.env_tasks[loaded.env.name] = loaded

    def load(self) -> Iterable[EnvforgeTask]:
        for name, env_tasks in self.env_tasks.items():
            for task in env_tasks.tasks:
                data = EnvforgeTaskData(
                    id=f"{name}/{task.id}",
                    name=task.id,
                    prompt=request_text(task),
                    system_prompt=env_tasks.env.policy.strip(),
                    env=name,
                    task_id=task.id,
                    env_dir=str(env_tasks.env_dir),
                )
                yield EnvforgeTask(data, self.config.task)


def _load(root: str, split: str | None, limit: int | None) -> EnvTasks:
    path = Path(root)
    if not (path / "env.toml").is_file():
        raise ValueError(f"{path} is not an env folder (no env.toml)")
    try:
        env_tasks = load_env_tasks(path)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    tasks: list[Task] = [t for t in env_tasks.tasks if split is None or split in t.split]
    if not tasks:
        raise ValueError(f"env {env_tasks.env.name!r} ({path}) has no task in split {split!r}")
    env_tasks.tasks = tasks[:limit]
    return env_tasks


class EnvforgeHarnessConfig(vf.HarnessConfig):  # type: ignore[misc]
    id: str = MODULE_ID
    max_tool_calls: int = Field(64, ge=1)
    """Tool calls one segment may make before it is cut (the model's turn cap is the agent's
    `max_turns`, enforced by verifiers' interception)."""


class EnvforgeHarness(vf.Harness[EnvforgeHarnessConfig]):  # type: ignore[misc]
    """The policy's chat loop, in-process: model calls through verifiers' interception, tool calls
    on the rollout's own envforge episode (module docstring)."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        rollout = _LIVE.get(trace.id)
        if rollout is None:
            return ProgramResult(
                1, "", f"no envforge episode is bound to trace {trace.id}: run it in EnvforgeEnv"
            )
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(message_to_wire(m) for m in prompt)
        calls = 0
        client = rollout.client(endpoint, secret)
        while True:
            try:
                # the wire dicts as verifiers' own chat program sends them (openai's TypedDicts)
                completion = await client.chat.completions.create(
                    model=ctx.model, messages=cast(Any, messages), tools=cast(Any, rollout.tools)
                )
            except openai.APIError as exc:  # a limit or a @stop refused the turn, or the model failed
                return ProgramResult(1, "", f"model call failed: {exc}")
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return ProgramResult(0, "", "")
            for call in message.tool_calls:
                calls += 1
                if calls > self.config.max_tool_calls:
                    return ProgramResult(0, "", f"cut after {self.config.max_tool_calls} tool calls")
                name = getattr(getattr(call, "function", None), "name", "")
                raw = getattr(getattr(call, "function", None), "arguments", None)
                text = await rollout.call(name, raw)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})


class EnvforgeEnvConfig(vf.EnvConfig):  # type: ignore[misc]
    """The env's one `agent` seat (the policy), the simulated user, and the conversation's cap."""

    taskset: EnvforgeTasksetConfig = EnvforgeTasksetConfig()
    agent: vf.AgentConfig = vf.AgentConfig(runtime=SubprocessConfig())
    """The policy's seat; its harness is the taskset's, `EnvforgeHarness`, and it runs in-process."""
    user: str = "scripted"
    """envforge's simulated user: `scripted`, or a litellm model string (an `LLMUser`)."""
    max_user_turns: int = Field(30, ge=1)
    """The user answers at most this many of the policy's turns; a conversation still going then
    is scored as cut (status `max_turns`, reward 0), as envforge scores a trial cut by its limit."""


class EnvforgeEnv(vf.Env[EnvforgeEnvConfig]):  # type: ignore[misc]
    """A conversation of the policy with envforge's simulated user on one envforge episode."""

    def __init__(self, config: EnvforgeEnvConfig) -> None:
        super().__init__(config)
        taskset = self.taskset
        assert isinstance(taskset, EnvforgeTaskset)
        self.env_tasks = taskset.env_tasks
        self._stack: AsyncExitStack | None = None
        self._rollout_envs: dict[str, HarnessRolloutEnv] = {}

    async def start(self) -> None:
        """Open the fleet every rollout's episode lives in (inside verifiers' `serving()`)."""
        stack = AsyncExitStack()
        fleet = await stack.enter_async_context(Fleet([et.env for et in self.env_tasks.values()]))
        self._stack = stack
        self._rollout_envs = {
            name: HarnessRolloutEnv(fleet, et, user=self.config.user, use_mcp=False)
            for name, et in self.env_tasks.items()
        }

    async def stop(self) -> None:
        stack, self._stack, self._rollout_envs = self._stack, None, {}
        if stack is not None:
            await stack.aclose()

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        if not isinstance(task, EnvforgeTask):
            raise TypeError(f"EnvforgeEnv plays envforge tasks, not {type(task).__name__}")
        rollout_env = self._rollout_envs.get(task.data.env)
        if rollout_env is None:
            raise EpisodeStateError("no fleet is open: run episodes inside env.serving() (vf-eval does)")
        tools = _function_tools(self.env_tasks[task.data.env])
        async with rollout_env.episode(task.data.task_id) as episode:
            rollout = _Rollout(task.data.env, task.data.task_id, episode, tools)
            # The user opens (its own opening, which an LLM user words itself): the policy's task
            # carries no prompt, and its own copy carries this rollout for the reward.
            played = task.with_data(prompt=None)
            played._rollout = rollout
            opening = episode.initial_messages()[-1]["content"]
            try:
                async with (
                    agents.agent.interaction(played) as conversation,
                    _bound(conversation.trace.id, rollout),
                ):
                    await self._converse(conversation, episode, rollout, opening)
                    rollout.verdict = await episode.finish(rollout.agent_messages)
            finally:
                await rollout.close()

    async def _converse(
        self, conversation: Any, episode: RolloutEpisode, rollout: _Rollout, opening: str
    ) -> None:
        said: str | None = opening
        for _ in range(self.config.max_user_turns):
            if said is None:
                return
            segment = await conversation.turn(said)
            if segment.terminated:
                return
            text = segment.last_reply
            rollout.agent_messages.append(text)
            said = await episode.user_reply(text)


@asynccontextmanager
async def _bound(trace_id: str, rollout: _Rollout) -> AsyncIterator[None]:
    _LIVE[trace_id] = rollout
    try:
        yield
    finally:
        _LIVE.pop(trace_id, None)


def _function_tools(env_tasks: EnvTasks) -> list[dict[str, Any]]:
    """The env's tools as OpenAI function tools: each tool's own name, description and schema."""
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": spec.description.strip(),
                "parameters": spec.input_schema,
            },
        }
        for name, spec in sorted(env_tasks.env.tools.items())
    ]


def load_environment(
    env_dirs: Sequence[str | Path],
    split: str | None = None,
    limit: int | None = None,
    user: str = "scripted",
    *,
    max_user_turns: int = 30,
) -> EnvforgeEnv:
    """A verifiers env of the tasks of `env_dirs` (those in `split`, the first `limit` per env),
    played against envforge's simulated `user` and rewarded by envforge's verdict. Run it as
    verifiers runs any env: `async with env.serving(): await env.run_episode(task, ctx)` (or
    `vf-eval envforge_verifiers ...`). Raises ValueError, one line, for a folder with no env or
    no tasks."""
    config = EnvforgeEnvConfig(
        taskset=EnvforgeTasksetConfig(env_dirs=[str(d) for d in env_dirs], split=split, limit=limit),
        user=user,
        max_user_turns=max_user_turns,
    )
    return EnvforgeEnv(config)


# verifiers imports a plugin by a dotless module name (module docstring).
sys.modules.setdefault(MODULE_ID, sys.modules[__name__])

__all__ = [
    "EnvforgeEnv",
    "EnvforgeEnvConfig",
    "EnvforgeHarness",
    "EnvforgeHarnessConfig",
    "EnvforgeTask",
    "EnvforgeTaskData",
    "EnvforgeTaskset",
    "EnvforgeTasksetConfig",
    "EpisodeStateError",
    "load_environment",
]
