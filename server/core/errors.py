"""Errors that cross the runtime's boundary.

`ToolError` is the one an environment author raises: its message is what the agent reads.
`EnvLoadError` is what a broken env folder produces: it always names a file and, where it can,
a line, because the person fixing it needs both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class ToolError(Exception):
    """A domain error the agent should see verbatim, e.g. ``ToolError("order #W1 is not pending")``.

    Raising it rolls the call's transaction back like any other exception, but its message is
    shown to the agent in full, while unexpected exceptions are shown only as a short summary.
    """


@dataclass(frozen=True)
class LoadProblem:
    """One thing wrong with an env folder, located as precisely as the loader could."""

    file: Path
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else f"{self.file}"
        return f"{where}: {self.message}"


class InvalidArguments(Exception):
    """The call's arguments do not fit the tool, as found by a check that runs inside the call
    (a confined env's worker, which alone has the real signature): the agent's mistake, reported
    as kind `invalid` exactly like the in-process check, not as a refusal or an env bug."""


class ToolTimeout(Exception):
    """A tool call ran past its time limit and was stopped: an env error, not a refusal. Its
    message says which limit, so the agent reads why instead of a bare exception name."""


class EnvLoadError(Exception):
    """An env folder failed validation; carries every problem found, each with file and line."""

    def __init__(self, problems: list[LoadProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class EpisodeNotFound(KeyError):
    """The episode id is unknown, closed, or expired.

    `reason` is "closed" or "expired" when the store still remembers the id, so a client whose
    episode timed out is told so instead of being left to guess (it is never restarted silently).
    """

    def __init__(self, episode_id: str, reason: str | None = None) -> None:
        self.episode_id = episode_id
        self.reason = reason
        super().__init__(episode_id)

    def __str__(self) -> str:
        if self.reason == "expired":
            return f"episode {self.episode_id!r} expired after sitting idle; create a new episode"
        if self.reason == "closed":
            return f"episode {self.episode_id!r} was closed; create a new episode"
        return f"episode {self.episode_id!r} does not exist (never created, closed, or expired)"


class EpisodeLimitReached(RuntimeError):
    """The episode store is full (in all, or for the calling client) and nothing idle could expire."""


class ClientEpisodeLimitReached(EpisodeLimitReached):
    """One client holds as many open episodes as it may; others are still served."""
