"""Single-lookup tasks: a learnable task set for a small model (`envforge train --tasks lookup`).

The synthesized tasks of the bundled envs chain several calls and a write, which a 135M model
never completes: every reward is 0, every group has zero variance and ERPO has nothing to learn
from. A lookup task asks one question a single read call answers: "What is the price of book
B-104?" → `get_book {"book_id": "B-104"}` → the figure, which the user must be told. The reward is
the product of `outputs` (the task's one required output, under the exact answer rule) and
`actions` (that read was called): a figure guessed right without looking it up earns nothing,
so a policy is never taught to guess. Small counts are guessable: on library's books, "1 copy
available" said blind was the right answer often enough to be rewarded before `actions` was
required.

They are made from the env itself, deterministically: every read-only tool with exactly one
parameter, a `*_id`, is called on every value of the seed column of that name, and each numeric
top-level field of its answer becomes a task (flags, 0/1 on every entity, are left out: a
guess earns half of them). The tasks are split into train and held-out by a hash
of their id (stable whatever else the env holds), and a run trains on the train side only.
"""

from __future__ import annotations

import hashlib
import json

from envforge.server import State
from envforge.synth import (
    ActionCheck,
    Call,
    CallNode,
    Dag,
    Difficulty,
    RewardPart,
    Task,
    UserScenario,
    state_hashes,
)

from .remote_fleet import EpisodeFleet

HELD_OUT_SHARE = 0.3


def _lookup_tools(fleet: EpisodeFleet, env_name: str) -> list[tuple[str, str]]:
    """(tool, its one `*_id` parameter) for every read-only single-parameter tool."""
    env = fleet.env(env_name)
    out = []
    for name in sorted(env.tools):
        spec = env.tools[name]
        if spec.read_only and len(spec.parameters) == 1 and spec.parameters[0].endswith("_id"):
            out.append((name, spec.parameters[0]))
    return out


def _column_values(state: State, column: str) -> list[str]:
    values: set[str] = set()
    for rows in state.values():
        for row in rows:
            value = row.get(column)
            if isinstance(value, str):
                values.add(value)
    return sorted(values)


def _numeric_fields(text: str) -> list[tuple[str, int | float]]:
    try:
        data = json.loads(text)
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    return [(k, v) for k, v in sorted(data.items()) if isinstance(v, int | float) and not isinstance(v, bool)]


def _figure(value: int | float) -> str:
    """How the user must hear it: integers plain, money (floats) to the cent, as synthesis writes."""
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _entity(param: str) -> str:
    return param.removesuffix("_id").replace("_", " ")


async def lookup_tasks(fleet: EpisodeFleet, env_name: str) -> list[Task]:
    """Every single-lookup task of `env_name` on its seed state, sorted by id."""
    env = fleet.env(env_name)
    seed = env.seed_state()
    golden_hash, golden_cents = state_hashes(seed)
    tasks: list[Task] = []
    for tool, param in _lookup_tools(fleet, env_name):
        for value in _column_values(seed, param):
            episode = await fleet.create_episode(env_name)
            try:
                result = await fleet.call(episode.id, tool, {param: value})
            finally:
                await fleet.close_episode(episode.id)
            if result.is_error:
                continue
            for field, figure in _numeric_fields(result.text):
                if field == param:
                    continue
                tasks.append(_task(env_name, tool, param, value, field, figure, golden_hash, golden_cents))
    return sorted(_without_flags(tasks), key=lambda t: t.id)


def _without_flags(tasks: list[Task]) -> list[Task]:
    """Drops the fields that are flags (0/1 on every entity): a guess would earn half of them."""
    values: dict[tuple[str, str], set[str]] = {}
    for t in tasks:
        values.setdefault(_field_key(t), set()).add(t.required_outputs[0])
    return [t for t in tasks if not values[_field_key(t)] <= {"0", "1"}]


def _field_key(task: Task) -> tuple[str, str]:
    tool, _, field = task.seed.removeprefix("lookup:").split(":", 2)
    return tool, field


def _task(
    env_name: str,
    tool: str,
    param: str,
    value: str,
    field: str,
    figure: int | float,
    golden_hash: str,
    golden_cents: str,
) -> Task:
    call = Call(name=tool, arguments={param: value})
    what = field.replace("_", " ")
    answer = _figure(figure)
    instruction = f"What is the {what} of {_entity(param)} {value}? Tell me the number."
    return Task(
        id=f"{env_name}-lookup-{tool}-{value}-{field}",
        env=env_name,
        seed=f"lookup:{tool}:{value}:{field}",
        dag=Dag(
            nodes=[CallNode(id="n0", text=f"{tool} ({param}: {json.dumps(value)})", call=call)], edges=[]
        ),
        scenario=UserScenario(
            persona="a customer who wants one figure",
            instruction=instruction,
            known_facts=[],
            must_be_told=[answer],
        ),
        golden_calls=[call],
        golden_hash=golden_hash,
        golden_cents_hash=golden_cents,
        golden_diff={},
        required_outputs=[answer],
        checkpoints=[],
        difficulty=Difficulty(calls=1, writes=0, reasoning=0, depth=1, tables=1),
        action_checks=[ActionCheck(name=tool, arguments={param: value})],
        reward_basis=[RewardPart.OUTPUTS, RewardPart.ACTIONS],
        split=["test" if held_out(f"{env_name}-lookup-{tool}-{value}-{field}") else "train"],
    )


def held_out(task_id: str, share: float = HELD_OUT_SHARE) -> bool:
    """Whether a task is on the held-out side: a hash of its id, so the split never depends on
    which other tasks exist or on a run's seed."""
    digest = hashlib.sha256(task_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def split_tasks(tasks: list[Task]) -> tuple[list[Task], list[Task]]:
    """(train, held-out) by each task's `split`."""
    train = [t for t in tasks if "test" not in t.split]
    return train, [t for t in tasks if "test" in t.split]
