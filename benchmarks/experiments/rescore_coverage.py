"""Exploratory (issue 5): a checkpoint's calibrated ranges scored on saved benchmark pairs.

``bench_measurer.py --json`` keeps every matched measurement (name, value, truth, study). The
values do not depend on the calibration, so a recalibrated checkpoint's coverage on those sets
can be read without measuring again: this prints, per set and over all sets together, the
share of true values inside each measurement's range and the ranges' mean width.

It also says how far one set's coverage scatters by chance: studies are drawn with replacement
from all sets together (a study's findings stay together, since errors within a study are
related) into sets as large as the given ones, 2,000 times; printed are the standard deviation
of their coverage and the share of them inside 0.88-0.92.

Usage: python benchmarks/experiments/rescore_coverage.py CHECKPOINT EVAL.json [EVAL.json ...]
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model.measurer.checkpoint.weights import load_checkpoint

calibration = load_checkpoint(sys.argv[1]).settings.calibration
if calibration is None:
    raise SystemExit(f"{sys.argv[1]} is not calibrated")
pooled: dict[str, list[int]] = defaultdict(lambda: [0, 0])
# per (set, study): per name [inside, total], for the bootstrap
Counts = dict[str, list[int]]
studies: dict[tuple[str, str], Counts] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
set_sizes: list[int] = []
for path in sys.argv[2:]:
    data = json.loads(Path(path).read_text())
    pairs = data.get("pairs")
    if pairs is None:
        raise SystemExit(f"{path} has no pairs: write it with bench_measurer.py --json")
    set_sizes.append(int(data["studies"]))
    inside: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    width: dict[str, float] = defaultdict(float)
    for name, value, truth, study in pairs:
        interval = calibration.interval(name, value)
        if interval is None:
            continue
        low, high = interval
        for table in (inside, pooled, studies[(path, study)]):
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

# Studies without a matched measurement add nothing to either count; they are left out of the
# draw, so a drawn set holds as many measured studies as the sets do on average.
keys = list(studies)
size = round(np.mean(set_sizes) * len(keys) / sum(set_sizes))
rng = np.random.default_rng(0)
for name in sorted(pooled):
    counts = np.array([studies[k].get(name, [0, 0]) for k in keys])
    draws = rng.integers(0, len(keys), size=(2000, size))
    cover = counts[draws, 0].sum(axis=1) / np.maximum(counts[draws, 1].sum(axis=1), 1)
    band = float(np.mean((cover >= 0.88) & (cover <= 0.92)))
    print(
        f"one set of {size} measured studies, {name}: coverage sd {cover.std():.3f}, "
        f"inside 0.88-0.92 in {band:.0%} of draws"
    )
