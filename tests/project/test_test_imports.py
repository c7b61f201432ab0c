"""No test file imports another test file (or conftest): what tests share lives in `tests/support/`.

A test module imported by another ties the two together: moving, renaming or deleting one breaks
the other, a private helper becomes an interface nobody declared, and pytest's import mode decides
whether the import works at all. Every import is checked, those inside functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

from support.paths import REPO

TESTS = REPO / "tests"


def _test_modules(root: Path) -> set[str]:
    """The names a test file could be imported by: every module under `root` but the shared helpers
    and the fixtures (whose tools.py files are envs' code, loaded by path)."""
    return {
        p.stem
        for p in root.rglob("*.py")
        if p.relative_to(root).parts[0] not in ("support", "fixtures") and p.stem != "__init__"
    }


def cross_imports(root: Path) -> list[str]:
    """`file:line imports name` for each import of a test module (or conftest) by a file under `root`."""
    forbidden = _test_modules(root)
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "fixtures":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = ["." * node.level + (node.module or "")]
            else:
                continue
            for name in names:
                if name.startswith(".") or name.split(".")[0] in forbidden:
                    found.append(f"{path.relative_to(root)}:{node.lineno} imports {name}")
    return found


def test_no_test_file_imports_another() -> None:
    assert cross_imports(TESTS) == []


def test_an_import_of_another_test_file_is_found(tmp_path: Path) -> None:
    """The check itself: a helper taken from another test file, at module level or inside a
    function, from a subfolder, or from conftest, is reported; one from `support` is not."""
    (tmp_path / "support").mkdir()
    (tmp_path / "support" / "paths.py").write_text("REPO = None\n")
    (tmp_path / "server").mkdir()
    (tmp_path / "conftest.py").write_text("REPO = None\n")
    (tmp_path / "server" / "test_b.py").write_text("def helper():\n    pass\n")
    (tmp_path / "test_a.py").write_text(
        "from support.paths import REPO\nfrom test_b import helper\ndef test_x():\n    import conftest\n"
    )
    assert cross_imports(tmp_path) == ["test_a.py:2 imports test_b", "test_a.py:4 imports conftest"]
