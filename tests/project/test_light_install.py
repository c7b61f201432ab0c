"""`make demo` installs what the demo runs and no more, and the demo's code path never imports the
training stack: a newcomer's first command should not spend minutes and gigabytes on torch, trl
and ray it never touches (docs/benchmarks/newcomer.md, "Install"), while `make test` keeps installing
everything the tests need."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.paths import REPO

TRAINING_STACK = ("torch", "transformers", "trl", "ray", "vllm")


def _dry_run(target: str, venv: Path) -> str:
    """The commands `make TARGET` would run for a venv at `venv` (recursive makes included)."""
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", target, f"VENV={venv}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def _installs(commands: str) -> list[str]:
    return [line for line in commands.splitlines() if "pip install" in line and " -e " in line]


def test_make_demo_on_a_fresh_machine_installs_the_local_model_but_no_training_stack(tmp_path: Path) -> None:
    (installs,) = [_installs(_dry_run("demo", tmp_path / ".venv"))]
    assert len(installs) == 1 and '".[local]"' in installs[0], installs
    assert not any(name in installs[0] for name in ("train", "ray", "gpu", "dev"))


def test_make_test_still_installs_everything_the_tests_need(tmp_path: Path) -> None:
    commands = _dry_run("test", tmp_path / ".venv")
    installs = _installs(commands)
    assert len(installs) == 1 and '".[dev,train,ray,local,openenv,inspect,verifiers]"' in installs[0], (
        installs
    )
    assert "pip install -q --no-deps verifiers==0.4.0" in commands  # its mcp pin is not ours (Makefile)


def test_make_demo_reuses_a_venv_set_up_for_everything(tmp_path: Path) -> None:
    venv = tmp_path / ".venv"
    venv.mkdir()
    (venv / ".stamp").touch()  # `make setup` / `make test` made it, after pyproject.toml changed
    os.utime(venv / ".stamp", (os.path.getmtime(REPO / "pyproject.toml") + 10,) * 2)
    assert _installs(_dry_run("demo", venv)) == []


def test_the_demo_runs_with_the_training_stack_unimportable(tmp_path: Path) -> None:
    """The demo's own path (the CLI module it is a command of, the fleet, the built-in agents, the
    report) played for real with torch and friends made unimportable, as on the light install."""
    code = textwrap.dedent(
        f"""
        import sys
        from importlib.abc import MetaPathFinder

        class NoTrainingStack(MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {TRAINING_STACK!r}:
                    raise ImportError(f"{{name}} is not installed (light install)")
                return None

        sys.meta_path.insert(0, NoTrainingStack())
        import anyio
        from pathlib import Path
        from rich.console import Console
        import envforge.cli.main  # the command the demo is
        from envforge.cli import demo

        anyio.run(demo._demo, Console(width=100), Path(sys.argv[1]), 1, None)
        print("loaded:", sorted(m for m in {TRAINING_STACK!r} if m in sys.modules))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded: []" in done.stdout
    for agent in ("oracle", "random", "noop"):
        assert (tmp_path / f"demo-{agent}" / "trials.jsonl").stat().st_size > 0
