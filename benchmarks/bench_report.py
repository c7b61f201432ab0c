"""How long `write_report` takes on a run directory, and how big the page is.

    python benchmarks/bench_report.py RUN_DIR [--repeat N]

A report is rendered at the end of every `eval` and by `envforge report`; for a run of many
trials its cost is reading trials.jsonl, the bootstrap CIs of the summary, the tasks and the
state diff of every failed trial. Prints the median and the fastest of N renders.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from envforge.harness import read_run, write_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    _, records = read_run(args.run_dir)
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.html"
        for _ in range(args.repeat):
            start = time.perf_counter()
            write_report(args.run_dir, out)
            times.append(time.perf_counter() - start)
        size = out.stat().st_size
    print(
        f"{len(records)} trials: median {statistics.median(times):.2f} s, best {min(times):.2f} s "
        f"over {args.repeat} renders; page {size / 1e6:.1f} MB"
    )


if __name__ == "__main__":
    main()
