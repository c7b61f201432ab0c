"""Reading a file an env folder names, without following a link out of the folder.

An env folder is data that may come from a model or from anyone's archive, and what it names is
read into places that leave the host: `policy.md` becomes the `instructions` every MCP client
receives, `schema.sql` and the seed become every episode's state, `tasks.jsonl` and
`phrases.toml` become scenarios shown to agents. A `policy.md` that is a symbolic link to
`~/.ssh/id_ed25519` (or a seed named `../../etc/passwd` in `env.toml`) would send a host file
to every client. So every such file is resolved (`os.path.realpath`, links at any depth
followed) and must lie inside the env folder's own real path; it is then opened with
`O_NOFOLLOW`, so a last component swapped for a link after the check is refused by the kernel,
and it must be a regular file (a FIFO would block the load forever). A link that stays inside
the folder is fine. Anything else is an `EnvLoadError` naming the file.

Writing is the mirror image: a file envforge writes into a folder (`tasks.jsonl`, `graph.json`,
`phrases.toml`) is written to a new file beside it and renamed over the name, so a link planted
at that name is replaced, never written through (`synth tasks` on a folder whose `tasks.jsonl`
links to `~/.bashrc` would have overwritten it, and created it through a dangling link).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from .errors import EnvLoadError, LoadProblem


class EnvFileError(EnvLoadError, OSError):
    """A file an env folder names that may not be read: outside the folder, missing, or not a
    regular file. Both a load error (file and reason) and an `OSError`, so callers that handle a
    file they cannot read (a report skipping a missing tasks file) handle this one too."""


def _outside(root: Path, name: str, why: str) -> EnvFileError:
    return EnvFileError([LoadProblem(root / name, None, why)])


def env_file(root: str | Path, name: str) -> Path:
    """The real path of `root/name`, checked to lie inside `root`'s real path.

    Raises `EnvFileError` when the name or a link leads out of the folder, or to nothing."""
    root = Path(root)
    if not name or os.path.isabs(name) or "\x00" in name:
        raise _outside(root, name, f"{name!r} is not a file name inside the env folder")
    base = os.path.realpath(root)
    real = os.path.realpath(os.path.join(base, name))
    if os.path.commonpath([base, real]) != base or real == base:
        raise _outside(root, name, "leads out of the env folder (a link or '..'); refused")
    if not os.path.exists(real):
        raise _outside(root, name, "is missing (or a link to nothing)")
    return Path(real)


def env_file_exists(root: str | Path, name: str) -> bool:
    """Whether the folder holds something under `name` (a link out counts: reading it is refused)."""
    return os.path.lexists(os.path.join(root, name))


def read_env_bytes(root: str | Path, name: str) -> bytes:
    """The bytes of `root/name`, read only if it is a regular file inside the folder."""
    real = env_file(root, name)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _outside(
            Path(root), name, f"cannot be opened without following a link: {exc.strerror}"
        ) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _outside(Path(root), name, "is not a regular file")
        return f.read()


def read_env_text(root: str | Path, name: str) -> str:
    """The UTF-8 text of `root/name` (see `read_env_bytes`)."""
    return read_env_bytes(root, name).decode("utf-8")


def replace_file(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` by a temporary file in the same folder renamed over it: a
    link at `path` is replaced by the file, never followed, and a reader never sees half of it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            os.fchmod(f.fileno(), 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
