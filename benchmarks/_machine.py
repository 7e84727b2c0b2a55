"""What the benchmark scripts print about the machine they ran on."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def machine() -> str:
    """CPU model, logical CPUs, torch threads, OS."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{model}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}, "
        f"{platform.system()} {platform.release()}"
    )


def load() -> str:
    """The 1 / 5 / 15-minute load averages."""
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"
