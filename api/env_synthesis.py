"""Environments from tool documents, many at once: one env per doc set, N at a time, resumable.

`synthesize_env` (synth's envsynth) builds, gates and repairs one env; a folder of doc sets wants
more around it, and a script wants it as much as `envforge synth envs` does: which children of
the folder are doc sets, which envs are already accepted (a rerun after an interruption redoes
only the rest), a bound on how many run at once, and a per-env failure to start (an unreadable
doc set, a missing recording) that stops that env and no other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from envforge.synth.envsynth import (
    DOC_SUFFIXES,
    DocsError,
    Responder,
    SynthesisReport,
    SynthSettings,
    load_doc_set,
    read_report,
    synthesize_env,
)


def _is_readme(path: Path) -> bool:
    """A README (any case, any doc suffix) beside the doc sets describes the folder; read as a
    markdown doc set it became an env named `README` whose tools were its headings."""
    return path.name.split(".")[0].lower() == "readme"


def doc_sets(docs_dir: Path) -> list[tuple[str, Path]]:
    """(env name, docs path) per child of `docs_dir`: a file, a folder of docs, or a folder with
    `docs/`; an env folder without docs (hand-written) is not one, nor is the folder's own README.
    `NotADirectoryError` when `docs_dir` is not a folder."""
    if not docs_dir.is_dir():
        raise NotADirectoryError(f"{docs_dir} is not a folder")
    found = []
    for child in sorted(docs_dir.iterdir()):
        if child.is_dir():
            if (child / "env.toml").exists() and not (child / "docs").is_dir():
                continue
            src = child / "docs" if (child / "docs").is_dir() else child
            if any(p.suffix.lower() in DOC_SUFFIXES for p in src.iterdir()):
                found.append((child.name, src))
        elif child.suffix.lower() in DOC_SUFFIXES and not _is_readme(child):
            found.append((child.stem.split(".")[0], child))
    return found


@dataclass
class EnvBatch:
    """What a batch did: every doc set, the report of each env synthesized or already accepted,
    which were skipped as accepted, and why each env that could not start did not."""

    sets: list[tuple[str, Path]]
    reports: dict[str, SynthesisReport] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    not_started: dict[str, str] = field(default_factory=dict)

    @property
    def rejected(self) -> list[str]:
        return [name for name, report in self.reports.items() if report.status != "accepted"]

    @property
    def all_accepted(self) -> bool:
        """Every doc set has an accepted env (synthesized now or before)."""
        return not self.rejected and len(self.reports) == len(self.sets)


async def synthesize_envs_async(
    docs_dir: Path,
    out: Path,
    responder: Callable[[str], Responder],
    *,
    settings: Callable[[str], SynthSettings] = lambda name: SynthSettings(name=name),
    concurrency: int = 4,
    force: bool = False,
    on_start: Callable[[int], None] | None = None,
    on_done: Callable[[str, SynthesisReport | str], None] | None = None,
) -> EnvBatch:
    """Synthesize an env per doc set of `docs_dir` (`doc_sets`) into `out/<name>`, `concurrency`
    at a time; an env already accepted there is skipped unless `force`.

    `responder(name)` answers for that env (a model, or its recorded responses) and `settings(name)`
    are its knobs; its doc set failing to load, or `responder` raising `DocsError`, `OSError` or
    `ValueError`, leaves that env out (`EnvBatch.not_started`). `on_start(todo)` gets the number to
    synthesize, `on_done(name, report)` each as it ends (for one that could not start, the reason).
    `NotADirectoryError` when `docs_dir` is not a folder."""
    batch = EnvBatch(doc_sets(docs_dir))
    todo = []
    for name, src in batch.sets:
        done = read_report(out / name)
        if done is not None and done.status == "accepted" and not force:
            batch.reports[name] = done
            batch.skipped.append(name)
        else:
            todo.append((name, src))
    if on_start is not None:
        on_start(len(todo))
    gate = asyncio.Semaphore(concurrency)

    async def one(name: str, src: Path) -> None:
        async with gate:
            try:
                docs = load_doc_set(docs_dir, src)
                answers = responder(name)
            except (DocsError, OSError, ValueError) as exc:
                batch.not_started[name] = str(exc)
                if on_done is not None:
                    on_done(name, str(exc))
                return
            batch.reports[name] = await synthesize_env(docs, out / name, answers, settings(name))
            if on_done is not None:
                on_done(name, batch.reports[name])

    # gather, not a task group: an unexpected error surfaces as itself, not wrapped in a group
    await asyncio.gather(*(one(name, src) for name, src in todo))
    return batch


def synthesize_envs(
    docs_dir: Path,
    out: Path,
    responder: Callable[[str], Responder],
    *,
    settings: Callable[[str], SynthSettings] = lambda name: SynthSettings(name=name),
    concurrency: int = 4,
    force: bool = False,
    on_start: Callable[[int], None] | None = None,
    on_done: Callable[[str, SynthesisReport | str], None] | None = None,
) -> EnvBatch:
    """`synthesize_envs_async` from synchronous code."""
    return asyncio.run(
        synthesize_envs_async(
            docs_dir,
            out,
            responder,
            settings=settings,
            concurrency=concurrency,
            force=force,
            on_start=on_start,
            on_done=on_done,
        )
    )
