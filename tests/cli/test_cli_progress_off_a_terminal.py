"""Long work speaks when its output is not a terminal. With stderr sent to a file or a pipe rich's
bars drew nothing, so a 5-minute eval, an 11-minute `synth env` or a 13-minute `train` looked hung.
Off a terminal each command's progress is a plain line per unit of work (every few seconds at
most) and a `still working` line while one unit takes long."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, TextColumn

from envforge.cli.progress import PlainProgress, work_progress

from support.paths import ENVS, REPO


def test_eval_piped_to_a_file_prints_progress_lines(tmp_path: Path) -> None:
    log = tmp_path / "eval.log"
    command = [sys.executable, "-m", "envforge.cli", "eval", str(ENVS / "gym"), "--agent", "oracle"]
    command += ["--user", "scripted", "--limit", "3", "--out", str(tmp_path / "run")]
    with log.open("w") as f:
        done = subprocess.run(
            command,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=300,
            cwd=REPO,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
    assert done.returncode == 0, log.read_text()
    lines = log.read_text().splitlines()
    assert any(line.startswith("eval oracle 3/3") for line in lines), lines  # the last unit, always


def test_off_a_terminal_a_long_unit_gets_a_heartbeat_and_each_unit_a_line() -> None:
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=False, width=200)
    progress = work_progress(TextColumn("x"), BarColumn(), console=console, label="train", heartbeat_s=1.5)
    assert isinstance(progress, PlainProgress)
    progress.every_s = 0.0  # a line per unit
    with progress:
        bar = progress.add_task("train", total=2, info="")
        time.sleep(2.8)  # the first step is slow: the user hears it is still going
        progress.update(bar, advance=1, info="reward 0.500")
        progress.update(bar, advance=1, info="reward 0.750")
    lines = sink.getvalue().splitlines()
    assert any("still working" in line and "0/2" in line for line in lines), lines
    assert any(line.startswith("train 1/2 reward 0.500") for line in lines), lines
    assert any(line.startswith("train 2/2 reward 0.750") for line in lines), lines


def test_on_a_terminal_it_is_the_bar() -> None:
    console = Console(file=io.StringIO(), force_terminal=True)
    assert not isinstance(work_progress(BarColumn(), console=console, label="eval"), PlainProgress)


def test_the_demos_closing_advice_fits_minutes_at_the_measured_trial_time() -> None:
    from envforge.cli import demo

    console = Console(file=io.StringIO(), record=True, width=300)
    demo.print_next_steps(console, [demo.REPO / "envs" / "retail_orders"], per_trial=161.0, all_trials=40)
    text = console.export_text()
    local = next(line for line in text.splitlines() if "--agent local" in line)
    limit = int(local.split("--limit ")[1].split()[0])
    assert limit * 161 <= demo.ADVICE_MINUTES * 60  # minutes, not the hours all 40 would take
    assert "x 161 s per trial (measured here just now): about 9 min" in text
    assert "all 40 demo tasks would take about 1 h 48 min" in text


def test_off_a_terminal_each_new_stage_gets_its_line_however_soon() -> None:
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=False, width=200)
    with work_progress(TextColumn("x"), console=console, label="synth env", every_s=60.0) as progress:
        stage = progress.add_task("library: 4 tools", total=None)
        for message in ("asking for schema", "round 0: gates", "round 0: probes failed, repairing tools"):
            progress.update(stage, description=message)
    lines = sink.getvalue().splitlines()
    assert [line.rsplit(" (", 1)[0] for line in lines] == [
        "synth env asking for schema",
        "synth env round 0: gates",
        "synth env round 0: probes failed, repairing tools",
    ]


def test_off_a_terminal_byte_counts_read_in_mib() -> None:
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=False, width=200)
    with work_progress(console=console, label="local", in_bytes=True) as progress:
        bar = progress.add_task("agent: local: checking weights", total=491_400_000)
        progress.update(bar, completed=491_400_000)
    assert "local agent: local: checking weights 469 MiB/469 MiB" in sink.getvalue()


def test_the_demos_advice_is_whole_lines_at_80_columns() -> None:
    from envforge.cli import demo

    console = Console(file=io.StringIO(), record=True, width=80)
    demo.print_next_steps(console, demo.demo_env_dirs(), per_trial=141.0, all_trials=45)
    lines = console.export_text().splitlines()
    local = next(line for line in lines if "--agent local" in line)
    assert local.strip().endswith("--out runs/local")  # one command, one line: it can be copied
    hosted = next(line for line in lines if "--agent openai/" in line)
    assert hosted.strip().startswith("envforge eval") and hosted.endswith("runs/gpt-4o-mini")
