"""Exploratory (issue 5): a checkpoint on validation phantoms, lesion recall by size.

Prints lesion recall (>= 10 mm, and by long axis 10-20 / 20-30 / >= 30 mm), false findings per
study, vessel recall, MAE, the 90th percentile of the absolute errors and how many are over
10 mm, and seconds per study, for the studies under DATA (written with
``radcaliper phantoms`` or ``ingestion.phantoms.write_phantoms``; use run seeds that are neither
training, calibration nor evaluation seeds, e.g. 5555 and 6666).

Environment:

``OPTS`` (JSON)
    ``InferenceOptions`` fields: ``find_plane_mm``, ``find_batch``, ``measure_batch``,
    ``find_voting`` (``{"shifts": [[r, c], ...], "votes": k, "keep_unaliased": b}``),
    ``find_overlap_mm``, ``find_edge_mm``, ``lesion_planes``, ``grouping`` (``GroupingRule``
    fields), e.g. ``OPTS='{"find_voting": {"shifts": [[0, 0], [14, 14]], "votes": 2}}'``.
``STAGES``
    Comma-separated stage names (``model.measurer.infer.stages.stages_named``), run in that order
    instead of the checkpoint's ``default_stages``: an ablation leaves stages out, e.g.
    ``STAGES=find,recentre,merge,measure,axes,dedupe,calibrate`` (no ``verify``).

Usage: python benchmarks/experiments/validate_measurer.py CHECKPOINT DATA [THREADS]
"""

import dataclasses
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model.measurer.data.sources import FolderSource
from model.measurer.evaluate.scoring import evaluate, summarize
from model.measurer.infer.grouping import GroupingRule
from model.measurer.infer.pipeline import CheckpointMeasurer, InferenceOptions
from model.measurer.infer.stages import stages_named
from model.measurer.inputs.voting import FindVoting

torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
fields = json.loads(os.environ.get("OPTS", "{}"))
unknown = set(fields) - {f.name for f in dataclasses.fields(InferenceOptions)}
if unknown:
    raise SystemExit(
        f"OPTS names {sorted(unknown)}, which InferenceOptions does not have; its fields: "
        + ", ".join(f.name for f in dataclasses.fields(InferenceOptions))
    )
if "find_voting" in fields:
    fields["find_voting"] = FindVoting.from_json(fields["find_voting"])
if "grouping" in fields:
    fields["grouping"] = GroupingRule(**fields["grouping"])
options = InferenceOptions(**fields)
names = [n.strip() for n in os.environ.get("STAGES", "").split(",") if n.strip()]
try:
    stages = stages_named(names) if names else None
except ValueError as error:
    raise SystemExit(f"STAGES={os.environ['STAGES']!r}: {error}") from error
measurer = CheckpointMeasurer.load(sys.argv[1], options=options, stages=stages)
source = FolderSource(Path(sys.argv[2]))
evaluation = evaluate(measurer, (source.study(i) for i in range(len(source.folders))))
e = summarize(evaluation.outcomes)
bins = {"10-20": [0, 0], "20-30": [0, 0], ">=30": [0, 0]}
for outcome in evaluation.outcomes:
    found = {t for t, _ in outcome.matches}
    for i, truth in enumerate(outcome.truth):
        size = truth.long_axis_mm or 0.0
        if truth.kind == "lesion" and size >= 10:
            key = "10-20" if size < 20 else "20-30" if size < 30 else ">=30"
            bins[key][0] += 1
            bins[key][1] += i in found
print(
    f"{sys.argv[1]} on {sys.argv[2]} {os.environ.get('OPTS', '')} stages "
    f"{','.join(s.name for s in measurer.stages)}: lesion recall "
    f"{e.lesions_10mm_found}/{e.lesions_10mm} = {e.lesion_recall:.3f} ("
    + ", ".join(f"{k} mm {v[1]}/{v[0]}" for k, v in bins.items())
    + f"); false {e.false_per_study:.3f} per study; vessels {e.vessels_found}/{e.vessels} = "
    f"{e.vessel_recall:.3f}; MAE "
    + " / ".join(f"{k} {v:.2f}" for k, v in sorted(e.mae_mm.items()))
    + f" mm; {e.seconds_median:.2f} s per study; {e.malformed_find_answers} malformed find answers"
)
errors: dict[str, list[float]] = defaultdict(list)
for outcome in evaluation.outcomes:
    for m in outcome.measurements:
        if m.value_mm is not None:
            errors[m.name.value].append(abs(m.value_mm - m.true_mm))
print(
    "absolute errors: "
    + ", ".join(
        f"{name} q90 {np.quantile(v, 0.9):.2f} mm, {sum(e > 10 for e in v)} over 10 mm"
        for name, v in sorted(errors.items())
    )
)
