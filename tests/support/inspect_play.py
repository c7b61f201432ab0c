"""envforge's built-in agents (the oracle, the no-op, the adversaries of harness/agents.py) as the
model of an `inspect_ai.eval`: inspect's stock `mockllm/model` with a `custom_outputs` function
that hands each sample's conversation to its agent and turns the agent's reply into inspect's
`ModelOutput` (a tool call, or a message to the user).

A sample is known by its opening request (the tasks played must have distinct ones); its n-th
run (`epochs=len(agents)`) is played by the n-th agent, whose name is kept in the sample's store
(`store()`, logged with the sample) under `AGENT_KEY`. So one eval plays every agent on every task;
what each run did is read back from the eval log, not from here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from inspect_ai.model import (
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageTool,
    ChatMessageUser,
    Model,
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.tool import ToolCall as InspectToolCall
from inspect_ai.tool import ToolInfo
from inspect_ai.util import store

from envforge.harness import Agent, Message, ToolCall, build_agent, request_text
from envforge.server import Environment
from envforge.synth import Call, PolicyRules, Task

AGENT_KEY = "envforge_test_agent"
"""Where a sample's store names the agent that played it."""

USAGE = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
"""Set on every output: mockllm otherwise counts tokens with tiktoken."""


class _Tools:
    """What an adversary asks of its episode client (`list_tools`): the env's own tool specs."""

    def __init__(self, env: Environment) -> None:
        self._tools = [
            SimpleNamespace(
                name=t.name,
                description=t.description,
                input_schema=t.input_schema,
                annotations=SimpleNamespace(read_only_hint=t.read_only),
            )
            for t in env.tools.values()
        ]

    async def list_tools(self) -> list[Any]:
        return list(self._tools)


def _harness_messages(messages: list[ChatMessage]) -> list[Message]:
    """inspect's conversation as the harness's (the system message left out, as agents get it)."""
    out: list[Message] = []
    for m in messages:
        if isinstance(m, ChatMessageUser):
            out.append(Message(role="user", content=m.text))
        elif isinstance(m, ChatMessageAssistant):
            if m.tool_calls:
                calls = [
                    ToolCall(id=c.id, name=c.function, arguments=dict(c.arguments)) for c in m.tool_calls
                ]
                out.append(Message(role="assistant", tool_calls=calls))
            else:
                out.append(Message(role="assistant", content=m.text))
        elif isinstance(m, ChatMessageTool):
            out.append(
                Message(
                    role="tool", content=m.text, tool_call_id=m.tool_call_id, is_error=m.error is not None
                )
            )
    return out


def agents_model(
    env: Environment,
    tasks: dict[str, Task],
    agents: tuple[str, ...],
    rules: PolicyRules | None,
) -> Model:
    """mockllm, the n-th run of each task's turns answered by `build_agent(agents[n], task)`."""
    by_opening = {request_text(t): t for t in tasks.values()}
    assert len(by_opening) == len(tasks), "the tasks played must open with distinct requests"
    runs: dict[str, int] = {}
    playing: dict[str, Agent] = {}
    client = _Tools(env)
    openai_tools = [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
        }
        for t in env.tools.values()
    ]

    async def respond(
        input: list[ChatMessage], tools: list[ToolInfo], tool_choice: Any, config: Any
    ) -> ModelOutput:
        sample = store()
        key = sample.get(AGENT_KEY)
        if key is None:
            opening = next(m.text for m in input if isinstance(m, ChatMessageUser))
            task = by_opening[opening]
            n = runs.get(task.id, 0)
            runs[task.id] = n + 1
            key = f"{agents[n]}:{task.id}"
            sample.set(AGENT_KEY, key)
            playing[key] = build_agent(agents[n], task, seed=0, policy=env.policy, rules=rules)
        reply = await playing[key].respond(_harness_messages(input), openai_tools, client)  # type: ignore[arg-type]
        message = reply if isinstance(reply, Message) else reply.message
        if message.tool_calls:
            calls = [
                InspectToolCall(id=c.id, function=c.name, arguments=dict(c.arguments))
                for c in message.tool_calls
            ]
            assistant = ChatMessageAssistant(content="", tool_calls=calls, model="mockllm", source="generate")
            out = ModelOutput(
                model="mockllm", choices=[ChatCompletionChoice(message=assistant, stop_reason="tool_calls")]
            )
        else:
            out = ModelOutput.from_content("mockllm", message.content or "")
        out.usage = USAGE
        return out

    return get_model("mockllm/model", custom_outputs=respond)


def actions_of(messages: list[ChatMessage]) -> tuple[list[Call], list[str]]:
    """The calls made and the messages said to the user in a sample's logged conversation."""
    calls: list[Call] = []
    said: list[str] = []
    for m in messages:
        if isinstance(m, ChatMessageAssistant):
            if m.tool_calls:
                calls += [Call(name=c.function, arguments=dict(c.arguments)) for c in m.tool_calls]
            else:
                said.append(m.text)
    return calls, said
