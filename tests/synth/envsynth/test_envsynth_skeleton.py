"""The tools stage fills in a skeleton written from the docs (`synth/envsynth/skeleton.py`).

Asked to implement every documented tool, the packaged 0.5B model answered with the tool documents
as a JSON dict in a python block (captured on the corpus's Petstore set), three rounds running.
The skeleton gives every tool its documented surface; these tests hold it to the gates on every
real doc set of the corpus: it passes the static gate as it is (a description saying "attach"
refused it, since the gate refuses that word in any string), and it loads into a tool surface the
probes gate finds identical to the docs (names, parameters, types, required, allowed values, a
tool named `list` included).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envforge.server import check_python, load_env
from envforge.synth.envsynth import load_doc_set, schema_problems, speakable, tools_skeleton

from support.paths import REPO

CORPUS = REPO / "benchmarks" / "envsynth_corpus"
SETS = sorted(p for p in CORPUS.iterdir() if (p / "docs").is_dir())


@pytest.mark.parametrize("doc_set", SETS, ids=[s.name for s in SETS])
def test_the_skeleton_of_every_corpus_set_passes_the_static_gate_and_matches_its_docs(
    doc_set: Path, tmp_path: Path
) -> None:
    docs = load_doc_set(CORPUS, doc_set / "docs")
    skeleton = tools_skeleton(docs)
    assert check_python(skeleton) == []
    root = tmp_path / "env"
    root.mkdir()
    (root / "env.toml").write_text('name = "env"\ndescription = "d"\nversion = "0.1.0"\nseed = "seed.json"\n')
    (root / "schema.sql").write_text("CREATE TABLE t (id TEXT PRIMARY KEY);\n")
    (root / "seed.json").write_text('{"t": [{"id": "a"}]}\n')
    (root / "policy.md").write_text("# Policy\n\nBe helpful.\n")
    (root / "tools.py").write_text(skeleton)
    env = load_env(root)
    for doc in docs:
        assert speakable(doc), doc.name
        assert schema_problems(doc, env) == [], doc.name


def test_a_description_with_a_word_the_gate_refuses_is_reworded_not_refused() -> None:
    docs = load_doc_set(CORPUS, CORPUS / "openapi_batch_jobs" / "docs")
    assert any("attach" in d.description.split() for d in docs)
    skeleton = tools_skeleton(docs)
    assert check_python(skeleton) == []
    assert "If you need to add multiple uploaded files" in skeleton
