"""`local` / `local/<name>` as agent, user or judge: a packaged model served for the command's run.

Each local role gets its own server (harness/local_server.py); the command then reaches it like
any OpenAI-compatible endpoint. Assembling and hash-checking the weights and loading them can
take a while on first use, so both show progress. Servers stop when the block ends: normally,
on an error, on Ctrl-C.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from .common import console, fail

if TYPE_CHECKING:
    from envforge.harness import LLMConfig


def is_local(spec: str | None) -> bool:
    from envforge.harness import is_local_spec

    return is_local_spec(spec)


@contextmanager
def local_roles(
    specs: dict[str, str | None], temperatures: dict[str, float | None] | None = None
) -> Iterator[dict[str, LLMConfig]]:
    """role -> how to reach its local server, for every role whose spec is local; exits 2 with a
    one-line error when a model or the runtime cannot be used."""
    from envforge.harness import LocalModelError, LocalServerError, running_local_server

    temperatures = temperatures or {}
    configs: dict[str, LLMConfig] = {}
    with ExitStack() as servers:
        wanted = {role: spec for role, spec in specs.items() if spec is not None and is_local(spec)}
        if wanted:
            with Progress(
                TextColumn("[bold]local[/] {task.description}"),
                BarColumn(),
                DownloadColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress:
                for role, spec in wanted.items():
                    bar = progress.add_task(f"{role}: {spec}: checking weights", total=None)

                    def on_progress(done: int, total: int, bar: object = bar) -> None:
                        progress.update(bar, completed=done, total=total)  # type: ignore[arg-type]

                    def on_notice(message: str, bar: object = bar, role: str = role) -> None:
                        progress.update(bar, description=f"{role}: {message}")  # type: ignore[arg-type]

                    try:
                        server = servers.enter_context(
                            running_local_server(spec, on_progress=on_progress, on_notice=on_notice)
                        )
                    except (LocalModelError, LocalServerError) as exc:
                        fail(str(exc))
                    configs[role] = server.llm_config(temperatures.get(role))
                    console.print(
                        f"local {role}: {server.model.name} (pid {server.process.pid}) at {server.base_url}"
                    )
        yield configs
