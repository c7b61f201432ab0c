"""The learner hands the memory an update freed back to the OS (`trainer/memory.py`).

Without it a 0.5B run at staleness 1 grew past 24 GB and was killed: glibc keeps freed blocks
in its heaps, and collection allocating from other threads' heaps beside each update grew them.
"""

from __future__ import annotations

import os
import sys
import threading

import pytest

from envforge.trainer import release_freed_memory

BLOCK = 64 * 1024  # below glibc's mmap threshold: served from a heap, not a mapping of its own


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap; /proc")
def test_holes_left_in_a_threads_heap_go_back_to_the_os() -> None:
    held: list[bytes] = []

    def allocate() -> None:  # from a worker thread, as the learner's step and the sampler run
        blocks = [b"\x01" * BLOCK for _ in range(6000)]  # ~390 MB, every page written
        held.extend(blocks[::16])  # one block in 16 stays: the heap is all holes, none at its top
        blocks.clear()

    worker = threading.Thread(target=allocate)
    worker.start()
    worker.join()
    freed_but_kept = resident_bytes()
    assert release_freed_memory()
    released = freed_but_kept - resident_bytes()
    assert released > 250 * 2**20, f"only {released / 2**20:.0f} MB of ~365 MB of holes went back"
    assert len(held) == 375
