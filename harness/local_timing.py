"""How long a local-model trial takes on this machine, remembered, so long work says its cost first.

On two shared CPU cores one trial of the packaged 0.5B model takes minutes (a 161 s single trial
in the demo), and the closing advice of `make demo` once suggested 40 such trials with no hint of
the hours it would take. The seconds per trial of each local run are kept beside the models'
cache (`$ENVFORGE_CACHE`, default `~/.cache/envforge`, in `trial_seconds.json`, keyed by the
roles' models), and the next run prints `trials x seconds per trial / concurrency` before it
starts; a first run prints the estimate once its first trial is done.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from .local_models import cache_dir

TIMING_FILE = "trial_seconds.json"


def timing_path() -> Path:
    return cache_dir().parent / TIMING_FILE


def remembered_seconds(key: str) -> float | None:
    """Mean seconds per trial of the last run with these local models; None when none ran here."""
    try:
        value = json.loads(timing_path().read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) and value > 0 else None


def remember_seconds(key: str, seconds: float) -> None:
    """Keep `seconds` per trial for `key`; a cache that cannot be written is left as it is."""
    path = timing_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        if not isinstance(data, dict):
            data = {}
        data[key] = round(seconds, 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    except (OSError, ValueError):
        return


def duration(seconds: float) -> str:
    """`45 s`, `12 min`, `2 h 05 min`: a span as a person reads it."""
    if seconds < 300:
        return f"{math.ceil(seconds)} s"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def estimate(trials: int, seconds_per_trial: float, *, measured: str) -> str:
    """`40 trials x 161 s per trial (measured ...): about 1 h 48 min`."""
    return (
        f"{trials} trial{'s' if trials != 1 else ''} x {duration(seconds_per_trial)} per trial ({measured}): "
        f"about {duration(trials * seconds_per_trial)}"
    )


class TrialClock:
    """An eval run's cost in time, said before it is paid: `on_start` gives the estimate from the
    last run with the same local models (or says one comes after the first trial), `on_trial` the
    estimate from the first trial when nothing was remembered, and `finish` remembers this run's
    wall seconds per trial (wall time over trials: concurrency and contention included)."""

    def __init__(self, key: str, concurrency: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.key, self.concurrency, self.clock = key, max(concurrency, 1), clock
        self.started = clock()
        self.todo = 0
        self.done = 0
        self.known = remembered_seconds(key)

    duration = staticmethod(duration)
    estimate = staticmethod(estimate)
    remember = staticmethod(remember_seconds)

    @staticmethod
    def key_of(local_specs: list[str], max_turns: int) -> str:
        """What a measurement is of: the local models by role, and the turn limit (a trial of 3
        turns and one of 30 are not the same work)."""
        return f"{','.join(sorted(local_specs))}|max_turns={max_turns}"

    def on_start(self, total: int, done: int) -> str | None:
        self.started, self.todo = self.clock(), total - done
        if self.todo <= 0:
            return None
        if self.known is not None:
            return "estimate: " + estimate(self.todo, self.known, measured="measured here on the last run")
        return f"estimate: {self.todo} trials of a local model; a figure follows the first trial"

    def on_trial(self) -> str | None:
        self.done += 1
        if self.done != 1 or self.known is not None or self.todo <= 1:
            return None
        per_trial = (self.clock() - self.started) / self.concurrency  # the others ran beside it
        return "estimate: " + estimate(self.todo - 1, per_trial, measured="from the first trial") + " more"

    def finish(self) -> None:
        if self.done:
            remember_seconds(self.key, (self.clock() - self.started) / self.done)
