"""Attacks through the files an env folder names: links and names that lead out of the folder.

A confined env is a folder a model (or anyone's archive) wrote. Its `policy.md` becomes the
`instructions` every MCP client receives, so a `policy.md` that is a symbolic link to a host file
sent that file to every client; a seed named `../secret.json` in `env.toml` became every
episode's state. Every file the folder names is now read only if its real path lies inside the
folder; anything else is a load error naming the file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envforge.server import EnvLoadError, load_env

from support.confined import make_confined_env
from support.paths import REPO

SECRET = "HOST-SECRET-4f1c9 the operator's private key"

CLEAN_TOOLS = '''
from envforge.server import Db, tool


@tool()
async def count_notes(db: Db) -> int:
    """How many notes there are."""
    return int(await db.fetch_value("SELECT count(*) FROM notes"))
'''


@pytest.fixture
def host_secret(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\n")
    return secret


def _env(tmp_path: Path) -> Path:
    return make_confined_env(tmp_path / "env", CLEAN_TOOLS)


def test_a_symlinked_policy_does_not_become_the_servers_instructions(
    tmp_path: Path, host_secret: Path
) -> None:
    root = _env(tmp_path)
    (root / "policy.md").unlink()
    (root / "policy.md").symlink_to(host_secret)
    with pytest.raises(EnvLoadError) as err:
        load_env(root)
    assert "policy.md" in str(err.value) and "out of the env folder" in str(err.value)
    assert SECRET not in str(err.value)


def test_inspect_and_serve_refuse_a_linked_policy_in_one_line(tmp_path: Path, host_secret: Path) -> None:
    root = _env(tmp_path)
    (root / "policy.md").unlink()
    (root / "policy.md").symlink_to(host_secret)
    proc = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "inspect", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "policy.md" in said and "Traceback" not in said and SECRET not in said


@pytest.mark.parametrize("name", ["schema.sql", "tools.py", "seed.json", "env.toml"])
def test_every_file_the_folder_names_is_refused_as_a_link_out(
    name: str, tmp_path: Path, host_secret: Path
) -> None:
    root = _env(tmp_path)
    outside = tmp_path / "outside" / name
    (root / name).rename(outside)  # the real content, moved out of the folder and linked back
    (root / name).symlink_to(outside)
    with pytest.raises(EnvLoadError, match=re.escape(name) + ": leads out of the env folder"):
        load_env(root)


def test_a_seed_named_outside_the_folder_is_refused(tmp_path: Path) -> None:
    root = _env(tmp_path)
    (tmp_path / "stolen.json").write_text(json.dumps({"notes": [{"id": 1, "body": SECRET}]}))
    manifest = (root / "env.toml").read_text().replace('seed = "seed.json"', 'seed = "../stolen.json"')
    (root / "env.toml").write_text(manifest)
    with pytest.raises(EnvLoadError, match=r"stolen\.json: leads out of the env folder"):
        load_env(root)


def test_a_link_that_stays_inside_the_folder_still_loads(tmp_path: Path) -> None:
    root = _env(tmp_path)
    (root / "docs").mkdir()
    (root / "policy.md").rename(root / "docs" / "policy.md")
    (root / "policy.md").symlink_to(Path("docs") / "policy.md")
    assert load_env(root).policy == "Payloads.\n"


def test_a_fifo_policy_is_refused_not_waited_on(tmp_path: Path) -> None:
    root = _env(tmp_path)
    (root / "policy.md").unlink()
    os.mkfifo(root / "policy.md")
    with pytest.raises(EnvLoadError, match=r"policy\.md: is not a regular file"):
        load_env(root)


@pytest.mark.parametrize("name", ["tasks.jsonl", "graph.json", "phrases.toml"])
def test_task_graph_and_phrase_files_linked_out_are_refused(
    name: str, tmp_path: Path, host_secret: Path
) -> None:
    """Tasks become the scenarios agents read, the graph and phrases shape them: none may come from
    a host file."""
    from envforge.synth import load_graph, load_phrases, load_tasks

    root = _env(tmp_path)
    env = load_env(root)
    (root / name).symlink_to(host_secret)
    read = {"tasks.jsonl": load_tasks, "graph.json": load_graph, "phrases.toml": lambda r: load_phrases(env)}
    with pytest.raises(OSError, match=re.escape(name) + ": leads out of the env folder") as err:
        read[name](root)
    assert SECRET not in str(err.value)


def test_a_tool_document_linked_out_of_a_docs_folder_is_refused(tmp_path: Path, host_secret: Path) -> None:
    from envforge.synth.envsynth import load_docs

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "tools.md").symlink_to(host_secret)
    with pytest.raises(OSError, match=r"tools\.md: leads out of the env folder"):
        load_docs(docs)


@pytest.mark.parametrize("name", ["tasks.jsonl", "graph.json", "phrases.toml"])
@pytest.mark.parametrize("dangling", [False, True])
def test_files_written_into_the_folder_replace_a_planted_link(
    name: str, dangling: bool, tmp_path: Path, host_secret: Path
) -> None:
    """`synth tasks --force`, `graph` and `synth phrases` wrote through a link at their file's name:
    a planted `tasks.jsonl -> ~/.bashrc` was overwritten (and a dangling one created its target)."""
    from envforge.synth import ToolGraph, write_graph, write_phrases, write_tasks

    root = _env(tmp_path)
    env = load_env(root)
    target = tmp_path / "outside" / "created_through_the_link" if dangling else host_secret
    (root / name).symlink_to(target)
    write = {
        "tasks.jsonl": lambda: write_tasks([], root),
        "graph.json": lambda: write_graph(ToolGraph(env=env.name, tools=[], edges=[], state_edges=[]), root),
        "phrases.toml": lambda: write_phrases(env),
    }
    write[name]()
    assert not (root / name).is_symlink() and (root / name).is_file()
    assert not target.exists() if dangling else target.read_text() == SECRET + "\n"
