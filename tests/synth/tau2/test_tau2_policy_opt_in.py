"""`envforge import tau2 --policy-rules`: τ²'s retail policy as envforge's policy part, opt-in.

By default a τ² import keeps τ²'s own reward (no policy_rules.toml, tasks byte for byte as
before). With the opt-in, τ²'s policy is checked from the trajectory: the user verified by email
or name + zip before a write, the user's yes before each write, a transfer only in a task whose
golden calls make one. The oracle, which keeps it, still scores 1 on every τ² train task; an
agent making τ²'s golden calls alone (no confirmation) breaks it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envforge.harness import EvalConfig, Message, ToolCall, run_eval
from envforge.synth import Task, import_tau2_env

from support.paths import TAU2_RETAIL
from support.skips import TAU2_NO_DATA, tau2_data_missing

pytestmark = pytest.mark.skipif(tau2_data_missing("tasks.json"), reason=TAU2_NO_DATA)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Task]]:
    root = tmp_path_factory.mktemp("tau2")
    plain, opted = root / "plain" / "tau2_retail", root / "opted" / "tau2_retail"
    import_tau2_env(TAU2_RETAIL, plain)
    imported = import_tau2_env(TAU2_RETAIL, opted, policy_rules=True)
    assert imported.tasks is not None
    return plain, opted, imported.tasks


def test_default_import_keeps_tau2_reward_and_opt_in_changes_only_principals(
    both: tuple[Path, Path, list[Task]],
) -> None:
    plain, opted, tasks = both
    assert not (plain / "policy_rules.toml").exists() and (opted / "policy_rules.toml").is_file()
    before = [json.loads(line) for line in (plain / "tasks.jsonl").read_text().splitlines()]
    after = [json.loads(line) for line in (opted / "tasks.jsonl").read_text().splitlines()]
    for a, b in zip(before, after, strict=True):
        assert a["dag"]["principal"] is None
        a["dag"].pop("principal"), b["dag"].pop("principal")
        assert a == b
    assert sum(t.dag.principal is not None for t in tasks) >= 100  # all but the transfer-only ones
    # importing again without the opt-in goes back to τ²'s own reward
    import_tau2_env(TAU2_RETAIL, opted)
    assert not (opted / "policy_rules.toml").exists()
    assert (opted / "tasks.jsonl").read_bytes() == (plain / "tasks.jsonl").read_bytes()
    import_tau2_env(TAU2_RETAIL, opted, policy_rules=True)


async def test_the_oracle_keeps_tau2_policy_on_every_train_task(
    both: tuple[Path, Path, list[Task]], tmp_path: Path
) -> None:
    _, opted, tasks = both
    train = [t.id for t in tasks if "train" in t.split]
    _, records = await run_eval([opted], EvalConfig(agent="oracle", task_ids=train), tmp_path)
    assert len(records) == len(train) == 74
    assert all(r.reward == 1.0 and r.parts["policy"] == 1.0 for r in records), [
        (r.task_id, r.parts) for r in records if r.reward < 1.0
    ]


class GoldenOnly:
    """τ²'s golden calls in order, no word to the user, then done: the policy's confirmations skipped."""

    def __init__(self, task: Task) -> None:
        self.task, self.at = task, 0

    async def respond(self, messages: list[Message], tools: list[dict[str, Any]], client: Any) -> Message:
        if self.at < len(self.task.golden_calls):
            c = self.task.golden_calls[self.at]
            self.at += 1
            return Message(
                role="assistant", tool_calls=[ToolCall(id=f"g{self.at}", name=c.name, arguments=c.arguments)]
            )
        return Message(role="assistant", content="All done.")


async def test_golden_writes_without_the_users_yes_earn_nothing_only_with_the_opt_in(
    both: tuple[Path, Path, list[Task]], tmp_path: Path
) -> None:
    plain, opted, tasks = both
    writes = {"cancel_pending_order", "return_delivered_order_items", "modify_pending_order_address"}
    ids = [t.id for t in tasks if "train" in t.split and any(c.name in writes for c in t.golden_calls)][:3]
    assert len(ids) == 3
    _, on = await run_eval(
        [opted],
        EvalConfig(agent="oracle", task_ids=ids),
        tmp_path / "on",
        make_agent=lambda t, s: GoldenOnly(t),
    )
    _, off = await run_eval(
        [plain],
        EvalConfig(agent="oracle", task_ids=ids),
        tmp_path / "off",
        make_agent=lambda t, s: GoldenOnly(t),
    )
    assert all(r.parts["state"] == 1.0 and r.parts["policy"] == 0.0 and r.reward == 0.0 for r in on)
    assert all("policy" not in r.parts and r.parts["state"] == 1.0 for r in off)
