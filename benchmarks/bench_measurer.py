"""Benchmark: the measurer on held-out phantoms (issue 5's targets), and its speed.

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_measurer.py [--model DIR] [--n 200] [--seed 2026] [--threads 2]
                                        [--data DIR] [--json FILE]

1. Writes ``--n`` phantom studies with ``radcaliper phantoms``' writer (run seed ``--seed``,
   never a training or calibration seed) as DICOM series under ``--data`` (a temporary folder by
   default) and reads them back through ingestion, as a user's studies would be.
2. Times loading the model in a fresh Python process (imports included), three times.
3. Measures every study with ``CheckpointMeasurer`` on ``--threads`` CPU threads and scores the
   results against ``truth.json`` (``model.measurer.evaluate.scoring``): recall of lesions >= 10 mm
   and false findings per study, MAE of long axis, short axis and vessel diameter, coverage of the
   calibrated ranges, answers that parsed, and seconds per study (median; the first study is a
   warm-up and not timed).

``--json`` writes the metrics and every matched measurement (``pairs``: name, value, truth,
study), so that another calibration can be scored on the same set without measuring again.

Targets (issue 5): recall >= 0.95 with <= 0.2 false findings per study; MAE long/short <= 2.0 mm,
diameter <= 1.5 mm; 90 % ranges cover 88-92 %; >= 99 % of answers parse; one study <= 3 s
(median) on 2 CPU cores; model load <= 5 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import load, machine

from ingestion.phantoms import write_phantoms
from model.measurer.checkpoint.settings import default_checkpoint
from model.measurer.data.sources import FolderSource
from model.measurer.evaluate.scoring import StudyOutcome, evaluate, summarize
from model.measurer.infer.pipeline import CheckpointMeasurer

LOAD_SNIPPET = (
    "import sys, time; t = time.perf_counter(); "
    "from model.measurer.infer.pipeline import CheckpointMeasurer; "
    "CheckpointMeasurer.load(sys.argv[1]); print(time.perf_counter() - t)"
)


def _load_seconds(model: Path, threads: int) -> list[float]:
    out = []
    for _ in range(3):
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import torch; torch.set_num_threads({threads}); " + LOAD_SNIPPET,
                str(model),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        out.append(float(result.stdout.strip().splitlines()[-1]))
    return out


def _pairs(outcomes: list[StudyOutcome] | tuple[StudyOutcome, ...]) -> list[list[object]]:
    """``[name, value_mm, true_mm, study folder]`` of every matched measurement with a value."""
    return [
        [m.name.value, m.value_mm, m.true_mm, Path(outcome.name).name]
        for outcome in outcomes
        for m in outcome.measurements
        if m.value_mm is not None
    ]


def _row(name: str, value: str, target: str, met: bool | None) -> str:
    verdict = "" if met is None else ("MET" if met else "missed")
    return f"| {name} | {value} | {target} | {verdict} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint (default: demo)")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", type=Path, default=None, help="keep the studies here")
    parser.add_argument("--json", type=Path, default=None, help="write the metrics as JSON")
    args = parser.parse_args()
    model = args.model or default_checkpoint()
    torch.set_num_threads(args.threads)
    started = datetime.now(UTC)
    print(f"load average at start: {load()}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or Path(tmp) / "studies"
        if not data.exists():
            t = time.perf_counter()
            write_phantoms(data, n=args.n, seed=args.seed)
            print(f"wrote {args.n} studies in {time.perf_counter() - t:.0f} s", flush=True)
        source = FolderSource(data)
        load_times = _load_seconds(model, args.threads)
        measurer = CheckpointMeasurer.load(model)
        warm = source.study(0)
        measurer.measure(warm.volume, source=warm.name)  # warm-up, not timed

        def progress(outcome: StudyOutcome) -> None:
            done.append(outcome)
            if len(done) % 20 == 0:
                print(f"  {len(done)}/{len(source.folders)} studies", flush=True)

        done: list[StudyOutcome] = []
        began = time.perf_counter()
        evaluation = evaluate(
            measurer, (source.study(i) for i in range(len(source.folders))), on_study=progress
        )
        wall = time.perf_counter() - began

    e = summarize(evaluation.outcomes)
    info = measurer.info
    coverage_ok = all(0.88 <= c <= 0.92 for c in e.coverage.values()) and bool(e.coverage)
    rows = [
        _row(
            "lesions >= 10 mm found (recall)",
            f"{e.lesions_10mm_found}/{e.lesions_10mm} = {e.lesion_recall:.3f}",
            ">= 0.95",
            e.lesion_recall >= 0.95,
        ),
        _row(
            "false findings per study",
            f"{e.false_per_study:.3f}",
            "<= 0.2",
            e.false_per_study <= 0.2,
        ),
        _row(
            "vessels found (recall)",
            f"{e.vessels_found}/{e.vessels} = {e.vessel_recall:.3f}",
            "",
            None,
        ),
    ]
    targets = {"long_axis": 2.0, "short_axis": 2.0, "diameter": 1.5}
    for name, target in targets.items():
        mae = e.mae_mm.get(name, float("nan"))
        rows.append(
            _row(
                f"MAE {name.replace('_', ' ')} (n = {e.counts.get(name, 0)})",
                f"{mae:.2f} mm",
                f"<= {target} mm",
                mae <= target,
            )
        )
    for name, coverage in e.coverage.items():
        rows.append(
            _row(
                f"90 % range coverage, {name.replace('_', ' ')}",
                f"{coverage:.3f} (mean width {e.mean_width_mm[name]:.2f} mm)",
                "0.88-0.92",
                0.88 <= coverage <= 0.92,
            )
        )
    rows.append(
        _row(
            "answers that parsed",
            f"{e.answers_parsed:.4f} ({e.not_measurable} not "
            f"measurable; {e.malformed_find_answers} malformed find answers)",
            ">= 0.99",
            e.answers_parsed >= 0.99,
        )
    )
    rows.append(
        _row(
            "seconds per study (median)",
            f"{e.seconds_median:.2f} s",
            "<= 3 s",
            e.seconds_median <= 3.0,
        )
    )
    rows.append(
        _row(
            "model load (fresh process, imports included; median of 3)",
            f"{statistics.median(load_times):.2f} s",
            "<= 5 s",
            statistics.median(load_times) <= 5.0,
        )
    )
    print()
    print(f"- command: `python benchmarks/bench_measurer.py {' '.join(sys.argv[1:])}`".rstrip())
    print(
        f"- date: {started.isoformat(timespec='seconds')}; "
        f"wall time {wall:.0f} s for {e.studies} studies"
    )
    print(f"- machine: {machine()}")
    print(f"- model: {info.name} {info.version} ({info.numeric_mode}) from {model}")
    print(
        f"- held-out studies: {e.studies} phantoms, run seed {args.seed}, read from DICOM; "
        f"{e.refused} refused"
    )
    print(f"- load average at end: {load()}")
    print()
    print("| metric | value | target | |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    print(f"| coverage all met | {coverage_ok} | | |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {**e.to_json(), "load_seconds": load_times, "pairs": _pairs(evaluation.outcomes)},
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
