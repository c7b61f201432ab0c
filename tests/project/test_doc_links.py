"""Every relative link in the docs leads somewhere: the file exists and so does the heading.

The benchmark figures live on a dashboard (`docs/benchmarks.md`) whose rows link into per-area
method pages (`docs/benchmarks/`), and the other docs link into both. A renamed heading or a moved
page breaks such a link silently on GitHub; this test reads every Markdown file a reader is sent
to (README.md and docs/), resolves each relative link and checks its anchor against the target's
headings, slugged as GitHub slugs them.
"""

from __future__ import annotations

import re
from pathlib import Path

from support.paths import REPO

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, where a link or a heading means one."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    problems = []
    for line in prose(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # code spans hold examples, not links
        for target in LINK.findall(line) + IMAGE.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}: {target}"
            if not dest.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where} (no such heading)")
    return problems


def test_slug_matches_github() -> None:
    assert slug("Rules + the local model as judge") == "rules--the-local-model-as-judge"
    assert slug("`make demo` with the local model") == "make-demo-with-the-local-model"
    assert slug("1,000 concurrent episodes over HTTP") == "1000-concurrent-episodes-over-http"
    assert slug("On a GPU, next to trl's GRPOTrainer") == "on-a-gpu-next-to-trls-grpotrainer"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](#nothing) [file](missing.md)\n", encoding="utf-8")
    assert broken_links(page, tmp_path) == [
        "page.md: #nothing (no such heading)",
        "page.md: missing.md (no such file)",
    ]


def test_every_relative_link_in_the_docs_resolves() -> None:
    problems = [problem for path in documents() for problem in broken_links(path)]
    assert not problems, "\n".join(problems)
