"""OS confinement for model-written code: the command line that starts a confined worker.

A confined worker is `python -I <script>` run inside bubblewrap (`bwrap`): new user, network,
PID, IPC, UTS and mount namespaces; the filesystem is only the interpreter, the Python path the
isolated interpreter uses (venv, site-packages), the server's `core/` and `sandbox/` folders (the
only envforge code a worker loads: `SANDBOX_VIEW`) and a minimal `/dev`, all read-only, plus a
small private tmpfs as scratch (the only place a file can be written); all capabilities dropped,
`no_new_privs` set, no further user namespaces, every environment variable cleared, and the
worker dies with its parent.
Inside, before any model-written code runs, the worker applies `confinement_inner` (resource
limits and a seccomp filter against new processes and sockets).

This layer fails closed: when bubblewrap, user namespaces or seccomp are unavailable a confined
env does not load, unless the operator sets `ENVFORGE_ALLOW_UNCONFINED=1` (then the worker runs
as a plain child process with a cleared environment and the resource limits, and a warning is
logged). See docs/security.md for why bubblewrap and what this does not cover.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ALLOW_UNCONFINED_ENV = "ENVFORGE_ALLOW_UNCONFINED"
SERVER_DIR = Path(__file__).resolve().parents[1]
SANDBOX_VIEW = tuple(str(SERVER_DIR / part) for part in ("core", "sandbox"))
"""The envforge folders a worker sees: the core and the sandbox, which import nothing else of
envforge (tests/project/test_layering.py); the runtime, the transports and the other packages stay out."""
SCRATCH = "/tmp"
PYTHON = os.path.normpath(os.path.abspath(sys.executable))  # no `..` through folders the sandbox hides
SANDBOX_UID = 65534  # "nobody" inside the user namespace
_SYSTEM_READ_ONLY = ("/usr", "/etc/ld.so.cache", "/etc/localtime")


class ConfinementUnavailable(RuntimeError):
    """OS confinement cannot be set up here and the operator did not opt out."""


@dataclass(frozen=True)
class Limits:
    """Per-worker resource bounds, applied inside the worker before model-written code runs."""

    address_space_mb: int = 2048
    cpu_seconds_per_call: int = 20
    # The hard RLIMIT_CPU: what a worker may use in its whole life, which it cannot raise (the
    # per-call budget is the soft limit, renewed before each call, so code that lifts it stops
    # here). Past it the kernel kills the worker and the parent starts a new one on the next call.
    cpu_seconds_per_worker: int = 600
    open_files: int = 64
    file_size_mb: int = 16
    scratch_mb: int = 64
    call_timeout_s: float = 30.0

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def allow_unconfined() -> bool:
    return os.environ.get(ALLOW_UNCONFINED_ENV, "") == "1"


@functools.cache
def interpreter_paths() -> tuple[str, ...]:
    """The directories `python -I` imports from (stdlib, venv and the site-packages its .pth files add)."""
    out = subprocess.run(
        [PYTHON, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
        capture_output=True,
        text=True,
        check=True,
        env={},
    )
    paths = {p for p in json.loads(out.stdout) if p and os.path.isdir(p)}
    paths |= {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    return tuple(sorted(paths))


@functools.cache
def confinement_problem() -> str | None:
    """What is missing for OS confinement on this machine, in one line (None: nothing)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap ('bwrap') is not installed (make setup installs it)"
    try:
        import pyseccomp  # noqa: F401  (loads libseccomp through ctypes)
    except (ImportError, OSError, TypeError) as exc:
        return f"seccomp is unavailable (pyseccomp/libseccomp: {exc})"
    probe = bwrap_command([PYTHON, "-I", "-c", "pass"])
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap cannot start a sandbox: {exc}"
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"bubblewrap cannot start a sandbox (user namespaces disabled?): {tail}"
    return None


def bwrap_command(argv: list[str], *, scratch_mb: int = 64) -> list[str]:
    """`argv` wrapped in bubblewrap with only the interpreter's files visible, read-only."""
    cmd = [
        "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "LC_ALL",
        "C.UTF-8",
        "--cap-drop",
        "ALL",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        # `--dev` is a tmpfs (null, zero, urandom, ... bound in) that is writable and sized at half
        # the host's RAM: files in /dev/shm escaped the scratch's size and the address-space limit
        # and outlived the call. Read-only, the device nodes still work; /tmp is the only scratch.
        "--remount-ro",
        "/dev",
    ]
    # The scratch tmpfs goes up first: binds made after it land inside it, so an interpreter or a
    # checkout under /tmp stays visible (mounted the other way round, the tmpfs hid them).
    cmd += ["--size", str(scratch_mb * 1024 * 1024), "--tmpfs", SCRATCH]
    for path in dict.fromkeys((*_SYSTEM_READ_ONLY, *interpreter_paths())):
        inside_usr = path.startswith("/usr/")  # already visible through /usr
        if os.path.exists(path) and not inside_usr:
            cmd += ["--ro-bind", path, path]
    # The envforge folders it may load, in a read-only `server/` of their own: a bare mount point
    # there would be a folder of the root (or of the scratch, for a checkout under /tmp) that
    # model code could write into as if it were the package.
    cmd += ["--tmpfs", str(SERVER_DIR)]
    for path in SANDBOX_VIEW:
        cmd += ["--ro-bind", path, path]
    cmd += ["--remount-ro", str(SERVER_DIR)]
    cmd += ["--chdir", SCRATCH]
    cmd += ["--remount-ro", "/", "--"]  # the sandbox's own root (mount points) is not a second scratch
    return cmd + argv


def confined_command(argv: list[str], *, what: str, scratch_mb: int = 64) -> list[str]:
    """`argv` under OS confinement, or unconfined when the operator opted out; else refuse.

    Raises `ConfinementUnavailable` with one line naming what is missing.
    """
    problem = confinement_problem()
    if problem is None:
        return bwrap_command(argv, scratch_mb=scratch_mb)
    if allow_unconfined():
        log.warning("running %s WITHOUT OS confinement (%s=1): %s", what, ALLOW_UNCONFINED_ENV, problem)
        return argv
    raise ConfinementUnavailable(
        f"cannot confine {what}: {problem}; set {ALLOW_UNCONFINED_ENV}=1 to run it unconfined"
    )


def child_environment() -> dict[str, str]:
    """The environment a worker starts with: nothing of the parent's (no API keys)."""
    return {"LC_ALL": "C.UTF-8"}
