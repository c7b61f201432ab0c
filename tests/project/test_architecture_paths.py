"""Every file, folder and module docs/architecture.md names exists.

The architecture page is the map a newcomer reads first, and it names the tree directly
(`server/core/db.py`, `synth/task/`, `envforge.server.sandbox`). A module moved or renamed leaves
the map pointing at nothing, and no link check sees it: these names sit in code spans, not links.
Here every repository path under a top-level folder (`server/…`, `synth/…`, `tests/…`, …), every
bare `name.py`, and every dotted `envforge.…` module name on the page is resolved against the
files, the dotted names through pyproject's `package-dir` (how `envforge.server` is `server/`).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
PAGE = REPO / "docs" / "architecture.md"
TOP = ("server", "synth", "harness", "trainer", "cli", "api", "tests", "benchmarks", "docs", "envs")
PATH = re.compile(rf"(?<![\w./<-])((?:{'|'.join(TOP)})/[\w./*-]*)")
BARE_FILE = re.compile(r"`([\w-]+\.py)`")
MODULE = re.compile(r"(?<![\w./-])(envforge(?:\.[A-Za-z_]\w*)+)")


def package_dirs(root: Path) -> dict[str, Path]:
    """Import name -> folder, from pyproject's `[tool.setuptools.package-dir]`."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    mapping = pyproject["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in mapping.items()}


def module_exists(name: str, dirs: dict[str, Path]) -> bool:
    """Whether `name` is a module or package of envforge's source tree (no import: names of the
    trainer would load torch)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        if (base := ".".join(parts[:cut])) in dirs:
            where = dirs[base].joinpath(*parts[cut:])
            return (where / "__init__.py").is_file() or where.with_suffix(".py").is_file()
    return False


def missing_names(text: str, root: Path) -> list[str]:
    """The paths and module names in `text` that name nothing in `root`, each once, in order."""
    dirs = package_dirs(root)
    sources = [p.name for top in TOP[:6] for p in (root / top).rglob("*.py")]
    missing = []
    for raw in PATH.findall(text):
        path = raw.rstrip(".,:;")
        if not (list(root.glob(path)) if "*" in path else (root / path).exists()):
            missing.append(f"{path} (no such file or folder)")
    for name in BARE_FILE.findall(text):
        if name not in sources:
            missing.append(f"{name} (no module of that name)")
    for name in MODULE.findall(text):
        if not module_exists(name, dirs):
            missing.append(f"{name} (no such module)")
    return list(dict.fromkeys(missing))


def test_a_wrong_path_or_module_is_found(tmp_path: Path) -> None:
    """A page naming a module that moved is caught, whichever way it names it."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"envforge" = "api"\n"envforge.server" = "server"\n', encoding="utf-8"
    )
    (tmp_path / "server" / "core").mkdir(parents=True)
    (tmp_path / "server" / "core" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "server" / "core" / "db.py").write_text("", encoding="utf-8")
    page = (
        "`server/core/db.py` and `server/core/`, `envforge.server.core.db` and `db.py` are there.\n"
        "`server/sqlguard.py` moved, so did `envforge.server.sqlguard`; `guard.py` never was.\n"
    )
    assert missing_names(page, tmp_path) == [
        "server/sqlguard.py (no such file or folder)",
        "guard.py (no module of that name)",
        "envforge.server.sqlguard (no such module)",
    ]


def test_every_path_and_module_the_architecture_page_names_exists() -> None:
    assert missing_names(PAGE.read_text(encoding="utf-8"), REPO) == []
