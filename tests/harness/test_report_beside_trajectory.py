"""The report over real runs on a bundled env: beside each trajectory the task's instruction, its
golden calls, the reward part that failed and the state diff; infra failures grey and not counted;
`eval` writes report.html; `envforge report A B` compares runs; bad input is a one-line error.

Each run here is a real `run_eval` over `envs/flight_booking` (real SQLite episodes, real files),
played by the built-in agents: `oracle` (passes), `noop` (does nothing), the reward hunters
`golden_prefix` (stops after its first write) and `spray` (every call, no answer told), and a
model agent whose server is not there (an infra failure).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

from envforge.cli.main import app
from envforge.harness import (
    REPORT_FILE,
    EvalConfig,
    LLMConfig,
    RunManifest,
    end_state_lines,
    keys_of,
    load_env_tasks,
    read_run,
    run_eval,
    write_report,
)
from envforge.synth import TableDiff, Task, diff_states, load_tasks

from support.paths import FIXTURES, REPO
from support.serving import free_port


def _frozen_flights() -> Path:
    """flight_booking with two tasks frozen as a fixture (a refund and a two-passenger check-in,
    whose values the tests below name); the bundled tasks are regenerated as synthesis improves."""
    root = Path(tempfile.mkdtemp(prefix="report-flights-")) / "flight_booking"
    shutil.copytree(REPO / "envs" / "flight_booking", root, ignore=shutil.ignore_patterns("tasks.jsonl"))
    shutil.copy(FIXTURES / "report_flight_tasks.jsonl", root / "tasks.jsonl")
    atexit.register(shutil.rmtree, root.parent, True)
    return root


FLIGHTS = _frozen_flights()
# a refund task (a member's travel credit raised, a payment row inserted) and a check-in task
# whose answer ("2") must be told to the user
REFUND, CHECK_IN = "flight_booking-0-00000", "flight_booking-0-00008"
EVAL = [sys.executable, "-m", "envforge.cli", "eval", str(FLIGHTS), "--agent", "oracle"]
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def tasks_by_id() -> dict[str, Task]:
    return {t.id: t for t in load_tasks(FLIGHTS)}


def run(out: Path, agent: str, *, agent_llm: LLMConfig | None = None) -> Path:
    config = EvalConfig(agent=agent, agent_llm=agent_llm, task_ids=[REFUND, CHECK_IN], concurrency=2)
    anyio.run(lambda: run_eval([FLIGHTS], config, out))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    dead = LLMConfig(model="openai/nobody", api_base=f"http://127.0.0.1:{free_port()}/v1", retries=0)
    return {
        "oracle": run(root / "oracle", "oracle"),
        "noop": run(root / "noop", "noop"),
        "golden_prefix": run(root / "golden_prefix", "golden_prefix"),
        "spray": run(root / "spray", "spray"),
        "dead": run(root / "dead", "openai/nobody", agent_llm=dead),
    }


def trial_section(page: str, trial_key: str) -> str:
    """The HTML of one trial of the viewer (from its <details> to the next trial's)."""
    sections = page.split('<details class="trial ')[1:]
    found = [s for s in sections if f"<td>{trial_key}</td>" in s]
    assert len(found) == 1, f"{trial_key}: {len(found)} sections"
    return found[0]


def esc(text: str) -> str:
    import html

    return html.escape(text, quote=True)


def test_failed_trial_shows_instruction_golden_calls_failed_part_and_diff(
    runs: dict[str, Path],
) -> None:
    page = write_report(runs["noop"]).read_text()
    tasks = tasks_by_id()
    refund = trial_section(page, f"flight_booking/{REFUND}/0")
    task = tasks[REFUND]
    assert f'<blockquote class="instruction">{esc(task.scenario.instruction)}</blockquote>' in refund
    assert f"expected calls ({len(task.golden_calls)})" in refund
    for call in task.golden_calls:
        args = json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)
        assert f'<span class="fn">{call.name}</span><code>{esc(args)}</code>' in refund
    # which part failed, in the summary line and in the parts table
    assert "failed: state" in refund and "state ✗ failed" in refund
    # the diff: the member's credit the golden run raised, and the payment row it inserted
    assert "state diff (expected vs actual)" in refund
    credit = re.search(
        r'<tr data-table="members"><td[^>]*>([^<]*)</td><td[^>]*>travel_credit</td>'
        r"<td[^>]*>([^<]*)</td><td[^>]*>([^<]*)</td></tr>",
        refund,
    )
    assert credit is not None, "no travel_credit row in the diff"
    assert credit.groups() == (esc('member_id="M-1017"'), "100.0", "0.0")
    assert re.search(r'<tr data-table="payments">(?:(?!</tr>).)*<td[^>]*>missing</td>', refund, re.S)
    # only what differs: no row of a table the task did not touch
    assert 'data-table="flights"' not in refund

    check_in = trial_section(page, f"flight_booking/{CHECK_IN}/0")
    assert "failed: state, outputs" in check_in
    assert "not communicated: 2" in check_in and "outputs ✗ failed" in check_in
    assert page == write_report(runs["noop"]).read_text()  # same run, same bytes


def test_policy_stopping_after_its_first_write_sees_the_row_it_left(runs: dict[str, Path]) -> None:
    """`golden_prefix` checks in the first passenger and stops, hoping partial work passes. The
    diff names the passenger it left (expected 1, actual 0) and not the one it did check in."""
    section = trial_section(write_report(runs["golden_prefix"]).read_text(), f"flight_booking/{CHECK_IN}/0")
    assert "failed: state" in section and "outputs ✗" not in section
    left = re.search(
        r'<tr data-table="passengers"><td[^>]*>([^<]*)</td><td[^>]*>checked_in</td>'
        r"<td[^>]*>([^<]*)</td><td[^>]*>([^<]*)</td>",
        section,
    )
    assert left is not None and left.groups() == (esc('passenger_id="P-7112"'), "1", "0")
    assert "P-7111" not in section.split("state diff")[1]  # the row it got right is not listed


def test_policy_right_on_state_but_silent_sees_only_outputs_fail(runs: dict[str, Path]) -> None:
    """`spray` ends in the golden state but never tells the user the answer: the failed part is
    outputs, with the value it did not communicate, and there is no state diff to read."""
    section = trial_section(write_report(runs["spray"]).read_text(), f"flight_booking/{CHECK_IN}/0")
    assert "failed: outputs" in section and "failed: state" not in section
    assert "not communicated: 2" in section and "state diff" not in section


def test_a_broken_policy_names_the_rule_it_broke(runs: dict[str, Path]) -> None:
    """`golden_prefix` writes without verifying the member or asking for a yes: the policy row
    says which rules broke, never a judge's verdict (no judge ran)."""
    section = trial_section(write_report(runs["golden_prefix"]).read_text(), f"flight_booking/{CHECK_IN}/0")
    assert "policy ✗ failed" in section
    policy_row = section.split("policy ✗ failed")[1].split("</tr>")[0]
    assert "policy broken: " in policy_row and "written without the user" in policy_row, policy_row
    assert "judge" not in policy_row, policy_row


def test_passing_trial_shows_its_task_and_no_diff(runs: dict[str, Path]) -> None:
    page = write_report(runs["oracle"]).read_text()
    section = trial_section(page, f"flight_booking/{REFUND}/0")
    assert section.startswith("pass") and '<blockquote class="instruction">' in section
    assert "state diff" not in section and "failed:" not in section and "✗" not in section
    assert section.count('<tr class="good">') == 3  # state and outputs, the task's basis; policy


def test_infra_failure_is_grey_labelled_and_left_out_of_pass_k(runs: dict[str, Path]) -> None:
    page = write_report(runs["dead"]).read_text()
    section = trial_section(page, f"flight_booking/{REFUND}/0")
    assert section.startswith('excluded"') and 'data-outcome="excluded"' in section
    assert "infra failure · not counted" in section
    assert "infra failure: not a measurement of the agent, left out of pass^k" in section
    assert 'class="c-reward fail"' not in page and ">0.00</span>" not in section
    assert "reward parts" not in section  # not judged: nothing it did is measured
    assert "2 infra and 0 env failure(s) are left out" in page


def test_report_without_the_env_folder_renders_with_a_note(runs: dict[str, Path], tmp_path: Path) -> None:
    run_dir = shutil.copytree(runs["noop"], tmp_path / "moved")
    manifest = RunManifest.model_validate_json((run_dir / "manifest.json").read_text())
    manifest.env_dirs = [str(tmp_path / "gone" / "flight_booking")]
    (run_dir / "manifest.json").write_text(manifest.model_dump_json())
    page = write_report(run_dir).read_text()
    assert "not found: the task is not shown" in page
    assert len(re.findall(r'<details class="trial fail"', page)) == 2


def test_cli_eval_writes_report_html_and_says_where(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [*EVAL, "--tasks", REFUND, "--out", str(out), "--json"],
        env={**ENV, "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"report: {out / REPORT_FILE}" in proc.stderr
    json.loads(proc.stdout)  # stdout stays the JSON summary alone
    page = (out / REPORT_FILE).read_text()
    assert esc(tasks_by_id()[REFUND].scenario.instruction) in page


def test_cli_report_compares_runs_side_by_side(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "compare.html"
    result = CliRunner().invoke(
        app, ["report", str(runs["oracle"]), str(runs["noop"]), "--out", str(out)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "A ^1" in result.stdout and "B ^1" in result.stdout
    assert re.search(r"flight_booking\s+1\.000\s+0\.000", result.stdout)
    assert f"report: {out}" in result.stdout
    page = out.read_text()
    for name in ("oracle", "noop"):
        assert esc(str(runs[name])) in page and f"<td>{name}</td>" in page
    row = re.search(r"<tr><td>flight_booking</td>(.*?)</tr>", page)
    assert row is not None
    assert re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1))[:2] == ["1.000", "0.000"]
    assert page.count("<svg") >= 2 and "pass^1 by env and run" in page
    assert not re.search(r"(src|href)=|https?://|@import", page)  # nothing fetched

    as_json = CliRunner().invoke(
        app, ["report", str(runs["oracle"]), str(runs["dead"]), "--json", "--out", str(out)]
    )
    assert as_json.exit_code == 0, as_json.output
    labels = [(r["label"], r["overall"]["infra_failures"]) for r in json.loads(as_json.stdout)["runs"]]
    assert labels == [("A", 0), ("B", 2)]


def test_cli_report_names_the_missing_run_in_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "compare.html"
    missing = tmp_path / "no-such-run"
    args = ["report", str(runs["oracle"]), str(missing), "--out", str(out)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no such run directory" in lines[0] and "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize("agent", ["noop", "golden_prefix", "spray", "oracle"])
def test_diff_from_stored_diffs_is_the_diff_of_the_end_states(runs: dict[str, Path], agent: str) -> None:
    """The report never loads the env: it compares the task's golden diff with the trial's final
    diff. Every cell it reports must be one where the rebuilt end states differ, and every cell
    where they differ must be reported (checked against `diff_states` on full states)."""
    et = load_env_tasks(FLIGHTS)
    _, records = read_run(runs[agent])
    for rec in records:
        assert rec.final_diff is not None
        task = et.task(rec.task_id)
        final = {t: TableDiff.model_validate(d) for t, d in rec.final_diff.items()}
        truth = diff_states(
            et.pks, et.final_from_diff(task, task.golden_diff), et.final_from_diff(task, final)
        )
        cells = {
            (table, col, exp, act)
            for table, _, col, exp, act in end_state_lines(task.golden_diff, final, keys_of(et.tasks))
        }
        expected_cells = {
            (table, col, json.dumps(u.before[col]), json.dumps(u.after[col]))
            for table, d in truth.items()
            for u in d.updated
            for col in u.after
        }
        whole_rows = sum(len(d.inserted) + len(d.deleted) for d in truth.values())
        assert {c for c in cells if c[1] != "(row)"} == expected_cells, rec.trial_key
        assert sum(1 for c in cells if c[1] == "(row)") == whole_rows, rec.trial_key
