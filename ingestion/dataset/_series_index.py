"""The image series under a folder, indexed to find where an annotation lies: by series, by SOP
instance (and frame), and by frame of reference and a point in patient space. Shared by the SR
and SEG importers (``sr``, ``seg``).

The folder is scanned once, headers only (``ingestion.scan``): the same series, slice order and
geometry ``load_path`` gives, so a slice index found here is the slice a loaded volume has.
A series split into several stacks is refused (its slice indices would be ambiguous), and a
point outside every image is refused: nothing is guessed (an :class:`UnusableError`, which the
importers turn into a Skipped line).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ingestion.dataset._dicom_values import UnusableError
from ingestion.dataset.format import ImageRef
from ingestion.scan import scan_path

if TYPE_CHECKING:
    from ingestion.dicom.stack import SeriesRef

__all__ = ["ImageIndex", "SliceAt", "image_points_to_lps", "nearest_slice"]

_PIXEL_TOLERANCE = 1e-3  # how far (pixels) a point may sit outside the image


@dataclass(frozen=True)
class SliceAt:
    """A referenced image: its stack and slice index (in ``load_path``'s slice order)."""

    ref: SeriesRef
    index: int


class ImageIndex:
    """The DICOM series under a folder (headers only), by series, SOP instance and frame of
    reference. A series split into several stacks is refused (its slice indices would be
    ambiguous)."""

    def __init__(self, root: Path, *, scan: bool = True) -> None:
        self.root = root
        self._series: dict[str, list[SeriesRef]] = {}
        self._slices: dict[str, list[tuple[int | None, SliceAt]]] = {}
        self._frames_of_reference: dict[str, str | None] = {}
        for ref in scan_path(root).series if scan else ():
            self._series.setdefault(ref.info.series_instance_uid, []).append(ref)
            for i, s in enumerate(ref.slices):
                frame = None if s.frame is None else s.frame + 1
                self._slices.setdefault(s.sop_instance_uid, []).append((frame, SliceAt(ref, i)))

    @classmethod
    def empty(cls, root: Path) -> ImageIndex:
        """An index of nothing (where nothing refers to images)."""
        return cls(root, scan=False)

    def series_uids(self) -> list[str]:
        return sorted(self._series)

    def stack(self, series_instance_uid: str) -> SeriesRef | None:
        """The series' stack; None when it is not under the folder.

        Raises:
            UnusableError: the series is split into several stacks.
        """
        refs = self._series.get(series_instance_uid)
        if refs is None:
            return None
        if len(refs) > 1:
            raise UnusableError(
                f"series {series_instance_uid} under {self.root} is split into {len(refs)} "
                "stacks (sizes, orientations or positions differ); its slices are ambiguous"
            )
        return refs[0]

    def image(self, sop_instance_uid: str, frame: int | None = None) -> SliceAt | None:
        """Where the image (1-based ``frame`` of a multi-frame image) lies; None if absent.

        Raises:
            UnusableError: a multi-frame image is named without a frame, or its series is split.
        """
        found = self._slices.get(sop_instance_uid, [])
        if frame is not None:
            found = [f for f in found if f[0] == frame]
        elif len(found) > 1:
            raise UnusableError(
                f"image {sop_instance_uid} has {len(found)} frames and the reference names none"
            )
        if not found:
            return None
        at = found[0][1]
        self.stack(at.ref.info.series_instance_uid)  # refuses a split series
        return at

    def frame_of_reference(self, ref: SeriesRef) -> str | None:
        """The series' Frame of Reference UID (read from its first file's header)."""
        uid = ref.info.series_instance_uid
        if uid not in self._frames_of_reference:
            from pydicom import dcmread

            header = dcmread(
                ref.slices[0].path, stop_before_pixels=True, specific_tags=["FrameOfReferenceUID"]
            )
            value = header.get("FrameOfReferenceUID")
            self._frames_of_reference[uid] = None if value is None else str(value)
        return self._frames_of_reference[uid]

    def stacks_in(self, frame_of_reference_uid: str) -> list[SeriesRef]:
        """Every (unsplit) stack in that frame of reference, by series UID."""
        out = []
        for uid in self.series_uids():
            refs = self._series[uid]
            if len(refs) == 1 and self.frame_of_reference(refs[0]) == frame_of_reference_uid:
                out.append(refs[0])
        return out

    def slice_near(
        self,
        frame_of_reference_uid: str,
        points: npt.NDArray[np.float64],
        prefer: Iterable[frozenset[str]] = (),
    ) -> SliceAt:
        """The slice nearest the middle of ``points`` ((N, 3) LPS mm) among the stacks in that
        frame of reference.

        ``prefer`` narrows the stacks: the first set of series UIDs that names any of them
        (e.g. the series an annotation names, then those its document names).

        Raises:
            UnusableError: no series is in the frame of reference, the middle lies outside
                every one, or inside several and ``prefer`` names none of them.
        """
        stacks = self.stacks_in(frame_of_reference_uid)
        if not stacks:
            raise UnusableError(
                f"3-D coordinates are in frame of reference {frame_of_reference_uid}, which no "
                f"series under {self.root} is in"
            )
        for named in prefer:
            chosen = [s for s in stacks if s.info.series_instance_uid in named]
            if chosen:
                stacks = chosen
                break
        middle = points.mean(axis=0)
        found = [at for s in stacks if (at := nearest_slice(s, middle)) is not None]
        if not found:
            raise UnusableError(
                f"3-D coordinates {middle.round(2).tolist()} lie outside every series of frame of "
                f"reference {frame_of_reference_uid} under {self.root}"
            )
        if len(found) > 1:
            uids = ", ".join(at.ref.info.series_instance_uid for at in found)
            raise UnusableError(
                f"3-D coordinates lie in {len(found)} series of frame of reference "
                f"{frame_of_reference_uid} ({uids}) and neither the group nor the document "
                "names one of them"
            )
        return found[0]

    @staticmethod
    def image_ref(ref: SeriesRef) -> ImageRef:
        """What loads the series: the folder that holds all its files."""
        folder = os.path.commonpath([str(s.path.parent.resolve()) for s in ref.slices])
        return ImageRef(folder, "dicom", ref.info.modality.value)


def image_points_to_lps(points: npt.NDArray[np.float64], at: SliceAt) -> npt.NDArray[np.float64]:
    """(column, row) image coordinates of ``at`` -> LPS mm, (N, 2) -> (N, 3).

    DICOM's convention: the top left corner of the top left pixel is (0, 0), its centre
    (0.5, 0.5), so voxel index = (slice of the image, row - 0.5, column - 0.5).

    Raises:
        UnusableError: a point lies outside the image.
    """
    rows, columns = at.ref.slices[0].rows, at.ref.slices[0].columns
    inside = (points >= -_PIXEL_TOLERANCE) & (
        points <= np.array([columns, rows]) + _PIXEL_TOLERANCE
    )
    if not np.all(inside):
        raise UnusableError(
            f"coordinates {points.tolist()} lie outside the {columns} x {rows} image "
            f"{at.ref.slices[at.index].sop_instance_uid}"
        )
    index = np.stack(
        [np.full(len(points), float(at.index)), points[:, 1] - 0.5, points[:, 0] - 0.5], axis=1
    )
    return np.asarray(at.ref.geometry.index_to_lps(index), dtype=np.float64)


def nearest_slice(ref: SeriesRef, point: npt.NDArray[np.float64]) -> SliceAt | None:
    """The slice of ``ref`` nearest ``point`` (LPS), None when the point is outside the stack."""
    s, r, c = ref.geometry.lps_to_index(point)
    shape = (len(ref.slices), ref.slices[0].rows, ref.slices[0].columns)
    if any(not (-0.5 - 1e-6 <= v <= n - 0.5 + 1e-6) for v, n in zip((s, r, c), shape, strict=True)):
        return None
    return SliceAt(ref, min(max(round(float(s)), 0), shape[0] - 1))
