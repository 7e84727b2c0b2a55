"""``radcaliper measure PATH --at X,Y,Z`` (issue 43): the result JSON with one finding per
measured point in point order and a ``clicks`` answer per point, stored as a run of its own
(once per model, input and points) unless ``--no-store``; points that are not three finite
numbers, too many of them, a point outside the volume or a path of several series: exit 2 with
the reason, nothing stored. The real demo model on a written phantom; the model is loaded once
for the module (``keeping_models``, as a resident keeps it)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from app.cli import app
from app.cli.measure import MAX_POINTS
from app.resident import keeping_models
from db.engine import open_store
from db.models import AuditEvent, Run
from db.store import input_fingerprint
from ingestion.load import load_path
from ingestion.phantoms import write_phantoms
from model.measurer.results import CALIPER_TOLERANCE_MM

from tests.support.series import SeriesFactory

runner = CliRunner()


@dataclass(frozen=True)
class Study:
    dicom: Path
    lesion: tuple[float, float, float]  # a true lesion's centre
    other: tuple[float, float, float]  # another true finding's centre
    air: tuple[float, float, float]  # a voxel in the corner: air, outside the body
    fingerprint: str


@pytest.fixture(scope="module", autouse=True)
def _one_model() -> Iterator[None]:
    with keeping_models():  # every command of the module measures with one loaded model
        yield


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Study:
    (folder,) = write_phantoms(tmp_path_factory.mktemp("at") / "s", n=1, seed=4711)
    truth = json.loads((folder / "truth.json").read_text())
    lesions = [f for f in truth["findings"] if f["kind"] == "lesion"]
    others = [f for f in truth["findings"] if f is not lesions[0]]
    (volume,) = load_path(folder / "dicom").volumes
    corner = volume.geometry.index_to_lps((volume.shape[0] // 2, 1, 1))
    return Study(
        folder / "dicom",
        tuple(lesions[0]["center_lps_mm"]),
        tuple(others[0]["center_lps_mm"]),
        (float(corner[0]), float(corner[1]), float(corner[2])),
        input_fingerprint(volume),
    )


def _text(point: tuple[float, ...], sep: str = ",") -> str:
    return sep.join(repr(c) for c in point)


def _at(*points: str) -> list[str]:
    return [part for point in points for part in ("--at", point)]


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'site.sqlite3'}"


def _flat(text: str) -> str:
    """``text`` on one line, without the borders of typer's error panel."""
    return " ".join(text.replace("│", " ").split())


def _check_answers(data: dict[str, Any], points: list[tuple[float, float, float]]) -> None:
    """The contract of the clicks: one per point in order, each a finding (ids 1.. in point
    order) or 'nothing measurable here' with a reason; each finding as measure gives it."""
    assert [c["at_lps_mm"] for c in data["clicks"]] == [list(p) for p in points]
    ids = [c["finding_id"] for c in data["clicks"] if c["finding_id"] is not None]
    assert ids == list(range(1, len(data["findings"]) + 1))
    assert [f["id"] for f in data["findings"]] == ids
    for click in data["clicks"]:
        assert set(click) == {"at_lps_mm", "finding_id", "nothing_measurable"}
        if click["finding_id"] is None:
            assert click["nothing_measurable"].startswith("nothing measurable here: ")
            assert len(click["nothing_measurable"]) > len("nothing measurable here: ")
        else:
            assert click["nothing_measurable"] is None
    for finding in data["findings"]:
        assert set(finding) == {
            "id",
            "kind",
            "center_lps_mm",
            "slice_index",
            "measurements",
            "axes_lps_mm",
        }
        names = [m["name"] for m in finding["measurements"]]
        assert names == (
            ["long_axis", "short_axis"] if finding["kind"] == "lesion" else ["diameter"]
        )
        for k, m in enumerate(finding["measurements"]):
            if m["value_mm"] is None:
                continue
            if m["range_mm"] is not None:
                assert m["range_mm"][0] <= m["value_mm"] <= m["range_mm"][1]
            start, end = finding["axes_lps_mm"][k]  # a value is its caliper's length
            assert math.dist(start, end) == pytest.approx(m["value_mm"], abs=CALIPER_TOLERANCE_MM)


def test_points_are_answered_in_order_and_stored_as_a_run_of_their_own(
    study: Study, tmp_path: Path
) -> None:
    url = _url(tmp_path)
    points = [study.lesion, study.air, study.other]
    texts = [_text(study.lesion), _text(study.air), _text(study.other, ", ")]  # spaces allowed
    result = runner.invoke(app, ["measure", str(study.dicom), "--json", "--db", url, *_at(*texts)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"]["name"] == "radcaliper-demo" and data["model"]["not_for_clinical_use"]
    assert data["source"] == str(study.dicom.resolve())
    _check_answers(data, points)
    first = data["clicks"][0]
    assert first["finding_id"] == 1 and data["findings"][0]["kind"] == "lesion"
    assert "stored as run 1" in result.stderr

    store = open_store(url)
    try:
        with store.reader() as session:
            (run,) = session.execute(select(Run)).scalars()
            assert run.settings == {
                "inference": "at",
                "at_lps_mm": [list(p) for p in points],
                "volume_fingerprint": study.fingerprint,
            }
            assert run.input_fingerprint != study.fingerprint  # not the whole study's run
            rows = sorted(run.findings, key=lambda f: f.number)
            assert [r.number for r in rows] == [f["id"] for f in data["findings"]]
            for row, finding in zip(rows, data["findings"], strict=True):
                assert row.kind == finding["kind"]
                stored_axes = None if row.axes_lps_mm is None else row.axes_lps_mm["segments"]
                assert stored_axes == finding["axes_lps_mm"]
                values = {m.name: m.value_mm for m in row.measurements}
                assert values == {m["name"]: m["value_mm"] for m in finding["measurements"]}
            nothing = [k for k, c in enumerate(data["clicks"], 1) if c["finding_id"] is None]
            assert [w.split(" at ")[0] for w in run.warnings["warnings"]] == [
                f"point {k}" for k in nothing
            ]
            events = session.execute(
                select(AuditEvent.action).where(AuditEvent.object_id == run.id)
            ).scalars()
            assert "run.stored" in list(events)
    finally:
        store.dispose()
    verified = runner.invoke(app, ["audit", "verify", "--db", url])
    assert verified.exit_code == 0, verified.output  # the run, its points and findings chained

    table = runner.invoke(app, ["measure", str(study.dicom), "--db", url, *_at(*texts)])
    assert table.exit_code == 0, table.output
    assert "already stored as run 1" in table.stderr  # the same points: stored once
    assert f"point 1 at ({', '.join(f'{c:.1f}' for c in study.lesion)}) mm: finding 1 (lesion)" in (
        " ".join(table.stdout.split())
    )
    assert "NOT FOR CLINICAL USE" in table.stdout
    other = runner.invoke(app, ["measure", str(study.dicom), "--db", url, *_at(texts[0])])
    assert other.exit_code == 0 and "stored as run 2" in other.stderr  # other points: a new run


def test_no_store_stores_nothing(study: Study, tmp_path: Path) -> None:
    database = tmp_path / "site.sqlite3"
    args = ["measure", str(study.dicom), "--json", "--no-store", "--db", _url(tmp_path)]
    result = runner.invoke(app, [*args, *_at(_text(study.lesion))])
    assert result.exit_code == 0, result.output
    _check_answers(json.loads(result.stdout), [study.lesion])
    assert not database.exists() and "stored" not in result.stderr


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("1,2", "has 2 number(s)"),
        ("1,2,3,4", "has 4 number(s)"),
        ("a,b,c", "'a' is not a number"),
        ("nan,0,0", "'nan' is not a finite number"),
        ("0,inf,0", "'inf' is not a finite number"),
        ("0,0,-Infinity", "'-Infinity' is not a finite number"),
        ("", "has 1 number(s)"),
        ("1,,2", "'' is not a number"),
    ],
)
def test_a_point_that_is_not_three_finite_numbers_is_refused(
    study: Study, tmp_path: Path, value: str, says: str
) -> None:
    args = ["measure", str(study.dicom), "--db", _url(tmp_path), *_at(_text(study.lesion), value)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    flat = _flat(result.output)
    assert "--at" in flat and repr(value) in flat and says in flat, flat
    assert "three finite numbers X,Y,Z" in flat and "Traceback" not in flat
    assert not (tmp_path / "site.sqlite3").exists()


def test_too_many_points_are_refused(study: Study, tmp_path: Path) -> None:
    args = ["measure", str(study.dicom), "--db", _url(tmp_path)]
    result = runner.invoke(app, args + _at(*["0,0,0"] * (MAX_POINTS + 1)))
    assert result.exit_code == 2
    flat = _flat(result.output)
    assert f"{MAX_POINTS + 1} points" in flat and f"at most {MAX_POINTS}" in flat
    assert not (tmp_path / "site.sqlite3").exists()


def test_a_point_outside_the_volume_is_refused_before_measuring(
    study: Study, tmp_path: Path
) -> None:
    x, y, z = study.lesion
    outside = f"{x},{y},{z + 10_000}"
    args = ["measure", str(study.dicom), "--db", _url(tmp_path)]
    result = runner.invoke(app, [*args, *_at(_text(study.lesion), outside)])
    assert result.exit_code == 2, result.output
    flat = _flat(result.stderr)
    assert f"--at {outside} is outside the volume" in flat and "it spans x " in flat, flat
    assert "give a point inside it" in flat
    assert not (tmp_path / "site.sqlite3").exists()


def test_a_path_of_several_series_is_refused(tmp_path: Path) -> None:
    write_phantoms(tmp_path / "two", n=2, seed=99)
    result = runner.invoke(
        app, ["measure", str(tmp_path / "two"), "--db", _url(tmp_path), *_at("0,0,0")]
    )
    assert result.exit_code == 2, result.output
    flat = _flat(result.stderr)
    assert "--at measures one series" in flat and "holds 2" in flat, flat
    assert not (tmp_path / "site.sqlite3").exists()


def test_a_study_the_model_refuses_answers_every_point_with_the_reason(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    write_series(tmp_path / "mr", n=4, modality="MR")
    (volume,) = load_path(tmp_path / "mr").volumes
    centre = volume.geometry.index_to_lps((1, 2, 2))
    point = ",".join(str(float(c)) for c in centre)
    args = ["measure", str(tmp_path / "mr"), "--json", "--db", _url(tmp_path)]
    result = runner.invoke(app, [*args, *_at(point, point)])
    assert result.exit_code == 2, result.output
    data = json.loads(result.stdout)
    assert data["findings"] == [] and len(data["clicks"]) == 2
    for click in data["clicks"]:
        assert click["finding_id"] is None and "trained on CT only" in click["nothing_measurable"]
    assert "answered at none of the points" in result.stderr and "stored as" not in result.stderr
    store = open_store(_url(tmp_path))
    try:
        with store.reader() as session:
            assert session.execute(select(Run)).first() is None
    finally:
        store.dispose()
