"""DICOM series: grouping, ordering, spacing, rescale and the documented rejection rules."""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydicom.dataset import Dataset

from ingestion import load_path, scan_path
from ingestion.volume import Modality, SourceFormat

from tests.support.series import SeriesFactory, WrittenSeries


def assert_volume_matches(folder: Path, written: WrittenSeries) -> None:
    result = load_path(folder)
    assert len(result.volumes) == 1, [r.reason for r in result.rejected]
    vol = result.volumes[0]
    np.testing.assert_array_equal(vol.voxels, written.hu)
    np.testing.assert_allclose(vol.geometry.origin, written.positions[0], atol=1e-6)
    # every slice lands exactly where its ImagePositionPatient says
    s = vol.shape[0]
    idx = np.stack([np.arange(s), np.zeros(s), np.zeros(s)], axis=1)
    np.testing.assert_allclose(vol.geometry.index_to_lps(idx), written.positions, atol=1e-5)
    np.testing.assert_allclose(vol.geometry.row_direction, written.row_direction, atol=1e-7)
    np.testing.assert_allclose(vol.geometry.column_direction, written.column_direction, atol=1e-7)
    assert (vol.geometry.row_spacing, vol.geometry.column_spacing) == written.pixel_spacing
    ds_uids = [p.name for p in written.paths]
    assert [p.name for p in vol.sources] == ds_uids


def test_shuffled_file_names_load_in_position_order(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    written = write_series(tmp_path / "s", order="shuffled", n=7)
    assert sorted(p.name for p in written.paths) != [p.name for p in written.paths]
    assert_volume_matches(tmp_path / "s", written)


def test_reversed_numbering_does_not_reverse_the_volume(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    # file names and InstanceNumber both count down while positions go up
    written = write_series(tmp_path / "s", order="descending", n=5)
    assert_volume_matches(tmp_path / "s", written)
    vol = load_path(tmp_path / "s").volumes[0]
    assert vol.geometry.slice_direction == pytest.approx((0.0, 0.0, 1.0))
    assert vol.geometry.slice_spacing == pytest.approx(2.5)
    assert vol.modality is Modality.CT and vol.source_format is SourceFormat.DICOM


def test_slices_listed_top_down_are_ordered_along_the_normal(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    # step against the normal: slice 0 is the highest; radcaliper orders along +normal
    written = write_series(tmp_path / "s", step=(0.0, 0.0, -3.0), n=5)
    assert_volume_matches(tmp_path / "s", written)
    vol = load_path(tmp_path / "s").volumes[0]
    assert vol.geometry.slice_direction == pytest.approx((0.0, 0.0, 1.0))
    assert vol.geometry.origin[2] == pytest.approx(30.0 - 4 * 3.0)


def test_sagittal_series(tmp_path: Path, write_series: SeriesFactory) -> None:
    written = write_series(
        tmp_path / "s", row_direction=(0, 1, 0), column_direction=(0, 0, -1), gap=1.2
    )
    assert_volume_matches(tmp_path / "s", written)
    vol = load_path(tmp_path / "s").volumes[0]
    assert vol.geometry.plane == "sagittal"
    # (0,1,0) x (0,0,-1) = (-1,0,0): slices are ordered along the image normal, patient right
    assert vol.geometry.slice_direction == pytest.approx((-1.0, 0.0, 0.0))


def test_double_oblique_series(tmp_path: Path, write_series: SeriesFactory) -> None:
    a, b = math.radians(25), math.radians(-40)
    row = np.array([math.cos(a), math.sin(a), 0.0])
    col = np.array([-math.sin(a) * math.cos(b), math.cos(a) * math.cos(b), math.sin(b)])
    written = write_series(tmp_path / "s", row_direction=row, column_direction=col, gap=1.7)
    assert_volume_matches(tmp_path / "s", written)
    vol = load_path(tmp_path / "s").volumes[0]
    assert vol.geometry.plane == "oblique"
    assert vol.geometry.slice_spacing == pytest.approx(1.7, abs=1e-5)


def test_gantry_tilt_is_kept_exact_and_reported(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    tilt = math.radians(15)
    step = (0.0, 2.0 * math.sin(tilt), 2.0 * math.cos(tilt))
    written = write_series(tmp_path / "s", step=step)
    assert_volume_matches(tmp_path / "s", written)
    vol = load_path(tmp_path / "s").volumes[0]
    assert vol.geometry.tilt_degrees == pytest.approx(15.0, abs=1e-3)
    assert vol.geometry.slice_plane_distance == pytest.approx(2.0 * math.cos(tilt), abs=1e-5)
    assert any("gantry tilt" in w for w in vol.warnings)


@pytest.mark.parametrize(
    ("tag", "tilt", "said"),
    [
        ("-15", -15.0, "sign of GantryDetectorTilt -15"),
        ("15", 15.0, "sign of GantryDetectorTilt 15"),
        ("-12", -15.0, "sign of GantryDetectorTilt -12, which disagrees with the 15.00 degrees"),
        (None, 15.0, "no GantryDetectorTilt tag: its sign is not known"),
        ("0", 15.0, "GantryDetectorTilt says 0: its sign is not known"),
    ],
)
def test_gantry_tilt_is_reported_with_the_sign_of_its_tag(
    tmp_path: Path, write_series: SeriesFactory, tag: str | None, tilt: float, said: str
) -> None:
    """The size comes from the positions; the sign (vendors differ in which way is positive)
    from GantryDetectorTilt, never made up."""
    from app.inspection import inspect_path_report

    def state(ds: Dataset, i: int) -> None:
        if tag is not None:
            ds.GantryDetectorTilt = tag

    angle = math.radians(15)
    write_series(
        tmp_path / "s", step=(0.0, 2.0 * math.sin(angle), 2.0 * math.cos(angle)), mutate=state
    )
    (volume,) = load_path(tmp_path / "s").volumes
    assert volume.geometry.tilt_degrees == pytest.approx(15.0, abs=1e-3)  # the geometry's size
    assert (volume.gantry_tilt_degrees is None) == (tag in (None, "0"))
    warning = next(w for w in volume.warnings if "gantry tilt" in w)
    assert warning.startswith(f"gantry tilt of {tilt:.2f} degrees ({said}")
    for read_pixels in (True, False):
        (series,) = inspect_path_report(tmp_path / "s", read_pixels=read_pixels)["series"]
        assert series["tilt_degrees"] == pytest.approx(tilt, abs=1e-3)


def test_rescale_slope_and_intercept_give_hu(tmp_path: Path, write_series: SeriesFactory) -> None:
    written = write_series(tmp_path / "s", slope=0.5, intercept=-1000.0)
    assert_volume_matches(tmp_path / "s", written)


def test_one_missing_slice_rejects_the_series_naming_the_gap(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    written = write_series(tmp_path / "s", n=8, drop=[4])
    result = load_path(tmp_path / "s")
    assert result.volumes == []
    (rejected,) = result.rejected
    assert "1 missing slice(s)" in rejected.reason
    assert "gap of 5.000 mm" in rejected.reason and "steps 2.500 mm" in rejected.reason
    # names the files on both sides of the hole
    assert str(written.paths[3]) in rejected.reason and str(written.paths[4]) in rejected.reason


def test_uneven_gaps_are_rejected(tmp_path: Path, write_series: SeriesFactory) -> None:
    def shift(ds: Dataset, i: int) -> None:
        if i == 3:
            x, y, z = (float(v) for v in ds.ImagePositionPatient)
            ds.ImagePositionPatient = [x, y, z + 0.8]

    write_series(tmp_path / "s", mutate=shift)
    (rejected,) = load_path(tmp_path / "s").rejected
    assert "non-uniform slice gaps" in rejected.reason


def test_positional_jitter_within_tolerance_is_accepted(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    def jitter(ds: Dataset, i: int) -> None:  # 5 micrometres: DS rounding in real exports
        x, y, z = (float(v) for v in ds.ImagePositionPatient)
        ds.ImagePositionPatient = [x, y, round(z + (0.005 if i % 2 else -0.005), 6)]

    write_series(tmp_path / "s", mutate=jitter)
    assert len(load_path(tmp_path / "s").volumes) == 1


def test_duplicated_position_rejects_and_names_both_files(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    written = write_series(tmp_path / "s", n=4)

    def same_place(ds: Dataset, i: int) -> None:
        ds.ImagePositionPatient = [f"{v:.6f}" for v in written.positions[1]]

    other = write_series(
        tmp_path / "x",
        n=1,
        series_uid=written.series_uid,
        study_uid=written.study_uid,
        mutate=same_place,
    )
    shutil.move(other.paths[0], tmp_path / "s" / "copy.dcm")
    (rejected,) = load_path(tmp_path / "s").rejected
    assert "duplicated slice position" in rejected.reason
    assert "copy.dcm" in rejected.reason and written.paths[1].name in rejected.reason


def test_exact_duplicate_file_is_used_once(tmp_path: Path, write_series: SeriesFactory) -> None:
    written = write_series(tmp_path / "s", n=4)
    shutil.copy(written.paths[2], tmp_path / "s" / "zz_copy.dcm")
    result = load_path(tmp_path / "s")
    assert len(result.volumes) == 1 and result.volumes[0].shape[0] == 4
    (rejected,) = result.rejected
    assert "same SOPInstanceUID" in rejected.reason


def test_each_extra_copy_of_an_image_gets_one_entry(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    """Three exact copies: two entries (one per extra copy), also for a multi-frame object."""
    from tests.support.enhanced import write_enhanced

    written = write_series(tmp_path / "s", n=4)
    for name in ("copy_a.dcm", "copy_b.dcm"):
        shutil.copy(written.paths[2], tmp_path / "s" / name)
    (tmp_path / "e").mkdir()
    write_enhanced(tmp_path / "e" / "enh.dcm", frames=5)
    for name in ("enh_a.dcm", "enh_b.dcm"):
        shutil.copy(tmp_path / "e" / "enh.dcm", tmp_path / "e" / name)
    for folder, planes in (("s", 4), ("e", 5)):
        result = load_path(tmp_path / folder)
        assert [v.shape[0] for v in result.volumes] == [planes]
        assert len(result.rejected) == 2, [r.reason for r in result.rejected]
        assert all("duplicate of" in r.reason for r in result.rejected)
        assert len({r.path for r in result.rejected}) == 2


def test_two_reconstructions_in_one_series_are_two_stacks(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    """One SeriesInstanceUID holding a 2.5 mm and a 5 mm reconstruction of the same range: the
    positions repeat, so the series does not stack as a whole; split by SliceThickness, each
    reconstruction is a valid stack of its own."""
    thin = write_series(tmp_path / "s" / "thin", n=10, gap=2.5, rows=6, cols=6)
    thick = write_series(
        tmp_path / "s" / "thick",
        n=5,
        gap=5.0,
        rows=6,
        cols=6,
        study_uid=thin.study_uid,
        series_uid=thin.series_uid,
        seed=1,
    )
    result = load_path(tmp_path / "s")
    assert result.rejected == []
    by_slices = {v.shape[0]: v for v in result.volumes}
    assert sorted(by_slices) == [5, 10]
    assert by_slices[10].geometry.slice_spacing == pytest.approx(2.5)
    assert by_slices[5].geometry.slice_spacing == pytest.approx(5.0)
    np.testing.assert_array_equal(by_slices[10].voxels, thin.hu)
    np.testing.assert_array_equal(by_slices[5].voxels, thick.hu)
    for volume, thickness in ((by_slices[10], "2.5"), (by_slices[5], "5")):
        note = volume.warnings[0]
        assert note.startswith("part ") and f"this one has SliceThickness {thickness}" in note


def test_images_at_one_position_that_nothing_tells_apart_stay_refused(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    """Bolus-tracking monitoring: four acquisitions at one table position, the same
    reconstruction. Not four stacks: the series is refused (duplicated position)."""

    def one_place(ds: Dataset, i: int) -> None:
        ds.ImagePositionPatient = ["0", "0", "61.5"]
        ds.AcquisitionNumber = i + 1

    write_series(tmp_path / "s", n=4, mutate=one_place)
    result = load_path(tmp_path / "s")
    assert result.volumes == []
    (rejected,) = result.rejected
    assert "duplicated slice position" in rejected.reason


def test_series_mixing_orientations_is_split(tmp_path: Path, write_series: SeriesFactory) -> None:
    axial = write_series(tmp_path / "s" / "a", n=4)
    write_series(
        tmp_path / "s" / "b",
        n=3,
        row_direction=(0, 1, 0),
        column_direction=(0, 0, -1),
        study_uid=axial.study_uid,
        series_uid=axial.series_uid,
        seed=1,
    )
    result = load_path(tmp_path / "s")
    assert sorted(v.shape[0] for v in result.volumes) == [3, 4]
    assert {v.geometry.plane for v in result.volumes} == {"axial", "sagittal"}
    for vol in result.volumes:
        assert any("split" in w for w in vol.warnings)


def test_series_mixing_image_sizes_is_split(tmp_path: Path, write_series: SeriesFactory) -> None:
    a = write_series(tmp_path / "s" / "a", n=3, rows=8)
    write_series(
        tmp_path / "s" / "b",
        n=3,
        rows=12,
        study_uid=a.study_uid,
        series_uid=a.series_uid,
        origin=(0.0, 0.0, 100.0),
    )
    result = load_path(tmp_path / "s")
    assert sorted(v.shape[1] for v in result.volumes) == [8, 12]


def test_studies_and_series_are_grouped(tmp_path: Path, write_series: SeriesFactory) -> None:
    a = write_series(tmp_path / "tree" / "p1" / "ct", n=3)
    write_series(tmp_path / "tree" / "p1" / "ct2", n=4, study_uid=a.study_uid, seed=2)
    write_series(tmp_path / "tree" / "p2", n=5, seed=3)
    result = scan_path(tmp_path / "tree")
    assert sorted(len(s.slices) for s in result.series) == [3, 4, 5]
    assert len({s.info.study_instance_uid for s in result.series}) == 2
    assert result.rejected == []


def test_identifiers_point_back_to_each_image(tmp_path: Path, write_series: SeriesFactory) -> None:
    import pydicom

    written = write_series(tmp_path / "s", n=4)
    vol = load_path(tmp_path / "s").volumes[0]
    expected = [str(pydicom.dcmread(p).SOPInstanceUID) for p in written.paths]
    assert list(vol.identifiers.sop_instance_uids) == expected
    assert vol.identifiers.frame_numbers == (None,) * 4
    assert vol.identifiers.series_instance_uid == written.series_uid
    assert vol.identifiers.patient_id == "TEST-0001"
    assert vol.identifiers.patient_name == "Test^Patient"


@pytest.mark.parametrize("name", [None, ""])
def test_absent_or_empty_patient_name_is_none(
    tmp_path: Path, write_series: SeriesFactory, name: str | None
) -> None:
    def set_name(ds: Dataset, i: int) -> None:
        if name is None:
            del ds.PatientName
        else:
            ds.PatientName = name

    write_series(tmp_path / "s", n=3, mutate=set_name)
    assert load_path(tmp_path / "s").volumes[0].identifiers.patient_name is None


@pytest.mark.parametrize(
    ("keyword", "message"),
    [
        ("PixelSpacing", "missing PixelSpacing"),
        ("ImagePositionPatient", "missing ImagePositionPatient"),
        ("ImageOrientationPatient", "missing ImageOrientationPatient"),
    ],
)
def test_missing_geometry_attribute_is_named(
    tmp_path: Path, write_series: SeriesFactory, keyword: str, message: str
) -> None:
    def remove(ds: Dataset, i: int) -> None:
        if i == 2:
            delattr(ds, keyword)

    written = write_series(tmp_path / "s", n=4, mutate=remove)
    result = scan_path(tmp_path / "s")
    bad = [r for r in result.rejected if message in r.reason]
    assert len(bad) == 1
    assert str(bad[0].path) in {str(p) for p in written.paths}
    # the other three slices do not pass for a complete series
    assert result.series == []
    assert any("incomplete" in r.reason and str(bad[0].path) in r.reason for r in result.rejected)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 0, 0, 0, 0.9, 0.4], "not a unit vector"),
        ([1, 0, 0, 0.7071068, 0.7071068, 0], "not perpendicular"),
        ([1, 0, 0, 0, 1], "must hold 6 finite numbers"),
    ],
)
def test_inconsistent_orientation_is_rejected(
    tmp_path: Path, write_series: SeriesFactory, value: list[float], message: str
) -> None:
    def corrupt(ds: Dataset, i: int) -> None:
        ds.ImageOrientationPatient = value

    write_series(tmp_path / "s", n=2, mutate=corrupt)
    result = scan_path(tmp_path / "s")
    assert result.series == []
    assert all(message in r.reason for r in result.rejected)


def test_zero_pixel_spacing_is_rejected(tmp_path: Path, write_series: SeriesFactory) -> None:
    def corrupt(ds: Dataset, i: int) -> None:
        ds.PixelSpacing = [0, 0.5]

    write_series(tmp_path / "s", n=2, mutate=corrupt)
    rejected = scan_path(tmp_path / "s").rejected
    assert all(
        "PixelSpacing is [0.0, 0.5] mm; both values must be > 0" in r.reason for r in rejected
    )


@pytest.mark.parametrize(
    ("tags", "words"),
    [
        ({"PixelSpacing": [-0.7, 0.8]}, "PixelSpacing is [-0.7, 0.8] mm"),
        (
            {"ImageOrientationPatient": [1, 0, 0, 0, 2, 0]},
            "ImageOrientationPatient [1.0, 0.0, 0.0, 0.0, 2.0, 0.0] has a column vector",
        ),
        (
            {"ImageOrientationPatient": [1, 0, 0, 0.6, 0.8, 0]},
            "ImageOrientationPatient [1.0, 0.0, 0.0, 0.6, 0.8, 0.0] has row and column vectors "
            "that are not perpendicular (dot = 0.6000)",
        ),
    ],
)
def test_contradictory_geometry_names_the_tag_and_its_value(
    tmp_path: Path, write_series: SeriesFactory, tags: dict[str, Any], words: str
) -> None:
    def corrupt(ds: Dataset, i: int) -> None:
        for keyword, value in tags.items():
            setattr(ds, keyword, value)

    write_series(tmp_path / "s", n=3, mutate=corrupt)
    result = scan_path(tmp_path / "s")
    assert result.series == [] and len(result.rejected) == 3
    assert all(words in r.reason for r in result.rejected), result.rejected[0].reason


@pytest.mark.parametrize(
    ("tags", "warning"),
    [
        ({"SliceThickness": "-2.5"}, "SliceThickness is -2.5 mm; a slice spacing must be > 0"),
        ({"SliceThickness": "0"}, "SliceThickness is 0 mm; a slice spacing must be > 0"),
        (
            {"SpacingBetweenSlices": "-2.5"},
            "SpacingBetweenSlices is -2.5 mm; a slice spacing must be > 0",
        ),
        ({"SliceThickness": "thick"}, "SliceThickness is 'thick', not a number"),
        (
            {"SpacingBetweenSlices": "4"},
            "SpacingBetweenSlices is 4 mm but the slices are 2.5 mm apart (2.5 mm between planes)",
        ),
    ],
)
def test_unused_header_contradictions_are_named_in_a_warning(
    tmp_path: Path, write_series: SeriesFactory, tags: dict[str, str], warning: str
) -> None:
    """Slice spacing comes from the positions; a stated one that cannot be right is named."""
    from pydicom.dataelem import RawDataElement
    from pydicom.tag import Tag

    def state(ds: Dataset, i: int) -> None:
        for keyword, value in tags.items():  # as written by an exporter, even 'thick'
            raw = value.encode().ljust(len(value) + len(value) % 2)
            ds[Tag(keyword)] = RawDataElement(Tag(keyword), "DS", len(raw), raw, 0, False, True)

    write_series(tmp_path / "s", n=4, gap=2.5, mutate=state)
    (volume,) = load_path(tmp_path / "s").volumes
    assert volume.geometry.slice_spacing == pytest.approx(2.5)
    assert any(w.startswith(warning) for w in volume.warnings), volume.warnings


def test_a_single_slice_with_a_negative_thickness_is_rejected_naming_it(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    def state(ds: Dataset, i: int) -> None:
        ds.SliceThickness = "-2.5"

    write_series(tmp_path / "s", n=1, mutate=state)
    (rejected,) = scan_path(tmp_path / "s").rejected
    assert "SliceThickness is -2.5 mm; a slice spacing must be > 0" in rejected.reason
    assert "its slice spacing is unknown" in rejected.reason


def test_localizer_is_skipped(tmp_path: Path, write_series: SeriesFactory) -> None:
    def scout(ds: Dataset, i: int) -> None:
        ds.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]

    write_series(tmp_path / "s", n=1, mutate=scout)
    (rejected,) = scan_path(tmp_path / "s").rejected
    assert "localizer/scout" in rejected.reason


def test_single_slice_uses_stated_thickness(tmp_path: Path, write_series: SeriesFactory) -> None:
    write_series(tmp_path / "s", n=1, gap=3.0)
    vol = load_path(tmp_path / "s").volumes[0]
    assert vol.geometry.slice_spacing == 3.0
    assert any("single slice" in w for w in vol.warnings)


def test_single_slice_without_thickness_is_rejected(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    def strip(ds: Dataset, i: int) -> None:
        del ds.SliceThickness

    write_series(tmp_path / "s", n=1, mutate=strip)
    (rejected,) = scan_path(tmp_path / "s").rejected
    assert "neither SpacingBetweenSlices nor SliceThickness" in rejected.reason


def test_mr_without_rescale_keeps_stored_values(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    def strip(ds: Dataset, i: int) -> None:
        del ds.RescaleSlope, ds.RescaleIntercept

    written = write_series(tmp_path / "s", modality="MR", intercept=0.0, mutate=strip)
    vol = load_path(tmp_path / "s").volumes[0]
    assert vol.modality is Modality.MR
    np.testing.assert_array_equal(vol.voxels, written.hu)


def _raw_text_elements(values: dict[str, tuple[str, bytes]]) -> Callable[[Dataset, int], None]:
    """A mutate that writes text values as raw bytes, as an exporter did (no SpecificCharacterSet
    unless given)."""
    from pydicom.dataelem import RawDataElement
    from pydicom.tag import Tag

    def write(ds: Dataset, i: int) -> None:
        for keyword, (vr, raw) in values.items():
            raw = raw + b" " * (len(raw) % 2)
            ds[Tag(keyword)] = RawDataElement(Tag(keyword), vr, len(raw), raw, 0, False, True)

    return write


@pytest.mark.parametrize(
    ("encoding", "read_as"), [("utf-8", "UTF-8"), ("latin-1", "ISO 8859-1 (Latin-1)")]
)
def test_undeclared_non_ascii_text_is_decoded_and_warned_about(
    tmp_path: Path,
    write_series: SeriesFactory,
    caplog: pytest.LogCaptureFixture,
    encoding: str,
    read_as: str,
) -> None:
    """No SpecificCharacterSet (default repertoire: ASCII) but non-ASCII bytes: UTF-8 when they
    are valid UTF-8, else Latin-1, with a warning naming each tag and never the value (pydicom
    alone gave 'PAT-Ã\x9cnÃ¯cÃ¶dÃ©' silently)."""
    patient_id = "PAT-Ünïcödé-日本" if encoding == "utf-8" else "PAT-Ünïcödé"
    values = {
        "PatientID": ("LO", patient_id.encode(encoding)),
        "PatientName": ("PN", "Müller^Jürgen".encode(encoding)),
        "SeriesDescription": ("LO", b"Thorax nativ"),  # ASCII: nothing to say
    }
    write_series(tmp_path / "s", n=3, mutate=_raw_text_elements(values))
    with caplog.at_level(logging.WARNING, logger="ingestion"):
        (volume,) = load_path(tmp_path / "s").volumes
    ids = volume.identifiers
    assert (ids.patient_id, ids.patient_name) == (patient_id, "Müller^Jürgen")
    assert ids.series_description == "Thorax nativ"
    said = [w for w in volume.warnings if "SpecificCharacterSet" in w]
    assert [w.split()[0] for w in said] == ["PatientID", "PatientName"]
    assert all(f"read as {read_as}" in w for w in said)
    logged = [r.getMessage() for r in caplog.records if "SpecificCharacterSet" in r.getMessage()]
    assert len(logged) == 2
    for text in (*said, *logged):
        assert "Ünïcödé" not in text and "Müller" not in text and "PAT-" not in text


def test_declared_character_sets_are_read_without_a_warning(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    values = {
        "SpecificCharacterSet": ("CS", b"ISO_IR 192"),
        "PatientID": ("LO", "PAT-Ünïcödé-日本".encode()),
        "PatientName": ("PN", "Müller^Jürgen".encode()),
    }
    write_series(tmp_path / "s", n=3, mutate=_raw_text_elements(values))
    (volume,) = load_path(tmp_path / "s").volumes
    assert volume.identifiers.patient_id == "PAT-Ünïcödé-日本"
    assert volume.identifiers.patient_name == "Müller^Jürgen"
    assert not any("SpecificCharacterSet" in w for w in volume.warnings)
