"""Attacks through the tool documents `synth env` and `synth envs` read from folders.

Tool documents go to the model: whatever a folder of them holds leaves the host. Every file of a
`docs/` folder was checked to lie inside that folder's real path, but the folder itself was not
checked against the doc set holding it: under `synth envs DIR`, a child whose `docs` is a link to
a host folder (`~/.config/gcloud`) had that folder's `.json` files read as tool documents and
sent to the model, and so did a child that is itself such a link. And a tool document was opened
with a plain read, so a FIFO named `tools.md` held `synth env` for ever. Now a doc set's folder
must lie inside DOCS_DIR (its env is refused with one line naming it, the others go on) and every
file of a docs folder is read as an env file is: inside the folder, without following a link,
and only if it is a regular file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import REPO

SECRET = "HOST-SECRET-9d2e7"
DOC = f"## leak_{SECRET.replace('-', '_').lower()}\n\n{SECRET}: the operator's credentials.\n"
CLEAN_DOC = "## get_item\n\nRead one item.\n\nParameters:\n- item_id (string, required): The item.\n"


def _envforge(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": "sk-fake", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run(
        [sys.executable, "-m", "envforge.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


@pytest.fixture
def host_folder(tmp_path: Path) -> Path:
    """A host folder of JSON and markdown files that must never reach a model."""
    folder = tmp_path / "home" / ".config" / "service"
    folder.mkdir(parents=True)
    (folder / "credentials.md").write_text(DOC)
    return folder


@pytest.mark.parametrize("link", ["docs", "child"])
def test_synth_envs_does_not_read_a_doc_set_linked_out_of_its_folder(
    link: str, tmp_path: Path, host_folder: Path
) -> None:
    from envforge.synth.envsynth import DocsError, load_doc_set

    sets = tmp_path / "sets"
    sets.mkdir()
    if link == "docs":
        (sets / "leaky").mkdir()
        (sets / "leaky" / "docs").symlink_to(host_folder, target_is_directory=True)
        src = sets / "leaky" / "docs"
    else:
        (sets / "leaky").symlink_to(host_folder, target_is_directory=True)
        src = sets / "leaky"
    with pytest.raises((DocsError, OSError), match="leads out of") as err:
        load_doc_set(sets, src)
    assert SECRET not in str(err.value)
    (sets / "fine").mkdir()
    (sets / "fine" / "tools.md").write_text(CLEAN_DOC)
    assert [d.name for d in load_doc_set(sets, sets / "fine")] == ["get_item"]


def test_synth_envs_refuses_the_linked_doc_set_in_one_line_and_goes_on(
    tmp_path: Path, host_folder: Path
) -> None:
    """Through the CLI: the linked set is refused by name; the clean one is still attempted."""
    sets = tmp_path / "sets"
    (sets / "leaky").mkdir(parents=True)
    (sets / "leaky" / "docs").symlink_to(host_folder, target_is_directory=True)
    (sets / "fine").mkdir()
    (sets / "fine" / "tools.md").write_text(CLEAN_DOC)
    replays = tmp_path / "replays"
    replays.mkdir()
    done = _envforge("synth", "envs", str(sets), "--out", str(tmp_path / "out"), "--replay-dir", str(replays))
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "leaky: cannot start" in out and "leads out of" in out, out
    assert "fine: cannot start" in out, out  # reached: its replay is missing, not its docs refused
    assert "Traceback" not in out and SECRET not in out, out


def test_a_fifo_tool_document_does_not_hold_synth_env(tmp_path: Path) -> None:
    """Before: `synth env docs/` opened the FIFO and waited for a writer for ever."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(CLEAN_DOC)
    os.mkfifo(docs / "tools.md")
    try:
        done = _envforge(
            "synth", "env", str(docs), "--out", str(tmp_path / "env_out"), "--model", "openai/x", timeout=40
        )
    except subprocess.TimeoutExpired:
        pytest.fail("synth env was still reading the FIFO after 40 s")
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "cannot read docs" in out and "tools.md" in out and "not a regular file" in out, out
    assert "Traceback" not in out, out
