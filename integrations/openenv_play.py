"""An envforge agent (a harness `Agent`: the oracle, the no-op, an adversary, a litellm model)
playing one episode through OpenEnv's stock client, against `envforge.integrations.openenv`.

    from envforge.harness import build_agent
    from envforge.integrations.openenv import EnvforgeEnv   # or OpenEnv's GenericEnvClient
    async with EnvforgeEnv(base_url=url) as client:
        played = await play(client, build_agent("oracle", task, ...), task_id=task.id)
    played.reward, played.calls, played.said

The client is OpenEnv's: its typed `EnvClient` (`EnvforgeEnv`) or its untyped
`GenericEnvClient`, whose observations are dicts; both are read alike. This module only turns
the agent's messages into OpenEnv actions (a tool call each, or a message to the user) and the
observations back into the conversation the agent reads. What the episode did (`calls`, `said`)
is kept so that the same actions can be scored by `envforge score` (`envforge.score_calls`): the
tests compare the two.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from envforge.harness import Agent, Message
from envforge.synth import Call


@dataclass
class Played:
    """One episode played through OpenEnv: its end (`reward`, `parts`, `status`), and the actions."""

    env: str
    task_id: str
    reward: float | None
    parts: dict[str, float]
    status: str | None
    user_error: bool
    calls: list[Call] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)


class _Tools:
    """What an agent asks of its episode client (`list_tools`), answered from the tools the reset
    observation listed; `read_only` names the tools an adversary may treat as reads."""

    def __init__(self, tools: list[dict[str, Any]], read_only: Collection[str]) -> None:
        self._tools = [
            SimpleNamespace(
                name=t["function"]["name"],
                description=t["function"].get("description", ""),
                input_schema=t["function"].get("parameters", {}),
                annotations=SimpleNamespace(read_only_hint=t["function"]["name"] in read_only),
            )
            for t in tools
        ]

    async def list_tools(self) -> list[Any]:
        return list(self._tools)


async def play(
    client: Any,
    agent: Agent,
    *,
    task_id: str,
    env: str | None = None,
    read_only: Collection[str] = (),
    max_actions: int = 64,
) -> Played:
    """Reset `client` (an OpenEnv `EnvClient`, `EnvforgeEnv` or `GenericEnvClient`, connected to
    an envforge OpenEnv server) to `task_id` (of `env` where task ids are not unique) and let
    `agent` play until the episode is done. Raises RuntimeError, one line, if it is not done
    after `max_actions`."""
    result = await client.reset(task_id=task_id, **({"env": env} if env else {}))
    first = _fields(result.observation)
    tools = list(first.get("tools") or [])
    episode = _Tools(tools, read_only)
    messages = [Message(role="user", content=first.get("content", ""))]
    played = Played(
        env=first.get("env", ""), task_id=task_id, reward=None, parts={}, status=None, user_error=False
    )
    for _ in range(max_actions):
        if result.done:
            break
        reply = await agent.respond(list(messages), tools, episode)  # type: ignore[arg-type]
        message = reply if isinstance(reply, Message) else reply.message
        if message.tool_calls:
            for call in message.tool_calls:
                messages.append(Message(role="assistant", tool_calls=[call]))
                played.calls.append(Call(name=call.name, arguments=dict(call.arguments)))
                result = await client.step({"tool": call.name, "arguments": dict(call.arguments)})
                obs = _fields(result.observation)
                messages.append(
                    Message(
                        role="tool",
                        content=obs.get("content", ""),
                        tool_call_id=call.id,
                        is_error=bool(obs.get("is_error")),
                    )
                )
                if result.done:
                    break
            continue
        text = message.content or ""
        messages.append(Message(role="assistant", content=text))
        played.said.append(text)
        result = await client.step({"message": text})
        messages.append(Message(role="user", content=_fields(result.observation).get("content", "")))
    if not result.done:
        raise RuntimeError(f"the episode of {task_id} was not done after {max_actions} actions")
    end = _fields(result.observation)
    played.reward, played.parts = result.reward, dict(end.get("parts") or {})
    played.status, played.user_error = end.get("status"), bool(end.get("user_error"))
    played.messages = messages
    return played


def _fields(observation: Any) -> dict[str, Any]:
    """An observation's fields: `EnvforgeEnv` gives a pydantic model, `GenericEnvClient` a dict."""
    if isinstance(observation, dict):
        return observation
    fields: dict[str, Any] = observation.model_dump()
    return fields
