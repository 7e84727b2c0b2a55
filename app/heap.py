"""glibc's malloc told to keep the memory inference frees, for the next study to use.

The model's activations are tensors of a few to 120 MiB (a find batch's pixels), allocated and
freed many times per study. glibc's malloc returns blocks this large to the kernel when they
are freed (as mappings of their own, or by trimming the top of its heap), and the next tensor
takes page faults to get them back: on 2 cores, a sixth of a demo study's time was the
kernel's (3.4 s system time of 24.5 s for 12 phantoms). Every block taken from the heap, and
the heap trimmed only when more than 1 GiB of it is free, cut that system time to a third and
a batch's measuring took 16 % less time (benchmarks/RESULTS.md). A process measuring many
studies does not grow from it: what it keeps is what its largest study needed anyway.

Process-wide and only for processes whose work is measuring: ``radcaliper measure`` and a
batch's measuring processes (or the batch process where it measures itself). Elsewhere (not
Linux with glibc) it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import platform
import sys

__all__ = ["keep_freed_memory"]

logger = logging.getLogger(__name__)

# mallopt(3) parameters
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4

TRIM_THRESHOLD = 1 << 30  # free memory at the top of the heap kept before it is returned
TOP_PAD = 64 << 20  # the heap grows in steps this large (fewer brk calls)


def keep_freed_memory() -> bool:
    """Set glibc's malloc to take every block from its heap and keep what is freed (module
    doc). True when it was set; False where the C library is not glibc or refused a value."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    settings = (
        (_M_MMAP_MAX, 0),  # no block mapped on its own (glibc maps them from 128 KiB to 32 MiB up)
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),  # set, glibc no longer adjusts it
        (_M_TOP_PAD, TOP_PAD),
    )
    done = all(mallopt(parameter, value) == 1 for parameter, value in settings)
    logger.debug("malloc takes every block from its heap and keeps what is freed: %s", done)
    return done
