"""DICOM SR export: one TID 1500 Comprehensive 3D SR per study, built from the store (highdicom).

What goes in, and the choices made (README "DICOM SR"):

- **Which run**: the run the review UI shows (``db.queries.shown_run_order``): the study's
  latest run of the whole study, else its latest run of clicked points (``measure --at``). Each
  finding is one measurement group (TID 1501) with a tracking identifier ("finding N") and a
  tracking UID that is derived from the run's identity and the finding number
  (:func:`tracking_uid`), so exporting again gives the same UID; finding type (SCT Lesion /
  Blood Vessel); the algorithm (model name, version, "NOT FOR CLINICAL USE" in the name when the
  model is the demo, and the calibrated coverage as a parameter); and the measured slice as
  source image.
- **Values**: Long Axis / Short Axis / Diameter (SCT) in UCUM ``mm``. The value is the current
  one: the model's, or the reviewer's when corrected. The calibrated range (nominal coverage,
  e.g. 90 %) is written as the measurement's lower / upper measurement uncertainty (TID 310
  Measurement Properties): ``value - low`` and ``high - value``. A corrected value carries no
  range, no algorithm and no axis coordinates (the range was calibrated around the model's
  value, the axes are the model's, and the value is the reviewer's). Rejected measurements are
  left out; a finding with nothing left is left out, and a study with no finding left gets no SR
  (``NothingToExportError``: TID 1500 needs a measurement group). "Not measurable" (no value) is
  left out too: highdicom's NUM item needs a value.
- **Implausible values**: a value that is not plausible (not finite, not > 0, or over its
  measurement's limit, ``db.review.CorrectionLimits``: what a correction may be today), e.g. a
  1e308 mm correction stored before corrections were checked, is left out with a warning that
  names the finding and the measurement, and the document is then not VERIFIED (UNVERIFIED,
  PARTIAL, PRELIMINARY): the SR never presents such a value, nor a set missing one, as verified.
  :attr:`SrExport.left_out` lists what was left out.
- **Review**: each measurement's review status is a qualitative evaluation (private coding scheme
  ``99RADCAL``). The document is VERIFIED, with one verifying observer per reviewer (name, time of
  their last review), once every measurement of the run is reviewed, and then COMPLETE and
  FINAL (DICOM allows VERIFIED only with COMPLETE); else UNVERIFIED, PARTIAL and PRELIMINARY.
- **What the store lacks**: it keeps no source headers, so the patient and study modules carry
  what is stored (the possibly pseudonymised patient id, the patient name where the source had
  one and the id is not pseudonymised, the study date) and leave the other type 2 attributes
  empty; the SOP class of the referenced images is derived from the modality
  (CT / MR, enhanced when the image is a frame of a multi-frame object). The evidence
  (Current Requested Procedure Evidence) lists every slice of the measured series: the model
  read them all. Finding sites are not stored and not invented.
- **Split series**: where one SeriesInstanceUID holds several stacks (axial and coronal
  reconstructions, ...), each stack is its own stored series (``db.store``), so the run's SR
  references that stack's images and maps its axes with that stack's geometry; the evidence
  names the DICOM SeriesInstanceUID, not the store's key of the stack. A run stored before
  that, under another stack's row (its findings on images the row does not hold), is refused
  with what to do (``StorageError``: measure the study again), never half-referenced.
- **Character set**: Specific Character Set is ISO_IR 192 (UTF-8) when any text of the document
  (patient id or name, reviewers, organization, model) is not ASCII, so ``PAT-Ünïcödé-日本`` is
  written as it is stored; otherwise it is left out (the default repertoire).
- **Identity**: every export is a new SR instance (new series and SOP instance UIDs); the
  tracking UIDs stay the same, so a PACS can relate the findings across exports.
- **Axes**: each measurement's axis end points (stored in LPS mm) are an SCOORD POLYLINE in
  (column, row) image coordinates of the measured slice, mapped with the series geometry the
  store keeps since schema 0002 (points within half a slice of the measured slice are projected
  onto it; axes further off are left out with a warning). Not SCOORD3D: the store keeps no
  frame of reference UID. A series stored before 0002 (no geometry) has no coordinates.
  A measurement is a caliper: an axis whose length on the slice differs from the exported value
  by more than a pixel (the larger pixel spacing) would contradict it, so it is left out with
  a warning and the value goes without coordinates (``dataset import --from sr`` skips a value
  that contradicts its own line).
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingestion.errors import NothingToExportError, StorageError

if TYPE_CHECKING:
    from pydicom import Dataset
    from sqlalchemy.orm import Session

    from db.models import Finding, Measurement, Run, Series, Study
    from db.review import CorrectionLimits

__all__ = ["SOP_CLASSES", "SrExport", "export_study_sr", "sr_path", "tracking_uid"]

logger = logging.getLogger(__name__)

# (modality, multi-frame) -> referenced image SOP class (derived: the store keeps no SOP class)
SOP_CLASSES = {
    ("CT", False): "1.2.840.10008.5.1.4.1.1.2",  # CT Image Storage
    ("CT", True): "1.2.840.10008.5.1.4.1.1.2.1",  # Enhanced CT Image Storage
    ("MR", False): "1.2.840.10008.5.1.4.1.1.4",  # MR Image Storage
    ("MR", True): "1.2.840.10008.5.1.4.1.1.4.1",  # Enhanced MR Image Storage
}
PRIVATE_SCHEME = "99RADCAL"
_NAMES = {"long_axis": "LongAxis", "short_axis": "ShortAxis", "diameter": "Diameter"}
_KINDS = {"lesion": "Lesion", "vessel": "BloodVessel"}  # SCT codes (pydicom codes.SCT)


UTF8 = "ISO_IR 192"  # Specific Character Set of a document with text that is not ASCII
_TEXT_VRS = {"AE", "AS", "CS", "DA", "DS", "DT", "IS", "LO", "LT", "PN", "SH", "ST", "TM", "UC",
             "UI", "UR", "UT"}  # fmt: skip


@dataclass(frozen=True)
class SrExport:
    path: Path
    groups: int  # measurement groups (findings) written
    verified: bool
    left_out: tuple[str, ...] = ()  # implausible values not exported (why, per measurement)


def sr_path(out_dir: Path, study_instance_uid: str) -> Path:
    """Where the study's SR goes: ``OUT_DIR/<study uid>.sr.dcm``."""
    return out_dir / f"{study_instance_uid}.sr.dcm"


def _derived_uid(*sources: str) -> str:
    """A ``2.25.`` UID (UUID-derived, DICOM PS3.5 B.2) from the sha256 of ``sources``."""
    digest = hashlib.sha256("\x1f".join(sources).encode()).digest()
    return f"2.25.{int.from_bytes(digest[:16], 'big')}"


def tracking_uid(run: Run, finding: Finding) -> str:
    """The finding's tracking UID: the same run and finding number give the same UID."""
    return _derived_uid(
        run.series.series_instance_uid,
        run.model_name,
        run.model_version,
        run.checkpoint_hash,
        run.input_fingerprint,
        str(finding.number),
    )


def _latest_run(session: Session, study_instance_uid: str) -> tuple[Study, Run | None]:
    from sqlalchemy import select

    from db.models import Run, Series, Study
    from db.queries import shown_run_order

    study = session.execute(
        select(Study).where(Study.study_instance_uid == study_instance_uid)
    ).scalar_one_or_none()
    if study is None:
        raise StorageError(
            f"there is no study {study_instance_uid} in the database; "
            "`radcaliper audit measurements` lists the stored studies"
        )
    run = session.execute(
        select(Run)
        .join(Series, Run.series_id == Series.id)
        .where(Series.study_id == study.id)
        .order_by(*shown_run_order())
        .limit(1)
    ).scalar_one_or_none()
    return study, run


def _sop_class(series: Series, frame: int | None) -> str:
    key = (series.modality or "", frame is not None)
    if key not in SOP_CLASSES:
        raise StorageError(
            f"cannot export SR: series {series.series_instance_uid} has modality "
            f"{series.modality or 'unknown'}; the SR references CT or MR images"
        )
    return SOP_CLASSES[key]


def _evidence(study: Study, series: Series) -> list[Dataset]:
    """Stand-ins for the measured series' images: what the store keeps of them."""
    from pydicom import Dataset

    from db.store import dicom_series_uid

    uids = series.sop_instance_uids.get("uids", [])
    frames = series.sop_instance_uids.get("frames", [])
    out: dict[str, Dataset] = {}
    for uid, frame in zip(uids, frames, strict=False):
        if uid is None or uid in out:
            continue
        ds = Dataset()
        ds.PatientID = study.patient_id
        ds.PatientName = study.patient_name or ""  # kept from the source unless pseudonymised
        ds.PatientBirthDate = ""
        ds.PatientSex = ""
        ds.StudyInstanceUID = study.study_instance_uid
        ds.StudyDate = study.study_date or ""
        ds.StudyTime = ""
        ds.StudyID = ""
        ds.AccessionNumber = ""
        ds.ReferringPhysicianName = ""
        ds.SeriesInstanceUID = dicom_series_uid(series)  # not a split series' stack key
        ds.SOPClassUID = _sop_class(series, frame)
        ds.SOPInstanceUID = uid
        out[uid] = ds
    if not out:
        raise StorageError(
            f"cannot export SR for study {study.study_instance_uid}: its series "
            f"{series.series_instance_uid} has no DICOM SOP instances (read from "
            f"{series.source_format}); an SR must reference DICOM images"
        )
    return list(out.values())


def _check_images(study_instance_uid: str, run: Run, held: set[str]) -> None:
    """Refuses a run whose findings lie on images its series row does not hold: a run of one
    stack stored under another stack's row, before radcaliper told the stacks of a series
    apart (``db.store``). Its SR would reference images it does not list, with the other
    stack's geometry."""
    for finding in run.findings:
        uid = finding.sop_instance_uid
        if uid is not None and uid not in held:
            raise StorageError(
                f"cannot export SR for study {study_instance_uid}: finding {finding.number} of "
                f"run {run.id} lies on image {uid}, which its series row "
                f"{run.series.series_instance_uid} does not hold (a series of several stacks, "
                "stored before each stack was a series of its own); measure the study again "
                "and export again"
            )


def _value(m: Measurement) -> float | None:
    from db.models import ReviewStatus

    if m.status is ReviewStatus.REJECTED:
        return None
    if m.status is ReviewStatus.CORRECTED:
        return m.reviewed_value_mm
    return m.value_mm


def _code(value: str, meaning: str) -> Any:
    from pydicom.sr.coding import Code

    return Code(value, PRIVATE_SCHEME, meaning)


@dataclass(frozen=True)
class _SliceAxis:
    """One axis on the measured slice: SCOORD (column, row) end points and their length."""

    column_row: Any  # (2, 2)
    length_mm: float  # of the line on the slice (what a reader of the SR measures)
    pixel_mm: float  # the larger pixel spacing of the slice


def _axes_on_slice(series: Series, finding: Finding) -> list[_SliceAxis] | None:
    """The finding's axes as (column, row) image coordinates of the measured slice (DICOM
    SCOORD: the top left corner of the top left pixel is (0, 0), its centre (0.5, 0.5)), one
    per measurement; None without stored geometry or axes, or off the slice."""
    import numpy as np

    from ingestion.geometry import Geometry

    if series.geometry is None or finding.axes_lps_mm is None or finding.sop_instance_uid is None:
        return None
    g = series.geometry
    geometry = Geometry(
        origin=tuple(g["origin"]),
        row_direction=tuple(g["row_direction"]),
        column_direction=tuple(g["column_direction"]),
        slice_direction=tuple(g["slice_direction"]),
        spacing=tuple(g["spacing"]),
    )
    pixel = max(geometry.row_spacing, geometry.column_spacing)
    out = []
    for segment in finding.axes_lps_mm["segments"]:
        index = geometry.lps_to_index(np.asarray(segment, dtype=np.float64))  # (2, 3) s, r, c
        if np.any(np.abs(index[:, 0] - finding.slice_index) > 0.5):
            logger.warning(
                "finding %d: axes leave the measured slice; not exported", finding.number
            )
            return None
        on_slice = index.copy()
        on_slice[:, 0] = finding.slice_index
        a, b = geometry.index_to_lps(on_slice)
        out.append(
            _SliceAxis(
                np.stack([index[:, 2] + 0.5, index[:, 1] + 0.5], axis=1),
                float(np.linalg.norm(b - a)),
                pixel,
            )
        )
    return out


def _caliper(finding: Finding, m: Measurement, value: float, axis: _SliceAxis | None) -> Any:
    """The axis' SCOORD points, or None (with a warning) when its length contradicts ``value``
    by more than a pixel (module doc, Axes)."""
    if axis is None:
        return None
    if abs(value - axis.length_mm) <= axis.pixel_mm:
        return axis.column_row
    logger.warning(
        "SR: finding %d, measurement %d: the value %g mm and its axis (%.4g mm on the slice) "
        "differ by more than a pixel (%g mm); the axis is left out",
        finding.number,
        m.id,
        value,
        axis.length_mm,
        axis.pixel_mm,
    )
    return None


def _measurement(
    m: Measurement, value: float, algorithm: Any, axis: Any | None, image: Any | None
) -> Any:
    import highdicom as hd
    from pydicom.sr.codedict import codes

    from db.models import ReviewStatus

    properties = None
    if m.status is not ReviewStatus.CORRECTED and m.range_low_mm is not None:
        high = m.range_high_mm if m.range_high_mm is not None else value
        lower, upper = value - m.range_low_mm, high - value
        if not (math.isfinite(lower) and math.isfinite(upper)):  # a stored range DICOM can't carry
            logger.warning("SR: measurement %d: range (%g, %g) left out", m.id, lower, upper)
        else:
            properties = hd.sr.MeasurementProperties(
                lower_measurement_uncertainty=lower, upper_measurement_uncertainty=upper
            )
            for item in properties:  # highdicom writes these with unit "1"; they are in mm
                if item.ValueType == "NUM":
                    unit = hd.sr.CodedConcept.from_code(codes.UCUM.Millimeter)
                    item.MeasuredValueSequence[0].MeasurementUnitsCodeSequence = [unit]
    return hd.sr.Measurement(
        name=getattr(codes.SCT, _NAMES[m.name]),
        value=value,
        unit=codes.UCUM.Millimeter,
        # a corrected value is the reviewer's, not the algorithm's
        algorithm_id=None if m.status is ReviewStatus.CORRECTED else algorithm,
        properties=properties,
        referenced_coordinates=None
        if axis is None or image is None or m.status is ReviewStatus.CORRECTED
        else [
            hd.sr.CoordinatesForMeasurement(
                graphic_type=hd.sr.GraphicTypeValues.POLYLINE,
                graphic_data=axis,
                source_image=image,
            )
        ],
    )


def _plausible(
    finding: Finding, m: Measurement, value: float | None, limits: CorrectionLimits, out: list[str]
) -> float | None:
    """``value``, or None (with the reason added to ``out`` and logged) when it is implausible."""
    if value is None:
        return None
    problem = limits.problem(m.name, value)
    if problem is None:
        return value
    why = f"finding {finding.number}, measurement {m.id} ({m.status}): {problem}"
    logger.warning("SR: left out %s", why)
    out.append(why)
    return None


def _group(run: Run, finding: Finding, limits: CorrectionLimits, left_out: list[str]) -> Any | None:
    import highdicom as hd
    from pydicom.sr.codedict import codes

    axes = _axes_on_slice(run.series, finding)
    kept = [
        (m, v, _caliper(finding, m, v, None if axes is None or i >= len(axes) else axes[i]))
        for i, m in enumerate(finding.measurements)
        if (v := _plausible(finding, m, _value(m), limits, left_out)) is not None
    ]
    if not kept:
        return None
    coverages = sorted({m.coverage for m, _, _ in kept if m.coverage is not None})
    name = run.model_name + (" (NOT FOR CLINICAL USE)" if run.not_for_clinical_use else "")
    algorithm = hd.sr.AlgorithmIdentification(
        name=name[:64],
        version=run.model_version[:64],
        parameters=[f"calibrated range coverage {c:g}" for c in coverages] or None,
    )
    source, image = [], None
    if finding.sop_instance_uid is not None:
        frame = finding.frame_number
        sop_class, frames = _sop_class(run.series, frame), None if frame is None else [frame]
        uid = finding.sop_instance_uid
        source.append(hd.sr.SourceImageForMeasurementGroup(sop_class, uid, frames))
        image = hd.sr.SourceImageForRegion(sop_class, uid, frames)
    return hd.sr.MeasurementsAndQualitativeEvaluations(
        tracking_identifier=hd.sr.TrackingIdentifier(
            uid=tracking_uid(run, finding), identifier=f"finding {finding.number}"
        ),
        finding_type=getattr(codes.SCT, _KINDS[finding.kind]),
        algorithm_id=algorithm,
        measurements=[_measurement(m, v, algorithm, axis, image) for m, v, axis in kept],
        qualitative_evaluations=[
            hd.sr.QualitativeEvaluation(
                name=_code(f"review-{m.name}", f"Review status of {m.name.replace('_', ' ')}"),
                value=_code(str(m.status), str(m.status)),
            )
            for m, _, _ in kept
        ],
        source_images=source or None,
    )


def _verifiers(run: Run) -> list[tuple[str, datetime]] | None:
    """(reviewer, time of their last review) when every measurement is reviewed, else None."""
    from db.models import ReviewStatus

    last: dict[str, datetime] = {}
    for finding in run.findings:
        for m in finding.measurements:
            if m.status is ReviewStatus.PENDING or m.reviewer is None or m.reviewed_at is None:
                return None
            name = m.reviewer.name
            last[name] = max(last.get(name, m.reviewed_at), m.reviewed_at)
    return sorted(last.items()) or None


def export_study_sr(
    session: Session,
    study_instance_uid: str,
    out_dir: Path,
    *,
    organization: str = "radcaliper",
    limits: CorrectionLimits | None = None,
) -> SrExport:
    """Write the study's SR to ``OUT_DIR/<study uid>.sr.dcm`` (replacing an earlier export),
    readable by its owner only (0600; missing folders 0700), whatever the umask.

    ``organization`` is the verifying organization of a verified document. ``limits``: which
    values are plausible (default ``CorrectionLimits()``); the others are left out, with a
    warning, and the document is then not verified.

    Raises:
        NothingToExportError: no finding has a measurement left to export (none found, all
            rejected or not measurable): TID 1500 needs at least one measurement group, so no
            file is written (a batch notes it and goes on).
        StorageError: the study is not stored, has no run, or was not read from DICOM.
    """
    import highdicom as hd
    from pydicom import Dataset
    from pydicom.sr.codedict import codes
    from pydicom.uid import generate_uid

    from app.files import private_file
    from db.private_paths import make_private_dirs
    from db.review import CorrectionLimits

    study, run = _latest_run(session, study_instance_uid)
    if run is None:
        raise StorageError(f"study {study_instance_uid} has no stored run to export")
    evidence = _evidence(study, run.series)
    _check_images(study_instance_uid, run, {str(ds.SOPInstanceUID) for ds in evidence})
    left_out: list[str] = []
    limits = limits or CorrectionLimits()
    groups = [g for f in run.findings if (g := _group(run, f, limits, left_out)) is not None]
    if not groups:
        raise NothingToExportError(
            f"study {study_instance_uid} has no measurement to export ({len(run.findings)} "
            "finding(s), none with a measurement that is not rejected, not measurable or "
            f"implausible ({len(left_out)} left out as implausible)); no SR written"
        )
    observer = hd.sr.ObserverContext(
        observer_type=codes.cid270.Device,
        observer_identifying_attributes=hd.sr.DeviceObserverIdentifyingAttributes(
            uid=_derived_uid(run.model_name, run.model_version, run.checkpoint_hash),
            name=run.model_name[:64],
            manufacturer_name="radcaliper",
            model_name=run.model_version[:64],
        ),
    )
    report = hd.sr.MeasurementReport(
        observation_context=hd.sr.ObservationContext(observer_device_context=observer),
        procedure_reported=codes.LN.CTUnspecifiedBodyRegion
        if run.series.modality == "CT"
        else codes.LN.MRUnspecifiedBodyRegion,
        imaging_measurements=groups,
    )
    verifiers = None if left_out else _verifiers(run)  # never verified with a value left out
    sr = hd.sr.Comprehensive3DSR(
        evidence=evidence,
        content=report[0],
        series_instance_uid=generate_uid(),
        series_number=9901,
        sop_instance_uid=generate_uid(),
        instance_number=1,
        manufacturer="radcaliper",
        is_complete=verifiers is not None,  # DICOM: VERIFIED only with COMPLETE
        is_final=verifiers is not None,
        is_verified=verifiers is not None,
        verifying_observer_name=None if verifiers is None else _person(verifiers[0][0]),
        verifying_organization=None if verifiers is None else organization,
        series_description=_description(run),
    )
    scheme = Dataset()
    scheme.CodingSchemeDesignator = PRIVATE_SCHEME
    scheme.CodingSchemeName = "radcaliper review status"
    scheme.CodingSchemeResponsibleOrganization = "radcaliper"
    sr.CodingSchemeIdentificationSequence = [scheme]
    if verifiers is not None:
        sr.VerifyingObserverSequence = [_observer(n, t, organization) for n, t in verifiers]
    if _has_non_ascii(sr):  # e.g. PAT-Ünïcödé-日本: UTF-8, not "?" in the default repertoire
        sr.SpecificCharacterSet = UTF8
    make_private_dirs(out_dir)  # the folders it creates are 0700, whatever the umask
    path = sr_path(out_dir, study_instance_uid)
    partial = path.with_name(path.name + ".partial")  # never a half-written SR under its name
    with private_file(partial) as file:  # 0600: it names the patient
        sr.save_as(file, enforce_file_format=True)
    partial.replace(path)
    logger.info("wrote SR %s (%d measurement groups)", path, len(groups))
    return SrExport(
        path=path, groups=len(groups), verified=verifiers is not None, left_out=tuple(left_out)
    )


def _has_non_ascii(ds: Dataset) -> bool:
    """Whether any text value of ``ds`` (nested sequences included) is not ASCII."""
    for element in ds:
        if element.VR == "SQ":
            if any(_has_non_ascii(item) for item in element.value):
                return True
        elif element.VR in _TEXT_VRS and element.value is not None:
            values = element.value if element.VM > 1 else [element.value]
            if any(not str(v).isascii() for v in values):
                return True
    return False


def _description(run: Run) -> str:
    """The SR series' description: the model, and "not for clinical use" where it applies."""
    tail = ", NOT FOR CLINICAL USE" if run.not_for_clinical_use else ""
    model = f"{run.model_name} {run.model_version}"[: 64 - len("radcaliper ()") - len(tail)]
    return f"radcaliper ({model}{tail})"


def _person(login: str) -> str:
    """A user name as a DICOM person name: a login is the family name (``alice^``)."""
    return login if "^" in login else f"{login}^"


def _observer(name: str, at: datetime, organization: str) -> Dataset:
    from pydicom import Dataset
    from pydicom.valuerep import DT

    item = Dataset()
    item.VerifyingObserverName = _person(name)
    item.VerifyingOrganization = organization
    # the store writes UTC; SQLite gives it back without the zone
    item.VerificationDateTime = DT(at if at.tzinfo else at.replace(tzinfo=UTC))
    item.VerifyingObserverIdentificationCodeSequence = []
    return item
