"""Shifted find passes and their vote: boxes that do not hang on where the token grid falls.

A find step's box is read off merged vision tokens (``images.SIDE_MULTIPLE`` pixels a side). A
small model sometimes puts a box exactly one token off (right size, right place inside the
token, wrong token), and whether it does depends on how the finding lies on the token grid.
So the plane is asked several times, its content shifted by a fraction of a token each time
(:attr:`FindVoting.shifts`; the coordinate frame of the find image stays put, so the answers are
in the shifted image's pixels), every answer's boxes are shifted back, and a box is kept where
at least :attr:`FindVoting.votes` passes agree on it (:func:`vote_boxes`): same kind, centres
within :func:`agreement_reach` of each other, which is less than half a token so that a box
one token off never agrees with the right one. A kept box is the median of the agreeing ones.

Shifting moves the content by whole pixels and fills the uncovered border with 0 (air in both
find windows); what is shifted out of the image is lost to that pass only.

Pure torch/NumPy; boxes are ``(row0, col0, row1, col1)`` pixel edges of the find image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from model.measurer.inputs.settings import SIDE_MULTIPLE, FindVoting
from model.measurer.tasks.text import FoundFinding

__all__ = [
    "FindVoting",
    "agreement_reach",
    "shift_planes",
    "unshift_findings",
    "vote_boxes",
]

_Box = tuple[float, float, float, float]


def shift_planes(windows: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """(S, C, H, W) planes with their content moved ``rows`` down and ``columns`` right (either
    may be negative); uncovered pixels are 0."""
    if rows == 0 and columns == 0:
        return windows
    height, width = int(windows.shape[-2]), int(windows.shape[-1])
    out = torch.zeros_like(windows)
    if abs(rows) < height and abs(columns) < width:
        out[
            ..., max(0, rows) : height + min(0, rows), max(0, columns) : width + min(0, columns)
        ] = windows[
            ..., max(0, -rows) : height - max(0, rows), max(0, -columns) : width - max(0, columns)
        ]
    return out


def unshift_findings(found: Sequence[FoundFinding], rows: int, columns: int) -> list[FoundFinding]:
    """Boxes of a pass shifted by (rows, columns) back in the unshifted image's pixels; a box
    wholly shifted out of the image (nothing left at or after pixel 0) is dropped."""
    out = []
    for finding in found:
        row0, col0, row1, col1 = finding.box
        box = (max(0.0, row0 - rows), max(0.0, col0 - columns), row1 - rows, col1 - columns)
        if box[0] < box[2] and box[1] < box[3]:
            out.append(FoundFinding(finding.kind, finding.slice_index, box))
    return out


def agreement_reach(box: _Box) -> float:
    """How far (pixels) two boxes' centres may lie apart and still agree: a quarter of the
    smaller side, at least 4 pixels and under half a merged token."""
    side = min(box[2] - box[0], box[3] - box[1])
    return min(max(4.0, 0.25 * side), SIDE_MULTIPLE / 2 - 4)


def _centre(box: _Box) -> tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def is_alias(a: _Box, b: _Box, slack: float = 8.0) -> bool:
    """Whether box ``a`` is ``b`` one merged token off: sides within 25 %, centres apart by
    0 or one token (``SIDE_MULTIPLE`` +- ``slack`` pixels) along each axis, not both 0."""
    for k in (0, 1):
        sa, sb = a[k + 2] - a[k], b[k + 2] - b[k]
        if abs(sa - sb) > 0.25 * max(sa, sb):
            return False
    offsets = [abs(p - q) for p, q in zip(_centre(a), _centre(b), strict=True)]
    whole = [d <= slack for d in offsets]
    token = [abs(d - SIDE_MULTIPLE) <= slack for d in offsets]
    return all(w or t for w, t in zip(whole, token, strict=True)) and any(token)


def vote_boxes(
    passes: Sequence[Sequence[FoundFinding]], votes: int, *, keep_unaliased: bool = False
) -> list[FoundFinding]:
    """The boxes of one plane that at least ``votes`` passes agree on (module doc), in reading
    order of their centres.

    Greedy: each box counts the passes with an agreeing box; boxes are taken in order of that
    count (then pass order), each gathering the nearest agreeing unused box of every other
    pass; a group with at least ``votes`` members becomes the median of its boxes.
    """
    boxes = [(p, f) for p, found in enumerate(passes) for f in found]
    support = []
    for p, f in boxes:
        reach = agreement_reach(f.box)
        cy, cx = _centre(f.box)
        others = {
            q
            for q, g in boxes
            if q != p and g.kind is f.kind and math.dist((cy, cx), _centre(g.box)) <= reach
        }
        support.append(len(others) + 1)
    order = sorted(range(len(boxes)), key=lambda i: (-support[i], boxes[i][0]))
    used: set[int] = set()
    out: list[FoundFinding] = []
    for i in order:
        if i in used:
            continue
        p, f = boxes[i]
        reach = agreement_reach(f.box)
        centre = _centre(f.box)
        members = [i]
        for q in range(len(passes)):
            if q == p:
                continue
            near = [
                (math.dist(centre, _centre(g.box)), j)
                for j, (r, g) in enumerate(boxes)
                if r == q and j not in used and g.kind is f.kind
            ]
            near = [(d, j) for d, j in near if d <= reach]
            if near:
                members.append(min(near)[1])
        r0, c0, r1, c1 = (float(v) for v in np.median([boxes[j][1].box for j in members], axis=0))
        box = FoundFinding(f.kind, f.slice_index, (r0, c0, r1, c1))
        if len(members) < votes and not (
            keep_unaliased and not any(k.kind is box.kind and is_alias(box.box, k.box) for k in out)
        ):
            continue
        used.update(members)
        out.append(box)
    out.sort(key=lambda f: _centre(f.box))
    return out
