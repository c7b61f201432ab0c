"""A failed `synth env -o envs/NAME` used to leave `envs/NAME/` (a report and a rejected candidate,
no manifest), which then broke `serve envs/*` and `eval envs/*` ("manifest is missing"). Now the
env is written into a temporary folder beside DIR and moved into place only when accepted; a
rejected run leaves DIR as it was and says, in its one error line, where its report is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from support.paths import ENVSYNTH_FIXTURES, REPO

LIBRARY_DOCS = REPO / "envs" / "library" / "docs"


def synth_env(out: Path, fixture: str | Path) -> subprocess.CompletedProcess[str]:
    args = ["synth", "env", str(LIBRARY_DOCS), "-o", str(out), "--name", "library", "--max-rounds", "1"]
    return subprocess.run(
        [sys.executable, "-m", "envforge.cli", *args, "--replay", str(ENVSYNTH_FIXTURES / fixture)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "300"},
    )


def visible(folder: Path) -> list[str]:
    """What `folder/*` names in a shell."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_a_rejected_synthesis_leaves_nothing_at_the_env_folder(tmp_path: Path) -> None:
    envs = tmp_path / "envs"
    shutil.copytree(REPO / "envs" / "gym", envs / "gym")
    done = synth_env(envs / "library", "wrong_name_rejected")
    assert done.returncode == 1, done.stderr
    assert visible(envs) == ["gym"]  # `serve envs/*` still names only envs
    kept = envs / ".rejected" / "library"
    assert json.loads((kept / "synthesis.json").read_text())["status"] == "rejected"
    assert (kept / "rejected_candidate" / "tools.py.txt").exists()
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert "library rejected (gate 'probes' still fails after 1 repair rounds)" in line
    assert f"nothing written to {envs / 'library'}" in line and str(kept) in line
    served = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "inspect", str(envs / "gym")], capture_output=True, timeout=120
    )
    assert served.returncode == 0


def test_a_rejected_rerun_keeps_the_accepted_env_an_accepted_one_replaces_it(tmp_path: Path) -> None:
    out = tmp_path / "envs" / "library"
    first = synth_env(out, "library")
    assert first.returncode == 0, first.stderr
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "env.toml" in files and json.loads(files["synthesis.json"])["status"] == "accepted"
    assert visible(out.parent) == ["library"] and not list(out.parent.glob(".library.*"))  # no temp left
    again = synth_env(out, "wrong_name_rejected")
    assert again.returncode == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files  # the accepted env, byte for byte
    third = synth_env(out, "library")
    assert third.returncode == 0, third.stderr
    assert not (out.parent / ".rejected" / "library").exists()  # an accepted run clears the stale report


def test_a_candidates_crashes_reach_the_gate_account_not_the_terminal(tmp_path: Path) -> None:
    # captured: the 1.5B's Slack tools crash on probe after probe; each confined worker's
    # traceback used to reach stderr, 100 lines of them within the first seconds of a run
    docs = REPO / "benchmarks" / "envsynth_corpus" / "mcp_slack" / "docs"
    fixture = ENVSYNTH_FIXTURES / "captured_slack_1.5b_lookup"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "envforge.cli",
            "synth",
            "env",
            str(docs),
            "-o",
            str(tmp_path / "slack"),
            "--max-rounds",
            "0",
            "--replay",
            str(fixture),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "300"},
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "confined env" not in done.stderr, done.stderr[:2000]
    assert "probes: FAILED" in done.stderr  # what crashed is still said, once, in the account


def test_an_accepted_env_keeps_the_answers_it_was_made_from(tmp_path: Path) -> None:
    # a real model's accepted env could not be rebuilt: only a rejected run kept its answers
    first = synth_env(tmp_path / "a" / "library", "library")
    assert first.returncode == 0, first.stderr
    kept = tmp_path / "a" / "library" / "responses.json"
    assert json.loads(kept.read_text())["note"] == "every answer of replay:library in this accepted run"
    again = synth_env(tmp_path / "b" / "library", kept)  # replayed from the env's own file
    assert again.returncode == 0, again.stderr
    made = sorted((tmp_path / "a" / "library").iterdir())
    for path in made:
        if path.name not in ("synthesis.json", "responses.json"):  # the reports hold times and notes
            assert path.read_bytes() == (tmp_path / "b" / "library" / path.name).read_bytes(), path.name
