"""A hostile seed generator's output, read by the pipeline's own process: whatever `generate()`
returns must end as a `SeedRunError` (a one-line reason the repair loop can show), never as an
exception that escapes `run_seed_generator` and stops the pipeline with a traceback."""

from __future__ import annotations

import pytest

from envforge.server import SEED_IMPORTS, check_python
from envforge.synth.envsynth import SeedRunError, run_seed_generator

pytestmark = pytest.mark.anyio


async def test_nesting_the_host_cannot_decode_is_a_seed_error() -> None:
    # 990 levels: the confined child's encoder writes them, the host's decoder then overflows.
    src = (
        "def generate():\n    x = []\n    for _ in range(990):\n        x = [x]\n"
        "    return {'t': [{'a': x}]}\n"
    )
    with pytest.raises(SeedRunError, match="JSON"):
        await run_seed_generator(src)


async def test_non_finite_numbers_are_refused() -> None:
    # NaN and Infinity are no JSON: seed.json would be written with them and read by nothing else.
    with pytest.raises(SeedRunError, match="NaN"):
        await run_seed_generator("def generate():\n    return {'t': [{'a': float('nan')}]}\n")


async def test_a_library_call_that_imports_time_runs_and_the_generator_itself_may_not() -> None:
    # captured: the 1.5B's Petstore seed wrote `expiresAt.strftime(...)`; datetime's strftime
    # imports time, and the guard refused it three rounds running
    src = (
        "import datetime\n\n"
        "def generate():\n"
        "    start = datetime.datetime(2025, 1, 6, 9, 0)\n"
        "    return {'sessions': [{'expiresAt': start.strftime('%Y-%m-%d %H:%M:%S')}]}\n"
    )
    assert await run_seed_generator(src) == {"sessions": [{"expiresAt": "2025-01-06 09:00:00"}]}
    sleeper = "import time\n\ndef generate():\n    return {'t': [{'a': time.time()}]}\n"
    assert any("forbidden import" in str(v) for v in check_python(sleeper, imports=SEED_IMPORTS))
