"""docs/benchmarks.md opens with a dashboard a reader can trust at a glance.

Every row of its tables names a target, the current figure, the command that measures it and the
date it was measured; every benchmark script a command names exists, so renaming a script cannot
leave the dashboard pointing at nothing. Every target links to the section that says how its
figure was taken (a method page under docs/benchmarks/, or the doc that owns the mechanism);
tests/project/test_doc_links.py checks that each such section exists.
"""

from __future__ import annotations

import re

from support.paths import REPO

DOC = REPO / "docs" / "benchmarks.md"
TARGET_LINK = re.compile(r"^\[.+\]\(([\w./-]+\.md)#[^)\s]+\)$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
SCRIPT = re.compile(
    r"(?:benchmarks/)?\b(bench_\w+\.py|ab_synth\.py|load_http\.py|erpo_vs_control\.py|erpo_ablation\.py|erpo_transfer\.py|trl_vs_envforge\.py)"
)


def dashboard() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Dashboard")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def rows(section: str) -> list[list[str]]:
    cells = []
    for line in section.splitlines():
        if not line.startswith("|") or set(line) <= {"|", "-", " "}:
            continue
        cells.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return cells


def test_the_dashboard_comes_first_and_has_a_table_per_area() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert text.index("## Dashboard") < text.index("\n## ", text.index("## Dashboard") + 1)
    areas = re.findall(r"^\*\*(.+)\*\*$", dashboard(), flags=re.MULTILINE)
    assert len(areas) >= 6, areas
    assert len(areas) == len(set(areas)), "an area appears twice"


def test_every_row_has_target_current_command_and_date() -> None:
    table = rows(dashboard())
    headers = [row for row in table if row[0] == "target"]
    assert headers and all(row == ["target", "current", "command", "date"] for row in headers)
    figures = [row for row in table if row[0] != "target"]
    assert len(figures) >= 20
    for row in figures:
        assert len(row) == 4, row
        target, current, command, date = row
        assert target and current, row
        if current.startswith("not measured"):  # a target with no figure yet says so, undated
            continue
        assert DATE.match(date), f"no date in {row}"
        assert "`" in command or command.startswith(("same", "see ")), f"no command in {row}"


def test_every_script_a_command_names_exists() -> None:
    named = set(SCRIPT.findall(dashboard()))
    assert named, "the dashboard names no benchmark script"
    missing = sorted(name for name in named if not (REPO / "benchmarks" / name).is_file())
    assert not missing, f"the dashboard names scripts that do not exist: {missing}"


def test_every_target_links_to_the_section_that_explains_its_figure() -> None:
    for row in rows(dashboard()):
        if row[0] == "target":
            continue
        link = TARGET_LINK.match(row[0])
        assert link, f"the target does not link to a section: {row[0]}"
        assert (DOC.parent / link.group(1)).is_file(), f"no page {link.group(1)} for {row[0]}"
