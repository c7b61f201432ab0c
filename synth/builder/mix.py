"""Which intent each attempt of a run aims at, and which built tasks would make a run repetitive.

Walks go where calls work, and some writes work almost always (a freeze, a restock): left alone,
a run ships them again and again (eight of ten gym tasks of seed 7 froze a membership). A run
therefore steers by intent (`checks/diversity.py`: the writes a task asks for, its reasoning
kinds, its user's role), in two ways:

- **aim**: each attempt aims at one write tool, drawn with weights that favour the tools the last
  `WINDOW - 1` shipped tasks asked for least (least-used first, the rest still possible), and that
  fall for a tool whose aimed attempts keep shipping nothing with it (`Tally`); the walk is cast in
  the role that may ask for that tool (`walk/roles.py`) and its steps towards the tool are made
  `AIM_BOOST` times likelier;
- **cap**: a task whose intent was shipped `MAX_REPEAT` times among the last `WINDOW - 1` tasks
  is not shipped, so any `WINDOW` tasks in a row hold at least `WINDOW / (MAX_REPEAT + 1)`
  intents, rounded up; an env that cannot give more keeps shipping what it can after `PATIENCE`
  such refusals in a row. The cap is on whole intents, not on the writes alone: an env with three
  writes, one of which never ships alone (gym), still varies by reasoning.

Both draw on the run's shipped tasks and streams of their own (`"S:k:aim"`), so the same seed
still writes the same bytes. `SynthConfig(vary=False)` turns both off.
"""

from __future__ import annotations

import random
from collections import Counter, deque

from ..checks.diversity import WINDOW, Intent, intent_of
from ..graph.domains import weighted_choice
from ..task.models import Task
from ..walk.outcomes import Tally
from ..walk.roles import Roles

# How many times likelier a walk's step towards the aimed write tool is.
AIM_BOOST = 6.0
# The most tasks of one intent among the last WINDOW - 1 shipped, before one more is refused.
MAX_REPEAT = 2
# Refusals in a row after which a repetitive task ships anyway (the env gives little else).
PATIENCE = 60


class IntentMix:
    """One run's recent intents, the next attempt's aim, and the cap on repeats."""

    def __init__(self, roles: Roles, tools: list[str]) -> None:
        self.roles = roles
        self.tools = sorted(tools)
        self.recent: deque[Intent] = deque(maxlen=WINDOW - 1)
        self.shipped: Counter[str] = Counter()
        self.aims = Tally()
        self.refused = 0  # repetitive tasks refused in a row

    def aim(self, rng: random.Random) -> str | None:
        """The write tool the next attempt aims at (None: the env has none)."""
        if not self.tools:
            return None
        recent = Counter(t for writes, _, _ in self.recent for t in writes)
        total = sum(self.shipped.values()) or 1

        def weight(tool: str) -> float:
            return self.aims.weight(tool) / (1 + recent[tool]) ** 2 / (1 + self.shipped[tool] / total)

        return weighted_choice(rng, self.tools, weight)

    def admits(self, task: Task) -> bool:
        """Whether `task` may ship: its intent was shipped fewer than `MAX_REPEAT` times lately,
        or `PATIENCE` tasks in a row were refused already."""
        if self.recent.count(intent_of(task, self.roles)) < MAX_REPEAT or self.refused >= PATIENCE:
            return True
        self.refused += 1
        return False

    def record(self, aim: str | None, task: Task | None) -> None:
        """Count an attempt aimed at `aim` and the task it shipped (None: it shipped nothing)."""
        intent = intent_of(task, self.roles) if task is not None else None
        if aim is not None:
            self.aims.add(aim, intent is not None and aim in intent[0])
        if intent is not None:
            self.refused = 0
            self.recent.append(intent)
            self.shipped.update(intent[0])
