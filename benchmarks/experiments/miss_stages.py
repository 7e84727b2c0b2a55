"""Exploratory (issue 5): at which step of the pipeline each missed lesion (>= 10 mm) is lost.

Runs a checkpoint over the studies under DATA with the pipeline's steps recorded and, for every
true lesion >= 10 mm that the final result does not match (``evaluate.match_findings``), names
the first step after which nothing of it is left: a finding of any kind within the match radius
in the axial plane and within the lesion's cranio-caudal half-extent (at least 5 mm) along z.

Steps: ``raw`` (a box in any shifted find pass), ``voted`` (kept by the vote), ``grouped``
(a 3-D finding), ``verified`` (the point task saw a finding there), ``measured`` (centre after
re-centring and the best-plane move), ``final`` (after the air and consolidation rules; a match
here of the wrong kind is reported as ``kind``). Each lost lesion also says what the contrast
proposals did there: ``no proposal``, ``proposal covered`` (a find candidate was near, so it was
not asked), ``proposal declined`` (the point task answered none or malformed) or ``proposal
kept`` (kept, then lost at a later step).

Usage: python benchmarks/experiments/miss_stages.py CHECKPOINT DATA [THREADS]
"""

import collections
import math
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model.measurer import pipeline
from model.measurer.evaluate import RECALL_MIN_LONG_AXIS_MM, match_findings
from model.measurer.pipeline import CheckpointMeasurer
from model.measurer.pool import FolderSource

torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
measurer = CheckpointMeasurer.load(sys.argv[1])
source = FolderSource(Path(sys.argv[2]))

record: dict[str, Any] = {}
_unshift, _plane_detections, _group = (
    pipeline.unshift_findings,
    pipeline.plane_detections,
    pipeline.group_detections,
)


def unshift(found: Any, rows: int, columns: int) -> Any:
    out = _unshift(found, rows, columns)
    record.setdefault("unshifted", []).append(out)
    return out


def detections(voted: Any, planes: Any, geometry: Any) -> Any:
    out = _plane_detections(voted, planes, geometry)
    flat = record.get("unshifted", [])
    raw = [
        d
        for p in range(0, len(flat), len(planes))
        for d in _plane_detections(flat[p : p + len(planes)], planes, geometry)
    ]
    record["raw"], record["voted"] = raw, out
    return out


def group(found: Any, spacing: float, rule: Any = None) -> Any:
    out = _group(found, spacing, rule)
    record["grouped"] = out
    return out


pipeline.unshift_findings = unshift
pipeline.plane_detections = detections
pipeline.group_detections = group
for step in ("_find", "_decide_proposals", "_verify", "_measure"):
    original = getattr(measurer, step)

    def wrapped(*args: Any, _original: Any = original, _step: str = step) -> Any:
        out = _original(*args)
        if _step == "_find":
            record["proposals"] = out[3]
        elif _step == "_decide_proposals":
            record["asked"], record["kept"] = args[1], out
        else:
            record[_step] = out[0] if _step == "_measure" else out
        return out

    setattr(measurer, step, wrapped)


def near(truth: Any, items: Any) -> list[Any]:
    reach = max(10.0, truth.long_axis_mm / 2)
    z_reach = max(5.0, (truth.cc_extent_mm or 0.0) / 2)
    return [
        f
        for f in items
        if math.hypot(
            f.center_lps_mm[0] - truth.center_lps_mm[0], f.center_lps_mm[1] - truth.center_lps_mm[1]
        )
        <= reach
        and abs(f.center_lps_mm[2] - truth.center_lps_mm[2]) <= z_reach
    ]


stages = ("raw", "voted", "grouped", "_verify", "_measure")
lost: collections.Counter[str] = collections.Counter()
total = found = 0
for index in range(len(source.folders)):
    study = source.study(index)
    record.clear()
    result = measurer.measure(study.volume, source=study.name)
    matched = {i for i, _ in match_findings(study.findings, result.findings)}
    for i, truth in enumerate(study.findings):
        if truth.kind != "lesion" or (truth.long_axis_mm or 0) < RECALL_MIN_LONG_AXIS_MM:
            continue
        total += 1
        if i in matched:
            found += 1
            continue
        where = next((s for s in stages if not near(truth, record.get(s, []))), None)
        if where is None:
            final = near(truth, result.findings)
            where = "kind" if final else "final"
            others = {j for _, j in match_findings(study.findings, result.findings)}
            where += "".join(
                f" [{f.kind.value} at {math.dist(f.center_lps_mm[:2], truth.center_lps_mm[:2]):.0f}"
                f" mm{', matched elsewhere' if result.findings.index(f) in others else ''}]"
                for f in final
            )
            before = near(truth, record["_measure"])
            where += " measured as " + ",".join(g.kind.value for g in before)
        lost[where] += 1
        proposal = next(
            (
                label
                for label, key in (
                    ("proposal kept", "kept"),
                    ("proposal declined", "asked"),
                    ("proposal covered", "proposals"),
                )
                if near(truth, record.get(key, []))
            ),
            "no proposal",
        )
        where += f" ({proposal})"
        print(
            f"{study.name} lesion {truth.long_axis_mm:.1f} x {truth.short_axis_mm:.1f} mm, "
            f"cc {truth.cc_extent_mm:.1f} mm, contrast {truth.contrast_hu:+.0f} HU: lost at {where}"
        )
print(f"found {found}/{total}; lost after: " + ", ".join(f"{k} {v}" for k, v in lost.items()))
