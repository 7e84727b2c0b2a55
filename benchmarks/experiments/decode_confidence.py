"""Experiment: does a weak numeric decode mark a wrong or invented value? (issue 23)

Every value the RNED head writes carries its decode confidence (``NumericHead.confidence``: the
peak correlation of the hidden state with its value's codeword). ``radcaliper calibrate`` fits a
``DecodeCheck`` on it: a value weaker than all but ``--decode-quantile`` of the decodes on the
calibration studies is "not measurable". This script measures studies with the ``calibrate``
stage left out (raw values, nothing refused), follows each reported finding's confidence through
the trace hook, and scores it against the truth:

- matched findings: the absolute error of each value by confidence quartile;
- false findings (reports matching no truth of an annotated kind): their confidences;
- a check fitted on the first source's reported values (as ``calibrate`` does) at each quantile:
  what share of matched values and of false findings it refuses on every source.

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/experiments/decode_confidence.py [--model DIR]
        [--phantoms SEED:N ...] [--dataset DIR ...] [--json OUT]

The first source calibrates (``--phantoms 7001:60`` by default, the calibrate command's seed);
add held-out sources after it, e.g. the real set that ``bench_real.py --work W`` imports
(``--dataset W/dataset``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ingestion.dataset.format import TrueFinding
from model.measurer.calibrate.calibration import fit_decode_check
from model.measurer.checkpoint.settings import default_checkpoint
from model.measurer.checkpoint.weights import load_checkpoint
from model.measurer.data.sources import DatasetSource, PhantomSource
from model.measurer.data.study import StudySource
from model.measurer.evaluate.scoring import StudyOutcome, evaluate
from model.measurer.infer.pipeline import CheckpointMeasurer
from model.measurer.infer.stages import default_stages
from model.measurer.infer.state import TraceEvent
from model.measurer.results import Measurement, MeasurementName

QUANTILES = (0.01, 0.05, 0.10)


@dataclass
class Scored:
    """One source's reported findings: (confidence, abs errors) of matched, and false ones."""

    name: str
    matched: list[tuple[float, list[float]]] = field(default_factory=list)
    false: list[float] = field(default_factory=list)
    reported: list[float] = field(default_factory=list)
    studies: int = 0
    refused: int = 0


def _source(spec: str, kind: str) -> tuple[str, StudySource, int]:
    if kind == "phantoms":
        seed, n = spec.split(":")
        return f"phantoms seed {seed}", PhantomSource(int(seed)), int(n)
    source = DatasetSource(Path(spec))
    return f"dataset {Path(spec).name}", source, len(source)


def score(measurer: CheckpointMeasurer, name: str, source: StudySource, n: int) -> Scored:
    """Measure ``n`` studies of ``source``; pair each report with its confidence."""
    last = measurer.stages[-1].name
    seen: list[list[float | None]] = []

    def trace(event: TraceEvent) -> None:
        if event.stage == last:
            seen.append(
                [
                    None if c.outcome is None else c.outcome.confidence
                    for c in event.state.candidates
                ]
            )

    scored = Scored(name)

    def on_study(outcome: StudyOutcome) -> None:
        scored.studies += 1
        if outcome.result is None:
            scored.refused += 1
            return
        confidences = seen.pop() if seen else []
        seen.clear()
        if len(confidences) != len(outcome.result.findings):
            raise RuntimeError(f"{outcome.name}: trace and result disagree on the findings")
        matched = {j: i for i, j in outcome.matches}
        for j, (report, confidence) in enumerate(
            zip(outcome.result.findings, confidences, strict=True)
        ):
            if confidence is None:
                continue
            scored.reported.append(confidence)
            if j in matched:
                truth = outcome.truth[matched[j]]
                errors = [
                    abs(m.value_mm - t)
                    for m, t in _pairs(report.measurements, truth)
                    if m.value_mm is not None
                ]
                scored.matched.append((confidence, errors))
            elif report.kind.value in outcome.annotated:
                scored.false.append(confidence)

    unsubscribe = measurer.subscribe(trace)
    try:
        evaluate(measurer, (source.study(i) for i in range(n)), on_study=on_study)
    finally:
        unsubscribe()
    return scored


def _pairs(
    measurements: tuple[Measurement, ...], truth: TrueFinding
) -> list[tuple[Measurement, float]]:
    true = {
        MeasurementName.LONG_AXIS: truth.long_axis_mm,
        MeasurementName.SHORT_AXIS: truth.short_axis_mm,
        MeasurementName.DIAMETER: truth.diameter_mm,
    }
    return [(m, t) for m in measurements if (t := true.get(m.name)) is not None]


def _share(flags: list[bool]) -> float | None:
    return float(np.mean(flags)) if flags else None


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def summary(scored: Scored, checks: dict[float, float]) -> dict[str, object]:
    """One source's figures (module doc), with the checks fitted on the first source."""
    confidences = [c for c, _ in scored.matched]
    quartiles: list[dict[str, float]] = []
    if confidences:
        edges = np.quantile(np.array(confidences), [0, 0.25, 0.5, 0.75, 1.0])
        for lo, hi in itertools.pairwise(edges):
            errors = [e for c, es in scored.matched if lo <= c <= hi for e in es]
            mae = float(np.mean(errors)) if errors else float("nan")
            quartiles.append(
                {"from": float(lo), "to": float(hi), "values": len(errors), "mae_mm": mae}
            )
    refused = {
        f"{q:g}": {
            "threshold": t,
            "matched_refused": _share([c < t for c in confidences]),
            "false_refused": _share([c < t for c in scored.false]),
        }
        for q, t in checks.items()
    }
    return {
        "source": scored.name,
        "studies": scored.studies,
        "refused_studies": scored.refused,
        "matched": len(scored.matched),
        "false": len(scored.false),
        "matched_confidence_median": _median(confidences),
        "false_confidence_median": _median(scored.false),
        "error_by_confidence_quartile": quartiles,
        "check": refused,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--phantoms", action="append", default=[], metavar="SEED:N")
    parser.add_argument("--dataset", action="append", default=[], metavar="DIR")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    specs = [(s, "phantoms") for s in args.phantoms or ["7001:60"]]
    specs += [(d, "dataset") for d in args.dataset]
    directory = args.model or default_checkpoint()
    loaded = load_checkpoint(directory)
    stages = [s for s in default_stages(loaded.settings) if s.name != "calibrate"]
    measurer = CheckpointMeasurer(loaded, directory=directory, stages=stages)
    results = []
    checks: dict[float, float] = {}
    for index, (spec, kind) in enumerate(specs):
        name, source, n = _source(spec, kind)
        scored = score(measurer, name, source, n)
        if index == 0:
            for q in QUANTILES:
                check = fit_decode_check(scored.reported, q)
                if check is not None:
                    checks[q] = check.min_confidence
        results.append(summary(scored, checks))
        print(json.dumps(results[-1], indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps({"model": str(directory), "sources": results}, indent=1))


if __name__ == "__main__":
    main()
