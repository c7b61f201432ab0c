"""Was a failure the simulated user's fault? (ERPO's MEU signal: don't punish the agent for it.)

Rules first, because they are free and exact:
- contradiction: a user message holds an id of the same kind as a known fact (same prefix, e.g.
  `C-1021` next to the fact `customer_id = C-1020`) that is neither a fact, nor in the user's
  own instruction, nor said earlier by the agent or a tool: the user gave a wrong value;
- premature stop: the user ended the conversation (`###STOP###` / `###TRANSFER###`) right after
  the agent asked something, or before the agent said anything at all.

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
from .users import STOP, TRANSFER, fact_text

ID = re.compile(r"\b([A-Z]{1,4})-(\d+)\b")


def _ids(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(0)) for m in ID.finditer(text)]


def _fact_ids(task: Task) -> dict[str, list[tuple[str, str]]]:
    """prefix -> [(fact name, id)] for every id-like fact value."""
    out: dict[str, list[tuple[str, str]]] = {}
    for f in task.scenario.known_facts:
        for prefix, ident in _ids(fact_text(f.value)):
            out.setdefault(prefix, []).append((f.name, ident))
    return out


class RuleVerdict(NamedTuple):
    """The rules' verdict: whether the simulated user erred, and why."""

    error: bool
    reason: str | None


def rule_user_error(task: Task, messages: list[Message]) -> RuleVerdict:
    """The rule-based verdict."""
    fact_ids = _fact_ids(task)
    allowed = {ident for _, ident in _ids(task.scenario.instruction)}
    allowed |= {ident for pairs in fact_ids.values() for _, ident in pairs}
    for i, m in enumerate(messages):
        text = m.content or ""
        if m.role != "user":
            allowed |= {ident for _, ident in _ids(text)}
            continue
        for prefix, ident in _ids(text):
            if ident not in allowed and prefix in fact_ids:
                name, known = fact_ids[prefix][0]
                return RuleVerdict(
                    True, f"user message {i} says {ident}, contradicting the known {name} = {known}"
                )
        if STOP in text or TRANSFER in text:
            said = [p for p in messages[:i] if p.role == "assistant" and p.content]
            if not said:
                return RuleVerdict(
                    True, f"user message {i} ended the conversation before the agent said anything"
                )
            if (said[-1].content or "").rstrip().endswith("?"):
                return RuleVerdict(
                    True, f"user message {i} ended the conversation while the agent was asking a question"
                )
    return RuleVerdict(False, None)


JUDGE_PROMPT = """You audit a simulated user in a customer-service conversation.
The user was told these facts (and must only state these values): {facts}
The user's goal: {instruction}

The user's messages, in order:
{user_messages}

Did the user make an error: state a value contradicting the facts, invent a fact, ask for something
other than the goal, or end the conversation before the agent could finish?
Answer with JSON only: {{"user_error": true|false, "reason": "..."}}"""


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
        user_messages="\n".join(f"- {m.content}" for m in messages if m.role == "user"),
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
