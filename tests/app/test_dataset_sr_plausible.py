"""``radcaliper dataset import SOURCE OUT --from sr`` refuses absurd truth (issue 41, item 4 of
the second trust round): a value outside the correction limits (``db.review.CorrectionLimits``,
the settings' ``RADCALIPER_MAX_*_MM``), or one that contradicts its own end points by more than
a pixel of the referenced image, is a skipped item with its reason; the good report imports and
the command exits 1 (some items skipped).

The reports are built with highdicom on a small real DICOM series (``write_series``), each
axis a SCOORD3D line in the series' frame of reference, as a viewer writes it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import highdicom as hd
import numpy as np
import pytest
from pydicom import Dataset, dcmread
from pydicom.sr.codedict import codes
from typer.testing import CliRunner

from app.cli import app
from ingestion.dataset.format import read_dataset

from tests.support.series import SeriesFactory, WrittenSeries, fixed_uid

runner = CliRunner()
PIXEL_MM = 0.8  # the series' pixel spacing (row and column)
LONG_MM = 52.6  # the long axis' end points are this far apart
SHORT_MM = 30.0
FRAME = fixed_uid("frame of reference", "plausible")


def _headers(ds: Dataset, index: int) -> None:
    """What a scanner writes and the SR's evidence needs: frame of reference, study module."""
    ds.FrameOfReferenceUID = FRAME
    ds.StudyTime = "101010"
    ds.StudyID = "1"
    ds.AccessionNumber = ""
    ds.ReferringPhysicianName = ""
    ds.PatientBirthDate = ""
    ds.PatientSex = ""


@pytest.fixture
def series(write_series: SeriesFactory, tmp_path: Path) -> WrittenSeries:
    return write_series(
        tmp_path / "images",
        n=6,
        rows=96,
        cols=96,
        pixel_spacing=(PIXEL_MM, PIXEL_MM),
        seed=4101,
        mutate=_headers,
    )


def _axes(series: WrittenSeries) -> tuple[np.ndarray, np.ndarray]:
    """A long axis (LONG_MM, along the rows) and a short axis (SHORT_MM, along the columns)
    crossing on slice 2, inside the image (LPS mm)."""
    centre = series.positions[2] + 38.0 * series.row_direction + 38.0 * series.column_direction
    half_long = LONG_MM / 2 * series.row_direction
    half_short = SHORT_MM / 2 * series.column_direction
    return np.stack([centre - half_long, centre + half_long]), np.stack(
        [centre - half_short, centre + half_short]
    )


def _report(series: WrittenSeries, path: Path, long_mm: float, short_mm: float) -> Path:
    """A TID 1500 report of one lesion: its long and short axis with SCOORD3D lines."""
    long_line, short_line = _axes(series)
    assert math.dist(*long_line) == pytest.approx(LONG_MM)

    def measurement(name: Any, value: float, points: np.ndarray) -> Any:
        return hd.sr.Measurement(
            name=name,
            value=value,
            unit=codes.UCUM.Millimeter,
            referenced_coordinates=[
                hd.sr.CoordinatesForMeasurement3D(
                    graphic_type=hd.sr.GraphicTypeValues3D.POLYLINE,
                    graphic_data=points,
                    frame_of_reference_uid=FRAME,
                )
            ],
        )

    group = hd.sr.MeasurementsAndQualitativeEvaluations(
        tracking_identifier=hd.sr.TrackingIdentifier(
            uid=fixed_uid("track", path.name), identifier="nodule"
        ),
        finding_type=codes.SCT.Lesion,
        measurements=[
            measurement(codes.SCT.LongAxis, long_mm, long_line),
            measurement(codes.SCT.ShortAxis, short_mm, short_line),
        ],
    )
    observer = hd.sr.ObserverContext(
        observer_type=codes.cid270.Person,
        observer_identifying_attributes=hd.sr.PersonObserverIdentifyingAttributes(name="Doe^Jane"),
    )
    report = hd.sr.MeasurementReport(
        observation_context=hd.sr.ObservationContext(observer_person_context=observer),
        procedure_reported=codes.LN.CTUnspecifiedBodyRegion,
        imaging_measurements=[group],
    )
    sr = hd.sr.Comprehensive3DSR(
        evidence=[dcmread(p, stop_before_pixels=True) for p in series.paths],
        content=report[0],
        series_instance_uid=fixed_uid("sr series", path.name),
        series_number=700,
        sop_instance_uid=fixed_uid("sr", path.name),
        instance_number=1,
        manufacturer="test",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    sr.save_as(path, enforce_file_format=True)
    return path


@pytest.fixture
def reports(series: WrittenSeries, tmp_path: Path) -> Path:
    """A good report (its short axis written 0.4 mm off its line: within a pixel) and three
    absurd ones: 1e308 mm, 1e-300 mm, and 60 mm for a line of 52.6 mm."""
    root = tmp_path / "reports"
    _report(series, root / "good.dcm", LONG_MM, SHORT_MM + 0.4)
    _report(series, root / "huge.dcm", 1e308, SHORT_MM)
    _report(series, root / "tiny.dcm", 1e-300, SHORT_MM)
    _report(series, root / "contradicts.dcm", 60.0, SHORT_MM)
    return root


def _import(reports: Path, series: WrittenSeries, out: Path) -> Any:
    images = series.paths[0].parent
    command = ["dataset", "import", str(reports), str(out), "--from", "sr", "--images", str(images)]
    return runner.invoke(app, command)


def _skipped(out: Path) -> dict[str, str]:
    """The import report's skipped lines: file name -> reason."""
    lines = (out / "import_report.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return {Path(row["file"]).name: row["reason"] for row in rows}


def test_absurd_values_are_skipped_with_their_reason(
    reports: Path, series: WrittenSeries, tmp_path: Path
) -> None:
    out = tmp_path / "dataset"
    done = _import(reports, series, out)
    assert done.exit_code == 1, (done.output, done.exception)  # some items were skipped
    (finding,) = read_dataset(out).findings
    assert finding.provenance.item == "good.dcm, measurement group 1 (tracking id nodule)"
    assert (finding.long_axis_mm, finding.short_axis_mm) == (LONG_MM, SHORT_MM + 0.4)
    skipped = _skipped(out)
    assert set(skipped) == {"huge.dcm", "tiny.dcm", "contradicts.dcm"}
    for name, value in (("huge.dcm", "1e+308"), ("tiny.dcm", "1e-300")):
        assert skipped[name] == (
            f"{value} mm is not a plausible long axis (a long axis must be a finite number of mm "
            "of at least 0.1 and at most 500 mm, the limit set by RADCALIPER_MAX_LONG_AXIS_MM)"
        ), skipped[name]
    assert skipped["contradicts.dcm"] == (
        "the long axis is 60 mm but its end points are 52.6 mm apart: the value "
        f"contradicts its own coordinates by more than a pixel ({PIXEL_MM:g} mm)"
    )
    for name in skipped:  # one line each on stderr too: file, item and reason
        assert name in done.stderr
    assert "Imported 1 series, 1 lesion (finding)" in done.stdout


def test_the_limits_are_the_sites_correction_limits(
    reports: Path, series: WrittenSeries, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site whose limit is below the good report's long axis skips it too, naming its limit."""
    monkeypatch.setenv("RADCALIPER_MAX_LONG_AXIS_MM", "50")
    out = tmp_path / "dataset"
    done = _import(reports, series, out)
    assert done.exit_code == 1, done.output
    assert not read_dataset(out).findings
    assert "52.6 mm is not a plausible long axis" in _skipped(out)["good.dcm"]
    assert "at most 50 mm" in _skipped(out)["good.dcm"]
