"""docs/api.md's example is code that runs: executed here as a newcomer would paste it, from the
repository's root, and every `print(...)  # value` in it must print that value, so the page
cannot drift from the API it documents."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.paths import REPO

DOC = REPO / "docs" / "api.md"


def example(doc: str) -> str:
    """The page's ```python blocks, in order, as one script (a ```text block is shown only)."""
    return "\n".join(re.findall(r"^```python\n(.*?)^```", doc, re.S | re.M))


def promised_outputs(code: str) -> list[str]:
    """What each commented print says it prints (`print(x)  # value`), in order."""
    return [m.group(1).strip() for m in re.finditer(r"^\s*print\(.*\)\s+#\s*(.+)$", code, re.M)]


def test_the_api_doc_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    code = example(DOC.read_text(encoding="utf-8"))
    promised = promised_outputs(code)
    assert len(promised) >= 6, "the example lost its checked prints"
    script = tmp_path / "api_example.py"
    script.write_text(code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.strip() for line in done.stdout.splitlines()]
    missing, at = [], 0
    for value in promised:
        try:
            at = lines.index(value, at) + 1
        except ValueError:
            missing.append(value)
    assert missing == [], f"printed:\n{done.stdout}"


def test_the_readme_points_to_the_api_doc() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "## Python API" in readme and "docs/api.md" in readme
