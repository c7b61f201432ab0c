"""τ²-bench's retail folder as a checkout publishes it: imported, served, evaluated by split.

A τ²-bench checkout's retail folder holds db.json, tasks.json, policy.md and split_tasks.json, and
nothing else (no tools.json: the port's own tools define the schema). Those four files are copied
from shared/tau2/retail (beside the repository, never copied into it) into a temporary folder and
imported once with the real CLI; the env it writes is served by a real `envforge serve` process,
and `envforge eval --split/--limit` runs the oracle against it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from envforge.cli.main import app
from envforge.harness import RunDir
from envforge.synth import load_tasks

from support.paths import REPO, TAU2_RETAIL
from support.serving import envforge_serve
from support.skips import TAU2_NO_DATA, tau2_data_missing

pytestmark = pytest.mark.skipif(tau2_data_missing("split_tasks.json"), reason=TAU2_NO_DATA)

CHECKOUT_FILES = ("db.json", "tasks.json", "policy.md", "split_tasks.json")
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _split(name: str) -> list[str]:
    """The split's task ids in tasks.json order (the order the import keeps)."""
    members = set(json.loads((TAU2_RETAIL / "split_tasks.json").read_text(encoding="utf-8"))[name])
    order = [str(t["id"]) for t in json.loads((TAU2_RETAIL / "tasks.json").read_text(encoding="utf-8"))]
    return [i for i in order if i in members]


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`envforge import tau2` of the four checkout files, into a folder that did not exist."""
    root = tmp_path_factory.mktemp("checkout")
    src = root / "tau2-bench" / "data" / "tau2" / "domains" / "retail"
    src.mkdir(parents=True)
    for name in CHECKOUT_FILES:
        shutil.copy(TAU2_RETAIL / name, src / name)
    out = root / "envs" / "tau2_retail"
    proc = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "import", "tau2", str(src), "-o", str(out)],
        capture_output=True,
        text=True,
        env={**ENV, "COLUMNS": "200"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr  # no tools.json: nothing to cross-check, nothing to warn about
    assert "wrote env.toml, schema.sql, tools.py, seed.json, policy.md, tasks.jsonl" in proc.stderr
    return out


@pytest.fixture
def served(env_dir: Path) -> Iterator[str]:
    with envforge_serve([str(env_dir)]) as url:
        yield url


def test_checkout_folder_imports_into_a_complete_env(env_dir: Path) -> None:
    assert sorted(p.name for p in env_dir.iterdir()) == sorted(
        ["env.toml", "schema.sql", "tools.py", "seed.json", "policy.md", "tasks.jsonl"]
    )
    for name in ("env.toml", "schema.sql", "tools.py"):  # the port's code, as the package ships it
        assert (env_dir / name).read_bytes() == (REPO / "synth" / "tau2" / "tau2_retail" / name).read_bytes()
    tasks = load_tasks(env_dir)
    assert len(tasks) == 114
    assert [t.id for t in tasks if "test" in t.split] == _split("test")


def test_served_checkout_import_gives_the_oracle_full_reward(
    env_dir: Path, served: str, tmp_path: Path
) -> None:
    tools = httpx.get(served + "/control/envs", timeout=10).json()["envs"][0]["tools"]
    assert len(tools) == 16 and "transfer_to_human_agents" in tools
    out = tmp_path / "run"
    args = ["eval", str(env_dir), "--server", served, "--agent", "oracle", "--split", "test", "--limit", "3"]
    proc = subprocess.run(
        [sys.executable, "-m", "envforge.cli", *args, "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    manifest = RunDir(out).read_manifest()
    assert manifest is not None and manifest.task_ids == {"tau2_retail": _split("test")[:3]}
    records = RunDir(out).read_records()
    assert sorted(r.task_id for r in records) == sorted(_split("test")[:3])
    assert [(r.status, r.reward) for r in records] == [("completed", 1.0)] * 3
    assert json.loads(proc.stdout)["overall"]["mean_reward"] == 1.0


def _eval(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["eval", *args])
    return result.exit_code, " ".join(result.output.split())


def test_eval_split_and_limit_select_tasks(env_dir: Path, tmp_path: Path) -> None:
    train = _split("train")
    code, output = _eval(
        str(env_dir), "--agent", "noop", "--split", "train", "--limit", "2", "--out", str(tmp_path / "a")
    )
    assert code == 0, output
    assert RunDir(tmp_path / "a").read_manifest().task_ids == {"tau2_retail": train[:2]}  # type: ignore[union-attr]
    # --limit alone: the first N of the file; after --tasks: the first N of those, in file order.
    code, output = _eval(str(env_dir), "--agent", "noop", "--limit", "1", "--out", str(tmp_path / "b"))
    assert code == 0, output
    assert RunDir(tmp_path / "b").read_manifest().task_ids == {"tau2_retail": ["0"]}  # type: ignore[union-attr]
    ids = f"{train[5]},{train[3]},{train[4]}"
    code, output = _eval(
        str(env_dir), "--agent", "noop", "--tasks", ids, "--limit", "2", "--out", str(tmp_path / "c")
    )
    assert code == 0, output
    assert RunDir(tmp_path / "c").read_manifest().task_ids == {"tau2_retail": train[3:5]}  # type: ignore[union-attr]


def test_eval_selection_errors_are_one_line(env_dir: Path, tmp_path: Path) -> None:
    gym = REPO / "envs" / "gym"
    cases = [
        ((str(env_dir), "--split", "dev"), "error: split 'dev': tau2_retail has no such split (its splits: base, test, train)"),  # noqa: E501
        ((str(gym), "--split", "train"), "error: split 'train': gym's tasks have no splits"),
        ((str(env_dir), str(gym), "--split", "test"), "error: split 'test': gym's tasks have no splits"),
        ((str(env_dir), "--limit", "0"), "error: --limit must be at least 1, not 0"),
        ((str(env_dir), "--limit", "-3"), "error: --limit must be at least 1, not -3"),
        ((str(env_dir), "--split", "test", "--tasks", _split("train")[0]), "error: split 'test': none of"),
    ]  # fmt: skip
    for i, (args, message) in enumerate(cases):
        out = tmp_path / f"run{i}"
        code, output = _eval(*args, "--agent", "noop", "--out", str(out))
        assert code == 2 and output.startswith(message), (args, output)
        assert "Traceback" not in output and not (out / "manifest.json").exists()
