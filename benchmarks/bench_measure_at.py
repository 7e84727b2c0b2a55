"""Benchmark: seconds per click of ``radcaliper measure PATH --at X,Y,Z`` through a running
resident (issue 43; target <= 0.5 s per click).

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_measure_at.py [--commands 10] [--cores 0,1] [--data DIR]
                                          [--no-store] [--json FILE]

Set-up, not timed: three phantom studies (``ingestion.phantoms.write_phantoms``, seed 4343) in
``--data`` (default: a temporary folder, removed after), ``RADCALIPER_DATA_DIR`` pointing into
it, and ``radcaliper resident`` with the demo model (pinned to ``--cores`` with ``taskset``
when given), which measures one command before the timing (its first inference warms up
torch; not counted).

Timed: ``--commands`` commands with one click each, then as many with five clicks each,
interleaved; each command is ``radcaliper -v measure STUDY --json --at ... [--no-store]`` as a
fresh client process (``radcaliper`` next to this interpreter, else ``python -m app.cli``),
wall time from spawn to exit: what a user or a script waits for. The clicks are the true
centres of the studies' lesions and vessels, each moved by up to 2 mm (seeded), so no two
commands click the same points (each stores a run of its own, unless ``--no-store``). Each
command's output is checked (exit 0, "measured by the resident", one answer per click).

Reported: seconds per click (a command's time over its clicks), median and p90, for one and for
five clicks per command; the added time of one more click ((five-click command - one-click
command) / 4, medians); the share of clicks answered with a finding. Timings on a machine that
others use are noisy: the load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import load, machine

from ingestion.phantoms import write_phantoms

REPOSITORY = Path(__file__).resolve().parents[1]
STUDIES = 3
SEED = 4343
TARGET_S = 0.5  # seconds per click
JITTER_MM = 2.0


def _radcaliper() -> list[str]:
    script = Path(sys.executable).parent / "radcaliper"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "app.cli"]


def _pinned(command: list[str], cores: str | None) -> list[str]:
    return ["taskset", "-c", cores, *command] if cores else command


def _centres(study: Path) -> list[tuple[float, float, float]]:
    """The true centres of a phantom study's findings (LPS mm)."""
    truth = json.loads((study / "truth.json").read_text())
    return [tuple(float(c) for c in f["center_lps_mm"]) for f in truth["findings"]]


def _start_resident(env: dict[str, str], cores: str | None, log: Path) -> subprocess.Popen[bytes]:
    """``radcaliper resident`` for the data dir of ``env``, once it listens."""
    with log.open("wb") as sink:
        process = subprocess.Popen(
            _pinned([*_radcaliper(), "resident"], cores),
            cwd=REPOSITORY,
            env=env,
            stdout=sink,
            stderr=sink,
        )
    deadline = time.monotonic() + 300
    while "listening at" not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"the resident did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.2)
    return process


class _Clicks:
    """The commands' clicks: true finding centres in turn, each moved by up to 2 mm."""

    def __init__(self, studies: list[Path]) -> None:
        self.studies = studies
        self.centres = [_centres(study) for study in studies]
        self.rng = np.random.default_rng(SEED)
        self.turn = 0

    def next(self, k: int) -> tuple[Path, list[str]]:
        """A study and ``k`` clicks in it, as ``--at`` values."""
        index = self.turn % len(self.studies)
        self.turn += 1
        centres = self.centres[index]
        points = []
        for j in range(k):
            centre = np.asarray(centres[(self.turn + j) % len(centres)])
            moved = centre + self.rng.uniform(-JITTER_MM, JITTER_MM, size=3)
            points.append(",".join(f"{v:.3f}" for v in moved))
        return self.studies[index] / "dicom", points


def _command(
    study: Path, points: list[str], store: bool, env: dict[str, str], cores: str | None
) -> tuple[float, dict[str, Any]]:
    """One ``measure --at`` client: its wall time and its JSON, checked."""
    at = [part for point in points for part in ("--at", point)]
    argv = [*_radcaliper(), "-v", "measure", str(study), "--json", *at]
    if not store:
        argv.append("--no-store")
    began = time.perf_counter()
    done = subprocess.run(
        _pinned(argv, cores), cwd=REPOSITORY, env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - began
    if done.returncode != 0 or "measured by the resident" not in done.stderr:
        raise SystemExit(f"a command failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    data = json.loads(done.stdout)
    if len(data["clicks"]) != len(points):
        raise SystemExit(f"{len(points)} clicks, {len(data['clicks'])} answers")
    return seconds, data


def _p90(values: list[float]) -> float:
    return float(np.percentile(values, 90))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=10, help="commands of each size")
    parser.add_argument("--cores", default=None, help="taskset CPU list, e.g. 0,1")
    parser.add_argument("--data", type=Path, default=None, help="set-up folder (default: temp)")
    parser.add_argument("--no-store", action="store_true", help="measure without storing")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    if args.commands < 1:
        raise SystemExit("--commands must be at least 1")
    data = args.data or Path(tempfile.mkdtemp(prefix="bench-measure-at-"))
    data.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADCALIPER_")}
    env["RADCALIPER_DATA_DIR"] = str(data / "radcaliper")
    command = "python benchmarks/bench_measure_at.py " + " ".join(sys.argv[1:])
    print(f"- command: `{command.strip()}`")
    print(f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}")
    print(f"- machine: {machine()}")
    print(f"- load average at start: {load()}")
    store = not args.no_store
    resident = None
    times: dict[int, list[float]] = {1: [], 5: []}
    found = clicked = 0
    try:
        phantoms = data / "phantoms"
        studies = sorted(phantoms.iterdir()) if phantoms.is_dir() else []
        if len(studies) < STUDIES:
            studies = write_phantoms(phantoms, n=STUDIES, seed=SEED)
        resident = _start_resident(env, args.cores, data / "resident.log")
        clicks = _Clicks(list(studies))
        _command(*clicks.next(1), store, env, args.cores)  # warm-up: not counted
        for _ in range(args.commands):
            for k in (1, 5):
                seconds, answer = _command(*clicks.next(k), store, env, args.cores)
                times[k].append(seconds)
                clicked += k
                found += sum(c["finding_id"] is not None for c in answer["clicks"])
    finally:
        if resident is not None:
            resident.terminate()
            resident.wait(timeout=60)
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    print(f"- load average at end: {load()}")
    print(
        f"- {args.commands} commands of 1 and of 5 clicks, interleaved, through a resident; "
        f"cores: {args.cores or 'all'}; {'stored' if store else '--no-store'}; "
        f"{found} of {clicked} clicks answered with a finding\n"
    )
    print("| clicks per command | command, median | s per click, median | p90 | target |")
    print("|---|---|---|---|---|")
    for k, runs in times.items():
        per_click = [t / k for t in runs]
        median = statistics.median(per_click)
        verdict = "MET" if median <= TARGET_S else "MISSED"
        print(
            f"| {k} | {statistics.median(runs):.2f} s | {median:.2f} s | "
            f"{_p90(per_click):.2f} s | {TARGET_S:g} s ({verdict}) |"
        )
    added = (statistics.median(times[5]) - statistics.median(times[1])) / 4
    print(f"\nOne more click in a command adds {added:.2f} s (medians: (5 clicks - 1 click) / 4).")
    if args.json is not None:
        rows = {"times_s": {str(k): v for k, v in times.items()}, "added_click_s": added}
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
