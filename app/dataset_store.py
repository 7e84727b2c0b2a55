"""Import reviewed measurements from radcaliper's store into a dataset (``SourceType.STORE``).

A review is truth about the model's findings, so each reviewed finding (``db.training``) is one
row:

- **accepted** measurement: the truth is the model's value; the model's axis end points are kept.
- **corrected** measurement: the truth is the reviewer's value; the model's end points are left
  out (they measure the model's value, not the reviewer's).
- **all measurements rejected**: a negative example (``Label.NEGATIVE``, no values): the
  reviewer said there is no such finding there.
- **partly rejected** (e.g. long axis corrected, short axis rejected), or **partly pending**: not
  imported, with the reason in the import report. A lesion's truth needs both axes, and a
  rejected axis says the reviewer did not accept the finding as measured, which is neither a
  finding with two true axes nor a place without one.
- an accepted "not measurable" measurement (no value), or a correction that leaves a lesion's
  short axis longer than its long axis: not imported, with the reason.
- a run on a volume built in memory (``synthetic``), or whose measured path is relative or no
  longer there: not imported (there is no image to train on), with the reason.

Of each series only the latest run with a review is read (``db.training.reviewed_findings``).

Each row's annotator is ``reviewer <name>`` (``reviewers <a>, <b>`` when its measurements were
reviewed by several), its time the latest review (ISO 8601 UTC), its item ``run N finding M``,
its path the database URL with the password masked. A review covers the model's findings, not the
whole series, so the studies say nothing was annotated exhaustively (``annotated=()``): a report
the reviewers never saw is not counted as false. ``z_range_lps_mm`` is not known (None).

No patient identifier is written: rows carry UIDs and the measured path only (a site whose
folder names hold patient names should know that the path is kept, as the image reference).

The database is opened as the read-only commands open it (``db.engine.open_store`` without
creating anything): an absent SQLite file, an empty database or one at another schema version is
an error with what to do; nothing is created or migrated.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from db.audit.coverage import canonical_time
from db.engine import Store, connect, in_memory, open_store
from db.models import ReviewStatus
from db.training import ReviewedFinding, ReviewedMeasurement, Segment, reviewed_findings
from ingestion.dataset.format import (
    DatasetFinding,
    DatasetStudy,
    ImageRef,
    ImportResult,
    Label,
    Provenance,
    Skipped,
    SourceType,
    finding_id,
)
from ingestion.errors import ConfigurationError, SchemaVersionError, StorageError

__all__ = ["DEFAULT_LICENCE", "import_store"]

logger = logging.getLogger(__name__)

DEFAULT_LICENCE = "site data: see your institution's terms"
_NAMES = {"lesion": ("long_axis", "short_axis"), "vessel": ("diameter",)}
_IMAGE_FORMATS = ("dicom", "nifti", "nrrd")


def import_store(url: str, *, licence: str = DEFAULT_LICENCE) -> ImportResult:
    """The reviewed findings of the store at ``url`` as dataset rows (module doc).

    Raises:
        ConfigurationError: ``url`` is not a database URL, or names an SQLite file that does
            not exist (it is not created); an empty ``licence``.
        StorageError: the database cannot be reached, is empty, or is not at this radcaliper's
            schema version (``SchemaVersionError``).
    """
    if not licence.strip():
        raise ConfigurationError("the licence must not be empty (say the data's terms of use)")
    path = _input_name(url)
    store = _open(url, path)
    try:
        with store.reader() as session:
            findings = reviewed_findings(session)
    except SQLAlchemyError as error:
        raise StorageError(f"cannot read the reviews in {path}: {error}") from error
    finally:
        store.dispose()
    result = _rows(findings, path=path, licence=licence)
    logger.info(
        "store %s: %d reviewed finding(s), %d imported, %d skipped",
        path,
        len(findings),
        len(result.findings),
        len(result.skipped),
    )
    return result


def _input_name(url: str) -> str:
    """The URL as the rows name it: password masked, an SQLite file's path made absolute."""
    try:
        parsed = make_url(url)
    except ArgumentError as error:
        raise ConfigurationError(
            f"{url!r} is not a database URL; use e.g. sqlite:///path/radcaliper.sqlite3 or "
            "postgresql://user@host/dbname"
        ) from error
    if parsed.get_backend_name() == "sqlite":
        if in_memory(parsed):
            raise ConfigurationError(
                "an in-memory SQLite database holds no reviews; give the URL of the store the "
                "review UI uses (sqlite:///path/radcaliper.sqlite3)"
            )
        database = str(parsed.database)
        if not database.startswith("file:"):
            file = Path(database).expanduser().resolve()
            if not file.is_file():
                raise ConfigurationError(
                    f"there is no database at {file}: nothing to import (give the URL of the "
                    "store the review UI uses; importing does not create one)"
                )
            parsed = parsed.set(database=str(file))
    return parsed.render_as_string(hide_password=True)


def _open(url: str, shown: str) -> Store:
    try:
        return open_store(url, create_if_empty=False)
    except SchemaVersionError:
        if _has_tables(url):
            raise
        raise StorageError(
            f"the database {shown} is empty (no radcaliper store in it): there are no reviewed "
            "measurements to import; give the URL of the store the review UI uses"
        ) from None


def _has_tables(url: str) -> bool:
    engine = connect(url)
    try:
        return bool(inspect(engine).get_table_names())
    finally:
        engine.dispose()


# -- rows -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Truth:
    """What the reviews make of one finding."""

    label: Label
    values: dict[str, float]  # measurement name -> true value (mm)
    segments: dict[str, Segment]  # measurement name -> the model's end points (accepted only)


def _rows(findings: Sequence[ReviewedFinding], *, path: str, licence: str) -> ImportResult:
    """Dataset rows of ``findings`` (one import of the store named ``path``)."""
    studies: dict[str, DatasetStudy] = {}
    out: list[DatasetFinding] = []
    skipped: list[Skipped] = []
    for finding in findings:
        item = f"run {finding.run_id} finding {finding.finding_number}"
        image = _image(finding)
        if isinstance(image, str):
            skipped.append(Skipped(SourceType.STORE, path, finding.source, item, image))
            continue
        truth = _truth(finding)
        if isinstance(truth, str):
            skipped.append(Skipped(SourceType.STORE, path, path, item, truth))
            continue
        reviewed = [m for m in finding.measurements if m.reviewed]
        provenance = Provenance(
            SourceType.STORE,
            path,
            item,
            annotator=_annotator(reviewed),
            licence=licence,
            annotated_at=_latest(reviewed),
        )
        out.append(_row(finding, image, truth, provenance))
        studies.setdefault(
            finding.series_instance_uid,
            DatasetStudy(
                finding.study_instance_uid,
                finding.series_instance_uid,
                image,
                (),
                Provenance(SourceType.STORE, path, "", "radcaliper reviewers", licence),
            ),
        )
    return ImportResult(SourceType.STORE, path, tuple(studies.values()), tuple(out), tuple(skipped))


def _image(finding: ReviewedFinding) -> ImageRef | str:
    """The measured image, or why there is none to read."""
    if finding.source_format not in _IMAGE_FORMATS:
        return (
            f"no image file: the run measured a volume built in memory "
            f"({finding.source_format}, {finding.source!r})"
        )
    source = Path(finding.source)
    if not source.is_absolute():
        return (
            f"the run's source {finding.source!r} is a relative path and the folder it was "
            "measured from is not stored; measure with an absolute path to import its reviews"
        )
    if not source.exists():
        return f"the measured image is no longer at {finding.source}"
    return ImageRef(finding.source, finding.source_format, finding.modality)


def _truth(finding: ReviewedFinding) -> _Truth | str:
    """The finding's truth from its reviews, or why it has none (module doc)."""
    expected = _NAMES.get(finding.kind)
    by_name = {m.name: m for m in finding.measurements}
    if expected is None or tuple(by_name) != expected:
        return f"a {finding.kind} with measurements {', '.join(by_name)} is not a known finding"
    statuses = {m.status for m in finding.measurements}
    if statuses == {ReviewStatus.REJECTED}:
        return _Truth(Label.NEGATIVE, {}, {})
    pending = [name for name, m in by_name.items() if m.status is ReviewStatus.PENDING]
    if pending:
        return f"partly reviewed: the {_said(pending)} not reviewed yet"
    rejected = [name for name, m in by_name.items() if m.status is ReviewStatus.REJECTED]
    if rejected:
        kept = [name for name in expected if name not in rejected]
        return (
            f"the {_said(rejected)} rejected but the {_said(kept)} kept: a {finding.kind}'s "
            "truth needs all its measurements"
        )
    values: dict[str, float] = {}
    segments: dict[str, Segment] = {}
    for index, name in enumerate(expected):
        measurement = by_name[name]
        value = _true_value(measurement)
        if value is None:
            return f"the {name.replace('_', ' ')} was accepted without a value (not measurable)"
        values[name] = value
        axes = finding.axes_lps_mm
        if measurement.status is ReviewStatus.ACCEPTED and axes and index < len(axes):
            segments[name] = axes[index]
    if finding.kind == "lesion" and values["short_axis"] > values["long_axis"]:
        return (
            f"after review the short axis ({values['short_axis']:g} mm) exceeds the long axis "
            f"({values['long_axis']:g} mm)"
        )
    return _Truth(Label.FINDING, values, segments)


def _true_value(measurement: ReviewedMeasurement) -> float | None:
    if measurement.status is ReviewStatus.CORRECTED:
        return measurement.reviewed_value_mm
    return measurement.value_mm


def _said(names: Sequence[str]) -> str:
    text = " and ".join(name.replace("_", " ") for name in names)
    return f"{text} {'were' if len(names) > 1 else 'was'}"


def _annotator(reviewed: Sequence[ReviewedMeasurement]) -> str:
    names = sorted({m.reviewer for m in reviewed if m.reviewer})
    if not names:
        return "reviewer (unknown)"
    return f"reviewer{'s' if len(names) > 1 else ''} {', '.join(names)}"


def _latest(reviewed: Sequence[ReviewedMeasurement]) -> str | None:
    times = [m.reviewed_at for m in reviewed if m.reviewed_at is not None]
    return canonical_time(max(times)) if times else None


def _row(
    finding: ReviewedFinding, image: ImageRef, truth: _Truth, provenance: Provenance
) -> DatasetFinding:
    values, segments = truth.values, truth.segments
    return DatasetFinding(
        id=finding_id(provenance, finding.series_instance_uid, provenance.item),
        study_instance_uid=finding.study_instance_uid,
        series_instance_uid=finding.series_instance_uid,
        image=image,
        kind="lesion" if finding.kind == "lesion" else "vessel",
        label=truth.label,
        name=f"finding {finding.finding_number}",
        center_lps_mm=finding.center_lps_mm,
        slice_index=finding.slice_index,
        provenance=provenance,
        long_axis_mm=values.get("long_axis"),
        short_axis_mm=values.get("short_axis"),
        diameter_mm=values.get("diameter"),
        long_axis_lps_mm=segments.get("long_axis"),
        short_axis_lps_mm=segments.get("short_axis"),
        diameter_lps_mm=segments.get("diameter"),
    )
