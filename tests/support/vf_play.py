"""Playing envforge tasks through verifiers (`envforge.integrations.verifiers`) with a replaying model.

The model is a fake: an OpenAI-compatible server on 127.0.0.1 (`FakeOpenAI`) whose answers are an
envforge agent's (`OracleAgent`, `NoopAgent`, `AdversaryAgent`), each turn given the conversation
verifiers sent; everything between it and envforge is the real thing: verifiers' env, agent,
interception server and trace, envforge's episode, simulated user and reward.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import Any

from envforge.harness import Message, ToolCall
from envforge.synth import Call

from support.fake_llm import FakeOpenAI, completion

KEY_VAR = "ENVFORGE_TEST_FAKE_KEY"
STOP = "###STOP###"


@dataclass
class Played:
    """What one rollout earned through verifiers, and what the model did in it."""

    reward: float | None
    parts: dict[str, float]
    texts: list[str]
    calls: list[Call]
    episode: Any
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def message(self) -> str:
        """The agent's last text before the stop token."""
        return next((t for t in reversed(self.texts) if t != STOP), "")

    @property
    def policy_kept(self) -> bool:
        return self.parts.get("envforge/policy", 1.0) == 1.0


def agent_brain(agent: Any, texts: list[str], calls: list[Call]) -> Any:
    """A model whose every turn is `agent.respond(...)` (an agent of `envforge.harness`: the oracle,
    the no-op, an adversary) on the conversation verifiers sent; the texts and calls it sends are
    appended to `texts` and `calls`. Once the agent has said its last text, it says the stop token."""
    said_last = [False]

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if said_last[0]:
            texts.append(STOP)
            return 200, completion(STOP)
        messages = [_message(m) for m in body["messages"] if m["role"] != "system"]
        reply = asyncio.run(agent.respond(messages, body.get("tools", []), None))
        if reply.tool_calls:
            wire = []
            for call in reply.tool_calls:
                calls.append(Call(name=call.name, arguments=call.arguments))
                wire.append(
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                    }
                )
            return 200, completion(tool_calls=wire)
        text = reply.content or ""
        if text:
            texts.append(text)
        said_last[0] = not _asks(text)
        return 200, completion(text)

    return brain


def _asks(text: str) -> bool:
    """Whether the agent's text waits for the user's answer (the oracle's confirmation request)."""
    return text.rstrip().endswith("(yes/no)")


def _message(wire: dict[str, Any]) -> Message:
    tool_calls = [
        ToolCall(
            id=c["id"], name=c["function"]["name"], arguments=json.loads(c["function"]["arguments"] or "{}")
        )
        for c in wire.get("tool_calls") or []
    ]
    content = wire.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return Message(
        role=wire["role"], content=content, tool_calls=tool_calls, tool_call_id=wire.get("tool_call_id")
    )


def play(env: Any, task_id: str, agent: Any) -> Played:
    """One rollout of `task_id` (`env/task` or a bare task id) through verifiers' own episode
    runner, inside its `serving()`, with the model played by `agent`."""

    async def run() -> Played:
        with FakeOpenAI(agent_brain(agent, [], [])) as fake:
            async with env.serving():
                return await play_served(env, task_id, agent, fake)

    return asyncio.run(run())


async def play_served(env: Any, task_id: str, agent: Any, fake: FakeOpenAI) -> Played:
    """`play` on an env already serving, the model served by `fake` (its brain becomes `agent`'s):
    several rollouts share one fleet and one model server."""
    import verifiers.v1 as vf

    task = next(t for t in env.taskset if task_id in (t.data.id, t.data.task_id))
    texts: list[str] = []
    calls: list[Call] = []
    os.environ.setdefault(KEY_VAR, "unused")
    fake.brain = agent_brain(agent, texts, calls)
    first = len(fake.requests)
    client = vf.EvalClientConfig(base_url=fake.url, api_key_var=KEY_VAR)
    episode = await env.run_episode(task, vf.ModelContext(model="replay", client=client))
    (trace,) = episode.traces
    reward = trace.rewards.get("envforge")
    return Played(
        None if reward is None else reward.score,
        {k: float(v) for k, v in trace.metrics.items() if k.startswith("envforge/") and v is not None},
        texts,
        calls,
        episode,
        fake.requests[first:],
    )
