"""Synthetic CT phantoms: within the spec, deterministic, exact partial volume and round trips."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydicom.uid import UID, CTImageStorage, ExplicitVRLittleEndian
from typer.testing import CliRunner

from app.cli import app
from ingestion import load_nifti, load_path
from ingestion.errors import ConfigurationError
from ingestion.geometry import Geometry
from ingestion.phantoms import (
    Phantom,
    PhantomSpec,
    TruthFinding,
    generate_phantom,
    study_seed,
    write_dicom,
    write_nifti,
    write_phantoms,
)
from ingestion.volume import Volume

SPEC = PhantomSpec()
SEEDS = range(20)
MM = 1e-3  # geometry tolerance in mm
NOISELESS = PhantomSpec(noise_sd_hu=(0.0, 0.0))


@pytest.fixture(scope="module")
def phantoms() -> list[Phantom]:
    """Twenty default-spec phantoms, in memory."""
    return [generate_phantom(seed) for seed in SEEDS]


def lesions(phantom: Phantom) -> list[TruthFinding]:
    return [f for f in phantom.findings if f.kind == "lesion"]


def vessels(phantom: Phantom) -> list[TruthFinding]:
    return [f for f in phantom.findings if f.kind == "vessel"]


def normalised_radius(lesion: TruthFinding, points: np.ndarray) -> np.ndarray:
    """|M (p - centre)| for (..., 3) LPS points: < 1 inside the lesion ellipsoid."""
    assert lesion.long_axis_mm and lesion.short_axis_mm and lesion.cc_extent_mm
    angle = math.radians(lesion.rotation_deg or 0.0)
    d = np.asarray(points, dtype=float) - np.asarray(lesion.center_lps_mm)
    u = math.cos(angle) * d[..., 0] + math.sin(angle) * d[..., 1]
    v = -math.sin(angle) * d[..., 0] + math.cos(angle) * d[..., 1]
    return (
        np.asarray(
            (u / (lesion.long_axis_mm / 2)) ** 2
            + (v / (lesion.short_axis_mm / 2)) ** 2
            + (d[..., 2] / (lesion.cc_extent_mm / 2)) ** 2
        )
        ** 0.5
    )


def lesion_surface(lesion: TruthFinding, n: int = 24) -> np.ndarray:
    """(2n * n, 3) LPS points on the lesion's surface."""
    assert lesion.long_axis_mm and lesion.short_axis_mm and lesion.cc_extent_mm
    u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 2 * n, endpoint=False), np.linspace(0, np.pi, n))
    a, b, c = lesion.long_axis_mm / 2, lesion.short_axis_mm / 2, lesion.cc_extent_mm / 2
    x, y, z = a * np.cos(u) * np.sin(v), b * np.sin(u) * np.sin(v), c * np.cos(v)
    angle = math.radians(lesion.rotation_deg or 0.0)
    pts = np.stack(
        [math.cos(angle) * x - math.sin(angle) * y, math.sin(angle) * x + math.cos(angle) * y, z],
        axis=-1,
    ).reshape(-1, 3)
    return np.asarray(pts + np.asarray(lesion.center_lps_mm))


def lesion_outline(lesion: TruthFinding, n: int = 720) -> np.ndarray:
    """(n, 2) x, y points on the lesion's axial outline through its centre.

    The ellipsoid's third axis is along z, so this ellipse is also its axial projection.
    """
    assert lesion.long_axis_mm and lesion.short_axis_mm
    t = np.linspace(0, 2 * np.pi, n, endpoint=False)
    u, v = lesion.long_axis_mm / 2 * np.cos(t), lesion.short_axis_mm / 2 * np.sin(t)
    angle = math.radians(lesion.rotation_deg or 0.0)
    x = math.cos(angle) * u - math.sin(angle) * v + lesion.center_lps_mm[0]
    y = math.sin(angle) * u + math.cos(angle) * v + lesion.center_lps_mm[1]
    return np.stack([x, y], axis=1)


def body_depth(phantom: Phantom, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Distance (mm) inside the body outline, by brute force over 4000 outline points."""
    (cx, cy), (a, b) = phantom.body.center_lps_mm, phantom.body.semi_axes_mm
    t = np.linspace(0, 2 * np.pi, 4000, endpoint=False)
    ox, oy = cx + a * np.cos(t), cy + b * np.sin(t)
    dist = np.sqrt((x[:, None] - ox) ** 2 + (y[:, None] - oy) ** 2).min(axis=1)
    inside = ((x - cx) / a) ** 2 + ((y - cy) / b) ** 2 < 1
    return np.asarray(np.where(inside, dist, -dist))


def voxel_radius(phantom: Phantom, lesion: TruthFinding) -> np.ndarray:
    """(S, R, C) normalised radius of every voxel centre with respect to ``lesion``."""
    g = phantom.geometry
    slices, rows, cols = phantom.shape
    z = g.origin[2] + g.slice_spacing * np.arange(slices)[:, None, None]
    y = g.origin[1] + g.row_spacing * np.arange(rows)[None, :, None]
    x = g.origin[0] + g.column_spacing * np.arange(cols)[None, None, :]
    points = np.stack(np.broadcast_arrays(x, y, z), axis=-1)  # (S, R, C, 3)
    return normalised_radius(lesion, points)


def assert_same_geometry(got: Geometry, want: Geometry) -> None:
    for name in ("origin", "spacing", "row_direction", "column_direction", "slice_direction"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=MM, err_msg=name)


def loaded_dicom(folder: Path) -> Volume:
    result = load_path(folder)
    assert not result.rejected, result.rejected
    (volume,) = result.volumes
    return volume


# -- spec ----------------------------------------------------------------------------------------


def test_spec_defaults_are_the_spec() -> None:
    assert SPEC.matrix_size == (224, 288)
    assert SPEC.pixel_spacing_mm == (0.6, 1.0)
    assert SPEC.slice_spacings_mm == (1.0, 1.25, 2.0, 2.5, 3.0, 5.0)
    assert SPEC.slice_count == (20, 60)
    assert SPEC.air_hu == -1000.0
    assert SPEC.body_semi_axis_fraction == (0.30, 0.45)
    assert SPEC.fat_hu == -100.0
    assert SPEC.fat_thickness_mm == (5.0, 20.0)
    assert SPEC.soft_tissue_hu == (30.0, 60.0)
    assert SPEC.noise_sd_hu == (8.0, 25.0)
    assert SPEC.lesion_count == (1, 3)
    assert SPEC.lesion_long_axis_mm == (8.0, 60.0)
    assert SPEC.lesion_short_axis_ratio == (0.4, 1.0)
    assert SPEC.lesion_cc_extent_ratio == (0.5, 1.0)
    assert SPEC.lesion_contrast_hu == (40.0, 120.0)
    assert SPEC.lesion_edge_margin_mm == 5.0
    assert SPEC.lesion_gap_mm == 3.0
    assert SPEC.vessel_probability == 0.7
    assert SPEC.vessel_diameter_mm == (15.0, 45.0)
    assert SPEC.vessel_hu == (150.0, 300.0)
    assert json.loads(json.dumps(SPEC.to_json()))["slice_count"] == [20, 60]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("matrix_size", (300, 200)),
        ("matrix_size", (224.0, 288)),
        ("pixel_spacing_mm", (0.0, 1.0)),
        ("slice_spacings_mm", ()),
        ("slice_spacings_mm", (1.0, -2.0)),
        ("slice_count", (0, 5)),
        ("body_semi_axis_fraction", (0.3, 0.6)),
        ("noise_sd_hu", (-1.0, 5.0)),
        ("lesion_short_axis_ratio", (0.4, 1.5)),
        ("lesion_long_axis_mm", (8.0, float("nan"))),
        ("lesion_gap_mm", -1.0),
        ("vessel_probability", 1.2),
        ("vessel_hu", "150-300"),
        ("fat_hu", None),
    ],
)
def test_spec_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        PhantomSpec(**{field: value})  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(lo=st.floats(0.1, 100), delta=st.floats(0.01, 50))
def test_spec_rejects_any_inverted_range(lo: float, delta: float) -> None:
    with pytest.raises(ValueError, match="min <= max"):
        PhantomSpec(vessel_diameter_mm=(lo + delta, lo))


def test_a_spec_without_room_is_refused_clearly() -> None:
    cramped = PhantomSpec(body_semi_axis_fraction=(0.1, 0.1), fat_thickness_mm=(20.0, 20.0))
    with pytest.raises(ValueError, match="no room"):
        generate_phantom(0, cramped)


def test_truth_findings_check_their_fields() -> None:
    lesion = TruthFinding(
        kind="lesion",
        center_lps_mm=(1, 2, 3),
        slice_index=4,
        long_axis_mm=20,
        short_axis_mm=10,
        cc_extent_mm=15,
        rotation_deg=30,
        contrast_hu=-50,
        hu=-10,
    )
    assert lesion.to_json() == {
        "kind": "lesion",
        "center_lps_mm": [1.0, 2.0, 3.0],
        "slice_index": 4,
        "long_axis_mm": 20.0,
        "short_axis_mm": 10.0,
        "cc_extent_mm": 15.0,
        "rotation_deg": 30.0,
        "contrast_hu": -50.0,
        "hu": -10.0,
    }
    vessel = TruthFinding(
        kind="vessel", center_lps_mm=(0, 0, 0), slice_index=0, diameter_mm=20, hu=200
    )
    assert vessel.to_json()["diameter_mm"] == 20.0 and "long_axis_mm" not in vessel.to_json()
    with pytest.raises(ValueError, match="kind"):
        TruthFinding(kind="cyst", center_lps_mm=(0, 0, 0), slice_index=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="long_axis_mm"):
        TruthFinding(kind="lesion", center_lps_mm=(0, 0, 0), slice_index=0)
    with pytest.raises(ValueError, match="long_axis_mm"):
        TruthFinding(
            kind="vessel",
            center_lps_mm=(0, 0, 0),
            slice_index=0,
            diameter_mm=1,
            hu=1,
            long_axis_mm=3,
        )
    with pytest.raises(ValueError, match="hu"):
        TruthFinding(kind="vessel", center_lps_mm=(0, 0, 0), slice_index=0, diameter_mm=1)
    with pytest.raises(ValueError, match="center_lps_mm"):
        TruthFinding(kind="vessel", center_lps_mm=(0, 0), slice_index=0, diameter_mm=1, hu=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="slice_index"):
        TruthFinding(kind="vessel", center_lps_mm=(0, 0, 0), slice_index=-1, diameter_mm=1, hu=1)


def test_phantom_checks_its_arrays(phantoms: list[Phantom]) -> None:
    from dataclasses import replace

    phantom = phantoms[0]
    with pytest.raises(ValueError, match="int16"):
        replace(phantom, hu=phantom.hu.astype(np.float32))
    with pytest.raises(ValueError, match="sop_instance_uids"):
        replace(phantom, sop_instance_uids=phantom.sop_instance_uids[1:])
    with pytest.raises(ValueError, match="patient_id"):
        replace(phantom, patient_id="")


# -- generation: determinism and the spec's ranges -----------------------------------------------


def test_same_seed_same_phantom_and_different_seed_differs(phantoms: list[Phantom]) -> None:
    again = generate_phantom(3)
    first = phantoms[3]
    np.testing.assert_array_equal(again.hu, first.hu)
    assert again.truth_json() == first.truth_json()
    assert again.geometry == first.geometry
    other = phantoms[4]
    assert other.truth_json()["findings"] != first.truth_json()["findings"]
    assert other.study_instance_uid != first.study_instance_uid
    assert other.hu.shape != first.hu.shape or not np.array_equal(other.hu, first.hu)


def test_bad_seed_is_refused() -> None:
    with pytest.raises(ValueError, match="seed"):
        generate_phantom(-1)


def test_every_sampled_quantity_is_within_the_spec(phantoms: list[Phantom]) -> None:
    seen_spacings = set()
    for phantom in phantoms:
        slices, rows, cols = phantom.shape
        g = phantom.geometry
        assert phantom.hu.dtype == np.int16
        assert rows == cols and 224 <= rows <= 288
        assert 20 <= slices <= 60
        assert g.row_spacing == g.column_spacing and 0.6 <= g.row_spacing <= 1.0
        assert g.slice_spacing in SPEC.slice_spacings_mm
        seen_spacings.add(g.slice_spacing)
        assert (g.row_direction, g.column_direction, g.slice_direction) == (
            (1.0, 0.0, 0.0),
            (0.0, 1.0, 0.0),
            (0.0, 0.0, 1.0),
        )
        fov = rows * g.row_spacing
        body = phantom.body
        centre = g.index_to_lps(((slices - 1) / 2, (rows - 1) / 2, (cols - 1) / 2))
        np.testing.assert_allclose(body.center_lps_mm, centre[:2], atol=MM)
        for semi in body.semi_axes_mm:
            assert 0.30 * fov <= semi <= 0.45 * fov
        assert 5.0 <= body.fat_thickness_mm <= 20.0
        assert 30.0 <= body.soft_tissue_hu <= 60.0
        assert 8.0 <= body.noise_sd_hu <= 25.0
        assert (body.air_hu, body.fat_hu) == (-1000.0, -100.0)
        found = lesions(phantom)
        assert 1 <= len(found) <= 3
        assert len(vessels(phantom)) <= 1
        z_first, z_last = g.origin[2], g.origin[2] + (slices - 1) * g.slice_spacing
        for lesion in found:
            assert lesion.long_axis_mm and lesion.short_axis_mm and lesion.cc_extent_mm
            assert 8.0 <= lesion.long_axis_mm <= 60.0
            assert 0.4 <= lesion.short_axis_mm / lesion.long_axis_mm <= 1.0
            assert 0.5 <= lesion.cc_extent_mm / lesion.long_axis_mm <= 1.0
            assert lesion.contrast_hu is not None and 40.0 <= abs(lesion.contrast_hu) <= 120.0
            assert lesion.hu == pytest.approx(body.soft_tissue_hu + lesion.contrast_hu)
            assert lesion.rotation_deg is not None and 0.0 <= lesion.rotation_deg < 180.0
            outline = lesion_outline(lesion)
            # Fully inside soft tissue: at least the fat rim (>= 5 mm) from the body outline.
            depth = body_depth(phantom, outline[:, 0], outline[:, 1])
            assert depth.min() >= max(5.0, body.fat_thickness_mm) - 0.05
            cz, half_cc = lesion.center_lps_mm[2], lesion.cc_extent_mm / 2
            assert z_first - MM <= cz - half_cc and cz + half_cc <= z_last + MM
            index = g.lps_to_index(lesion.center_lps_mm)
            assert lesion.slice_index == round(float(index[0]))
            for vessel in vessels(phantom):
                assert vessel.diameter_mm is not None
                vx, vy = vessel.center_lps_mm[:2]
                gap = np.hypot(outline[:, 0] - vx, outline[:, 1] - vy).min()
                assert gap - vessel.diameter_mm / 2 >= 3.0 - 0.05
        for i, one in enumerate(found):
            for two in found[i + 1 :]:
                s1, s2 = lesion_surface(one), lesion_surface(two)
                assert np.all(normalised_radius(one, s2) > 1) and np.all(
                    normalised_radius(two, s1) > 1
                )
                gap = np.sqrt(((s1[:, None, :] - s2[None, :, :]) ** 2).sum(-1)).min()
                assert gap >= 3.0 - 0.5  # surface sampling is ~1 mm coarse
        for vessel in vessels(phantom):
            assert vessel.diameter_mm is not None and vessel.hu is not None
            assert 15.0 <= vessel.diameter_mm <= 45.0
            assert 150.0 <= vessel.hu <= 300.0
            depth = body_depth(
                phantom, np.array([vessel.center_lps_mm[0]]), np.array([vessel.center_lps_mm[1]])
            )
            assert depth[0] - vessel.diameter_mm / 2 >= body.fat_thickness_mm - 0.01
            assert vessel.slice_index == (slices - 1) // 2
            assert vessel.center_lps_mm[2] == pytest.approx(
                g.index_to_lps((vessel.slice_index, 0, 0))[2]
            )
        for uid in (
            phantom.study_instance_uid,
            phantom.series_instance_uid,
            *phantom.sop_instance_uids,
        ):
            assert UID(uid).is_valid and len(uid) <= 64
        assert len(set(phantom.sop_instance_uids)) == slices
        assert phantom.patient_id == f"PHANTOM-{phantom.seed}"
    assert len(seen_spacings) >= 3


def test_vessel_in_about_70_percent_and_lesion_counts_all_occur() -> None:
    from ingestion.phantoms.layout import sample_layout

    layouts = [sample_layout(np.random.default_rng(seed), SPEC) for seed in range(150)]
    share = sum(layout.vessel is not None for layout in layouts) / len(layouts)
    assert 0.6 <= share <= 0.8
    assert {len(layout.lesions) for layout in layouts} == {1, 2, 3}


def test_body_air_and_noise(phantoms: list[Phantom]) -> None:
    phantom = phantoms[0]
    # Corners are far outside the body: exactly air, no noise.
    assert np.all(phantom.hu[:, :5, :5] == -1000)
    # Noise inside the body: a pure fat patch has the spec's SD.
    body = phantom.body
    g = phantom.geometry
    a = body.semi_axes_mm[0]
    x = body.center_lps_mm[0] + a - body.fat_thickness_mm / 2  # middle of the fat rim on +x
    index = np.rint(g.lps_to_index((x, body.center_lps_mm[1], g.origin[2]))).astype(int)
    patch = phantom.hu[:, index[1] - 1 : index[1] + 2, index[2]].astype(float)
    assert abs(patch.mean() - body.fat_hu) < 4 * body.noise_sd_hu / math.sqrt(patch.size) + 1
    assert patch.std() == pytest.approx(body.noise_sd_hu, rel=0.3)


# -- partial volume ------------------------------------------------------------------------------


def test_boundary_voxels_take_intermediate_values() -> None:
    phantom = generate_phantom(5, NOISELESS)
    body = phantom.body
    middle = phantom.hu[phantom.shape[0] // 2]
    between_air_and_fat = (middle > -999) & (middle < -101)
    # About one mixed pixel per pixel of outline length.
    a, b = body.semi_axes_mm
    perimeter_px = (
        math.pi
        * (3 * (a + b) - math.sqrt((3 * a + b) * (a + 3 * b)))
        / phantom.geometry.row_spacing
    )
    assert 0.5 * perimeter_px < between_air_and_fat.sum() < 2.5 * perimeter_px
    lesion = max(lesions(phantom), key=lambda f: f.long_axis_mm or 0.0)
    assert lesion.hu is not None
    plane = phantom.hu[lesion.slice_index].astype(float)
    lo, hi = sorted((body.soft_tissue_hu, lesion.hu))
    assert np.sum((plane > lo + 2) & (plane < hi - 2)) > 10


def test_outline_area_is_exact_in_a_noiseless_slice() -> None:
    spec = PhantomSpec(noise_sd_hu=(0.0, 0.0), lesion_count=(0, 0), vessel_probability=0.0)
    phantom = generate_phantom(11, spec)
    body = phantom.body
    plane = phantom.hu[0].astype(float)
    pixel_area = phantom.geometry.row_spacing**2
    a, b, t = *body.semi_axes_mm, body.fat_thickness_mm
    # Perimeter of the ellipse by quadrature; area of the soft tissue by Steiner's formula (exact
    # here: the ellipse's smallest radius of curvature exceeds the fat thickness).
    theta = np.linspace(0, 2 * np.pi, 200001)
    perimeter = np.trapezoid(np.hypot(a * np.sin(theta), b * np.cos(theta)), theta)
    area_body = math.pi * a * b
    area_soft = area_body - perimeter * t + math.pi * t * t
    expected = (body.fat_hu - body.air_hu) * area_body + (
        body.soft_tissue_hu - body.fat_hu
    ) * area_soft
    got = (plane - body.air_hu).sum() * pixel_area
    assert got == pytest.approx(expected, rel=2e-4)


def test_lesion_volume_is_exact_without_noise() -> None:
    # Contrast ranges of one value draw the same random numbers, so the layouts are identical.
    flat = PhantomSpec(noise_sd_hu=(0.0, 0.0), lesion_count=(1, 1), lesion_contrast_hu=(0.0, 0.0))
    bright = PhantomSpec(
        noise_sd_hu=(0.0, 0.0), lesion_count=(1, 1), lesion_contrast_hu=(100.0, 100.0)
    )
    without, with_lesion = generate_phantom(8, flat), generate_phantom(8, bright)
    (lesion,) = lesions(with_lesion)
    assert lesion.long_axis_mm and lesion.short_axis_mm and lesion.cc_extent_mm
    assert lesion.center_lps_mm == lesions(without)[0].center_lps_mm
    diff = with_lesion.hu.astype(float) - without.hu.astype(float)
    voxel = float(np.prod(with_lesion.geometry.spacing))
    volume = math.pi / 6 * lesion.long_axis_mm * lesion.short_axis_mm * lesion.cc_extent_mm
    assert abs(diff.sum()) * voxel / 100.0 == pytest.approx(volume, rel=5e-3, abs=1.0)


def test_large_lesion_mean_is_tissue_plus_contrast(phantoms: list[Phantom]) -> None:
    checked = 0
    for phantom in phantoms:
        for lesion in lesions(phantom):
            assert lesion.hu is not None and lesion.long_axis_mm is not None
            if lesion.long_axis_mm < 30:
                continue
            core = voxel_radius(phantom, lesion) < 0.6
            values = phantom.hu[core].astype(float)
            assert values.size > 100
            tolerance = 4 * phantom.body.noise_sd_hu / math.sqrt(values.size) + 0.5
            assert abs(values.mean() - lesion.hu) < tolerance
            checked += 1
        if checked >= 3:
            break
    assert checked >= 3


# -- truth geometry ------------------------------------------------------------------------------


def test_voxel_at_the_true_centre_has_the_finding_hu(phantoms: list[Phantom]) -> None:
    checked = 0
    for phantom in phantoms:
        g = phantom.geometry
        sd = phantom.body.noise_sd_hu
        half = np.array(g.spacing) / 2
        corners = np.array([(i, j, k) for i in (-1, 1) for j in (-1, 1) for k in (-1, 1)]) * half
        for finding in phantom.findings:
            index = tuple(int(i) for i in np.rint(g.lps_to_index(finding.center_lps_mm)))
            assert index[0] == finding.slice_index
            centre = g.index_to_lps(index)
            if finding.kind == "lesion" and np.any(
                normalised_radius(finding, centre + corners) > 1
            ):
                continue  # the centre voxel is partly outside (small lesion, thick slices)
            assert finding.hu is not None
            assert abs(float(phantom.hu[index]) - finding.hu) <= 5 * sd + 1
            checked += 1
    assert checked >= 20


# -- writing and reading back --------------------------------------------------------------------


def test_dicom_round_trip_is_exact(tmp_path: Path, phantoms: list[Phantom]) -> None:
    phantom = phantoms[2]
    paths = write_dicom(phantom, tmp_path / "dicom")
    assert len(paths) == phantom.shape[0]
    volume = loaded_dicom(tmp_path / "dicom")
    np.testing.assert_array_equal(volume.voxels, phantom.hu.astype(np.float32))
    assert_same_geometry(volume.geometry, phantom.geometry)
    ids = volume.identifiers
    assert ids.study_instance_uid == phantom.study_instance_uid
    assert ids.series_instance_uid == phantom.series_instance_uid
    assert ids.sop_instance_uids == phantom.sop_instance_uids
    assert ids.patient_id == phantom.patient_id
    assert volume.warnings == ()


def test_dicom_header(tmp_path: Path, phantoms: list[Phantom]) -> None:
    phantom = phantoms[1]
    paths = write_dicom(phantom, tmp_path)
    raw = paths[0].read_bytes()
    assert raw[:128] == b"\0" * 128 and raw[128:132] == b"DICM"
    ds = pydicom.dcmread(paths[0])
    assert ds.file_meta.TransferSyntaxUID == ExplicitVRLittleEndian
    assert (
        ds.file_meta.MediaStorageSOPInstanceUID == ds.SOPInstanceUID == phantom.sop_instance_uids[0]
    )
    assert ds.SOPClassUID == CTImageStorage and ds.Modality == "CT"
    assert list(ds.ImageType) == ["ORIGINAL", "PRIMARY", "AXIAL"]
    assert (ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation) == (16, 16, 15, 0)
    assert (float(ds.RescaleIntercept), float(ds.RescaleSlope)) == (-1024.0, 1.0)
    assert [float(v) for v in ds.ImageOrientationPatient] == [1, 0, 0, 0, 1, 0]
    assert [float(v) for v in ds.PixelSpacing] == [phantom.geometry.row_spacing] * 2
    assert float(ds.SliceThickness) == phantom.geometry.slice_spacing
    np.testing.assert_allclose([float(v) for v in ds.ImagePositionPatient], phantom.geometry.origin)
    assert ds.InstanceNumber == 1
    assert ds.PatientID == phantom.patient_id and str(ds.PatientName)
    assert re.fullmatch(r"\d{8}", ds.StudyDate) and ds.SeriesDescription
    np.testing.assert_array_equal(ds.pixel_array.astype(int) - 1024, phantom.hu[0])


def test_file_names_carry_no_order(tmp_path: Path, phantoms: list[Phantom]) -> None:
    phantom = phantoms[0]
    paths = write_dicom(phantom, tmp_path)
    assert all(re.fullmatch(r"[0-9a-f]{16}\.dcm", p.name) for p in paths)
    by_name = sorted(paths, key=lambda p: p.name)
    instances = [int(pydicom.dcmread(p, stop_before_pixels=True).InstanceNumber) for p in by_name]
    n = phantom.shape[0]
    assert instances != list(range(1, n + 1)) and instances != list(range(n, 0, -1))
    assert sorted(instances) == list(range(1, n + 1))
    again = write_dicom(phantom, tmp_path / "again")
    assert [p.name for p in again] == [p.name for p in paths]  # deterministic


def test_nifti_matches_the_dicom_load(tmp_path: Path, phantoms: list[Phantom]) -> None:
    phantom = phantoms[6]
    write_dicom(phantom, tmp_path / "dicom")
    path = write_nifti(phantom, tmp_path / "image.nii.gz")
    from_dicom = loaded_dicom(tmp_path / "dicom")
    from_nifti = load_nifti(path)
    np.testing.assert_array_equal(from_nifti.voxels, phantom.hu.astype(np.float32))
    np.testing.assert_array_equal(from_nifti.voxels, from_dicom.voxels)
    assert_same_geometry(from_nifti.geometry, from_dicom.geometry)
    assert_same_geometry(from_nifti.geometry, phantom.geometry)
    assert from_nifti.warnings == ()
    img = nib.load(str(path))
    assert isinstance(img, nib.Nifti1Image)
    header = img.header
    assert isinstance(header, nib.Nifti1Header)
    assert int(header["sform_code"]) == 1 and int(header["qform_code"]) == 1
    assert header.get_data_dtype() == np.int16


def test_an_independent_reader_agrees(tmp_path: Path, phantoms: list[Phantom]) -> None:
    """ITK (through SimpleITK) reads both files to the same voxels and LPS geometry."""
    import SimpleITK as sitk  # a dev dependency: always installed with .[dev]

    phantom = phantoms[9]
    write_dicom(phantom, tmp_path / "dicom")
    write_nifti(phantom, tmp_path / "image.nii")
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(tmp_path / "dicom")))
    for image in (reader.Execute(), sitk.ReadImage(str(tmp_path / "image.nii"))):
        np.testing.assert_array_equal(sitk.GetArrayFromImage(image), phantom.hu)  # (z, y, x)
        np.testing.assert_allclose(image.GetOrigin(), phantom.geometry.origin, atol=MM)
        g = phantom.geometry
        np.testing.assert_allclose(
            image.GetSpacing(), (g.column_spacing, g.row_spacing, g.slice_spacing), atol=MM
        )
        np.testing.assert_allclose(image.GetDirection(), np.eye(3).ravel(), atol=1e-6)


def test_nifti_needs_a_nifti_name(tmp_path: Path, phantoms: list[Phantom]) -> None:
    with pytest.raises(ValueError, match=r"\.nii"):
        write_nifti(phantoms[0], tmp_path / "image.img")


# -- write_phantoms and the command line ---------------------------------------------------------


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_write_phantoms_layout_and_truth(tmp_path: Path) -> None:
    done: list[Path] = []
    out = tmp_path / "out"
    folders = write_phantoms(out, n=2, seed=5, nifti=True, on_study=done.append)
    assert folders == done == [out / "phantom_0000", out / "phantom_0001"]
    for index, folder in enumerate(folders):
        truth = json.loads((folder / "truth.json").read_text())
        phantom = generate_phantom(study_seed(5, index))
        assert truth["seed"] == phantom.seed == study_seed(5, index)
        assert truth["patient_id"] == f"PHANTOM-5-{index}"
        assert truth["run"] == {"seed": 5, "index": index}
        assert truth["files"] == {"dicom": "dicom", "nifti": "image.nii.gz"}
        assert truth["spec"] == SPEC.to_json()
        assert truth["study_instance_uid"] == phantom.study_instance_uid
        assert truth["geometry"]["shape"] == list(phantom.shape)
        assert truth["geometry"]["origin_lps_mm"] == list(phantom.geometry.origin)
        assert truth["geometry"]["spacing_mm"] == list(phantom.geometry.spacing)
        assert truth["findings"] == [f.to_json() for f in phantom.findings]
        assert {f["kind"] for f in truth["findings"]} <= {"lesion", "vessel"}
        for finding in truth["findings"]:
            assert len(finding["center_lps_mm"]) == 3
            keys = (
                {"long_axis_mm", "short_axis_mm"}
                if finding["kind"] == "lesion"
                else {"diameter_mm"}
            )
            assert keys <= finding.keys()
        assert len(list((folder / "dicom").glob("*.dcm"))) == phantom.shape[0]
        volume = loaded_dicom(folder / "dicom")
        assert volume.identifiers.patient_id == f"PHANTOM-5-{index}"
        np.testing.assert_array_equal(volume.voxels, phantom.hu)
        assert (folder / "image.nii.gz").is_file()
    # Same arguments, same bytes; study 0 does not depend on n.
    write_phantoms(tmp_path / "again", n=1, seed=5, nifti=True)
    assert digest(tmp_path / "again" / "phantom_0000") == digest(out / "phantom_0000")


def test_write_phantoms_refuses_a_used_folder(tmp_path: Path) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigurationError, match="not empty"):
        write_phantoms(tmp_path / "used", n=1, seed=0)
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigurationError, match="is a file"):
        write_phantoms(tmp_path / "file", n=1, seed=0)
    with pytest.raises(ConfigurationError, match="studies"):
        write_phantoms(tmp_path / "new", n=0, seed=0)
    with pytest.raises(ConfigurationError, match="seed"):
        write_phantoms(tmp_path / "new", n=1, seed=-3)
    (tmp_path / "empty").mkdir()
    assert len(write_phantoms(tmp_path / "empty", n=1, seed=0)) == 1


def test_cli_writes_studies(tmp_path: Path) -> None:
    out = tmp_path / "phantoms"
    result = CliRunner().invoke(app, ["phantoms", str(out), "--n", "2", "--seed", "3", "--nifti"])
    assert result.exit_code == 0, result.output
    studies = sorted(p for p in out.iterdir() if p.is_dir())
    assert [p.name for p in studies] == ["phantom_0000", "phantom_0001"]
    for study in studies:
        assert (study / "truth.json").is_file() and (study / "image.nii.gz").is_file()
        assert any((study / "dicom").glob("*.dcm"))
    assert "Wrote 2 studies" in result.stdout


def test_the_small_spec_stays_inside_the_spec_except_where_it_says() -> None:
    small, spec = PhantomSpec.small(), PhantomSpec()
    changed = {k for k, v in small.to_json().items() if spec.to_json()[k] != v}
    assert changed == {
        "matrix_size",
        "slice_spacings_mm",
        "slice_count",
        "lesion_long_axis_mm",
        "vessel_diameter_mm",
        "fat_thickness_mm",
    }
    phantom = generate_phantom(3, small)
    assert phantom.hu.shape[1:] == (128, 128) and 20 <= phantom.hu.shape[0] <= 24
