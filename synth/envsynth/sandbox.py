"""Run an LLM-written seed generator, after the static gate, in an OS-confined child process.

Defence in depth: the code has already passed `static_gate.check_python` with the seed allowlist;
it then runs in a separate isolated interpreter (`python -I`) under the same OS confinement as
confined env tools (bubblewrap: no network, read-only view of the interpreter only, private
scratch, no environment variables; then resource limits and the seccomp filter of
`envforge.server.sandbox.confinement_inner`, applied after the source is read and before it runs), with a
time limit, a builtins table without `open`/`eval`/`exec`/`__import__` (imports go through a
guard that admits only `SEED_IMPORTS`), and its only output is the JSON of `generate()` on
stdout. A hang or a crash costs a child process, never the pipeline.

Dates, times and decimals in the rows are written as SQLite stores them (ISO text, a number), and
the `random` module's own functions are seeded: Qwen2.5-Coder-1.5B filled a skeleton with
`datetime.datetime.now() + ...` and `random.randint(1, 3)` beside the skeleton's seeded `rng`
(captured on the corpus's Petstore set), a generator that was otherwise right.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from envforge.server import SEED_IMPORTS
from envforge.server.sandbox import confinement, confinement_inner

MAX_OUTPUT = 20_000_000
"""Bytes a generator may write on stdout (its rows' JSON), and on stderr; past either it is killed."""
STDERR_TAIL_BYTES = 4096
"""How much of the end of its stderr is kept, for the reason it failed."""
_CHUNK = 1 << 16

_RUNNER = r"""
import builtins, importlib.util, json, sys
ALLOWED = set(json.loads(sys.argv[1]))
spec = importlib.util.spec_from_file_location("confinement_inner", sys.argv[2])
inner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(inner)
source = sys.stdin.read()
inner.confine_self(json.loads(sys.argv[3]), require_seccomp=sys.argv[4] == "1")
SAFE = ["abs", "all", "any", "bool", "chr", "dict", "divmod", "enumerate", "filter", "float", "format",
        "next", "iter", "frozenset", "int", "isinstance", "len", "list", "map", "max", "min", "ord", "pow",
        "range",
        "repr", "reversed", "round", "set", "sorted", "str", "sum", "tuple", "zip", "Exception",
        "ValueError", "KeyError", "IndexError", "TypeError", "StopIteration", "True", "False", "None"]
real_import = builtins.__import__
def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level or name not in ALLOWED:
        raise ImportError(f"import of {name!r} is not allowed in seed generators")
    return real_import(name, globals, locals, fromlist, level)
safe = {n: getattr(builtins, n) for n in SAFE if hasattr(builtins, n)}
safe["__import__"] = guarded_import
namespace = {"__builtins__": safe, "__name__": "seed_generator"}
import datetime, decimal, random
random.seed(0)  # the module's own functions, used in place of the skeleton's rng, same rows each run
def plain(value):
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    raise TypeError(f"a value of type {type(value).__name__} is no JSON value")
exec(compile(source, "seed_generator", "exec"), namespace)
if "generate" not in namespace:
    raise SystemExit("seed generator defines no generate()")
sys.stdout.write(json.dumps(namespace["generate"](), default=plain))
"""


class SeedRunError(RuntimeError):
    """The generator failed, timed out, or returned something that is not {table: [rows]}."""


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    try:
        stdin.write(data)
        await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):  # it exited without reading everything
        pass


async def _discard(stream: asyncio.StreamReader | None) -> None:
    """Read a killed process's pipe to its end, keeping nothing: `proc.wait()` waits for that end,
    and a reader that stopped part way (its buffer full) would never see it."""
    if stream is not None:
        while await stream.read(_CHUNK):
            pass


async def _drain(
    stream: asyncio.StreamReader, proc: asyncio.subprocess.Process, keep_tail: int | None
) -> tuple[bytes, bool]:
    """Read `stream` to its end as it is written: what was kept (all of it, or its last `keep_tail`
    bytes), and whether it passed `MAX_OUTPUT`, at which point the process is killed at once.

    The output is the generator's to choose: read whole (`communicate`) and measured afterwards,
    600 MB of it cost this process 1.2 GB; here no more than `MAX_OUTPUT` is ever held.
    """
    kept = bytearray()
    total = 0
    while chunk := await stream.read(_CHUNK):
        total += len(chunk)
        if total > MAX_OUTPUT:
            proc.kill()
            await _discard(stream)
            return b"", True
        kept += chunk
        if keep_tail is not None:
            del kept[:-keep_tail]
    return bytes(kept), False


async def _communicate(proc: asyncio.subprocess.Process, source: bytes) -> tuple[bytes, bytes, bool]:
    """`proc.communicate(source)` that holds at most `MAX_OUTPUT` of stdout and the tail of stderr;
    the third value says whether either stream passed `MAX_OUTPUT` (the process was killed)."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    _, (out, out_flood), (err, err_flood), _ = await asyncio.gather(
        _feed(proc.stdin, source),
        _drain(proc.stdout, proc, None),
        _drain(proc.stderr, proc, STDERR_TAIL_BYTES),
        proc.wait(),
    )
    return out, err, out_flood or err_flood


def _no_constant(name: str) -> Any:
    """Refuse NaN and Infinity, which `json.loads` accepts and no JSON reader after it need."""
    raise ValueError(f"{name} is no JSON value (write a number or null)")


LIBRARY_IMPORTS = frozenset({"time"})
"""Modules the standard library's own code imports when a generator calls it (`datetime`'s
`strftime` imports `time`: Qwen2.5-Coder-1.5B's Petstore seed wrote `expiresAt.strftime(...)` and
was refused the import three rounds running, captured). The runtime guard admits them; the
generator's own imports stay held to `SEED_IMPORTS` by the static gate, which runs first."""


async def run_seed_generator(source: str, *, timeout: float = 20.0) -> dict[str, list[dict[str, Any]]]:
    limits = confinement.Limits()
    allowed = json.dumps(sorted(SEED_IMPORTS | LIBRARY_IMPORTS))
    argv = [confinement.PYTHON, "-I", "-c", _RUNNER, allowed, confinement_inner.__file__]
    try:
        command = confinement.confined_command(argv, what="a seed generator", scratch_mb=limits.scratch_mb)
    except confinement.ConfinementUnavailable as exc:
        raise SeedRunError(str(exc)) from exc
    confined = "1" if command is not argv else "0"
    proc = await asyncio.create_subprocess_exec(
        *command,
        json.dumps(limits.to_json()),
        confined,
        env=confinement.child_environment(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err, flooded = await asyncio.wait_for(_communicate(proc, source.encode()), timeout)
    except TimeoutError as exc:
        proc.kill()
        await asyncio.gather(_discard(proc.stdout), _discard(proc.stderr), proc.wait())
        raise SeedRunError(f"seed generator ran longer than {timeout:.0f}s") from exc
    if flooded:
        raise SeedRunError(f"seed generator produced too much data (over {MAX_OUTPUT} bytes); it was stopped")
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        raise SeedRunError("seed generator failed: " + " | ".join(tail))
    try:
        data = json.loads(out, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # the child's JSON is its to shape: too deep, NaN
        raise SeedRunError(f"generate() returned no JSON the loader reads: {str(exc)[:200]}") from exc
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(r, dict) for r in v)
        for k, v in data.items()
    ):
        raise SeedRunError("generate() must return {table: [row, ...]}")
    return data
