"""How varied an env's tasks are, and whether each casts its user in a role that may ask for it.

A task set in which eight of ten tasks read "You want to freeze your membership" trains and tests
one thing eight times. What a task asks of the agent is its intent: the write tools the user asks
for (every write node, a refused or untaken one too), the kinds of reasoning it needs (argmax,
filter, count, branch, …) and the role of its user (`walk/roles.py`: the principal's, "patient",
or staff's). The measures, per env, the same way for any task file (`envforge check`,
`benchmarks/bench_diversity.py`):

- **intents**: distinct intents among the tasks, and among the first `WINDOW` of them (what a
  short run of `synth tasks --n 10` gives);
- **window**: the fewest distinct intents in any `WINDOW` consecutive tasks (all of them, when
  there are fewer), and the mean over every such window: a file can hold many intents in all and
  still bunch them, ten of one kind then ten of another;
- **top share**: the share of the most common intent;
- **role mismatches**: tasks whose user's role may not ask for one of its writes (a patient who
  restocks a drug). Target 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from envforge.server import Environment

from ..graph.domains import derive_domains
from ..task.models import Task, ToolGraph
from ..task.statediff import primary_keys
from ..walk.principal import Ownership
from ..walk.roles import Roles, env_roles

#: How many consecutive tasks a window holds.
WINDOW = 10

Intent = tuple[tuple[str, ...], tuple[str, ...], str]
"""(write tools asked for, reasoning kinds, the user's role), the tuples sorted."""


def roles_of(env: Environment, graph: ToolGraph) -> Roles:
    """`env`'s roles (`walk/roles.py`) without a synthesis context: for measuring a task file."""
    return env_roles(env, Ownership(env, graph, primary_keys(env.tables)), derive_domains(env))


def write_tools(task: Task) -> tuple[str, ...]:
    """The write tools `task`'s user asks for: every write node's, refused or untaken too."""
    return tuple(sorted({n.call.name for n in task.dag.nodes if n.kind == "call" and n.write}))


def intent_of(task: Task, roles: Roles) -> Intent:
    """What `task` asks of the agent (see the module docstring)."""
    kinds = tuple(sorted({n.op for n in task.dag.nodes if n.kind == "reason"}))
    return write_tools(task), kinds, roles.role_of(task.dag.principal)


def window_counts(intents: Sequence[Intent], window: int = WINDOW) -> list[int]:
    """Distinct intents in each `window` consecutive ones (one count for a shorter list)."""
    if len(intents) <= window:
        return [len(set(intents))] if intents else []
    return [len(set(intents[i : i + window])) for i in range(len(intents) - window + 1)]


class Diversity(BaseModel):
    """The diversity measures of one env's task set (what `envforge check` prints and `--json` holds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str
    tasks: int
    intents: int
    first_window: int
    window: int = WINDOW
    window_min: int
    window_mean: float
    top_intent: str
    top_share: float
    roles: list[str]
    role_mismatches: int
    mismatch_examples: list[str]


def describe(intent: Intent) -> str:
    """An intent in a few words: `freeze_membership+book_class [argmax] (member)`."""
    writes, kinds, role = intent
    text = "+".join(writes) or "no write"
    return text + (f" [{','.join(kinds)}]" if kinds else "") + f" ({role})"


def measure_diversity(env: str, tasks: Sequence[Task], roles: Roles, window: int = WINDOW) -> Diversity:
    """The diversity measures of `env`'s `tasks`, in file order."""
    intents = [intent_of(t, roles) for t in tasks]
    counts = window_counts(intents, window)
    top, top_n = Counter(intents).most_common(1)[0] if intents else (((), (), ""), 0)
    bad = [(t.id, roles.mismatches(t)) for t in tasks]
    bad = [(tid, tools) for tid, tools in bad if tools]
    return Diversity(
        env=env,
        tasks=len(tasks),
        intents=len(set(intents)),
        first_window=len(set(intents[:window])),
        window=window,
        window_min=min(counts, default=0),
        window_mean=round(sum(counts) / len(counts), 2) if counts else 0.0,
        top_intent=describe(top) if intents else "",
        top_share=round(top_n / len(intents), 4) if intents else 0.0,
        roles=sorted({i[2] for i in intents}),
        role_mismatches=len(bad),
        mismatch_examples=[f"{tid} ({', '.join(tools)})" for tid, tools in bad[:5]],
    )


def diversity_line(d: Diversity) -> str:
    """One line for `check`: intents in all and in the first window, the fewest and mean in any
    window, the most common intent's share, the roles, and the tasks casting the wrong role."""
    line = (
        f"{d.env}: {d.intents} intents in {d.tasks} tasks, {d.first_window} in the first {d.window}; "
        f"any {d.window} in a row cover {d.window_min}+ (mean {d.window_mean:.1f}); "
        f"top {100 * d.top_share:.0f}% {d.top_intent}; roles {', '.join(d.roles) or '-'}; "
        f"role mismatches {d.role_mismatches}"
    )
    if d.mismatch_examples:
        line += f" ({', '.join(d.mismatch_examples[:3])})"
    return line
