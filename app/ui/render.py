"""Drawing a slice with its findings: windowing, zoom, and overlays placed in patient space.

Overlays come from stored findings (LPS mm) and are mapped into the displayed slice through the
volume's own geometry, so they land where the model measured whatever the orientation:

- lesion: the long and short axis as lines (when the model located its axes), their bounding
  box, the finding's number;
- vessel: the circle of the measured diameter around the centre of its located diameter (else
  the finding's centre), with its bounding box;
- a finding whose axes the model did not locate is drawn as a cross at its centre with its
  number: nothing is drawn that the model did not say.

A finding is drawn on the slice nearest its centre (its ``slice_index``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from ingestion.volume import Volume

__all__ = ["WINDOWS", "Overlay", "display_size", "pixel_of", "render_slice"]

WINDOWS: dict[str, tuple[float, float]] = {
    "soft tissue": (40.0, 400.0),
    "lung": (-600.0, 1500.0),
    "bone": (400.0, 1800.0),
}
"""Window presets (level, width) in HU."""

DISPLAY = 512  # pixels of the displayed image's longer side
COLOURS = {"lesion": (255, 200, 0), "vessel": (0, 200, 255), "selected": (255, 60, 60)}


@dataclass(frozen=True)
class Overlay:
    """One finding to draw."""

    number: int
    kind: str
    slice_index: int
    center_lps_mm: tuple[float, float, float]
    axes_lps_mm: tuple[tuple[tuple[float, float, float], ...], ...] | None
    diameter_mm: float | None = None  # vessels: the measured diameter
    selected: bool = False


def display_size(volume: Volume) -> tuple[int, int]:
    """(width, height) of the displayed image: the slice at its true aspect ratio."""
    _, rows, columns = volume.shape
    height_mm = rows * volume.geometry.row_spacing
    width_mm = columns * volume.geometry.column_spacing
    scale = DISPLAY / max(height_mm, width_mm)
    return max(1, round(width_mm * scale)), max(1, round(height_mm * scale))


def _view(volume: Volume, zoom: float) -> tuple[float, float, float, float]:
    """(row0, col0, rows, cols) of the shown region in voxel index units (centred zoom)."""
    _, rows, columns = volume.shape
    zoom = max(1.0, zoom)
    shown_r, shown_c = rows / zoom, columns / zoom
    return (rows - shown_r) / 2, (columns - shown_c) / 2, shown_r, shown_c


def pixel_of(volume: Volume, zoom: float, row: float, column: float) -> tuple[float, float]:
    """Voxel (row, column) -> displayed (x, y) pixel."""
    width, height = display_size(volume)
    r0, c0, shown_r, shown_c = _view(volume, zoom)
    return (column - c0 + 0.5) * width / shown_c, (row - r0 + 0.5) * height / shown_r


def index_of(volume: Volume, zoom: float, x: float, y: float) -> tuple[float, float]:
    """Displayed (x, y) pixel -> voxel (row, column): the inverse of :func:`pixel_of`."""
    width, height = display_size(volume)
    r0, c0, shown_r, shown_c = _view(volume, zoom)
    return y * shown_r / height + r0 - 0.5, x * shown_c / width + c0 - 0.5


def render_slice(
    volume: Volume,
    index: int,
    window: tuple[float, float],
    zoom: float = 1.0,
    overlays: Sequence[Overlay] = (),
) -> Image.Image:
    """Slice ``index`` windowed (level, width), zoomed about the centre, with overlays."""
    level, width = window
    plane = volume.voxels[int(index)]
    grey = np.clip((plane - (level - width / 2)) / width, 0.0, 1.0)
    r0, c0, shown_r, shown_c = _view(volume, zoom)
    top, left = math.floor(r0), math.floor(c0)
    bottom = min(plane.shape[0], math.ceil(r0 + shown_r))
    right = min(plane.shape[1], math.ceil(c0 + shown_c))
    crop = (grey[top:bottom, left:right] * 255).astype(np.uint8)
    image = (
        Image.fromarray(crop).convert("RGB").resize(display_size(volume), Image.Resampling.BILINEAR)
    )
    draw = ImageDraw.Draw(image)
    for overlay in overlays:
        if overlay.slice_index == index:
            _draw(draw, volume, zoom, overlay)
    return image


def _to_pixels(volume: Volume, zoom: float, point: Sequence[float]) -> tuple[float, float]:
    _, row, column = volume.geometry.lps_to_index(np.asarray(point, dtype=np.float64))
    return pixel_of(volume, zoom, float(row), float(column))


def _draw(draw: ImageDraw.ImageDraw, volume: Volume, zoom: float, overlay: Overlay) -> None:
    colour = COLOURS["selected"] if overlay.selected else COLOURS[overlay.kind]
    center = _to_pixels(volume, zoom, overlay.center_lps_mm)
    points: list[tuple[float, float]] = []
    if overlay.axes_lps_mm:
        for segment in overlay.axes_lps_mm:
            ends = [_to_pixels(volume, zoom, p) for p in segment]
            points += ends
            if overlay.kind == "lesion":
                draw.line(ends, fill=colour, width=2)
        if overlay.kind == "vessel":
            (a, b) = points[:2]
            center = ((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)
    if overlay.kind == "vessel" and overlay.diameter_mm:
        radius_x, radius_y = _radius_pixels(volume, zoom, overlay.diameter_mm / 2)
        box = [
            center[0] - radius_x,
            center[1] - radius_y,
            center[0] + radius_x,
            center[1] + radius_y,
        ]
        draw.ellipse(box, outline=colour, width=2)
        points += [(box[0], box[1]), (box[2], box[3])]
    if points:
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        draw.rectangle([min(xs) - 3, min(ys) - 3, max(xs) + 3, max(ys) + 3], outline=colour)
        label = (min(xs) - 3, min(ys) - 16)
    else:  # nothing located: a cross at the centre
        x, y = center
        draw.line([(x - 6, y), (x + 6, y)], fill=colour, width=2)
        draw.line([(x, y - 6), (x, y + 6)], fill=colour, width=2)
        label = (x + 6, y - 16)
    draw.text(label, str(overlay.number), fill=colour)


def _radius_pixels(volume: Volume, zoom: float, radius_mm: float) -> tuple[float, float]:
    width, height = display_size(volume)
    _, _, shown_r, shown_c = _view(volume, zoom)
    per_column = width / shown_c / volume.geometry.column_spacing
    per_row = height / shown_r / volume.geometry.row_spacing
    return radius_mm * per_column, radius_mm * per_row
