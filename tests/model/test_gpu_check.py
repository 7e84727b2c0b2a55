"""benchmarks/gpu_check.sh, the device check of a lent GPU machine, at its CPU fallback: every
step (build, LoRA training, saving, loading, measuring) at the published 3B layout with narrow
widths, ending in the one line of figures that RESULTS.md records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_the_cpu_fallback_runs_every_step_and_prints_its_figures(tmp_path: Path) -> None:
    figures = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--tiny", "--json", str(figures)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("gpu_check: ") and "3b narrow" in line
    data = json.loads(figures.read_text())
    assert data["shape"] == "3b narrow"
    assert data["train"]["steps"] == 2 and data["train"]["s_per_step"] > 0
    assert 0 < data["train"]["trainable"] < data["train"]["parameters"]
    assert data["measure"]["studies"] == 1 and data["measure"]["prompts"] > 0
    assert "gpu_tests" not in data  # no GPU tests on the CPU fallback
    assert not list(tmp_path.glob("gpu-check.*"))  # its scratch directory is removed
