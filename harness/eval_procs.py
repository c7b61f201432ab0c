"""One evaluation spread over several processes: every core for one `envforge eval`.

One process runs every trial on one event loop, so a run with a fast agent (or an instant model)
is bound by one core. With `EvalConfig.procs` = N the parent process keeps what a run owns alone
(the lock on the run directory, the manifest, `trials.jsonl`) and starts N children
(`python -m envforge.harness.eval_child`), each the ordinary in-process harness (`run_jobs`) on its
shard of the trials:

- **Sharding** is deterministic: trial i of the plan (env, task, trial order) goes to child i mod N,
  so every child gets a like mix of envs and tasks. The trials in flight (`concurrency`) are the
  run's total, shared among the children (at least one each).
- **Logs**: a child appends each record, fsynced, to its own `RUN_DIR/shards/<i>/trials.jsonl`
  (`RunDir.append`); the parent follows those files for progress. When the children are done (or
  one dies, or the run is stopped) the parent folds the shard logs into `trials.jsonl` in plan
  order and removes them, so the run's log holds its records in the order a one-process run at
  concurrency 1 writes them, whatever finished first; each record is the same as a one-process
  run's (trial seeds come from the run seed and the trial's key, never from where it ran).
- **Failures**: a child that exits before finishing its shard makes the run fail with
  `ProcessDied`, naming the child and its unfinished trials; what every child finished is folded
  first, so `--resume` runs only the rest. A run killed before folding leaves its shard logs;
  the next `--resume` folds them before planning (`fold_shards`).
- **Stopping**: the children ignore SIGINT (Ctrl-C reaches the whole process group); the parent,
  cancelled, terminates them and folds what they finished. A child exits at once when its stdin
  (a pipe from the parent) closes, so a parent that dies, even by SIGKILL, leaves no child behind.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticSerializationError

from .records import TrialRecord, parse_trials, read_trials
from .runs import RunDir

SHARDS_DIR = "shards"
"""The run directory's folder of per-process logs while a multi-process run is going."""
POLL_S = 0.2
"""How often the parent looks for new records in the shard logs (progress only)."""
STOP_GRACE_S = 5.0
"""How long a child has to exit after SIGTERM before it is killed."""


class ProcessDied(RuntimeError):
    """A child of a multi-process run exited before finishing its trials (`--resume` runs them)."""


class ShardSpec(BaseModel):
    """What the parent tells a child on its stdin: the run, the settings and the trials to run."""

    model_config = ConfigDict(extra="forbid")

    index: int
    env_dirs: list[str]
    config: dict[str, Any]
    run_id: str
    keys: list[str]
    log_dir: str


def shard_keys(keys: Sequence[str], procs: int) -> list[list[str]]:
    """`keys` dealt round robin over `procs` shards; empty shards are left out."""
    return [shard for i in range(procs) if (shard := list(keys[i::procs]))]


def concurrency_share(total: int, shards: int, index: int) -> int:
    """Shard `index`'s part of `total` trials in flight: an even split, at least one."""
    return max(1, total // shards + (index < total % shards))


def fold_shards(rd: RunDir, order: Sequence[str]) -> set[str]:
    """Move the records of `rd`'s shard logs into its `trials.jsonl` in `order` (plan order; keys
    not in it last), remove the logs, and return the keys moved. Nothing to fold: an empty set."""
    folder = rd.path / SHARDS_DIR
    if not folder.is_dir():
        return set()
    records = [r for log in sorted(folder.glob("*/trials.jsonl")) for r in read_trials(log).records]
    rank = {key: i for i, key in enumerate(order)}
    records.sort(key=lambda r: rank.get(r.trial_key, len(rank)))
    rd.extend(records)
    shutil.rmtree(folder)
    return {r.trial_key for r in records}


class _Tail:
    """New whole lines of one shard log since the last look, as records (for progress)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new(self) -> list[TrialRecord]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return parse_trials(data[:end]).records


async def run_in_processes(
    rd: RunDir,
    config: BaseModel,
    procs: int,
    concurrency: int,
    env_dirs: Sequence[str],
    run_id: str,
    keys: Sequence[str],
    on_record: Callable[[TrialRecord], None] | None = None,
) -> None:
    """Run the trials `keys` (plan order) of `rd`'s run over `procs` child processes and fold their
    records into `rd` in that order; `ProcessDied` when a child left trials unfinished. `config` is
    the run's `EvalConfig`, whose `concurrency` (trials in flight in all) the children share."""
    shards = shard_keys(keys, procs)
    folder = rd.path / SHARDS_DIR
    shutil.rmtree(folder, ignore_errors=True)  # `_plan` folded any earlier run's logs
    specs = []
    for i, shard in enumerate(shards):
        share = concurrency_share(concurrency, len(shards), i)
        child = config.model_copy(update={"procs": 1, "concurrency": share})
        try:
            settings = child.model_dump(mode="json")
        except PydanticSerializationError as exc:
            why = f"these settings cannot be handed to another process ({exc}): leave procs at 1"
            raise ValueError(why) from None
        log_dir = folder / str(i)
        log_dir.mkdir(parents=True)
        specs.append(
            ShardSpec(
                index=i,
                env_dirs=[str(Path(d).resolve()) for d in env_dirs],
                config=settings,
                run_id=run_id,
                keys=shard,
                log_dir=str(log_dir.resolve()),
            )
        )
    tails = [_Tail(Path(s.log_dir) / "trials.jsonl") for s in specs]
    exits: list[tuple[int, int] | None] = [None] * len(specs)  # (pid, status) per child

    def report() -> None:
        if on_record is None:
            return
        for tail in tails:
            for record in tail.new():
                on_record(record)

    async def follow() -> None:
        while on_record is not None:  # nobody to tell: nothing to read until the fold
            await anyio.sleep(POLL_S)
            report()

    done: set[str] = set()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            async with anyio.create_task_group() as children:
                for i, spec in enumerate(specs):
                    children.start_soon(_run_child, spec, exits, i)
            tg.cancel_scope.cancel()
        report()
    finally:
        with anyio.CancelScope(shield=True):
            done = fold_shards(rd, keys)
    died = [
        f"eval process {i} (pid {pid}) exited with status {status} before finishing "
        f"{len(left)} trial(s): {', '.join(left[:5])}{' ...' if len(left) > 5 else ''}"
        for i, (spec, ended) in enumerate(zip(specs, exits, strict=True))
        if ended is not None
        for pid, status in [ended]
        if (left := [k for k in spec.keys if k not in done])
    ]
    if died:
        raise ProcessDied("; ".join(died) + "; what finished is in trials.jsonl: --resume runs the rest")


async def _run_child(spec: ShardSpec, exits: list[tuple[int, int] | None], i: int) -> None:
    """Start the child for `spec`, hand it its spec, and wait for it; stopped, stop it."""
    process = await anyio.open_process(
        [sys.executable, "-m", "envforge.harness.eval_child"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=None,
    )
    try:
        assert process.stdin is not None
        try:
            await process.stdin.send(spec.model_dump_json().encode() + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # it died before reading its spec: its exit status says so below
        exits[i] = (process.pid, await process.wait())
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(STOP_GRACE_S):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            await process.aclose()
