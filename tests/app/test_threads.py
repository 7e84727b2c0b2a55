"""app.threads: how many CPUs other work keeps busy while a command starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from app.threads import CpuTimes, busy_cpus, cpu_times, measuring_threads, others_busy

_STAT = """cpu  900 0 300 8000 20 0 0 0 0 0
cpu0 500 0 100 4000 10 0 0 0 0 0
cpu1 400 0 200 4000 10 0 0 0 0 0
intr 12345
ctxt 999
"""

linux = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="counts /proc/stat")


def test_others_busy_is_the_cpus_busy_time_less_this_process_per_second() -> None:
    before = CpuTimes(wall=100.0, own=2.0, busy=50.0)
    after = CpuTimes(wall=104.0, own=4.0, busy=56.0)  # 6 s busy in 4 s, 2 of them ours
    assert others_busy(before, after) == pytest.approx(1.0)
    assert others_busy(before, CpuTimes(104.0, 8.0, 55.0)) == 0.0  # never below 0


def test_others_busy_is_unknown_without_counts_or_over_too_short_a_span() -> None:
    before = CpuTimes(wall=100.0, own=0.0, busy=50.0)
    assert others_busy(before, CpuTimes(100.2, 0.0, 50.4)) is None
    assert others_busy(before, CpuTimes(104.0, 0.0, None)) is None
    assert others_busy(CpuTimes(100.0, 0.0, None), CpuTimes(104.0, 0.0, 51.0)) is None


def test_busy_seconds_count_only_the_usable_cpus() -> None:
    from app import threads

    ticks = os.sysconf("SC_CLK_TCK")
    assert threads._busy_seconds(_STAT, {0, 1}) == pytest.approx(1200 / ticks)
    assert threads._busy_seconds(_STAT, {1}) == pytest.approx(600 / ticks)  # taskset -c 1
    assert threads._busy_seconds(_STAT, {7}) is None


@linux
def test_a_busy_neighbour_counts() -> None:
    spin = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass"
    started = cpu_times()
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(1.2)
        assert busy_cpus(started) >= 1
    finally:
        spinner.wait()


@linux
def test_measuring_threads_after_a_quiet_start_ignore_an_earlier_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0))  # a job that ended
    monkeypatch.setattr("app.threads.usable_cpus", lambda: 4)
    quiet = CpuTimes(wall=time.monotonic() - 2.0, own=0.0, busy=None)
    assert measuring_threads(4, since=quiet) == 1  # no count: the load average says busy
    now = cpu_times()
    counted = CpuTimes(now.wall - 2.0, now.own, now.busy)  # nothing ran for 2 s
    assert measuring_threads(4, since=counted) == 4
    assert measuring_threads(2, since=counted) == 2  # never more than torch's default
