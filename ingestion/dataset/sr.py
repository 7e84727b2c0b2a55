"""DICOM SR TID 1500 importer: the measurement groups someone saved in a viewer (OHIF, 3D Slicer,
radcaliper's own ``export-sr``) become dataset rows (``ingestion.dataset.format``).

What it reads, and the choices made (README "Datasets"):

- **Input**: one SR file or a folder tree of them. Files that are not DICOM SR are ignored, so
  the folder may hold the images too. An SR that highdicom cannot read, or that is not a TID 1500
  measurement report, is a Skipped line.
- **Images**: ``images`` (default: the source folder, or the SR file's own folder) is scanned once,
  headers only (``ingestion.scan``: the same series, slice order and geometry ``load_path``
  gives; no pixel data is read). SCOORD coordinates find their series and slice by the referenced
  SOP Instance UID (and frame number); SCOORD3D by the Frame of Reference UID, narrowed to the
  series the group or the document's evidence names.
- **Measurements**, by concept name (SCT, or the older SRT codes that OHIF/dcmjs write, which
  pydicom relates): Long Axis (103339001 / G-A185) and Short Axis (103340004 / G-A186) make a
  lesion; Diameter (81827009 / M-02550) makes a vessel when the finding type or a finding site
  is a blood vessel (Blood Vessel, Artery, Vein, Aorta, ...). A diameter of anything else is
  skipped (RECIST gives a lesion two axes; a diameter alone is not a lesion), as is a lone long
  or short axis, and a blood vessel measured only with axes. Other measurements (area, volume,
  length) are not used; a group with nothing else is skipped with what it holds.
- **Coordinates**: SCOORD POLYLINE of two points in (column, row) image coordinates of the
  referenced image, DICOM's convention (the top left corner of the top left pixel is (0, 0), its
  centre (0.5, 0.5)), so voxel index = (slice of the image, row - 0.5, column - 0.5), mapped to
  LPS by the series geometry; SCOORD3D POLYLINE: LPS mm as written. A bidirectional measurement
  (OHIF/dcmjs, radcaliper) is two lines, one under each axis.
- **Position** (never guessed): a lesion's centre is its long axis' midpoint, a vessel's the
  diameter line's midpoint. Where that measurement has no coordinates (radcaliper writes none
  for a corrected value), the other axis' midpoint, else the centre of the group's Image Region
  (TID 1410) is used. Nothing at all: Skipped. ``slice_index`` is the slice of the referenced
  image (SCOORD) or the slice nearest the centre (SCOORD3D).
- **Values** as written (FloatingPointValue where present, else NumericValue), in mm: UCUM mm;
  um, cm and m are converted. The value is the annotation: it is not replaced by the length of
  its line. But it must be plausible and agree with its line, else the group is skipped with
  the reason: within ``limits``, the limits a reviewer's correction must keep (the command line
  passes ``db.review.CorrectionLimits`` from the settings, ``RADCALIPER_MAX_*_MM``: e.g. no
  1e308 mm long axis), and, where the measurement has end points, no further from their
  distance than one pixel of the image they lie on (the larger pixel spacing; the image is
  always known, its geometry places the points): a 60 mm or a 1e-300 mm long axis drawn as a
  52.6 mm line is not truth.
- **Review** (radcaliper's own SR): values are the current ones (the reviewer's when corrected)
  and rejected measurements are not in the file (``app.sr``); a measurement whose review status
  (private scheme 99RADCAL) says rejected is left out all the same.
- **Provenance**: annotator = the ``annotator`` argument, else the group's algorithm
  ("<name> <version> (model)", with "corrected/accepted by ..." when its review statuses say so),
  else the document's person observer, else its device observer; ``annotated_at`` = the
  document's ContentDate/ContentTime. Item: "measurement group N (tracking id ...)".
- **Studies**: one per referenced series found under ``images``, ``annotated=()``: an SR lists
  what someone measured, not every finding of the series.

This module reads documents (their groups, observers and provenance) and makes the rows; one
group is read by ``_sr_group`` and the images are found by ``_dicom_import``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingestion.dataset._dicom_import import (
    Collected,
    ImageIndex,
    UnusableError,
    code_meaning,
    code_value,
    content_time,
    import_objects,
    person_name,
)
from ingestion.dataset._sr_group import (
    Axis,
    GroupRead,
    ReadContext,
    ValueLimits,
    children,
    concept_name,
    read_group,
    review_statuses,
    text_of,
)
from ingestion.dataset.format import (
    DatasetFinding,
    DatasetStudy,
    ImportProgress,
    ImportResult,
    Label,
    Provenance,
    Skipped,
    SourceType,
    finding_id,
)

if TYPE_CHECKING:
    from pydicom import Dataset

    from ingestion.dicom.stack import SeriesRef

__all__ = ["ValueLimits", "import_sr"]

logger = logging.getLogger(__name__)


def _is_sr(path: Path) -> bool:
    from pydicom import dcmread
    from pydicom.errors import InvalidDicomError

    try:
        header = dcmread(path, stop_before_pixels=True, specific_tags=["Modality", "SOPClassUID"])
    except (InvalidDicomError, OSError, ValueError, EOFError):
        return False
    sop_class = str(header.get("SOPClassUID", ""))
    return header.get("Modality") == "SR" or sop_class.startswith("1.2.840.10008.5.1.4.1.1.88.")


def _evidence(sr: Dataset) -> frozenset[str]:
    out = set()
    for keyword in ("CurrentRequestedProcedureEvidenceSequence", "PertinentOtherEvidenceSequence"):
        for study in sr.get(keyword, []):
            for series in study.get("ReferencedSeriesSequence", []):
                out.add(str(series.SeriesInstanceUID))
    return frozenset(out)


def _observers(root: Dataset) -> tuple[str | None, str | None]:
    """The document's (person observer name, device observer name)."""
    person = device = None
    for child in children(root):
        if child.get("RelationshipType") != "HAS OBS CONTEXT":
            continue
        name = child.ConceptNameCodeSequence[0]
        if code_value(name) == "121008" and child.ValueType == "PNAME":
            person = person or person_name(child.PersonName)
        if code_value(name) == "121013" and child.ValueType == "TEXT":
            device = device or str(child.TextValue)
    return person, device


def _verifiers(sr: Dataset) -> list[str]:
    if sr.get("VerificationFlag") != "VERIFIED":
        return []
    return [person_name(o.VerifyingObserverName) for o in sr.get("VerifyingObserverSequence", [])]


def _annotator(group: Dataset, document: str, verifiers: Sequence[str]) -> str:
    name, version = text_of(group, "111001"), text_of(group, "111003")
    if name is None:
        return document
    who = f"{name} {version} (model)" if version else f"{name} (model)"
    statuses = set(review_statuses(group).values())
    by = ", ".join(verifiers) if verifiers else "a reviewer"
    if "corrected" in statuses:
        who += f", corrected by {by}"
    elif statuses and statuses <= {"accepted"}:
        who += f", accepted by {by}"
    return who


def _segment(axis: Axis | None) -> Any:
    return None if axis is None or axis.points is None else axis.points.tolist()


def _finding(
    read: GroupRead, group: Dataset, label: str, provenance: Provenance, key: str, index: ImageIndex
) -> DatasetFinding:
    """The dataset row of a group read (raises ValueError where the values do not make one,
    e.g. a short axis longer than the long axis)."""
    ref = read.at.ref
    x, y, z = (float(v) for v in read.centre)

    def value(name: str) -> float | None:
        axis = read.axes.get(name)
        return None if axis is None else axis.value_mm

    return DatasetFinding(
        id=finding_id(provenance, ref.info.series_instance_uid, key),
        study_instance_uid=ref.info.study_instance_uid,
        series_instance_uid=ref.info.series_instance_uid,
        image=index.image_ref(ref),
        kind=read.kind,
        label=Label.FINDING,
        name=text_of(group, "112039") or label,
        center_lps_mm=(x, y, z),
        slice_index=read.at.index,
        provenance=provenance,
        long_axis_mm=value("long_axis"),
        short_axis_mm=value("short_axis"),
        diameter_mm=value("diameter"),
        long_axis_lps_mm=_segment(read.axes.get("long_axis")),
        short_axis_lps_mm=_segment(read.axes.get("short_axis")),
        diameter_lps_mm=_segment(read.axes.get("diameter")),
    )


def _study_row(index: ImageIndex, ref: SeriesRef, provenance: Provenance) -> DatasetStudy:
    """The dataset study of a referenced series (``annotated=()``)."""
    return DatasetStudy(
        ref.info.study_instance_uid,
        ref.info.series_instance_uid,
        index.image_ref(ref),
        (),
        provenance,
    )


def _group_label(number: int, group: Dataset) -> str:
    tracking = text_of(group, "112039")
    return f"measurement group {number}" + (f" (tracking id {tracking})" if tracking else "")


def _import_file(
    path: Path,
    relative: str,
    index: ImageIndex,
    base: Provenance,
    annotator: str | None,
    limits: ValueLimits,
    out: Collected,
) -> None:
    import highdicom as hd
    from pydicom.sr.codedict import codes

    def skip(item: str, reason: str) -> None:
        out.skipped.append(Skipped(SourceType.SR, base.path, str(path), item, reason))

    try:
        sr = hd.sr.srread(path)
    except RuntimeError as error:  # an SR class highdicom does not read
        skip("", f"not a TID 1500 measurement report ({error})")
        return
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as error:
        skip("", f"highdicom cannot read this SR: {error}")
        return
    root = sr.content[0]
    if concept_name(root) != codes.DCM.ImagingMeasurementReport:
        skip(
            "",
            f"not a TID 1500 measurement report (its root is {code_meaning(concept_name(root))!r})",
        )
        return
    containers = [
        c for c in children(root, "CONTAINER") if concept_name(c) == codes.DCM.ImagingMeasurements
    ]
    groups = [
        g
        for c in containers
        for g in children(c, "CONTAINER")
        if concept_name(g) == codes.DCM.MeasurementGroup
    ]
    if not groups:
        skip("", "the report holds no measurement group")
    ctx = ReadContext(index, _evidence(sr), limits)
    person, device = _observers(root)
    document = annotator or person or device or "unknown"
    verifiers = _verifiers(sr)
    referenced = set(ctx.evidence)
    for number, group in enumerate(groups, start=1):
        label = _group_label(number, group)
        item = label if relative == "" else f"{relative}, {label}"
        try:
            read = read_group(group, ctx)
        except UnusableError as error:
            skip(label, str(error))
            continue
        ref = read.at.ref
        referenced.add(ref.info.series_instance_uid)
        provenance = Provenance(
            SourceType.SR,
            base.path,
            item,
            annotator or _annotator(group, document, verifiers),
            base.licence,
            content_time(sr),
        )
        key = f"{relative or path.name}#{number}"
        try:
            finding = _finding(read, group, label, provenance, key, ctx.index)
        except ValueError as error:
            skip(label, str(error))
            continue
        out.findings.append(finding)
    study_provenance = Provenance(SourceType.SR, base.path, "", base.annotator, base.licence)
    for uid in sorted(referenced):
        try:
            stack = ctx.index.stack(uid)
        except UnusableError:
            continue
        if stack is not None and uid not in out.studies:
            out.studies[uid] = _study_row(ctx.index, stack, study_provenance)


def import_sr(
    source: Path,
    *,
    limits: ValueLimits,
    images: Path | None = None,
    annotator: str | None = None,
    licence: str = "unknown",
    on_item: ImportProgress | None = None,
) -> ImportResult:
    """Import the TID 1500 measurement reports of ``source`` (an SR file or a folder tree).

    Args:
        source: a DICOM SR file, or a folder searched recursively (other files are ignored).
        limits: which values are plausible (module doc, Values), e.g.
            ``db.review.CorrectionLimits``; a group with a value outside them is skipped.
        images: where the referenced image series are (a folder tree of DICOM files); default:
            ``source`` when it is a folder, else the SR file's folder.
        annotator: who made the measurements; default: from each SR (module doc).
        licence: the input's licence or terms of use.
        on_item: progress, called before each file.

    Returns:
        One finding per usable measurement group, one study per referenced series found under
        ``images``, and a Skipped line (file, group, reason) for everything else.

    Raises:
        ConfigurationError: ``source`` or ``images`` does not exist.
    """
    return import_objects(
        SourceType.SR,
        source,
        images=images,
        annotator=annotator,
        licence=licence,
        is_object=_is_sr,
        name="SR",
        import_file=lambda path, relative, index, base, out: _import_file(
            path, relative, index, base, annotator, limits, out
        ),
        on_item=on_item,
    )
