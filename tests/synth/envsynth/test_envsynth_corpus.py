"""The corpus of real tool documents (benchmarks/envsynth_corpus/) is usable as `synth envs` reads it.

Each doc set is a folder with `docs/` (what `synth envs` sends to the model) and `SOURCE.md`
(where it came from and under which licence). A set that envforge's own doc readers cannot read,
that documents too few or too many tools, whose tools lack a name or a description, or whose
licence is not one the corpus may carry, would make a benchmark over the corpus measure the
wrong thing (or ship material it may not ship); these tests catch each of those.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import envforge
from envforge.synth.envsynth import load_doc_set

from support.paths import REPO

CORPUS = REPO / "benchmarks" / "envsynth_corpus"
SETS = sorted(p for p in CORPUS.iterdir() if p.is_dir())
ALLOWED_LICENCES = (
    "MIT",
    "Apache-2.0",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "CC-BY-4.0",
    "CC0-1.0",
    "public domain",
)
BUNDLED_DOMAINS = (
    "retail",
    "airline",
    "flight",
    "car_rental",
    "gym",
    "library",
    "pharmacy",
    "helpdesk",
    "ticket",
)


def _format(path: Path) -> str:
    """Which of the four input formats a doc file is, by the shape `parse_data` detects."""
    if path.suffix == ".md":
        return "markdown"
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and "openapi" in data:
        return "openapi"
    if isinstance(data, dict) and ("tools" in data or "result" in data):
        return "mcp"
    return "openai"


def _index_rows() -> dict[str, list[str]]:
    """The README's table: set name -> its cells."""
    rows = {}
    for line in (CORPUS / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 6 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    return rows


def test_the_corpus_has_24_sets_in_all_four_formats_each_a_doc_set_of_synth_envs() -> None:
    assert len(SETS) >= 24
    found = dict(envforge.doc_sets(CORPUS))
    for s in SETS:
        assert found.get(s.name) == s / "docs", f"{s.name}: synth envs would not read {s.name}/docs"
    formats = {_format(f) for s in SETS for f in (s / "docs").iterdir()}
    assert formats == {"openapi", "mcp", "openai", "markdown"}


@pytest.mark.parametrize("doc_set", SETS, ids=[s.name for s in SETS])
def test_each_set_reads_into_4_to_15_named_described_tools(doc_set: Path) -> None:
    docs = load_doc_set(CORPUS, doc_set / "docs")
    assert 4 <= len(docs) <= 15, f"{doc_set.name}: {len(docs)} tools"
    for d in docs:
        assert d.name and d.description.strip(), f"{doc_set.name}: {d.name!r} has no description"
        assert d.parameters.get("type") == "object"
        # BFCL's sets once had "properties": null beside their required names (the conversion
        # dropped them): no env could ever match such docs, and no reader complained
        assert set(d.required) <= set(d.properties), (
            f"{doc_set.name}: {d.name} requires undescribed parameters"
        )
    row = _index_rows().get(doc_set.name)
    assert row is not None, f"{doc_set.name} is missing from the corpus README's table"
    assert int(row[2]) == len(docs), f"{doc_set.name}: README says {row[2]} tools, the docs {len(docs)}"


@pytest.mark.parametrize("doc_set", SETS, ids=[s.name for s in SETS])
def test_each_source_names_its_origin_commit_and_an_allowed_licence(doc_set: Path) -> None:
    source = (doc_set / "SOURCE.md").read_text(encoding="utf-8")
    licence = re.search(r"^- Licence: (.+)$", source, re.MULTILINE)
    assert licence, f"{doc_set.name}: SOURCE.md has no '- Licence:' line"
    assert any(name in licence.group(1) for name in ALLOWED_LICENCES), licence.group(1)
    origin = re.search(r"^- Source: (.+(?:\n  .+)*)", source, re.MULTILINE)
    assert origin and "https://github.com/" in origin.group(1), f"{doc_set.name}: no source repository"
    assert re.search(r"^- Trimmed: ", source, re.MULTILINE), f"{doc_set.name}: trimming not stated"
    assert not any(d in doc_set.name for d in BUNDLED_DOMAINS), f"{doc_set.name}: a bundled env's domain"


def test_the_readme_lists_no_set_that_is_not_there() -> None:
    assert set(_index_rows()) == {s.name for s in SETS}
