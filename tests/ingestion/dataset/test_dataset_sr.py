"""DICOM SR TID 1500 import (``ingestion.dataset.sr``): reports built with highdicom on the shared
real CT cases (``../shared/data/real-ct/``), the way OHIF/dcmjs writes a bidirectional measurement
(two POLYLINE lines under Long Axis / Short Axis, the older SRT codes), with SCOORD3D, and a
vessel's diameter; the values and end points come back from the cases' truth.json, and each
group radcaliper cannot use is a Skipped line with its reason.

The data is read in place (never copied into the repository); the image folders the importer
scans are links to the cases' files.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import highdicom as hd
import numpy as np
import pytest
from pydicom import Dataset, dcmread
from pydicom.sr.codedict import codes
from pydicom.sr.coding import Code

from db.review import CorrectionLimits
from ingestion.dataset.format import Label, SourceType
from ingestion.dataset.sr import import_sr
from ingestion.errors import ConfigurationError
from ingestion.scan import scan_path

from tests.support.series import fixed_uid

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "real-ct"
pytestmark = pytest.mark.skipif(
    not (DATA / "cases.json").is_file(), reason=f"the shared real CT cases are not at {DATA}"
)
# dcmjs (OHIF) writes the axes with these SRT codes; SCT 103339001 / 103340004 are the same
OHIF_LONG = Code("G-A185", "SRT", "Long Axis")
OHIF_SHORT = Code("G-A186", "SRT", "Short Axis")
CASES = ("lidc0314_nodule", "lung1_001_gtv", "ts_abdomen_dicom")
LIMITS = CorrectionLimits()  # what a correction may be (the command line: the settings')
OTHER = "sts_002_sarcoma"  # a case whose images are not in the images folder


# -- building reports -------------------------------------------------------------------------


class Case:
    """A real CT case: its series (scanned), image headers and truth."""

    def __init__(self, name: str) -> None:
        self.name = name
        (self.series,) = scan_path(DATA / name / "dicom").series
        self.headers = [dcmread(s.path, stop_before_pixels=True) for s in self.series.slices]
        self.truth = json.loads((DATA / name / "truth.json").read_text(encoding="utf-8"))

    def image(self, slice_index: int) -> Dataset:
        return self.headers[slice_index]

    def column_row(self, segment: Any) -> np.ndarray:
        """LPS end points -> (column, row) image coordinates (DICOM: pixel centre = index + 0.5)."""
        index = self.series.geometry.lps_to_index(np.asarray(segment, dtype=np.float64))
        return np.stack([index[:, 2] + 0.5, index[:, 1] + 0.5], axis=1)


def _line(case: Case, segment: Any, slice_index: int) -> Any:
    image = case.image(slice_index)
    return hd.sr.CoordinatesForMeasurement(
        graphic_type=hd.sr.GraphicTypeValues.POLYLINE,
        graphic_data=case.column_row(segment),
        source_image=hd.sr.SourceImageForRegion(image.SOPClassUID, image.SOPInstanceUID),
    )


def _measurement(name: Any, value: float, coordinates: Any = None, unit: Any = None) -> Any:
    return hd.sr.Measurement(
        name=name,
        value=value,
        unit=unit or codes.UCUM.Millimeter,
        referenced_coordinates=None if coordinates is None else [coordinates],
    )


def _group(tag: str, measurements: list[Any], finding: Any = None, region: Any = None) -> Any:
    tracking = hd.sr.TrackingIdentifier(uid=fixed_uid("track", tag), identifier=tag)
    if region is not None:
        return hd.sr.PlanarROIMeasurementsAndQualitativeEvaluations(
            tracking_identifier=tracking,
            referenced_region=region,
            finding_type=finding,
            measurements=measurements,
        )
    return hd.sr.MeasurementsAndQualitativeEvaluations(
        tracking_identifier=tracking, finding_type=finding, measurements=measurements
    )


def _write(
    path: Path, groups: list[Any], evidence: list[Dataset], reader: str = "Doe^Jane"
) -> Path:
    observer = hd.sr.ObserverContext(
        observer_type=codes.cid270.Person,
        observer_identifying_attributes=hd.sr.PersonObserverIdentifyingAttributes(name=reader),
    )
    report = hd.sr.MeasurementReport(
        observation_context=hd.sr.ObservationContext(observer_person_context=observer),
        procedure_reported=codes.LN.CTUnspecifiedBodyRegion,
        imaging_measurements=groups,
    )
    with warnings.catch_warnings():  # the real cases' patient names ("LUNG1-001") are as found
        warnings.filterwarnings("ignore", "The string .* unlikely to represent", UserWarning)
        sr = hd.sr.Comprehensive3DSR(
            evidence=evidence,
            content=report[0],
            series_instance_uid=fixed_uid("sr series", path.name),
            series_number=700,
            sop_instance_uid=fixed_uid("sr", path.name),
            instance_number=1,
            manufacturer="test",
        )
    sr.ContentDate, sr.ContentTime = "20240305", "141516"
    path.parent.mkdir(parents=True, exist_ok=True)
    sr.save_as(path, enforce_file_format=True)
    return path


@pytest.fixture(scope="module")
def cases() -> dict[str, Case]:
    return {name: Case(name) for name in CASES}


@pytest.fixture(scope="module")
def images(cases: dict[str, Case], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of links to the three cases' image files (and an unrelated text file)."""
    root = tmp_path_factory.mktemp("images")
    for name, case in cases.items():
        (root / name).mkdir()
        for s in case.series.slices:
            (root / name / s.path.name).symlink_to(s.path)
    (root / "notes.txt").write_text("not DICOM", encoding="utf-8")
    return root


def _lidc_report(case: Case, other: Case, path: Path) -> Path:
    """The nodule as OHIF writes it, and four groups radcaliper cannot use."""
    lesion = case.truth["lesions"][0]
    k = lesion["slice_index"]
    long_line = _line(case, lesion["long_axis_lps_mm"], k)
    ohif = _group(
        "web annotation",
        [
            _measurement(OHIF_LONG, lesion["long_axis_mm"], long_line),
            _measurement(
                OHIF_SHORT, lesion["short_axis_mm"], _line(case, lesion["short_axis_lps_mm"], k)
            ),
        ],
    )
    outline = np.array([[180.0, 240.0], [195.0, 240.0], [195.0, 255.0], [180.0, 240.0]])
    image = case.image(k)
    area = _group(
        "area",
        [_measurement(codes.SCT.Area, 226.4, unit=codes.UCUM.SquareMillimeter)],
        finding=codes.SCT.Lesion,
        region=hd.sr.ImageRegion(
            graphic_type=hd.sr.GraphicTypeValues.POLYLINE,
            graphic_data=outline,
            source_image=hd.sr.SourceImageForRegion(image.SOPClassUID, image.SOPInstanceUID),
        ),
    )
    diameter = _group(
        "lesion diameter",
        [_measurement(codes.SCT.Diameter, 21.0, long_line)],
        finding=codes.SCT.Lesion,
    )
    values_only = _group(
        "values only",
        [_measurement(codes.SCT.LongAxis, 21.0), _measurement(codes.SCT.ShortAxis, 15.0)],
        finding=codes.SCT.Lesion,
    )
    on = other.image(0)  # an image of another series, not under the images folder

    def off(points: list[list[float]]) -> Any:
        return hd.sr.CoordinatesForMeasurement(
            graphic_type=hd.sr.GraphicTypeValues.POLYLINE,
            graphic_data=np.asarray(points),
            source_image=hd.sr.SourceImageForRegion(on.SOPClassUID, on.SOPInstanceUID),
        )

    foreign = _group(
        "elsewhere",
        [
            _measurement(OHIF_LONG, 30.0, off([[40.5, 50.5], [70.5, 50.5]])),
            _measurement(OHIF_SHORT, 20.0, off([[55.5, 40.5], [55.5, 60.5]])),
        ],
    )
    groups = [ohif, area, diameter, values_only, foreign]
    return _write(path, groups, [*case.headers, on])


def _lung1_report(case: Case, path: Path) -> Path:
    """The tumour's axes as SCOORD3D (LPS) lines."""
    lesion = case.truth["lesions"][0]
    frame = case.image(0).FrameOfReferenceUID

    def line(segment: Any) -> Any:
        return hd.sr.CoordinatesForMeasurement3D(
            graphic_type=hd.sr.GraphicTypeValues3D.POLYLINE,
            graphic_data=np.asarray(segment, dtype=np.float64),
            frame_of_reference_uid=frame,
        )

    group = _group(
        "GTV-1",
        [
            _measurement(
                codes.SCT.LongAxis, lesion["long_axis_mm"], line(lesion["long_axis_lps_mm"])
            ),
            _measurement(
                codes.SCT.ShortAxis, lesion["short_axis_mm"], line(lesion["short_axis_lps_mm"])
            ),
        ],
        finding=codes.SCT.Neoplasm,
    )
    return _write(path, [group], case.headers, reader="Roe^Rick")


def _aorta_line(case: Case) -> tuple[np.ndarray, dict[str, Any]]:
    aorta = next(v for v in case.truth["vessels"] if v["name"] == "aorta")
    centre = np.asarray(aorta["center_lps_mm"], dtype=np.float64)
    half = np.array([aorta["diameter_mm"] / 2, 0.0, 0.0])
    return np.stack([centre - half, centre + half]), aorta


def _aorta_report(case: Case, path: Path) -> Path:
    """The aorta's diameter (in cm, as a viewer may write it) on its widest slice."""
    segment, aorta = _aorta_line(case)
    k = round(float(case.series.geometry.lps_to_index(segment.mean(axis=0))[0]))
    group = _group(
        "aorta",
        [
            _measurement(
                codes.SCT.Diameter,
                aorta["diameter_mm"] / 10,
                _line(case, segment, k),
                unit=codes.UCUM.Centimeter,
            )
        ],
        finding=codes.SCT.BloodVessel,
    )
    return _write(path, [group], case.headers)


@pytest.fixture(scope="module")
def reports(cases: dict[str, Case], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reports")
    _lidc_report(cases["lidc0314_nodule"], Case(OTHER), root / "a" / "lidc.dcm")
    _lung1_report(cases["lung1_001_gtv"], root / "b" / "lung1.dcm")
    _aorta_report(cases["ts_abdomen_dicom"], root / "c" / "aorta.sr")
    (root / "readme.txt").write_text("not an SR", encoding="utf-8")
    return root


# -- tests -------------------------------------------------------------------------------------


def test_an_ohif_bidirectional_measurement_gives_back_its_values_and_end_points(
    cases: dict[str, Case], reports: Path, images: Path
) -> None:
    case = cases["lidc0314_nodule"]
    truth = case.truth["lesions"][0]
    done = import_sr(reports / "a" / "lidc.dcm", images=images, licence="CC BY 3.0", limits=LIMITS)
    assert done.source is SourceType.SR and done.path == str((reports / "a" / "lidc.dcm").resolve())
    (finding,) = done.findings
    assert finding.kind == "lesion" and finding.label is Label.FINDING
    assert finding.long_axis_mm == truth["long_axis_mm"]  # exact: as written
    assert finding.short_axis_mm == truth["short_axis_mm"]
    assert finding.slice_index == truth["slice_index"]
    assert finding.series_instance_uid == case.series.info.series_instance_uid
    for name in ("long_axis_lps_mm", "short_axis_lps_mm"):
        np.testing.assert_allclose(getattr(finding, name), truth[name], atol=0.01)
    np.testing.assert_allclose(finding.center_lps_mm, truth["center_lps_mm"], atol=0.01)
    assert finding.name == "web annotation"
    assert finding.provenance.item == "measurement group 1 (tracking id web annotation)"
    assert finding.provenance.annotator == "Jane Doe"  # the report's person observer
    assert finding.provenance.licence == "CC BY 3.0"
    assert finding.provenance.annotated_at == "2024-03-05T14:15:16"
    assert finding.image.path == str((images / "lidc0314_nodule").resolve())
    (study,) = [s for s in done.studies if s.series_instance_uid == finding.series_instance_uid]
    assert study.annotated == () and study.study_instance_uid == finding.study_instance_uid


def test_groups_radcaliper_cannot_use_are_reported_with_their_reason(
    cases: dict[str, Case], reports: Path, images: Path
) -> None:
    done = import_sr(reports / "a" / "lidc.dcm", images=images, limits=LIMITS)
    lines = {s.item: s.reason for s in done.skipped}
    foreign = Case(OTHER).image(0).SOPInstanceUID
    assert set(lines) == {
        "measurement group 2 (tracking id area)",
        "measurement group 3 (tracking id lesion diameter)",
        "measurement group 4 (tracking id values only)",
        "measurement group 5 (tracking id elsewhere)",
    }
    assert lines["measurement group 2 (tracking id area)"].startswith("area only")
    assert "not a blood vessel" in lines["measurement group 3 (tracking id lesion diameter)"]
    assert (
        "no coordinates give the finding's position"
        in lines["measurement group 4 (tracking id values only)"]
    )
    assert lines["measurement group 5 (tracking id elsewhere)"] == (
        f"coordinates reference images not in the dataset (SOP Instance UID {foreign} is not "
        f"under {images.resolve()})"
    )
    assert all(s.file == str((reports / "a" / "lidc.dcm").resolve()) for s in done.skipped)


def test_scoord3d_lines_are_patient_coordinates(
    cases: dict[str, Case], reports: Path, images: Path
) -> None:
    truth = cases["lung1_001_gtv"].truth["lesions"][0]
    done = import_sr(reports / "b" / "lung1.dcm", images=images, limits=LIMITS)
    assert not done.skipped
    (finding,) = done.findings
    assert (finding.long_axis_mm, finding.short_axis_mm) == (
        truth["long_axis_mm"],
        truth["short_axis_mm"],
    )
    assert finding.slice_index == truth["slice_index"]
    for name in ("long_axis_lps_mm", "short_axis_lps_mm"):
        np.testing.assert_allclose(getattr(finding, name), truth[name], atol=1e-6)
    np.testing.assert_allclose(finding.center_lps_mm, truth["center_lps_mm"], atol=0.01)
    assert finding.provenance.annotator == "Rick Roe"


def test_a_folder_of_reports_imports_each_and_ignores_other_files(
    cases: dict[str, Case], reports: Path, images: Path
) -> None:
    done = import_sr(reports, images=images, annotator="reader 7", limits=LIMITS)
    by_file = {f.provenance.item.split(",")[0]: f for f in done.findings}
    assert set(by_file) == {"a/lidc.dcm", "b/lung1.dcm", "c/aorta.sr"}
    vessel = by_file["c/aorta.sr"]
    segment, aorta = _aorta_line(cases["ts_abdomen_dicom"])
    assert vessel.kind == "vessel" and vessel.long_axis_mm is None
    assert vessel.diameter_mm == pytest.approx(aorta["diameter_mm"], rel=1e-12)  # cm -> mm
    np.testing.assert_allclose(vessel.diameter_lps_mm, segment, atol=0.01)
    np.testing.assert_allclose(vessel.center_lps_mm, aorta["center_lps_mm"], atol=0.01)
    assert {f.provenance.annotator for f in done.findings} == {"reader 7"}
    assert len(done.skipped) == 4  # the lidc report's, as on its own
    series = {c.series.info.series_instance_uid for c in cases.values()}
    assert {s.series_instance_uid for s in done.studies} == series
    assert all(s.annotated == () for s in done.studies)


def test_importing_twice_gives_identical_rows(reports: Path, images: Path) -> None:
    first, second = (import_sr(reports, images=images, limits=LIMITS) for _ in range(2))
    assert [f.to_json() for f in first.findings] == [f.to_json() for f in second.findings]
    assert [s.to_json() for s in first.studies] == [s.to_json() for s in second.studies]
    assert [s.to_json() for s in first.skipped] == [s.to_json() for s in second.skipped]
    assert len({f.id for f in first.findings}) == len(first.findings) == 3


def test_reports_whose_series_is_not_there_and_bad_inputs(
    reports: Path, images: Path, tmp_path: Path
) -> None:
    done = import_sr(reports / "b" / "lung1.dcm", images=images / "lidc0314_nodule", limits=LIMITS)
    assert not done.findings and not done.studies
    (line,) = done.skipped
    assert "frame of reference" in line.reason and "no series under" in line.reason
    (tmp_path / "x.txt").write_text("hello", encoding="utf-8")
    empty = import_sr(tmp_path, images=images, limits=LIMITS)
    assert [s.reason for s in empty.skipped] == ["no DICOM SR file under this folder"]
    with pytest.raises(ConfigurationError, match="no such SR file or folder"):
        import_sr(tmp_path / "missing.dcm", limits=LIMITS)


def test_a_region_gives_the_position_of_values_without_lines(
    cases: dict[str, Case], images: Path, tmp_path: Path
) -> None:
    """A planar ROI group (TID 1410) whose diameter has no line of its own: the centre of its
    circle is the vessel's position, on the circle's image."""
    case = cases["ts_abdomen_dicom"]
    segment, aorta = _aorta_line(case)
    k = round(float(case.series.geometry.lps_to_index(segment.mean(axis=0))[0]))
    image = case.image(k)
    circle = hd.sr.ImageRegion(  # its centre, then a point on it
        graphic_type=hd.sr.GraphicTypeValues.CIRCLE,
        graphic_data=case.column_row(np.stack([segment.mean(axis=0), segment[1]])),
        source_image=hd.sr.SourceImageForRegion(image.SOPClassUID, image.SOPInstanceUID),
    )
    group = _group(
        "outlined", [_measurement(codes.SCT.Diameter, 27.5)], codes.SCT.Aorta, region=circle
    )
    path = _write(tmp_path / "outlined.dcm", [group], case.headers)
    (vessel,) = import_sr(path, images=images / "ts_abdomen_dicom", limits=LIMITS).findings
    assert vessel.kind == "vessel" and vessel.diameter_mm == 27.5
    assert vessel.diameter_lps_mm is None and vessel.slice_index == k
    np.testing.assert_allclose(vessel.center_lps_mm, aorta["center_lps_mm"], atol=0.01)
