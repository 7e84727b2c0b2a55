"""Exploratory (issue 5): contrast proposals alone (no model) on validation phantoms.

For the studies under DATA, prepares each as the checkpoint's find step does (planes about
``find_plane_mm`` = 2 mm apart), makes the contrast proposals (``model.measurer.proposals``)
and prints every lesion >= 10 mm that no proposal lies on (within the spec's match radius and
the lesion's cranio-caudal half-extent) and every proposal that lies on no true finding, then
the totals and the proposals' time per study. ``RULE`` (environment, JSON) sets
``ProposalRule`` fields, e.g. ``RULE='{"min_contrast_hu": 15}'``.

Usage: python benchmarks/experiments/proposal_coverage.py CHECKPOINT DATA
"""

import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model.measurer.checkpoint import load_checkpoint
from model.measurer.find import prepare_for_find
from model.measurer.pool import FolderSource
from model.measurer.proposals import ProposalRule, contrast_proposals, window_to_hu

rule = ProposalRule(**json.loads(os.environ.get("RULE", "{}")))
inputs = load_checkpoint(sys.argv[1]).settings.find_inputs
source = FolderSource(Path(sys.argv[2]))
lesions = covered = made = off = 0
seconds = 0.0
for index in range(len(source.folders)):
    study = source.study(index)
    prepared = prepare_for_find(study.volume, inputs)
    stride = max(1, round(2.0 / prepared.geometry.slice_spacing))
    planes = list(range(0, prepared.shape[0], stride))
    start = time.perf_counter()
    hu = window_to_hu(prepared.image[1, planes].numpy(), inputs.wide_window)
    found = contrast_proposals(hu, inputs.pixel_mm, rule)
    seconds += time.perf_counter() - start
    centres = [prepared.index_to_lps([planes[p.plane], p.row, p.column]) for p in found]
    made += len(found)
    on_truth: set[int] = set()
    for truth in study.findings:
        size = truth.long_axis_mm or truth.diameter_mm or 0.0
        z_reach = max(5.0, (truth.cc_extent_mm or 0.0) / 2)
        near = {
            k
            for k, c in enumerate(centres)
            if math.dist(c[:2], truth.center_lps_mm[:2]) <= max(10.0, size / 2)
            and (truth.kind == "vessel" or abs(c[2] - truth.center_lps_mm[2]) <= z_reach)
        }
        on_truth |= near
        if truth.kind == "lesion" and size >= 10.0:
            lesions += 1
            covered += bool(near)
            if not near:
                print(f"{study.name}: lesion {size:.1f} mm, {truth.contrast_hu:+.0f} HU: none")
    for k in sorted(set(range(len(found))) - on_truth):
        off += 1
        p = found[k]
        print(f"{study.name}: proposal {p.size_mm:.0f} mm, {p.contrast_hu:+.0f} HU on no finding")
print(
    f"lesions >= 10 mm with a proposal {covered}/{lesions}; {made} proposals "
    f"({made / len(source.folders):.2f} per study), {off} on no finding; "
    f"{1000 * seconds / len(source.folders):.0f} ms per study"
)
