"""What the SQL guard costs per tool call, in process (no transport): calls/s for reads only, and
for a write tool and a read tool in turn — the worst case of the guard's statement expiry, since
every write→read switch narrows the allowed write set and so re-prepares the read's statements.

usage: python benchmarks/bench_guard.py [--calls N] [--rounds R]
Prints the median of R rounds of N calls per pattern. Run it on two trees to compare them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
from _util import REPO

from envforge.server import Fleet, load_env

BANK = REPO / "tests" / "fixtures" / "bank"
READ = ("get_account", {"account_id": "A-1"})
WRITE = ("transfer", {"src": "A-1", "dst": "A-2", "amount": 0.01})


async def rate(pattern: list[tuple[str, dict]], calls: int) -> float:
    fleet = Fleet([load_env(BANK)])
    episode = await fleet.create_episode("bank")
    for name, args in pattern:  # warm the statement cache
        await fleet.call(episode.id, name, args)
    t0 = time.perf_counter()
    for i in range(calls):
        name, args = pattern[i % len(pattern)]
        result = await fleet.call(episode.id, name, args)
        assert not result.is_error, result.text
    elapsed = time.perf_counter() - t0
    await fleet.aclose()
    return calls / elapsed


async def main(calls: int, rounds: int) -> None:
    patterns = {"read only": [READ], "write, read in turn": [WRITE, READ]}
    for label, pattern in patterns.items():
        rates = [await rate(pattern, calls) for _ in range(rounds)]
        print(f"{label:>20}: {statistics.median(rates):8.0f} calls/s (median of {rounds})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    ns = parser.parse_args()
    anyio.run(main, ns.calls, ns.rounds)
