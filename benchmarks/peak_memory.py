"""Peak resident memory growth over a block, sampled every millisecond from /proc (a process's
lifetime peak is usually its model loading's, so the growth is measured from the block's start).
Shared by the benchmarks; Linux only."""

from __future__ import annotations

import contextlib
import resource
import threading
import time
from collections.abc import Iterator


def rss_mib() -> float:
    """The process's resident set size now, in MiB."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


@contextlib.contextmanager
def peak_growth() -> Iterator[dict[str, float]]:
    """``with peak_growth() as peak: ...``; afterwards ``peak["mib"]`` is the largest RSS
    growth seen during the block."""
    result = {"mib": 0.0}
    before = peak = rss_mib()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mib())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield result
    finally:
        done.set()
        sampler.join()
        result["mib"] = max(peak, rss_mib()) - before
