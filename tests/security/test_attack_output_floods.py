"""Attacks by model-written code on the memory of the process that reads its output.

A confined worker describing its tools at load time, and a seed generator, write to pipes this
process reads. Their output is theirs to choose: each must be read as it comes, with no more held
than the cap, and the writer killed once past it. Real workers under bubblewrap, real pipes; the
static gate is skipped (the floods below are ordinary code the OS confinement lets run).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from envforge.server import EnvLoadError, load_env
from envforge.synth.envsynth import SeedRunError, run_seed_generator

from support.confined import make_confined_env
from support.probes import peak_growth_mb_since_reset, reset_peak

FLOOD_AT_IMPORT = textwrap.dedent(
    '''
    """Tools whose import prints 300 MB (to the worker's stderr: its stdout is the protocol)."""

    from __future__ import annotations

    from envforge.server import Db, tool

    for _ in range(300):
        print("w" * 1_000_000)


    @tool
    async def count_notes(db: Db) -> int:
        """How many notes there are."""
        return await db.fetch_value("SELECT COUNT(*) FROM notes")
    '''
)


def test_a_tools_file_that_floods_its_output_at_load_is_stopped(tmp_path: Path) -> None:
    root = make_confined_env(tmp_path / "flood", FLOOD_AT_IMPORT)
    reset_peak()
    with pytest.raises(EnvLoadError) as err:
        load_env(root, static_gate=False)
    grew = peak_growth_mb_since_reset()
    assert "wrote more than" in str(err.value), str(err.value)
    assert grew < 100, f"loading the env raised peak RSS by {grew:.0f} MB"


@pytest.mark.parametrize(
    "source",
    [
        # 150 MB of JSON on stdout: what the generator returns is printed for the parent
        'def generate():\n    row = {"body": "x" * 1000000}\n    return {"notes": [row] * 150}\n',
        # 150 MB of traceback on stderr
        'def generate():\n    raise ValueError("x" * 150000000)\n',
    ],
    ids=["stdout", "stderr"],
)
async def test_a_seed_generator_that_floods_its_output_is_stopped_at_the_cap(source: str) -> None:
    reset_peak()
    with pytest.raises(SeedRunError, match="too much data"):
        await run_seed_generator(source)
    grew = peak_growth_mb_since_reset()
    assert grew < 100, f"running the generator raised peak RSS by {grew:.0f} MB"
