"""`local` / `local/<name>` as agent, user or judge: a packaged model served for the command's run.

Each local role gets its own server (harness/local_server.py) by default, so the agent's long
policy-and-tools prefix stays in its server's prompt cache; with `shared=True` (`eval
--local-servers shared`) roles that name the same model share one server, which saves loading and
memory but lets the roles evict each other's cached prefix (both measured in docs/benchmarks.md).
The command then reaches a server like any OpenAI-compatible endpoint. Assembling and
hash-checking the weights and loading them can take a while on first use, so both show progress.
Servers stop when the block ends: normally, on an error, on Ctrl-C.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, TypeVar

from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from .common import console, fail

if TYPE_CHECKING:
    from envforge.harness import LLMConfig


def is_local(spec: str | None) -> bool:
    from envforge.harness import is_local_spec

    return is_local_spec(spec)


R = TypeVar("R", bound=str)


@contextmanager
def local_roles(
    specs: Mapping[R, str | None],
    temperatures: Mapping[R, float | None] | None = None,
    *,
    shared: bool = False,
) -> Iterator[dict[R, LLMConfig]]:
    """role -> how to reach its local server, for every role whose spec is local; exits 2 with a
    one-line error when a model or the runtime cannot be used."""
    from envforge.harness import LocalModelError, LocalServerError, model_for_spec, running_local_server

    temperatures = temperatures or {}
    configs: dict[R, LLMConfig] = {}
    with ExitStack() as servers:
        wanted = {role: spec for role, spec in specs.items() if spec is not None and is_local(spec)}
        groups: dict[str, list[R]] = {}  # server key -> the roles it serves
        for role, spec in wanted.items():
            try:
                key = model_for_spec(spec).name if shared else role
            except LocalModelError as exc:
                fail(str(exc))
            groups.setdefault(key, []).append(role)
        if wanted:
            with Progress(
                TextColumn("[bold]local[/] {task.description}"),
                BarColumn(),
                DownloadColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress:
                for roles in groups.values():
                    names, spec = ", ".join(roles), wanted[roles[0]]
                    bar = progress.add_task(f"{names}: {spec}: checking weights", total=None)

                    def on_progress(done: int, total: int, bar: TaskID = bar) -> None:
                        progress.update(bar, completed=done, total=total)

                    def on_notice(message: str, bar: TaskID = bar, names: str = names) -> None:
                        progress.update(bar, description=f"{names}: {message}")

                    try:
                        server = servers.enter_context(
                            running_local_server(spec, on_progress=on_progress, on_notice=on_notice)
                        )
                    except (LocalModelError, LocalServerError) as exc:
                        fail(str(exc))
                    for role in roles:
                        configs[role] = server.llm_config(temperatures.get(role))
                    console.print(
                        f"local {names}: {server.model.name} (pid {server.process.pid}) at {server.base_url}"
                    )
        yield configs
