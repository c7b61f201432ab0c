"""`envforge check` holds a task to the golden end state it stores, not only to the one it scores.

Scoring reads a task's cents hash, which the golden replay already checks; the exact hash and the
diff from the initial state are stored beside it, and the report shows that diff as "expected".
A task file edited by hand, or written by a buggy importer, whose stored diff or hash names an end
state the golden calls never reach would show readers a wrong expectation while still scoring:
the `stored_golden` check fails it.
"""

from __future__ import annotations

from envforge import check_tasks
from envforge.server import Environment
from envforge.synth import Task, load_tasks


def first_task_with_an_update(env: Environment) -> Task:
    for task in load_tasks(env.root):
        if any(diff.updated for diff in task.golden_diff.values()):
            return task
    raise AssertionError("no task updates a row")


def test_an_honest_task_passes(retail_orders: Environment) -> None:
    task = first_task_with_an_update(retail_orders)
    (result,) = check_tasks(retail_orders, [task])
    assert "stored_golden" not in result.failed_checks, result.failed_checks


def test_a_stored_diff_that_lies_about_the_expected_change_fails(retail_orders: Environment) -> None:
    task = first_task_with_an_update(retail_orders)
    table, diff = next((t, d) for t, d in task.golden_diff.items() if d.updated)
    first = diff.updated[0]
    column = next(iter(first.after))
    forged = first.model_copy(update={"after": {**first.after, column: "forged"}})
    lying = task.model_copy(
        update={"golden_diff": {**task.golden_diff, table: diff.model_copy(update={"updated": [forged]})}}
    )
    (result,) = check_tasks(retail_orders, [lying])
    assert "stored_golden" in result.failed_checks
    assert "golden_replay" not in result.failed_checks  # it still scores: only the stored view lies


def test_a_stored_exact_hash_from_another_task_fails(retail_orders: Environment) -> None:
    tasks = load_tasks(retail_orders.root)
    task, other = tasks[0], next(t for t in tasks if t.golden_hash != tasks[0].golden_hash)
    swapped = task.model_copy(update={"golden_hash": other.golden_hash})
    (result,) = check_tasks(retail_orders, [swapped])
    assert result.failed_checks == ["stored_golden"]
