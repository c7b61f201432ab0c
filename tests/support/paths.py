"""Where the repository, its bundled envs and the test fixtures are, wherever a test file sits."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENVS = REPO / "envs"
FIXTURES = REPO / "tests" / "fixtures"
BANK_DIR = FIXTURES / "bank"
DUAL_PHONE_DIR = FIXTURES / "dual_phone"
"""A dual-control env: agent tools, the user's phone tools, setup actions and env assertions."""
ENVSYNTH_FIXTURES = FIXTURES / "envsynth"
SHARED = REPO.parent / "shared"
TAU2_RETAIL = SHARED / "tau2" / "retail"


def bundled_env_dirs() -> list[Path]:
    """The envs that ship in the repository: every folder of `envs/` with an env.toml and a seed,
    except those `.gitignore` keeps out of it (what `envforge import tau2` writes there, e.g.
    `envs/tau2_retail/`: τ²'s data and τ²'s own rules, tested against τ² under tests/synth/tau2)."""
    return sorted(
        p
        for p in ENVS.iterdir()
        if (p / "env.toml").exists() and (p / "seed.json").exists() and p.name not in _ignored_envs()
    )


def _ignored_envs() -> set[str]:
    """Names of the `envs/NAME/` folders `.gitignore` lists."""
    ignored = set()
    for line in (REPO / ".gitignore").read_text().splitlines():
        line = line.strip()
        if line.startswith("envs/") and line.count("/") == 2 and line.endswith("/"):
            ignored.add(line.split("/")[1])
    return ignored
