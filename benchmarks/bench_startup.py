"""Benchmark: start-up of the command line, each command as a whole process (issue 26).

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_startup.py [--repeats 5] [--cores 0,1] [--data DIR] [--no-phases]
                                       [--json FILE]

Set-up, not timed: ``radcaliper phantoms DATA/phantoms --n 4`` writes four phantom studies,
``radcaliper batch`` stores them in a fresh SQLite database (``DATA/store.sqlite3``) with the
demo model. ``--data`` defaults to a temporary folder (removed after); ``RADCALIPER_DATA_DIR``
points into it, so nothing outside it is touched.

Timed, each command a fresh process (``radcaliper`` next to this interpreter, else ``python -m
app.cli``; pinned to ``--cores`` with ``taskset`` when given), the commands interleaved,
``--repeats`` runs each; wall time from spawn to exit, min and median:

- ``radcaliper --help`` (target 0.3 s);
- ``radcaliper measure --help``;
- ``radcaliper audit measurements --db DATA/store.sqlite3``: the four studies' measurements as a
  table (target 0.8 s);
- ``radcaliper measure DATA/phantoms/phantom_0000/dicom --no-store --json --no-resident``: the
  whole command in its own process (target 4 s);
- ``radcaliper -v measure DATA/phantoms/phantom_0000/dicom --no-store --json`` with
  ``radcaliper resident`` running (started after the set-up, pinned like the commands, loaded
  before the first run; the client must say "measured by the resident"): the command as a user
  waits for it when a resident keeps the libraries and the model loaded (target 4 s);
- ``radcaliper batch DATA/phantoms --db ... --work ...`` again: every study is stored already,
  nothing is loaded or measured (target 1.5 s).

Each run's exit status and output are checked (the re-run must report "0 stored, 4 already
stored"), so a broken command is not timed as a fast one.

Phases of ``measure`` (unless ``--no-phases``): one more process per repeat does what
``radcaliper measure --no-store`` does, step by step, with ``time.perf_counter`` between the
steps (imports in the order the command makes them: the command line, settings, the DICOM
reader, torch, transformers, the model's modules, the checkpoint, MONAI, then inference on the
threads ``app.threads.measuring_threads`` gives); the table gives each step's median.
Timings on a machine that others use are noisy: the load average is printed at the start and
the end, and the minimum is the figure to compare.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import load, machine

REPOSITORY = Path(__file__).resolve().parents[1]
STUDIES = 4

# One process doing what `radcaliper measure STUDY --no-store --json` does, a step at a time;
# prints {"step": seconds, ...} as JSON on its last line.
_PHASES = """
import json, sys, time
from pathlib import Path

steps = {}
last = time.perf_counter()


def step(name):
    global last
    now = time.perf_counter()
    steps[name] = now - last
    last = now


import app.cli
from app.threads import cpu_times
started = cpu_times()
step("import app.cli (typer, rich)")
from app.settings import Settings
Settings()
step("settings (pydantic-settings)")
from ingestion.load import load_path
step("import the DICOM reader (pydicom, numpy)")
volume = load_path(Path(sys.argv[1]), None).volumes[0]
step("read the series")
import torch
step("import torch")
import transformers.modeling_utils
step("import transformers.modeling_utils")
import model.circle_rope.modeling
import model.measurer.infer.pipeline
step("import the model's modules")
from app.cli.loading import load_measurer
measurer = load_measurer(None)
step("load the checkpoint (weights, tokenizer)")
import ingestion.prepare
step("import ingestion.prepare (MONAI)")
from app.heap import keep_freed_memory
from app.threads import measuring_threads, torch_threads
keep_freed_memory()
threads = measuring_threads(torch.get_num_threads(), since=started)
with torch_threads(threads):
    result = measurer.measure(volume, source=sys.argv[1])
step("measure: inference")
json.dumps(result.to_json())
step("JSON")
print(json.dumps({"steps": steps, "threads": threads}))
"""


def _radcaliper() -> list[str]:
    script = Path(sys.executable).parent / "radcaliper"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "app.cli"]


def _pinned(command: list[str], cores: str | None) -> list[str]:
    return ["taskset", "-c", cores, *command] if cores else command


def _run(
    command: list[str], env: dict[str, str], cores: str | None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    began = time.perf_counter()
    done = subprocess.run(
        _pinned(command, cores), cwd=REPOSITORY, env=env, capture_output=True, text=True
    )
    return time.perf_counter() - began, done


def _set_up(data: Path, env: dict[str, str]) -> dict[str, list[str]]:
    """Write the studies, store them; the timed commands (name -> argv after radcaliper)."""
    cli = _radcaliper()
    phantoms = data / "phantoms"
    url = f"sqlite:///{data / 'store.sqlite3'}"
    work = data / "work"
    if not phantoms.is_dir():
        subprocess.run(
            [*cli, "phantoms", str(phantoms), "--n", str(STUDIES)],
            cwd=REPOSITORY,
            env=env,
            check=True,
            capture_output=True,
        )
    batch = ["batch", str(phantoms), "--db", url, "--work", str(work)]
    began = time.perf_counter()
    first = subprocess.run([*cli, *batch], cwd=REPOSITORY, env=env, capture_output=True, text=True)
    if first.returncode != 0:
        raise SystemExit(f"the set-up batch failed:\n{first.stdout}{first.stderr}")
    print(f"- set-up: {STUDIES} studies stored in {time.perf_counter() - began:.1f} s")
    study = sorted(phantoms.iterdir())[0] / "dicom"
    return {
        "--help": ["--help"],
        "measure --help": ["measure", "--help"],
        "audit measurements": ["audit", "measurements", "--db", url],
        "measure": ["measure", str(study), "--no-store", "--json", "--no-resident"],
        "measure (resident)": ["-v", "measure", str(study), "--no-store", "--json"],
        "batch re-run": batch,
    }


TARGETS = {
    "--help": 0.3,
    "audit measurements": 0.8,
    "measure": 4.0,
    "measure (resident)": 4.0,
    "batch re-run": 1.5,
}

LABELS = {
    "measure": "`radcaliper measure --no-resident` (its own process)",
    "measure (resident)": "`radcaliper measure` (a resident running)",
    "batch re-run": "`radcaliper batch` (re-run, all stored)",
}


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


def _check(name: str, output: str, status: int) -> None:
    expected = {
        "--help": ("Usage",),
        "measure --help": ("Usage",),
        "audit measurements": ("row(s)",),
        "measure": ('"findings"',),
        "measure (resident)": ('"findings"', "measured by the resident"),
        "batch re-run": (f"0 stored, {STUDIES} already stored",),
    }[name]
    if status != 0 or not all(text in output for text in expected):
        raise SystemExit(f"`{name}` did not do its work (exit {status}):\n{output[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command")
    parser.add_argument("--cores", default=None, help="taskset CPU list, e.g. 0,1")
    parser.add_argument("--data", type=Path, default=None, help="set-up folder (default: temp)")
    parser.add_argument("--no-phases", action="store_true", help="skip the measure phases")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="bench-startup-"))
    data.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADCALIPER_")}
    env["RADCALIPER_DATA_DIR"] = str(data / "radcaliper")
    command = "python benchmarks/bench_startup.py " + " ".join(sys.argv[1:])
    print(f"- command: `{command.strip()}`")
    print(f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}")
    print(f"- machine: {machine()}")
    print(f"- load average at start: {load()}")
    resident = None
    try:
        commands = _set_up(data, env)
        resident = _start_resident(env, args.cores, data / "resident.log")
        cli = _radcaliper()
        times: dict[str, list[float]] = {name: [] for name in commands}
        phases: list[dict[str, float]] = []
        threads: list[int] = []
        study = commands["measure"][1]
        for _ in range(args.repeats):
            for name, argv in commands.items():
                seconds, done = _run([*cli, *argv], env, args.cores)
                _check(name, done.stdout + done.stderr, done.returncode)
                times[name].append(seconds)
            if not args.no_phases:
                _, done = _run([sys.executable, "-c", _PHASES, study], env, args.cores)
                if done.returncode != 0:
                    raise SystemExit(f"the measure phases failed:\n{done.stderr[-2000:]}")
                said = json.loads(done.stdout.strip().splitlines()[-1])
                phases.append(said["steps"])
                threads.append(said["threads"])
    finally:
        if resident is not None:
            resident.terminate()
            resident.wait(timeout=60)
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    print(f"- load average at end: {load()}")
    print(f"- {args.repeats} runs each, interleaved; cores: {args.cores or 'all'}\n")
    print("| command | min | median | target |")
    print("|---|---|---|---|")
    for name, runs in times.items():
        target = TARGETS.get(name)
        verdict = "" if target is None else f"{target:g} s ({_met(min(runs), target)})"
        label = LABELS.get(name, f"`radcaliper {name}`")
        print(f"| {label} | {min(runs):.2f} s | {statistics.median(runs):.2f} s | {verdict} |")
    rows: dict[str, Any] = {"times_s": times}
    if phases:
        print(
            "\nPhases of `radcaliper measure --no-store` (one process, median of each step; "
            f"torch threads {', '.join(map(str, threads))}):\n"
        )
        print("| step | median | min |")
        print("|---|---|---|")
        for step in phases[0]:
            values = [p[step] for p in phases if step in p]
            print(f"| {step} | {statistics.median(values):.2f} s | {min(values):.2f} s |")
        total = [sum(p.values()) for p in phases]
        print(f"| total (in the process) | {statistics.median(total):.2f} s | {min(total):.2f} s |")
        rows["measure_phases_s"] = phases
        rows["measure_threads"] = threads
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


def _met(seconds: float, target: float) -> str:
    return "MET" if seconds <= target else "MISSED"


if __name__ == "__main__":
    main()
