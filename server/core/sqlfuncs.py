"""SQLite functions that do superlinear work inside one VM step, replaced by linear ones.

A confined call's deadline reaches its statements through SQLite's progress handler, which runs
only between VM steps. A few built-ins compare every character of one argument with every one of
another inside a single step: `trim(X, Y)` (and `ltrim`, `rtrim`) checks each character of X
against all of Y, `instr(X, Y)` and `replace(X, Y, Z)` try the whole of Y at every position of X.
With texts of a few hundred thousand characters (16 MiB are allowed) one call held the server for
a minute, out of any deadline's reach. `install` replaces them on a connection with versions
that give SQLite's answers in linear time (Python's string search, a character class), so no
step of a model-written statement costs more than its inputs' length.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import threading
from collections.abc import Callable

SqlValue = str | bytes | int | float | None

_CAST = sqlite3.connect(":memory:", check_same_thread=False)
_CAST_LOCK = threading.Lock()


def _text(value: object) -> str:
    """`value` as SQLite's text functions read it: a number as SQLite writes it (`1.0e+20`,
    `Inf`), a blob's bytes as they are (bytes that are no UTF-8 kept apart, so a text made of
    them fails on its way out, as SQLite's does)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, int):
        return str(value)
    with _CAST_LOCK:  # SQLite's own number-to-text conversion, not Python's repr
        return str(_CAST.execute("SELECT CAST(? AS TEXT)", (value,)).fetchone()[0])


def _trimmer(left: bool, right: bool) -> Callable[[SqlValue, SqlValue], str | None]:
    """`trim(X, Y)` (or `ltrim`, `rtrim`): the characters of Y stripped from X's ends, Y's
    distinct characters made one character class."""

    def trim(value: SqlValue, chars: SqlValue) -> str | None:
        if value is None or chars is None:
            return None
        text = _text(value)
        strip = _text(chars).split("\0", 1)[0]  # SQLite reads the characters only up to a NUL
        unique = frozenset(strip)
        if not unique:
            return text
        if len(unique) <= MAX_CLASS_CHARACTERS:
            run = _class_run("".join(sorted(unique)))
            start = _run_length(run, text) if left else 0
            end = len(text) - (_run_length(run, text[::-1][: len(text) - start]) if right else 0)
            return text[start:end]
        start, end = 0, len(text)  # a large set: one lookup per stripped character, nothing kept
        while left and start < end and text[start] in unique:
            start += 1
        while right and end > start and text[end - 1] in unique:
            end -= 1
        return text[start:end]

    return trim


MAX_CLASS_CHARACTERS = 256
"""Sets of characters to strip up to this size become a compiled, remembered character class (a
pattern of a million characters took 2.5 s to compile and 20 MiB to keep); larger ones are
looked up character by character."""


def _run_length(run: re.Pattern[str], text: str) -> int:
    found = run.match(text)
    return found.end() if found is not None else 0


@functools.lru_cache(maxsize=256)
def _class_run(unique: str) -> re.Pattern[str]:
    """A run of any of `unique`'s characters (a class: one lookup per character of the text)."""
    return re.compile("[" + "".join(re.escape(c) for c in unique) + "]*")


def _instr(haystack: SqlValue, needle: SqlValue) -> int | None:
    """`instr(X, Y)`: where Y first starts in X, from 1 (0: nowhere); bytes when both are blobs."""
    if haystack is None or needle is None:
        return None
    if isinstance(haystack, bytes) and isinstance(needle, bytes):
        return haystack.find(needle) + 1
    return _text(haystack).find(_text(needle)) + 1


def _utf8_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


class ResultTooBig(ValueError):
    """A replacement's result would pass the connection's `SQLITE_LIMIT_LENGTH`."""


def _replacer(conn: sqlite3.Connection) -> Callable[[SqlValue, SqlValue, SqlValue], SqlValue]:
    """`replace(X, Y, Z)` on `conn`: every Y in X made Z; X itself when Y is empty or starts with
    a NUL (SQLite looks at Y's first character only), a blob X as its text. The result's length
    is worked out before it is built: SQLite's own stops at the length limit as it grows, and
    building first would let `replace(1,500 x 'a', 'a', 1 MiB)` take 1.5 GiB of this process."""

    def replace(value: SqlValue, old: SqlValue, new: SqlValue) -> SqlValue:
        if value is None or old is None:
            return None
        pattern = _text(old)
        if not pattern or pattern[0] == "\0":
            return _text(value) if isinstance(value, bytes) else value
        if new is None:
            return None
        text, replacement = _text(value), _text(new)
        found = text.count(pattern)
        grows = len(replacement.encode("utf-8", "surrogateescape")) - len(
            pattern.encode("utf-8", "surrogateescape")
        )
        size = len(text.encode("utf-8", "surrogateescape")) + found * grows
        if size > conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH):
            raise ResultTooBig(f"replace() would make {size} bytes")
        return text.replace(pattern, replacement)

    return replace


def install(conn: sqlite3.Connection) -> None:
    """Put the linear versions in place of SQLite's on `conn`."""
    for name, left, right in (("trim", True, True), ("ltrim", True, False), ("rtrim", False, True)):
        conn.create_function(name, 2, _trimmer(left, right), deterministic=True)
    conn.create_function("instr", 2, _instr, deterministic=True)
    conn.create_function("replace", 3, _replacer(conn), deterministic=True)
