"""`--user-error-rate`: training episodes whose user errs on purpose, recorded and scored against the mask.

A scripted policy plays library's lookup tasks through the harness (announces work, then answers),
so every conversation gives each error kind its moment. At rate 1 every trajectory records the
kind its user committed and the detector flags it; at rate 0 none does; the same seed draws the
same errors. `envforge train --tasks lookup --user-error-rate R` plays lookups with the scripted
user, writes the mask's precision and recall per step and in `run.json`, and bad settings are one
`error:` line each.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
import typer
from typer.testing import CliRunner

from envforge.cli import trainer_commands
from envforge.harness import ERROR_KINDS
from envforge.server import Fleet
from envforge.synth import Task
from envforge.trainer import (
    Trajectory,
    build_tiny_model,
    lookup_tasks,
    mask_scores,
)

from support.paths import REPO
from support.scripted_policy import Say, play_scripted

LIBRARY = REPO / "envs" / "library"


def announce(task: Task | None, turn: int) -> str:
    """Says it will check, then gives a figure: a turn to ask and a turn to answer."""
    return "Let me check that for you." if turn == 0 else "The answer is 3."


def in_a_sentence(task: Task) -> str:
    return f"The {task.seed.rsplit(':', 1)[-1].replace('_', ' ')} is {task.required_outputs[0]}."


def solver(answer: Callable[[Task], str]) -> Say:
    """Calls the lookup's read, then answers with `answer(task)`."""

    def say(task: Task | None, turn: int) -> str:
        assert task is not None  # played with the honest user, whose opening is the request
        call = task.golden_calls[0]
        return f"{call.name} {json.dumps(call.arguments)}" if turn == 0 else answer(task)

    return say


async def play(
    rate: float, seed: int = 0, groups: int = 6, solve: Callable[[Task], str] | None = None
) -> list[Trajectory]:
    async def three_lookups(fleet: Fleet) -> list[Task]:
        return (await lookup_tasks(fleet, "library"))[:3]

    say = solver(solve) if solve else announce
    return await play_scripted(LIBRARY, three_lookups, say, groups=groups, user_error_rate=rate, seed=seed)


def test_every_injected_error_is_recorded_and_flagged() -> None:
    trajs = anyio.run(play, 1.0)
    kinds = [t.injected_user_error for t in trajs]
    assert None not in kinds and set(kinds) <= set(ERROR_KINDS) and len(set(kinds)) >= 3
    assert all(t.user_error for t in trajs), [(t.injected_user_error, t.user_error_reason) for t in trajs]
    scores = mask_scores(trajs)
    assert scores["user_errors_injected"] == scores["user_errors_caught"] == len(trajs)
    assert scores["mask_precision"] == scores["mask_recall"] == 1.0


def test_a_lookup_played_with_the_user_pays_the_read_and_the_figure() -> None:
    trajs = anyio.run(lambda: play(0.0, groups=3, solve=in_a_sentence))
    assert [t.reward for t in trajs] == [1.0] * 6, [(t.parts, t.messages[-1]) for t in trajs]
    assert all(t.parts == {"outputs": 1.0, "actions": 1.0, "policy": 1.0} for t in trajs)


@pytest.mark.parametrize("form", ["{}", "{}.", "`{}`", "**{}**"])
def test_attack_a_bare_right_figure_after_the_read_is_paid(form: str) -> None:
    """The read, then the figure alone ("7"): the user once heard it as saying nothing, nudged
    twice and ended the episode as the agent's silence (reward 0), so lookup training with a user
    punished the short answer the task asks for ("Tell me the number.")."""
    trajs = anyio.run(lambda: play(0.0, groups=3, solve=lambda t: form.format(t.required_outputs[0])))
    assert [t.reward for t in trajs] == [1.0] * 6, [(t.parts, t.messages[-1]) for t in trajs]


@pytest.mark.parametrize("bare", ["987654321", "  ", "...", "{}"])
def test_attack_a_bare_wrong_figure_or_nothing_is_still_no_answer(bare: str) -> None:
    """The other way: a figure alone that is not the answer, or a reply with nothing in it after
    the read, earns nothing (the read alone is no answer)."""
    trajs = anyio.run(lambda: play(0.0, groups=3, solve=lambda t: bare))
    assert [t.reward for t in trajs] == [0.0] * 6, [(t.parts, t.messages[-1]) for t in trajs]
    assert all(t.parts.get("outputs", 0.0) == 0.0 for t in trajs)


def test_no_rate_no_injection_and_the_same_seed_draws_the_same_errors() -> None:
    clean = anyio.run(play, 0.0)
    assert all(t.injected_user_error is None and not t.user_error for t in clean)
    assert mask_scores(clean)["mask_recall"] is None
    first, again = anyio.run(play, 0.5, 3), anyio.run(play, 0.5, 3)
    drawn = [t.injected_user_error for t in first]
    assert drawn == [t.injected_user_error for t in again]
    assert 0 < sum(k is not None for k in drawn) < len(drawn)


def _app() -> typer.Typer:
    app = typer.Typer()
    trainer_commands.register(app)
    return app


def test_train_records_the_mask_against_the_injected_errors(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", ["get_book", "book_id", "The answer is"])
    out = tmp_path / "run"
    args = ["train", "--model", str(model), "--envs", str(LIBRARY), "--tasks", "lookup"]
    args += ["--steps", "1", "--tasks-per-step", "2", "--rollouts-per-task", "2", "--max-turns", "2"]
    args += ["--max-new-tokens", "3", "--staleness", "0", "--user-error-rate", "1", "--no-mask-user-errors"]
    args += ["--out", str(out), "--no-mcp"]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    # 4 drawn; a premature stop needs an agent turn that asks or announces, which a random model
    # may not write, and is then not recorded as committed
    injected = step["user_errors_injected"]
    assert 3 <= injected <= 4 and step["user_errors_caught"] <= step["user_errors_flagged"]
    assert step["masked_fraction"] == 0.0  # flagged, not masked: --no-mask-user-errors
    ran = json.loads((out / "run.json").read_text())
    assert ran["learner"]["mask_user_errors"] is False
    assert ran["ran"]["env_kind"] == "harness" and ran["ran"]["user_errors"]["injected"] == injected
    assert f"user errors: {injected} injected" in res.output


def test_bad_rates_and_combinations_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    base = ["train", "--model", str(tmp_path), "--envs", str(LIBRARY), "--out", str(tmp_path / "o")]
    for extra, said in [
        (["--user-error-rate", "1.5"], "--user-error-rate must be between 0 and 1"),
        (["--user-error-rate", "0.5", "--env-kind", "fleet"], "needs a simulated user"),
        (["--user-error-rate", "0.5", "--user", "openai/gpt-4o-mini"], "--user scripted"),
    ]:
        res = CliRunner().invoke(_app(), [*base, *extra])
        assert res.exit_code != 0 and said in res.output, res.output
        assert "Traceback" not in res.output
