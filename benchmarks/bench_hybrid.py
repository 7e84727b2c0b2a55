"""Benchmark: a checkpoint on hybrid studies of held-out real backgrounds (issue 23's targets).

Hybrid studies (``model.measurer.data.hybrid``: real CT backgrounds with synthetic lesions inserted,
truth measured from the final label map) are made from the backgrounds named by ``--held-out``
only (leave-one-background-out: a checkpoint trained with ``held_out`` set to the same ids
never saw them). Two tasks are scored:

- **click**: ``measure_at`` at every true lesion's centre (the UI's click): the lesions >= 10 mm
  the point task names as a lesion, long- and short-axis MAE, and how often the 90 % ranges
  cover the truth; a "none", a vessel or a malformed answer at a lesion counts as missed; the
  errors are also broken down by true long axis with their sign (a model that shrinks big
  lesions and grows small ones shows it there);
- **detection**: ``measure`` on the whole study, scored with ``evaluate.score_study`` (the
  matching rule of every evaluation): lesion recall >= 10 mm, false findings per study,
  vessels (from the background's masks) found and their diameter MAE, for every verified
  report (the checkpoint's ``calibrate`` stage left out), at the checkpoint's detection
  operating point, and along the detection curve (``model.measurer.calibrate.operating``: the best
  recall within each budget of false findings per study).

Usage::

    python benchmarks/bench_hybrid.py --model DIR --held-out ts_abdomen_dicom --n 20 --seed 9001

Prints a markdown table (and writes it with ``--json``). Run alone: timings are not
meaningful beside other jobs.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from ingestion.dataset.format import DatasetFinding
from ingestion.errors import ModelError
from model.measurer.calibrate.operating import detection_curve
from model.measurer.checkpoint.settings import default_checkpoint
from model.measurer.data.hybrid import HybridSource, choose_backgrounds, shared_data_root
from model.measurer.evaluate.scoring import StudyOutcome, score_study
from model.measurer.infer.pipeline import CheckpointMeasurer
from model.measurer.infer.state import TraceEvent
from model.measurer.results import FindingKind

logger = logging.getLogger("bench_hybrid")


_SIZE_BINS = ((10.0, 20.0), (20.0, 40.0), (40.0, math.inf))
_BUDGETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0)  # false findings per study (the detection curve)


def _mae(errors: list[float]) -> float:
    return statistics.fmean(errors) if errors else math.nan


def _tissue(name: str) -> str:
    """The tissue of an inserted lesion from its name ("synthetic lesion (lung, ...)"), else
    "real" (a lesion annotated in the background itself)."""
    prefix = "synthetic lesion ("
    if name.startswith(prefix):
        return name[len(prefix) :].split(",")[0]
    return "real"


def _print_click_row(label: str, rows_in: list[dict[str, float | int | str]]) -> None:
    """One markdown row: clicks, and MAE / mean signed error of each axis."""
    if not rows_in:
        return
    cells = []
    for axis in ("long", "short"):
        signed = [float(c[f"{axis}_mm"]) - float(c[f"true_{axis}_mm"]) for c in rows_in]
        cells.append(f"{_mae([abs(e) for e in signed]):.2f} / {statistics.fmean(signed):+.2f} mm")
    print(f"| {label} | {len(rows_in)} | {cells[0]} | {cells[1]} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint (default: demo)")
    parser.add_argument("--held-out", required=True, help="background ids, comma-separated")
    parser.add_argument("--n", type=int, default=20, help="hybrid studies")
    parser.add_argument("--seed", type=int, default=9001)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--shared", type=Path, default=None, help="the shared data folder")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--tasks",
        choices=("click", "detection", "both"),
        default="both",
        help="score the click, the whole-study detection, or both (default)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    held_out = [s for s in args.held_out.split(",") if s]
    root = shared_data_root(args.shared)
    refs = choose_backgrounds(root, None)
    source = HybridSource(refs, args.seed, held_out=held_out).validation()
    model_dir = args.model or default_checkpoint()
    measurer = CheckpointMeasurer.load(model_dir)
    # detection runs without the calibrate stage, so that every verified report is seen with
    # its presence; the checkpoint's operating point (applied by that stage, last) is then
    # evaluated exactly from the same run by re-matching what it keeps
    # (model.measurer.calibrate.operating)
    operating = measurer.loaded.settings.detection
    measurer.stages = tuple(s for s in measurer.stages if s.name != "calibrate")
    last_stage = measurer.stages[-1].name
    pending: list[float | None] = []

    def on_stage(event: TraceEvent) -> None:
        if event.stage == last_stage:
            pending[:] = [c.presence for c in event.state.candidates]

    measurer.subscribe(on_stage)
    outcomes: list[StudyOutcome] = []
    presences: list[list[float | None]] = []

    click_long: list[float] = []
    click_short: list[float] = []
    covered = {"long_axis": 0, "short_axis": 0}
    ranged = {"long_axis": 0, "short_axis": 0}
    click_total = click_named = 0
    clicks: list[
        dict[str, float | int | str]
    ] = []  # every clicked lesion named a lesion with both values
    lesions = found = false = vessels = vessels_found = refused = 0
    diameter_errors: list[float] = []
    seconds: list[float] = []
    began = time.perf_counter()
    clicking = args.tasks in ("click", "both")
    detecting = args.tasks in ("detection", "both")
    for index in range(args.n):
        study = source.study(index)
        for truth in study.findings if clicking else ():
            if truth.kind != "lesion" or (truth.long_axis_mm or 0.0) < 10.0:
                continue
            click_total += 1
            try:
                reported = measurer.measure_at(study.volume, truth.center_lps_mm)
            except ModelError:
                continue
            if reported is None or reported.kind is not FindingKind.LESION:
                continue
            long, short = reported.measurements
            if long.value_mm is None or short.value_mm is None:
                continue
            click_named += 1
            assert truth.long_axis_mm is not None and truth.short_axis_mm is not None
            clicks.append(
                {
                    "study": index,
                    "tissue": _tissue(truth.name if isinstance(truth, DatasetFinding) else ""),
                    "true_long_mm": truth.long_axis_mm,
                    "true_short_mm": truth.short_axis_mm,
                    "long_mm": long.value_mm,
                    "short_mm": short.value_mm,
                }
            )
            for m, true in ((long, truth.long_axis_mm), (short, truth.short_axis_mm)):
                assert true is not None and m.value_mm is not None
                (click_long if m.name == "long_axis" else click_short).append(
                    abs(m.value_mm - true)
                )
                if m.range_mm is not None:
                    ranged[str(m.name)] += 1
                    covered[str(m.name)] += m.range_mm[0] <= true <= m.range_mm[1]
        if not detecting:
            print(f"  {index + 1}/{args.n} studies (click)", file=sys.stderr)
            continue
        pending.clear()
        outcome = score_study(study, measurer)
        outcomes.append(outcome)
        presences.append(list(pending) if outcome.result is not None else [])
        if outcome.result is None:
            refused += 1
            continue
        seconds.append(outcome.seconds)
        matched = dict(outcome.matches)
        for t, truth in enumerate(study.findings):
            if truth.kind == "lesion" and (truth.long_axis_mm or 0.0) >= 10.0:
                lesions += 1
                found += t in matched
            elif truth.kind == "vessel":
                vessels += 1
                if t in matched:
                    vessels_found += 1
                    (value,) = outcome.result.findings[matched[t]].measurements
                    if value.value_mm is not None and truth.diameter_mm is not None:
                        diameter_errors.append(abs(value.value_mm - truth.diameter_mm))
        false += outcome.false_and_unjudged()[0]
        print(f"  {index + 1}/{args.n} studies", file=sys.stderr)
    measured = args.n - refused
    figures = {
        "model": f"{measurer.info.name} {measurer.info.version}",
        "held_out": held_out,
        "studies": args.n,
        "seed": args.seed,
        "refused": refused,
        "click_lesions": click_total,
        "click_named_lesion": click_named,
        "click_mae_long_mm": _mae(click_long),
        "click_mae_short_mm": _mae(click_short),
        "click_coverage_long": covered["long_axis"] / max(1, ranged["long_axis"]),
        "click_coverage_short": covered["short_axis"] / max(1, ranged["short_axis"]),
        "lesion_recall": found / max(1, lesions),
        "lesions": lesions,
        "lesions_found": found,
        "false_per_study": false / max(1, measured),
        "vessels": vessels,
        "vessels_found": vessels_found,
        "vessel_diameter_mae_mm": _mae(diameter_errors),
        "seconds_per_study_median": statistics.median(seconds) if seconds else math.nan,
        "wall_s": time.perf_counter() - began,
        "clicks": clicks,
    }
    curve = detection_curve(outcomes, presences)
    froc = []
    for budget in _BUDGETS:
        within = [p for p in curve if p.false_per_study <= budget]
        best = max(within, key=lambda p: (p.lesion_recall, -p.threshold), default=None)
        froc.append((budget, best))
    figures["froc"] = [
        {
            "false_per_study_budget": budget,
            "threshold": None if p is None else p.threshold,
            "lesion_recall": None if p is None else p.lesion_recall,
            "false_per_study": None if p is None else p.false_per_study,
            "vessels_found": None if p is None else p.vessels_found,
        }
        for budget, p in froc
    ]
    at_operating = None
    if operating is not None:
        (at_operating,) = detection_curve(outcomes, presences, [operating.min_presence])
        figures["operating_point"] = {
            "min_presence": operating.min_presence,
            "lesion_recall": at_operating.lesion_recall,
            "false_per_study": at_operating.false_per_study,
            "vessels_found": at_operating.vessels_found,
        }
    rows = [
        ("click: lesions >= 10 mm named a lesion", f"{click_named}/{click_total}", ""),
        (
            "click: MAE long / short",
            f"{_mae(click_long):.2f} / {_mae(click_short):.2f} mm",
            "<= 2.0 mm",
        ),
        (
            "click: 90 % range coverage long / short",
            f"{figures['click_coverage_long']:.3f} / {figures['click_coverage_short']:.3f}",
            "0.88-0.92",
        ),
    ]
    detection_rows = [
        ("detection, every verified report: lesion recall >= 10 mm", f"{found}/{lesions}", ""),
        (
            "detection, every verified report: false findings per study",
            f"{figures['false_per_study']:.2f}",
            "",
        ),
        ("detection, every verified report: vessels found", f"{vessels_found}/{vessels}", ""),
        ("detection: vessel diameter MAE", f"{_mae(diameter_errors):.2f} mm", "<= 2.5 mm"),
        ("seconds per study (median)", f"{figures['seconds_per_study_median']:.1f} s", ""),
        ("studies refused", f"{refused}/{args.n}", ""),
    ]
    if detecting:
        rows += detection_rows
    print(f"\n- command: `python benchmarks/bench_hybrid.py {' '.join(argv or sys.argv[1:])}`")
    print(f"- model: {figures['model']} ({model_dir})")
    print(f"- held-out backgrounds: {', '.join(held_out)}; {args.n} studies, seed {args.seed}")
    print("\n| metric | value | target |\n|---|---|---|")
    for name, cell, target in rows:
        print(f"| {name} | {cell} | {target} |")
    if detecting and at_operating is not None and operating is not None:
        print(
            f"\nAt the checkpoint's operating point (presence >= {operating.min_presence:.10g}, "
            f"fitted for {operating.false_per_study:g} false findings per study): lesion recall "
            f"{at_operating.lesions_found}/{at_operating.lesions} (target >= 0.80), "
            f"{at_operating.false_per_study:.2f} false findings per study (target <= 1.0), "
            f"vessels {at_operating.vessels_found}/{at_operating.vessels}"
        )
    if detecting:
        print(
            "\nDetection curve (the best lesion recall within each budget of false findings per "
            "study, over presence thresholds):\n\n"
            "| false findings per study at most | presence threshold (1 - P(none)) | "
            "lesion recall >= 10 mm | "
            "false per study | vessels found |\n|---|---|---|---|---|"
        )
        for budget, p in froc:
            if p is None:
                print(f"| {budget:g} | - | - | - | - |")
            else:
                print(
                    f"| {budget:g} | {p.threshold:.10g} | {p.lesions_found}/{p.lesions} | "
                    f"{p.false_per_study:.2f} | {p.vessels_found}/{p.vessels} |"
                )
    print(
        "\nClicked lesions by true long axis (signed error = reported - true):\n\n"
        "| true long axis | lesions | long: MAE / mean signed | short: MAE / mean signed |\n"
        "|---|---|---|---|"
    )
    for low, high in _SIZE_BINS:
        _print_click_row(
            f"{low:g}-{high:g} mm", [c for c in clicks if low <= float(c["true_long_mm"]) < high]
        )
    print(
        '\nClicked lesions by tissue (where the lesion was inserted; "real": the background\'s '
        "own annotated lesion):\n\n"
        "| tissue | lesions | long: MAE / mean signed | short: MAE / mean signed |\n"
        "|---|---|---|---|"
    )
    for tissue in sorted({str(c["tissue"]) for c in clicks}):
        _print_click_row(tissue, [c for c in clicks if c["tissue"] == tissue])
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
