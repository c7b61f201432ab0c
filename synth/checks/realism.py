"""How much an env's tasks read like something a person would ask (issue 16, measured realism).

Synthetic tasks that read like instruction sequences test list-following, not working out what a
user wants; these measures say how far a task set is from that, per env, the same way for our
synthesized tasks and for τ²'s imported ones (`envforge check`, `benchmarks/bench_realism.py`):

- **procedural instructions**: an instruction that names a tool of the env (the identifier as a
  whole word, any case; a name of four or more snake_case parts also spelled with spaces, "find
  customer by email": shorter ones, "cancel order", "add checked bags", are how people speak),
  copies a tool's description (its first clause, when five words or more: "Get a customer's
  profile with their addresses and payment methods"), or is a numbered step list ("1." then
  "2.", as lines or inline, or a reference to "step N"). Target 0.
- **dead reads**: a read call whose result feeds no later argument, reasoning node or required
  output. Where the DAG records data flow (synthesized tasks: `data` edges, reasoning nodes'
  `source`) a read feeds what its data edges reach; where it records none (τ²'s imports, whose
  DAG is the gold actions in order) the flow is read off values: a read feeds a later call when
  one of that call's argument values is in the read's result and was not already known (an
  argument of it or an earlier call, or a fact the user holds). Either way a read whose result
  holds a required output that no reasoning node produced feeds that output. Values need the
  golden calls' results (`golden_results`); without them a DAG with no data flow is not judged.
- **duplicates**: tasks that repeat an earlier one by either of synthesis's identities
  (`taskfile.task_keys`: golden end state with required outputs, or golden calls).
- **principals**: whose story a task is. `Dag.principal` when recorded; else every value of a
  person's id among the golden calls' arguments (a parameter `<who>_id` with `<who>` one of
  `PERSON_WORDS`) and, given the results, among the top-level fields of a call's object result
  (τ²'s `get_order_details` names the order's `user_id`). Ids are compared by value.
- **stiff wording**: an instruction that reads machine-made: a code word said raw ("because
  wrong_size"; ids are exempt: the agent must type them), "the … on file" (a reference that names
  nothing), a persona that is a numbered row ("Member 114"), a label repeated in what the user
  knows, the user's own id in their wishes (the principal named in the third person: "freeze
  membership for member G-114" said to member G-114; a principal that is no person, a channel,
  may be named), a plural after a count of one ("for 1 days"), or "total total". Target 0.
- **shape**: calls, writes and reasoning nodes per task (executed call nodes, those that write,
  reasoning nodes), as min / median / max and mean.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from envforge.server import execute

from ..graph.footprint import parse_result
from ..task.models import KNOWN_FACTS_LINE, CallNode, ReasonNode, Task
from ..task.taskfile import task_keys
from ..walk.context import SynthContext
from ..walk.replayer import side_of

#: The `<who>` of a `<who>_id` parameter that names a person a task can be the story of.
PERSON_WORDS = frozenset(
    {
        "customer",
        "member",
        "user",
        "patient",
        "traveller",
        "traveler",
        "client",
        "guest",
        "borrower",
        "renter",
        "employee",
        "requester",
    }
)

_WORD = r"[A-Za-z0-9_]"
_LINE_ONE = re.compile(r"(?m)^\s*(?:step\s+)?1[.):]\s+\S")
_LINE_TWO = re.compile(r"(?m)^\s*(?:step\s+)?2[.):]\s+\S")
_INLINE_LIST = re.compile(r"(?s)(?<![\w$.,])1[.)]\s+[A-Za-z].*?(?<![\w$.,])2[.)]\s+[A-Za-z]")
_STEP_REF = re.compile(r"(?i)\bstep\s+\d+\b")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Spread(_Model):
    """A per-task count over an env's tasks."""

    min: int
    median: float
    max: int
    mean: float


class TaskRealism(_Model):
    """The realism measures of one task."""

    id: str
    tool_names: list[str]
    tool_descriptions: list[str]
    numbered_steps: bool
    dead_reads: list[str] | None
    principals: list[str]
    stiff: list[str] = []
    calls: int
    writes: int
    reasoning: int

    @property
    def procedural(self) -> bool:
        return bool(self.tool_names or self.tool_descriptions) or self.numbered_steps


class EnvRealism(_Model):
    """The realism measures of one env's task set (what `envforge check` prints and `--json` holds)."""

    env: str
    tasks: int
    procedural: int
    procedural_share: float
    tool_name_tasks: int
    tool_description_tasks: int
    numbered_step_tasks: int
    dead_read_tasks: int | None
    dead_reads: int | None
    duplicates: int
    duplicate_groups: list[list[str]]
    principals: int
    multi_principal_tasks: int
    no_principal_tasks: int
    stiff_tasks: int = 0
    calls: Spread
    writes: Spread
    reasoning: Spread
    examples: dict[str, list[str]]

    def strict_failures(self) -> list[str]:
        """What `check --strict-realism` fails the env for (the targets are 0)."""
        out = []
        if self.procedural:
            out.append(f"{self.procedural} procedural instructions")
        if self.dead_reads:
            out.append(f"{self.dead_reads} dead reads")
        if self.duplicates:
            out.append(f"{self.duplicates} duplicates")
        if self.stiff_tasks:
            out.append(f"{self.stiff_tasks} stiffly worded instructions")
        return out


# --------------------------------------------------------------------------- instructions


def tool_names_in(text: str, tool_names: Iterable[str]) -> list[str]:
    """The tools `text` names: the identifier as a whole word (any case), or, for a name of four
    or more snake_case parts, the same words separated by spaces."""
    found = []
    for name in sorted(set(tool_names)):
        forms = [re.escape(name)]
        parts = [p for p in name.split("_") if p]
        if len(parts) >= 4:
            forms.append(r"\s+".join(re.escape(p) for p in parts))
        if any(re.search(rf"(?<!{_WORD})(?:{f})(?!{_WORD})", text, re.IGNORECASE) for f in forms):
            found.append(name)
    return found


def description_clause(description: str) -> str | None:
    """The first clause of a tool's description (up to the first `.,;:(`), when it is five words
    or more: short ones ("Cancel a booking") are how people speak."""
    clause = re.split(r"[.,;:(\n]", description.strip(), maxsplit=1)[0]
    words = clause.split()
    return " ".join(words).lower() if len(words) >= 5 else None


def tool_descriptions_in(text: str, descriptions: Mapping[str, str]) -> list[str]:
    """The tools whose description's first clause (`description_clause`) `text` copies (any case,
    any spacing)."""
    flat = " ".join(text.split()).lower()
    return sorted(
        name for name, desc in descriptions.items() if (clause := description_clause(desc)) and clause in flat
    )


def has_numbered_steps(text: str) -> bool:
    """Whether `text` is a numbered step list ("1." then "2.", as lines or inline) or refers to a
    numbered step ("the result of step 3")."""
    if _LINE_ONE.search(text) and _LINE_TWO.search(text):
        return True
    return bool(_INLINE_LIST.search(text) or _STEP_REF.search(text))


_CODE_WORD = re.compile(r"\b[a-z]+(?:_[a-z0-9]+)+\b")
_NUMBERED_PERSONA = re.compile(r"[A-Za-z]+ #?\d+")
_ONE_PLURAL = re.compile(
    r"(?<![\w.,-])1 (?:days|nights|hours|weeks|bags|checked bags|copies|seats|items|units)\b"
)


def stiff_wording(task: Task, people: Collection[str] | None = None) -> list[str]:
    """Why `task`'s scenario reads machine-made (the module docstring's list); [] when it does not.
    `people`: the env's tables whose rows are persons (its phrases' `person`), where known. A
    principal of another table (a channel, whose story a Slack task stays on) is not the user, so
    naming it is no third person: "post in channel C-14" is how a member of it asks."""
    scenario = task.scenario
    text = scenario.instruction
    lines = text.splitlines()
    wishes = [ln for ln in lines if not ln.startswith(KNOWN_FACTS_LINE)]
    ids = [f.value for f in scenario.known_facts if "id" in f.name]
    out = []
    raw = [w for w in _CODE_WORD.findall(text) if not re.search(rf"\bids?:? {re.escape(w)}\b", text)]
    if any(not any(word in v for v in ids) for word in raw):
        out.append("code word")
    if " on file" in text:
        out.append("on file")
    if _NUMBERED_PERSONA.fullmatch(scenario.persona.split(",")[0]):
        out.append("numbered persona")
    known = next((ln for ln in lines if ln.startswith(KNOWN_FACTS_LINE)), "")
    parts = known.removeprefix(KNOWN_FACTS_LINE).lstrip().split("; ")
    labels = [part.split(":", 1)[0] for part in parts if ":" in part]
    if len(labels) != len(set(labels)):
        out.append("repeated label")
    principal = task.dag.principal
    if principal is not None and len(principal.key) == 1 and (people is None or principal.table in people):
        (me,) = (str(v) for v in principal.key.values())
        if any(re.search(rf"(?<![\w-]){re.escape(me)}(?![\w-])", ln) for ln in wishes):
            out.append("user in the third person")
    if _ONE_PLURAL.search(text):
        out.append("plural after one")
    if "total total" in text:
        out.append("total total")
    return out


# --------------------------------------------------------------------------- values


def _norm(value: Any) -> str:
    """A scalar as compared across arguments, results and outputs: numbers by value, text by
    its trimmed lower case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return format(float(value), ".10g")
    text = str(value).strip()
    number = text.replace(",", "").removeprefix("$")
    try:
        return format(float(number), ".10g")
    except ValueError:
        return text.lower()


def _leaves(value: Any) -> set[str]:
    out: set[str] = set()

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif v is not None and v != "":
            out.add(_norm(v))

    walk(value)
    return out


def _result_leaves(text: str) -> set[str]:
    data = parse_result(text)
    if data is None:
        return {_norm(text)} if text.strip() else set()
    return _leaves(data)


def _executed_calls(task: Task) -> list[CallNode]:
    return [n for n in task.dag.nodes if isinstance(n, CallNode) and n.executed]


def _aligned_results(task: Task, results: Sequence[str] | None) -> dict[str, str] | None:
    """Executed call nodes' ids -> result texts (`results` in `golden_calls` order), or None when
    they do not line up with the task's calls."""
    nodes = _executed_calls(task)
    if results is None or len(results) != len(nodes) or len(nodes) != len(task.golden_calls):
        return None
    if any(n.call.name != c.name for n, c in zip(nodes, task.golden_calls, strict=True)):
        return None
    return {n.id: text for n, text in zip(nodes, results, strict=True)}


# --------------------------------------------------------------------------- dead reads


def dead_reads(task: Task, results: Sequence[str] | None = None) -> list[str] | None:
    """The ids of the task's read calls whose result feeds nothing (module docstring); None when
    the DAG records no data flow and no results are given to read it off."""
    texts = _aligned_results(task, results)
    reads = [n for n in _executed_calls(task) if not n.write and not n.expect_error]
    reasoned = {_norm(n.value) for n in task.dag.nodes if isinstance(n, ReasonNode) and n.value is not None}
    direct_outputs = {_norm(o) for o in task.required_outputs} - reasoned
    fed_by_edges = {e.source for e in task.dag.edges if e.kind == "data"}
    fed_by_edges |= {n.source for n in task.dag.nodes if isinstance(n, ReasonNode) and n.source}
    flow_recorded = bool(fed_by_edges) or any(isinstance(n, ReasonNode) for n in task.dag.nodes)
    if not flow_recorded and texts is None:
        return None
    leaves = {nid: _result_leaves(text) for nid, text in (texts or {}).items()}
    dead = []
    for read in reads:
        if read.id in fed_by_edges:
            continue
        if read.id in leaves and direct_outputs & leaves[read.id]:
            continue
        if not flow_recorded and read.id in leaves and _feeds_by_value(task, read, leaves[read.id]):
            continue
        dead.append(read.id)
    return dead


def _feeds_by_value(task: Task, read: CallNode, result: set[str]) -> bool:
    """Whether a call after `read` takes a value that `read`'s result holds and nothing before
    it (the user's facts, its own or an earlier call's arguments) already gave."""
    known = _leaves([f.value for f in task.scenario.known_facts])
    calls = _executed_calls(task)
    at = calls.index(read)
    for node in calls[: at + 1]:
        known |= _leaves(node.call.arguments)
    fresh = result - known
    return any(fresh & _leaves(node.call.arguments) for node in calls[at + 1 :])


# --------------------------------------------------------------------------- principals


def is_person_id(param: str) -> bool:
    """Whether a parameter or field names a person's id (`<who>_id`, `<who>` in `PERSON_WORDS`)."""
    if not param.endswith("_id"):
        return False
    who = param[: -len("_id")].rsplit("_", 1)[-1]
    return who in PERSON_WORDS


def task_principals(task: Task, results: Sequence[str] | None = None) -> list[str]:
    """Whose story the task is (module docstring), sorted."""
    if task.dag.principal is not None:
        return ["/".join(str(v) for v in task.dag.principal.key.values())]
    found: set[str] = set()
    for call in task.golden_calls:
        for param, value in call.arguments.items():
            if is_person_id(param):
                found |= {
                    str(v) for v in (value if isinstance(value, list) else [value]) if v not in (None, "")
                }
    for text in (_aligned_results(task, results) or {}).values():
        data = parse_result(text)
        if isinstance(data, dict):
            found |= {
                str(v) for k, v in data.items() if is_person_id(k) and isinstance(v, str | int) and v != ""
            }
    return sorted(found)


# --------------------------------------------------------------------------- duplicates


def duplicate_groups(tasks: Sequence[Task]) -> list[list[str]]:
    """Groups (in file order) of tasks that are one task by either identity of `task_keys`."""
    parent = list(range(len(tasks)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[int, str], int] = {}
    for i, task in enumerate(tasks):
        for which, key in enumerate(task_keys(task)):
            j = first.setdefault((which, key), i)
            parent[root(i)] = root(j)
    groups: dict[int, list[str]] = {}
    for i, task in enumerate(tasks):
        groups.setdefault(root(i), []).append(task.id)
    return [g for g in groups.values() if len(g) > 1]


# --------------------------------------------------------------------------- per task, per env


def task_realism(
    task: Task,
    tool_names: Iterable[str],
    results: Sequence[str] | None = None,
    descriptions: Mapping[str, str] | None = None,
    people: Collection[str] | None = None,
) -> TaskRealism:
    calls = _executed_calls(task)
    return TaskRealism(
        id=task.id,
        tool_names=tool_names_in(task.scenario.instruction, tool_names),
        tool_descriptions=tool_descriptions_in(task.scenario.instruction, descriptions or {}),
        numbered_steps=has_numbered_steps(task.scenario.instruction),
        dead_reads=dead_reads(task, results),
        principals=task_principals(task, results),
        stiff=stiff_wording(task, people),
        calls=len(calls),
        writes=sum(1 for n in calls if n.write),
        reasoning=sum(1 for n in task.dag.nodes if isinstance(n, ReasonNode)),
    )


def spread(values: Sequence[int]) -> Spread:
    if not values:
        return Spread(min=0, median=0.0, max=0, mean=0.0)
    return Spread(
        min=min(values),
        median=float(statistics.median(values)),
        max=max(values),
        mean=round(statistics.fmean(values), 2),
    )


def measure_realism(
    env: str,
    tasks: Sequence[Task],
    tool_names: Iterable[str],
    results: Mapping[str, Sequence[str]] | None = None,
    descriptions: Mapping[str, str] | None = None,
    people: Collection[str] | None = None,
) -> EnvRealism:
    """The realism measures of `env`'s `tasks`; `results` maps task ids to their golden calls'
    result texts (`golden_results`), which judge value flow and name principals in results;
    `descriptions` maps tool names to their descriptions, which instructions must not copy;
    `people` names the tables whose rows are persons (`stiff_wording`)."""
    names = sorted(set(tool_names))
    per = [task_realism(t, names, (results or {}).get(t.id), descriptions, people) for t in tasks]
    groups = duplicate_groups(tasks)
    judged = [p.dead_reads for p in per if p.dead_reads is not None]
    procedural = [p for p in per if p.procedural]
    return EnvRealism(
        env=env,
        tasks=len(tasks),
        procedural=len(procedural),
        procedural_share=round(len(procedural) / len(tasks), 4) if tasks else 0.0,
        tool_name_tasks=sum(1 for p in per if p.tool_names),
        tool_description_tasks=sum(1 for p in per if p.tool_descriptions),
        numbered_step_tasks=sum(1 for p in per if p.numbered_steps),
        dead_read_tasks=sum(1 for d in judged if d) if judged or not per else None,
        dead_reads=sum(len(d) for d in judged) if judged or not per else None,
        duplicates=sum(len(g) - 1 for g in groups),
        duplicate_groups=groups,
        principals=len({who for p in per for who in p.principals}),
        multi_principal_tasks=sum(1 for p in per if len(p.principals) > 1),
        no_principal_tasks=sum(1 for p in per if not p.principals),
        stiff_tasks=sum(1 for p in per if p.stiff),
        calls=spread([p.calls for p in per]),
        writes=spread([p.writes for p in per]),
        reasoning=spread([p.reasoning for p in per]),
        examples={
            "procedural": [p.id for p in procedural][:5],
            "dead_reads": [p.id for p in per if p.dead_reads][:5],
            "multi_principal": [p.id for p in per if len(p.principals) > 1][:5],
            "stiff": [f"{p.id} ({', '.join(p.stiff)})" for p in per if p.stiff][:5],
        },
    )


async def golden_results(ctx: SynthContext, task: Task) -> list[str]:
    """The result text of each golden call, replayed in order on the task's initial state, each
    on its requestor's side (a dual-control user's call on the user's tools); tools are
    deterministic: the `deterministic` self-check holds shipped tasks to it."""
    database, _, _ = ctx.states.task_initial(task)
    episode = await ctx.replayer.open_episode(database)
    try:
        return [(await execute(episode, c.name, c.arguments, side_of(c))).text for c in task.golden_calls]
    finally:
        await ctx.replayer.close_episode(episode)


# --------------------------------------------------------------------------- the table


def _spread_cell(s: Spread) -> str:
    median = f"{s.median:g}"
    return f"{s.min}/{median}/{s.max} {s.mean:.1f}"


def realism_table(rows: Sequence[EnvRealism]) -> str:
    """One line per env, within 80 columns: procedural instructions (tool names or numbered
    steps) as a share, stiffly worded ones (`stiff_wording`), tasks with dead reads / dead reads,
    duplicates, distinct principals (and tasks with more than one), and min/median/max mean of
    calls, writes and reasoning nodes."""
    head = ("env", "tasks", "proc", "stiff", "dead", "dup", "who", "calls", "writes", "reason")
    lines = [head]
    for r in rows:
        dead = "-" if r.dead_reads is None else f"{r.dead_read_tasks}/{r.dead_reads}"
        who = f"{r.principals}" + (f" ({r.multi_principal_tasks})" if r.multi_principal_tasks else "")
        lines.append(
            (
                r.env[:14],
                str(r.tasks),
                f"{100 * r.procedural_share:.0f}%",
                str(r.stiff_tasks),
                dead,
                str(r.duplicates),
                who,
                _spread_cell(r.calls),
                _spread_cell(r.writes),
                _spread_cell(r.reasoning),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for line in lines:
        cells = [line[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)]
        out.append(" ".join(cells).rstrip())
    return "\n".join(out)
