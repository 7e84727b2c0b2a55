"""How well can ANY method measure a thin lesion's long axis from its mask? (issue 22)

For a centre-sampled ellipse (a pixel is inside when its centre is), every ellipse that puts
every pixel centre of the grid on the same side gives the same mask. This script finds, for
random ellipses, the largest and the smallest semi-major axis among those ellipses (SLSQP from
the true ellipse, one constraint per pixel next to the edge, the result checked against every
pixel of the grid). The long axis of such a mask is known only to within ``2 (a_max - a_min)``:
whatever one value a method returns, some ellipse with that very mask is at least
``a_max - a_min`` pixels away. Where that exceeds 0.5 px, "within half a pixel of the analytic
value on every rasterised ellipse" cannot be met by any method.

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/experiments/recist_feasible.py [--seed 2] [--n 25]

Measured 2026-11-27 (25 ellipses per band of the semi-minor axis b, the semi-major uniform in
[max(b, 15), 60] px, 1 px spacing), ``a_max - a_min`` median / max and the share of masks above
0.5 px, seed 1 | seed 2: b in [3, 5) 0.614 / 0.807, 68 % | 0.477 / 0.803, 44 %; b in [5, 8)
0.313 / 0.607, 8 % | 0.288 / 0.452, 0 %; b in [8, 12) 0.210 / 0.312, 0 % | 0.205 / 0.442, 0 %.
The local optimiser can only miss wider extremes, so these are lower bounds.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import numpy.typing as npt
from scipy import ndimage
from scipy.optimize import minimize

Points = npt.NDArray[np.float64]


def level(params: npt.ArrayLike, points: Points) -> Points:
    """The ellipse's implicit function at ``points`` (<= 1 inside); params: cx, cy, a, b, angle."""
    cx, cy, a, b, angle = (float(v) for v in np.asarray(params))
    dx, dy = points[:, 0] - cx, points[:, 1] - cy
    c, s = math.cos(angle), math.sin(angle)
    u, v = (dx * c + dy * s) / a, (-dx * s + dy * c) / b
    return np.asarray(u * u + v * v, dtype=np.float64)


def semi_major_range(a: float, b: float, angle: float, cx: float, cy: float) -> float | None:
    """``a_max - a_min`` over the ellipses giving the same mask (None: the optimiser failed)."""
    n = int(a + 6)
    rows, cols = np.mgrid[-n : n + 1, -n : n + 1]
    points = np.column_stack([rows.ravel(), cols.ravel()]).astype(np.float64)
    inside = level((cx, cy, a, b, angle), points) <= 1.0
    grid = inside.reshape(rows.shape)
    ring = np.ones((3, 3), dtype=bool)
    edge_in = (grid & ~ndimage.binary_erosion(grid, ring, border_value=0)).ravel()
    edge_out = (~grid & ndimage.binary_dilation(grid, ring)).ravel()
    p_in, p_out = points[edge_in], points[edge_out]
    constraints = [
        {"type": "ineq", "fun": lambda p: 1.0 - level(p, p_in)},
        {"type": "ineq", "fun": lambda p: level(p, p_out) - 1.0 - 1e-9},
    ]
    start = np.array([cx, cy, a, b, angle])
    extremes = []
    for sign in (1.0, -1.0):
        found = minimize(
            lambda p, s=sign: -s * p[2],
            start,
            constraints=constraints,
            method="SLSQP",
            options={"maxiter": 500, "ftol": 1e-10},
        )
        every = level(found.x, points)
        if not (np.all(every[inside] <= 1 + 1e-6) and np.all(every[~inside] >= 1 - 1e-6)):
            return None
        extremes.append(float(found.x[2]))
    return extremes[0] - extremes[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--n", type=int, default=25, help="Ellipses per band.")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    for low, high in ((3.0, 5.0), (5.0, 8.0), (8.0, 12.0)):
        widths = []
        for _ in range(args.n):
            b = rng.uniform(low, high)
            a = rng.uniform(max(b, 15.0), 60.0)
            cx, cy = rng.uniform(-0.5, 0.5, 2)
            width = semi_major_range(a, b, rng.uniform(0.0, math.pi), cx, cy)
            if width is not None:
                widths.append(width)
        values = np.array(widths)
        print(
            f"b in [{low:g}, {high:g}): {len(values)} masks; a_max - a_min median "
            f"{np.median(values):.3f} px, max {values.max():.3f} px; share above 0.5 px "
            f"{np.mean(values > 0.5):.2f}"
        )


if __name__ == "__main__":
    main()
