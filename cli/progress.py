"""Progress that speaks on a terminal and off one.

A rich bar redraws itself in place, which only a terminal can show: with stderr sent to a file or
a pipe (a CI log, `make demo > log`, `nohup`) rich draws nothing until the end, and an eleven-minute
`synth env` or a thirteen-minute `train` looked hung. `work_progress` keeps the bar on a terminal
and, off one, gives a `Progress` that prints a plain line to stderr per unit of work (trial, step,
round: at most one every `every_s` seconds, the last always) and, while a unit takes long, a
line every `heartbeat_s` seconds saying it is still working.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console
from rich.progress import Progress, ProgressColumn, TaskID

EVERY_S = 2.0
"""Fewest seconds between two progress lines off a terminal (the last unit is always shown)."""
HEARTBEAT_S = 15.0
"""Most seconds without a line off a terminal while work goes on."""


def work_progress(
    *columns: str | ProgressColumn,
    console: Console,
    label: str,
    transient: bool = False,
    disable: bool = False,
    every_s: float = EVERY_S,
    heartbeat_s: float = HEARTBEAT_S,
    in_bytes: bool = False,
) -> Progress:
    """A rich bar of `columns` on a terminal; off one, a `PlainProgress` whose lines start `label`
    (`in_bytes`: its counts are bytes, shown in MiB)."""
    if console.is_terminal:
        return Progress(*columns, console=console, transient=transient, disable=disable)
    return PlainProgress(
        console, label, hidden=disable, every_s=every_s, heartbeat_s=heartbeat_s, in_bytes=in_bytes
    )


class PlainProgress(Progress):
    """`Progress` as plain lines: `label description done/total info (elapsed)`, one per unit of
    work at most every `every_s` seconds (a new description, a new stage, always gets its line)
    and a heartbeat every `heartbeat_s` seconds of silence.

    It is a `Progress` (rich's own bookkeeping of tasks, totals and fields) with the live display
    off, so the commands' hooks drive it exactly as they drive a bar."""

    def __init__(
        self,
        console: Console,
        label: str,
        *,
        hidden: bool = False,
        every_s: float,
        heartbeat_s: float,
        in_bytes: bool = False,
    ) -> None:
        super().__init__(console=console, disable=True)
        self.label, self.hidden, self.in_bytes = label, hidden, in_bytes
        self.every_s, self.heartbeat_s = every_s, heartbeat_s
        self.started = self.last_line = time.monotonic()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.beat: threading.Thread | None = None

    def start(self) -> None:
        self.started = self.last_line = time.monotonic()
        if not self.hidden and self.beat is None:
            self.beat = threading.Thread(target=self._heartbeat, name="progress-heartbeat", daemon=True)
            self.beat.start()

    def stop(self) -> None:
        self.done.set()
        if self.beat is not None:
            self.beat.join()
            self.beat = None

    def update(
        self,
        task_id: TaskID,
        *,
        total: float | None = None,
        completed: float | None = None,
        advance: float | None = None,
        description: str | None = None,
        visible: bool | None = None,
        refresh: bool = False,
        **fields: Any,
    ) -> None:
        before = self._task(task_id)
        super().update(
            task_id,
            total=total,
            completed=completed,
            advance=advance,
            description=description,
            visible=visible,
            refresh=refresh,
            **fields,
        )
        after = self._task(task_id)
        if after[2] != before[2] and not self.hidden:  # a new stage of the work: always worth a line
            self._say(task_id, time.monotonic())
        else:
            self._maybe_say(task_id, moved=after[0] > before[0])

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._maybe_say(task_id, moved=True)

    def _task(self, task_id: TaskID) -> tuple[float, float | None, str]:
        task = self._tasks[task_id]
        return task.completed, task.total, task.description

    def _maybe_say(self, task_id: TaskID, *, moved: bool) -> None:
        if not moved or self.hidden:
            return
        completed, total, _ = self._task(task_id)
        now = time.monotonic()
        if now - self.last_line >= self.every_s or (total is not None and completed >= total):
            self._say(task_id, now)

    def _say(self, task_id: TaskID, now: float, suffix: str = "") -> None:
        with self.lock:
            self.last_line = now
            task = self._tasks[task_id]
            done = self._count(task.completed)
            if task.total is not None:
                done += "/" + self._count(task.total)
            if task.total is None and not task.completed:
                done = ""  # no count yet: a stage, not a tally
            info = task.fields.get("info", "")
            what = "" if task.description == self.label else task.description
            parts = [self.label, what, done, str(info), suffix, f"({now - self.started:.0f}s)"]
            self.console.print(" ".join(p for p in parts if p), markup=False, highlight=False, soft_wrap=True)

    def _count(self, n: float) -> str:
        return f"{n / (1024 * 1024):.0f} MiB" if self.in_bytes else f"{n:g}"

    def _heartbeat(self) -> None:
        while not self.done.wait(1.0):
            now = time.monotonic()
            if now - self.last_line < self.heartbeat_s or not self._tasks:
                continue
            unfinished = [t.id for t in self._tasks.values() if t.total is None or t.completed < t.total]
            if unfinished:
                self._say(unfinished[-1], now, "still working")
