"""Attacks on whose failure a trial is: an agent must not move its own failing trial out of
pass^k (an `env` or `infra` fault), nor end the whole run, by what it says or which arguments
it passes.

Real parts throughout: the harness with the scripted user over the in-process MCP fleet, real
SQLite, the confined envs' worker processes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import anyio
import pytest

from envforge.harness import EvalConfig, Message, OracleAgent, load_env_tasks, run_eval
from envforge.server import Fleet, load_env
from envforge.synth import Task

from support.paths import REPO, bundled_env_dirs

ENV_DIRS = [p for p in bundled_env_dirs() if (p / "tasks.jsonl").exists()]
RETAIL = REPO / "envs" / "retail_orders"


class Finally(OracleAgent):
    """The oracle's calls, then `last(n)` for its n-th closing message instead of the answer."""

    def __init__(self, task: Task, rules: Any, last: Any) -> None:
        super().__init__(task, rules)
        self.last, self.closing = last, 0

    async def respond(self, messages: list[Message], tools: list[dict[str, Any]], client: Any) -> Message:
        reply = await super().respond(messages, tools, client)
        if reply.tool_calls or (reply.content or "").startswith("I am about to"):
            return reply
        self.closing += 1
        return Message(role="assistant", content=self.last(self.closing))


async def play(tmp_path: Path, name: str, last: Any, limit: int = 3) -> list[Any]:
    et = load_env_tasks(RETAIL)
    _, records = await run_eval(
        [RETAIL],
        EvalConfig(agent="oracle", limit=limit),
        tmp_path / name,
        make_agent=lambda t, s: Finally(t, et.policy_rules, last),
    )
    return records


HUGE = {
    "product": " * ".join(["1" + "0" * 9999] * 101) + " = 5",
    "400_digits": "9" * 400,
    "5000_digits": "9" * 5000,
}


@pytest.mark.parametrize("kind", sorted(HUGE))
async def test_attack_a_huge_number_in_the_answer_is_scored_not_a_crashed_run(
    tmp_path: Path, kind: str
) -> None:
    """One agent message ended the whole run from inside the scoring: shown working past
    Decimal's range (101 factors of 10^9999, about 1 MB) raised `decimal.Overflow` in the
    scorer; a 400-digit number overflowed the user-error rules' `int(n) / 100`, a 5,000-digit one
    their `int(n)` (Python's 4,300-digit limit). Each is the agent's message, scored as such."""
    records = await play(tmp_path, kind, lambda n: f"All done. {HUGE[kind]}")
    tasks = {t.id: t for t in load_env_tasks(RETAIL).tasks}
    assert len(records) == 3
    for rec in records:
        assert rec.status == "completed" and rec.fault == "none", (rec.status, rec.error)
        # the golden end state: paid where nothing had to be told, else the answer is missing
        assert rec.score is not None and rec.reward == float(not tasks[rec.task_id].required_outputs)


async def test_attack_filler_between_silent_turns_runs_out_the_turns_as_the_agents_failure(
    tmp_path: Path,
) -> None:
    """An agent that did the work, then alternates empty turns with "Let me check" (which resets
    the user's count of silent turns in a row), is never ended by a user stop: it runs out the
    run's exchanges, its own failure, reward 0, and no user error masks it."""
    filler = "Let me check that for you."
    records = await play(tmp_path, "stretch", lambda n: "" if n % 2 else filler, limit=2)
    for rec in records:
        assert rec.status == "max_turns" and rec.fault == "agent" and rec.reward == 0.0, rec.status
        assert not rec.user_error


INTS = [0, -1, 2**31, 2**53, 2**63 - 1, 2**63, -(2**63) - 1, 10**40]
FLOATS = [0.0, -0.0, 1e308, -1e308, 5e-324, math.inf, math.nan]
STRINGS = ["", " ", "\x00", "a\x00b", "\u202e", "𝟘", "%", "'", "0", "-1", "null", "P-101\n", "x" * 10_000]


def edge_values(schema: dict[str, Any]) -> list[Any]:
    if "enum" in schema:
        return list(schema["enum"])
    if "anyOf" in schema:
        return [v for s in schema["anyOf"] for v in edge_values(s)]
    kind = schema.get("type")
    if kind == "integer":
        return INTS
    if kind == "number":
        return FLOATS + INTS
    if kind == "boolean":
        return [True, False]
    if kind == "null":
        return [None]
    if kind == "array":
        items = edge_values(schema.get("items", {"type": "string"}))
        return [[], *([v] for v in items), [items[0]] * 2000]
    return STRINGS


def test_attack_no_argument_an_agent_passes_makes_a_bundled_tool_an_env_error() -> None:
    """A trial whose tool answered with an env error and that earns < 1 is an `env` failure, left
    out of pass^k. Every tool of every bundled env (trusted and confined), each parameter in turn
    set to an edge value its schema admits (huge and out-of-range integers, inf and NaN, NUL
    characters, empty and 10,000-character strings, right-to-left marks, 2,000-item lists) with
    the others real seed values, is answered as the agent's (`invalid`, `refused`) or `ok`,
    never as the env's failure, and within a second."""
    found: list[str] = []

    async def run(env_dir: Path) -> None:
        env = load_env(env_dir)
        real: dict[str, list[Any]] = {}
        for rows in env.seed_state().values():
            for row in rows[:3]:
                for column, value in row.items():
                    real.setdefault(column, []).append(value)
        async with Fleet([env], max_episodes=4096) as fleet:
            for name, spec in env.tools.items():
                props = spec.input_schema.get("properties", {})
                base = {
                    p: (real.get(p) or edge_values(props[p]))[0]
                    for p in spec.input_schema.get("required", [])
                    if p in props
                }
                for param, schema in props.items():
                    for value in edge_values(schema):
                        episode = await fleet.create_episode(env.name)
                        with anyio.fail_after(5):
                            t0 = anyio.current_time()
                            result = await fleet.call(episode.id, name, {**base, param: value})
                            took = anyio.current_time() - t0
                        if result.kind == "env_error" or took > 1.0:
                            found.append(f"{env.name}.{name}({param}={value!r:.40}): {result.text[:120]}")
                        await fleet.close_episode(episode.id)

    for env_dir in ENV_DIRS:
        anyio.run(run, env_dir)
    assert not found, found[:10]
