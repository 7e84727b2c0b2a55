"""Model inputs for the find task: one prompt per prepared axial plane, boxes as answers.

A study is prepared once (``ingestion.prepare``, MONAI) at :attr:`FindInputs.pixel_mm` with its
native slice spacing; every prepared plane becomes one find prompt with one image, and the
answer lists the findings visible on that plane (``model.measurer.tasks.text``, one-image form:
``lesion box [row0, col0, row1, col1] ; ... ; end`` or ``none``).
:mod:`model.measurer.infer.grouping` joins the per-plane boxes into findings in 3-D.

The image is one two-frame image (Qwen2.5-VL's temporal patch holds two frames, so the token
count is that of a still image):

- frame 0, the content: ``(soft, 1 - soft, wide)`` with ``soft`` the plane in a narrow
  soft-tissue window and ``wide`` in a wide one, so that flat regions of different HU point in
  different directions after the bias-free patch embedding (see ``images.contrast_channels``) and
  a hyperdense lesion is told from a contrast-filled vessel;
- frame 1, the coordinates: ``(row / (H - 1), column / (W - 1), 0.5)`` (CoordConv). Qwen's
  vision tower has only relative (rotary) positions, so a tower trained from scratch cannot
  otherwise tell where in the image a patch lies, which a box needs.

3-D context (:attr:`FindInputs.context_mm` > 0): the image gets a second temporal patch, frames
2 and 3 the content of the prepared planes nearest to ``context_mm`` below and above (the
volume's end plane where there is none), so the model sees whether a structure runs on through
the slices (a vessel) or ends within a few (a lesion). Qwen2.5-VL's vision tower and the
Circle-RoPE positions handle ``t = 2`` as they handle a video's; the image has twice the
tokens. A plane with its context is carried as one (6, H, W) tensor of windows: (soft, wide) of
the plane, of the one below and of the one above, so shifting and tiling treat them as one.

Labels (training): a lesion is listed on a plane when the plane's slab (its centre +- half the
slice spacing) cuts the ellipsoid in a cross-section at least :data:`VISIBLE_FRACTION` of the
central one; its box is that cross-section's bounding box. A vessel is listed on every plane.
Boxes are in pixels of the plane with pixel ``i`` covering ``[i, i + 1)`` (edges), findings in
reading order of their box centres (row, then column).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from model.measurer.inputs.images import two_window_channels
from model.measurer.inputs.settings import FindInputs
from model.measurer.inputs.tiles import FIELD_EDGE_MM, field_side
from model.measurer.inputs.voting import shift_planes
from model.measurer.results import FindingKind
from model.measurer.tasks.text import FoundFinding, find_answer, find_kinds, find_prompt

if TYPE_CHECKING:
    from ingestion.dataset.format import TrueFinding
    from ingestion.prepare import PreparedVolume
    from ingestion.volume import Volume

__all__ = [
    "VISIBLE_FRACTION",
    "FindExample",
    "FindInputs",
    "FindPlane",
    "field_extent_mm",
    "find_frames",
    "find_planes",
    "plane_images",
    "plane_labels",
    "prepare_find_field",
    "with_context",
]

VISIBLE_FRACTION = 0.6
"""A lesion is labelled on a plane whose cross-section is at least this fraction of its
central one (linear size)."""


@dataclass(frozen=True)
class FindExample:
    """One plane's image and texts; ``answer`` is None at inference."""

    images: torch.Tensor  # (F, 3, H, W) float32 in [0, 1]: one image of F = 2 or 4 frames
    prompt: str
    answer: str | None


def field_extent_mm(volume: Volume) -> float:
    """The larger in-plane (x, y) extent of the volume's reconstructed field in mm (from the
    LPS corners of its voxels, one pixel included: exact for any orientation)."""
    shape = volume.shape
    corners = np.array(
        [
            [k, r, c]
            for k in (0, shape[0] - 1)
            for r in (0, shape[1] - 1)
            for c in (0, shape[2] - 1)
        ],
        dtype=np.float64,
    )
    lps = np.array([volume.geometry.index_to_lps(corner) for corner in corners])
    spacing = volume.geometry.spacing
    pixel = max(spacing[1], spacing[2])
    return float(max(np.ptp(lps[:, 0]), np.ptp(lps[:, 1]))) + pixel


def prepare_find_field(
    volume: Volume, inputs: FindInputs, *, stride: int = 1, edge_mm: float = FIELD_EDGE_MM
) -> PreparedVolume:
    """Every ``stride``-th native plane prepared for the find step over the whole field of
    view (less ``edge_mm`` on each side), square and at least one tile
    (``model.measurer.inputs.tiles``)."""
    from ingestion.prepare import PrepareConfig, prepare_volume

    extent = max(inputs.size * inputs.pixel_mm, field_extent_mm(volume) - 2.0 * edge_mm)
    side = field_side(extent, inputs.pixel_mm, inputs.size)
    config = PrepareConfig(
        pixel_mm=inputs.pixel_mm,
        size=(side, side),
        windows=(inputs.soft_window, inputs.wide_window),
        slice_stride=stride,
    )
    return prepare_volume(volume, config)


def plane_images(prepared: PreparedVolume, inputs: FindInputs) -> torch.Tensor:
    """(S, F, 3, H, W) float32: every prepared plane as a find image (F = 2, or 4 with
    context)."""
    if prepared.image.shape[0] != 2:
        raise ValueError(
            f"a find volume has 2 windows (soft, wide), got {prepared.image.shape[0]}; "
            "prepare it with prepare_find_field"
        )
    planes = prepared.image.transpose(0, 1)  # (S, 2, H, W)
    spacing = prepared.geometry.slice_spacing
    return find_frames(with_context(planes, inputs.context_planes(spacing)), inputs)


def with_context(planes: torch.Tensor, offset: int) -> torch.Tensor:
    """(S, 2, H, W) consecutive planes -> (S, 6, H, W): each plane's windows, then those of
    the plane ``offset`` below and ``offset`` above it (clamped to the first and last plane).
    ``offset`` 0: the planes unchanged."""
    if offset < 0:
        raise ValueError(f"offset must be >= 0 planes, got {offset}")
    if offset == 0:
        return planes
    index = torch.arange(planes.shape[0])
    below = planes[(index - offset).clamp(min=0)]
    above = planes[(index + offset).clamp(max=planes.shape[0] - 1)]
    return torch.cat((planes, below, above), dim=1)


def _content(windows: torch.Tensor) -> torch.Tensor:
    """(S, 2, H, W) (soft, wide) -> (S, 3, H, W) ``(soft, 1 - soft, wide)``."""
    return two_window_channels(windows)


def find_frames(windows: torch.Tensor, inputs: FindInputs) -> torch.Tensor:
    """(S, C, H, W) planes in the (soft, wide) windows, C = ``inputs.windows`` (with their
    context planes, :func:`with_context`) -> (S, F, 3, H, W) float32 find images, F = 2 or 4
    (frames and channels as in the module doc)."""
    if windows.ndim != 4 or windows.shape[1] != inputs.windows:
        raise ValueError(
            f"find windows must be (S, {inputs.windows}, H, W) for context_mm "
            f"{inputs.context_mm:g}, got {tuple(windows.shape)}"
        )
    windows = windows.float()
    content = _content(windows[:, :2])  # (S, 3, H, W)
    s, _, h, w = content.shape
    if inputs.coordinates:
        rows = torch.linspace(0.0, 1.0, h).view(h, 1).expand(h, w)
        columns = torch.linspace(0.0, 1.0, w).view(1, w).expand(h, w)
        coords = torch.stack((rows, columns, torch.full((h, w), 0.5)))  # (3, H, W)
        second = coords.expand(s, 3, h, w)
    else:
        second = content
    frames = [content, second]
    if inputs.context_mm > 0:
        frames += [_content(windows[:, 2:4]), _content(windows[:, 4:6])]
    return torch.stack(frames, dim=1).contiguous()  # (S, F, 3, H, W)


def _cross_section_scale(finding: TrueFinding, plane_z: float, half_slab: float) -> float:
    """Linear size of the lesion's largest cross-section inside the slab, relative to the
    central one (0 when the slab misses it)."""
    assert finding.cc_extent_mm is not None
    distance = max(0.0, abs(plane_z - finding.center_lps_mm[2]) - half_slab)
    ratio = 2.0 * distance / finding.cc_extent_mm
    return math.sqrt(1.0 - ratio * ratio) if ratio < 1.0 else 0.0


def _half_extents(finding: TrueFinding, scale: float) -> tuple[float, float]:
    """(along y, along x) half-extents in mm of the finding's axial cross-section."""
    if finding.kind == "vessel":
        assert finding.diameter_mm is not None
        radius = finding.diameter_mm / 2.0
        return radius, radius
    assert finding.long_axis_mm is not None and finding.short_axis_mm is not None
    assert finding.rotation_deg is not None
    a, b = finding.long_axis_mm / 2.0 * scale, finding.short_axis_mm / 2.0 * scale
    theta = math.radians(finding.rotation_deg)  # long axis from +x towards +y
    ex = math.hypot(a * math.cos(theta), b * math.sin(theta))
    ey = math.hypot(a * math.sin(theta), b * math.cos(theta))
    return ey, ex


def plane_labels(
    findings: Sequence[TrueFinding], prepared: PreparedVolume
) -> list[list[FoundFinding]]:
    """The findings visible on each prepared plane (module doc), in reading order."""
    geometry = prepared.geometry
    planes, rows, columns = (int(n) for n in prepared.image.shape[1:])
    pixel = geometry.row_spacing
    half_slab = geometry.slice_spacing / 2.0
    out: list[list[FoundFinding]] = [[] for _ in range(planes)]
    for finding in findings:
        index = geometry.lps_to_index(np.asarray(finding.center_lps_mm, dtype=np.float64))
        z_range = finding.z_range_lps_mm
        for k in range(planes):
            plane_z = float(geometry.index_to_lps(np.array([k, 0.0, 0.0]))[2])
            if z_range is not None and not (
                z_range[0] - half_slab <= plane_z <= z_range[1] + half_slab
            ):
                continue  # a vessel (or lesion) that does not reach this plane
            scale = 1.0
            if finding.kind == "lesion":
                scale = _cross_section_scale(finding, plane_z, half_slab)
                if scale < VISIBLE_FRACTION:
                    continue
            ey, ex = _half_extents(finding, scale)
            row, column = float(index[1]) + 0.5, float(index[2]) + 0.5  # edge coordinates
            box = (
                max(0.0, round(row - ey / pixel, 1)),
                max(0.0, round(column - ex / pixel, 1)),
                min(float(rows), round(row + ey / pixel, 1)),
                min(float(columns), round(column + ex / pixel, 1)),
            )
            if box[0] < box[2] and box[1] < box[3]:
                out[k].append(FoundFinding(FindingKind(finding.kind), 0, box))
    for found in out:
        found.sort(key=lambda f: ((f.box[0] + f.box[2]) / 2, (f.box[1] + f.box[3]) / 2))
    return out


@dataclass(frozen=True, eq=False)
class FindPlane:
    """One prepared plane kept for training: its two windows (float16), its labels and the
    kinds those labels list exhaustively (a finding of another kind may be there unlabelled)."""

    windows: torch.Tensor  # (C, H, W) float16 in [0, 1]: soft, wide (C = 6: with context)
    findings: tuple[FoundFinding, ...]
    kinds: frozenset[FindingKind] = frozenset(FindingKind)

    def example(
        self,
        inputs: FindInputs,
        shift: tuple[int, int] = (0, 0),
        kinds: Collection[FindingKind] | None = None,
    ) -> FindExample:
        """The plane as a find example asking for ``kinds`` (default: the plane's own), which
        must be labelled exhaustively on it; the answer lists the boxes of those kinds.
        ``shift`` (rows, columns) moves its content and its boxes by whole pixels
        (``voting.shift_planes``: the coordinate frame stays), as the shifted passes of
        inference do. Boxes are clipped to the image; one shifted out of it is left out."""
        asked = self.kinds if kinds is None else find_kinds(kinds)
        if not asked <= self.kinds:
            raise ValueError(
                f"this plane lists {sorted(k.value for k in self.kinds)} exhaustively; it "
                f"cannot answer a find prompt for {sorted(k.value for k in asked)}"
            )
        rows, columns = shift
        windows = shift_planes(self.windows[None], rows, columns)
        images = find_frames(windows, inputs)[0]  # (F, 3, H, W)
        height, width = (float(n) for n in self.windows.shape[-2:])
        found = []
        for finding in self.findings:
            if finding.kind not in asked:
                continue
            row0, col0, row1, col1 = finding.box
            box = (
                min(height, max(0.0, row0 + rows)),
                min(width, max(0.0, col0 + columns)),
                min(height, max(0.0, row1 + rows)),
                min(width, max(0.0, col1 + columns)),
            )
            if box[0] < box[2] and box[1] < box[3]:
                found.append(FoundFinding(finding.kind, 0, box))
        found.sort(key=lambda f: ((f.box[0] + f.box[2]) / 2, (f.box[1] + f.box[3]) / 2))
        return FindExample(images, find_prompt(1, asked), find_answer(found, num_images=1))


def _tile_findings(
    found: Sequence[FoundFinding], row: int, column: int, size: int
) -> tuple[FoundFinding, ...]:
    """A plane's boxes seen from the tile at ``(row, column)``: moved, clipped to the tile, and
    left out where less than half of a box lies inside it (the overlapping tile that holds it
    whole answers for it at inference, ``model.measurer.inputs.tiles``)."""
    out = []
    for finding in found:
        r0, c0, r1, c1 = finding.box
        box = (
            max(0.0, r0 - row),
            max(0.0, c0 - column),
            min(float(size), r1 - row),
            min(float(size), c1 - column),
        )
        area = (r1 - r0) * (c1 - c0)
        inside = max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])
        if area > 0 and inside >= 0.5 * area:
            out.append(FoundFinding(finding.kind, 0, box))
    return tuple(out)


def find_planes(
    volume: Volume,
    findings: Sequence[TrueFinding],
    inputs: FindInputs,
    rng: np.random.Generator,
    *,
    planes: int | None = None,
    edge_mm: float = FIELD_EDGE_MM,
    kinds: Collection[FindingKind] | None = None,
) -> list[FindPlane]:
    """Training planes of one study: ``planes`` planes drawn without replacement, those that
    show a lesion twice as likely as the others (all planes when None). The study is prepared
    over its whole field as inference prepares it (:func:`prepare_find_field`), and each plane
    is one tile of the trained size at a random place in that field. ``kinds``: what the
    study's findings list exhaustively (default both); the planes ask only for those."""
    exhaustive = find_kinds(kinds)
    prepared = prepare_find_field(volume, inputs, edge_mm=edge_mm)
    labels = plane_labels(findings, prepared)
    chosen: Sequence[int] = range(len(labels))
    if planes is not None and planes < len(labels):
        weight = np.array(
            [2.0 if any(f.kind is FindingKind.LESION for f in found) else 1.0 for found in labels]
        )
        chosen = sorted(rng.choice(len(labels), planes, replace=False, p=weight / weight.sum()))
    windows = prepared.image.to(torch.float16)  # (2, S, H, W)
    side_rows, side_columns = (int(n) for n in windows.shape[-2:])
    size = inputs.size
    offset = inputs.context_planes(prepared.geometry.slice_spacing)
    last = windows.shape[1] - 1
    out = []
    for k in chosen:
        row = int(rng.integers(0, side_rows - size + 1))
        column = int(rng.integers(0, side_columns - size + 1))
        picked = [k] if not offset else [k, max(0, k - offset), min(last, k + offset)]
        tile = windows[:, picked, row : row + size, column : column + size]  # (2, n, s, s)
        tile = tile.transpose(0, 1).reshape(-1, size, size).clone()  # (2 n, s, s)
        out.append(FindPlane(tile, _tile_findings(labels[k], row, column, size), exhaustive))
    return out
