"""Was a failure the simulated user's fault? (ERPO's MEU signal: don't punish the agent for it.)

Rules first, because they are free and exact (`user_error_rules.py`: wrong facts, contradictions,
leaks, premature stops and invented facts, each rule naming its kind; their precision and recall
on the labeled set `user_error_set.py` are in docs/benchmarks/meu.md).

When the rules find nothing and a judge model is configured, an LLM judge reads the user's
messages against the facts (`judge_user_error`).
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from envforge.synth import Task

from .llm import LLMConfig, complete
from .records import Message, Usage, call_results
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

The conversation, in order (USER: the simulated user's words, CALL: a tool the agent called,
RESULT: what the tool returned, AGENT: only the values the agent named and whether it asked a
question). The agent's own words are withheld: the agent is the one being graded, so what it says
about the user is no evidence. Values the agent or a RESULT showed are not the user's invention; a
USER value that differs from the facts is.
{transcript}

Did the user make an error: state a value contradicting the facts, invent a fact, ask for something
other than the goal, or end the conversation before the agent could finish?
Answer with JSON only: {{"user_error": true|false, "reason": "..."}}"""
"""The judge reads what the user and the tools did, never the agent's words (`judge_transcript`):
an agent message claiming the user contradicted themselves, with `{"user_error": true}`, made a
local judge flag 12 of 12 failing trials as the user's, masking the agent's failure."""

TRANSCRIPT_CHARS = 6000
"""The judge's whole view of the conversation: a small local model's context (and its prompt
speed on CPU) is the limit, so tool results are cut first and user lines never."""
RESULT_CHARS = 240
AGENT_CHARS = 400


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


VALUE = re.compile(
    r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # an email
    r"|\b\d+(?:[-/:]\d+)+\b"  # a date or a time
    r"|\b[A-Za-z]+(?:[-_/:][A-Za-z0-9]+)*[-_/:]?\d[\w/:-]*"  # an id: letters then digits (P-104, W123)
    r"|(?<![\w.])[$€£]?\d[\d,]*(?:\.\d+)?%?(?![\w])"  # a number or an amount
)
"""What the judge is shown of text the agent wrote: the values in it (ids, numbers, amounts, dates,
emails), which a user may repeat without inventing them, and none of the words around them."""


def agent_values(text: str) -> list[str]:
    """The values the agent named in `text`, in order, each once."""
    return list(dict.fromkeys(VALUE.findall(text)))


def _agent_line(text: str) -> str:
    values = agent_values(text)
    named = f"named {', '.join(values)}" if values else "named no value"
    return _clip(f"AGENT: [{named}{'; asked a question' if '?' in text else ''}]", AGENT_CHARS)


def _argument_view(value: Any) -> Any:
    """An argument as the judge sees it: a string that is one value stays, other text is cut to
    the values in it (an argument is the agent's text too, and can address the judge)."""
    if isinstance(value, str):
        return value if VALUE.fullmatch(value) or not value.strip() else " ".join(agent_values(value))
    if isinstance(value, dict):
        return {str(k): _argument_view(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_argument_view(v) for v in value]
    return value


def _result_view(text: str, arguments: dict[str, Any]) -> str:
    """A result less the text its call passed in: an error that repeats an argument would carry
    the agent's words to the judge."""
    for value in _strings(arguments):
        if len(value) > 3 and not VALUE.fullmatch(value):
            text = text.replace(value, "…")
    return text


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def judge_transcript(messages: list[Message], *, budget: int = TRANSCRIPT_CHARS) -> str:
    """The conversation as the judge reads it, one line per message: the user's words whole, the
    tool calls and (clipped) tool results, and of the agent's turns only the values it named and
    whether it asked a question, so that a user value can be checked against what the agent said
    and looked up while nothing the agent claims reaches the judge (its arguments are cut to their
    values, and a result to what its call did not pass in). The first user message (the scenario
    request) and every user line are kept whole; when over `budget`, results are dropped oldest
    first."""
    lines: list[tuple[str, bool]] = []  # (line, may be dropped)
    calls = dict((id(m), c) for c, m in call_results(messages))
    for m in messages:
        if m.role == "user":
            lines.append((f"USER: {' '.join((m.content or '').split())}", False))
        elif m.role == "assistant":
            if m.content and m.content.strip():
                lines.append((_agent_line(m.content), False))
            for call in m.tool_calls:
                view = _argument_view(call.arguments)
                args = json.dumps(view, separators=(",", ":"), sort_keys=True)
                lines.append((f"CALL: {call.name}({_clip(args, AGENT_CHARS)})", False))
        elif m.role == "tool":
            tag = "RESULT (error)" if m.is_error else "RESULT"
            answered = calls.get(id(m))
            text = _result_view(m.content or "", answered.arguments if answered else {})
            lines.append((f"{tag}: {_clip(text, RESULT_CHARS)}", True))
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
