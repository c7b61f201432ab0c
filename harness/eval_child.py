"""One child of a multi-process evaluation (`eval_procs`): the in-process harness on one shard.

Run as `python -m envforge.harness.eval_child` by `eval_procs.run_in_processes`, never by hand: it
reads its `ShardSpec` as one JSON line on stdin, runs those trials with `run_jobs` and appends each
record to its own shard log. It ignores SIGINT (the parent stops it) and exits the moment its stdin
reaches its end, so a parent that dies, even by SIGKILL, leaves no child running.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import anyio

from .eval_procs import ShardSpec
from .orchestrator import EvalConfig, plan_jobs, quiet_collector, run_jobs, selected_envs
from .runs import RunDir

ORPHANED_EXIT = 3


def _leave_with_parent() -> None:
    """Exit the moment stdin reaches its end: the parent has gone."""

    def wait_for_end() -> None:
        # the descriptor, not `sys.stdin`: a thread blocked in a buffered reader's lock aborts the
        # interpreter's shutdown when the shard ends normally
        while os.read(0, 4096):
            continue
        os._exit(ORPHANED_EXIT)

    threading.Thread(target=wait_for_end, daemon=True).start()


async def run_shard(spec: ShardSpec) -> None:
    """Run `spec`'s trials here, `spec.config`'s concurrency at once, into its shard log."""
    config = EvalConfig.model_validate(spec.config)
    envs = selected_envs(spec.env_dirs, config)
    wanted = set(spec.keys)
    jobs = [job for job in plan_jobs(envs, config.trials) if job.key in wanted]
    with quiet_collector(config.concurrency):
        await run_jobs(envs, jobs, config, spec.run_id, RunDir(spec.log_dir).append)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops its children itself
    spec = ShardSpec.model_validate_json(sys.stdin.buffer.readline())
    _leave_with_parent()
    try:
        anyio.run(run_shard, spec)
    except Exception as exc:
        print(f"error: eval process {spec.index}: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
