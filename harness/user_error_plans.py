"""What each item of the user-error set does differently from the clean conversation: its `Plan`.

One builder per label. Clean builders make the *agent* fail while the user behaves (the hard
negatives); error builders inject exactly one user error of their kind, at a slot and in a surface
form drawn from the item's own `random.Random`, so the set is reproducible and its forms varied.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from envforge.synth import Call, CallNode, Fact, Task

from .user_error_play import (
    ID_RE,
    ISO_DATE_RE,
    THANKS,
    Plan,
    Step,
    base_name,
    other_id,
    other_value,
    plan_steps,
    say_facts,
    spoken_date,
    spoken_name,
)
from .users import STOP, TRANSFER, fact_text, request_text

TOKEN_RE = re.compile(r"[A-Za-z0-9@._-]+")


@dataclass
class TaskContext:
    """What the builders need to know about one task: its steps, slots and which values are whose."""

    task: Task
    steps: list[Step]
    pools: dict[str, list[Any]]
    """fact base name -> every value it takes across the env's tasks (for same-type substitutes)."""

    @classmethod
    def of(cls, task: Task, pools: dict[str, list[Any]]) -> TaskContext:
        return cls(task, plan_steps(task), pools)

    @property
    def answer_slots(self) -> list[int]:
        """Slots where the user answers a question (1..n), in step order."""
        return list(range(1, 1 + sum(1 for s in self.steps if s.ask)))

    @property
    def final_slot(self) -> int:
        return 1 + len(self.answer_slots)

    def asked_at(self, slot: int) -> list[Fact]:
        return [s for s in self.steps if s.ask][slot - 1].ask

    def step_index_of(self, slot: int) -> int:
        return [i for i, s in enumerate(self.steps) if s.ask][slot - 1]

    def writes_before(self, slot: int) -> bool:
        writes = {n.call.name for n in self.task.dag.nodes if isinstance(n, CallNode) and n.write}
        return any(s.call.name in writes for s in self.steps[: self.step_index_of(slot)])

    @property
    def avoid(self) -> set[str]:
        """Values a substitute must not take: the ones the user legitimately knows."""
        known = {fact_text(f.value) for f in self.task.scenario.known_facts}
        return known | set(TOKEN_RE.findall(self.task.scenario.instruction))

    def hidden_values(self) -> list[tuple[str, str]]:
        """(what, value): what only the agent can find: required outputs, and golden argument values
        that come from results (never in the user's instruction nor its facts)."""
        request = request_text(self.task)
        facts = {fact_text(f.value) for f in self.task.scenario.known_facts}
        out = [("answer", o) for o in self.task.required_outputs]
        for call in self.task.golden_calls:
            for key, value in call.arguments.items():
                text = fact_text(value)
                if (
                    isinstance(value, str | int)
                    and len(text) >= 3
                    and text not in request
                    and text not in facts
                ):
                    out.append((key.replace("_", " "), text))
        unique: dict[str, str] = {}
        for what, value in out:
            unique.setdefault(value, what)
        return [(what, value) for value, what in unique.items()]


def _say(name: str, value: Any, rng: random.Random) -> str:
    """One fact (possibly a wrong value) in one of several shapes, dates sometimes in words."""
    text = fact_text(value)
    if isinstance(value, str) and ISO_DATE_RE.match(value) and rng.random() < 0.4:
        return f"It's {spoken_date(value)}."
    if isinstance(value, int) and rng.random() < 0.4:
        return f"{value} {spoken_name(name)}, please."
    return say_facts([(name, text)], rng)


def _answer_with(asked: list[Fact], target: Fact, value: Any, rng: random.Random) -> str:
    """An answer to a question about `asked` where `target` takes `value` (the rest truthful)."""
    if len(asked) == 1:
        return _say(target.name, value, rng)
    return say_facts([(f.name, value if f.name == target.name else f.value) for f in asked], rng)


def _pick_fact(ctx: TaskContext, rng: random.Random) -> tuple[int, Fact]:
    """A (slot, fact) pair, its value's form (id, date, count, word, text...) drawn first, so ids,
    the commonest facts, do not crowd out the other forms."""
    pairs = [(slot, f) for slot in ctx.answer_slots for f in ctx.asked_at(slot)]
    form = rng.choice(sorted({_kind_of(f.value) for _, f in pairs}))
    return rng.choice([(slot, f) for slot, f in pairs if _kind_of(f.value) == form])


def _substitute(ctx: TaskContext, fact: Fact, rng: random.Random) -> Any:
    pool = ctx.pools.get(base_name(fact.name), [])
    return other_value(fact.value, pool, rng, ctx.avoid)


# --------------------------------------------------------------------------- clean (hard negatives)


GIVE_UP = (
    "I'm sorry, I can't complete this request.",
    "Unfortunately I was unable to finish this: the system refused the change.",
    "I cannot help with this one, please contact support.",
    "I'm sorry, I couldn't do that. Is there anything else I can help you with?",
)
FALSE_DONE = ("All done.", "That's everything, you're all set.", "Your request has been completed.")
CLAIMED_WRITE = (
    "I've made the change you asked for.",
    "Your request has been processed and saved.",
    "It's booked and confirmed.",
    "The update went through.",
)


def clean_plan(ctx: TaskContext, rng: random.Random, variant: str) -> Plan:
    n = len(ctx.steps)
    if variant == "gives_up":
        return Plan(variant=variant, stop_after=rng.randrange(n), final_text=rng.choice(GIVE_UP))
    if variant == "false_done":
        return Plan(
            variant=variant, stop_after=rng.randrange(1, n) if n > 1 else 0, final_text=rng.choice(FALSE_DONE)
        )
    if variant == "claimed_write":
        writes = {nd.call.name for nd in ctx.task.dag.nodes if isinstance(nd, CallNode) and nd.write}
        first = next((i for i, s in enumerate(ctx.steps) if s.call.name in writes), n)
        return Plan(variant=variant, stop_after=first, final_text=rng.choice(CLAIMED_WRITE))
    if variant == "wrong_call":
        for i, step in enumerate(ctx.steps):
            ids = [(k, v) for k, v in step.call.arguments.items() if isinstance(v, str) and ID_RE.match(v)]
            if ids:
                key, value = rng.choice(ids)
                typo = Call(
                    name=step.call.name,
                    arguments={**step.call.arguments, key: other_id(value, rng, ctx.avoid)},
                )
                return Plan(
                    variant=variant,
                    extra_calls={i: typo},
                    note=f"agent called {step.call.name} with a wrong {key}",
                )
    return Plan(variant="full")


CLEAN_VARIANTS = ("gives_up", "false_done", "claimed_write", "wrong_call", "full")


# --------------------------------------------------------------------------- injected user errors


def wrong_fact_plan(ctx: TaskContext, rng: random.Random) -> Plan:
    slot, fact = _pick_fact(ctx, rng)
    wrong = _substitute(ctx, fact, rng)

    def user_at(s: int, default: str, asked: list[Fact]) -> str:
        return _answer_with(asked, fact, wrong, rng) if s == slot else default

    return Plan(
        label="wrong_fact",
        variant=_kind_of(fact.value),
        note=f"{fact.name}: said {fact_text(wrong)!r} instead of {fact_text(fact.value)!r}",
        user_at=user_at,
        call_values={fact_text(fact.value): wrong},
        values_from=slot,
        error_slot=slot,
    )


def contradiction_plan(ctx: TaskContext, rng: random.Random) -> Plan:
    slot, fact = _pick_fact(ctx, rng)
    wrong, right = fact_text(_substitute(ctx, fact, rng)), fact_text(fact.value)
    name = spoken_name(fact.name)
    later = [s for s in [*ctx.answer_slots, ctx.final_slot] if s > slot]
    form = rng.choice(["later", "self_correct", "then_wrong"] if later else ["self_correct", "then_wrong"])
    if form == "later":
        at = rng.choice(later)
        correction = rng.choice(
            [
                f"Oh, sorry, I got my {name} wrong earlier: it's {wrong}.",
                f"Wait, the {name} is actually {wrong}, not {right}.",
                f"Correction: use {wrong} as the {name}.",
            ]
        )

        def later_at(s: int, default: str, asked: list[Fact]) -> str:
            if s != at:
                return default
            return correction if s == ctx.final_slot else f"{default} {correction}"

        return Plan(
            label="contradiction",
            variant=f"later/{_kind_of(fact.value)}",
            note=f"{fact.name}: {right!r}, later {wrong!r}",
            user_at=later_at,
            error_slot=at,
        )
    first, second = (right, wrong) if form == "then_wrong" else (wrong, right)
    said = rng.choice(
        [
            f"My {name} is {first}. No wait, sorry, it's {second}.",
            f"My {name} is {first}... actually, make that {second}.",
        ]
        if len(ctx.asked_at(slot)) > 1
        else [f"{first}. No wait, sorry, it's {second}.", f"It's {first}... actually, make that {second}."]
    )

    def user_at(s: int, default: str, asked: list[Fact]) -> str:
        if s != slot:
            return default
        rest = " ".join(
            f"My {spoken_name(f.name)} is {fact_text(f.value)}." for f in asked if f.name != fact.name
        )
        return f"{rest} {said}".strip()

    return Plan(
        label="contradiction",
        variant=f"{form}/{_kind_of(fact.value)}",
        note=f"{fact.name}: {first!r} then {second!r}",
        user_at=user_at,
        call_values={right: fact.value if form == "self_correct" else _typed(fact.value, wrong)},
        values_from=slot,
        error_slot=slot,
    )


LEAK_FORMS = (
    "By the way, I already know the {what} is {value}.",
    "(You should find that it's {value}.)",
    "I checked myself and the {what} comes to {value}.",
    "Just so you know, {value}.",
    "A friend told me the {what} will be {value}.",
)


def leak_plan(ctx: TaskContext, rng: random.Random) -> list[Plan]:
    """Candidates (the first whose value the agent had not yet surfaced is kept by the caller)."""
    hidden = ctx.hidden_values()
    if not hidden:
        return []
    what, value = rng.choice(hidden)
    form = rng.choice(LEAK_FORMS)
    sentence = form.format(what=what, value=value)
    plans = []
    for slot in [0, *ctx.answer_slots[:3]]:

        def user_at(s: int, default: str, asked: list[Fact], slot: int = slot) -> str:
            return f"{default} {sentence}" if s == slot else default

        plans.append(
            Plan(
                label="leak",
                variant="output" if what == "answer" else "hidden_value",
                note=f"volunteered the {what} {value!r}",
                leaked=value,
                user_at=user_at,
                error_slot=slot,
            )
        )
    rng.shuffle(plans)
    return plans


STOP_ANSWERS = (
    f"Never mind, I'll sort it out later. {STOP}",
    STOP,
    f"Actually, forget it. {STOP}",
    f"I don't have time for this right now. {STOP}",
)
TRANSFER_ANSWERS = (
    f"Can you just transfer me to a human? {TRANSFER}",
    f"I want to talk to a person. {TRANSFER}",
)
ANNOUNCE = (
    "Next, I'll take care of the following step.",
    "Let me now continue with the rest of your request.",
    "One moment while I check the next part.",
    "Okay, now I'm going to handle the next step for you.",
)


def premature_stop_plan(ctx: TaskContext, rng: random.Random) -> Plan:
    forms = ["answer_stop", "transfer", "opening_stop"]
    later = [s for s in ctx.answer_slots if ctx.step_index_of(s) > 0]
    if later:
        forms.append("after_announcement")
    unwritten = [s for s in later if not ctx.writes_before(s)]
    if unwritten:
        forms.append("after_partial_result")
    form = rng.choice(forms)
    if form == "opening_stop":
        closing = rng.choice(["Actually, never mind.", "Hmm, I'll call back later.", "Sorry, wrong number."])
        return Plan(
            label="premature_stop",
            variant=form,
            user_at=lambda s, d, a: f"{d}\n{closing} {STOP}" if s == 0 else d,
            error_slot=0,
        )
    if form in ("answer_stop", "transfer"):
        slot = rng.choice(ctx.answer_slots)
        text = rng.choice(STOP_ANSWERS if form == "answer_stop" else TRANSFER_ANSWERS)
        return Plan(
            label="premature_stop",
            variant=form,
            user_at=lambda s, d, a: text if s == slot else d,
            error_slot=slot,
        )
    slot = rng.choice(later if form == "after_announcement" else unwritten)
    if form == "after_announcement":
        agent = rng.choice(ANNOUNCE)
    else:
        previous = ctx.steps[ctx.step_index_of(slot) - 1].call
        agent = rng.choice(
            [
                f"Here is what {previous.name} returned.",
                "I found the record you mentioned.",
                "That lookup worked.",
            ]
        )
    thanks = rng.choice(THANKS)
    return Plan(
        label="premature_stop",
        variant=form,
        agent_at=lambda s, d: agent if s == slot else d,
        user_at=lambda s, d, a: thanks if s == slot else d,
        error_slot=slot,
    )


FIRST = ("Dana", "Priya", "Marco", "Lena", "Tomas", "Aiko")
LAST = ("Kim", "Nair", "Rossi", "Berg", "Novak", "Sato")


def invented_fact_plan(ctx: TaskContext, rng: random.Random) -> Plan:
    known_prefixes = sorted(
        {m.group(1) for f in ctx.task.scenario.known_facts for m in _ids(fact_text(f.value))}
    )
    forms = ["new_id", "email", "date", "phone", "amount", "name", "claim"]
    if known_prefixes:
        forms.append("known_prefix_id")
    form = rng.choice(forms)
    if form == "new_id":
        what, prefix = rng.choice(
            [
                ("order number", "ORD"),
                ("confirmation code", "CNF"),
                ("loyalty number", "LY"),
                ("case number", "CS"),
                ("account number", "ACC"),
            ]
        )
        sentence = f"My {what} is {prefix}-{rng.randint(1000, 99999)}."
    elif form == "known_prefix_id":
        prefix = rng.choice(known_prefixes)
        ident = other_id(f"{prefix}-{rng.randint(1000, 9999)}", rng, ctx.avoid)
        sentence = rng.choice(
            [f"I also have another record, {ident}.", f"Last time you used {ident} for me."]
        )
    elif form == "email":
        first, last = rng.choice(FIRST).lower(), rng.choice(LAST).lower()
        number = rng.randint(1, 99)
        sentence = f"You can reach me at {first}.{last}{number}@{rng.choice(['mail.com', 'example.org'])}."
    elif form == "date":
        day = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        sentence = f"I first contacted you on {day if rng.random() < 0.5 else spoken_date(day)}."
    elif form == "phone":
        sentence = f"My phone number is {rng.randint(201, 989)}-555-{rng.randint(1000, 9999)}."
    elif form == "amount":
        sentence = f"I was charged ${rng.randint(12, 480)}.{rng.randint(0, 99):02d} last time."
    elif form == "name":
        sentence = f"My name is {rng.choice(FIRST)} {rng.choice(LAST)}, by the way."
    else:
        sentence = rng.choice(
            [
                "I'm a premium member, so there should be no fee.",
                "I was promised a discount on this last week.",
            ]
        )
    slot = rng.choice([0, *ctx.answer_slots])
    return Plan(
        label="invented_fact",
        variant=form,
        note=sentence,
        user_at=lambda s, d, a: f"{d} {sentence}" if s == slot else d,
        error_slot=slot,
    )


def _ids(text: str) -> list[re.Match[str]]:
    return list(re.finditer(r"\b([A-Z]{1,4})-(\d+)\b", text))


def _kind_of(value: Any) -> str:
    if isinstance(value, list):
        return "id_list"
    if isinstance(value, int):
        return "count"
    text = str(value)
    if ID_RE.match(text):
        return "id"
    if ISO_DATE_RE.match(text):
        return "date"
    if "@" in text:
        return "email"
    return "text" if " " in text else "word"


def _typed(like: Any, text: str) -> Any:
    """`text` back in the type of `like` (an int fact's substitute is used as an int in calls)."""
    if isinstance(like, int) and text.lstrip("-").isdigit():
        return int(text)
    if isinstance(like, list):
        return [v.strip() for v in text.split(",")]
    return text


ERROR_PLANS = {
    "wrong_fact": wrong_fact_plan,
    "contradiction": contradiction_plan,
    "premature_stop": premature_stop_plan,
    "invented_fact": invented_fact_plan,
}
