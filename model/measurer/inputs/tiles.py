"""The find step's field: the whole reconstructed slice, in overlapping tiles.

The find task is trained on square images of ``FindInputs.size`` pixels at ``pixel_mm``
(280 mm for the demo model), while real fields of view are 350-500 mm. Rather than cropping
the middle of each slice (which leaves out the body wall, the flanks and both lungs' outer
parts of an adult), the slice is prepared whole and cut into tiles of the trained size that
overlap by at least ``overlap_px``, so that any finding up to that size lies wholly inside one
tile. Each tile is asked separately; boxes are moved back to the slice's pixels and a box that
lies mostly inside a larger box of the same kind from another tile (the same finding, cut by a
tile edge) is left out.

Pure Python; boxes are pixel edges ``(row0, col0, row1, col1)`` as in ``model.measurer.tasks.text``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from model.measurer.tasks.text import FoundFinding

__all__ = [
    "CONTAINED_FRACTION",
    "FIELD_EDGE_MM",
    "field_side",
    "merge_tiles",
    "offset_findings",
    "tile_starts",
]

FIELD_EDGE_MM = 5.0
"""The outermost margin of the reconstructed field that the find step leaves out (air or the
table, never a finding; a phantom's 288 mm field stays one 280 mm tile)."""

CONTAINED_FRACTION = 0.5
"""A box whose area lies at least this much inside a larger box of the same kind from another
tile is a piece of it."""


def field_side(extent_mm: float, pixel_mm: float, tile: int) -> int:
    """The prepared side (pixels) that holds a field of ``extent_mm``: at least one tile.
    (Tiles are cut from it, so it need not be a multiple of the vision tower's 28 pixels:
    rounding a 491 mm field up to 504 pixels would take a third tile per axis.)"""
    if not (math.isfinite(extent_mm) and extent_mm > 0 and pixel_mm > 0):
        raise ValueError(f"field extent and pixel size must be > 0, got {extent_mm}, {pixel_mm}")
    return max(tile, math.ceil(extent_mm / pixel_mm - 1e-6))


def tile_starts(side: int, tile: int, overlap: int) -> list[int]:
    """First pixels of the tiles covering ``[0, side)``: one when a tile covers it, else the
    fewest evenly spaced tiles whose neighbours overlap by at least ``overlap`` pixels."""
    if tile <= 0 or side <= 0:
        raise ValueError(f"side and tile must be > 0, got {side}, {tile}")
    if not 0 <= overlap < tile:
        raise ValueError(f"overlap must be in [0, {tile}), got {overlap}")
    if side <= tile:
        return [0]
    count = math.ceil((side - overlap) / (tile - overlap))
    step = (side - tile) / (count - 1)
    return [round(k * step) for k in range(count)]


def offset_findings(found: Sequence[FoundFinding], rows: int, columns: int) -> list[FoundFinding]:
    """Boxes of a tile moved to the pixels of the field (tile origin ``rows, columns``)."""
    return [
        FoundFinding(
            f.kind,
            f.slice_index,
            (f.box[0] + rows, f.box[1] + columns, f.box[2] + rows, f.box[3] + columns),
        )
        for f in found
    ]


def _area(box: tuple[float, float, float, float]) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def _inside(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    """The fraction of ``a``'s area inside ``b``."""
    rows = min(a[2], b[2]) - max(a[0], b[0])
    columns = min(a[3], b[3]) - max(a[1], b[1])
    area = _area(a)
    return 0.0 if rows <= 0 or columns <= 0 or area <= 0 else rows * columns / area


def merge_tiles(per_tile: Sequence[Sequence[FoundFinding]]) -> list[FoundFinding]:
    """One plane's boxes from all its tiles (already in field pixels): largest first, a box
    mostly inside a kept box of the same kind from another tile is left out (module doc)."""
    boxes = [(t, f) for t, found in enumerate(per_tile) for f in found]
    boxes.sort(key=lambda item: -_area(item[1].box))
    kept: list[tuple[int, FoundFinding]] = []
    for tile, finding in boxes:
        if any(
            other.kind is finding.kind
            and t != tile
            and _inside(finding.box, other.box) >= CONTAINED_FRACTION
            for t, other in kept
        ):
            continue
        kept.append((tile, finding))
    out = [f for _, f in kept]
    out.sort(key=lambda f: ((f.box[0] + f.box[2]) / 2, (f.box[1] + f.box[3]) / 2))
    return out
