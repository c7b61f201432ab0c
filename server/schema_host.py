"""A confined env's schema and seed, built in a child process the OS bounds.

A model-written `schema.sql` runs as SQLite DDL: `CREATE TABLE t AS WITH RECURSIVE ...` passes
every check on what a statement is and then computes for ever, or fills memory (1.38 GB in 15 s),
and the trigger a schema declares runs on every seed row. In this process nothing could stop it:
SQLite checks a deadline only between program steps, and memory has no bound. So a confined env's
`loader.build_seed` runs here, as `python -I schema_host.py` under the same confinement as a tool
worker (bubblewrap, seccomp, resource limits: `SCHEMA_MEMORY_MB` of address space, CPU seconds
up to the deadline), and the parent kills it at `schema_timeout_s()`. What comes back is the
serialised seed database (or the load's problems, with their file and line), which the serving
process only deserialises. Run as a script, it reads one JSON line and writes one.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import sqlite3
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

SERVER_DIR = Path(__file__).resolve().parent
SCHEMA_MEMORY_MB = 1024
"""Address space of the child: a schema and seed that need more are refused."""
DEFAULT_SCHEMA_TIMEOUT_S = 30.0
TIMEOUT_ENV = "ENVFORGE_SCHEMA_TIMEOUT_S"
_SEED = "seed"
_SCHEMA = "schema.sql"


def schema_timeout_s() -> float:
    """How long a confined env's schema and seed may take to build (`ENVFORGE_SCHEMA_TIMEOUT_S`)."""
    try:
        return max(1.0, float(os.environ.get(TIMEOUT_ENV, DEFAULT_SCHEMA_TIMEOUT_S)))
    except ValueError:
        return DEFAULT_SCHEMA_TIMEOUT_S


class _ChildFailed(Exception):
    """The child gave no answer: over its deadline, past its memory, or unable to start."""


def _run_child(request: dict[str, Any], what: str) -> dict[str, Any]:
    """Run `request` in a confined child (this file as a script); its one-line JSON answer.

    Raises `_ChildFailed` with the reason when there is none (killed at `schema_timeout_s()`, out
    of memory, confinement missing)."""
    from . import confinement

    timeout = schema_timeout_s()
    request = {
        **request,
        "limits": {
            **confinement.Limits().to_json(),
            "address_space_mb": SCHEMA_MEMORY_MB,
            "cpu_seconds_per_call": int(timeout) + 1,
            "cpu_seconds_per_worker": int(timeout) + 2,
        },
    }
    argv = [confinement.PYTHON, "-I", str(Path(__file__).resolve())]
    try:
        command = confinement.confined_command(argv, what=what)
    except confinement.ConfinementUnavailable as exc:
        raise _ChildFailed(str(exc)) from exc
    if command is not argv:
        command.append("--require-seccomp")
    try:
        done = subprocess.run(
            command,
            input=json.dumps(request).encode(),
            capture_output=True,
            timeout=timeout,
            env=confinement.child_environment(),
        )
    except subprocess.TimeoutExpired as exc:
        raise _ChildFailed(f"it took longer than {timeout:g}s and was stopped") from exc
    try:
        answer: dict[str, Any] = json.loads(done.stdout.split(b"\n", 1)[0])
        return answer
    except ValueError:
        tail = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1][:300]
        if "MemoryError" in tail or "out of memory" in tail:
            tail = f"it needed more than {SCHEMA_MEMORY_MB} MiB ({tail})"
        raise _ChildFailed(f"it failed (exit status {done.returncode}): {tail}") from None


def build_seed_bounded(root: Path, manifest: Any, schema_sql: str) -> tuple[bytes, list[Any]]:
    """`loader.build_seed` in a confined child: the seed database and its tables, or `EnvLoadError`
    (a problem of the env's files, a schema or seed over the deadline or the memory bound)."""
    from .envfiles import env_file_exists, read_env_text
    from .errors import EnvLoadError, LoadProblem
    from .state import read_tables

    seed_path = root / manifest.seed
    if not env_file_exists(root, manifest.seed):
        raise EnvLoadError([LoadProblem(seed_path, None, "seed file is missing")])
    seed = read_env_text(root, manifest.seed)  # never through a link out of the folder
    request = {
        "manifest": manifest.model_dump(mode="json"),
        "schema": schema_sql,
        "seed_suffix": seed_path.suffix,
        "seed": seed,
    }
    try:
        answer = _run_child(request, f"the schema of env {manifest.name!r}")
    except _ChildFailed as exc:
        why = f"building the schema and seed failed: {exc}"
        raise EnvLoadError([LoadProblem(root / _SCHEMA, None, why)]) from exc
    if "problems" in answer:
        names = {_SEED + seed_path.suffix: seed_path}
        raise EnvLoadError(
            [
                LoadProblem(names.get(name, root / name), line, message)
                for name, line, message in answer["problems"]
            ]
        )
    seed_db = base64.b64decode(answer["db"])
    conn = sqlite3.connect(":memory:")  # the seed's tables read off it; no statement of the env runs
    try:
        conn.deserialize(seed_db)
        return seed_db, read_tables(conn)
    finally:
        conn.close()


def build_state_bounded(env: Any, state: Any) -> bytes:
    """`Environment.database_from_state` of a confined env, in a confined child.

    A state posted on the control plane is rows a client chose, inserted under the env's
    model-written schema, whose CHECKs, generated columns and index expressions run on every row
    (and triggers, where a schema is loaded without the schema policy). Here they run under the
    child's deadline and memory bound. Raises `ValueError`, as the in-process build does: the
    state's own problem with its table and row, or the build's deadline or memory.
    """
    try:
        answer = _run_child({"schema": env.schema_sql, "state": state}, f"a state of env {env.name!r}")
    except _ChildFailed as exc:
        raise ValueError(f"building the state failed: {exc}") from exc
    except (TypeError, ValueError) as exc:  # json.dumps of a state given in-process
        raise ValueError(f"state is not JSON: {exc}") from None
    if "error" in answer:
        raise ValueError(str(answer["error"]))
    return base64.b64decode(answer["db"])


def _light_package() -> None:
    """`envforge.server` without its `__init__` (MCP, HTTP), as the tool worker has it."""
    top = types.ModuleType("envforge")
    top.__path__ = []
    sys.modules["envforge"] = top
    pkg = types.ModuleType("envforge.server")
    pkg.__path__ = [str(SERVER_DIR)]
    pkg.__package__ = "envforge.server"
    sys.modules["envforge.server"] = pkg


def _main() -> None:
    """The child: read the request, confine itself, build, answer one JSON line."""
    _light_package()
    import tempfile

    from envforge.server import confinement_inner
    from envforge.server.errors import EnvLoadError
    from envforge.server.manifest import EnvManifest

    # The loader imports this module for `build_seed_bounded`; this process is another program,
    # the loader's child, and runs the loader's `build_seed` by name.
    loader = importlib.import_module("envforge.server.loader")
    request = json.loads(sys.stdin.buffer.read())
    if "state" in request:
        _build_state(loader, request)
        return
    scratch = Path(tempfile.mkdtemp())
    seed_name = _SEED + request["seed_suffix"]
    (scratch / seed_name).write_text(request["seed"], encoding="utf-8")
    manifest = EnvManifest.model_validate({**request["manifest"], "seed": seed_name})
    confinement_inner.confine_self(request["limits"], require_seccomp="--require-seccomp" in sys.argv)
    out = sys.stdout
    try:
        seed_db, _ = loader.build_seed(scratch, manifest, request["schema"])
    except EnvLoadError as exc:
        problems = [[Path(p.file).name, p.line, p.message] for p in exc.problems]
        out.write(json.dumps({"problems": problems}) + "\n")
        return
    except (MemoryError, sqlite3.Error) as exc:
        out.write(json.dumps({"problems": [["schema.sql", None, f"building it failed: {exc}"]]}) + "\n")
        return
    out.write(json.dumps({"db": base64.b64encode(seed_db).decode()}) + "\n")


def _build_state(loader: Any, request: dict[str, Any]) -> None:
    """The child's work for `build_state_bounded`: answer the database, or the state's error."""
    from envforge.server import confinement_inner

    confinement_inner.confine_self(request["limits"], require_seccomp="--require-seccomp" in sys.argv)
    try:
        db = loader.state_database(request["schema"], Path(_SCHEMA), request["state"])
    except (ValueError, MemoryError, sqlite3.Error) as exc:  # the state's problem, or its build's
        sys.stdout.write(json.dumps({"error": str(exc) or type(exc).__name__}) + "\n")
        return
    sys.stdout.write(json.dumps({"db": base64.b64encode(db).decode()}) + "\n")


if __name__ == "__main__":
    _main()
