"""Exploratory (issue 5): choose the find stage's grouping rule on validation phantoms.

For each candidate rule (:data:`RULES`) the checkpoint runs only the ``find`` and ``verify``
stages (``stages.stages_named``; ``find`` alone where the checkpoint does not confirm
candidates with the point task) on every study, and a trace (``CheckpointMeasurer.measure(...,
trace=...)``) keeps the candidates each stage left. Both are scored with the phantom spec's
matching rule (``evaluate.match_findings``): without confirmation (after ``find``) and with it
(after ``verify``). Each rule runs the find stage anew (the rule is an inference option).
Validation studies come from a run seed that is neither the training's nor the evaluation's
(use the calibration seed, 7001), so the held-out evaluation stays untouched by the choice.

Diagnostics: for every true lesion >= 10 mm, the nearest candidate of the most permissive rule
(the smallest ``min_plane_fraction``) after ``find``, of any kind and of kind lesion, within the
lesion's cranio-caudal half-extent along z: whether a miss is the model's or the rules'.

Usage: python benchmarks/experiments/tune_grouping.py CHECKPOINT N [SEED]
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model.measurer.checkpoint.weights import load_checkpoint
from model.measurer.data.sources import PhantomSource
from model.measurer.data.study import TrainingStudy
from model.measurer.evaluate.scoring import RECALL_MIN_LONG_AXIS_MM, match_findings
from model.measurer.infer.grouping import GroupingRule
from model.measurer.infer.pipeline import CheckpointMeasurer, InferenceOptions
from model.measurer.infer.stages import stages_named
from model.measurer.infer.state import Candidate, TraceEvent
from model.measurer.results import MEASUREMENTS_OF, FindingKind, Measurement, StudyFinding

RULES = tuple(GroupingRule(max_plane_gap=2, min_plane_fraction=f) for f in (0.0, 0.3))


class StageRecorder:
    """A trace: the candidates each stage of the current study left, by stage name."""

    def __init__(self) -> None:
        self.after: dict[str, tuple[Candidate, ...]] = {}

    def __call__(self, event: TraceEvent) -> None:
        self.after[event.stage] = event.state.candidates


def as_findings(candidates: Sequence[Candidate]) -> list[StudyFinding]:
    """Candidates as unmeasured findings (``match_findings`` reads kind and centre only)."""
    return [
        StudyFinding(
            k,
            c.found.kind,
            c.found.center_lps_mm,
            0,
            tuple(
                Measurement.not_measurable(name, "not measured (grouping experiment)")
                for name in MEASUREMENTS_OF[c.found.kind]
            ),
        )
        for k, c in enumerate(candidates, start=1)
    ]


def counted(study: TrainingStudy) -> list[int]:
    """Indices of the study's true lesions >= 10 mm (the recall's lesions)."""
    return [
        i
        for i, t in enumerate(study.findings)
        if t.kind == "lesion" and (t.long_axis_mm or 0) >= RECALL_MIN_LONG_AXIS_MM
    ]


def score(studies: Sequence[TrainingStudy], reported: Sequence[Sequence[Candidate]]) -> str:
    """Lesion recall (>= 10 mm) and false findings per study, as one line."""
    lesions = found = false = 0
    for study, candidates in zip(studies, reported, strict=True):
        findings = as_findings(candidates)
        pairs = match_findings(study.findings, findings)
        matched = {i for i, _ in pairs}
        lesions += len(counted(study))
        found += sum(i in matched for i in counted(study))
        false += len(findings) - len(pairs)
    return (
        f"lesion recall {found / max(1, lesions):.3f} ({found}/{lesions}), "
        f"false per study {false / max(1, len(studies)):.2f}"
    )


def diagnostics(studies: Sequence[TrainingStudy], found: Sequence[Sequence[Candidate]]) -> str:
    """Nearest candidates to each counted lesion (module doc), as one line."""
    near_any = near_lesion = 0
    distances = []
    for study, candidates in zip(studies, found, strict=True):
        for i in counted(study):
            t = study.findings[i]
            half = (t.cc_extent_mm or 0.0) / 2
            best = best_lesion = math.inf
            for c in candidates:
                centre = c.found.center_lps_mm
                if abs(centre[2] - t.center_lps_mm[2]) > half:
                    continue
                distance = math.dist(centre[:2], t.center_lps_mm[:2])
                best = min(best, distance)
                if c.found.kind is FindingKind.LESION:
                    best_lesion = min(best_lesion, distance)
            radius = max(10.0, (t.long_axis_mm or 0.0) / 2)
            near_any += best <= radius
            near_lesion += best_lesion <= radius
            distances.append(round(best_lesion, 1))
    return (
        f"lesions with a candidate of any kind within the radius: {near_any}; of kind lesion: "
        f"{near_lesion}; nearest lesion-candidate distances (mm): {sorted(distances)}"
    )


def main(argv: Sequence[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    torch.set_num_threads(1)
    loaded = load_checkpoint(argv[0])
    n = int(argv[1])
    source = PhantomSource(int(argv[2]) if len(argv) > 2 else 7001)
    studies = [source.study(i) for i in range(n)]
    settings = loaded.settings
    confirms = settings.verify_candidates and "point" in settings.tasks
    names = ["find", "verify"] if confirms else ["find"]
    first: list[tuple[Candidate, ...]] | None = None
    for rule in sorted(RULES, key=lambda r: r.min_plane_fraction):
        measurer = CheckpointMeasurer(
            loaded, options=InferenceOptions(grouping=rule), stages=stages_named(names)
        )
        after: dict[str, list[tuple[Candidate, ...]]] = {name: [] for name in names}
        for study in studies:
            recorder = StageRecorder()
            measurer.measure(study.volume, source=study.name, trace=recorder)
            for name in names:
                after[name].append(recorder.after[name])
        first = after["find"] if first is None else first
        for name in names:
            print(
                f"min_plane_fraction {rule.min_plane_fraction:.1f} gap {rule.max_plane_gap} "
                f"verify {name == 'verify'}: {score(studies, after[name])}",
                flush=True,
            )
    assert first is not None  # RULES is not empty
    print(diagnostics(studies, first))


if __name__ == "__main__":
    main(sys.argv[1:])
