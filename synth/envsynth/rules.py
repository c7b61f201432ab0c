"""The policy rules gates: a synthesized env's `policy_rules.toml` must say what its policy.md
says in a form the verifier reads, and must leave every verified task solvable by keeping it.

A rules file the reward reads is a reward: one that names a tool the env lacks breaks every
episode's scoring; an identity "check" that is a write, or a rule guarding a read, checks nothing
(the verifier looks at writes); and rules no agent can keep make every task unsolvable, so the
oracle bound falls below 1. Two gates, because the task gate reads the file (the facts a user
needs for the identity rule, `skip_policy`):

- `policy_rules`, before the task gate: the file parses with `parse_policy_rules` against the
  env's tools; identity tools are reads with parameters that are columns (what a user's own row
  can fill), every `exempt` tool is a write, each lookup guards a write that takes its parameter
  and is a read whose first tool takes it, and a forbidden call's arguments are the tool's own.
- `policy_kept`, after it: each verified task is run, on its own initial state, the way an agent
  keeping the rules runs it (the harness's oracle, which synth may not import: verify the
  principal first with the first identity tool the user's facts fill, look a record up before a
  write that names it, propose each write and take the user's yes), and `policy_violations` must
  find nothing.

Every problem names the rule and what is wrong, because its first reader is the model repairing
the file.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from envforge.server import Environment, Fleet, execute
from envforge.synth.graph.toolgraph import load_graph
from envforge.synth.task.models import Call, Task
from envforge.synth.task.policy_rules import (
    POLICY_RULES_FILE,
    PolicyRules,
    PolicyRulesError,
    Step,
    identity_call,
    looked_up,
    names_only,
    parse_policy_rules,
    policy_violations,
)
from envforge.synth.task.taskfile import load_tasks
from envforge.synth.walk.context import SynthContext

from .report import GateResult

STAGE = "policy_rules"
YES = "Yes, please go ahead."

Run = Callable[[Call], Awaitable[tuple[str, bool]]]


def _result(name: str, checks: int, problems: list[str], t0: float) -> GateResult:
    failed = min(checks, len(problems))
    return GateResult(
        name=name,
        passed=not problems,
        checks=checks,
        passed_checks=checks - failed,
        problems=problems[:40],
        blame=[STAGE] if problems else [],
        seconds=round(time.perf_counter() - t0, 3),
    )


def _kind(env: Environment, name: str) -> str:
    spec = env.tools[name]
    return "a read" if spec.read_only else f"a write (writes {', '.join(spec.writes)})"


def rules_problems(env: Environment, path: Path) -> tuple[PolicyRules | None, list[str]]:
    """`path` read as the verifier reads it, and what it names checked against `env`: the rules
    (None: they do not parse) and every problem, one line each naming the rule."""
    tools = {n: s.read_only for n, s in env.tools.items()}
    try:
        rules = parse_policy_rules(path, tools)
    except PolicyRulesError as exc:
        why = str(exc).replace(str(path), POLICY_RULES_FILE)
        return None, [f"{why} (the env's tools: {', '.join(sorted(tools))})"]
    d = rules.declared
    columns = {c for t in env.tables for c in t.columns}
    writes = sorted(rules.writes)
    out: list[str] = []
    for name in d.identity.tools if d.identity else []:
        spec = env.tools[name]
        if not spec.read_only:
            out.append(
                f"[identity] tools: {name} is {_kind(env, name)}; an identity check is a read "
                "whose result shows the one person the task acts for"
            )
        if not spec.parameters:
            out.append(f"[identity] tools: {name} takes no parameter: nothing the user knows can name them")
        for p in sorted(spec.required - columns):
            out.append(
                f"[identity] tools: {name}'s parameter {p} is no column of any table, so the facts "
                "a user knows of their own row can never fill it"
            )
    for section, exempt in (
        ("identity", d.identity.exempt if d.identity else []),
        ("confirmation", d.confirmation.exempt if d.confirmation else []),
    ):
        for name in exempt:
            if tools[name]:
                out.append(
                    f"[{section}] exempt: {name} is a read; the rule guards writes only, so exempting "
                    f"a read means nothing (list writes that need no {section}; writes: {', '.join(writes)})"
                )
    for rule in d.lookup:
        where = f"[[lookup]] param = {rule.param!r}"
        guarded = [w for w in writes if rule.param in env.tools[w].parameters]
        if not guarded:
            takers = sorted(n for n, s in env.tools.items() if rule.param in s.parameters)
            out.append(
                f"{where}: no write takes {rule.param}, so the rule guards nothing (a lookup rule "
                f"guards writes; {rule.param} is taken by {', '.join(takers) or 'no tool'})"
            )
        for name in rule.tools:
            if not tools[name]:
                why = "a lookup is a read that shows the record"
                out.append(f"{where} tools: {name} is {_kind(env, name)}; {why}")
        first = rule.tools[0]
        if rule.param not in env.tools[first].parameters:
            out.append(
                f"{where} tools: the first, {first}, does not take {rule.param}; an agent keeping the "
                f"rule calls the first tool with {rule.param} = the value it is about to write"
            )
    for ban in d.forbidden:
        for arg in sorted(set(ban.arguments) - set(env.tools[ban.tool].parameters)):
            params = ", ".join(env.tools[ban.tool].parameters) or "none"
            out.append(f"[[forbidden]] tool = {ban.tool!r}: {arg} is not one of its parameters ({params})")
    return rules, out


def gate_rules(env: Environment, root: Path) -> GateResult:
    """The `policy_rules` gate: one check, the file as the verifier reads it."""
    t0 = time.perf_counter()
    _, problems = rules_problems(env, root / POLICY_RULES_FILE)
    return _result("policy_rules", 1, problems, t0)


# --------------------------------------------------------------------------- kept by an agent


def proposal(call: Call) -> str:
    """What an agent keeping a confirmation rule says before `call` (the scripted user's format)."""
    args = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in call.arguments.items())
    return f"I am about to {call.name}{f' with {args}' if args else ''}. Shall I proceed? (yes/no)"


def _identity_calls(rules: PolicyRules, schemas: Mapping[str, Mapping[str, Any]], task: Task) -> list[Call]:
    """Every identity call the user's facts fill, in the order the oracle tries them (a fact held
    twice, "email" and "email (2)", tried with each value)."""
    facts = task.scenario.known_facts
    known = {f.name: f.value for f in facts}
    pools = [known, *({**known, f.name.split(" (")[0]: f.value} for f in facts if " (" in f.name)]
    out: list[Call] = []
    for pool in pools:
        skip: set[str] = set()
        while (call := identity_call(rules, schemas, pool, skip=skip)) is not None:
            if call not in out:
                out.append(call)
            skip.add(call.name)
    return out


async def keeping_run(
    rules: PolicyRules, task: Task, schemas: Mapping[str, Mapping[str, Any]], run: Run
) -> list[Step]:
    """The task's golden calls as an agent keeping `rules` makes them, with every result (`run`
    executes one call: its text and whether it failed)."""
    steps: list[Step] = []
    principal = task.dag.principal
    key = next(iter(principal.key.items())) if principal is not None and len(principal.key) == 1 else None
    verified = False
    looked: set[tuple[str, str]] = set()
    pending = (
        _identity_calls(rules, schemas, task)
        if key is not None and any(rules.needs_identity(c.name) for c in task.golden_calls)
        else []
    )

    async def make(call: Call) -> None:
        nonlocal verified
        text, error = await run(call)
        step = Step("call", text, call, error)
        steps.append(step)
        if key is not None and call.name in rules.identity_tools and names_only(step, *key):
            verified = True
        looked.update(looked_up(rules, step))

    while pending and not verified:  # before anything else, reads included
        await make(pending.pop(0))
    for call in task.golden_calls:
        if call.name in rules.writes:
            for rule in rules.declared.lookup:
                if rule.param in call.arguments:
                    value = json.dumps(call.arguments[rule.param], sort_keys=True)
                    if (rule.param, value) not in looked:
                        looked.add((rule.param, value))
                        args = {rule.param: call.arguments[rule.param]}
                        await make(Call(name=rule.tools[0], arguments=args))
            if rules.needs_confirmation(call.name):
                steps += [Step("agent", proposal(call)), Step("user", YES)]
        await make(call)
    return steps


def _hint(rules: PolicyRules, task: Task, steps: list[Step], violation: str) -> str:
    """What the model should change for `violation`, naming the rule."""
    principal = task.dag.principal
    tried = [s for s in steps if s.call is not None and s.call.name in rules.identity_tools]
    if "before the principal" in violation or "before verifying" in violation:
        who = f"{principal.table} {principal.key}" if principal else "the principal"
        if not tried:
            facts = ", ".join(f.name for f in task.scenario.known_facts) or "nothing"
            return (
                f"[identity]: none of tools {list(rules.identity_tools)} can be called from what the "
                f"user knows ({facts}) to verify {who}; declare an identity read whose required "
                f"parameters are columns of the {principal.table if principal else 'person'} row, "
                "or exempt the write if it acts for no one"
            )
        shown = "; ".join(
            f"{s.call.name}({json.dumps(s.call.arguments)}) -> {s.text[:120]}" for s in tried if s.call
        )
        return (
            f"[identity]: {shown} did not verify {who}: an identity tool's result must name that one "
            "person by their key and no one else"
        )
    if "looked up" in violation:
        return "[[lookup]]: the first of the rule's tools, called with the value, did not show the record"
    if "forbidden" in violation:
        return "[[forbidden]]: the rule bans a call the task itself needs; ban only what policy.md forbids"
    if "transferred" in violation:
        return "[transfer]: the task hands the user over, which the rule does not allow"
    return "a rule an agent following policy.md cannot keep"


async def gate_kept(env: Environment, root: Path) -> GateResult:
    """The `policy_kept` gate: one check per verified task (tasks.jsonl in `root`)."""
    t0 = time.perf_counter()
    rules, problems = rules_problems(env, root / POLICY_RULES_FILE)
    tasks = load_tasks(root)
    graph = load_graph(root)
    if rules is None or problems or graph is None:
        return _result("policy_kept", len(tasks) or 1, problems or ["no tool graph"], t0)
    schemas = {name: spec.input_schema for name, spec in env.tools.items()}
    fleet = Fleet([env], max_episodes=8)
    ctx = SynthContext.create(env, graph, fleet)
    try:
        for task in tasks:
            database, _, _ = ctx.states.task_initial(task)
            episode = await ctx.replayer.open_episode(database)

            async def run(call: Call, episode: Any = episode) -> tuple[str, bool]:
                res = await execute(episode, call.name, call.arguments)
                return res.text, res.is_error

            try:
                steps = await keeping_run(rules, task, schemas, run)
            finally:
                await ctx.replayer.close_episode(episode)
            broken = policy_violations(rules, task, steps)
            if broken:
                problems.append(f"task {task.id}: {broken[0]}: {_hint(rules, task, steps, broken[0])}")
    finally:
        ctx.replayer.close()
        await fleet.aclose()
    return _result("policy_kept", len(tasks), problems, t0)


# --------------------------------------------------------------------------- the format's example

EXAMPLE_NAMES = frozenset({"get_x", "x_id", "delete_x"})
"""The names the rules format's example uses (`prompts.RULES_FORMAT`), none of them any env's."""
_SECTION = re.compile(r"^[ \t]*\[\[?[ \t]*\w+[ \t]*\]\]?[ \t]*(?:#.*)?$", re.MULTILINE)
_QUOTED = re.compile(r"\"([^\"\n]*)\"|'([^'\n]*)'")


def without_the_example(rules_toml: str) -> str:
    """policy_rules.toml without the sections that still carry the format's example names
    (`tools = ["get_x"]`, `param = "x_id"`, `tool = "delete_x"`): those are the example copied,
    not a rule of this env's policy. Captured: Qwen2.5-Coder-1.5B answered with the example on
    Petstore, Redis and Slack, uncommented when it came commented out, and again in repairs that
    named the unknown tools. What is left is judged by the rules gate as any file."""
    starts = [m.start() for m in _SECTION.finditer(rules_toml)]
    if not starts:
        return rules_toml
    kept = [rules_toml[: starts[0]]]
    for start, end in zip(starts, [*starts[1:], len(rules_toml)], strict=True):
        block = rules_toml[start:end]
        said = {a or b for a, b in _QUOTED.findall(_code(block))}
        if not said & EXAMPLE_NAMES:
            kept.append(block)
    return "".join(kept)


def _code(block: str) -> str:
    """The block's lines without their `#` comments (a quoted name in a comment is no rule)."""
    return "\n".join(line.split("#", 1)[0] for line in block.splitlines())
