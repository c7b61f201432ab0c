"""Env synthesis over a folder of doc sets, from Python as `envforge synth envs` runs it: which
children are doc sets, and an env that cannot start stops itself and no other."""

from __future__ import annotations

from pathlib import Path

import pytest

import envforge
from envforge.synth.envsynth import Responder, SynthesisReport

from support.paths import REPO

LIBRARY_DOCS = REPO / "envs" / "library" / "docs"


def _doc_folder(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    (docs / "plain").mkdir(parents=True)
    (docs / "plain" / "tools.json").write_text((LIBRARY_DOCS / "tools.openai.json").read_text())
    (docs / "nested" / "docs").mkdir(parents=True)
    (docs / "nested" / "docs" / "tools.json").write_text((LIBRARY_DOCS / "tools.openai.json").read_text())
    (docs / "handwritten").mkdir()
    (docs / "handwritten" / "env.toml").write_text("")  # an env folder without docs: not a doc set
    (docs / "single.tools.json").write_text((LIBRARY_DOCS / "tools.openai.json").read_text())
    return docs


def test_doc_sets_are_files_folders_and_folders_with_docs_but_not_env_folders(tmp_path: Path) -> None:
    docs = _doc_folder(tmp_path)
    assert envforge.doc_sets(docs) == [
        ("nested", docs / "nested" / "docs"),
        ("plain", docs / "plain"),
        ("single", docs / "single.tools.json"),
    ]
    with pytest.raises(NotADirectoryError, match="is not a folder"):
        envforge.doc_sets(docs / "single.tools.json")


def test_the_folders_own_readme_is_no_doc_set_but_another_markdown_file_is(tmp_path: Path) -> None:
    # `synth envs benchmarks/envsynth_corpus` took the corpus README for a doc set: an env named
    # README, asked of the model from the README's headings
    docs = _doc_folder(tmp_path)
    (docs / "README.md").write_text("# Doc sets\n\n## library\n\nWhere each set came from.\n")
    (docs / "readme.txt").write_text("notes\n")
    gym = (REPO / "envs" / "gym" / "docs" / "tools.md").read_text()
    (docs / "vet_clinic.md").write_text(gym)
    assert [name for name, _ in envforge.doc_sets(docs)] == ["nested", "plain", "single", "vet_clinic"]
    # the corpus folder as it is: its sets, and no README among them
    corpus = REPO / "benchmarks" / "envsynth_corpus"
    assert "README" not in dict(envforge.doc_sets(corpus))


def test_an_env_that_cannot_start_is_reported_and_stops_no_other(tmp_path: Path) -> None:
    docs = _doc_folder(tmp_path)
    ended: list[tuple[str, SynthesisReport | str]] = []

    def no_recording(name: str) -> Responder:
        raise ValueError(f"no recorded responses for {name}")

    batch = envforge.synthesize_envs(
        docs, tmp_path / "out", no_recording, on_done=lambda name, r: ended.append((name, r))
    )
    assert sorted(batch.not_started) == ["nested", "plain", "single"]
    assert sorted(name for name, _ in ended) == ["nested", "plain", "single"]
    assert all(isinstance(r, str) and "no recorded responses" in r for _, r in ended)
    assert batch.reports == {} and not batch.all_accepted
