"""Reviewed measurements as training rows: the typed query over a real store (SQLite and
PostgreSQL) and ``radcaliper dataset import`` of a store: accepted -> the model's value,
corrected -> the reviewer's, all rejected -> a negative example, the rest in the report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import inspect, select
from sqlalchemy.engine import make_url

from app.dataset_store import DEFAULT_LICENCE, import_store
from db.audit.coverage import canonical_time
from db.engine import Store, connect
from db.models import Finding, Measurement, ReviewStatus, Study, User
from db.review import review_measurement
from db.training import ReviewedMeasurement, reviewed_findings
from ingestion.dataset.format import (
    DatasetFinding,
    DatasetStudy,
    ImageRef,
    Label,
    Provenance,
    Skipped,
    SourceType,
    finding_id,
    write_import,
)
from ingestion.errors import ConfigurationError, StorageError
from ingestion.geometry import Geometry
from ingestion.load import load_path
from ingestion.volume import Volume
from model.measurer.results import (
    NOT_MEASURABLE,
    FindingKind,
    ModelInfo,
    StudyFinding,
    StudyResult,
)
from model.measurer.results import Measurement as Measured
from model.measurer.results import MeasurementName as Name

from tests.support.db import store_one
from tests.support.series import SeriesFactory

KEY = "site-secret"  # the pseudonym key: the stored patient id is a pseudonym
LONG_AXIS = ((0.0, -10.0, 35.0), (24.0, 8.0, 35.0))  # the model's end points of finding 1
SHORT_AXIS = ((18.0, -8.0, 35.0), (6.0, 8.0, 35.0))
DIAMETER = ((-5.0, 0.0, 32.5), (20.0, 0.0, 32.5))


def _lesion(number: int, long_mm: float, short_mm: float, axes: bool = False) -> StudyFinding:
    return StudyFinding(
        number,
        FindingKind.LESION,
        (float(number), 2.0 * number, 35.0),
        2,
        (Measured(Name.LONG_AXIS, long_mm), Measured(Name.SHORT_AXIS, short_mm)),
        (LONG_AXIS, SHORT_AXIS) if axes else None,
    )


def _result(volume: Volume, source: str, *, version: str = "1.0.0") -> StudyResult:
    ids = volume.identifiers
    vessel = StudyFinding(
        2,
        FindingKind.VESSEL,
        (7.5, 0.0, 32.5),
        1,
        (Measured(Name.DIAMETER, 25.0, (24.0, 26.0), 0.9),),
        (DIAMETER,),
    )
    not_measurable = StudyFinding(
        7,
        FindingKind.VESSEL,
        (1.0, 1.0, 30.0),
        0,
        (Measured(Name.DIAMETER, None, qualifier=NOT_MEASURABLE, reason="blurred"),),
    )
    findings = (
        _lesion(1, 30.0, 20.0, axes=True),
        vessel,
        _lesion(3, 12.0, 8.0),
        _lesion(4, 40.0, 30.0),
        _lesion(5, 15.0, 10.0),
        _lesion(6, 16.0, 11.0),
        not_measurable,
    )
    model = ModelInfo("radcaliper-test", version, "rned_corr")
    patient = ids.patient_id or ""
    return StudyResult(
        ids.study_instance_uid, ids.series_instance_uid, patient, source, model, findings
    )


def _ids(store: Store, run_id: int) -> dict[tuple[int, str], int]:
    """Measurement ids by (finding number, measurement name) of one run."""
    with store.reader() as session:
        rows = session.execute(
            select(Finding.number, Measurement.name, Measurement.id)
            .join(Finding, Measurement.finding_id == Finding.id)
            .where(Finding.run_id == run_id)
        )
        return {(number, name): mid for number, name, mid in rows}


def _review(store: Store, mid: int, user: User, action: str, value: float | None = None) -> None:
    with store.writer() as session:
        review_measurement(
            session,
            mid,
            action=action,
            reviewer=user,
            seen_version=1,
            value_mm=value,
            reason=None if action == "accept" else f"{action} by {user.name}",
        )
        session.commit()


def _reviewed_at(store: Store, *mids: int) -> str:
    """The latest review time of these measurements, as the rows give it."""
    with store.reader() as session:
        times = session.execute(
            select(Measurement.reviewed_at).where(Measurement.id.in_(mids))
        ).scalars()
        return canonical_time(max(t for t in times if t is not None))


@dataclass
class Reviewed:
    """A measured, stored and reviewed DICOM series."""

    folder: Path
    volume: Volume
    run_id: int
    ids: dict[tuple[int, str], int]


@pytest.fixture
def reviewed(
    store: Store, users: dict[str, User], write_series: SeriesFactory, tmp_path: Path
) -> Reviewed:
    """Findings 1-7 of :func:`_result`, reviewed: 1 long axis accepted (alice), short axis
    corrected 20 -> 18 (bob); 2 vessel accepted; 3 both axes rejected; 4 long axis corrected,
    short axis rejected; 5 not reviewed; 6 long axis accepted, short axis pending; 7 a "not
    measurable" diameter accepted."""
    folder = tmp_path / "ct"
    write_series(folder, n=4, rows=8, cols=10)
    (volume,) = load_path(folder).volumes
    run_id = store_one(store, _result(volume, str(folder)), volume, pseudonym_key=KEY).run_id
    ids = _ids(store, run_id)
    alice, bob = users["alice"], users["bob"]
    _review(store, ids[1, "long_axis"], alice, "accept")
    _review(store, ids[1, "short_axis"], bob, "correct", 18.0)
    _review(store, ids[2, "diameter"], alice, "accept")
    _review(store, ids[3, "long_axis"], alice, "reject")
    _review(store, ids[3, "short_axis"], alice, "reject")
    _review(store, ids[4, "long_axis"], bob, "correct", 42.0)
    _review(store, ids[4, "short_axis"], bob, "reject")
    _review(store, ids[6, "long_axis"], alice, "accept")
    _review(store, ids[7, "diameter"], alice, "accept")
    return Reviewed(folder, volume, run_id, ids)


def _url(store: Store) -> str:
    """The store's URL; on PostgreSQL with a password (the test server trusts local
    connections, so any password is accepted), to see it masked in the rows."""
    url = make_url(store.url)
    if store.backend == "postgresql" and url.password is None:
        url = url.set(password="s3cret")
    return url.render_as_string(hide_password=False)


def _shown(url: str) -> str:
    """How the rows name the store: password masked, an SQLite file's path absolute."""
    parsed = make_url(url)
    if parsed.database and parsed.get_backend_name() == "sqlite":
        parsed = parsed.set(database=str(Path(parsed.database).resolve()))
    return parsed.render_as_string(hide_password=True)


def test_reviewed_findings_are_typed_rows(store: Store, reviewed: Reviewed) -> None:
    with store.reader() as session:
        found = reviewed_findings(session)
    assert [f.finding_number for f in found] == [1, 2, 3, 4, 6, 7]  # 5 is not reviewed
    first = found[0]
    ids = reviewed.volume.identifiers
    assert (first.run_id, first.study_instance_uid, first.series_instance_uid) == (
        reviewed.run_id,
        ids.study_instance_uid,
        ids.series_instance_uid,
    )
    assert (first.source, first.source_format, first.modality) == (
        str(reviewed.folder),
        "dicom",
        "CT",
    )
    assert (first.kind, first.center_lps_mm, first.slice_index) == ("lesion", (1.0, 2.0, 35.0), 2)
    assert first.axes_lps_mm == (LONG_AXIS, SHORT_AXIS)
    assert (first.model_name, first.model_version) == ("radcaliper-test", "1.0.0")
    long_axis, short_axis = first.measurements
    assert long_axis == ReviewedMeasurement(
        "long_axis", 30.0, ReviewStatus.ACCEPTED, None, "alice", long_axis.reviewed_at
    )
    assert short_axis == ReviewedMeasurement(
        "short_axis", 20.0, ReviewStatus.CORRECTED, 18.0, "bob", short_axis.reviewed_at
    )
    for m in (long_axis, short_axis):
        assert m.reviewed_at is not None and m.reviewed_at.utcoffset() is not None  # UTC
    assert canonical_time(short_axis.reviewed_at) == _reviewed_at(  # type: ignore[arg-type]
        store, reviewed.ids[1, "short_axis"]
    )
    partly = found[4]
    assert [(m.status, m.reviewer, m.reviewed_at) for m in partly.measurements][1] == (
        ReviewStatus.PENDING,
        None,
        None,
    )
    assert not any("patient" in name for name in vars(first))


def test_the_latest_reviewed_run_of_each_series(store: Store, reviewed: Reviewed) -> None:
    """A newer run of the series (another model version) waiting for review leaves the
    reviews of the older run in; once it is reviewed, only its findings come."""
    volume = reviewed.volume
    result = _result(volume, str(reviewed.folder), version="2.0.0")
    newer = store_one(store, result, volume, checkpoint="d" * 64).run_id
    with store.reader() as session:
        assert {f.run_id for f in reviewed_findings(session)} == {reviewed.run_id}
    with store.reader() as session:
        alice = session.execute(select(User).where(User.name == "alice")).scalar_one()
    _review(store, _ids(store, newer)[2, "diameter"], alice, "accept")
    with store.reader() as session:
        latest = reviewed_findings(session)
        every = reviewed_findings(session, latest_run_only=False)
    assert [(f.run_id, f.finding_number, f.model_version) for f in latest] == [(newer, 2, "2.0.0")]
    assert [(f.run_id, f.finding_number) for f in every] == [
        *((reviewed.run_id, n) for n in (1, 2, 3, 4, 6, 7)),
        (newer, 2),
    ]


def test_import_store_rows(store: Store, reviewed: Reviewed) -> None:
    url = _url(store)
    result = import_store(url)
    path = _shown(url)
    assert "s3cret" not in path
    assert (result.source, result.path) == (SourceType.STORE, path)
    ids = reviewed.volume.identifiers
    study_uid, series_uid = ids.study_instance_uid, ids.series_instance_uid
    image = ImageRef(str(reviewed.folder), "dicom", "CT")
    run = reviewed.run_id
    m = reviewed.ids

    def provenance(number: int, annotator: str, *mids: int) -> Provenance:
        return Provenance(
            SourceType.STORE,
            path,
            f"run {run} finding {number}",
            annotator,
            DEFAULT_LICENCE,
            _reviewed_at(store, *mids),
        )

    def row(number: int, kind: str, label: Label, where: Provenance, **values: object) -> object:
        center = (7.5, 0.0, 32.5) if number == 2 else (float(number), 2.0 * number, 35.0)
        return DatasetFinding(
            id=finding_id(where, series_uid, where.item),
            study_instance_uid=study_uid,
            series_instance_uid=series_uid,
            image=image,
            kind=kind,  # type: ignore[arg-type]
            label=label,
            name=f"finding {number}",
            center_lps_mm=center,
            slice_index=1 if number == 2 else 2,
            provenance=where,
            **values,  # type: ignore[arg-type]
        )

    assert result.findings == (
        row(  # long axis accepted: the model's value and end points; short axis corrected:
            # the reviewer's value, no end points
            1,
            "lesion",
            Label.FINDING,
            provenance(1, "reviewers alice, bob", m[1, "long_axis"], m[1, "short_axis"]),
            long_axis_mm=30.0,
            short_axis_mm=18.0,
            long_axis_lps_mm=LONG_AXIS,
        ),
        row(
            2,
            "vessel",
            Label.FINDING,
            provenance(2, "reviewer alice", m[2, "diameter"]),
            diameter_mm=25.0,
            diameter_lps_mm=DIAMETER,
        ),
        row(  # all rejected: a negative example
            3,
            "lesion",
            Label.NEGATIVE,
            provenance(3, "reviewer alice", m[3, "long_axis"], m[3, "short_axis"]),
        ),
    )
    assert result.findings[0].rotation_deg == pytest.approx(36.8698976, abs=1e-6)  # atan(18/24)
    assert result.studies == (
        DatasetStudy(
            study_uid,
            series_uid,
            image,
            (),
            Provenance(SourceType.STORE, path, "", "radcaliper reviewers", DEFAULT_LICENCE),
        ),
    )
    assert result.skipped == (
        Skipped(
            SourceType.STORE,
            path,
            path,
            f"run {run} finding 4",
            "the short axis was rejected but the long axis was kept: a lesion's truth needs "
            "all its measurements",
        ),
        Skipped(
            SourceType.STORE,
            path,
            path,
            f"run {run} finding 6",
            "partly reviewed: the short axis was not reviewed yet",
        ),
        Skipped(
            SourceType.STORE,
            path,
            path,
            f"run {run} finding 7",
            "the diameter was accepted without a value (not measurable)",
        ),
    )


def test_importing_twice_gives_the_same_rows_and_files(
    store: Store, reviewed: Reviewed, tmp_path: Path
) -> None:
    first, again = import_store(store.url), import_store(store.url)
    assert first == again
    assert {
        f.provenance.licence for f in import_store(store.url, licence="CC BY 4.0").findings
    } == {"CC BY 4.0"}
    one, two = tmp_path / "one", tmp_path / "two"
    write_import(one, [first])
    write_import(two, [again])
    write_import(two, [import_store(store.url)])
    for name in ("dataset.json", "studies.jsonl", "findings.jsonl", "import_report.jsonl"):
        assert (one / name).read_bytes() == (two / name).read_bytes()


def test_no_patient_identifier_is_written(store: Store, reviewed: Reviewed, tmp_path: Path) -> None:
    with store.reader() as session:
        (stored,) = session.execute(select(Study.patient_id)).scalars()
    assert stored.startswith("PSN-")  # the store holds a pseudonym (and no name)
    write_import(tmp_path / "dataset", [import_store(store.url)])
    text = "".join(p.read_text() for p in sorted((tmp_path / "dataset").iterdir()))
    for identifier in (stored, "PSN-", "TEST-0001", "Test^Patient"):  # pseudonym, source's
        assert identifier not in text


def test_runs_without_an_image_file_are_reported(
    store: Store, reviewed: Reviewed, users: dict[str, User], write_series: SeriesFactory
) -> None:
    """A run on a volume built in memory, one with a relative source and one whose image is
    gone: their reviews have no image to train on."""
    geometry = Geometry(
        origin=(0.0, 0.0, 0.0),
        row_direction=(1.0, 0.0, 0.0),
        column_direction=(0.0, 1.0, 0.0),
        slice_direction=(0.0, 0.0, 1.0),
        spacing=(2.0, 1.0, 1.0),
    )
    synthetic = Volume.in_memory(np.zeros((3, 4, 4), dtype=np.float32), geometry)
    relative_folder = reviewed.folder.parent / "relative"
    write_series(relative_folder, n=3, rows=6, cols=6)
    (relative,) = load_path(relative_folder).volumes
    run_ids = []
    for volume, source in ((synthetic, "phantom-3"), (relative, "relative")):
        run_ids.append(store_one(store, _result(volume, source), volume).run_id)
        _review(store, _ids(store, run_ids[-1])[2, "diameter"], users["alice"], "accept")
    for path in reviewed.folder.iterdir():
        path.unlink()
    reviewed.folder.rmdir()
    result = import_store(store.url)
    assert result.findings == () and result.studies == ()
    lines = {(s.item, s.file): s.reason for s in result.skipped}
    gone = {k: v for k, v in lines.items() if k[0].startswith(f"run {reviewed.run_id} ")}
    assert set(gone.values()) == {f"the measured image is no longer at {reviewed.folder}"}
    assert len(gone) == 6
    synthetic_run, relative_run = run_ids
    assert lines[f"run {synthetic_run} finding 2", "phantom-3"] == (
        "no image file: the run measured a volume built in memory (synthetic, 'phantom-3')"
    )
    assert "is a relative path" in lines[f"run {relative_run} finding 2", "relative"]


def test_a_store_without_reviews_gives_no_rows(store: Store) -> None:
    result = import_store(store.url)
    assert (result.studies, result.findings, result.skipped) == ((), (), ())


def test_an_absent_database_is_refused_and_not_created(tmp_path: Path) -> None:
    absent = tmp_path / "none" / "radcaliper.sqlite3"
    with pytest.raises(ConfigurationError, match=r"there is no database at .*nothing to import"):
        import_store(f"sqlite:///{absent}")
    assert not absent.exists() and not absent.parent.exists()
    with pytest.raises(ConfigurationError, match="in-memory"):
        import_store("sqlite://")
    with pytest.raises(ConfigurationError, match="not a database URL"):
        import_store("no url")
    with pytest.raises(ConfigurationError, match="licence must not be empty"):
        import_store(f"sqlite:///{absent}", licence="")


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_an_empty_database_is_refused_and_left_empty(empty_url: str) -> None:
    database = make_url(empty_url).database
    if empty_url.startswith("sqlite") and database:
        Path(database).touch()  # an empty file, as a mistyped --db would leave
    with pytest.raises(StorageError, match=r"is empty \(no radcaliper store in it\)"):
        import_store(empty_url)
    engine = connect(empty_url)
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_an_unreachable_database_does_not_show_its_password() -> None:
    with pytest.raises(StorageError, match="cannot reach the database") as caught:
        import_store("postgresql://user:s3cret@127.0.0.1:1/none")
    assert "s3cret" not in str(caught.value)
