"""Exploratory (issue 5): after which inference stage each missed lesion (>= 10 mm) is lost.

Runs a checkpoint over the studies under DATA and watches every stage through the measurer's
trace hook (``CheckpointMeasurer.measure(..., trace=...)``, ``model.measurer.infer.stages``). For
every true lesion >= 10 mm that the final result does not match (``evaluate.match_findings``)
it names the first step after which nothing of it is left: a candidate of any kind within
``max(10 mm, half the long axis)`` of it in the axial plane and within the lesion's
cranio-caudal half-extent (at least 5 mm) along z.

Steps, in order:

``boxes``
    Did the model see the lesion at all? A second measurer on the same weights runs the
    ``find`` stage alone, keeping a box seen in any one shifted pass (``FindVoting.votes`` 1)
    and groups seen on any number of planes (``GroupingRule.min_plane_fraction`` 0).
    ``BOXES=0`` leaves this run out.
then the measurer's own stages (the checkpoint's ``default_stages``, or ``STAGES``):
    ``find`` (after the vote and the grouping rule), ``verify``, ``recentre``, ``merge``,
    ``measure``, ``axes``, ``dedupe``, ``calibrate``.

A lesion with a candidate near it after the last stage but no match is ``unmatched``; the line
gives the kind and in-plane distance of each finding near it (and whether another true finding
took it) and the kinds the ``measure`` stage left there.

Environment: ``STAGES`` (comma-separated stage names, ``stages.stages_named``: an ablation that
leaves stages out); ``N`` (only the first N studies); ``BOXES=0`` (no ``boxes`` run).

Usage: python benchmarks/experiments/miss_stages.py CHECKPOINT DATA [THREADS]
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ingestion.dataset.format import TrueFinding
from model.measurer.data.sources import FolderSource
from model.measurer.evaluate.scoring import RECALL_MIN_LONG_AXIS_MM, match_findings
from model.measurer.infer.pipeline import CheckpointMeasurer
from model.measurer.infer.stages import stages_named
from model.measurer.infer.state import InferenceStage, TraceEvent
from model.measurer.inputs.voting import FindVoting
from model.measurer.results import StudyFinding

logger = logging.getLogger("miss_stages")

Place = tuple[str, tuple[float, float, float]]
"""A candidate as this experiment sees it: kind ("lesion"/"vessel") and LPS centre (mm)."""


class StageRecorder:
    """A trace: the candidates each stage of the current study left, by stage name."""

    def __init__(self) -> None:
        self.after: dict[str, list[Place]] = {}

    def __call__(self, event: TraceEvent) -> None:
        self.after[event.stage] = [
            (c.found.kind.value, c.found.center_lps_mm) for c in event.state.candidates
        ]


def near(truth: TrueFinding, places: Sequence[Place]) -> list[Place]:
    """The places within reach of ``truth`` (module doc)."""
    reach = max(10.0, (truth.long_axis_mm or 0.0) / 2)
    z_reach = max(5.0, (truth.cc_extent_mm or 0.0) / 2)
    x, y, z = truth.center_lps_mm
    return [
        (kind, c)
        for kind, c in places
        if math.hypot(c[0] - x, c[1] - y) <= reach and abs(c[2] - z) <= z_reach
    ]


def env_stages() -> tuple[InferenceStage, ...] | None:
    """The stages ``STAGES`` names, or None (the checkpoint's) where it is unset."""
    names = [n.strip() for n in os.environ.get("STAGES", "").split(",") if n.strip()]
    if not names:
        return None
    try:
        return stages_named(names)
    except ValueError as error:
        raise SystemExit(f"STAGES={os.environ['STAGES']!r}: {error}") from error


def boxes_measurer(measurer: CheckpointMeasurer) -> CheckpointMeasurer:
    """The ``find`` stage alone on the same weights, keeping every pass's boxes and groups of
    any plane count."""
    voting = measurer.options.find_voting or measurer.settings.find_voting
    options = dataclasses.replace(
        measurer.options,
        find_voting=FindVoting(voting.shifts, votes=1),
        grouping=dataclasses.replace(measurer.options.grouping, min_plane_fraction=0.0),
    )
    return CheckpointMeasurer(
        measurer.loaded, device=measurer.device, options=options, stages=stages_named(["find"])
    )


def unmatched_detail(
    truth: TrueFinding,
    findings: Sequence[StudyFinding],
    taken: set[int],
    measured: Sequence[Place],
) -> str:
    """What is near an unmatched lesion after the last stage, and what ``measure`` left there."""
    parts = []
    for index, f in enumerate(findings):
        place = (f.kind.value, f.center_lps_mm)
        if not near(truth, [place]):
            continue
        distance = math.dist(f.center_lps_mm[:2], truth.center_lps_mm[:2])
        elsewhere = ", matched elsewhere" if index in taken else ""
        parts.append(f" [{f.kind.value} at {distance:.0f} mm{elsewhere}]")
    kinds = ",".join(kind for kind, _ in near(truth, measured)) or "-"
    return "".join(parts) + f" measured as {kinds}"


def main(argv: Sequence[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)
    torch.set_num_threads(int(argv[2]) if len(argv) > 2 else 1)
    measurer = CheckpointMeasurer.load(argv[0], stages=env_stages())
    boxes = None if os.environ.get("BOXES", "1") == "0" else boxes_measurer(measurer)
    steps = (["boxes"] if boxes is not None else []) + [s.name for s in measurer.stages]
    logger.info("steps: %s", ", ".join(steps))
    source = FolderSource(Path(argv[1]))
    n = min(len(source.folders), int(os.environ.get("N", len(source.folders))))

    lost: collections.Counter[str] = collections.Counter()
    total = found = 0
    for index in range(n):
        study = source.study(index)
        recorder = StageRecorder()
        if boxes is not None:
            seen = StageRecorder()
            boxes.measure(study.volume, source=study.name, trace=seen)
            recorder.after["boxes"] = seen.after["find"]
        result = measurer.measure(study.volume, source=study.name, trace=recorder)
        pairs = match_findings(study.findings, result.findings)
        matched = {i for i, _ in pairs}
        taken = {j for _, j in pairs}
        for i, truth in enumerate(study.findings):
            if truth.kind != "lesion" or (truth.long_axis_mm or 0) < RECALL_MIN_LONG_AXIS_MM:
                continue
            total += 1
            if i in matched:
                found += 1
                continue
            where = next((s for s in steps if not near(truth, recorder.after.get(s, []))), None)
            if where is None:
                where = "unmatched"
                detail = unmatched_detail(
                    truth, result.findings, taken, recorder.after.get("measure", [])
                )
            else:
                detail = ""
            lost[where] += 1
            contrast = getattr(truth, "contrast_hu", None)
            print(
                f"{study.name} lesion {truth.long_axis_mm or 0:.1f} x "
                f"{truth.short_axis_mm or 0:.1f} mm, cc {truth.cc_extent_mm or 0:.1f} mm"
                + ("" if contrast is None else f", contrast {contrast:+.0f} HU")
                + f": lost after {where}{detail}",
                flush=True,
            )
    print(
        f"found {found}/{total} in {n} studies; lost after: "
        + (", ".join(f"{k} {v}" for k, v in lost.most_common()) or "-")
    )


if __name__ == "__main__":
    main(sys.argv[1:])
