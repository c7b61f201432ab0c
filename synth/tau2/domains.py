"""`envforge import tau2`'s entry: which τ² domain a folder holds, and that domain's importer.

Retail and airline publish one `db.json` and share `importer.py`; telecom publishes two TOML DBs
and dual-control tasks, and has its own (`telecom_import.py`, which reuses the shared parts of
`importer.py`). This module sits above both so neither imports the other's caller.
"""

from __future__ import annotations

from pathlib import Path

from .importer import Tau2Import, Tau2ImportError, import_tau2_json_env
from .telecom_import import ENV_NAME as TELECOM
from .telecom_import import import_telecom_env, is_telecom_folder


def import_tau2_env(
    src_dir: Path,
    env_dir: Path,
    *,
    tasks: bool = True,
    strict_tools: bool = False,
    policy_rules: bool = False,
) -> Tau2Import:
    """Write the `tau2_retail`, `tau2_airline` or `tau2_telecom` env folder `env_dir` from a τ²-bench
    domain folder `src_dir` as published (or a folder holding domain folders, the one `env_dir` is
    named after).

    Telecom is recognised by its `db.toml` (`import_telecom_env`); retail and airline by their
    `db.json`'s top-level objects (`importer.import_tau2_json_env`, whose docstring says what is
    written, checked and opted into). Bad input is one `Tau2ImportError`, with nothing written.
    """
    src_dir, env_dir = Path(src_dir), Path(env_dir)
    for folder in (src_dir, src_dir / "telecom") if env_dir.name == TELECOM else (src_dir,):
        if is_telecom_folder(folder):
            if policy_rules:
                raise Tau2ImportError(f"--policy-rules: the {TELECOM} port declares no policy rules")
            return import_telecom_env(folder, env_dir, tasks=tasks, strict_tools=strict_tools)
    return import_tau2_json_env(
        src_dir, env_dir, tasks=tasks, strict_tools=strict_tools, policy_rules=policy_rules
    )
