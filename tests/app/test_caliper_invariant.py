"""The measurement is the caliper, end to end: every value the demo model gives is the distance
between its end points, in `measure --json`, in the stored rows, in the study view's overlay and
in the DICOM SR; on a phantom and on the real abdominal CT (issue 43).

The real CT is measured once for the module (the whole pipeline on 20 slices of 512 x 512)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from app.cli import app
from app.sr import export_study_sr
from app.ui.render import COLOURS, index_of, pixel_of, render_slice
from app.ui.study import study_overlays, study_state
from db.engine import Store, open_store
from db.models import Finding, Run, Series, Study
from ingestion.geometry import Geometry
from ingestion.load import load_path
from ingestion.phantoms import write_phantoms
from ingestion.volume import Volume

from tests.support.sr import SCT, _num, _read_back, dciodvfy

runner = CliRunner()
REAL_CT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real-ct"
TOLERANCE_MM = 0.1  # the bar: endpoint distance = value within 0.1 mm


def _length(segment: Any) -> float:
    a, b = segment
    return math.dist(a, b)


class Measured:
    """One input measured by `radcaliper measure --json` into its own SQLite store."""

    def __init__(self, path: Path, db: Path) -> None:
        self.path, self.url = path, f"sqlite:///{db}"
        done = runner.invoke(
            app, ["measure", str(path), "--json", "--db", self.url, "--no-resident"]
        )
        assert done.exit_code == 0, done.output
        self.json: dict[str, Any] = json.loads(done.stdout)
        (self.volume,) = load_path(path).volumes

    def store(self) -> Store:
        return open_store(self.url)


@pytest.fixture(scope="module", params=["phantom", "real abdominal CT"])
def measured(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Measured:
    root = tmp_path_factory.mktemp("caliper")
    if request.param == "phantom":
        write_phantoms(root / "phantoms", n=1, seed=4343)
        path = root / "phantoms" / "phantom_0000" / "dicom"
    else:
        if not (REAL_CT / "ts_abdomen_dicom").is_dir():
            pytest.skip(f"the shared real CT is not at {REAL_CT}")
        path = REAL_CT / "ts_abdomen_dicom" / "dicom"
    return Measured(path, root / "store.db")


def test_the_json_values_are_their_end_points(measured: Measured) -> None:
    findings = measured.json["findings"]
    assert findings, "the demo found nothing to check the invariant on"
    values = 0
    for finding in findings:
        axes = finding["axes_lps_mm"]
        for k, m in enumerate(finding["measurements"]):
            if m["value_mm"] is None:
                continue  # "not measurable" carries no number
            values += 1
            assert axes is not None, f"finding {finding['id']}: a value without its caliper"
            assert _length(axes[k]) == pytest.approx(m["value_mm"], abs=TOLERANCE_MM)
    assert values, "no value to check"


def _stored(store: Store, study_uid: str) -> list[Finding]:
    with store.reader() as session:
        run = (
            session.execute(
                select(Run)
                .join(Run.series)
                .join(Series.study)
                .where(Study.study_instance_uid == study_uid)
                .order_by(Run.id.desc())
            )
            .scalars()
            .first()
        )
        assert run is not None
        findings = list(run.findings)
        for f in findings:
            _ = [m.value_mm for m in f.measurements]  # loaded while the session is open
        return findings


def test_the_stored_rows_carry_the_same_end_points(measured: Measured) -> None:
    store = measured.store()
    stored = _stored(store, measured.json["study_instance_uid"])
    assert len(stored) == len(measured.json["findings"])
    for row, finding in zip(
        sorted(stored, key=lambda f: f.number), measured.json["findings"], strict=True
    ):
        assert row.axes_lps_mm is not None
        np.testing.assert_allclose(row.axes_lps_mm["segments"], finding["axes_lps_mm"], atol=1e-6)
        for k, m in enumerate(sorted(row.measurements, key=lambda m: m.id)):
            if m.value_mm is not None:
                assert _length(row.axes_lps_mm["segments"][k]) == pytest.approx(
                    m.value_mm, abs=TOLERANCE_MM
                )


def _on_screen_mm(volume: Volume, zoom: float, ends: list[tuple[float, float]]) -> float:
    """The length in mm of a line drawn between two displayed pixels on the volume's slice."""
    g = volume.geometry
    points = [g.index_to_lps([0.0, *index_of(volume, zoom, x, y)]) for x, y in ends]
    return float(np.linalg.norm(points[1] - points[0]))


def test_the_study_view_draws_exactly_those_end_points(measured: Measured) -> None:
    store = measured.store()
    study = study_state(store, measured.json["study_instance_uid"])
    overlays = study_overlays(study, None)
    assert len(overlays) == len(measured.json["findings"])
    volume, zoom = measured.volume, 1.0
    for overlay, finding in zip(overlays, study["findings"], strict=True):
        assert overlay.axes_lps_mm is not None
        np.testing.assert_allclose(overlay.axes_lps_mm, finding["axes_lps_mm"], atol=1e-9)
        for segment, m in zip(overlay.axes_lps_mm, finding["measurements"], strict=True):
            if m["value_mm"] is None:
                continue
            ends = []
            for point in segment:
                _, row, column = volume.geometry.lps_to_index(np.asarray(point))
                ends.append(pixel_of(volume, zoom, float(row), float(column)))
            assert _on_screen_mm(volume, zoom, ends) == pytest.approx(
                m["value_mm"], abs=TOLERANCE_MM
            )
            if overlay.kind != "lesion":
                continue  # a vessel is drawn as the circle of its diameter
            # the line is drawn there, in the finding's colour, from end to end
            image = np.asarray(
                render_slice(volume, overlay.slice_index, (40.0, 400.0), zoom, [overlay])
            ).astype(int)
            (x0, y0), (x1, y1) = ends
            steps = max(2, int(math.hypot(x1 - x0, y1 - y0)))
            hits = np.all(np.abs(image - np.array(COLOURS[overlay.kind])) <= 40, axis=-1)
            on_line = [  # the line is 2 pixels wide: in its colour within a pixel of the path
                hits[max(0, y - 1) : y + 2, max(0, x - 1) : x + 2].any()
                for t in np.linspace(0.1, 0.9, steps)
                for x, y in [(round(x0 + t * (x1 - x0)), round(y0 + t * (y1 - y0)))]
            ]
            assert all(on_line)


def test_the_sr_carries_the_same_calipers(measured: Measured, tmp_path: Path) -> None:
    store = measured.store()
    uid = measured.json["study_instance_uid"]
    with store.reader() as session:
        done = export_study_sr(session, uid, tmp_path)
    dciodvfy(done.path)
    _, groups = _read_back(done.path)
    g = measured.volume.geometry
    by_number = {f["id"]: f for f in measured.json["findings"]}
    checked = 0
    for group in groups.values():
        finding = by_number[int(group.tracking_identifier.removeprefix("finding "))]
        slice_index = finding["slice_index"]
        for read in group.get_measurements():
            value, unit = _num(read[0])
            assert unit == "mm"
            (coordinates,) = read.referenced_coordinates  # none is left out: none contradicts
            column_row = np.asarray(coordinates.GraphicData, dtype=np.float64).reshape(2, 2)
            index = [[slice_index, r - 0.5, c - 0.5] for c, r in column_row]
            a, b = Geometry.index_to_lps(g, index)
            assert float(np.linalg.norm(b - a)) == pytest.approx(value, abs=TOLERANCE_MM)
            name = next(n for n, code in SCT.items() if code == read.name.value)
            stated = next(m for m in finding["measurements"] if m["name"] == name)
            assert value == pytest.approx(stated["value_mm"], abs=1e-9)
            checked += 1
    assert checked == sum(
        m["value_mm"] is not None for f in measured.json["findings"] for m in f["measurements"]
    )


def test_measure_at_answers_with_calipers_too(measured: Measured) -> None:
    points = [f["center_lps_mm"] for f in measured.json["findings"]][:3]
    args = [a for p in points for a in ("--at", ",".join(f"{v:.3f}" for v in p))]
    done = runner.invoke(
        app, ["measure", str(measured.path), *args, "--json", "--db", measured.url, "--no-resident"]
    )
    assert done.exit_code == 0, done.output
    clicked = json.loads(done.stdout)
    assert len(clicked["clicks"]) == len(points)
    values = 0
    for finding in clicked["findings"]:
        for k, m in enumerate(finding["measurements"]):
            if m["value_mm"] is not None:
                values += 1
                assert _length(finding["axes_lps_mm"][k]) == pytest.approx(
                    m["value_mm"], abs=TOLERANCE_MM
                )
    assert values, "no clicked value to check"
    with measured.store().reader() as session:  # stored as printed, a run of its own
        run = session.execute(select(Run).order_by(Run.id.desc())).scalars().first()
        assert run is not None and run.settings["inference"] == "at"
        for row in run.findings:
            assert row.axes_lps_mm is not None
            for k, m in enumerate(sorted(row.measurements, key=lambda m: m.id)):
                if m.value_mm is not None:
                    assert _length(row.axes_lps_mm["segments"][k]) == pytest.approx(
                        m.value_mm, abs=TOLERANCE_MM
                    )
