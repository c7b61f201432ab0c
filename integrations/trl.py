"""envforge environments inside trl's `GRPOTrainer`, through its `environment_factory` contract.

    from envforge.integrations.trl import environments
    envs = environments(["envs/car_rental", "envs/gym"], split="train", erpo=True)
    trainer = GRPOTrainer(model, args, train_dataset=envs.dataset,
                          processing_class=read_tool_calls_as_envforge(tokenizer),
                          environment_factory=envs.environment_factory, reward_funcs=envs.reward_funcs)

What trl sees (trl 1.16, `trl/trainer/grpo_trainer.py`): a dataset row per task (the prompt as a
conversation, an `environment` column naming the env, the `task_id`); per env, a factory of
instances, one per rollout, pooled and reused by trl, each `reset(**row)` before its rollout; the
instance's public methods are the tools, their JSON schemas read by transformers' `get_json_schema`
off the signatures and Google-style docstrings, which are built here from the env's own schemas and
descriptions; the reward functions are called with the prompts, the completions and
`environments=` (the rollouts' instances).

Each instance holds one envforge episode of an in-process `Fleet` (the runtime that synthesis,
scoring and envforge's own trainer use), at its task's initial state; its tools reach that episode
only, and the episode is scored once, by envforge's composer (the trainer's `FleetRolloutEnv`,
the same one `envforge train` plays: state match, required outputs, the env's declared policy),
from the end state, the calls made and the model's final texts. After the score the episode is
closed: a later tool call on that instance is refused until the next `reset`.

What trl's loop cannot express: a conversation with a simulated user. trl generates from one
prompt, and the only other turns are tool results; there is no user turn for the model to ask a
question in or to receive an answer from. So the user's whole request is given up front (the
task's instruction less its answers line, as `envforge train`'s no-user rollouts open), and the
episode is scored exactly as `envforge score` scores the same calls and messages. A task whose
writes the env's policy lets happen only after the user's yes cannot be played that way (no agent
could keep the rule with no user to say yes): those tasks are left out of the dataset, listed in
`TrlEnvironments.left_out`, rather than scored as broken policy or with the rule dropped. They need
a multi-turn loop with envforge's simulated user (`envforge train --env-kind harness`).
"""

from __future__ import annotations

import inspect
import json
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio.from_thread

from envforge.server import Environment, Fleet, load_env
from envforge.synth import Task, load_policy_rules, load_tasks
from envforge.trainer import FleetRolloutEnv, RewardInfo, parse_tool_call, unbiased_std

ERPO_EPS = 1e-6
"""The eps of ERPO's env-level std (`envforge.trainer.erpo_advantages`'s default)."""

RESERVED = frozenset({"reset", "get_reward"})
"""Method names trl gives a meaning of its own; a tool so named could not be exposed."""

RewardFunc = Callable[..., list[float | None]]


class EpisodeStateError(RuntimeError):
    """A tool call or a reward asked of an instance whose episode is not open (no `reset` yet, or
    already scored)."""


class _Runtime:
    """The fleet all instances share, living on an event loop in a thread of its own: trl calls
    `reset`, the tools and the reward functions from synchronous code, and the episodes' databases
    belong to one loop."""

    def __init__(self, envs: Sequence[Environment], tasks: dict[str, list[Task]]) -> None:
        self._stack = ExitStack()
        self.portal = self._stack.enter_context(anyio.from_thread.start_blocking_portal())
        try:
            self.fleet = self._stack.enter_context(self.portal.wrap_async_context_manager(Fleet(envs)))
            self.rollout_envs = {
                env.name: FleetRolloutEnv(self.fleet, env.name, tasks[env.name], use_mcp=False)
                for env in envs
            }
        except BaseException:
            self._stack.close()
            raise
        self._lock = threading.Lock()
        self.closed = False
        # held strongly: an instance trl drops mid-rollout still has its episode closed here
        # (a weak set forgot it, and closing the fleet then waited forever on that episode)
        self.open_episodes: set[EnvforgeEpisode] = set()

    def close(self) -> None:
        """Close the episodes still open (each waits in the portal for its exit), then the fleet."""
        with self._lock:
            if not self.closed:
                for instance in list(self.open_episodes):
                    instance._close()
                self.closed = True
                self._stack.close()


class EnvforgeEpisode:
    """One rollout's envforge episode, as trl's environment instance; each env gets a subclass
    whose public methods are its tools (`_env_class`). Everything else here is private: trl
    exposes every public method to the model."""

    _runtime: _Runtime
    _env_name: str

    def __init__(self) -> None:
        self._scope: AbstractContextManager[Any] | None = None
        self._episode: Any = None
        self._task_id: str | None = None
        self._verdict: RewardInfo | None = None

    def reset(self, task_id: str, **_row: Any) -> None:
        """Open a fresh episode of `task_id` at its initial state (the previous one is closed).
        The other columns of the row (the prompt) are trl's: the prompt already holds the request."""
        self._close()
        rollout_env = self._runtime.rollout_envs[self._env_name]
        if task_id not in rollout_env.tasks:
            raise ValueError(f"env {self._env_name!r} has no task {task_id!r} to play")
        scope = self._runtime.portal.wrap_async_context_manager(rollout_env.episode(task_id))
        self._episode = scope.__enter__()
        self._scope, self._task_id, self._verdict = scope, task_id, None
        self._runtime.open_episodes.add(self)

    @property
    def verdict(self) -> RewardInfo | None:
        """The episode's score with its parts, once the reward was asked (a property: trl exposes
        functions only, so the model cannot call it)."""
        return self._verdict

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call in this instance's own episode; the text is what an agent over MCP
        would read (a refused or invalid call says why, as envforge's runtime words it)."""
        if self._verdict is not None:
            raise EpisodeStateError(f"the episode of {self._task_id} was scored: reset() starts the next")
        if self._episode is None:
            raise EpisodeStateError("no episode is open: trl calls reset(**row) before a rollout")
        outcome = self._runtime.portal.call(self._episode.call_tool, name, arguments)
        return str(outcome.text)

    def _finish(self, agent_messages: Sequence[str]) -> RewardInfo:
        """Score the episode once (later asks get the same verdict) and close it."""
        if self._verdict is not None:
            return self._verdict
        if self._episode is None:
            raise EpisodeStateError(
                "reward asked of an instance with no episode: reset(**row) and a rollout come first"
            )
        episode = self._episode
        for text in agent_messages:
            self._runtime.portal.call(episode.user_reply, text)
        verdict: RewardInfo = self._runtime.portal.call(episode.finish, list(agent_messages))
        self._close()
        self._verdict = verdict
        return verdict

    def _close(self) -> None:
        scope, self._scope, self._episode = self._scope, None, None
        self._runtime.open_episodes.discard(self)
        if scope is not None and not self._runtime.closed:
            scope.__exit__(None, None, None)


def read_tool_calls_as_envforge(tokenizer: Any) -> Any:
    """`tokenizer`, made to read the model's tool calls as envforge's rollout reads them.

    trl finds a call with the tokenizer's `parse_response`, which for Qwen2.5's template reads only
    `<tool_call>` tags. Small models often call without them: Qwen2.5-Coder-0.5B writes a bare or
    ```json-fenced object, which `envforge train` and `envforge eval` execute and trl would take
    for a final answer, so trl's episodes would make no calls and earn nothing. Here a turn is a
    call exactly when `envforge.trainer.parse_tool_call` finds one in its text (the first, one per
    turn, as the rollout plays it), and the reward then scores the same episodes both trainers
    would play. Returns the same tokenizer object, its `parse_response` replaced."""

    def parse_response(
        response: Any, schema: Any = None, prefix: Any = None, tools: Sequence[Any] | None = None
    ) -> dict[str, Any]:
        text = response if isinstance(response, str) else tokenizer.decode(response, skip_special_tokens=True)
        names = [_tool_name(t) for t in tools or ()]
        call = parse_tool_call(text, names)
        if call is None:
            return {"role": "assistant", "content": text}
        function = {"name": call.name, "arguments": call.arguments}
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": function}],
        }

    tokenizer.parse_response = parse_response
    if getattr(tokenizer, "response_template", None) is None:
        # trl parses with `parse_response` only when the tokenizer declares a response format, and
        # would otherwise set its own; this one says which reader is in charge
        tokenizer.response_template = {"reader": "envforge.trainer.parse_tool_call"}
    return tokenizer


def _tool_name(tool: Any) -> str:
    if isinstance(tool, Mapping):
        function = tool.get("function", tool)
        return str(function.get("name", ""))
    return str(getattr(tool, "__name__", ""))


def agent_messages(completion: Any) -> list[str]:
    """What the model said to the user in a completion: its assistant texts other than tool calls
    (a text that came with tool calls is the call's preamble, as envforge's rollout reads it)."""
    if isinstance(completion, str):
        return [completion.strip()] if completion.strip() else []
    out = []
    for message in completion:
        if message.get("role") == "assistant" and not message.get("tool_calls"):
            content = message.get("content")
            text = content if isinstance(content, str) else _text_parts(content)
            if text.strip():
                out.append(text.strip())
    return out


def _text_parts(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")


def erpo_rewards(
    rewards: Sequence[float | None], envs: Sequence[str], eps: float = ERPO_EPS
) -> list[float | None]:
    """ERPO's rewards for trl's GRPO with `scale_rewards="none"`: each kept reward over its env's
    std of kept rewards in the batch (plus eps); a masked (user-error) one stays `None`, which trl
    leaves out of its group mean and gives advantage 0 (tests/trainer/test_trainer_trl.py)."""
    kept: dict[str, list[float]] = defaultdict(list)
    for reward, env in zip(rewards, envs, strict=True):
        if reward is not None:
            kept[env].append(reward)
    scale = {env: unbiased_std(xs) + eps for env, xs in kept.items()}
    return [None if r is None else r / scale[e] for r, e in zip(rewards, envs, strict=True)]


@dataclass
class TrlEnvironments:
    """What goes into `GRPOTrainer`: `dataset`, `environment_factory` and `reward_funcs`; `left_out`
    holds, per env, the tasks trl's single-prompt loop cannot play (module docstring). `close()`
    (or a `with` block) ends the fleet; it also ends with the process."""

    dataset: Any
    environment_factory: dict[str, Callable[[], EnvforgeEpisode]]
    reward_funcs: list[RewardFunc]
    left_out: dict[str, list[str]] = field(default_factory=dict)
    _runtime: _Runtime | None = None

    def close(self) -> None:
        if self._runtime is not None:
            self._runtime.close()

    def __enter__(self) -> TrlEnvironments:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def environments(
    env_dirs: Iterable[str | Path],
    split: str | None = None,
    limit: int | None = None,
    erpo: bool = False,
    tasks: Mapping[str, Sequence[Task]] | None = None,
) -> TrlEnvironments:
    """The tasks of the envs in `env_dirs` (each folder's `tasks.jsonl`; those in `split` where
    given, the first `limit` per env where given) as trl's dataset, environment factories and
    reward functions. `tasks` plays the given tasks of each env (keyed by env name) instead of its
    folder's file: a task set made from the env, as `envforge.trainer.lookup_tasks` makes.
    `erpo=True` makes the reward ERPO's (`erpo_rewards`): train with
    `GRPOConfig(scale_rewards="none")`. Raises ValueError, one line, for an env folder with no
    tasks trl can play, two envs of one name, or a tool trl could not expose."""
    from datasets import Dataset

    dirs = [Path(d) for d in env_dirs]
    if not dirs:
        raise ValueError("no env folders given")
    loaded = [load_env(d) for d in dirs]
    names = [env.name for env in loaded]
    if len(set(names)) != len(names):
        raise ValueError(f"two env folders hold an env of one name: {sorted(names)}")
    playable: dict[str, list[Task]] = {}
    left_out: dict[str, list[str]] = {}
    for env, root in zip(loaded, dirs, strict=True):
        given = _given_tasks(tasks, env.name, root)
        env_tasks = [t for t in given if t.env == env.name and (split is None or split in t.split)]
        policy = load_policy_rules(env)
        # trl's loop has no user: a task whose write needs the user's yes, or whose user must act
        # on their own device (dual control), cannot be played there and is left out, listed
        confirming = {
            t.id
            for t in env_tasks
            if policy is not None and any(policy.needs_confirmation(c.name) for c in t.golden_calls)
        }
        needs_user = confirming | {t.id for t in env_tasks if t.user_calls}
        if needs_user:
            left_out[env.name] = sorted(needs_user)
        kept = [t for t in env_tasks if t.id not in needs_user][:limit]
        if not kept:
            n = len(env_tasks)
            why = (
                (
                    f"all {n} need the user's yes before a write"
                    if needs_user == confirming
                    else f"all {n} need the user's yes before a write or the user to act on their device"
                )
                if n
                else "none in that split"
            )
            raise ValueError(f"env {env.name!r} ({root}) has no task trl can play: {why}")
        playable[env.name] = kept
        _check_tool_names(env)
    runtime = _Runtime(loaded, playable)
    try:
        factories = {env.name: _factory(_env_class(env, runtime)) for env in loaded}
        rows = [
            {
                "prompt": [
                    {"role": "system", "content": env.policy.strip()},
                    {"role": "user", "content": task.scenario.without_answers()},
                ],
                "environment": env.name,
                "task_id": task.id,
            }
            for env in loaded
            for task in playable[env.name]
        ]
        dataset = Dataset.from_list(rows)
    except BaseException:
        runtime.close()
        raise
    return TrlEnvironments(
        dataset=dataset,
        environment_factory=factories,
        reward_funcs=[_reward_func(erpo)],
        left_out=left_out,
        _runtime=runtime,
    )


def _given_tasks(tasks: Mapping[str, Sequence[Task]] | None, env_name: str, root: Path) -> list[Task]:
    """The tasks `environments` was handed for `env_name`, else its folder's `tasks.jsonl`."""
    if tasks is not None:
        if env_name not in tasks:
            raise ValueError(f"no tasks given for env {env_name!r} ({root}): tasks= names {sorted(tasks)}")
        return list(tasks[env_name])
    tasks_file = root / "tasks.jsonl"
    if not tasks_file.exists():
        raise ValueError(f"{tasks_file} is missing: synthesize tasks first (envforge synth tasks)")
    return load_tasks(root)


def _factory(cls: type[EnvforgeEpisode]) -> Callable[[], EnvforgeEpisode]:
    def make() -> EnvforgeEpisode:
        return cls()

    return make


def _reward_func(erpo: bool) -> RewardFunc:
    def envforge_reward(
        prompts: list[Any], completions: list[Any], environments: list[Any] | None = None, **_: Any
    ) -> list[float | None]:
        """envforge's composed reward of each finished rollout (ERPO-scaled with `erpo`)."""
        if environments is None:
            raise ValueError("envforge's reward needs trl's environment instances: pass environment_factory")
        verdicts: list[RewardInfo] = []
        for env, completion in zip(environments, completions, strict=True):
            if not isinstance(env, EnvforgeEpisode):
                raise TypeError(f"not an envforge environment: {type(env).__name__}")
            verdicts.append(env._finish(agent_messages(completion)))
        rewards = [None if v.user_error else v.reward for v in verdicts]
        if not erpo:
            return rewards
        return erpo_rewards(rewards, [env._env_name for env in environments])

    envforge_reward.__name__ = "envforge_erpo_reward" if erpo else "envforge_reward"
    return envforge_reward


_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _check_tool_names(env: Environment) -> None:
    for name, tool in env.tools.items():
        if not _IDENTIFIER.match(name) or name in RESERVED:
            raise ValueError(f"env {env.name!r}: trl cannot expose a tool named {name!r} as a method")
        for param in tool.input_schema.get("properties", {}):
            if not _IDENTIFIER.match(param) or param == "self":
                raise ValueError(
                    f"env {env.name!r}: tool {name!r} has a parameter trl cannot name: {param!r}"
                )


def _env_class(env: Environment, runtime: _Runtime) -> type[EnvforgeEpisode]:
    """A subclass of `EnvforgeEpisode` for `env`, one public method per tool."""
    members: dict[str, Any] = {"_runtime": runtime, "_env_name": env.name}
    for name, tool in sorted(env.tools.items()):
        members[name] = _tool_method(name, tool.description, tool.input_schema)
    class_name = "Envforge_" + re.sub(r"\W", "_", env.name)
    return type(class_name, (EnvforgeEpisode,), members)


def _tool_method(name: str, description: str, schema: dict[str, Any]) -> Callable[..., str]:
    """A method that calls tool `name` in the instance's episode, with the signature and docstring
    from which `get_json_schema` reads `schema` back: a parameter's type hint carries its type (an
    enum as a `Literal`, an optional one as `T | None`), the docstring's `Args:` its description.
    Nested objects become `dict[str, Any]`, their fields spelled out in the description.
    The arguments go to envforge as given: its runtime validates them, as over MCP."""

    def method(self: EnvforgeEpisode, **arguments: Any) -> str:
        return self._call(name, arguments)

    defs = schema.get("$defs", {})
    required = set(schema.get("required", []))
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    lines = []
    for pname, prop in schema.get("properties", {}).items():
        hint, extra = _hint(prop, defs)
        params.append(
            inspect.Parameter(
                pname,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=hint,
                default=inspect.Parameter.empty if pname in required else prop.get("default"),
            )
        )
        annotations[pname] = hint
        text = " ".join((prop.get("description") or prop.get("title") or pname).split())
        lines.append(f"    {pname}: {text}{extra}")
    annotations["return"] = str
    doc = _flat_description(description)
    if lines:
        doc += "\n\nArgs:\n" + "\n".join(lines)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = doc
    method.__annotations__ = annotations
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    return method


def _flat_description(description: str) -> str:
    """The tool's description, with lines that `get_json_schema` would read as a section of its own
    (`Args:`, `Returns:`, `Raises:`) kept as text."""
    lines = [ln.rstrip() for ln in description.strip().splitlines()] or ["(no description)"]
    return "\n".join(re.sub(r"^(\s*)(Args|Returns|Raises):", r"\1\2 -", ln) for ln in lines)


_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}


def _hint(prop: dict[str, Any], defs: dict[str, Any]) -> tuple[Any, str]:
    """(type hint, text to add to the description) for one JSON-schema property."""
    if "$ref" in prop:
        return _hint(defs.get(str(prop["$ref"]).rsplit("/", 1)[-1], {}), defs)
    variants = prop.get("anyOf")
    if isinstance(variants, list):
        kept = [v for v in variants if v.get("type") != "null"]
        if len(kept) == 1:
            hint, extra = _hint(kept[0], defs)
            return (hint | None if len(kept) < len(variants) else hint), extra
        return Any, ""
    if "enum" in prop and all(isinstance(v, (str, int, float, bool)) for v in prop["enum"]):
        return Literal.__getitem__(tuple(prop["enum"])), ""
    kind = prop.get("type")
    if kind in _SCALARS:
        return _SCALARS[kind], ""
    if kind == "array":
        item, extra = _hint(prop.get("items", {}), defs)
        return list[item], extra  # type: ignore[valid-type]
    if kind == "object" or "properties" in prop:
        fields = prop.get("properties", {})
        if not fields:
            return dict[str, Any], ""
        shown = ", ".join(
            f"{k} ({_kind_name(v, defs)}{', required' if k in prop.get('required', []) else ''})"
            for k, v in fields.items()
        )
        return dict[str, Any], f" (an object with fields: {shown})"
    return Any, ""


def _kind_name(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return "object"
    if "enum" in prop:
        return "one of " + "|".join(json.dumps(v) for v in prop["enum"])
    return str(prop.get("type", "any"))
