"""A hostile seed generator's output, read by the pipeline's own process: whatever `generate()`
returns must end as a `SeedRunError` (a one-line reason the repair loop can show), never as an
exception that escapes `run_seed_generator` and stops the pipeline with a traceback."""

from __future__ import annotations

import pytest

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
