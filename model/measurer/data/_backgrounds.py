"""Real CT backgrounds for hybrid training data (``model.measurer.data.hybrid``): which of the
project's shared real volumes may be used, and loading them with their labels.

A background is usable (:func:`survey_backgrounds`) when it is CT, its pixels are 0.4-1.5 mm,
its licence allows training a model the project ships (:func:`licence_allows_training`), and
its case is not one radcaliper must refuse (``cases.json``'s ``expect: refuse``,
``ingestion.json``'s ``expect_inspect: refuse ...``). From ``real-dicom/`` (no masks) only
ordinary axial stacks of CT images qualify: no localizer, secondary capture or perfusion map,
no repeated positions, no gantry tilt (a sheared grid, which the in-plane augmentations do not
handle). Every other case is listed with the reason it was left out.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ingestion.dataset.format import (
    DatasetFinding,
    ImageRef,
    KindName,
    Provenance,
    SourceType,
)
from ingestion.errors import ConfigurationError, IngestionError
from ingestion.geometry import Geometry
from ingestion.volume import Modality, Volume

__all__ = [
    "PIXEL_RANGE_MM",
    "Background",
    "BackgroundRef",
    "BackgroundSurvey",
    "licence_allows_training",
    "survey_backgrounds",
]

logger = logging.getLogger(__name__)

PIXEL_RANGE_MM = (0.4, 1.5)
_DENIED = re.compile(
    r"\bNC\b|non-?commercial|\bND\b|no-?deriv|research[- ]only|academic[- ]only|unknown",
    re.IGNORECASE,
)
_ALLOWED = re.compile(
    r"\bApache\b|\bBSD\b|\bMIT\b|\bCC[- ]BY\b|\bCC0\b|public domain", re.IGNORECASE
)
_VESSEL_ROLES = {"vessel", "target_vessel", "other_vessel", "target"}
_NOT_ANATOMY = {"LOCALIZER", "PERFUSION", "SCOUT"}


def licence_allows_training(licence: str) -> bool:
    """Whether a licence text allows training a model the project ships: it names a licence
    that does (Apache, BSD, MIT, CC BY, CC0, public domain) and nothing that forbids it
    (non-commercial "NC", no-derivatives "ND", research or academic use only, unknown)."""
    return bool(_ALLOWED.search(licence)) and not _DENIED.search(licence)


@dataclass(frozen=True)
class BackgroundRef:
    """A usable background, not yet loaded.

    Args:
        id: the case id (``cases.json`` / ``ingestion.json``).
        title: the case's description.
        image: what is loaded: a NIfTI file (HU, the grid of ``labels``) or a DICOM folder.
        labels: the label map on the image's grid, None where the case has none.
        label_map: (value, name, role) per label; role "lesion", "vessel" or "organ".
        licence: the licence text of the source.
        source: repository, commit and paths of the source.
        annotation: who made the labels.
        lesions_exhaustive: whether every lesion of the background is known (its findings are
            the whole truth for lesions): true for the curated cases with masks; false for
            series without masks (a cohort's patients may have lesions nobody outlined).
        series_instance_uid: the series to load from a DICOM folder of several.
    """

    id: str
    title: str
    image: Path
    labels: Path | None
    label_map: tuple[tuple[int, str, str], ...]
    licence: str
    source: str
    annotation: str
    lesions_exhaustive: bool
    series_instance_uid: str | None = None

    @property
    def vessels_annotated(self) -> bool:
        return any(role == "vessel" for _, _, role in self.label_map)

    def describe(self) -> dict[str, object]:
        return {
            "id": self.id,
            "title": self.title,
            "image": str(self.image),
            "licence": self.licence,
            "source": self.source,
            "annotation": self.annotation,
        }

    def load(self) -> Background:
        """The image (HU) and its label map.

        Raises:
            IngestionError: the image or label map cannot be loaded, or they are not on one
                grid (the file named).
        """
        volume = _load_image(self)
        labels = np.zeros(volume.shape, dtype=np.int16)
        if self.labels is not None:
            labels = _load_labels(self.labels, volume, {v for v, _, _ in self.label_map})
        logger.info("background %s loaded: %s voxels", self.id, "x".join(map(str, volume.shape)))
        return Background(self, volume, labels)


def _load_image(ref: BackgroundRef) -> Volume:
    from ingestion.load import load_path

    result = load_path(ref.image, nifti_modality=Modality.CT)
    volumes = [
        v
        for v in result.volumes
        if ref.series_instance_uid is None
        or v.identifiers.series_instance_uid == ref.series_instance_uid
    ]
    if not volumes:
        reasons = "; ".join(f"{r.path}: {r.reason}" for r in result.rejected[:3])
        raise IngestionError(
            f"{ref.image}: background {ref.id} does not load ({reasons or 'no series found'}); "
            "check the shared data folder"
        )
    return volumes[0]


def _load_labels(path: Path, volume: Volume, values: set[int]) -> npt.NDArray[np.int16]:
    from ingestion.nifti import load_nifti

    labels = load_nifti(path)
    same = labels.shape == volume.shape and np.allclose(
        labels.geometry.affine, volume.geometry.affine, atol=1e-3
    )
    if not same:
        raise IngestionError(
            f"{path}: the label map is not on its image's grid ({labels.shape} vs "
            f"{volume.shape}); a background needs both on one grid"
        )
    array = np.rint(labels.voxels).astype(np.int32)
    array[~np.isin(array, list(values))] = 0
    return array.astype(np.int16)


@dataclass(frozen=True, eq=False)
class Background:
    """A loaded background: its volume (HU), its label map on the same grid (0 where nothing
    is labelled) and, from the label map, its known findings."""

    ref: BackgroundRef
    volume: Volume
    labels: npt.NDArray[np.int16]

    @property
    def id(self) -> str:
        return self.ref.id

    @property
    def licence(self) -> str:
        return self.ref.licence

    @property
    def roles(self) -> dict[int, tuple[str, KindName]]:
        """The labels that are findings: value -> (name, "lesion" | "vessel")."""
        out: dict[int, tuple[str, KindName]] = {}
        for value, name, role in self.ref.label_map:
            if role == "lesion":
                out[value] = (name, "lesion")
            elif role == "vessel":
                out[value] = (name, "vessel")
        return out

    @property
    def names(self) -> dict[int, tuple[str, str]]:
        """Every label: value -> (name, role)."""
        return {value: (name, role) for value, name, role in self.ref.label_map}

    @cached_property
    def findings(self) -> tuple[DatasetFinding, ...]:
        """The background's own findings, measured from its label map as an import would."""
        from ingestion.dataset.masks import findings_from_labels

        ids = self.volume.identifiers
        rows, _ = findings_from_labels(
            self.labels,
            self.volume.geometry,
            self.roles,
            study_instance_uid=ids.study_instance_uid,
            series_instance_uid=ids.series_instance_uid,
            image=ImageRef(str(self.ref.image), "nifti", "CT"),
            provenance=Provenance(
                SourceType.MASKS, str(self.ref.image), "", "background", self.licence
            ),
            file=str(self.ref.labels or self.ref.image),
        )
        return tuple(rows)

    def crop(self, slices: slice, rows: slice, columns: slice) -> Background:
        """A part of the background (a smaller grid with the same voxels and exact geometry)."""
        box = (slices, rows, columns)
        start = [s.indices(n)[0] for s, n in zip(box, self.volume.shape, strict=True)]
        voxels = np.ascontiguousarray(self.volume.voxels[box])
        g = self.volume.geometry
        origin = g.index_to_lps([float(v) for v in start])
        geometry = Geometry(
            origin=(float(origin[0]), float(origin[1]), float(origin[2])),
            row_direction=g.row_direction,
            column_direction=g.column_direction,
            slice_direction=g.slice_direction,
            spacing=g.spacing,
        )
        ids = self.volume.identifiers
        n = voxels.shape[0]
        identifiers = replace(
            ids,
            series_instance_uid=f"{ids.series_instance_uid}.{start[0]}.{start[1]}.{start[2]}",
            sop_instance_uids=(None,) * n,
            frame_numbers=(None,) * n,
        )
        volume = replace(self.volume, voxels=voxels, geometry=geometry, identifiers=identifiers)
        return Background(self.ref, volume, np.ascontiguousarray(self.labels[box]))


@dataclass(frozen=True)
class BackgroundSurvey:
    """The usable backgrounds and, per case left out, (id, reason)."""

    usable: tuple[BackgroundRef, ...]
    excluded: tuple[tuple[str, str], ...]


def _pixel_spacing(path: Path) -> tuple[float, float] | None:
    import nibabel as nib

    try:
        zooms = nib.load(str(path)).header.get_zooms()  # type: ignore[attr-defined]
    except Exception:  # nibabel raises several types for a bad file
        return None
    return float(zooms[0]), float(zooms[1])


def _source_text(source: dict[str, Any]) -> str:
    paths = "; ".join(str(p) for p in source.get("paths", []))
    return f"{source.get('repo', '?')} {source.get('commit', '')} {paths}".strip()


def _role(role: str) -> str:
    role = role.strip().lower()
    if role in _VESSEL_ROLES:
        return "vessel"
    return "lesion" if role == "lesion" else "organ"


def _cases(path: Path) -> list[dict[str, Any]]:
    """The ``cases`` of a shared data manifest (none where the file is absent)."""
    if not path.is_file():
        return []
    try:
        cases: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["cases"]
    except (OSError, ValueError, KeyError) as error:
        raise ConfigurationError(f"{path}: not a readable {path.name} ({error})") from error
    return cases


def _real_ct(root: Path) -> tuple[list[BackgroundRef], list[tuple[str, str]]]:
    usable: list[BackgroundRef] = []
    excluded: list[tuple[str, str]] = []
    for case in _cases(root / "real-ct" / "cases.json"):
        case_id = str(case["id"])
        licence = str(case.get("source", {}).get("licence", "unknown"))
        folder = root / "real-ct" / str(case.get("truth_dir") or case["input"].split("/")[0])
        image = folder / str(case.get("truth_image") or "image.nii.gz")
        reason = None
        if case.get("modality") != "CT":
            reason = f"modality {case.get('modality')}, not CT"
        elif case.get("expect") == "refuse":
            reason = f"a case radcaliper refuses ({case.get('expect_reason')})"
        elif not licence_allows_training(licence):
            reason = f"licence does not allow training a shipped model: {licence}"
        elif not image.is_file():
            reason = f"{image}: no image"
        else:
            spacing = _pixel_spacing(image)
            if spacing is None:
                reason = f"{image}: unreadable NIfTI header"
            elif not all(PIXEL_RANGE_MM[0] <= s <= PIXEL_RANGE_MM[1] for s in spacing):
                reason = f"pixel spacing {spacing[0]:.2f} mm, outside 0.4-1.5 mm"
        if reason is not None:
            excluded.append((case_id, reason))
            continue
        labels = folder / str(case.get("labels") or "labels.nii.gz")
        label_map = tuple(
            (int(value), str(entry.get("name", "")), _role(str(entry.get("role", "organ"))))
            for value, entry in sorted(case.get("label_map", {}).items(), key=lambda i: int(i[0]))
        )
        usable.append(
            BackgroundRef(
                id=case_id,
                title=str(case.get("title", "")),
                image=image,
                labels=labels if labels.is_file() else None,
                label_map=label_map if labels.is_file() else (),
                licence=licence,
                source=_source_text(case.get("source", {})),
                annotation=str(case.get("annotation", "unknown")),
                lesions_exhaustive=labels.is_file(),
            )
        )
    return usable, excluded


def _header_reason(header: dict[str, Any]) -> str | None:
    image_type = {str(t).upper() for t in header.get("image_type") or []}
    spacing = header.get("spacing_mm") or {}
    pixels = [spacing.get("row"), spacing.get("column")]
    if header.get("modality") != "CT":
        return f"modality {header.get('modality')}, not CT"
    if image_type & _NOT_ANATOMY or "Secondary Capture" in str(header.get("sop_class", "")):
        return f"not an anatomical CT image ({'/'.join(header.get('image_type') or [])})"
    if header.get("slice_direction") is None or header.get("same_position_frames", 0):
        return "slices at repeated positions (no stack)"
    if abs(float(header.get("tilt_degrees_from_positions") or 0.0)) > 0.5:
        return (
            f"gantry tilt {header.get('tilt_degrees_from_positions')} deg: a sheared grid, "
            "which the in-plane augmentations do not handle"
        )
    if not all(
        isinstance(p, int | float) and PIXEL_RANGE_MM[0] <= p <= PIXEL_RANGE_MM[1] for p in pixels
    ):
        return f"pixel spacing {pixels} mm, outside 0.4-1.5 mm"
    if int((header.get("dimensions") or {}).get("slices", 0)) < 3:
        return "fewer than 3 slices"
    return None


def _real_dicom(root: Path) -> tuple[list[BackgroundRef], list[tuple[str, str]]]:
    usable: list[BackgroundRef] = []
    excluded: list[tuple[str, str]] = []
    for case in _cases(root / "real-dicom" / "ingestion.json"):
        case_id = str(case["id"])
        licence = str(case.get("source", {}).get("licence", "unknown"))
        if case.get("modality") != "CT":
            excluded.append((case_id, f"modality {case.get('modality')}, not CT"))
            continue
        if str(case.get("expect_inspect", "")).lower().startswith("refuse"):
            excluded.append((case_id, f"a case radcaliper refuses ({case['expect_inspect']})"))
            continue
        if not licence_allows_training(licence):
            excluded.append(
                (case_id, f"licence does not allow training a shipped model: {licence}")
            )
            continue
        headers = case.get("headers") or []
        reasons = [_header_reason(h) for h in headers]
        good = [h for h, r in zip(headers, reasons, strict=True) if r is None]
        if not good:
            excluded.append((case_id, "; ".join(sorted({r for r in reasons if r})) or "no series"))
            continue
        for k, header in enumerate(good):
            usable.append(
                BackgroundRef(
                    id=case_id if len(good) == 1 else f"{case_id}:{k + 1}",
                    title=str(case.get("title", "")),
                    image=root / "real-dicom" / str(case["input"]),
                    labels=None,
                    label_map=(),
                    licence=licence,
                    source=_source_text(case.get("source", {})),
                    annotation="none (no masks)",
                    lesions_exhaustive=False,
                    series_instance_uid=str(header["series_instance_uid"]),
                )
            )
    return usable, excluded


def survey_backgrounds(shared_root: Path) -> BackgroundSurvey:
    """The usable backgrounds under ``shared_root`` (``real-ct/cases.json`` and
    ``real-dicom/ingestion.json``; module doc) and the cases left out with their reasons.
    Reads the two JSON files and the NIfTI headers only.

    Raises:
        ConfigurationError: ``shared_root`` holds neither file, or one cannot be read.
    """
    root = Path(shared_root)
    found = [root / "real-ct" / "cases.json", root / "real-dicom" / "ingestion.json"]
    if not any(p.is_file() for p in found):
        raise ConfigurationError(
            f"{root}: no real-ct/cases.json or real-dicom/ingestion.json; give the shared data "
            "folder (--shared DIR or RADCALIPER_SHARED_DATA)"
        )
    ct, ct_out = _real_ct(root)
    dicom, dicom_out = _real_dicom(root)
    return BackgroundSurvey(tuple(ct + dicom), tuple(ct_out + dicom_out))
