"""`envforge serve --help` read in a terminal of any width: no option name is cut.

Off a terminal rich assumes 80 columns, and help came out with `--max-episode-mib-per-clie…`,
which cannot be typed back; a wide terminal (`COLUMNS=200`) must use its width.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

LONGEST = "--max-episode-mib-per-client"


@pytest.mark.parametrize("columns", [80, 200])
def test_serve_help_keeps_every_option_name_whole(columns: int) -> None:
    env = {**os.environ, "COLUMNS": str(columns), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("TERMINAL_WIDTH", None)
    out = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    lines = out.splitlines()
    assert max(len(line) for line in lines) == columns  # the panel takes the width it is given
    assert any(LONGEST in line for line in lines), [line for line in lines if "max-episode" in line]
    assert "…" not in out


def test_help_paragraphs_wrap_to_the_terminal_width() -> None:
    """`check --help`'s realism legend is one paragraph: at 120 columns it is wrapped to 120, not
    broken where its source lines end ("... or numbering" / "steps; ...")."""
    env = {**os.environ, "COLUMNS": "120", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    out = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "check", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    assert any("copying its description or numbering steps; stiff" in line for line in out.splitlines()), out
