"""Self-verification: the checks every shipped task passes, each catching a kind of bad task.

1. golden_replay     replaying the golden calls scores 1.0 (the golden state is reachable);
2. do_nothing        an agent that does nothing scores 0 (the task asks for something);
3. drop_write        dropping any single successful write call scores < 1 (every write matters);
4. not_presatisfied  the initial state is not already the golden state;
5. deterministic     executing the golden calls twice gives the same state hash;
6. refusals         every call the task expects to be refused is refused by a rule of the env
                     (`ToolError`), not failed by an env error (a crash is no refusal);
7. untaken_branch    each branch's call not taken would have done what the DAG says had the
                     branch gone the other way: run in the state the branch is decided in (the
                     initial state plus the golden calls before it), it succeeds and changes the
                     state (or, marked to be refused, is refused). A task with no branch passes.
8. stored_golden     the golden end state the task stores (its exact hash and its diff from the
                     initial state, which the report shows) is the one its golden calls reach:
                     checked standalone, since synthesis writes both from the run it just made.

All run from the task's initial state: the seed with the task's setup rows applied.

`adversary_rewards` runs the adversarial agents of `adversaries.py` on a task: a task on which one
of them earns full reward can be gamed, and is neither shipped by synthesis nor passed by `check`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from envforge.server import State, state_hash

from ..task.golden import GoldenRun
from ..task.models import Call, CallNode, RewardPart, RowCheck, Task, ToolShape
from ..task.policy_rules import PolicyRules, load_policy_rules, steps_of_calls
from ..task.rewards import EnvAssertionError, Evidence, PartScore, compose_reward, judge_env_assertions
from ..task.scoring import oracle_messages, shown_results
from ..task.statediff import apply_diff, cents_hash, states_match
from ..walk.context import SynthContext
from ..walk.states import setup_key
from .adversaries import ADVERSARIES, adversary_calls, adversary_message, counts, write_positions

CHECKS = (
    "golden_replay",
    "do_nothing",
    "drop_write",
    "not_presatisfied",
    "deterministic",
    "refusals",
    "untaken_branch",
    "stored_golden",
)


async def _reward(
    ctx: SynthContext,
    task: Task,
    final: State,
    messages: list[str],
    *,
    golden_state: State | None,
    shown: Sequence[str] = (),
    keys: Mapping[str, tuple[str, ...]] | None = None,
    policy: PolicyRules | None = None,
    calls: Sequence[Call] = (),
    agent_calls: Sequence[Call] | None = None,
) -> float:
    """The reward `compose_reward` gives the episode: only the parts of the task's basis are scored.
    `shown`: the result texts the run saw (an adversary may repeat what it was shown); with
    `policy`, the env's rules are judged on `calls`, made with no word to or from the user;
    `agent_calls`, where the run's calls are known, judge the `actions` part as the harness does.
    A task's env assertions (τ² telecom) are judged on `final`, which must then be the whole
    state, with the env's check tools (`_env_assertions`), so a run is scored as an eval scores it."""
    evidence = Evidence(
        final,
        messages,
        shown,
        keys,
        agent_calls=agent_calls,
        golden_state=golden_state,
        verdicts=await _env_assertions(ctx, task, final),
        policy=policy,
        trajectory=None if policy is None else steps_of_calls(calls, []),
    )
    return compose_reward(task, evidence).value


async def _env_assertions(ctx: SynthContext, task: Task, final: State) -> dict[RewardPart, PartScore]:
    """The env-assertion verdict on `final` for a task whose basis has the part (none otherwise:
    the checks need no episode). An assertion that cannot be judged fails the part: the task is
    broken, so its golden replay fails rather than `check` stopping."""
    if not task.env_assertions or RewardPart.ENV_ASSERTIONS not in task.reward_basis:
        return {}
    try:
        verdict = await judge_env_assertions(ctx.env, task, final)
    except EnvAssertionError as exc:
        verdict = PartScore(0.0, str(exc))
    return {RewardPart.ENV_ASSERTIONS: verdict}


def write_indices(ctx: SynthContext, task: Task) -> list[int]:
    """Positions in `golden_calls` of write calls that are meant to succeed."""
    return write_positions(task, {name for name, spec in ctx.env.tools.items() if not spec.read_only})


def refusal_indices(task: Task) -> list[int]:
    """Positions in `golden_calls` of the calls the task expects to be refused (executed call nodes
    and golden calls correspond by position)."""
    executed = [n for n in task.dag.nodes if n.kind == "call" and n.executed]
    return [
        i
        for i, n in enumerate(executed)
        if n.expect_error and i < len(task.golden_calls) and task.golden_calls[i] == n.call
    ]


def untaken_calls(task: Task) -> list[tuple[int | None, CallNode | None]]:
    """Per branch node, the position in `golden_calls` of the call it took (None when the calls do
    not hold it there) and the call node it did not take (None when the DAG has none)."""
    executed = [n for n in task.dag.nodes if n.kind == "call" and n.executed]
    position = {n.id: i for i, n in enumerate(executed)}
    out: list[tuple[int | None, CallNode | None]] = []
    for b in task.dag.nodes:
        if b.kind != "reason" or b.op != "branch" or b.then_node is None or b.else_node is None:
            continue
        taken, untaken = (b.then_node, b.else_node) if b.value else (b.else_node, b.then_node)
        i = position.get(taken)
        if i is not None and (i >= len(task.golden_calls) or task.golden_calls[i] != executed[i].call):
            i = None
        node = next((n for n in task.dag.nodes if n.id == untaken), None)
        if node is None or node.kind != "call":
            out.append((None, None))  # nothing to run: the branch cannot be shown to work
        else:
            out.append((i, node))
    return out


def checkpoint_rows(task: Task) -> dict[int, list[RowCheck]]:
    """Per position in `golden_calls`, the golden rows its call's checkpoint names (the rows that
    write changed): where a replay without that write differs from the golden state, it is
    likeliest to differ there."""
    executed = [n for n in task.dag.nodes if n.kind == "call" and n.executed]
    calls = task.golden_calls
    at = {n.id: i for i, n in enumerate(executed) if i < len(calls) and calls[i] == n.call}
    return {at[c.node]: c.rows for c in task.checkpoints if c.node in at}


async def verify_task(ctx: SynthContext, task: Task, *, golden_state: State | None = None) -> list[str]:
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
    database, initial_state, initial_cents = ctx.states.task_initial(task)
    messages = oracle_messages(task)
    if initial_cents == task.golden_cents_hash:
        failed.append("not_presatisfied")
    drops = write_indices(ctx, task)
    branches = untaken_calls(task)
    at = sorted(set(drops) | {i for i, _ in branches if i is not None})
    kinds: dict[int, str] = {}
    final, snapshots = await ctx.replayer.replay_snapshots(
        database, task.golden_calls, at, unless_equal=ctx.replayer.golden_db(golden_state), kinds=kinds
    )
    if any(kinds.get(i, "refused") != "refused" for i in refusal_indices(task)):
        failed.append("refusals")  # an expected refusal that succeeds, or is an env's crash
    if final is None:  # the replay ended on the very database the golden state was exported from
        assert golden_state is not None
        final = golden_state
    h1 = state_hash(final) if golden_state is None else ""
    calls = task.golden_calls
    if await _reward(ctx, task, final, messages, golden_state=golden_state, agent_calls=calls) != 1.0:
        failed.append("golden_replay")
    if await _reward(ctx, task, initial_state, [], golden_state=golden_state, agent_calls=[]) != 0.0:
        failed.append("do_nothing")
    tables = None
    golden_part = golden_state
    if golden_state is not None and not task.env_assertions:
        # The env's check tools read the whole state: a task with env assertions replays it all.
        tables = ctx.index.write_tables([c.name for c in task.golden_calls])
        golden_part = {t: golden_state[t] for t in tables}
    tools = ctx.env.tools
    changed = checkpoint_rows(task)
    for i in drops:
        rest = [c for c in task.golden_calls[i + 1 :] if c.name not in tools or not tools[c.name].read_only]
        if tables is not None and golden_state is not None and "state" in task.reward_basis:
            # A state part of 0 makes the reward 0 whatever the other parts: one table unlike the
            # golden one settles it. The dropped write's own tables are the likeliest to differ,
            # and the smaller ones are cheaper to read: those come first.
            first = ctx.index.write_tables([task.golden_calls[i].name])
            order = sorted(tables, key=lambda t: (t not in first, len(golden_state[t]), t))
            if await ctx.replayer.replay_differs(
                snapshots[i], rest, golden_state, order, rows=changed.get(i, [])
            ):
                continue
        dropped, _ = await ctx.replayer.replay(snapshots[i], rest, tables=tables, hashed=False)
        made = [*calls[:i], *calls[i + 1 :]]
        if await _reward(ctx, task, dropped, messages, golden_state=golden_part, agent_calls=made) >= 1.0:
            failed.append("drop_write")
            break
    for at_call, node in branches:
        if at_call is None or node is None:
            failed.append("untaken_branch")
            break
        if not await ctx.replayer.try_instead(snapshots[at_call], node.call, refused=node.expect_error):
            failed.append("untaken_branch")
            break
    if golden_state is not None:
        if final != golden_state:
            failed.append("deterministic")
    else:
        if h1 != (await ctx.replayer.replay(database, task.golden_calls))[1]:
            failed.append("deterministic")
        if h1 != task.golden_hash or state_hash(apply_diff(ctx.pks, initial_state, task.golden_diff)) != h1:
            failed.append("stored_golden")
    return [c for c in CHECKS if c in failed]


def tool_shapes(ctx: SynthContext) -> list[ToolShape]:
    """The env's tools as the adversaries see them."""
    return list(ctx.index.tool_shapes())


async def adversary_rewards(
    ctx: SynthContext, task: Task, *, golden: GoldenRun | None = None, until_gamed: bool = False
) -> dict[str, float | None]:
    """Each adversary's reward on `task`; None where its run is the golden solution in disguise
    (`adversaries.counts`).

    Standalone (`envforge check`) every judged run is executed and scored against the task's
    stored hashes. Right after synthesis, `golden` (what building the task saw of its golden run,
    shown deterministic by `verify_task`) stands in for the runs whose end is known, and runs
    that provably cannot earn full reward are skipped; the rewards are those the runs would earn:

    - a spray's calls are the golden ones, and so are `copy_result`'s: each ends in the golden
      state, having seen the golden run's result texts;
    - `read_all` only reads, so it ends in the initial state, where not even the required outputs
      stated verbatim earn anything on a task whose state must change;
    - `golden_prefix` ends in the state the golden run passed right after its first write;
    - a double writer that is judged (it left the golden state) earns 0 with the state in the
      reward basis; otherwise it is the one run replayed.

    `until_gamed` stops at the first adversary that earns full reward (synthesis needs the
    verdict only): the later ones are left out.
    """
    database, initial_state, _ = ctx.states.task_initial(task)
    tools = tool_shapes(ctx)
    policy = load_policy_rules(ctx.env)
    golden_state = golden.state if golden is not None else None
    rewards: dict[str, float | None] = {}
    for name in ADVERSARIES:
        if name == "skip_policy":
            rewards[name] = await _skip_policy_reward(ctx, task, tools, policy, golden_state)
            if until_gamed and rewards[name] == 1.0:
                break
            continue
        if name in ("spray", "golden_prefix", "copy_result") and not counts(
            name, task, tools, reached_golden=False
        ):
            rewards[name] = None
            continue
        if (
            name == "read_all"
            and await _reward(ctx, task, initial_state, oracle_messages(task), golden_state=golden_state)
            == 0.0
        ):
            rewards[name] = 0.0
            continue
        if name == "double_write" and golden is not None and "state" in task.reward_basis:
            rewards[name] = 0.0
            continue
        calls = adversary_calls(name, task, tools)
        final: State | None
        if name in ("spray", "copy_result") and golden is not None:  # the golden calls
            final, texts = golden.state, list(golden.texts)
            calls = list(task.golden_calls)
        elif name in ("spray", "read_all", "copy_result"):
            # `read_all` only reads, so it ends where it began.
            final, texts = await ctx.replayer.run_all(database, calls, export=name != "read_all")
            final = final or initial_state
        elif name == "golden_prefix" and golden is not None and golden.after_first_write is not None:
            final, texts = golden.after_first_write, []
        else:
            final, _ = await ctx.replayer.replay(database, calls, hashed=False)
            texts = []
        if name in ("spray", "read_all"):
            ids = ctx.states.entity_ids(setup_key(task.setup), initial_state)
            message = adversary_message(name, task, texts, ids)
        elif name == "copy_result":
            message = adversary_message(name, task, texts)
        else:
            message = adversary_message(name, task, [])
        reached = (
            states_match(final, golden_state)
            if golden_state is not None
            else cents_hash(final) == task.golden_cents_hash
        )
        results = [(c.name, c.arguments, t) for c, t in zip(calls, texts, strict=False)]
        if counts(name, task, tools, reached_golden=reached, message=message, calls=calls):
            rewards[name] = await _reward(
                ctx,
                task,
                final,
                [message],
                golden_state=golden_state,
                shown=shown_results(task, results),
                keys=ctx.pks,
                agent_calls=calls,
            )
            if until_gamed and rewards[name] == 1.0:
                break
        else:
            rewards[name] = None
    return rewards


async def _skip_policy_reward(
    ctx: SynthContext,
    task: Task,
    tools: Sequence[ToolShape],
    policy: PolicyRules | None,
    golden_state: State | None,
) -> float | None:
    """`skip_policy`'s reward: the golden writes without the calls and the word with the user
    that keep the env's rules; None where no declared rule binds the task's writes. Only reads
    are left out, so with the golden end state at hand (`golden_state`) nothing is replayed."""
    if not counts("skip_policy", task, tools, reached_golden=False, policy=policy):
        return None
    calls = adversary_calls("skip_policy", task, tools, policy)
    if golden_state is not None:
        final = golden_state
    else:
        database, _, _ = ctx.states.task_initial(task)
        final, _ = await ctx.replayer.replay(database, calls, hashed=False)
    message = adversary_message("skip_policy", task, [])
    return await _reward(
        ctx,
        task,
        final,
        [message],
        golden_state=golden_state,
        keys=ctx.pks,
        policy=policy,
        calls=calls,
        agent_calls=calls,
    )


def gamed_by(rewards: dict[str, float | None]) -> list[str]:
    """The adversaries that earned full reward."""
    return [name for name, r in rewards.items() if r is not None and r >= 1.0]
