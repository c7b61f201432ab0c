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
