"""A minimal rollout loop over the fleet: the policy writes tool calls, MCP executes them, a scorer rewards.

The loop talks to environments only through the small `RolloutEnv`/`RolloutEpisode` protocols, so the
evaluation harness can later supply episodes with simulated users and its own scoring (and flag
`user_error`) without the trainer changing. `FleetRolloutEnv` is the built-in one: a single user turn
(the task's instruction), tools over in-process MCP, reward from synth's `compose_reward` (the parts
of the task's reward basis) or a given function.

With no simulated user, an env's declared policy rules (`policy_rules.toml`) are kept or broken
as in the harness, with one exception that no agent could meet: the user's yes before a write.
So `FleetRolloutEnv` refuses a task whose writes fall under the env's confirmation rule
(`NeedsUser`: play it with `--env-kind harness`), as it refuses a dual-control task whose user
must act on their own device, and judges the `policy` part on every other
rollout of such an env from what happened: the opening, the calls with their results, the
policy's texts. Lookup tasks are reads, which no identity, confirmation or lookup rule covers;
there the part still catches a forbidden call or a transfer the policy does not allow.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NamedTuple, Protocol

import anyio
from pydantic import BaseModel, Field

from envforge.harness import MalformedToolCall, parse_tool_calls
from envforge.server import Environment, EpisodeClient, State
from envforge.synth import (
    Call,
    Evidence,
    PartScore,
    PolicyRules,
    RewardPart,
    Step,
    Task,
    apply_diff,
    compose_reward,
    judge_env_assertions,
    load_policy_rules,
    primary_keys,
    shown_results,
)

from .backends import GenerationBackend
from .remote_fleet import EpisodeFleet, open_episode_client
from .trajectory import SequenceBuilder, TokenizerLike, Trajectory


class RewardInfo(BaseModel):
    reward: float
    parts: dict[str, float] = Field(default_factory=dict)
    user_error: bool = False
    user_error_reason: str | None = None
    injected_user_error: str | None = None
    """The user error the simulated user was made to commit (`--user-error-rate`), else None."""


class ToolOutcome(NamedTuple):
    """What a tool call gave the policy: the result's text, and whether it was an error."""

    text: str
    is_error: bool


class RolloutEpisode(Protocol):
    def initial_messages(self) -> list[dict[str, str]]: ...

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolOutcome: ...

    async def user_reply(self, assistant_text: str) -> str | None:
        """The user's next message, or None when the conversation is over."""
        ...

    async def finish(self, agent_messages: list[str]) -> RewardInfo: ...


class RolloutEnv(Protocol):
    name: str

    def task_ids(self) -> list[str]: ...

    def tool_names(self) -> list[str]: ...

    def episode(self, task_id: str) -> AbstractAsyncContextManager[RolloutEpisode]: ...


RewardFn = Callable[[Task, State, list[str]], tuple[float, dict[str, float]]]


class _FleetEpisode:
    def __init__(
        self, env: FleetRolloutEnv, task: Task, episode_id: str, client: EpisodeClient | None
    ) -> None:
        self.env, self.task, self.episode_id, self.client = env, task, episode_id, client
        self.calls: list[Call] = []  # every call the policy made, for the `actions` reward part
        self.opening = task.scenario.without_answers()
        self.results: list[tuple[str, dict[str, Any], str]] = []  # each call's tool, arguments, result
        # The episode as the policy part reads it: the opening, each call with its result, each text.
        self.steps: list[Step] = [Step("user", self.opening)]

    def initial_messages(self) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.env.system_prompt()},
            {"role": "user", "content": self.opening},
        ]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        self.calls.append(Call(name=name, arguments=arguments))
        if self.client is not None:
            result = await self.client.call_tool(name, arguments)
        else:
            result = await self.env.fleet.call(self.episode_id, name, arguments)
        self.results.append((name, arguments, result.text))
        self.steps.append(Step("call", result.text, self.calls[-1], result.is_error))
        return ToolOutcome(result.text, result.is_error)

    async def user_reply(self, assistant_text: str) -> str | None:
        self.steps.append(Step("agent", assistant_text))
        return None

    def shown(self) -> list[str]:
        """What the policy was shown: its opening, and what the task's own calls showed it."""
        return [self.opening, *shown_results(self.task, self.results)]

    async def finish(self, agent_messages: list[str]) -> RewardInfo:
        state = await self.env.fleet.export_state(self.episode_id)
        if self.env.reward_fn is not None:
            reward, parts = self.env.reward_fn(self.task, state, agent_messages)
            return RewardInfo(reward=reward, parts=parts)
        policy = self.env.policy
        verdicts: dict[RewardPart, PartScore] = {}
        if self.task.env_assertions:  # the env's check tools judge the end state, as `score` does
            verdicts[RewardPart.ENV_ASSERTIONS] = await judge_env_assertions(self.env._env, self.task, state)
        evidence = Evidence(
            state,
            agent_messages,
            self.shown,
            self.env.keys,
            agent_calls=self.calls,
            policy=policy,
            trajectory=self.steps if policy is not None else None,
            verdicts=verdicts,
        )
        composed = compose_reward(self.task, evidence)
        return RewardInfo(reward=composed.value, parts={str(p): s.value for p, s in composed.parts.items()})


class NeedsUser(ValueError):
    """Tasks whose writes the env's policy wants the user's yes for, given to a rollout with no user."""


class FleetRolloutEnv:
    """Tasks of one env of a fleet, played through in-process MCP (or the runtime directly).

    Raises `NeedsUser` for tasks that write under the env's confirmation rule (module docstring),
    and for dual-control tasks whose gold has the user act on their own device (τ² telecom): with
    no user those calls never happen, so such a task could only ever score 0.
    """

    def __init__(
        self,
        fleet: EpisodeFleet,
        env_name: str,
        tasks: Sequence[Task],
        *,
        reward_fn: RewardFn | None = None,
        use_mcp: bool = True,
    ) -> None:
        self.fleet = fleet
        self.name = env_name
        self.tasks = {t.id: t for t in tasks if t.env == env_name}
        self.reward_fn = reward_fn
        self.use_mcp = use_mcp
        self._env = fleet.env(env_name)
        self.keys = primary_keys(self._env.tables)
        self.policy: PolicyRules | None = load_policy_rules(self._env)
        policy = self.policy
        if policy is not None:
            confirming = sorted(
                t.id
                for t in self.tasks.values()
                if any(policy.needs_confirmation(c.name) for c in t.golden_calls)
            )
            if confirming:
                raise NeedsUser(
                    f"env {env_name!r}: {len(confirming)} of {len(self.tasks)} tasks (first {confirming[0]}) "
                    "write under its policy's confirmation rule, which a rollout with no user cannot keep; "
                    "play them with a simulated user (--env-kind harness)"
                )
        acting = sorted(t.id for t in self.tasks.values() if t.user_calls)
        if acting:
            raise NeedsUser(
                f"env {env_name!r}: {len(acting)} of {len(self.tasks)} tasks (first {acting[0]}) need the "
                "user to act on their own device (dual control), which a rollout with no user cannot do; "
                "play them with a simulated user (--env-kind harness)"
            )

    def task_ids(self) -> list[str]:
        return sorted(self.tasks)

    def tool_names(self) -> list[str]:
        return sorted(self._env.tools)

    def system_prompt(self) -> str:
        return policy_prompt(self._env)

    @asynccontextmanager
    async def episode(self, task_id: str) -> AsyncIterator[_FleetEpisode]:
        task = self.tasks[task_id]
        state = apply_diff(self.keys, self._env.seed_state(), task.setup) if task.setup else None
        ep = await self.fleet.create_episode(self.name, state=state)
        try:
            if self.use_mcp:
                async with open_episode_client(self.fleet, self.name, ep.id) as client:
                    yield _FleetEpisode(self, task, ep.id, client)
            else:
                yield _FleetEpisode(self, task, ep.id, None)
        finally:
            await self.fleet.close_episode(ep.id)


CALL_FORMAT = (
    "To call a tool, write only the call, in Qwen/Hermes tags:\n"
    '<tool_call>{"name": "<tool name>", "arguments": {"<parameter>": "<value>"}}</tool_call>\n'
    "The result comes back to you; then answer the user."
)
"""How a call is written: the `<tool_call>` form Qwen models are trained on (and the harness parses);
`name {json}` stays accepted."""


def policy_prompt(env: Environment) -> str:
    """The policy and one compact line per tool (`name(param: type, ...): summary`), then how to
    call one (`CALL_FORMAT`): the system prompt of every trainer episode, single-turn or with a user.
    On CPU the prompt is most of a turn's cost, and full JSON schemas triple it for a small model
    that reads them no better: shown `name {"param": {"description": ..., "type": ...}}`,
    Qwen2.5-Coder-0.5B copied the schema as the call's arguments."""
    tools = "\n".join(
        f"- {s.name}({_params(s.input_schema)}): {s.description.splitlines()[0]}" for s in env.tools.values()
    )
    return f"{env.policy.strip()}\n\nTools:\n{tools}\n\n{CALL_FORMAT}"


def _params(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    out = []
    for name, prop in schema.get("properties", {}).items():
        kinds = [prop.get("type")] if "type" in prop else [k.get("type") for k in prop.get("anyOf", [])]
        kind = "|".join(str(k) for k in kinds if k and k != "null") or "any"
        if "enum" in prop or any("enum" in k for k in prop.get("anyOf", [])):
            values = prop.get("enum") or next(k["enum"] for k in prop["anyOf"] if "enum" in k)
            kind = "|".join(json.dumps(v) for v in values)
        out.append(f"{name}: {kind}" if name in required else f"{name}?: {kind}")
    return ", ".join(out)


_TAGGED = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_TAG = re.compile(r"</?tool_call>")
_PLAIN = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(\{.*\})?\s*$", re.S)


class ParsedCall(NamedTuple):
    """A tool call read from the policy's text."""

    name: str
    arguments: dict[str, Any]


def parse_tool_call(text: str, tool_names: Sequence[str]) -> ParsedCall | None:
    """`<tool_call>{"name":..., "arguments":...}</tool_call>` or `name {json}` / bare `name`; else None.

    Word-level tokenizers decode with spaces between tokens, so JSON is parsed after removing the
    spaces a decoder may have put around punctuation only when plain parsing fails. JSON nested
    deeper than the decoder recurses is no call: the text is the policy's, and a RecursionError
    here stopped the rollout (envforge's, and trl's through `read_tool_calls_as_envforge`).
    """
    try:
        return _parse_tool_call(text, tool_names)
    except RecursionError:
        return None


def _parse_tool_call(text: str, tool_names: Sequence[str]) -> ParsedCall | None:
    m = _TAGGED.search(text)
    if m:
        try:
            obj = json.loads(m.group(1))
            return ParsedCall(str(obj["name"]), dict(obj.get("arguments") or {}))
        except (ValueError, KeyError, TypeError):
            return None
    m = _PLAIN.match(text)
    if not m or m.group(1) not in tool_names:
        return _model_form(text)
    if not m.group(2):
        return ParsedCall(m.group(1), {})
    try:
        args = json.loads(m.group(2))
    except ValueError:
        return None
    return ParsedCall(m.group(1), args) if isinstance(args, dict) else None


def _model_form(text: str) -> ParsedCall | None:
    """The first call in the other forms real models write (SmolLM2's `<tool_call>[{...}]</tool_call>`
    list, Qwen's bare or ```json-fenced object), read by the harness's parser, so a call counts in
    training exactly when it would in `envforge eval`."""
    try:
        _, calls = parse_tool_calls(text)
    except MalformedToolCall:  # e.g. a list inside the tags, which the harness reads untagged only
        try:
            _, calls = parse_tool_calls(_TAG.sub("", text))
        except MalformedToolCall:
            return None
    return ParsedCall(calls[0].name, dict(calls[0].arguments)) if calls else None


class RolloutConfig(BaseModel):
    max_turns: int = 4
    max_new_tokens: int = 64
    max_seq_len: int = 4096


class PromptTooLong(ValueError):
    """A task whose opening (the system prompt and the first user turn) leaves no room for one
    turn under the rollout's `max_seq_len`: no token could be generated, so the episode would be
    a zero reward that measured nothing (τ² telecom's policy and manual are ~6,500 tokens)."""


async def rollout(
    env: RolloutEnv,
    task_id: str,
    backend: GenerationBackend,
    tokenizer: TokenizerLike,
    config: RolloutConfig,
    *,
    group: int = 0,
    seed: int | None = None,
) -> Trajectory:
    """Play one episode; every assistant token comes from `backend` and is kept verbatim.

    With `seed`, turn k samples with seed `seed + k`: the same weights play the same episode, which
    is what makes held-out evaluations of two runs comparable sample for sample.
    """
    started = time.time()
    builder = SequenceBuilder(tokenizer)
    version = backend.version
    messages: list[dict[str, Any]] = []
    agent_messages: list[str] = []
    tools = env.tool_names()
    async with backend.session() as session, env.episode(task_id) as ep:
        for msg in ep.initial_messages():
            builder.add_message(msg["role"], msg["content"])
            messages.append(msg)
        for turn in range(config.max_turns):
            if len(builder.token_ids) + config.max_new_tokens > config.max_seq_len:
                if turn == 0:
                    raise PromptTooLong(
                        f"task {task_id} of env {env.name}: its opening is {len(builder.token_ids)} "
                        f"tokens, which with {config.max_new_tokens} new tokens passes the rollout's "
                        f"{config.max_seq_len}-token limit: no turn could be generated (raise --max-seq-len)"
                    )
                break
            builder.open_assistant()
            gen = await backend.generate(
                builder.token_ids,
                max_new_tokens=config.max_new_tokens,
                seed=None if seed is None else seed + turn,
                session=session,
            )
            version = min(version, gen.version)
            builder.add_generated(gen.token_ids, gen.logprobs)
            ended = bool(gen.token_ids) and gen.token_ids[-1] == backend.eos_id
            builder.close_assistant(ended)
            text = tokenizer.decode(gen.token_ids, skip_special_tokens=True).strip()
            call = parse_tool_call(text, tools)
            messages.append({"role": "assistant", "content": text})
            if call is None:
                agent_messages.append(text)
                reply = await ep.user_reply(text)
                if reply is None:
                    break
                builder.add_message("user", reply)
                messages.append({"role": "user", "content": reply})
                continue
            result, is_error = await ep.call_tool(*call)
            builder.add_message("tool", result)
            messages.append({"role": "tool", "content": result, "is_error": is_error})
        info = await ep.finish(agent_messages)
    return Trajectory(
        env=env.name,
        task_id=task_id,
        group=group,
        token_ids=builder.token_ids,
        logprobs=builder.logprobs,
        loss_mask=builder.loss_mask,
        reward=info.reward,
        parts=info.parts,
        user_error=info.user_error,
        user_error_reason=info.user_error_reason,
        injected_user_error=info.injected_user_error,
        policy_version=version,
        messages=messages,
        started_at=started,
        finished_at=time.time(),
    )


async def rollout_group(
    env: RolloutEnv,
    task_id: str,
    backend: GenerationBackend,
    tokenizer: TokenizerLike,
    config: RolloutConfig,
    n: int,
    *,
    group: int = 0,
) -> list[Trajectory]:
    """`n` concurrent rollouts of one task (a GRPO group)."""
    out: list[Trajectory | None] = [None] * n

    async def one(i: int) -> None:
        out[i] = await rollout(env, task_id, backend, tokenizer, config, group=group)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return [t for t in out if t is not None]
