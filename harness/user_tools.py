"""The simulated user's own tools (dual control): how a user calls them and how a trial keeps them.

In a dual-control env (τ²-bench telecom) the user acts on their own side of the state (their
phone) with the env's `side="user"` tools, and the agent cannot. A trial gives its user a
`UserToolbox`: the user's tools in OpenAI form and a way to call them, each call run on the
trial's episode on the user's side and recorded in the trial's messages as it happens: a `user`
message holding the call (`tool_calls`, ids `user_h0`, `user_h1`, ...), then its `tool` result.
The agent never sees that traffic (`agent_view`), as τ²'s agent never sees the user's calls; the
`actions` part, τ²'s action matching, compares the calls of both (`trajectory_calls`).

The oracle agent hands over to the user with `user_action_request`: it names the user's next
golden calls, in golden order, and the scripted user plays exactly those (`user_runs`), so the
oracle and the scripted user together replay a task's golden interleaving.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from envforge.server import Environment, ToolResult
from envforge.synth import Call, Task, plain_value

from .records import Message, ToolCall, recordable

USER_ACTION = "On your device, please"
"""How the oracle's hand-over to the user starts (`user_action_request`)."""


def user_call_id(index: int) -> str:
    """The id of a trial's `index`-th user tool call (from 0), beside the agent's `call_h<n>`."""
    return f"user_h{index}"


def user_tool_specs(env: Environment) -> list[dict[str, Any]]:
    """The env's user tools as OpenAI function tools, in tools.py's order."""
    return [
        {
            "type": "function",
            "function": {"name": s.name, "description": s.description, "parameters": s.input_schema},
        }
        for s in env.tools_of("user").values()
    ]


class UserCaller(Protocol):
    """What runs a user's call on the trial's episode: an in-process fleet or the episode's user
    MCP endpoint (`EpisodeClient.call_tool`)."""

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult: ...


@dataclass
class FleetUserCaller:
    """A user's calls run straight on an in-process fleet's episode, on the user's side."""

    call: Callable[..., Awaitable[ToolResult]]
    episode_id: str

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        return await self.call(self.episode_id, name, arguments or {}, side="user")


@dataclass
class UserToolbox:
    """A trial's user tools: `tools` to offer a model, `call` to run one, each call recorded in
    `messages` (the trial's) at `turn`, and a crash of the env noted in `env_errors`."""

    tools: list[dict[str, Any]]
    caller: UserCaller
    messages: list[Message]
    env_errors: list[str] | None = None
    turn: int = 0
    made: int = 0
    names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.names = frozenset(t["function"]["name"] for t in self.tools)

    async def call(self, name: str, arguments: dict[str, Any]) -> Message:
        """Run one of the user's calls and record it; its recorded result. A name that is not one
        of the user's tools never reaches the env (answered as the runtime would)."""
        arguments, problem = recordable(arguments)
        name = recordable(name).value
        call = ToolCall(id=user_call_id(self.made), name=name, arguments=arguments)
        self.made += 1
        self.messages.append(Message(role="user", tool_calls=[call], turn=self.turn))
        if problem is not None:
            text, is_error = f"Error: the arguments of {name} are unusable: {problem}", True
        elif name not in self.names:
            text, is_error = f"Error: Tool '{name}' not found.", True
        else:
            result = await self.caller.call_tool(name, arguments)
            text, is_error = result.text, result.is_error
            if self.env_errors is not None and result.kind == "env_error":
                self.env_errors.append(f"{name} (user): {text[:200]}")
        said = Message(role="tool", content=text, tool_call_id=call.id, is_error=is_error, turn=self.turn)
        self.messages.append(said)
        return said


def is_user_call(message: Message) -> bool:
    """A message holding one of the user's own tool calls (not something the user said)."""
    return message.role == "user" and bool(message.tool_calls)


def agent_view(messages: list[Message]) -> list[Message]:
    """The conversation as the agent sees it: without the user's tool calls and their results."""
    out: list[Message] = []
    hidden = False
    for m in messages:
        if m.role == "tool" and hidden:
            continue
        hidden = is_user_call(m)
        if not hidden:
            out.append(m)
    return out


def user_call_results(messages: list[Message]) -> list[tuple[ToolCall, Message]]:
    """Each of the user's calls with its result, in order (by position, as `call_results`)."""
    pairs: list[tuple[ToolCall, Message]] = []
    pending: list[ToolCall] = []
    for m in messages:
        if is_user_call(m):
            pending = list(m.tool_calls)
        elif m.role == "tool" and pending:
            pairs.append((pending.pop(0), m))
        elif m.role != "tool":
            pending = []
    return pairs


def trajectory_calls(messages: list[Message]) -> list[Call]:
    """Every tool call of the trial in order, the agent's and the user's (with `requestor`)."""
    calls: list[Call] = []
    for m in messages:
        if m.role == "assistant":
            calls.extend(Call(name=c.name, arguments=c.arguments) for c in m.tool_calls)
        elif is_user_call(m):
            calls.extend(Call(name=c.name, arguments=c.arguments, requestor="user") for c in m.tool_calls)
    return calls


def user_runs(task: Task) -> list[tuple[int, int]]:
    """The runs of consecutive golden calls the user makes, as `(start, end)` index ranges."""
    runs: list[tuple[int, int]] = []
    calls = task.golden_calls
    i = 0
    while i < len(calls):
        if calls[i].requestor == "user":
            j = i
            while j < len(calls) and calls[j].requestor == "user":
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    return runs


def user_action_request(calls: Sequence[Call]) -> str:
    """What the oracle says to hand `calls` (the user's next golden calls) over to the user."""
    steps = "; then ".join(
        f"{c.name}({', '.join(f'{k}={plain_value(v)}' for k, v in c.arguments.items())})" for c in calls
    )
    return f"{USER_ACTION} do the following and tell me what you see: {steps}."


class SoloClient:
    """The agent's episode client in solo mode: a call to one of the user's tools goes to the
    episode's user side (τ²: an assistant call to a user tool goes to the user's toolkit), any
    other to the agent's own endpoint."""

    def __init__(self, client: Any, user: UserCaller, user_names: frozenset[str]) -> None:
        self.client, self.user, self.user_names = client, user, user_names

    async def list_tools(self) -> Any:
        return await self.client.list_tools()

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        if name in self.user_names:
            return await self.user.call_tool(name, arguments)
        result: ToolResult = await self.client.call_tool(name, arguments)
        return result


def results_text(results: Sequence[tuple[str, Message]]) -> str:
    """What a scripted user says after acting on their device: each call's result."""
    said = " ".join(f"{name}: {(m.content or '').strip()}" for name, m in results)
    return f"I did that. {said}".strip()
