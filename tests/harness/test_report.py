"""The HTML report and `envforge report`: every trial shown, text escaped, SVG drawn, stable bytes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from envforge.cli.report_commands import register
from envforge.harness import REPORT_FILE, Message, RunManifest, ToolCall, TrialRecord, Usage, write_report
from envforge.synth import Score

EVIL = "<script>alert('pwned')</script>"


def rec(env: str, task: str, trial: int, reward: float, status: str = "completed", **kw: Any) -> TrialRecord:
    messages = [
        Message(role="system", content="You are a helpful agent."),
        Message(role="user", content=f"Please help {EVIL}", turn=1),
        Message(
            role="assistant",
            tool_calls=[ToolCall(id="c1", name="get_account", arguments={"account_id": "A<1>"})],
            turn=1,
        ),
        Message(
            role="tool", tool_call_id="c1", content='{"error": "no such account"}', is_error=True, turn=1
        ),
        Message(role="assistant", content="Done & dusted.", turn=2),
    ]
    score = Score(
        reward=reward,
        state_match=reward == 1.0,
        outputs=1.0,
        outputs_missing=[] if reward == 1.0 else ["balance <b>42</b>"],
        checkpoints=0.5,
        checkpoints_passed=1,
        checkpoints_total=2,
        basis=["state", "outputs"],
    )
    return TrialRecord(
        run_id="r1",
        trial_key=f"{env}/{task}/{trial}",
        env=env,
        task_id=task,
        trial=trial,
        seed=trial,
        status=status,  # type: ignore[arg-type]
        termination="user_stop",
        messages=messages,
        score=score if status == "completed" else None,
        reward=reward,
        usage={"agent": Usage(calls=2, prompt_tokens=1200, completion_tokens=80, cost_usd=0.01)},
        difficulty={"calls": 1 + int(task[-1]) * 2},  # t1: 3-4 calls, t2 and t3: 5+ (two buckets to compare)
        started_at=1000.0,
        duration_s=2.5,
        agent="agent-model",
        user="user-model",
        **kw,
    )


def make_run(run_dir: Path, with_trials: bool = True) -> Path:
    run_dir.mkdir(parents=True)
    manifest = RunManifest(
        run_id="r1",
        created_at=1_700_000_000.0,
        envs=["bank", "shop"],
        env_dirs=["envs/bank", "envs/shop"],
        task_ids={"bank": ["t1", "t2"], "shop": ["t3"]},
        trials=3,
        agent="gpt-agent<x>",
        user="user-model",
        concurrency=2,
        seed=0,
        judge="judge-model",
    )
    (run_dir / "manifest.json").write_text(manifest.model_dump_json())
    if with_trials:
        records = [
            rec(env, task, t, 1.0 if (t + len(task)) % 2 else 0.0)
            for env, task in (("bank", "t1"), ("bank", "t2"), ("shop", "t3"))
            for t in range(3)
        ]
        records[-1] = rec("shop", "t3", 2, 0.0, status="infra_failure", error="server crashed")
        records[4] = rec("bank", "t2", 1, 0.0, user_error=True, user_error_reason="user <lied>")
        records[0].parts = {"state": 1.0, "nl_assertions": 0.25}
        records[0].not_judged = ["nl_assertions"]
        (run_dir / "trials.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in records))
    return run_dir


def test_report_shows_every_trial_escaped(tmp_path: Path) -> None:
    path = write_report(make_run(tmp_path / "run"))
    assert path == tmp_path / "run" / REPORT_FILE
    page = path.read_text()
    trials = re.findall(r'<details class="trial (?:pass|fail|excluded)"', page)
    assert len(trials) == 9
    for env, task in (("bank", "t1"), ("bank", "t2"), ("shop", "t3")):
        for t in range(3):
            assert f"{env}/{task}/{t}" in page
    assert EVIL not in page and "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # only the filter script of the page itself
    assert "gpt-agent&lt;x&gt;" in page and "user &lt;lied&gt;" in page and "balance &lt;b&gt;42" in page
    assert "Done &amp; dusted." in page
    assert 'class="msg tool error"' in page and "get_account" in page and "A&lt;1&gt;" in page
    assert "server crashed" in page and "checkpoints" in page and "not scored" in page
    assert "part: nl_assertions" in page and "0.250" in page and "not judged" in page
    assert "judge-model" in page


def test_report_renders_svg_and_is_self_contained(tmp_path: Path) -> None:
    page = write_report(make_run(tmp_path / "run")).read_text()
    assert page.count("<svg") == 5
    for caption in (
        "pass^k by env",
        "Reward by env",
        "Reward by difficulty",
        "Tokens per role",
        "Cost per role",
    ):
        assert caption in page
    assert "<polyline" in page and "<rect" in page and 'class="whisker"' in page
    assert not re.search(r"(src|href)=|https?://|@import", page)
    assert "2023-11-14 22:13:20 UTC" in page  # manifest date, rendered in UTC


def test_report_is_deterministic(tmp_path: Path) -> None:
    a = write_report(make_run(tmp_path / "a")).read_text()
    b = write_report(make_run(tmp_path / "b")).read_text()
    assert a == b
    assert write_report(tmp_path / "a").read_text() == a


def app() -> typer.Typer:
    root = typer.Typer()
    register(root)

    @root.callback()
    def _root() -> None:
        """Keep `report` a subcommand, as in the real multi-command app."""

    return root


def test_cli_report_table_and_json(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    result = CliRunner().invoke(app(), ["report", str(run)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "pass^3" in result.stdout and "overall" in result.stdout
    assert f"report: {run / REPORT_FILE}" in result.stdout
    assert (run / REPORT_FILE).exists()

    (run / REPORT_FILE).unlink()
    result = CliRunner().invoke(app(), ["report", str(run), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert set(summary) == {"overall", "envs"} and summary["overall"]["infra_failures"] == 1
    assert len(summary["overall"]["pass_hat_k"]) == 3
    assert "report:" in result.stderr and (run / REPORT_FILE).exists()


@pytest.mark.parametrize("case", ["missing", "no_manifest", "no_trials"])
def test_cli_report_clear_errors(tmp_path: Path, case: str) -> None:
    run = tmp_path / "run"
    if case == "no_manifest":
        run.mkdir()
    elif case == "no_trials":
        make_run(run, with_trials=False)
    result = CliRunner().invoke(app(), ["report", str(run)])
    assert result.exit_code == 2
    message = {
        "missing": "no such run directory",
        "no_manifest": "no manifest.json",
        "no_trials": "no trials",
    }
    assert message[case] in " ".join(result.stderr.split())  # rich wraps long lines
    assert not (run / REPORT_FILE).exists()


def test_cli_report_warns_on_truncated_line(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    with (run / "trials.jsonl").open("a") as f:
        f.write('{"run_id": "r1", "trial_key": "ba')
    result = CliRunner().invoke(app(), ["report", str(run), "--json"])
    assert result.exit_code == 0, result.output
    assert "skipped 1 unreadable line(s) at line 10" in " ".join(result.stderr.split())
    assert json.loads(result.stdout)["overall"]["n_trials"] == 8
