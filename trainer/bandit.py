"""A four-button bandit environment and its tasks: the smallest env where RL has something to learn.

One tool call (`press_green`) makes the final state match the golden one; the other three do not.
Used by the learning tests, `bench_train.py` and as a smoke test for `envforge train` (a real env
folder, real SQLite, real MCP, real `compose_reward`), with a model small enough for a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

from envforge.server import Fleet
from envforge.synth import Call, Dag, Difficulty, Task, UserScenario, cents_hash

COLORS = ("red", "green", "blue", "yellow")
INSTRUCTIONS = ("Press the button", "Please press the button", "Press a button", "Please press a button")

_TOOLS = '''"""Four buttons; each press is recorded."""

from envforge.server import tool

'''
_TOOL = '''

@tool(writes=["presses"])
async def press_{c}(db) -> str:
    """Press the {c} button."""
    await db.execute("INSERT INTO presses (color) VALUES ('{c}')")
    return "pressed"
'''


def write_bandit_env(root: str | Path, name: str = "bandit") -> Path:
    """Write the env folder to `root/name` and return it."""
    d = Path(root) / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "env.toml").write_text(
        f'name = "{name}"\ndescription = "Four buttons, one of them right."\nversion = "0.1.0"\n'
    )
    (d / "policy.md").write_text("Press exactly one button.\n")
    (d / "schema.sql").write_text(
        "CREATE TABLE presses (\n  id INTEGER PRIMARY KEY AUTOINCREMENT,\n  color TEXT NOT NULL\n);\n"
    )
    (d / "seed.json").write_text(json.dumps({"presses": []}))
    (d / "tools.py").write_text(_TOOLS + "".join(_TOOL.format(c=c) for c in COLORS))
    return d


async def bandit_tasks(fleet: Fleet, env_name: str, n: int = 2, target: str = "green") -> list[Task]:
    """`n` tasks whose golden end state is one press of `target` (computed by actually pressing it)."""
    ep = await fleet.create_episode(env_name)
    try:
        await fleet.call(ep.id, f"press_{target}", {})
        state, golden_hash = await fleet.export(ep.id)
    finally:
        await fleet.close_episode(ep.id)
    return [
        Task(
            id=f"{env_name}-{i}",
            env=env_name,
            seed=str(i),
            dag=Dag(nodes=[], edges=[]),
            scenario=UserScenario(
                persona="", instruction=INSTRUCTIONS[i % len(INSTRUCTIONS)], known_facts=[], must_be_told=[]
            ),
            golden_calls=[Call(name=f"press_{target}", arguments={})],
            golden_hash=golden_hash,
            golden_cents_hash=cents_hash(state),
            golden_diff={},
            required_outputs=[],
            checkpoints=[],
            difficulty=Difficulty(calls=1, writes=1, reasoning=0, depth=1, tables=1),
            reward_basis=["state"],
        )
        for i in range(n)
    ]


def bandit_corpus() -> list[str]:
    """The words the bandit's tokenizer needs: tool names and instructions (keeps the vocab ~12)."""
    return [" ".join(f"press_{c}" for c in COLORS), *INSTRUCTIONS]
