"""Agents: what the harness evaluates. One async method, so a user can plug in anything.

`Agent.respond` gets the conversation so far, the env's tools in OpenAI format and the episode's
MCP client, and returns its next assistant message: tool calls (the orchestrator executes them
through MCP and asks again) or text (said to the user). A fresh agent is built per trial
(`build_agent`), so agents may keep per-trial state without locks.

Built-ins: `oracle` (the task's golden calls, then its required outputs: the upper bound that
proves a task is solvable through MCP), `noop` (answers without tools: the floor), `random`
(schema-valid random calls, seeded: a sanity baseline), the adversarial agents of
`synth/checks/adversaries.py` (`spray`, `read_all`, `double_write`, `golden_prefix`, `skip_policy`:
tricks a task's reward must not pay for, to probe any task set with `eval`), and any litellm
model string. The oracle keeps the env's declared policy rules (identity check, lookups, the
user's yes before each write).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import mcp_types as types

from envforge.server import EpisodeClient
from envforge.synth import (
    ADVERSARIES,
    Call,
    PolicyRules,
    Step,
    Task,
    ToolShape,
    adversary_calls,
    adversary_message,
    identity_call,
    looked_up,
    names_only,
    says_yes,
)

from .llm import LLMConfig, complete, to_openai
from .records import Message, ToolCall, Usage
from .user_tools import user_action_request
from .users import confirmation_request
from .vocab import AgentName

BUILTIN_AGENTS: tuple[AgentName, ...] = tuple(AgentName)


@dataclass
class AgentReply:
    """The agent's next message plus what producing it cost (zero for agents without a model)."""

    message: Message
    usage: Usage = field(default_factory=Usage)


@runtime_checkable
class Agent(Protocol):
    async def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], client: EpisodeClient
    ) -> AgentReply | Message: ...


def openai_tools(tools: list[types.Tool]) -> list[dict[str, Any]]:
    """MCP tool definitions as OpenAI function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description or "",
                "parameters": t.input_schema or {"type": "object", "properties": {}},
            },
        }
        for t in tools
    ]


def _say(text: str) -> Message:
    return Message(role="assistant", content=text)


class OracleAgent:
    """The task's golden calls in order (one per step), then its required outputs; following the
    env's declared policy (`rules`) on the way, so the upper bound is an agent that keeps it.

    Where a write of the task needs the principal verified, the oracle verifies it before its
    first call (the policies say: before looking at anything) with the first declared identity
    tool the user's facts can fill (`identity_call`), and the next tool or fact value (a second
    email) if that did not verify;
    it never reads the principal's records to learn how (synthesis gives the user the facts the
    identity rule needs, `identity_facts`). Before a write the rules want looked up by a
    parameter, it reads the record with the declared lookup tool. Before a write the rules want
    confirmed, it sends `confirmation_request(call)` (the scripted user's format) and writes only
    when the user's reply says yes.

    A golden call the user makes (dual control: `requestor="user"`) is not the oracle's: it hands
    the run of them over with `user_action_request` and goes on once the user has answered (the
    scripted user plays that run, and never one it was not asked for).
    """

    def __init__(self, task: Task, rules: PolicyRules | None = None, *, solo: bool = False) -> None:
        self.task = task
        self.rules = rules
        self.solo = solo
        """τ²'s solo mode: the agent has the user's tools too and makes the user's calls itself."""
        self.next = 0
        self.made = 0
        self.verified = False
        self.looked: set[tuple[str, str]] = set()
        self.tried: set[str] = set()
        self.asked_at: int | None = None  # the golden call the last confirmation request was for
        self.pending: Call | None = None  # the oracle's own call whose result is next
        self.handed: int | None = None  # the golden index of the user's run last handed over

    def _call(self, call: Call) -> Message:
        self.made += 1
        self.pending = call
        return Message(
            role="assistant",
            tool_calls=[ToolCall(id=f"oracle_{self.made}", name=call.name, arguments=call.arguments)],
        )

    def _see(self, messages: list[Message]) -> None:
        """Learn from the result of the oracle's last call: verified, looked up."""
        call, self.pending = self.pending, None
        last = messages[-1] if messages else None
        if call is None or last is None or last.role != "tool" or self.rules is None:
            return
        step = Step("call", last.content or "", call, last.is_error)
        key = self._key()
        if key is not None and call.name in self.rules.identity_tools and names_only(step, *key):
            self.verified = True
        self.looked |= looked_up(self.rules, step)

    def _key(self) -> tuple[str, Any] | None:
        p = self.task.dag.principal
        return next(iter(p.key.items())) if p is not None and len(p.key) == 1 else None

    def _identity_call(self, tools: list[dict[str, Any]]) -> Call | None:
        """The next call towards verifying the principal from what the user knows (None: the
        oracle cannot, and goes on)."""
        if self._key() is None or self.rules is None:
            return None
        schemas = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
        facts = self.task.scenario.known_facts
        known = {f.name: f.value for f in facts}
        # A fact the user holds twice ("email", "email (2)"): each value is tried in turn.
        pools = [known, *({**known, f.name.split(" (")[0]: f.value} for f in facts if " (" in f.name)]
        for pool in pools:
            skip: set[str] = set()
            while (call := identity_call(self.rules, schemas, pool, skip=skip)) is not None:
                key = json.dumps([call.name, call.arguments], sort_keys=True, default=str)
                if key not in self.tried:
                    self.tried.add(key)
                    return call
                skip.add(call.name)
        return None

    def _before(self, call: Call, tools: list[dict[str, Any]]) -> Call | None:
        """A call the policy wants made before golden `call` (None: nothing more)."""
        rules = self.rules
        if rules is None:
            return None
        if not self.verified and any(rules.needs_identity(c.name) for c in self.task.golden_calls):
            identity = self._identity_call(tools)  # before anything else, reads included
            if identity is not None:
                return identity
        if call.name not in rules.writes:
            return None
        for rule in rules.declared.lookup:
            if rule.param in call.arguments:
                value = json.dumps(call.arguments[rule.param], sort_keys=True)
                if (rule.param, value) not in self.looked:
                    self.looked.add((rule.param, value))  # one try: a failed lookup is not retried
                    return Call(name=rule.tools[0], arguments={rule.param: call.arguments[rule.param]})
        return None

    def proposal(self, index: int, call: Call) -> str:
        """What the oracle says to ask for the yes to golden call `index` (`call`): the scripted
        user's own `confirmation_request`. A subclass proposing something else tests the rule."""
        return confirmation_request(call)

    async def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], client: EpisodeClient
    ) -> Message:
        self._see(messages)
        golden = self.task.golden_calls
        while self.next < len(golden):
            call = golden[self.next]
            if call.requestor == "user" and not self.solo:
                end = self.next
                while end < len(golden) and golden[end].requestor == "user":
                    end += 1
                if self.handed == self.next:  # the user has answered the hand-over: played it
                    self.next = end
                    continue
                self.handed = self.next
                return _say(user_action_request(golden[self.next : end]))
            before = self._before(call, tools)
            if before is not None:
                return self._call(before)
            if self.rules is not None and self.rules.needs_confirmation(call.name):
                if self.asked_at != self.next:
                    self.asked_at = self.next
                    return _say(self.proposal(self.next, call))
                reply = next((m.content or "" for m in reversed(messages) if m.role == "user"), "")
                if not says_yes(reply):
                    self.next += 1  # declined: the write is not made
                    continue
            self.next += 1
            return self._call(call)
        outputs = "; ".join(self.task.required_outputs)
        return _say(f"All done. {outputs}".strip())


class NoopAgent:
    """Never touches the environment: the reward floor every real agent must beat."""

    async def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], client: EpisodeClient
    ) -> Message:
        return _say("I am sorry, I cannot help with this request.")


_EXAMPLE = re.compile(r"such as '([^']+)'")
_ID = re.compile(r"\b[A-Z]{1,4}-\d+\b")


class RandomAgent:
    """`calls` random tool calls whose arguments satisfy the JSON schemas, then a closing message.

    String arguments come from ids seen earlier in the conversation or in the schema's own
    examples ("such as 'C-1001'"), so some calls hit real rows; everything is drawn from one
    `random.Random(seed)`, so a trial is reproducible.
    """

    def __init__(self, seed: int, calls: int = 3) -> None:
        self.rng = random.Random(seed)
        self.calls = calls
        self.made = 0

    def _value(self, name: str, schema: dict[str, Any], pool: list[str]) -> Any:
        if "anyOf" in schema:
            options = [s for s in schema["anyOf"] if s.get("type") != "null"] or schema["anyOf"]
            return self._value(name, self.rng.choice(options), pool)
        if "enum" in schema:
            return self.rng.choice(schema["enum"])
        kind = schema.get("type", "string")
        if kind == "integer":
            return self.rng.randint(max(1, int(schema.get("minimum", 1))), 3)
        if kind == "number":
            return round(self.rng.uniform(1, 100), 2)
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "array":
            return [self._value(name, schema.get("items", {"type": "string"}), pool)]
        if kind == "object":
            return {}
        examples = _EXAMPLE.findall(schema.get("description", ""))
        choices = pool + examples
        return self.rng.choice(choices) if choices else f"x{self.rng.randint(0, 999)}"

    async def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], client: EpisodeClient
    ) -> Message:
        if self.made >= self.calls or not tools:
            return _say("I have done what I could.")
        self.made += 1
        pool = sorted({i for m in messages for i in _ID.findall(m.content or "")})
        fn = self.rng.choice(tools)["function"]
        params = fn.get("parameters", {})
        props: dict[str, Any] = params.get("properties", {})
        required = set(params.get("required", []))
        args = {
            name: self._value(name, schema, pool)
            for name, schema in props.items()
            if name in required or self.rng.random() < 0.3
        }
        return Message(
            role="assistant", tool_calls=[ToolCall(id=f"random_{self.made}", name=fn["name"], arguments=args)]
        )


def tool_shape(tool: types.Tool) -> ToolShape:
    """What an adversary needs of an MCP tool: read-only or not (the server's `readOnlyHint`; a
    tool without the hint counts as a writer) and its parameters."""
    schema = tool.input_schema or {}
    params = tuple(schema.get("properties", {}))
    required = set(schema.get("required", []))
    read_only = bool(tool.annotations and tool.annotations.read_only_hint)
    return ToolShape(tool.name, read_only, params, tuple(p for p in params if p in required))


class AdversaryAgent:
    """An adversarial agent of `synth/checks/adversaries.py` played over MCP: its calls are planned from
    the task and the episode's tool list on the first step and made one per step; then its final
    message, from the tool results it got and the ids the conversation named (the entity ids an
    agent behind MCP can know)."""

    def __init__(self, name: str, task: Task, rules: PolicyRules | None = None) -> None:
        self.name = name
        self.task = task
        self.rules = rules
        self.calls: list[Call] | None = None
        self.made = 0

    async def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], client: EpisodeClient
    ) -> Message:
        if self.calls is None:
            self.calls = adversary_calls(
                self.name, self.task, [tool_shape(t) for t in await client.list_tools()], self.rules
            )
        if self.made < len(self.calls):
            call = self.calls[self.made]
            self.made += 1
            return Message(
                role="assistant",
                tool_calls=[
                    ToolCall(id=f"{self.name}_{self.made}", name=call.name, arguments=call.arguments)
                ],
            )
        results = [m.content or "" for m in messages if m.role == "tool"]
        ids = sorted({i for m in messages for i in _ID.findall(m.content or "")})
        return _say(adversary_message(self.name, self.task, results, ids))


class LLMAgent:
    """A model behind litellm with the env's policy as system prompt and the MCP tools as functions."""

    def __init__(self, cfg: LLMConfig, policy: str) -> None:
        self.cfg = cfg
        self.system = Message(role="system", content=policy)

    async def respond(
        self, messages: list[Message], tools: list[dict[str, Any]], client: EpisodeClient
    ) -> AgentReply:
        message, usage = await complete(self.cfg, to_openai([self.system, *messages]), tools=tools)
        return AgentReply(message, usage)


def build_agent(
    spec: str,
    task: Task,
    *,
    seed: int,
    policy: str,
    llm: LLMConfig | None = None,
    rules: PolicyRules | None = None,
    solo: bool = False,
) -> Agent:
    """A fresh agent for one trial: a built-in name, or a model (`llm` says how to reach it);
    `rules`, the env's declared policy rules, are what the oracle follows; `solo`: τ²'s solo mode
    (the oracle makes the user's golden calls itself)."""
    if spec == AgentName.ORACLE:
        return OracleAgent(task, rules, solo=solo)
    if spec == AgentName.NOOP:
        return NoopAgent()
    if spec == AgentName.RANDOM:
        return RandomAgent(seed)
    if spec in ADVERSARIES:
        return AdversaryAgent(spec, task, rules)
    return LLMAgent(llm or LLMConfig(model=spec), policy)


def as_reply(result: AgentReply | Message) -> AgentReply:
    return result if isinstance(result, AgentReply) else AgentReply(result)
