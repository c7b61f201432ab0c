"""A confined env's schema and seed, built in a child process the OS bounds.

A model-written `schema.sql` runs as SQLite DDL: `CREATE TABLE t AS WITH RECURSIVE ...` passes
every check on what a statement is and then computes for ever, or fills memory (1.38 GB in 15 s),
and the trigger a schema declares runs on every seed row. In this process nothing could stop it:
SQLite checks a deadline only between program steps, and memory has no bound. So a confined env's
`seed.build_seed` (core) runs here, as `python -I schema_host.py` under the same confinement as a tool
worker (bubblewrap, seccomp, resource limits: `SCHEMA_MEMORY_MB` of address space, CPU seconds
up to the deadline), and the parent kills it at `schema_timeout_s()`. What comes back is the
serialised seed database (or the load's problems, with their file and line), which the serving
process only deserialises. Run as a script, it reads one JSON line and writes one.
"""

from __future__ import annotations

import json
import os
import selectors
import sqlite3
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

SERVER_DIR = Path(__file__).resolve().parents[1]
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


class DatabaseTooLarge(ValueError):
    """The database a state built is larger than its caller allowed; it was not sent back."""

    def __init__(self, size: int, cap: int) -> None:
        super().__init__(f"its database is {size / 2**20:.1f} MiB, over the {cap / 2**20:.1f} MiB allowed")
        self.size = size
        self.cap = cap


STATE_DATABASE_MAX_BYTES = 64 * 1024 * 1024
"""The largest database a state posted on the control plane may build: four times the largest body
the HTTP app takes (16 MiB), where an honest state's database is about twice its JSON. A schema
whose generated column stores a megabyte per row built 180 MB from 4.6 KB of state."""
HEADER_MAX_BYTES = 16 * 1024 * 1024
"""The child's answer line (its problems, or the size of the database that follows)."""
STDERR_TAIL_BYTES = 4096
_CHUNK = 1 << 20


class _Answer:
    """The child's stdout, taken as it arrives: one JSON line, then the database's raw bytes when
    the line says `db_bytes`. The bytes go straight into one buffer of their announced size (no
    base64, no JSON string, no whole-output copy: those cost 2.5-3.8x the database at peak), and
    an announced size over `cap` ends the read there."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head = bytearray()
        self.line: dict[str, Any] | None = None
        self.db: bytearray | None = None
        self.filled = 0

    @property
    def done(self) -> bool:
        return self.line is not None and (self.db is None or self.filled == len(self.db))

    def read(self, fd: int) -> bool:
        """Read what the pipe has; False at its end."""
        if self.db is not None:
            view = memoryview(self.db)[self.filled : self.filled + _CHUNK]
            got = os.readv(fd, [view])
            self.filled += got
            return got > 0
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return False
        self.head += chunk
        end = self.head.find(b"\n")
        if end < 0:
            if len(self.head) > HEADER_MAX_BYTES:
                raise _ChildFailed(f"its answer exceeded {HEADER_MAX_BYTES} bytes")
            return True
        try:
            line = json.loads(self.head[:end])
        except ValueError:
            raise _ChildFailed("its answer was not JSON") from None
        if not isinstance(line, dict):
            raise _ChildFailed("its answer was not a JSON object")
        rest = self.head[end + 1 :]
        self.head = bytearray()
        self.line = line
        size = line.get("db_bytes")
        if size is not None:
            if not isinstance(size, int) or size < 0:
                raise _ChildFailed(f"it announced a database of {size!r} bytes")
            if size > self.cap:
                raise DatabaseTooLarge(size, self.cap)
            self.db = bytearray(size)
            self.filled = min(len(rest), size)
            self.db[: self.filled] = rest[: self.filled]
        return True


def _run_child(request: dict[str, Any], what: str, max_db_bytes: int) -> tuple[dict[str, Any], bytes | None]:
    """Run `request` in a confined child (this file as a script); its JSON answer and the database
    that follows it, if any.

    `max_db_bytes` is sent to the child, which refuses a larger database without sending it, and
    bounds what is read here too: past it, `DatabaseTooLarge`. Raises `_ChildFailed` with the
    reason when there is no answer (killed at `schema_timeout_s()`, out of memory, confinement
    missing)."""
    from . import confinement

    timeout = schema_timeout_s()
    request = {
        **request,
        "max_db_bytes": max_db_bytes,
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
    data = json.dumps(request).encode()  # TypeError/ValueError: a state given in-process, not JSON
    answer = _Answer(max_db_bytes)
    err = bytearray()
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=confinement.child_environment(),
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + timeout
    written = 0
    try:
        with selectors.DefaultSelector() as selector:
            os.set_blocking(proc.stdin.fileno(), False)
            selector.register(proc.stdin, selectors.EVENT_WRITE)
            selector.register(proc.stdout, selectors.EVENT_READ)
            selector.register(proc.stderr, selectors.EVENT_READ)
            while selector.get_map() and not answer.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _ChildFailed(f"it took longer than {timeout:g}s and was stopped")
                for key, _ in selector.select(left):
                    pipe = key.fileobj
                    if pipe is proc.stdin:
                        try:
                            written += os.write(proc.stdin.fileno(), data[written : written + (1 << 16)])
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:  # it exited without reading everything
                            written = len(data)
                        if written >= len(data):
                            selector.unregister(proc.stdin)
                            proc.stdin.close()
                    elif pipe is proc.stdout:
                        if not answer.read(proc.stdout.fileno()):
                            selector.unregister(proc.stdout)
                    else:
                        chunk = os.read(proc.stderr.fileno(), 1 << 16)
                        if not chunk:
                            selector.unregister(proc.stderr)
                        err += chunk
                        del err[:-STDERR_TAIL_BYTES]
    finally:
        _kill(proc)
    if answer.line is not None and answer.done:
        db = None if answer.db is None else bytes(answer.db)
        return answer.line, db
    tail = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1][:300]
    if "MemoryError" in tail or "out of memory" in tail:
        tail = f"it needed more than {SCHEMA_MEMORY_MB} MiB ({tail})"
    raise _ChildFailed(f"it failed (exit status {proc.returncode}): {tail}")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """End the child (it has answered, or must stop) and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None and not pipe.closed:
            pipe.close()


def build_seed_bounded(root: Path, manifest: Any, schema_sql: str) -> tuple[bytes, list[Any]]:
    """`seed.build_seed` in a confined child: the seed database and its tables, or `EnvLoadError`
    (a problem of the env's files, a schema or seed over the deadline or the memory bound)."""
    from ..core.envfiles import env_file_exists, read_env_text
    from ..core.errors import EnvLoadError, LoadProblem
    from ..core.state import read_tables

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
        what = f"the schema of env {manifest.name!r}"
        answer, seed_db = _run_child(request, what, SCHEMA_MEMORY_MB * 2**20)
    except (_ChildFailed, DatabaseTooLarge) as exc:
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
    if seed_db is None:
        why = "building the schema and seed gave no database"
        raise EnvLoadError([LoadProblem(root / _SCHEMA, None, why)])
    conn = sqlite3.connect(":memory:")  # the seed's tables read off it; no statement of the env runs
    try:
        conn.deserialize(seed_db)
        return seed_db, read_tables(conn)
    finally:
        conn.close()


def build_state_bounded(env: Any, state: Any, max_db_bytes: int = STATE_DATABASE_MAX_BYTES) -> bytes:
    """`Environment.database_from_state` of a confined env, in a confined child.

    A state posted on the control plane is rows a client chose, inserted under the env's
    model-written schema, whose CHECKs, generated columns and index expressions run on every row
    (and triggers, where a schema is loaded without the schema policy). Here they run under the
    child's deadline and memory bound. Raises `ValueError`, as the in-process build does: the
    state's own problem with its table and row, or the build's deadline or memory; and
    `DatabaseTooLarge` when the database is over `max_db_bytes` (the child sends none then: a few
    kilobytes of state can build hundreds of megabytes, which are not this process's to hold).
    """
    try:
        answer, db = _run_child(
            {"schema": env.schema_sql, "state": state}, f"a state of env {env.name!r}", max_db_bytes
        )
    except DatabaseTooLarge:
        raise
    except _ChildFailed as exc:
        raise ValueError(f"building the state failed: {exc}") from exc
    except (TypeError, ValueError) as exc:  # json.dumps of a state given in-process
        raise ValueError(f"state is not JSON: {exc}") from None
    if "error" in answer:
        raise ValueError(str(answer["error"]))
    if "too_large" in answer:
        raise DatabaseTooLarge(int(answer["too_large"]), max_db_bytes)
    if db is None:
        raise ValueError("building the state failed: it gave no database")
    return db


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

    from envforge.server.core import seed
    from envforge.server.core.errors import EnvLoadError
    from envforge.server.core.manifest import EnvManifest
    from envforge.server.sandbox import confinement_inner

    request = json.loads(sys.stdin.buffer.read())
    if "state" in request:
        _build_state(seed, request)
        return
    scratch = Path(tempfile.mkdtemp())
    seed_name = _SEED + request["seed_suffix"]
    (scratch / seed_name).write_text(request["seed"], encoding="utf-8")
    manifest = EnvManifest.model_validate({**request["manifest"], "seed": seed_name})
    confinement_inner.confine_self(request["limits"], require_seccomp="--require-seccomp" in sys.argv)
    try:
        seed_db, _ = seed.build_seed(scratch, manifest, request["schema"])
    except EnvLoadError as exc:
        _answer({"problems": [[Path(p.file).name, p.line, p.message] for p in exc.problems]})
        return
    except (MemoryError, sqlite3.Error) as exc:
        _answer({"problems": [["schema.sql", None, f"building it failed: {exc}"]]})
        return
    _answer_database(seed_db, int(request["max_db_bytes"]))


def _build_state(seed: types.ModuleType, request: dict[str, Any]) -> None:
    """The child's work for `build_state_bounded`: answer the database, or the state's error."""
    from envforge.server.sandbox import confinement_inner

    confinement_inner.confine_self(request["limits"], require_seccomp="--require-seccomp" in sys.argv)
    try:
        db = seed.state_database(request["schema"], Path(_SCHEMA), request["state"])
    except (ValueError, MemoryError, sqlite3.Error) as exc:  # the state's problem, or its build's
        _answer({"error": str(exc) or type(exc).__name__})
        return
    _answer_database(db, int(request["max_db_bytes"]))


def _answer(line: dict[str, Any], db: bytes = b"") -> None:
    """The child's answer: one JSON line, then `db`'s raw bytes when the line announces them."""
    out = sys.stdout.buffer
    out.write(json.dumps(line).encode() + b"\n")
    out.write(db)
    out.flush()


def _answer_database(db: bytes, cap: int) -> None:
    """The built database, or only its size when it is over `cap` (the parent would refuse it)."""
    if len(db) > cap:
        _answer({"too_large": len(db)})
    else:
        _answer({"db_bytes": len(db)}, db)


if __name__ == "__main__":
    _main()
