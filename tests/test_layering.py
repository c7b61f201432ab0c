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
    "": ROOT / "api",  # the top-level `envforge`
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
        prefix = f"envforge.{package}." if package else "envforge."
        if not any(name.startswith(prefix) and name.count(".") == prefix.count(".") for name in banned):
            continue  # this config does not guard that package
        missing += [
            prefix + p.stem
            for p in folder.glob("*.py")
            if p.stem != "__init__" and prefix + p.stem not in banned
        ]
    assert missing == []


LEFT_OF_THE_API = ("server", "synth", "harness", "trainer")


def _top_level_imports(path: Path) -> list[str]:
    """Imports of the top-level `envforge` (api/) itself or of its modules, by absolute name."""
    own = {p.stem for p in (ROOT / "api").glob("*.py")} - {"__init__"}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level == 0
            else []
        )
        found += [n for n in names if n == "envforge" or n.split(".")[:2] in (["envforge", m] for m in own)]
    return found


@pytest.mark.parametrize("package", LEFT_OF_THE_API)
def test_the_packages_left_of_the_api_never_import_it(package: str) -> None:
    """ruff's banned-api bans a name with everything under it, so `envforge` cannot be banned
    without banning `envforge.server`: the one-way rule for the top level is checked here."""
    offenders = {
        str(p.relative_to(ROOT)): found
        for p in (ROOT / package).rglob("*.py")
        if (found := _top_level_imports(p))
    }
    assert offenders == {}


def test_the_api_imports_no_cli() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "api").glob("*.py")
        if "envforge.cli" in p.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_importing_envforge_loads_nothing_and_its_names_load_only_their_own_stack() -> None:
    """`import envforge` is free; evaluation and synthesis from it load no ML stack, and the
    model client only with the harness that needs it."""
    code = (
        "import sys, envforge\n"
        "bare = sorted(m for m in sys.modules if m.startswith(('envforge.', 'mcp', 'litellm', 'torch')))\n"
        "envforge.run_episode, envforge.check_tasks, envforge.evaluate, envforge.RunOptions\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'ray', 'vllm') if m in sys.modules]\n"
        "print(','.join(bare) + '|' + ','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "|"
