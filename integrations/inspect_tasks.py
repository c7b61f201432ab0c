"""envforge environments as inspect_ai tasks, scored by envforge's composer.

    inspect eval envforge/car_rental -T limit=5 --model hf/PATH

    from envforge.integrations.inspect_tasks import envforge_task
    inspect_ai.eval(envforge_task("envs/car_rental", limit=5), model="mockllm/model")

What inspect sees (inspect_ai 0.3.285): a `Task` whose samples are the env's tasks (the env's
policy as the system message, the simulated user's opening request as the user message, the task
id as the sample id, `env` and `task_id` in the metadata); a solver, `envforge_agent`, that is
inspect's own `react` agent given the env's tools; and a scorer, `envforge_scorer`, whose value is
envforge's composed reward, its parts in the Score's metadata and explanation. `envforge/<env>`
names a task for each env folder of the checkout's `envs/`, registered through inspect's entry
point (`[project.entry-points.inspect_ai]`); `envforge/env_task` takes any env folder (`-T
env_dir=PATH`).

Each sample plays one envforge episode of its own, opened by the solver at the task's initial
state: the tools given to the agent are bound to that episode (no argument names an episode, so
no call can reach another sample's), and they run in envforge's runtime, which validates the
arguments as over MCP and runs a confined env's tools in its sandboxed worker. inspect checks a
call's arguments against the tool's schema first, and answers one that does not fit with its own
parse error; such a call never reaches the episode.

The simulated user: inspect's `react` loop asks its `on_continue` hook whether to go on after each
turn, and a string it returns becomes the next user message. So a model turn with no tool call
goes to envforge's simulated user (`ScriptedUser` by default; a litellm model string with
`user=`), whose answer is the next user turn, and the conversation ends when the user ends it (or
at inspect's `message_limit`, which scores as envforge scores a trial cut by its turn limit: 0).
The episode is the trainer's `HarnessRolloutEnv` (what `envforge train --env-kind harness` plays),
and the scorer asks it for the verdict once the agent is done: `score_trial`'s `compose_reward`
(state match, required outputs, the env's declared policy judged on the conversation), as
`envforge eval` reports it, with the simulated user's errors flagged (`user_error` in the Score's
metadata). Then the episode is closed. A score asked while the agent still plays, or of a sample
whose episode this process did not play (say, re-scoring a log), is refused.
"""

from __future__ import annotations

import importlib.util
import os
import tomllib
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Literal

from inspect_ai import Task, task
from inspect_ai.agent import AgentState, as_solver, react
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageSystem, ChatMessageUser
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import ToolDef, ToolError, ToolParam, ToolParams

from envforge.harness import EnvTasks, LLMConfig, UserName, load_env_tasks, request_text
from envforge.server import Environment, Fleet
from envforge.synth import Task as EnvTask
from envforge.trainer import HarnessRolloutEnv, RewardInfo, RolloutEpisode

REPO = Path(__file__).resolve().parent.parent
"""The checkout this module sits in (its `envs/` folders are registered as `envforge/<env>`)."""

MESSAGE_LIMIT = 50
"""The default cap on a sample's messages (inspect's `message_limit`): a loop of calls ends there."""


def _offline_token_counts() -> None:
    """inspect counts a model's tokens with tiktoken's o200k_base (mockllm's too), which tiktoken
    downloads on first use; litellm, an envforge dependency, ships that file, so inspect is pointed
    at litellm's copy (as litellm points itself) unless a cache folder was chosen."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return
    bundled = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"
    if bundled.is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(bundled)


_offline_token_counts()


class EpisodeStateError(RuntimeError):
    """A tool call or a score asked of a sample's episode that is not in the state it needs."""


Status = Literal["playing", "ended", "scored"]


class _Fleet:
    """One `Fleet` per env folder, shared by the samples playing at once in this process: opened
    by the first sample that needs it, closed by the last one's cleanup (a Fleet lives on one event
    loop, and each `inspect_ai.eval` runs on a loop of its own)."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self._fleet: Fleet | None = None
        self._users = 0

    def acquire(self) -> Fleet:
        if self._fleet is None:
            self._fleet = Fleet([self.env])
        self._users += 1
        return self._fleet

    async def release(self) -> None:
        self._users -= 1
        if self._users == 0 and self._fleet is not None:
            fleet, self._fleet = self._fleet, None
            await fleet.aclose()


class _Loaded:
    """An env folder loaded once per process (its confined worker started once), with the fleet
    its samples share."""

    def __init__(self, env_tasks: EnvTasks) -> None:
        self.env_tasks = env_tasks
        self.tasks = {t.id: t for t in env_tasks.tasks}
        self.fleet = _Fleet(env_tasks.env)


_LOADED: dict[Path, _Loaded] = {}

_EPISODES: dict[str, EnvforgeEpisode] = {}
"""Each running sample's episode, by the sample's uuid (unique per sample and epoch of a run)."""


def _load(env_dir: str | Path) -> _Loaded:
    """The env folder and its tasks (loaded once per process). Raises ValueError, one line, for a
    folder that is not an env or has no tasks."""
    root = Path(env_dir).resolve()
    if root not in _LOADED:
        if not (root / "env.toml").exists():
            raise ValueError(f"{env_dir} is not an env folder (no env.toml)")
        try:
            env_tasks = load_env_tasks(root)
        except FileNotFoundError as exc:
            raise ValueError(str(exc)) from None
        if not env_tasks.tasks:
            raise ValueError(f"{root / 'tasks.jsonl'} holds no task of env {env_tasks.env.name!r}")
        _LOADED[root] = _Loaded(env_tasks)
    return _LOADED[root]


class EnvforgeEpisode:
    """One sample's envforge episode: opened by `envforge_agent`, played through the tools bound to
    it and the simulated user's turns, scored once by `envforge_scorer`, closed by the scorer or by
    the task's cleanup."""

    def __init__(self, loaded: _Loaded, task: EnvTask, user: str) -> None:
        self.loaded, self.task, self.user = loaded, task, user
        self.status: Status = "playing"
        self.agent_messages: list[str] = []
        self.verdict: RewardInfo | None = None
        self._stack = AsyncExitStack()
        self._episode: RolloutEpisode | None = None

    @property
    def env(self) -> Environment:
        return self.loaded.env_tasks.env

    async def open(self) -> str:
        """Open the episode at the task's initial state; the user's opening message."""
        fleet = self.loaded.fleet.acquire()
        self._stack.push_async_callback(self.loaded.fleet.release)
        scripted = self.user == UserName.SCRIPTED
        rollout_env = HarnessRolloutEnv(
            fleet,
            self.loaded.env_tasks,
            user=self.user,
            user_llm=None if scripted else LLMConfig(model=self.user),
            use_mcp=False,
            task_ids=[self.task.id],
        )
        self._episode = await self._stack.enter_async_context(rollout_env.episode(self.task.id))
        return str(self._episode.initial_messages()[-1]["content"])

    def _open_episode(self) -> RolloutEpisode:
        if self._episode is None:
            raise EpisodeStateError(f"the episode of {self.task.id} is closed")
        return self._episode

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call in this sample's episode. An error result (a refused or invalid call,
        as envforge's runtime words it) is raised as inspect's `ToolError`, which the model reads
        as the call's error."""
        if self.status != "playing":
            raise ToolError(f"the episode of {self.task.id} has ended: no further tool calls reach it")
        outcome = await self._open_episode().call_tool(name, arguments)
        if outcome.is_error:
            raise ToolError(outcome.text)
        return outcome.text

    async def said(self, text: str) -> str | None:
        """The model's turn with no tool call, said to the user: the user's answer (None: the
        conversation is over)."""
        if self.status != "playing":
            raise EpisodeStateError(f"the episode of {self.task.id} has ended")
        self.agent_messages.append(text)
        return await self._open_episode().user_reply(text)

    async def finish(self) -> RewardInfo:
        """envforge's verdict on the episode, computed once (a later ask gets the same), then the
        episode is closed."""
        if self.verdict is not None:
            return self.verdict
        if self.status == "playing":
            raise EpisodeStateError(
                f"score asked of {self.task.id} while its agent still plays: "
                "envforge scores an episode once it ends"
            )
        verdict = await self._open_episode().finish(list(self.agent_messages))
        self.verdict, self.status = verdict, "scored"
        await self.close()
        return verdict

    async def close(self) -> None:
        self._episode = None
        await self._stack.aclose()


def episode_of(state: TaskState) -> EnvforgeEpisode | None:
    """The sample's envforge episode while its sample runs (None before `envforge_agent` opened
    it and after the sample's cleanup): for a solver or scorer of one's own next to envforge's."""
    return _EPISODES.get(state.uuid)


def tool_params(schema: dict[str, Any]) -> ToolParams:
    """inspect's `ToolParams` for a tool's JSON schema: the env's own properties, types, enums,
    descriptions and required list, with `$ref`s to `$defs` written out (inspect's schema model has
    no `$defs`), and no other argument allowed."""
    defs = schema.get("$defs", {})
    properties = {
        name: ToolParam.model_validate(_inline(prop, defs))
        for name, prop in schema.get("properties", {}).items()
    }
    return ToolParams(properties=properties, required=list(schema.get("required", [])))


def _inline(node: Any, defs: dict[str, Any], depth: int = 0) -> Any:
    if depth > 32:
        raise ValueError("a tool schema's $refs nest more than 32 deep")
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs.get(str(node["$ref"]).rsplit("/", 1)[-1], {})
            merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            return _inline(merged, defs, depth + 1)
        return {k: _inline(v, defs, depth + 1) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs, depth + 1) for v in node]
    return node


def episode_tools(episode: EnvforgeEpisode) -> list[ToolDef]:
    """The env's tools as inspect tools bound to `episode` (and to no other)."""
    return [
        ToolDef(
            _tool_function(episode, name),
            name=name,
            description=tool.description.strip() or name,
            parameters=tool_params(tool.input_schema),
        )
        for name, tool in sorted(episode.env.tools.items())
    ]


def _tool_function(episode: EnvforgeEpisode, name: str) -> Any:
    async def execute(**arguments: Any) -> str:
        return await episode.call(name, arguments)

    execute.__name__ = name
    return execute


@solver
def envforge_agent(env_dir: str, user: str = UserName.SCRIPTED) -> Solver:
    """inspect's `react` agent on the sample's own envforge episode: the env's tools bound to it,
    and envforge's simulated user answering each turn with no tool call (`on_continue`)."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        loaded = _load(env_dir)
        task_id = str(state.metadata.get("task_id", state.sample_id))
        if task_id not in loaded.tasks:
            raise ValueError(f"env {loaded.env_tasks.env.name!r} has no task {task_id!r} to play")
        if state.uuid in _EPISODES:
            raise EpisodeStateError(f"sample {state.uuid} already has an episode")
        episode = EnvforgeEpisode(loaded, loaded.tasks[task_id], user)
        _EPISODES[state.uuid] = episode
        opening = await episode.open()
        for i, message in enumerate(state.messages):  # a model user opens in its own words
            if isinstance(message, ChatMessageUser):
                state.messages[i] = ChatMessageUser(content=opening)
                break

        async def on_continue(agent_state: AgentState) -> bool | str:
            message = agent_state.output.message
            if message.tool_calls:
                return True
            reply = await episode.said(message.text)
            return False if reply is None else reply

        agent = react(prompt=None, tools=episode_tools(episode), submit=False, on_continue=on_continue)
        try:
            return await as_solver(agent)(state, generate)
        finally:
            episode.status = "ended"

    return solve


@scorer(metrics=[mean(), stderr()])
def envforge_scorer() -> Scorer:
    """envforge's composed reward of the sample's episode (`HarnessRolloutEnv`'s verdict), its
    parts in the Score's metadata and explanation."""

    async def score(state: TaskState, target: Target) -> Score:
        episode = _EPISODES.get(state.uuid)
        if episode is None:
            raise EpisodeStateError(
                f"no envforge episode for sample {state.sample_id!r}: envforge's scorer scores the episode "
                "envforge_agent played in this run (a log cannot be re-scored)"
            )
        verdict = await episode.finish()
        parts = ", ".join(f"{name} {value:g}" for name, value in sorted(verdict.parts.items()))
        explanation = f"envforge reward {verdict.reward:g} ({parts or 'no parts'})"
        if verdict.user_error:
            explanation += f"; the simulated user erred: {verdict.user_error_reason}"
        return Score(
            value=verdict.reward,
            answer="\n".join(episode.agent_messages),
            explanation=explanation,
            metadata={
                "env": episode.env.name,
                "task_id": episode.task.id,
                "parts": dict(verdict.parts),
                "user_error": verdict.user_error,
                "user_error_reason": verdict.user_error_reason,
            },
        )

    return score


async def _cleanup(state: TaskState) -> None:
    """After the sample's solver and scorer (or its error): its episode is closed and forgotten."""
    episode = _EPISODES.pop(state.uuid, None)
    if episode is not None:
        if episode.status == "playing":
            episode.status = "ended"
        await episode.close()


def envforge_task(
    env_dir: str | Path,
    split: str | None = None,
    limit: int | None = None,
    task_ids: Sequence[str] | None = None,
    user: str = UserName.SCRIPTED,
    message_limit: int = MESSAGE_LIMIT,
) -> Task:
    """The env folder's tasks as one inspect `Task` (those in `split` where given, the first
    `limit` where given, or exactly `task_ids`), played by `envforge_agent` against envforge's
    simulated user (`user`: "scripted", or a litellm model string) and scored by
    `envforge_scorer`. Raises ValueError, one line, for a folder with nothing to play."""
    loaded = _load(env_dir)
    env = loaded.env_tasks.env
    if task_ids is not None:
        unknown = [t for t in task_ids if t not in loaded.tasks]
        if unknown:
            raise ValueError(f"env {env.name!r} has no task {unknown[0]!r}")
        chosen = [loaded.tasks[t] for t in task_ids]
    else:
        chosen = [t for t in loaded.tasks.values() if split is None or split in t.split]
    chosen = chosen[:limit]
    if not chosen:
        raise ValueError(f"env {env.name!r} has no task in split {split!r}")
    samples = [
        Sample(
            input=[ChatMessageSystem(content=env.policy.strip()), ChatMessageUser(content=request_text(t))],
            target=list(t.required_outputs),
            id=t.id,
            metadata={"env": env.name, "task_id": t.id},
        )
        for t in chosen
    ]
    return Task(
        dataset=samples,
        solver=envforge_agent(str(loaded.env_tasks.env_dir), user=user),
        scorer=envforge_scorer(),
        cleanup=_cleanup,
        message_limit=message_limit,
        name=env.name,
        metadata={"env": env.name, "env_dir": str(loaded.env_tasks.env_dir), "user": user},
    )


@task
def env_task(
    env_dir: str, split: str | None = None, limit: int | None = None, user: str = UserName.SCRIPTED
) -> Task:
    """Any env folder's tasks: `inspect eval envforge/env_task -T env_dir=PATH`."""
    return envforge_task(env_dir, split=split, limit=limit, user=user)


def bundled_envs(root: Path = REPO / "envs") -> dict[str, Path]:
    """The env folders of the checkout's `envs/` that have tasks, by env name (read from env.toml,
    without loading the env)."""
    found: dict[str, Path] = {}
    if not root.is_dir():
        return found
    for manifest in sorted(root.glob("*/env.toml")):
        if not (manifest.parent / "tasks.jsonl").exists():
            continue
        try:
            name = str(tomllib.loads(manifest.read_text(encoding="utf-8"))["name"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            continue
        found.setdefault(name, manifest.parent)
    return found


def _register_bundled() -> None:
    """`envforge/<env>` for each bundled env: inspect names a task of an installed package by the
    package and the name it was registered under."""
    for name, root in bundled_envs().items():
        task(name=name)(_bundled_task(name, root))


def _bundled_task(name: str, root: Path) -> Any:
    def make(split: str | None = None, limit: int | None = None, user: str = UserName.SCRIPTED) -> Task:
        return envforge_task(root, split=split, limit=limit, user=user)

    make.__name__ = make.__qualname__ = name
    make.__doc__ = f"The tasks of the env folder envs/{root.name}/."
    return make


_register_bundled()
