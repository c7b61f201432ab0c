"""How well an agent's model writes tool calls: the share of its turns that made a valid call.

An agent turn is one assistant message the agent produced, plus the one it failed to produce when
a trial ended as `malformed_output` (a tagged call that was not one, a call without a name: never
recorded as a message). A turn *made a valid call* when it has at least one tool call and every
call names one of the env's tools with a JSON object of arguments — i.e. none was answered with the
orchestrator's "unknown tool" / "not a JSON object" errors. Turns that talk to the user count as
turns without a call, so the share is the one a weak model is judged by: how often it acted at all,
and correctly, when it could.

Only records of model agents carry tokens; built-in agents (oracle, random) have no model to
measure and are left out (`agent_turns` 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .records import Message, TrialRecord
from .vocab import TrialStatus

CALL_REFUSED_PREFIXES = ("Error: unknown tool", "Error: the arguments of")
"""How the orchestrator answers a call that never reached the env (orchestrator._call_problem)."""


def _valid_turn(message: Message, results: Sequence[Message]) -> bool:
    """`results`: the tool messages that follow `message`, in call order (the orchestrator appends
    one per call, and may stop early at its tool-error limit)."""
    if not message.tool_calls:
        return False
    if any("__unparsed__" in call.arguments for call in message.tool_calls):
        return False
    return not any((r.content or "").startswith(CALL_REFUSED_PREFIXES) for r in results)


def tool_call_validity(records: Sequence[TrialRecord]) -> dict[str, Any]:
    """`{"agent_turns", "tool_call_turns", "valid_tool_call_turns", "valid_share"}` over the
    records of model agents (valid_share None when there is no such turn)."""
    turns = with_calls = valid = 0
    for rec in records:
        if not rec.usage.get("agent") or not rec.usage["agent"].calls:
            continue
        messages = rec.messages
        for i, m in enumerate(messages):
            if m.role != "assistant":
                continue
            results = messages[i + 1 : i + 1 + len(m.tool_calls)]
            turns += 1
            with_calls += bool(m.tool_calls)
            valid += _valid_turn(m, [r for r in results if r.role == "tool"])
        if rec.status == TrialStatus.MALFORMED_OUTPUT:
            turns += 1
            with_calls += 1
    return {
        "agent_turns": turns,
        "tool_call_turns": with_calls,
        "valid_tool_call_turns": valid,
        "valid_share": valid / turns if turns else None,
    }
