"""A scripted user that errs in a chosen share of episodes: user errors during training, with the truth.

ERPO's mask (MEU) keeps trajectories the simulated user spoiled out of training. Whether that buys
anything depends on how often the user errs and on how well the detector (`user_errors.py`) finds
those episodes; a scripted user that never errs exercises neither. `ErringUser` is the
`ScriptedUser` with one error of a kind the detector claims (`ERROR_KINDS`) built into the
episode, in the surface forms of the labeled set (`user_error_plans.py`: same-type substitutes
from `other_value`, the scripted user's `lies`):

- `wrong_fact`: a fact the user holds is stated with another value of its type when asked; a task
  whose user holds no typed fact (a lookup: "What is the price of book B-104?") is requested with
  another id of the same prefix in the opening;
- `contradiction`: at its first reply the user takes back the id or value it gave ("Wait, I
  meant B-131, not B-104."), and the conversation goes on where it would have ended;
- `leak`: the opening states a value only the agent could find (a required output, "I think the
  answer is 12.50", else a value a golden call takes from a result);
- `premature_stop`: the user hangs up at the first turn where the agent asks a question (not a
  closing offer) or announces more work;
- `invented_fact`: the opening adds an account id that no fact, instruction or tool gave it.

`committed` is the kind once the error has really happened in the conversation, else None: a
premature stop needs an agent turn that asks or announces, a lie needs the agent to ask for that
fact. So each trajectory records what the user did, not what was planned, and the detector's
precision and recall are measured against it.

Which episodes err is drawn per episode from (seed, env, task, the episode's number for that
task), a string seed (hashed with SHA-512 by `random`): the same run plays the same errors.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from envforge.synth import Task

from .records import Message
from .user_error_play import EMAIL_RE, ID_RE, ISO_DATE_RE, other_id, other_value
from .user_error_rules import ERROR_KINDS, ErrorKind
from .users import (
    STOP,
    ScriptedUser,
    UserReply,
    announces_more_work,
    fact_text,
    last_agent_turn,
    request_text,
    says_nothing,
)

ID_IN_TEXT = re.compile(r"\b[A-Z]{1,4}-\d+\b")
CLOSING_OFFER = re.compile(r"\b(?:anything else|something else|else i can|help you with)\b", re.I)
INVENTED_PREFIXES = ("ACCT", "MBR", "REF", "CUST", "QX")
HANG_UP = f"Never mind, I have to go. {STOP}"


def draw_user_error(seed: int, env: str, task_id: str, episode: int, rate: float) -> float | None:
    """A number in [0, 1) choosing this episode's error kind when the episode errs, else None.

    Deterministic in its arguments: the n-th episode of a task errs in every run of the same seed.
    """
    rng = random.Random(f"user-error:{seed}:{env}:{task_id}:{episode}")
    if rng.random() >= rate:
        return None
    return rng.random()


def _typed(value: Any) -> bool:
    """A fact value whose substitute the detector can tell from it: an id, email, date or number."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and bool(
        ID_RE.match(value) or EMAIL_RE.match(value) or ISO_DATE_RE.match(value)
    )


@dataclass(frozen=True)
class _Plan:
    """What the user will do differently: which kind, and the values it needs."""

    kind: ErrorKind
    lies: dict[str, Any]
    opening: str | None = None
    """Replaces (wrong_fact) or extends (leak, invented_fact) the opening request."""
    correction: str | None = None
    """What the contradiction says at the first reply."""


class _Planner:
    """Which kinds a task can host and the values each would use (ids and values the task's own
    facts and instruction never hold, so the error is one the detector can tell apart)."""

    def __init__(self, task: Task, rng: random.Random) -> None:
        self.task, self.rng = task, rng
        self.facts = {f.name: f.value for f in task.scenario.known_facts}
        self.instruction_ids = ID_IN_TEXT.findall(task.scenario.instruction)
        words = [fact_text(v) for v in self.facts.values()] + [task.scenario.instruction]
        self.avoid = {w for text in words for w in ID_IN_TEXT.findall(text)} | {
            fact_text(v) for v in self.facts.values()
        }

    def typed_fact(self) -> str | None:
        names = sorted(n for n, v in self.facts.items() if _typed(v))
        return self.rng.choice(names) if names else None

    def hidden(self) -> str | None:
        """A value only the agent can find: a required output the user does not hold, else a value
        with a digit that a golden call takes and the user was never given."""
        told = {fact_text(v) for v in self.facts.values()}
        outputs = [o for o in self.task.required_outputs if o and o not in told]
        if outputs:
            return f"I think the answer is {outputs[0]}."
        for call in self.task.golden_calls:
            for key, value in sorted(call.arguments.items()):
                text = fact_text(value)
                if (
                    isinstance(value, str)
                    and any(c.isdigit() for c in text)
                    and text not in told
                    and text not in self.task.scenario.instruction
                ):
                    return f"The {key.replace('_', ' ')} is {text}."
        return None

    def plans(self, request: str) -> dict[ErrorKind, _Plan]:
        """Every kind this task can host, with its values drawn."""
        out: dict[ErrorKind, _Plan] = {}
        fact = self.typed_fact()
        if fact is not None:
            lie = other_value(self.facts[fact], [], self.rng, self.avoid)
            out["wrong_fact"] = _Plan("wrong_fact", {fact: lie})
        elif self.instruction_ids:
            ident = self.instruction_ids[0]
            out["wrong_fact"] = _Plan(
                "wrong_fact", {}, opening=request.replace(ident, other_id(ident, self.rng, self.avoid))
            )
        said = fact_text(self.facts[fact]) if fact is not None else (self.instruction_ids or [None])[0]
        if said is not None:
            other = fact_text(other_value(said, [], self.rng, self.avoid))
            out["contradiction"] = _Plan(
                "contradiction", {}, correction=f"Wait, I meant {other}, not {said}."
            )
        leak = self.hidden()
        if leak is not None:
            out["leak"] = _Plan("leak", {}, opening=f"{request} {leak}")
        out["premature_stop"] = _Plan("premature_stop", {})
        prefixes = [p for p in INVENTED_PREFIXES if not any(a.startswith(f"{p}-") for a in self.avoid)]
        invented = f"{self.rng.choice(prefixes or ['QX'])}-{self.rng.randint(10000, 99999)}"
        out["invented_fact"] = _Plan(
            "invented_fact", {}, opening=f"{request} My account number is {invented}."
        )
        return out


class ErringUser:
    """A `ScriptedUser` that makes one user error of one kind (see the module docstring).

    `choice` in [0, 1) picks the kind among those the task can host (`draw_user_error`), so the
    same draw gives the same kind; `kinds` narrows the kinds drawn from.
    """

    def __init__(
        self,
        task: Task,
        choice: float,
        *,
        max_turns: int = 10,
        kinds: tuple[ErrorKind, ...] = ERROR_KINDS,
        seed: int = 0,
    ) -> None:
        rng = random.Random(f"user-error-values:{seed}:{task.id}:{choice}")
        request = request_text(task)
        plans = _Planner(task, rng).plans(request)
        hosted = [k for k in kinds if k in plans]
        self.plan = plans[hosted[int(choice * len(hosted))]] if hosted else None
        self.inner = ScriptedUser(task, max_turns=max_turns, lies=self.plan.lies if self.plan else None)
        self.request = request
        self.replies = 0
        self.committed: ErrorKind | None = None

    @property
    def planned(self) -> ErrorKind | None:
        return self.plan.kind if self.plan else None

    async def start(self) -> UserReply:
        plan = self.plan
        if plan is not None and plan.opening is not None:
            self.committed = plan.kind
            return UserReply(plan.opening)
        return UserReply(self.request)

    async def reply(self, messages: list[Message]) -> UserReply:
        self.replies += 1
        answer = await self.inner.reply(messages)
        plan = self.plan
        if plan is None or self.committed is not None:
            return answer
        said = last_agent_turn(messages)
        if plan.kind == "wrong_fact" and plan.lies:
            if any(fact_text(v) in answer.text for v in plan.lies.values()):
                self.committed = "wrong_fact"
        elif plan.kind == "contradiction" and self.replies == 1 and not answer.agent_silent:
            self.committed = "contradiction"
            if answer.stop or answer.transfer:
                return UserReply(f"{plan.correction} Can you check that one?")
            return UserReply(f"{answer.text} {plan.correction}")
        elif plan.kind == "premature_stop" and not (answer.stop or answer.transfer or answer.agent_silent):
            asks = said.strip().endswith("?") and not CLOSING_OFFER.search(said)
            if not says_nothing(said) and (asks or announces_more_work(said)):
                self.committed = "premature_stop"
                return UserReply(HANG_UP)
        return answer
