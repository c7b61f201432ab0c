"""The report opens on something worth seeing: a newcomer runs `eval`, then `report`, and looks.

Before: the one failed trial sat collapsed among the rest, four nearly empty plots came first,
nothing said why the user stopped, and a task that asks the agent to tell nothing showed
"outputs 1.00 every required output communicated".
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio

from envforge.harness import EvalConfig, Message, OracleAgent, load_env_tasks, run_eval, write_report

from support.paths import ENVS

GYM = ENVS / "gym"


def opened(page: str) -> list[str]:
    """The `<details class="trial ...">` tags the page opens."""
    return re.findall(r'<details class="trial [^"]*"[^>]* open>', page)


class Refuser:
    """Does nothing and says so: the task fails."""

    async def respond(self, messages: Any, tools: Any, client: Any) -> Message:
        return Message(role="assistant", content="I am sorry, I cannot help with this request.")


def report_of(tmp_path: Path, make_agent: Any, n: int = 2) -> tuple[str, list[str]]:
    tasks = load_env_tasks(GYM).tasks[:n]
    config = EvalConfig(agent="oracle", task_ids=[t.id for t in tasks])
    anyio.run(lambda: run_eval([GYM], config, tmp_path / "run", make_agent=make_agent))
    return write_report(tmp_path / "run").read_text(encoding="utf-8"), [t.id for t in tasks]


def test_the_one_failed_trial_is_open_and_the_passing_ones_are_not(tmp_path: Path) -> None:
    """The first task passes (the oracle), the second fails (the noop agent): the page opens on the
    failure, beside its task, and on nothing else."""
    first, second = (t.id for t in load_env_tasks(GYM).tasks[:2])

    def agent(task: Any, seed: int) -> Any:
        return OracleAgent(task) if task.id == first else Refuser()

    page, _ = report_of(tmp_path, agent)
    shown = opened(page)
    assert len(shown) == 1, shown
    assert 'data-outcome="fail"' in shown[0] and second in shown[0]


def test_a_run_where_everything_passed_opens_its_first_trial(tmp_path: Path) -> None:
    page, ids = report_of(tmp_path, lambda t, s: OracleAgent(t))
    (shown,) = opened(page)
    assert ids[0] in shown and 'data-outcome="pass"' in shown


def test_the_user_reason_to_stop_and_no_output_required_are_said(tmp_path: Path) -> None:
    """The scripted user stops after the agent's report: the page says who ended it and in the
    user's own words; a gym task that requires no output says so instead of "every required
    output communicated"."""
    task = load_env_tasks(GYM).tasks[0]
    assert not task.required_outputs
    page, _ = report_of(tmp_path, lambda t, s: OracleAgent(t), n=1)
    assert "the user ended the conversation (###STOP###): \u201cThank you. ###STOP###\u201d" in page
    assert "no output required" in page
    assert "every required output communicated" not in page


def test_plots_that_compare_nothing_are_left_out(tmp_path: Path) -> None:
    """One env, one trial per task, one difficulty bucket: no pass^k curve of one point, no bars
    of an env against itself; the section goes with them."""
    page, _ = report_of(tmp_path, lambda t, s: OracleAgent(t), n=1)
    assert "<h2>Plots</h2>" not in page and "<svg" not in page
