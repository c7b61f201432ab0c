"""`envs/*` on a fresh clone: every entry the shell glob gives is an env that loads and serves.

The τ² retail port is not an env folder until `envforge import tau2` writes one (its code ships in
the envforge package, its data never in the repository), so nothing under `envs/` may be a folder
that needs an import first, and no file there may be caught by the glob (ruff's config is
`envs/.ruff.toml`). A fresh clone is modelled by copying the files git tracks under `envs/`.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from envforge.cli.main import app
from envforge.server import load_env

from support.paths import REPO
from support.serving import envforge_serve

ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


@pytest.fixture(scope="module")
def fresh_envs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files git tracks under envs/ (as a clone has them, untracked imports left out)."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "envs"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files of envs/ cannot be listed")
    root = tmp_path_factory.mktemp("clone")
    for name in filter(None, listed.decode().split("\0")):
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    return root / "envs"


def _glob(envs: Path) -> list[str]:
    """What the shell's `envs/*` expands to (no dotfiles), sorted as the shell sorts it."""
    return sorted(glob.glob(str(envs / "*")))


def test_every_entry_of_the_envs_glob_loads(fresh_envs: Path) -> None:
    entries = _glob(fresh_envs)
    assert len(entries) >= 8
    for entry in entries:
        load_env(entry)  # raises EnvLoadError naming the file and line
    assert not (fresh_envs / "tau2_retail").exists()


def test_serve_envs_glob_serves_every_env(fresh_envs: Path) -> None:
    entries = _glob(fresh_envs)
    with envforge_serve(entries, timeout_s=120) as url:
        served = {e["name"] for e in httpx.get(url + "/control/envs", timeout=10).json()["envs"]}
    assert served == {Path(e).name for e in entries}


def test_check_takes_several_env_folders(fresh_envs: Path) -> None:
    """`envforge check envs/*` is one command over every folder (two small envs here, for time)."""
    small = [e for e in _glob(fresh_envs) if Path(e).name in ("gym", "library")]
    result = CliRunner().invoke(app, ["check", *small])
    output = " ".join(result.output.split())
    assert result.exit_code == 0, output
    assert re.search(r"gym: \d+ tasks", output) and re.search(r"library: \d+ tasks", output)
    assert output.endswith("2 envs pass")
