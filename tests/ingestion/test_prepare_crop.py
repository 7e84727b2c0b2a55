"""Crops resampled by MONAI (``ingestion.prepare.crop_volume``) equal the measurer's former crops.

``reference_resample`` below is the hand-written resampler that ``model/measurer/inputs/images.py``
used before issue 23 (torch ``grid_sample`` on an air-padded block), kept here only as the reference
the model's inputs are held to. ``exact`` is trilinear interpolation in float64 (scipy).

Both resamplers sample in float32, so their sample positions carry rounding of about 1e-5 voxel;
times the steepest HU step of a volume (bone to air, ~2000 HU per voxel on real CT) that is up
to ~0.02 HU. Measured here: MONAI's crops differ from the former ones by 0.013 HU at most (noisy
phantom), 0.003 HU on the real CT, and each is within 0.017 HU of the float64 truth: not bit for
bit, but 1/30,000 of a 400 HU window. The tolerance follows from that (:func:`tolerance`),
never less than ``FLOOR_HU``; a grid misplaced by half a voxel, or wrong padding, would be off
by tens to hundreds of HU.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import torch
import torch.nn.functional as F
from scipy import ndimage

from ingestion.geometry import Geometry
from ingestion.nifti import load_nifti
from ingestion.phantoms import PhantomSpec, generate_phantom
from ingestion.prepare import crop_volume
from ingestion.volume import Modality, Volume
from model.measurer.inputs.data import phantom_volume
from model.measurer.inputs.images import AIR_HU, crop_around

from tests.support.series import volume_from_array

REAL_CT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real-ct"
REAL_CT_IMAGE = REAL_CT / "ts_abdomen_dicom" / "image.nii.gz"

FLOOR_HU = 1e-3
"""Largest difference accepted between two float32 resamplers on any volume (HU)."""
POSITION_ROUNDING_VOXELS = 2e-5
"""Float32 rounding of a sample position (voxels) that each resampler may have: 2**-23 times
half a block of up to ~300 voxels. Tolerance: this times the steepest HU step, twice."""


# -- the references -------------------------------------------------------------------------
def _reference_block(
    voxels: npt.NDArray[np.float32], lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
) -> torch.Tensor:
    """Voxels ``lo..hi`` (inclusive, may reach one voxel outside) as a float32 tensor, air
    outside the volume (images.py before issue 23)."""
    shape = np.asarray(voxels.shape, dtype=np.int64)
    start, stop = np.maximum(lo, 0), np.minimum(hi, shape - 1)
    block = np.full(tuple(hi - lo + 1), AIR_HU, dtype=np.float32)  # (Sb, Rb, Cb)
    if np.all(start <= stop):
        inner = tuple(slice(int(a), int(b) + 1) for a, b in zip(start, stop, strict=True))
        where = tuple(
            slice(int(a - o), int(b - o) + 1) for a, b, o in zip(start, stop, lo, strict=True)
        )
        block[where] = voxels[inner]
    return torch.from_numpy(block)


def reference_resample(volume: Volume, crop: Geometry, shape: tuple[int, int, int]) -> torch.Tensor:
    """The measurer's crop resampler before issue 23 (``images._resample``), verbatim."""
    to_index = np.linalg.solve(volume.affine, crop.affine)  # crop index -> volume index
    linear, offset = to_index[:3, :3], to_index[:3, 3]
    corners = np.array(list(itertools.product(*((0, n - 1) for n in shape))), dtype=np.float64)
    reach = corners @ linear.T + offset  # (8, 3) volume indices of the crop's corners
    n = np.asarray(volume.shape, dtype=np.int64)
    lo = np.clip(np.floor(reach.min(axis=0)), -1, n).astype(np.int64)
    hi = np.clip(np.floor(reach.max(axis=0)) + 1, -1, n).astype(np.int64)
    block = _reference_block(volume.voxels, lo, hi)  # (Sb, Rb, Cb)
    to_block = 2.0 / np.maximum(hi - lo, 1).astype(np.float64)  # block index -> normalised
    matrix = (to_block[:, None] * linear)[::-1]  # (3 xyz, 3 crop axes)
    shift = (to_block * (offset - lo) - 1.0)[::-1]  # (3,) xyz
    steps = [
        (np.arange(k, dtype=np.float64)[:, None] * matrix[:, axis]).astype(np.float32)
        for axis, k in enumerate(shape)
    ]  # (F, 3), (size, 3), (size, 3)
    grid = (
        torch.from_numpy(steps[0])[:, None, None]
        + torch.from_numpy(steps[1])[None, :, None]
        + torch.from_numpy(steps[2] + shift.astype(np.float32))[None, None, :]
    )  # (F, size, size, 3)
    sampled = F.grid_sample(
        block[None, None],  # (1, 1, Sb, Rb, Cb)
        grid[None],  # (1, F, size, size, 3)
        mode="bilinear",
        padding_mode="border",
        align_corners=True,
    )  # (1, 1, F, size, size)
    return sampled[0, 0]


def exact(volume: Volume, crop: Geometry, shape: tuple[int, int, int]) -> np.ndarray:
    """Trilinear interpolation in float64, air blended in within one voxel outside (scipy)."""
    to_index = np.linalg.solve(volume.affine, crop.affine)
    points = np.indices(shape, dtype=np.float64).reshape(3, -1)  # (3, N) crop indices
    where = to_index[:3, :3] @ points + to_index[:3, 3:]  # (3, N) volume indices
    values = ndimage.map_coordinates(
        volume.voxels.astype(np.float64), where, order=1, mode="grid-constant", cval=AIR_HU
    )
    return np.asarray(values.reshape(shape))


def steepest_step(volume: Volume) -> float:
    """Largest HU difference between neighbouring voxels, air beyond the volume included."""
    padded = np.pad(volume.voxels.astype(np.float64), 1, constant_values=AIR_HU)
    return max(float(np.abs(np.diff(padded, axis=axis)).max()) for axis in range(3))


def tolerance(volume: Volume) -> float:
    return max(FLOOR_HU, 2 * POSITION_ROUNDING_VOXELS * steepest_step(volume))


def axial_crop(
    centre: npt.ArrayLike, pixel_mm: float, size: int, frames: int, slice_mm: float
) -> Geometry:
    """The measurer's crop grid: LPS axes, centred on ``centre`` (as crop_around lays it)."""
    c = np.asarray(centre, dtype=np.float64)
    half = (size - 1) / 2 * pixel_mm
    return Geometry(
        origin=(c[0] - half, c[1] - half, c[2] - (frames - 1) / 2 * slice_mm),
        row_direction=(1.0, 0.0, 0.0),
        column_direction=(0.0, 1.0, 0.0),
        slice_direction=(0.0, 0.0, 1.0),
        spacing=(slice_mm, pixel_mm, pixel_mm),
    )


def assert_same_crops(
    volume: Volume, crops: list[tuple[Geometry, tuple[int, int, int]]]
) -> dict[str, float]:
    """crop_volume equals the former resampler (and both the float64 truth) on every crop."""
    tol = tolerance(volume)
    worst = {"reference": 0.0, "exact": 0.0}
    for geometry, shape in crops:
        new = crop_volume(volume, geometry, shape)
        assert tuple(new.shape) == shape and new.dtype == torch.float32
        old = reference_resample(volume, geometry, shape)
        truth = exact(volume, geometry, shape)
        worst["reference"] = max(worst["reference"], float((new - old).abs().max()))
        worst["exact"] = max(worst["exact"], float(np.abs(new.numpy() - truth).max()))
        assert float(np.abs(old.numpy() - truth).max()) <= tol  # the reference is as sound
    assert worst["reference"] <= tol, (worst, tol)
    assert worst["exact"] <= tol, (worst, tol)
    return worst


def grid_centres(volume: Volume, fractions: npt.ArrayLike) -> np.ndarray:
    """LPS points at fractional positions (0 = first voxel, 1 = last) of the volume's axes."""
    index = np.asarray(fractions, dtype=np.float64) * (np.asarray(volume.shape) - 1)
    return volume.geometry.index_to_lps(index)


# -- volumes --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def phantom_ct() -> Volume:
    """A noisy phantom (seed 3) as loading its DICOM series would give it."""
    return phantom_volume(generate_phantom(3, PhantomSpec()))


def rotation(a: float, b: float, c: float) -> np.ndarray:
    rx = np.array([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]])
    ry = np.array([[math.cos(b), 0, math.sin(b)], [0, 1, 0], [-math.sin(b), 0, math.cos(b)]])
    rz = np.array([[math.cos(c), -math.sin(c), 0], [math.sin(c), math.cos(c), 0], [0, 0, 1]])
    return np.asarray(rz @ ry @ rx, dtype=np.float64)


def field_volume(
    row: npt.ArrayLike, column: npt.ArrayLike, slice_: npt.ArrayLike, spacing: tuple[float, ...]
) -> Volume:
    """(24, 48, 40) voxels of a sharp-edged, asymmetric HU field (a bright ball in soft tissue,
    a dark slab, noise) on a grid of the given directions and spacing around the origin."""
    shape = (24, 48, 40)
    directions = np.array([slice_, column, row], dtype=np.float64).T  # columns: slice, row, col
    half = (np.asarray(shape) - 1) / 2 * np.asarray(spacing)
    geometry = Geometry(
        origin=tuple(-(directions @ half)),
        row_direction=tuple(float(v) for v in np.asarray(row)),  # type: ignore[arg-type]
        column_direction=tuple(float(v) for v in np.asarray(column)),  # type: ignore[arg-type]
        slice_direction=tuple(float(v) for v in np.asarray(slice_)),  # type: ignore[arg-type]
        spacing=spacing,  # type: ignore[arg-type]
    )
    lps = geometry.index_to_lps(np.indices(shape).reshape(3, -1).T).reshape(*shape, 3)
    hu = np.full(shape, 40.0)
    hu[np.linalg.norm(lps - [6.0, -4.0, 2.0], axis=-1) < 9.0] = 1200.0  # bone-bright ball
    hu[lps[..., 0] + 0.5 * lps[..., 2] < -12.0] = -850.0  # lung-dark slab
    hu += np.random.default_rng(7).normal(0.0, 15.0, shape)
    return Volume.in_memory(hu, geometry)


_OBLIQUE = rotation(0.3, 0.4, -0.5)
_TILT = math.radians(20.0)


# -- crop_volume equals the former crops ------------------------------------------------------
def test_phantom_crops_are_unchanged(phantom_ct: Volume) -> None:
    """Around each finding and at random points, three frames, several pixel sizes."""
    phantom = generate_phantom(3, PhantomSpec())
    rng = np.random.default_rng(23)
    crops = []
    for finding in phantom.findings:
        for pixel_mm in (0.5, 0.8, 1.3):
            crops.append((axial_crop(finding.center_lps_mm, pixel_mm, 112, 3, 1.7), (3, 112, 112)))
    for fractions in rng.random((6, 3)):
        crops.append(
            (axial_crop(grid_centres(phantom_ct, fractions), 0.9, 56, 2, 2.5), (2, 56, 56))
        )
    assert_same_crops(phantom_ct, crops)


@pytest.mark.parametrize(
    ("row", "column", "slice_"),
    [
        (tuple(_OBLIQUE[:, 0]), tuple(_OBLIQUE[:, 1]), tuple(_OBLIQUE[:, 2])),
        ((1.0, 0.0, 0.0), (0.0, math.cos(_TILT), math.sin(_TILT)), (0.0, 0.0, 1.0)),  # tilt
        ((0.0, 1.0, 0.0), (0.0, 0.0, -1.0), (-1.0, 0.0, 0.0)),  # sagittal
    ],
    ids=["oblique", "gantry_tilt", "sagittal"],
)
def test_oblique_volumes_give_unchanged_crops(
    row: tuple[float, ...], column: tuple[float, ...], slice_: tuple[float, ...]
) -> None:
    volume = field_volume(row, column, slice_, (1.5, 0.7, 0.7))
    crops = [
        (axial_crop(centre, 0.6, 28, 3, 1.1), (3, 28, 28))
        for centre in ([0.0, 0.0, 0.0], [6.0, -4.0, 2.0], [-10.0, 7.0, -5.0])
    ]
    # An oblique crop grid too (crop_volume takes any geometry, not only crop_around's).
    oblique = rotation(-0.2, 0.5, 0.9)
    crops.append(
        (
            Geometry(
                origin=(-8.0, -9.0, -6.0),
                row_direction=tuple(oblique[:, 0]),
                column_direction=tuple(oblique[:, 1]),
                slice_direction=tuple(oblique[:, 2]),
                spacing=(0.9, 0.55, 0.65),
            ),
            (4, 30, 26),
        )
    )
    assert_same_crops(volume, crops)


@pytest.mark.parametrize("spacing", [(5.0, 0.6, 0.6), (0.8, 0.5, 1.7), (2.5, 1.9, 0.4)])
def test_anisotropic_spacing_gives_unchanged_crops(spacing: tuple[float, float, float]) -> None:
    volume = field_volume((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), spacing)
    crops = [
        (axial_crop(centre, pixel_mm, 56, 3, slice_mm), (3, 56, 56))
        for centre in ([0.0, 0.0, 0.0], [6.0, -4.0, 2.0])
        for pixel_mm, slice_mm in ((0.35, 0.7), (1.1, 3.0))
    ]
    assert_same_crops(volume, crops)


@pytest.mark.parametrize("which", ["phantom", "tissue_to_the_edge"])
def test_crops_over_the_edge_are_air_padded_as_before(phantom_ct: Volume, which: str) -> None:
    """Crops centred on corners and edges of the volume, a fraction of a voxel beyond them, far
    outside, and frames reaching past the first and last slice; on the phantom (air around
    the body) and on a volume whose edges are tissue (so that padding shows)."""
    volume = (
        phantom_ct
        if which == "phantom"
        else field_volume((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (2.0, 0.8, 0.8))
    )
    last = np.asarray(volume.shape) - 1
    spacing = np.asarray(volume.geometry.spacing)
    crops = []
    for corner in itertools.product((0, 1), repeat=3):
        index = np.asarray(corner) * last
        crops.append(
            (axial_crop(volume.geometry.index_to_lps(index), 1.0, 56, 3, 2.0), (3, 56, 56))
        )
    for beyond in (0.25, 0.5, 0.75, 1.0, 1.5):  # voxels past the first slice and last column
        index = np.array([-beyond, last[1] / 2, last[2] + beyond])
        centre = volume.geometry.index_to_lps(index)
        crops.append((axial_crop(centre, 0.7, 28, 1, 1.0), (1, 28, 28)))
    far = volume.geometry.index_to_lps(last / 2) + np.array([0, 0, 10 * spacing[0] * last[0]])
    crops.append((axial_crop(far, 1.0, 28, 2, 1.0), (2, 28, 28)))
    assert_same_crops(volume, crops)

    outside = crop_volume(volume, axial_crop(far, 1.0, 28, 2, 1.0), (2, 28, 28))
    assert torch.equal(outside, torch.full((2, 28, 28), AIR_HU))


def test_a_single_slice_volume_gives_unchanged_crops() -> None:
    """One slice: the crop reaches one voxel along that axis (MONAI needs two to normalise)."""
    rng = np.random.default_rng(5)
    geometry = Geometry(
        origin=(-30.0, -30.0, 12.0),
        row_direction=(1.0, 0.0, 0.0),
        column_direction=(0.0, 1.0, 0.0),
        slice_direction=(0.0, 0.0, 1.0),
        spacing=(3.0, 0.8, 0.8),
    )
    volume = volume_from_array(rng.normal(0.0, 300.0, (1, 76, 76)), geometry)
    crops = [
        (axial_crop((x, y, z), 0.6, 28, frames, 0.9), (frames, 28, 28))
        for x, y in ((0.0, 0.0), (28.0, -29.0))
        for z, frames in ((12.0, 1), (12.4, 1), (12.0, 3), (11.0, 2))
    ]
    assert_same_crops(volume, crops)


@pytest.mark.skipif(
    not REAL_CT_IMAGE.is_file(), reason=f"shared real CT data not found at {REAL_CT_IMAGE}"
)
def test_real_ct_crops_are_unchanged() -> None:
    """The abdominal CT (NIfTI, loaded as RADCALIPER_NIFTI_MODALITY=CT would): crops on the
    aorta's truth centre, at random points and over the volume's edges."""
    volume = load_nifti(REAL_CT_IMAGE, Modality.CT)
    truth = json.loads((REAL_CT_IMAGE.parent / "truth.json").read_text(encoding="utf-8"))
    centres = [np.asarray(v["center_lps_mm"]) for v in truth["vessels"]]
    assert centres  # the aorta at least
    rng = np.random.default_rng(11)
    centres += [grid_centres(volume, f) for f in rng.random((8, 3))]
    centres += [grid_centres(volume, f) for f in ((0, 0, 0), (1, 1, 1), (0.5, 0, 1), (1, 0.5, 0))]
    crops = [(axial_crop(c, 0.8, 112, 3, 2.0), (3, 112, 112)) for c in centres]
    worst = assert_same_crops(volume, crops)
    assert worst["reference"] > 0.0  # float32 rounding differs: the comparison is not vacuous


# -- crop_volume on its own ---------------------------------------------------------------------
def test_a_grid_on_the_voxels_returns_them(phantom_ct: Volume) -> None:
    """The volume's own grid (any sub-block) is returned as it is, up to float32 rounding."""
    start = np.array([3, 40, 17])
    geometry = Geometry.from_affine(
        phantom_ct.affine @ np.block([[np.eye(3), start[:, None]], [np.zeros((1, 3)), 1.0]])
    )
    out = crop_volume(phantom_ct, geometry, (4, 30, 20))
    expected = phantom_ct.voxels[3:7, 40:70, 17:37]
    np.testing.assert_allclose(out.numpy(), expected, rtol=0.0, atol=1e-3)


def test_pad_value_fills_outside(phantom_ct: Volume) -> None:
    """Crop points more than one voxel beyond the volume are ``pad_value``; those inside it do
    not depend on it."""
    geometry = axial_crop(phantom_ct.geometry.index_to_lps((0, 0, 0)), 1.0, 28, 1, 1.0)
    air = crop_volume(phantom_ct, geometry, (1, 28, 28))
    padded = crop_volume(phantom_ct, geometry, (1, 28, 28), pad_value=-2048.0)
    points = geometry.index_to_lps(np.indices((1, 28, 28)).reshape(3, -1).T)
    index = phantom_ct.geometry.lps_to_index(points).reshape(1, 28, 28, 3)
    last = np.asarray(phantom_ct.shape) - 1
    beyond = torch.from_numpy(np.any((index < -1) | (index > last + 1), axis=-1))
    inside = torch.from_numpy(np.all((index >= 0) & (index <= last), axis=-1))
    assert beyond.any() and inside.any()
    assert torch.all(padded[beyond] == -2048.0) and torch.all(air[beyond] == AIR_HU)
    torch.testing.assert_close(padded[inside], air[inside], rtol=0.0, atol=1e-3)


@pytest.mark.parametrize(
    ("shape", "pad_value", "match"),
    [
        ((1, 28), AIR_HU, r"shape must be three integers .*got \(1, 28\)"),
        ((1, 0, 28), AIR_HU, r"shape must be three integers >= 1 .*got \(1, 0, 28\)"),
        ((1, 2.5, 28), AIR_HU, r"shape must be three integers >= 1 .*got \(1, 2.5, 28\)"),
        ((True, 28, 28), AIR_HU, r"shape must be three integers >= 1"),
        ("abc", AIR_HU, "shape must be three integers"),
        ((1, 28, 28), math.nan, "pad_value must be a finite number .*got nan"),
        ((1, 28, 28), "air", "pad_value must be a finite number .*got 'air'"),
    ],
)
def test_crop_volume_rejects(
    phantom_ct: Volume, shape: object, pad_value: object, match: str
) -> None:
    geometry = axial_crop((0.0, 0.0, 0.0), 1.0, 28, 1, 1.0)
    with pytest.raises(ValueError, match=match):
        crop_volume(phantom_ct, geometry, shape, pad_value=pad_value)  # type: ignore[arg-type]


# -- the model's inputs ---------------------------------------------------------------------------
def test_crop_around_gives_the_former_model_inputs(phantom_ct: Volume) -> None:
    """crop_around (windowed, several channels) equals the former crops windowed the same way."""
    phantom = generate_phantom(3, PhantomSpec())
    windows = ((40.0, 400.0), (-600.0, 1500.0), (400.0, 1800.0))
    for finding in phantom.findings:
        crop = crop_around(
            phantom_ct,
            finding.center_lps_mm,
            pixel_mm=0.7,
            size=112,
            window=windows,
            slices=3,
            slice_mm=1.5,
        )
        hu = reference_resample(phantom_ct, crop.geometry, (3, 112, 112))
        for channel, (level, width) in enumerate(windows):
            expected = ((hu - (level - width / 2)) / width).clamp(0.0, 1.0)
            torch.testing.assert_close(
                crop.image[:, channel], expected, rtol=0.0, atol=tolerance(phantom_ct) / width
            )
