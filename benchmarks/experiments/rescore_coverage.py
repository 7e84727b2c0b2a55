"""Exploratory (issue 5): a checkpoint's calibrated ranges scored on saved benchmark pairs.

``bench_measurer.py --json`` keeps every matched measurement (name, value, truth, study). The
values do not depend on the calibration, so a recalibrated checkpoint's coverage on those sets
can be read without measuring again: this prints, per set and over all sets together, the
share of true values inside each measurement's range and the ranges' mean width.

Usage: python benchmarks/experiments/rescore_coverage.py CHECKPOINT EVAL.json [EVAL.json ...]
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model.measurer.checkpoint import load_checkpoint

calibration = load_checkpoint(sys.argv[1]).settings.calibration
if calibration is None:
    raise SystemExit(f"{sys.argv[1]} is not calibrated")
pooled: dict[str, list[int]] = defaultdict(lambda: [0, 0])
for path in sys.argv[2:]:
    pairs = json.loads(Path(path).read_text()).get("pairs")
    if pairs is None:
        raise SystemExit(f"{path} has no pairs: write it with bench_measurer.py --json")
    inside: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    width: dict[str, float] = defaultdict(float)
    for name, value, truth, _ in pairs:
        interval = calibration.interval(name, value)
        if interval is None:
            continue
        low, high = interval
        for table in (inside, pooled):
            table[name][0] += low <= truth <= high
            table[name][1] += 1
        width[name] += high - low
    print(
        path
        + ": "
        + ", ".join(
            f"{n} {k}/{t} = {k / t:.3f} (width {width[n] / t:.2f} mm)"
            for n, (k, t) in sorted(inside.items())
        )
    )
together = (f"{n} {k}/{t} = {k / t:.3f}" for n, (k, t) in sorted(pooled.items()))
print("together: " + ", ".join(together))
