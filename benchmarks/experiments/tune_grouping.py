"""Exploratory (issue 5): choose the find step's grouping rule on validation phantoms.

The model answers the find prompts of each study once; the per-plane boxes are then grouped with
each candidate rule (and confirmed with the point task or not), and scored with the phantom
spec's matching rule. Validation studies come from a run seed that is neither the training's
nor the evaluation's (use the calibration seed, 7001), so the held-out evaluation stays
untouched by the choice.

Usage: python benchmarks/experiments/tune_grouping.py CHECKPOINT N [SEED]
"""

import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model.measurer.evaluate import match_findings
from model.measurer.find import FindExample, plane_images, prepare_for_find
from model.measurer.grouping import GroupingRule, group_detections, plane_detections
from model.measurer.pipeline import CheckpointMeasurer
from model.measurer.pool import PhantomSource
from model.measurer.results import FindingKind, Measurement, MeasurementName, StudyFinding
from model.measurer.tasks import find_prompt, parse_find

torch.set_num_threads(1)
measurer = CheckpointMeasurer.load(sys.argv[1])
n = int(sys.argv[2])
source = PhantomSource(int(sys.argv[3]) if len(sys.argv) > 3 else 7001)
inputs = measurer.loaded.settings.find_inputs
cached = []
for i in range(n):
    study = source.study(i)
    prepared = prepare_for_find(study.volume, inputs)
    native = prepared.geometry.slice_spacing
    stride = max(1, round(measurer.options.find_plane_mm / native))
    planes = list(range(0, prepared.shape[0], stride))
    images = plane_images(prepared, inputs)
    examples = [FindExample(images[k], find_prompt(1), None) for k in planes]
    answers = []
    for start in range(0, len(examples), 64):
        for text in measurer._generate(examples[start : start + 64], 80):
            parsed = parse_find(text, num_images=1)
            answers.append(parsed.findings if parsed.success else ())
    detections = plane_detections(answers, planes, prepared.geometry)
    cached.append((study, detections, native * stride))
print(f"{n} studies answered", flush=True)


def as_findings(grouped):
    out = []
    for k, g in enumerate(grouped, start=1):
        names = (
            (MeasurementName.LONG_AXIS, MeasurementName.SHORT_AXIS)
            if g.kind is FindingKind.LESION
            else (MeasurementName.DIAMETER,)
        )
        out.append(
            StudyFinding(k, g.kind, g.center_lps_mm, 0, tuple(Measurement(m, 1.0) for m in names))
        )
    return out


for fraction, gap, verify in itertools.product((0.0, 0.3), (2,), (False, True)):
    rule = GroupingRule(max_plane_gap=gap, min_plane_fraction=fraction)
    lesions = found = false = 0
    for study, detections, spacing in cached:
        grouped = group_detections(detections, spacing, rule)
        if verify:
            grouped = measurer._verify(study.volume, grouped, [])
        reported = as_findings(grouped)
        pairs = match_findings(study.findings, reported)
        matched = {i for i, _ in pairs}
        for i, t in enumerate(study.findings):
            if t.kind == "lesion" and (t.long_axis_mm or 0) >= 10:
                lesions += 1
                found += i in matched
        false += len(reported) - len(pairs)
    print(
        f"min_plane_fraction {fraction:.1f} gap {gap} verify {verify}: lesion recall "
        f"{found / max(1, lesions):.3f} ({found}/{lesions}), false per study {false / n:.2f}",
        flush=True,
    )

# diagnostics: for every true lesion >= 10 mm, the nearest raw box centre (any kind) near its z
near_any = near_lesion = 0
distances = []
for study, detections, _spacing in cached:
    for t in study.findings:
        if t.kind != "lesion" or (t.long_axis_mm or 0) < 10:
            continue
        assert t.cc_extent_mm is not None
        best, best_lesion = 1e9, 1e9
        for d in detections:
            if abs(d.center_lps_mm[2] - t.center_lps_mm[2]) > t.cc_extent_mm / 2:
                continue
            dist = ((d.center_lps_mm[0] - t.center_lps_mm[0]) ** 2
                    + (d.center_lps_mm[1] - t.center_lps_mm[1]) ** 2) ** 0.5  # fmt: skip
            best = min(best, dist)
            if d.kind is FindingKind.LESION:
                best_lesion = min(best_lesion, dist)
        radius = max(10.0, t.long_axis_mm / 2)
        near_any += best <= radius
        near_lesion += best_lesion <= radius
        distances.append(round(best_lesion, 1))
print(
    f"lesions with a box of any kind within the radius on some plane: {near_any}; "
    f"of kind lesion: {near_lesion}; nearest lesion-box distances: {sorted(distances)}"
)
