"""Import ``radcaliper phantoms`` folders into a dataset (``SourceType.PHANTOMS``).

Every study folder under the input (one holding a ``truth.json``, as
``ingestion.phantoms.write_phantoms`` writes them) gives one study and one row per true
finding. The truth is analytic, so the rows are exact:

- **lesion**: long and short axis of the ellipsoid's axial section through its centre; their end
  points through the centre, the long axis at ``rotation_deg`` from +x towards +y (so
  ``DatasetFinding.rotation_deg`` gives the phantom's rotation back) and the short axis
  perpendicular to it in the axial plane; ``z_range_lps_mm`` = centre +- ``cc_extent_mm`` / 2.
- **vessel**: the diameter of its circular section, centred on its slice, end points along +x;
  ``z_range_lps_mm`` None (the vessel runs through the whole volume).

The image is the study's DICOM folder (``dicom/``; format "dicom"), else its NIfTI file
(``image.nii.gz``; "nifti"), modality CT; the UIDs are those of ``truth.json`` (the DICOM's; a
NIfTI-only study's loaded UIDs are derived from the file's content instead, see
``DatasetStudy``). Phantom truth is exhaustive: the studies annotate both kinds. The annotator is
"phantom generator (radcaliper <version>)".

Only ``truth.json`` is read (and the DICOM folder listed to count its files): no image is loaded,
so importing is fast. A study whose ``truth.json`` cannot be read or checked, whose image is
missing, or whose series was already imported from another folder, is a line of the import
report; the others import.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ingestion.dataset.format import (
    DatasetFinding,
    DatasetStudy,
    ImageRef,
    ImportProgress,
    ImportResult,
    Label,
    Provenance,
    Segment,
    Skipped,
    SourceType,
    Vector3,
    finding_id,
)
from ingestion.errors import ConfigurationError
from ingestion.phantoms import DICOM_FOLDER, NIFTI_NAME, TRUTH_NAME, TruthFinding

__all__ = ["DEFAULT_LICENCE", "import_phantoms"]

logger = logging.getLogger(__name__)

DEFAULT_LICENCE = "synthetic (radcaliper phantoms): no restriction"
_TRUTH_FORMAT_VERSION = 1


@dataclass(frozen=True)
class _Study:
    """What one study folder's ``truth.json`` says."""

    study_instance_uid: str
    series_instance_uid: str
    slices: int
    findings: tuple[TruthFinding, ...]


def import_phantoms(
    source: Path, *, licence: str = DEFAULT_LICENCE, on_item: ImportProgress | None = None
) -> ImportResult:
    """The studies under the phantom folder ``source`` as dataset rows (module doc);
    ``on_item``: progress, called before each study folder.

    Raises:
        ConfigurationError: ``source`` is not a folder, or holds no ``truth.json``; an empty
            ``licence``.
    """
    if not licence.strip():
        raise ConfigurationError("the licence must not be empty (say the data's terms of use)")
    root = Path(source).resolve()
    if not root.is_dir():
        raise ConfigurationError(
            f"{root} is not a folder of phantoms; write some with "
            "'radcaliper phantoms OUT --n N --seed S'"
        )
    folders = sorted(p.parent for p in root.rglob(TRUTH_NAME))
    if not folders:
        raise ConfigurationError(
            f"{root} holds no study with a {TRUTH_NAME}; write some with "
            "'radcaliper phantoms OUT --n N --seed S'"
        )
    path = str(root)
    annotator = f"phantom generator (radcaliper {_version()})"
    studies: list[DatasetStudy] = []
    findings: list[DatasetFinding] = []
    skipped: list[Skipped] = []
    seen: dict[str, Path] = {}  # series UID -> the folder it was imported from
    for done, folder in enumerate(folders):
        if on_item is not None:
            on_item(done, len(folders), str(folder))
        name = folder.relative_to(root).as_posix()
        truth_path = folder / TRUTH_NAME
        try:
            study = _read(truth_path)
            image = _image(folder, study)
        except ValueError as error:
            skipped.append(Skipped(SourceType.PHANTOMS, path, str(truth_path), "", str(error)))
            continue
        first = seen.setdefault(study.series_instance_uid, folder)
        if first != folder:
            reason = f"series {study.series_instance_uid} was already imported from {first}"
            skipped.append(Skipped(SourceType.PHANTOMS, path, str(truth_path), "", reason))
            continue
        studies.append(
            DatasetStudy(
                study.study_instance_uid,
                study.series_instance_uid,
                image,
                ("lesion", "vessel"),
                Provenance(SourceType.PHANTOMS, path, "", annotator, licence),
            )
        )
        for number, truth in enumerate(study.findings, 1):
            item = f"{name} finding {number}" if name != "." else f"finding {number}"
            provenance = Provenance(SourceType.PHANTOMS, path, item, annotator, licence)
            findings.append(_row(truth, number, study, image, provenance))
    logger.info(
        "phantoms %s: %d studies, %d findings, %d skipped",
        path,
        len(studies),
        len(findings),
        len(skipped),
    )
    return ImportResult(SourceType.PHANTOMS, path, tuple(studies), tuple(findings), tuple(skipped))


def _version() -> str:
    try:
        return version("radcaliper")
    except PackageNotFoundError:
        return "unknown version"


def _read(path: Path) -> _Study:
    """The study in ``path`` (a ``truth.json``); ``ValueError`` says what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not a readable phantom {TRUTH_NAME} ({error})") from error
    if not isinstance(data, dict):
        raise ValueError(f"not a phantom {TRUTH_NAME} (not a JSON object)")
    if data.get("format_version") != _TRUTH_FORMAT_VERSION:
        raise ValueError(
            f"phantom truth format version {data.get('format_version')!r}; this radcaliper "
            f"reads version {_TRUTH_FORMAT_VERSION}: write the phantoms again"
        )
    study, series = data.get("study_instance_uid"), data.get("series_instance_uid")
    uids = data.get("sop_instance_uids")
    if not (isinstance(study, str) and study and isinstance(series, str) and series):
        raise ValueError(f"{TRUTH_NAME} has no study_instance_uid or series_instance_uid")
    if not isinstance(uids, list) or not uids:
        raise ValueError(f"{TRUTH_NAME} has no sop_instance_uids (one per slice)")
    raw = data.get("findings")
    if not isinstance(raw, list):
        raise ValueError(f"{TRUTH_NAME} has no list of findings")
    findings = []
    for number, item in enumerate(raw, 1):
        try:
            finding = TruthFinding(**_fields(item))
        except (TypeError, ValueError) as error:
            raise ValueError(f"finding {number} of {TRUTH_NAME}: {error}") from error
        if finding.slice_index >= len(uids):
            raise ValueError(
                f"finding {number} of {TRUTH_NAME}: slice {finding.slice_index} of a series of "
                f"{len(uids)} slices"
            )
        findings.append(finding)
    return _Study(study, series, len(uids), tuple(findings))


def _fields(item: object) -> dict[str, Any]:
    if not isinstance(item, dict) or not all(isinstance(k, str) for k in item):
        raise ValueError(f"not a finding: {item!r}")
    return item


def _image(folder: Path, study: _Study) -> ImageRef:
    """The study's image (DICOM folder first); ``ValueError`` when there is none."""
    dicom = folder / DICOM_FOLDER
    if dicom.is_dir():
        files = sum(1 for p in dicom.iterdir() if p.is_file())
        if files != study.slices:
            raise ValueError(
                f"{dicom} holds {files} files but {TRUTH_NAME} lists {study.slices} slices"
            )
        return ImageRef(str(dicom), "dicom", "CT")
    nifti = folder / NIFTI_NAME
    if nifti.is_file():
        return ImageRef(str(nifti), "nifti", "CT")
    raise ValueError(f"no image: neither {DICOM_FOLDER}/ nor {NIFTI_NAME} is in {folder}")


def _through(center: Vector3, angle_deg: float, length_mm: float) -> Segment:
    """A segment of ``length_mm`` through ``center`` in the axial plane, at ``angle_deg`` from +x
    towards +y."""
    half = length_mm / 2.0
    dx = half * math.cos(math.radians(angle_deg))
    dy = half * math.sin(math.radians(angle_deg))
    x, y, z = center
    return ((x - dx, y - dy, z), (x + dx, y + dy, z))


def _row(
    truth: TruthFinding, number: int, study: _Study, image: ImageRef, provenance: Provenance
) -> DatasetFinding:
    center = truth.center_lps_mm
    long_mm, short_mm, diameter = truth.long_axis_mm, truth.short_axis_mm, truth.diameter_mm
    rotation = truth.rotation_deg or 0.0
    return DatasetFinding(
        id=finding_id(provenance, study.series_instance_uid, provenance.item),
        study_instance_uid=study.study_instance_uid,
        series_instance_uid=study.series_instance_uid,
        image=image,
        kind=truth.kind,
        label=Label.FINDING,
        name=f"{truth.kind} {number}",
        center_lps_mm=center,
        slice_index=truth.slice_index,
        provenance=provenance,
        z_range_lps_mm=truth.z_range_lps_mm,
        long_axis_mm=long_mm,
        short_axis_mm=short_mm,
        diameter_mm=diameter,
        long_axis_lps_mm=None if long_mm is None else _through(center, rotation, long_mm),
        short_axis_lps_mm=None if short_mm is None else _through(center, rotation + 90, short_mm),
        diameter_lps_mm=None if diameter is None else _through(center, 0.0, diameter),
    )
