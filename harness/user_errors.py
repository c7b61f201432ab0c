"""Was a failure the simulated user's fault? (ERPO's MEU signal: don't punish the agent for it.)

Rules first, because they are free and exact (`user_error_rules.py`: wrong facts, contradictions,
leaks, premature stops and invented facts, each rule naming its kind; their precision and recall
on the labeled set `user_error_set.py` are in docs/benchmarks.md).

When the rules find nothing and a judge model is configured, an LLM judge reads the user's
messages against the facts (`judge_user_error`).
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from envforge.synth import Task

from .llm import LLMConfig, complete
from .records import Message, Usage
from .user_error_rules import ERROR_KINDS, ErrorKind, RuleVerdict, rule_user_error, rule_verdict

__all__ = [
    "ERROR_KINDS",
    "ErrorKind",
    "RuleVerdict",
    "detect_user_error",
    "judge_transcript",
    "judge_user_error",
    "rule_user_error",
    "rule_verdict",
]


JUDGE_PROMPT = """You audit a simulated user in a customer-service conversation.
The user was told these facts (and must only state these values): {facts}
The user's goal: {instruction}

The conversation, in order (AGENT: the agent's words, CALL: a tool the agent called, RESULT: what
the tool returned, USER: the simulated user). Values the agent or a RESULT showed are not the
user's invention; a USER value that differs from the facts is.
{transcript}

Did the user make an error: state a value contradicting the facts, invent a fact, ask for something
other than the goal, or end the conversation before the agent could finish?
Answer with JSON only: {{"user_error": true|false, "reason": "..."}}"""

TRANSCRIPT_CHARS = 6000
"""The judge's whole view of the conversation: a small local model's context (and its prompt
speed on CPU) is the limit, so tool results are cut first and user lines never."""
RESULT_CHARS = 240
AGENT_CHARS = 400


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def judge_transcript(messages: list[Message], *, budget: int = TRANSCRIPT_CHARS) -> str:
    """The conversation as the judge reads it, one line per message: the agent's turns and tool
    calls and (clipped) tool results next to the user's words, so that a user value can be checked
    against what the agent actually said and looked up. The first user message (the scenario
    request) and every user line are kept whole; when over `budget`, results are dropped oldest
    first."""
    lines: list[tuple[str, bool]] = []  # (line, may be dropped)
    for m in messages:
        if m.role == "user":
            lines.append((f"USER: {' '.join((m.content or '').split())}", False))
        elif m.role == "assistant":
            if m.content and m.content.strip():
                lines.append((f"AGENT: {_clip(m.content, AGENT_CHARS)}", False))
            for call in m.tool_calls:
                args = json.dumps(call.arguments, separators=(",", ":"), sort_keys=True)
                lines.append((f"CALL: {call.name}({_clip(args, AGENT_CHARS)})", False))
        elif m.role == "tool":
            tag = "RESULT (error)" if m.is_error else "RESULT"
            lines.append((f"{tag}: {_clip(m.content or '', RESULT_CHARS)}", True))
    total = sum(len(line) + 1 for line, _ in lines)
    kept: list[str] = []
    for line, droppable in lines:
        if droppable and total > budget:
            total -= len(line) + 1
            continue
        kept.append(line)
    return "\n".join(kept)


def _parse_verdict(text: str) -> tuple[bool, str | None]:
    match = re.search(r"\{.*\}", text, re.S)
    try:
        verdict = json.loads(match.group(0)) if match else {}
    except ValueError:
        verdict = {}
    if not isinstance(verdict, dict):
        return False, None
    error = bool(verdict.get("user_error", False))
    return error, (str(verdict.get("reason") or "judged a user error") if error else None)


class UserErrorVerdict(NamedTuple):
    """Whether the simulated user erred (and why), and what a judge's call cost (None: no judge asked)."""

    error: bool
    reason: str | None
    usage: Usage | None


async def judge_user_error(task: Task, messages: list[Message], cfg: LLMConfig) -> UserErrorVerdict:
    """The LLM judge's verdict on the user's messages."""
    facts: dict[str, Any] = {f.name: f.value for f in task.scenario.known_facts}
    prompt = JUDGE_PROMPT.format(
        facts=json.dumps(facts),
        instruction=task.scenario.instruction,
        transcript=judge_transcript(messages),
    )
    message, usage = await complete(cfg, [{"role": "user", "content": prompt}])
    error, reason = _parse_verdict(message.content or "")
    return UserErrorVerdict(error, (f"judge: {reason}" if reason else None), usage)


async def detect_user_error(
    task: Task, messages: list[Message], judge: LLMConfig | None = None
) -> UserErrorVerdict:
    """Rules, then the judge (when given) if the rules find nothing."""
    error, reason = rule_user_error(task, messages)
    if error or judge is None:
        return UserErrorVerdict(error, reason, None)
    return await judge_user_error(task, messages, judge)
