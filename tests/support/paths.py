"""Where the repository, its bundled envs and the test fixtures are, wherever a test file sits."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENVS = REPO / "envs"
FIXTURES = REPO / "tests" / "fixtures"
BANK_DIR = FIXTURES / "bank"
ENVSYNTH_FIXTURES = FIXTURES / "envsynth"
SHARED = REPO.parent / "shared"
TAU2_RETAIL = SHARED / "tau2" / "retail"


def bundled_env_dirs() -> list[Path]:
    """The hand-written bundled envs (those whose seed ships in the repo)."""
    return sorted(
        p
        for p in (REPO / "envs").iterdir()
        if (p / "env.toml").exists() and (p / "seed.json").exists() and p.name != "tau2_retail"
    )
