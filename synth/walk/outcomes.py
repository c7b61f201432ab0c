"""What walks have learned about which calls work, to steer later walks towards calls that do.

Most tries a walk makes fail: the entity picked is in the wrong status (a flown reservation
cannot be upgraded, a delivered order cannot be changed), or a value carried over from a result
is the wrong kind of value (a ticket's own priority, given back to `change_ticket_priority`).
Nothing in the schema says so; the tools' refusals do. A synthesis run keeps tallies of what
worked, and walks weigh their choices by the smoothed success rates (`Tally`): an entity, an
edge or a start tool that keeps failing is tried less often, but never ruled out.

- Values are tallied per (parameter, value) across all write tools (a flown reservation fails
  every write that takes it, so one tool's refusals teach the others) and per (tool, parameter,
  value) for read tools (reads succeed on almost anything, and their successes must not vouch
  for an entity to the writes). A refusal that names some of the call's values blames only those.
- Graph edges are tallied per (source tool, result key, target tool, parameter).
- Start tools are tallied by whether their walk went on to write.

Tools themselves are not weighed by success: that would favour the tools whose preconditions are
easy (placing an order over changing one), and tasks would cover fewer tools. Coverage is kept
instead (`Outcomes.record_task`): a write tool that ships in fewer tasks than its share is made
somewhat likelier.

The tallies carry over from one attempt to the next within a run, so an attempt's walk depends on
the attempts before it: synthesis stays deterministic (attempts run in order, and the same seed
gives the same file), but attempt k alone cannot be rebuilt without the ones before it.
`SynthConfig(steer=False)` turns steering off.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

# The least weight a choice keeps, however often it failed: rare successes stay reachable.
FLOOR = 0.05
# How much likelier (or less likely) a write tool is made for coverage, at most.
COVERAGE_SPAN = 1.5
# The shortest text value a refusal must contain to be blamed alone (shorter ones match by chance).
MENTION_MIN = 3


class Tally:
    """Successes and failures per key, and the weight they give: (successes + 1) / (tries + 1),
    at least `FLOOR`. An untried key weighs 1, one failure halves it, and with more tries the
    weight tends to the success rate. Weights are kept beside the counts: walks read them far more
    often than they record."""

    def __init__(self, learn: bool = True) -> None:
        self._counts: dict[Hashable, list[int]] = {}
        self.weights: dict[Hashable, float] = {}
        self.learn = learn

    def add(self, key: Hashable, ok: bool) -> None:
        if not self.learn:
            return
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = [0, 0]
        counts[0 if ok else 1] += 1
        self.weights[key] = max(FLOOR, (counts[0] + 1) / (counts[0] + counts[1] + 1))

    def weight(self, key: Hashable) -> float:
        return self.weights.get(key, 1.0)


def _value_key(value: Any) -> Hashable | None:
    """A key for a plain scalar that keeps 1, 1.0 and True apart (strings, the most common, as they
    are); None for anything else."""
    if type(value) is str:
        return value
    if isinstance(value, int | float | bool) or value is None:
        return (type(value), value)
    return None


def value_key(tool: str, read_only: bool, param: str, value: Any) -> Hashable | None:
    """The `Outcomes.values` key of `value` as `param` of `tool` (None: not tallied)."""
    key = _value_key(value)
    return None if key is None else (tool if read_only else "", param, key)


def argument_items(arguments: dict[str, Any]) -> list[tuple[str, Any]]:
    """(parameter, value) for every scalar argument, a list parameter's items one by one."""
    return [
        (param, item)
        for param, value in arguments.items()
        for item in (value if isinstance(value, list) else (value,))
    ]


def named_in(error: str, items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The items whose text value a refusal names ("reservation R-5011 is flown"): what it blames."""
    return [(p, v) for p, v in items if type(v) is str and len(v) >= MENTION_MIN and v in error]


class Outcomes:
    """Success tallies of tool calls during one synthesis run."""

    def __init__(self, learn: bool = True) -> None:
        """`learn=False` keeps every weight at 1: walks then choose as if nothing had been tried."""
        self.learn = learn
        self.values = Tally(learn)  # ("" for writes or the read tool, parameter, value) -> call worked
        self.edges = Tally(learn)  # (source tool, result key, target tool, parameter) -> call worked
        self.starts = Tally(learn)  # start tool -> did the walk go on to write
        # (earlier write tool, later write tool) -> did the later one keep the earlier one's
        # changes (a walk whose write undoes an earlier one is discarded: `tasks.Builder.undoes`)
        self.sequels = Tally(learn)
        self.shipped: dict[str, int] = {}  # write tool -> successful calls of it in shipped tasks
        self.coverage: dict[str, float] = {}  # write tool -> its weight for coverage
        self.calls = 0  # calls recorded, learning or not: what synthesis reports
        self.failed = 0

    def record(
        self, tool: str, read_only: bool, arguments: dict[str, Any], ok: bool, error: str = ""
    ) -> None:
        """Count one call's outcome against its scalar argument values.

        A refusal usually names what it refused ("reservation R-5011 is flown", "member M-1020 is
        suspended"): when `error` mentions some of the call's text values, only those are blamed,
        and the others, which may be fine, are not counted at all. Otherwise every value is.
        """
        self.calls += 1
        self.failed += not ok
        scope = tool if read_only else ""
        items = argument_items(arguments)
        if error:
            items = named_in(error, items) or items
        for param, item in items:
            key = _value_key(item)
            if key is not None:
                self.values.add((scope, param, key), ok)

    def record_task(self, write_tools: list[str], writes: list[str]) -> None:
        """Count a shipped task's successful write calls (`writes`) among the env's `write_tools`,
        and weigh each write tool by how far its count is below the mean (or above it).

        Steering towards calls that work favours the tools whose preconditions are easy to meet
        (placing an order over changing one): a tool that ships less than its share is made up
        to `COVERAGE_SPAN` times likelier, one that ships more as many times less.
        """
        if not self.learn:
            return
        for tool in writes:
            self.shipped[tool] = self.shipped.get(tool, 0) + 1
        mean = sum(self.shipped.values()) / max(1, len(write_tools))
        self.coverage = {
            t: min(COVERAGE_SPAN, max(1 / COVERAGE_SPAN, (mean + 1) / (self.shipped.get(t, 0) + 1)))
            for t in write_tools
        }

    def record_edge(self, edge: tuple[str, str, str, str], ok: bool) -> None:
        """Count a call whose `param` was fed a `key` of `source`'s result: (source, key, target, param).
        Feeding along some edges never works (a ticket's own priority, fed to
        `change_ticket_priority`), along others often (an order id, fed to `cancel_order`)."""
        self.edges.add(edge, ok)

    def record_walk(self, start: str, wrote: bool) -> None:
        """Count whether a walk that began with tool `start` went on to write (else it is discarded):
        some tools lead only to lookups, or to writes whose preconditions rarely hold."""
        self.starts.add(start, wrote)

    def value_weight(self, tool: str, read_only: bool, param: str, value: Any) -> float:
        return self.values.weights.get(value_key(tool, read_only, param, value), 1.0)

    def weigh_for_writes(self, param: str, value: Any) -> float:
        """How well `value` has done as `param` of write calls: what a walk weighs an entity by when it
        picks one itself, for a read as much as for a write, since the walk is there to write."""
        key = _value_key(value)
        return 1.0 if key is None else self.values.weights.get(("", param, key), 1.0)
