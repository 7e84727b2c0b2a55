"""torch's CPU threads for inference: how many, and set while a command measures.

torch's intra-op threads wait for each other at the end of every operation, spinning. On CPUs
that other processes use too (a shared machine, the batch's loader processes), a thread that
is not scheduled stalls the others, and inference slows down many times over: on 2 cores that
other work kept busy, a demo study took 4.7 s and then 55 s with 2 threads, 5.2 to 5.6 s with
1. So inference gets the CPUs nobody else is using:

- ``radcaliper batch`` (``app.batch.inference_threads``): the CPUs its loader processes leave;
- ``radcaliper measure`` (:func:`measuring_threads`): the CPUs this process may run on, less
  those that other work kept busy over the last minute (the load average), at least one and
  never more than torch would take (``OMP_NUM_THREADS``, else the CPUs).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

__all__ = ["busy_cpus", "measuring_threads", "torch_threads", "usable_cpus"]

logger = logging.getLogger(__name__)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, e.g. under taskset), else the count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def busy_cpus() -> int:
    """CPUs that other work kept busy: the one-minute load average, rounded (0 where the
    system has none). A command that measures has run for a few seconds when it asks, which
    adds less than a tenth to it."""
    try:
        return max(0, round(os.getloadavg()[0]))
    except (AttributeError, OSError):  # no load average on this system
        return 0


def measuring_threads(default: int) -> int:
    """torch's threads for one command's inference: the usable CPUs that are not busy, at
    least 1, at most ``default`` (torch's own choice: ``OMP_NUM_THREADS``, else the CPUs)."""
    return max(1, min(default, usable_cpus() - busy_cpus()))


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` inside, restored after (a test or the UI in
    the same process keeps its own). Imports torch."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    logger.debug("inference on %d thread(s) (torch's default here: %d)", threads, before)
    try:
        yield
    finally:
        torch.set_num_threads(before)
