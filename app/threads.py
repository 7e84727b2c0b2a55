"""torch's CPU threads for inference: how many, and set while a command measures.

torch's intra-op threads wait for each other at the end of every operation, spinning. On CPUs
that other processes use too (a shared machine, the batch's loader processes), a thread that
is not scheduled stalls the others, and inference slows down many times over: on 2 cores that
other work kept busy, a demo study took 4.7 s and then 55 s with 2 threads, 5.2 to 5.6 s with
1. So inference gets the CPUs nobody else is using:

- ``radcaliper batch`` (``app.batch.inference_threads``): the CPUs its loader processes leave;
- ``radcaliper measure`` (:func:`measuring_threads`): the CPUs this process may run on, less
  those that other work kept busy while the command read the study and loaded the model (a few
  seconds: from ``/proc/stat``, less this process's own time; the one-minute load average where
  there is no such count), at least one and never more than torch would take
  (``OMP_NUM_THREADS``, else the CPUs).

The load average alone lags: a minute after a job ends it still counts most of a CPU, so a
second ``measure`` straight after a first ran on one thread (2.65 s of inference instead of
about 1.6 s on 2 idle cores).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = [
    "CpuTimes",
    "busy_cpus",
    "command_started",
    "cpu_times",
    "measuring_threads",
    "others_busy",
    "started_at",
    "torch_threads",
    "usable_cpus",
]

_SHORTEST_S = 0.5  # a shorter span says too little about other work: use the load average

logger = logging.getLogger(__name__)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, e.g. under taskset), else the count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class CpuTimes:
    """CPU seconds at one moment: this process's own (user and system, all its threads) and
    the usable CPUs' busy time since boot (not idle, not waiting on I/O; None without
    ``/proc/stat``)."""

    wall: float  # time.monotonic()
    own: float
    busy: float | None


def _busy_seconds(stat: str, cpus: set[int]) -> float | None:
    """Busy seconds of ``cpus`` from ``/proc/stat``'s text (None when none of them is there)."""
    ticks = os.sysconf("SC_CLK_TCK")  # there is a /proc/stat: a POSIX system
    total, found = 0, False
    for line in stat.splitlines():
        name, _, fields = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        # user nice system idle iowait irq softirq steal (guest time is in user already)
        values = [int(v) for v in fields.split()[:8]]
        total += sum(values) - values[3] - values[4]
        found = True
    return total / ticks if found else None


def cpu_times() -> CpuTimes:
    """Now's :class:`CpuTimes` (for :func:`busy_cpus` to compare with later)."""
    times = os.times()
    try:
        with open("/proc/stat") as stat:
            cpus = os.sched_getaffinity(0)
            busy = _busy_seconds(stat.read(), cpus)
    except (OSError, AttributeError, ValueError):  # not Linux
        busy = None
    return CpuTimes(time.monotonic(), times.user + times.system, busy)


_started: ContextVar[CpuTimes | None] = ContextVar("radcaliper_command_started", default=None)


def command_started() -> CpuTimes:
    """The sample a command counts other work from: now, or what :func:`started_at` set (a
    resident: a second or two before the command came, when its own process was idle)."""
    return _started.get() or cpu_times()


@contextlib.contextmanager
def started_at(sample: CpuTimes) -> Iterator[None]:
    """:func:`command_started` is ``sample`` inside."""
    token = _started.set(sample)
    try:
        yield
    finally:
        _started.reset(token)


def others_busy(before: CpuTimes, after: CpuTimes) -> float | None:
    """CPUs (a fraction) that other processes kept busy between two samples: the usable CPUs'
    busy time less this process's own, per second. None without counts or under 0.5 s apart."""
    span = after.wall - before.wall
    if before.busy is None or after.busy is None or span < _SHORTEST_S:
        return None
    others = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, others / span)


def busy_cpus(since: CpuTimes | None = None) -> int:
    """CPUs that other work kept busy, rounded: since ``since`` (:func:`others_busy`) where that
    can be counted, else the one-minute load average (0 where the system has none). A command
    that measures has run for a few seconds when it asks, which adds less than a tenth to the
    load average."""
    if since is not None:
        others = others_busy(since, cpu_times())
        if others is not None:
            logger.debug(
                "other work kept %.2f CPUs busy in the last %.1f s",
                others,
                time.monotonic() - since.wall,
            )
            return round(others)
    try:
        return max(0, round(os.getloadavg()[0]))
    except (AttributeError, OSError):  # no load average on this system
        return 0


def measuring_threads(default: int, since: CpuTimes | None = None) -> int:
    """torch's threads for one command's inference: the usable CPUs that other work did not
    keep busy (since ``since``, the command's start, where that can be counted: module doc), at
    least 1, at most ``default`` (torch's own choice: ``OMP_NUM_THREADS``, else the CPUs)."""
    return max(1, min(default, usable_cpus() - busy_cpus(since)))


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
