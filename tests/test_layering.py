"""The package structure that ruff's banned-api cannot see: no two modules of a package import each
other (type-only imports included), and the curated surfaces load nothing heavy on import."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(package: str, path: Path) -> set[str]:
    """The sibling modules `path` imports, by relative or absolute import, at any depth."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
            elif node.level == 0 and (node.module or "").startswith(f"envforge.{package}."):
                found.add((node.module or "").split(".")[2])
    return found - {path.stem, "__init__"}


@pytest.mark.parametrize("package", ["server", "synth", "harness", "trainer", "cli"])
def test_no_two_modules_of_a_package_import_each_other(package: str) -> None:
    imports = {p.stem: _imports(package, p) for p in (ROOT / package).glob("*.py")}
    cycles = sorted(
        f"{a} <-> {b}" for a, deps in imports.items() for b in deps if a < b and a in imports.get(b, set())
    )
    assert cycles == []


def test_the_package_surfaces_import_no_ml_stack_and_no_model_client() -> None:
    code = (
        "import sys, envforge.synth, envforge.harness, envforge.trainer\n"
        "from envforge.trainer import RolloutConfig, erpo_advantages, RunOptions\n"
        "heavy = [m for m in ('torch', 'transformers', 'litellm', 'ray', 'vllm') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


SURFACES = {
    "server": ROOT / "server",
    "synth": ROOT / "synth",
    "synth.envsynth": ROOT / "synth" / "envsynth",
    "harness": ROOT / "harness",
    "trainer": ROOT / "trainer",
}


@pytest.mark.parametrize(
    "config", ["cli/ruff.toml", "tests/ruff.toml", "harness/ruff.toml", "trainer/ruff.toml"]
)
def test_a_new_module_is_banned_wherever_its_package_is(config: str) -> None:
    """banned-api names modules one by one: a module added later must join the list, or callers
    could import it past the package's surface without ruff noticing."""
    lint = tomllib.loads((ROOT / config).read_text(encoding="utf-8"))["lint"]
    banned = set(lint["flake8-tidy-imports"]["banned-api"])
    missing = []
    for package, folder in SURFACES.items():
        prefix = f"envforge.{package}."
        if not any(name.startswith(prefix) and name.count(".") == prefix.count(".") for name in banned):
            continue  # this config does not guard that package
        missing += [
            prefix + p.stem
            for p in folder.glob("*.py")
            if p.stem != "__init__" and prefix + p.stem not in banned
        ]
    assert missing == []
