"""The scorer shared by self-verification and the evaluation harness.

Three parts, each judged on what the agent left behind and said:
- state: the final canonical state (volatile columns already dropped by export) equals the
  golden one, with floats compared to cents;
- outputs: every required output appears in the agent's messages (τ-bench's rule: case-insensitive
  substring match after removing commas);
- checkpoints: the fraction of write checkpoints whose rows hold their golden values.
The reward is the product of the parts named by the task's reward basis (state × outputs unless
the task says otherwise); the outputs part counts only when all outputs were communicated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from envforge.server import State

from .models import Checkpoint, Score, Task
from .statediff import cents_hash, cents_row, states_match


def normalize_text(text: str) -> str:
    return text.lower().replace(",", "")


def outputs_missing(required: Sequence[str], agent_messages: Sequence[str]) -> list[str]:
    """The required outputs not found in the agent's messages."""
    said = normalize_text("\n".join(agent_messages))
    return [o for o in required if normalize_text(o) not in said]


def _row_key(row: dict[str, Any], cols: Sequence[str]) -> str:
    return json.dumps([row.get(c) for c in cols])


def _lookup(state: State, table: str, key: dict[str, Any]) -> dict[str, Any] | None:
    """The first row of `table` whose `key` columns hold `key`'s values.

    Values are compared as values (a scan with early exit, no JSON per row); a checkpoint names a
    handful of rows, so indexing whole tables would cost more than it saves.
    """
    rows = state.get(table, [])
    if len(key) == 1:
        ((col, want),) = key.items()
        return next((r for r in rows if r.get(col) == want), None)
    items = list(key.items())
    return next((r for r in rows if all(r.get(c) == v for c, v in items)), None)


def checkpoint_passed(checkpoint: Checkpoint, state: State) -> bool:
    for check in checkpoint.rows:
        found = _lookup(state, check.table, check.key)
        if check.row is None:
            if found is not None:
                return False
        elif found is None or cents_row(found) != cents_row(check.row):
            return False
    return True


def oracle_messages(task: Task) -> list[str]:
    """What a perfect agent says: every required output (the oracle agent's final message)."""
    return ["; ".join(task.required_outputs)] if task.required_outputs else []


def score_episode(
    task: Task, final_state: State, agent_messages: Sequence[str], *, golden_state: State | None = None
) -> Score:
    """Score one finished episode of `task` from its exported final state and the agent's messages.

    `golden_state`, when the caller holds it (self-verification), replaces the hash comparison by a
    direct one that is cheaper; the verdict is the same.
    """
    if golden_state is not None:
        state_match = states_match(final_state, golden_state)
    else:
        state_match = cents_hash(final_state) == task.golden_cents_hash
    missing = outputs_missing(task.required_outputs, agent_messages)
    n_out = len(task.required_outputs)
    outputs = 1.0 if n_out == 0 else (n_out - len(missing)) / n_out
    passed = sum(checkpoint_passed(c, final_state) for c in task.checkpoints)
    total = len(task.checkpoints)
    checkpoints = 1.0 if total == 0 else passed / total
    parts = {
        "state": 1.0 if state_match else 0.0,
        "outputs": 1.0 if not missing else 0.0,
        "checkpoints": checkpoints,
    }
    # `actions` and `nl_assertions` need the agent's calls or an LLM judge: the harness scores
    # them (harness/runs.py); here they are reported as not judged rather than guessed.
    reward = 1.0
    for part in task.reward_basis:
        if part in parts:
            reward *= parts[part]
    return Score(
        reward=reward,
        state_match=state_match,
        outputs=outputs,
        outputs_missing=missing,
        checkpoints=checkpoints,
        checkpoints_passed=passed,
        checkpoints_total=total,
        basis=list(task.reward_basis),
        not_judged=[p for p in task.reward_basis if p not in parts],
    )


def reward_of(
    task: Task, final_state: State, agent_messages: Sequence[str], *, golden_state: State | None = None
) -> float:
    """`score_episode(...).reward`, computing only the parts the task's reward basis names.

    Self-verification asks for rewards only, several times per task; the parts are computed as
    `score_episode` computes them and multiplied in the same order, so the float is the same.
    """
    reward = 1.0
    for part in task.reward_basis:
        if part == "state":
            if golden_state is not None:
                match = states_match(final_state, golden_state)
            else:
                match = cents_hash(final_state) == task.golden_cents_hash
            reward *= 1.0 if match else 0.0
        elif part == "outputs":
            reward *= 0.0 if outputs_missing(task.required_outputs, agent_messages) else 1.0
        elif part == "checkpoints":
            total = len(task.checkpoints)
            passed = sum(checkpoint_passed(c, final_state) for c in task.checkpoints)
            reward *= 1.0 if total == 0 else passed / total
    return reward
