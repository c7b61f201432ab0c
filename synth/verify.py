"""Self-verification: the five checks every shipped task passes, each catching a kind of bad task.

1. golden_replay     replaying the golden calls scores 1.0 (the golden state is reachable);
2. do_nothing        an agent that does nothing scores 0 (the task asks for something);
3. drop_write        dropping any single successful write call scores < 1 (every write matters);
4. not_presatisfied  the initial state is not already the golden state;
5. deterministic     executing the golden calls twice gives the same state hash.
"""

from __future__ import annotations

import json
from typing import Any

from envforge.server import State, state_hash

from .models import Task
from .scoring import oracle_messages, score_episode

CHECKS = ("golden_replay", "do_nothing", "drop_write", "not_presatisfied", "deterministic")


def write_indices(ctx: Any, task: Task) -> list[int]:
    """Positions in `golden_calls` of write calls that are meant to succeed."""
    refused = {
        json.dumps(n.call.model_dump(), sort_keys=True)
        for n in task.dag.nodes
        if n.kind == "call" and n.expect_error and n.call is not None
    }
    return [
        i
        for i, c in enumerate(task.golden_calls)
        if c.name in ctx.env.tools
        and not ctx.env.tools[c.name].read_only
        and json.dumps(c.model_dump(), sort_keys=True) not in refused
    ]


async def verify_task(ctx: Any, task: Task, *, golden_state: State | None = None) -> list[str]:
    """The names of the checks `task` fails (empty: it passes).

    Standalone (`envforge check`), everything is judged against the task's stored hashes and the
    golden calls are executed twice. Right after synthesis the caller passes the `golden_state`
    its construction run produced (execution one): the replay is compared with it directly, and
    write-dropping replays export only the tables the task's tools can write.

    The golden replay serialises its database just before each write call (a memcpy), so the
    replay that drops write i starts from that snapshot (the state `calls[:i]` reach) and runs
    only the write calls after it: a read call cannot change state (the runtime rolls back and
    refuses one that tries), so skipping them leaves the end state, and the verdict, as it was.
    When the replay ends on a database byte-identical to the one the golden state was exported
    from (noted by `build_task`), that export is the replay's export and is not repeated.
    """
    failed: list[str] = []
    database, initial_state, initial_cents = ctx.task_initial(task)
    messages = oracle_messages(task)
    if initial_cents == task.golden_cents_hash:
        failed.append("not_presatisfied")
    drops = write_indices(ctx, task)
    final, snapshots = await ctx.replay_snapshots(
        database, task.golden_calls, drops, unless_equal=ctx.golden_db(golden_state)
    )
    if final is None:  # the replay ended on the very database the golden state was exported from
        assert golden_state is not None
        final = golden_state
    h1 = state_hash(final) if golden_state is None else ""
    if score_episode(task, final, messages, golden_state=golden_state).reward != 1.0:
        failed.append("golden_replay")
    if score_episode(task, initial_state, [], golden_state=golden_state).reward != 0.0:
        failed.append("do_nothing")
    tables = None
    golden_part = None
    if golden_state is not None:
        tables = ctx.write_tables([c.name for c in task.golden_calls])
        golden_part = {t: golden_state[t] for t in tables}
    tools = ctx.env.tools
    for i in drops:
        rest = [c for c in task.golden_calls[i + 1 :] if c.name not in tools or not tools[c.name].read_only]
        dropped, _ = await ctx.replay(snapshots[i], rest, tables=tables, hashed=False)
        if score_episode(task, dropped, messages, golden_state=golden_part).reward >= 1.0:
            failed.append("drop_write")
            break
    if golden_state is not None:
        if final != golden_state:
            failed.append("deterministic")
    elif h1 != (await ctx.replay(database, task.golden_calls))[1]:
        failed.append("deterministic")
    return [c for c in CHECKS if c in failed]
