"""app.heap: malloc keeps what a measuring process frees (no page faults to get it back)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# Allocates and frees blocks of 3-120 MiB, as a study's activations are, and prints the page
# faults of each round after the first.
_ROUNDS = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from app.heap import keep_freed_memory
    assert keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for round in range(4):
    before = faults()
    blocks = [np.ones(n << 20, dtype=np.uint8) for n in (3, 20, 7, 12, 120)]
    del blocks
    if round:
        print(faults() - before)
"""

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="mallopt is glibc's",
)


def _faults_per_round(mode: str) -> list[int]:
    result = subprocess.run(
        [sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, check=True
    )
    return [int(line) for line in result.stdout.split()]


@glibc
def test_freed_blocks_are_used_again_without_page_faults() -> None:
    kept = _faults_per_round("keep")
    default = _faults_per_round("default")
    # with glibc's defaults, every round faults some of its 162 MiB in again (the kernel
    # maps several pages on one fault)
    assert min(default) > 500, default
    assert max(kept) < 50, kept
