"""Exploratory (issue 5): lesions and vessels reported at one place, and what is true there.

For every lesion finding whose centre lies inside a vessel finding (the case in which
``model.measurer.consolidate`` drops the lesion as a piece of the vessel), prints what the
truth holds there (a true lesion or the true vessel within the match radius), the two
findings' planes (count and span in mm), the lesion's measured long axis, the median HU at the
lesion's centre, whether another vessel finding runs through the study elsewhere, and the
number of examined planes. The facts to tell a lesion seen as a vessel from a piece of vessel
seen as a lesion.

Usage: python benchmarks/experiments/lesion_vessel_twins.py CHECKPOINT DATA [THREADS]
"""

import math
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model.measurer import pipeline
from model.measurer.pipeline import CheckpointMeasurer
from model.measurer.pool import FolderSource
from model.measurer.results import FindingKind

torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
measurer = CheckpointMeasurer.load(sys.argv[1])
source = FolderSource(Path(sys.argv[2]))
_consolidate = pipeline.consolidate
state: dict[str, Any] = {}


def _axial(a: Any, b: Any) -> float:
    return math.dist(a.center_lps_mm[:2], b.center_lps_mm[:2])


def consolidate(findings, outcomes, examined, hu, vessel_min_hu, axes):  # type: ignore[no-untyped-def]
    keep = _consolidate(findings, outcomes, examined, hu, vessel_min_hu, axes)
    spacing = state["spacing"]
    truth = state["truth"]
    for i, lesion in enumerate(findings):
        if lesion.kind is not FindingKind.LESION:
            continue
        for k, vessel in enumerate(findings):
            if vessel.kind is not FindingKind.VESSEL:
                continue
            diameter = outcomes[k].measurements[0].value_mm or vessel.size_mm
            if _axial(lesion, vessel) >= 0.5 * diameter:
                continue
            there = [
                t.kind
                for t in truth
                if math.dist(t.center_lps_mm[:2], lesion.center_lps_mm[:2])
                <= max(10.0, (t.long_axis_mm or t.diameter_mm or 0) / 2)
            ]
            others = [
                v
                for v in findings
                if v.kind is FindingKind.VESSEL
                and _axial(v, vessel) > 0.5 * diameter
                and 2 * len(v.planes) >= examined
            ]
            long = outcomes[i].measurements[0].value_mm or lesion.size_mm
            print(
                f"{state['name']}: truth {there}; vessel planes {len(vessel.planes)} span "
                f"{(vessel.planes[-1] - vessel.planes[0] + 1) * spacing:.0f} mm d {diameter:.0f}; "
                f"lesion planes {len(lesion.planes)} span "
                f"{(lesion.planes[-1] - lesion.planes[0] + 1) * spacing:.0f} mm long {long:.0f}; "
                f"hu {hu[i]:.0f}; other vessel {len(others)}; examined {examined}; "
                f"kept lesion {i in keep} vessel {k in keep}"
            )
    return keep


_group = pipeline.group_detections


def group(found: Any, spacing: float, rule: Any = None) -> Any:
    state["spacing"] = spacing
    return _group(found, spacing, rule)


pipeline.consolidate = consolidate
pipeline.group_detections = group
for index in range(len(source.folders)):
    study = source.study(index)
    state.update(name=study.name, truth=study.findings)
    measurer.measure(study.volume, source=study.name)
