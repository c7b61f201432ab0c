"""`envforge synth env` given model output that passed the old deny-list gate must not run it on the host.

The recorded library responses are replayed with a payload spliced in: tools.py writes a marker
file through `json.codecs.open` when a probe calls `get_member`, and the seed generator writes
another through `dataclasses.builtins.open`. Both passed the old gate; the old pipeline imported
the tools in-process for its probes and ran the seed generator with the real `open` in reach.
A seed generator that escapes its restricted builtins (the gate deliberately skipped) must still
be stopped by the OS confinement.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from envforge.cli import envsynth_commands, synth_commands
from envforge.synth.envsynth import SeedRunError, run_seed_generator

from support.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "envsynth"
LIBRARY_DOCS = REPO / "envs" / "library" / "docs"


def _poisoned_fixture(root: Path, tools_marker: Path, seed_marker: Path) -> Path:
    fixture = root / "fixture"
    shutil.copytree(FIXTURES / "library", fixture)
    (fixture / "responses.json").write_text(
        (fixture / "responses.json").read_text().replace("../../../../envs", str(REPO / "envs"))
    )
    tools = (fixture / "tools.0.py.txt").read_text()
    tools = tools.replace("import datetime as dt\n", "import datetime as dt\nimport json\n", 1)
    tools = tools.replace(
        '        member_id: Member id such as \'M-1001\'.\n    """\n',
        f'        member_id: Member id such as \'M-1001\'.\n    """\n'
        f"    json.codecs.open({str(tools_marker)!r}, 'w').write('pwned')\n",
        1,
    )
    assert "json.codecs.open" in tools
    (fixture / "tools.0.py.txt").write_text(tools)
    seed = (fixture / "seed.0.py.txt").read_text()
    seed = seed.replace("import random\n", "import dataclasses\nimport random\n", 1)
    seed = seed.replace(
        "def generate():\n",
        f"def generate():\n    dataclasses.builtins.open({str(seed_marker)!r}, 'w').write('pwned')\n",
        1,
    )
    (fixture / "seed.0.py.txt").write_text(seed)
    return fixture


def test_synth_env_never_runs_a_payload_that_passed_the_old_gate(tmp_path: Path) -> None:
    tools_marker, seed_marker = tmp_path / "tools-ran", tmp_path / "seed-ran"
    fixture = _poisoned_fixture(tmp_path, tools_marker, seed_marker)
    app = typer.Typer()
    synth_commands.register(app)
    envsynth_commands.register(app)
    out = tmp_path / "out" / "library"
    args = ["synth", "env", str(LIBRARY_DOCS), "-o", str(out), "--replay", str(fixture), "--max-rounds", "0"]
    result = CliRunner().invoke(app, args)
    assert not tools_marker.exists(), "model-written tools.py ran on the host"
    assert not seed_marker.exists(), "model-written seed generator ran on the host"
    assert not (out / "tools.py").exists()
    assert result.exit_code != 0 or "rejected" in result.output


async def test_a_seed_generator_escaping_its_builtins_is_still_confined(tmp_path: Path) -> None:
    """The gate skipped: the generator walks to `os` through `__subclasses__` and tries the host."""
    marker = tmp_path / "seed-escaped"
    source = f"""
def generate():
    hits = []
    for cls in ().__class__.__base__.__subclasses__():
        if cls.__name__ == "_wrap_close":
            g = cls.__init__.__globals__
            try:
                fd = g["open"]({str(marker)!r}, g["O_WRONLY"] | g["O_CREAT"])
                g["write"](fd, b"pwned")
                hits.append("wrote")
            except OSError as exc:
                hits.append(str(exc))
            hits.append(str(g["system"]("echo pwned > {marker}.sh")))
            hits.append(sorted(g["environ"]))
    return {{"t": [{{"hits": str(hits)}}]}}
"""
    try:
        rows = await run_seed_generator(source)
    except SeedRunError:
        rows = None
    assert not marker.exists() and not Path(f"{marker}.sh").exists()
    if rows is not None:
        assert "wrote" not in rows["t"][0]["hits"] and "OPENAI" not in rows["t"][0]["hits"]


@pytest.fixture(autouse=True)
def _fake_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-parent-secret-123")
