"""The confinement a worker applies to itself before it runs model-written code.

Kept free of package imports: the tool worker imports it through a light `envforge.server`
package and the seed runner loads it by file path, each inside bubblewrap (`confinement`).

- Resource limits: address space, open files, size of any file written, no core dumps, and a
  CPU-seconds budget that `arm_cpu_budget` renews before each call (a busy loop gets SIGXCPU).
  The budget is the soft RLIMIT_CPU; the hard one is the worker's whole life
  (`cpu_seconds_per_worker`), so code that raises its soft limit gains at most that much, after
  which the kernel kills the process.
- A seccomp filter (libseccomp through `pyseccomp`): no fork, vfork, clone, clone3 or exec (no
  new processes or threads), no sockets, no ptrace, no namespace or mount changes. Setting it
  also sets `no_new_privs`. Denied calls fail with EPERM; the worker keeps running.
"""

from __future__ import annotations

import errno
import resource
from typing import Any

DENIED_SYSCALLS = (
    "fork",
    "vfork",
    "clone",
    "clone3",
    "execve",
    "execveat",
    "socket",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "personality",
)
MB = 1024 * 1024


def _cap(limit: int, value: int) -> None:
    _soft, hard = resource.getrlimit(limit)
    new_hard = value if hard == resource.RLIM_INFINITY else min(hard, value)
    resource.setrlimit(limit, (min(value, new_hard), new_hard))


def apply_limits(limits: dict[str, Any]) -> None:
    """Lower this process's resource limits (hard limits too: they cannot be raised again)."""
    _cap(resource.RLIMIT_AS, int(limits["address_space_mb"]) * MB)
    _cap(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    _cap(resource.RLIMIT_FSIZE, int(limits["file_size_mb"]) * MB)
    _cap(resource.RLIMIT_CORE, 0)
    _cap(resource.RLIMIT_NPROC, 1)  # belt and braces: seccomp already denies process creation
    _cap(resource.RLIMIT_CPU, int(limits["cpu_seconds_per_worker"]))
    arm_cpu_budget(int(limits["cpu_seconds_per_call"]))


def arm_cpu_budget(seconds: int) -> None:
    """Let the process use `seconds` more CPU seconds from now before SIGXCPU ends it."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = int(used.ru_utime + used.ru_stime) + 1
    _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = spent + seconds
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def cpu_seconds_left() -> float:
    """CPU seconds this process may still use before its hard limit kills it."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard == resource.RLIM_INFINITY:
        return float("inf")
    used = resource.getrusage(resource.RUSAGE_SELF)
    return hard - (used.ru_utime + used.ru_stime)


def apply_seccomp(*, required: bool) -> bool:
    """Install the syscall filter. Returns False when seccomp is unavailable and not `required`."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, TypeError):
        if required:
            raise
        return False
    flt = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            flt.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (RuntimeError, ValueError, OSError):
            continue  # a syscall this architecture does not have
    flt.load()
    return True


def confine_self(limits: dict[str, Any], *, require_seccomp: bool) -> None:
    """Limits, then the filter: after this returns the process can only compute and use its pipes."""
    apply_limits(limits)
    apply_seccomp(required=require_seccomp)
