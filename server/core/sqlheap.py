"""SQLite's own hard heap limit for the serving process, so that one SQLite step cannot fill memory.

A model-written statement can ask SQLite for gigabytes inside one program step, where no deadline
reaches it: eight distinct 16 MB JSON documents parsed in one statement took `envforge serve` from
80 to 1,458 MiB, and a `GROUP BY` over 1,000 values of 4 MB to 3.9 GB. Only an allocator limit can
refuse that while it happens, and SQLite has one: `sqlite3_hard_heap_limit64`, checked by every
SQLite allocation, which then fails with SQLITE_NOMEM (Python's `MemoryError`); SQLite undoes the
statement (or the whole transaction), frees what it took, and the connection stays usable. The
call is then refused (`confined_tools.StatementOutOfMemory`, whatever the tool did with the
error) and rolled back: nothing of it is kept.

The limit is process-wide (one counter for every connection), so it must leave room for what
legitimately lives in SQLite's heap. That is the episode databases, which the store already
counts (`episodes.reserved_bytes`: a database twice plus its room to grow, the figure the
per-client byte cap counts), plus a connection's own structures, plus the working memory of the
statements running now. So the limit follows the store: it is SQLite's use when the budget was
installed, plus what open episodes and states being built hold (`hold`/`let_go`, each episode
counted `CONNECTION_BYTES` more), plus `work_bytes` for statements (`envforge serve
--sqlite-work-mib`, or `ENVFORGE_SQLITE_WORK_MIB`: 256 MiB by default). One statement can then
take at most the working memory plus what open episodes have reserved but do not use; the attacks
above are refused at that figure, and the harness's 1,000 concurrent episodes (~130 KiB of heap
each) run far inside it. While one statement holds the working memory, another episode's
statement that needs fresh memory at that moment is refused the same way.

The library is reached through ctypes on the `_sqlite3` extension module, which links the SQLite
that Python's `sqlite3` uses (a statically linked one would be found by the same name). Only
`envforge serve` installs the budget: a limit set in a process that runs other work (tests,
synthesis) would apply to all of it.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

CONNECTION_BYTES = 256 * 1024
"""SQLite heap one episode's connection takes besides its database (schema, statement cache,
lookaside: ~130 KiB measured for the bank fixture), counted with each held episode."""


class HeapLimitUnavailable(RuntimeError):
    """The SQLite library Python uses has no hard heap limit (before 3.31) or cannot be reached."""


class _Sqlite:
    """The two C functions used, bound once."""

    def __init__(self) -> None:
        import _sqlite3

        try:
            lib = ctypes.CDLL(_sqlite3.__file__)
            self.hard_heap_limit64: Any = lib.sqlite3_hard_heap_limit64
            self.memory_used: Any = lib.sqlite3_memory_used
        except (OSError, AttributeError) as exc:
            raise HeapLimitUnavailable(f"SQLite's hard heap limit is not available here: {exc}") from exc
        self.hard_heap_limit64.restype = ctypes.c_int64
        self.hard_heap_limit64.argtypes = [ctypes.c_int64]
        self.memory_used.restype = ctypes.c_int64
        self.memory_used.argtypes = []


_lib: _Sqlite | None = None


def _sqlite() -> _Sqlite:
    global _lib
    if _lib is None:
        _lib = _Sqlite()
    return _lib


def memory_used() -> int:
    """Bytes SQLite holds now, in this process."""
    return int(_sqlite().memory_used())


def hard_heap_limit() -> int:
    """SQLite's hard heap limit now (0: none)."""
    return int(_sqlite().hard_heap_limit64(-1))


class HeapBudget:
    """The process's hard heap limit, kept at SQLite's use at install + what is held + `work_bytes`."""

    def __init__(self, work_bytes: int) -> None:
        self.work_bytes = work_bytes
        self.base = memory_used()
        self.held = 0
        self._lock = threading.Lock()
        self._apply()

    @property
    def limit(self) -> int:
        return self.base + self.held + self.work_bytes

    def hold(self, nbytes: int) -> None:
        """Room for a database about to live in SQLite's heap (an episode, a state being built)."""
        with self._lock:
            self.held += nbytes
            self._apply()

    def let_go(self, nbytes: int) -> None:
        """Its database is gone (the episode closed, the build ended)."""
        with self._lock:
            self.held = max(0, self.held - nbytes)
            self._apply()

    def _apply(self) -> None:
        _sqlite().hard_heap_limit64(self.limit)


_budget: HeapBudget | None = None


def install(work_bytes: int) -> HeapBudget:
    """Bound SQLite's heap in this whole process from now on (`envforge serve` calls it once its
    envs are loaded). Raises `HeapLimitUnavailable` when the library lacks the limit."""
    global _budget
    _budget = HeapBudget(work_bytes)
    return _budget


def installed() -> HeapBudget | None:
    """The budget in force, if `install` was called."""
    return _budget


def hold(nbytes: int) -> None:
    """`HeapBudget.hold` on the installed budget; nothing when none is."""
    if _budget is not None:
        _budget.hold(nbytes)


def let_go(nbytes: int) -> None:
    """`HeapBudget.let_go` on the installed budget; nothing when none is."""
    if _budget is not None:
        _budget.let_go(nbytes)
