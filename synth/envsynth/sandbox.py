"""Run an LLM-written seed generator, after the static gate, in an OS-confined child process.

Defence in depth: the code has already passed `static_gate.check_python` with the seed allowlist;
it then runs in a separate isolated interpreter (`python -I`) under the same OS confinement as
confined env tools (bubblewrap: no network, read-only view of the interpreter only, private
scratch, no environment variables; then resource limits and the seccomp filter of
`envforge.server.confinement_inner`, applied after the source is read and before it runs), with a
time limit, a builtins table without `open`/`eval`/`exec`/`__import__` (imports go through a
guard that admits only `SEED_IMPORTS`), and its only output is the JSON of `generate()` on
stdout. A hang or a crash costs a child process, never the pipeline.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from envforge.server import confinement, confinement_inner

from .static_gate import SEED_IMPORTS

MAX_OUTPUT = 20_000_000

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
exec(compile(source, "seed_generator", "exec"), namespace)
if "generate" not in namespace:
    raise SystemExit("seed generator defines no generate()")
sys.stdout.write(json.dumps(namespace["generate"]()))
"""


class SeedRunError(RuntimeError):
    """The generator failed, timed out, or returned something that is not {table: [rows]}."""


async def run_seed_generator(source: str, *, timeout: float = 20.0) -> dict[str, list[dict[str, Any]]]:
    limits = confinement.Limits()
    allowed = json.dumps(sorted(SEED_IMPORTS))
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
        out, err = await asyncio.wait_for(proc.communicate(source.encode()), timeout)
    except TimeoutError as exc:
        proc.kill()
        await proc.wait()
        raise SeedRunError(f"seed generator ran longer than {timeout:.0f}s") from exc
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        raise SeedRunError("seed generator failed: " + " | ".join(tail))
    if len(out) > MAX_OUTPUT:
        raise SeedRunError("seed generator produced too much data")
    data = json.loads(out)
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(r, dict) for r in v)
        for k, v in data.items()
    ):
        raise SeedRunError("generate() must return {table: [row, ...]}")
    return data
