"""`local` / `local/<name>` as agent, user or judge: a packaged model served for the command's run.

`envforge.local_model_servers` starts the servers (one per role, or with `eval --local-servers
shared` one per model: both measured in docs/benchmarks.md) and stops them when the block ends;
this draws their start. Assembling and hash-checking the weights and loading them can take a while
on first use, so both show progress, and a model or runtime that cannot be used is one error line.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from .common import console, fail
from .progress import work_progress

if TYPE_CHECKING:
    from envforge import LocalServerWatch
    from envforge.harness import LLMConfig, LocalServer


def is_local(spec: str | None) -> bool:
    from envforge.harness import is_local_spec

    return is_local_spec(spec)


R = TypeVar("R", bound=str)


@dataclass(frozen=True)
class ServerBar:
    """One local server's start, drawn as a bar (weights checked in bytes, then each step)."""

    display: Progress
    bar: TaskID
    names: str

    def progress(self, done: int, total: int) -> None:
        self.display.update(self.bar, completed=done, total=total)

    def notice(self, message: str) -> None:
        self.display.update(self.bar, description=f"{self.names}: {message}")

    def ready(self, server: LocalServer) -> None:
        where = f"(pid {server.process.pid}) at {server.base_url}"
        console.print(f"local {self.names}: {server.model.name} {where}")


@contextmanager
def local_roles(
    specs: Mapping[R, str | None],
    temperatures: Mapping[R, float | None] | None = None,
    *,
    shared: bool = False,
) -> Iterator[dict[R, LLMConfig]]:
    """role -> how to reach its local server (`envforge.local_model_servers`), for every role whose
    spec is local; exits 2 with a one-line error when a model or the runtime cannot be used."""
    import envforge
    from envforge.harness import LocalModelError, LocalServerError

    if not any(spec is not None and is_local(spec) for spec in specs.values()):
        yield {}
        return
    servers = ExitStack()
    columns = (TextColumn("[bold]local[/] {task.description}"), BarColumn(), DownloadColumn())
    bars = work_progress(
        *columns, TimeElapsedColumn(), console=console, label="local", transient=True, in_bytes=True
    )
    with bars as progress:

        def watch(roles: Sequence[R], spec: str) -> LocalServerWatch:
            names = ", ".join(roles)
            bar = progress.add_task(f"{names}: {spec}: checking weights", total=None)
            return ServerBar(progress, bar, names)

        try:
            configs = servers.enter_context(
                envforge.local_model_servers(specs, temperatures, shared=shared, watch=watch)
            )
        except (LocalModelError, LocalServerError) as exc:
            fail(str(exc))
    with servers:  # the bar is gone (one live display at a time: the command may draw its own)
        yield configs
