"""Preparation: orientation, resampling, windows, pad/crop, slice selection, the way back to LPS."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from monai.data.meta_tensor import MetaTensor

import ingestion
from ingestion.errors import PreparationError
from ingestion.geometry import Geometry
from ingestion.prepare import (
    IMAGE_KEY,
    LPS_TO_RAS,
    LUNG_WINDOW,
    SOFT_TISSUE_WINDOW,
    SOURCE_AFFINE_KEY,
    PrepareConfig,
    PreparedVolume,
    SelectSlicesd,
    build_preparation,
    prepare_volume,
    resolve_slice_indices,
    select_slices,
    volume_to_dict,
)
from ingestion.volume import Volume

from tests.support.series import volume_from_array

AIR = -1000.0
SHAPE = (12, 64, 64)
SPACING = (3.0, 0.8, 0.8)
# The canonical prepared directions in LPS, as columns: slice -> +z, row -> +y, column -> +x.
CANONICAL = np.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def rotation(a: float, b: float, c: float) -> np.ndarray:
    rx = np.array([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]])
    ry = np.array([[math.cos(b), 0, math.sin(b)], [0, 1, 0], [-math.sin(b), 0, math.cos(b)]])
    rz = np.array([[math.cos(c), -math.sin(c), 0], [math.sin(c), math.cos(c), 0], [0, 0, 1]])
    return np.asarray(rz @ ry @ rx, dtype=np.float64)


_OBLIQUE = rotation(0.3, 0.4, -0.5)
_TILT = math.radians(20.0)
# name: (row_direction, column_direction, slice_direction, native prepared slice spacing)
ORIENTATIONS: dict[str, tuple[Sequence[float], Sequence[float], Sequence[float], float]] = {
    "axial": ((1, 0, 0), (0, 1, 0), (0, 0, 1), SPACING[0]),
    "axial_reversed_slices": ((1, 0, 0), (0, 1, 0), (0, 0, -1), SPACING[0]),
    "axial_flipped_in_plane": ((-1, 0, 0), (0, -1, 0), (0, 0, 1), SPACING[0]),
    "sagittal": ((0, 1, 0), (0, 0, -1), (-1, 0, 0), SPACING[1]),
    "coronal": ((1, 0, 0), (0, 0, -1), (0, 1, 0), SPACING[1]),
    "oblique": (tuple(_OBLIQUE[:, 0]), tuple(_OBLIQUE[:, 1]), tuple(_OBLIQUE[:, 2]), SPACING[0]),
    "gantry_tilt": ((1, 0, 0), (0, math.cos(_TILT), math.sin(_TILT)), (0, 0, 1), SPACING[0]),
}


def make_geometry(name: str, spacing: Sequence[float] = SPACING) -> Geometry:
    row, column, slice_, _ = ORIENTATIONS[name]
    return Geometry(
        origin=(12.0, -30.0, 45.0),
        row_direction=tuple(float(v) for v in row),  # type: ignore[arg-type]
        column_direction=tuple(float(v) for v in column),  # type: ignore[arg-type]
        slice_direction=tuple(float(v) for v in slice_),  # type: ignore[arg-type]
        spacing=tuple(float(v) for v in spacing),  # type: ignore[arg-type]
    )


def make_volume(
    geometry: Geometry,
    voxels: np.ndarray | None = None,
    *,
    shape: tuple[int, int, int] = SHAPE,
    spheres: Sequence[tuple[Sequence[float], float]] = (),
    radius_mm: float = 6.0,
    hu: float = 1000.0,
) -> Volume:
    """A CT volume of air (or ``voxels``) with a ``hu`` sphere at each (source index, radius)."""
    if voxels is None:
        voxels = np.full(shape, AIR, dtype=np.float32)
    voxels = np.asarray(voxels, dtype=np.float32).copy()
    if spheres:
        index = np.indices(voxels.shape).reshape(3, -1).T  # (N, 3)
        lps = geometry.index_to_lps(index).reshape(*voxels.shape, 3)
        for centre, r in spheres:
            centre_lps = geometry.index_to_lps(np.asarray(centre, dtype=float))
            voxels[np.linalg.norm(lps - centre_lps, axis=-1) <= r] = hu
    return volume_from_array(voxels, geometry)


def centre_of_mass(image: torch.Tensor) -> np.ndarray:
    """(slice, row, column) centre of mass of channel 0 of a (C, S, R, C) image."""
    weights = image[0].numpy().astype(np.float64)
    grids = np.indices(weights.shape)
    return np.array([(weights * g).sum() / weights.sum() for g in grids])


# -- orientation and the affine -----------------------------------------------------------------
SPHERE_INDEX = (5.0, 22.0, 40.0)  # off-centre in every source axis, so a flip would show


@pytest.mark.parametrize("name", sorted(ORIENTATIONS))
def test_canonical_orientation_and_affine(name: str) -> None:
    geometry = make_geometry(name)
    volume = make_volume(geometry, spheres=[(SPHERE_INDEX, 6.0)])
    prepared = prepare_volume(volume, PrepareConfig(pixel_mm=1.0, size=(96, 96)))

    native = ORIENTATIONS[name][3]
    spacing = np.linalg.norm(prepared.affine_lps[:3, :3], axis=0)
    np.testing.assert_allclose(spacing, [native, 1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(prepared.affine_lps[:3, :3] / spacing, CANONICAL, atol=1e-6)

    sphere_lps = geometry.index_to_lps(np.asarray(SPHERE_INDEX))
    expected = prepared.lps_to_index(sphere_lps)
    np.testing.assert_allclose(centre_of_mass(prepared.image), expected, atol=0.5)
    s, r, c = (int(v) for v in np.floor(expected + 0.5))
    assert prepared.image[0, s, r, c] > 0.5
    np.testing.assert_allclose(prepared.index_to_lps(expected), sphere_lps, atol=1e-6)


@pytest.mark.parametrize("name", ["axial", "axial_reversed_slices", "sagittal", "oblique"])
def test_array_axes_point_superior_posterior_left(name: str) -> None:
    """Without trusting the affine: moving a sphere in LPS moves it along the canonical axes."""
    geometry = make_geometry(name)
    a_index, b_index = (4.0, 20.0, 18.0), (7.0, 44.0, 40.0)
    config = PrepareConfig(pixel_mm=1.0, size=(96, 96))
    a = prepare_volume(make_volume(geometry, spheres=[(a_index, 6.0)]), config)
    b = prepare_volume(make_volume(geometry, spheres=[(b_index, 6.0)]), config)
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.affine_lps, b.affine_lps)

    moved_mm = (centre_of_mass(b.image) - centre_of_mass(a.image)) * np.asarray(
        a.geometry.spacing
    )  # (slice, row, column) in mm
    dx, dy, dz = geometry.index_to_lps(np.asarray(b_index)) - geometry.index_to_lps(
        np.asarray(a_index)
    )
    np.testing.assert_allclose(moved_mm, [dz, dy, dx], atol=0.5 * max(a.geometry.spacing))


def test_axis_aligned_volume_at_native_spacing_is_not_interpolated() -> None:
    geometry = make_geometry("axial")
    voxels = np.random.default_rng(0).uniform(-200, 300, SHAPE).astype(np.float32)
    volume = make_volume(geometry, voxels)
    prepared = prepare_volume(volume, PrepareConfig(pixel_mm=0.8, size=(64, 64)))
    expected = np.clip((voxels - (40 - 200)) / 400, 0, 1)
    np.testing.assert_allclose(prepared.image[0].numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(prepared.affine_lps, geometry.affine, atol=1e-9)
    assert prepared.source_slice_indices == tuple(range(SHAPE[0]))


def test_lps_space_metatensor_gives_the_same_result() -> None:
    """MONAI's own LPS convention (meta["space"] == "LPS") is honoured, not mistaken for RAS."""
    volume = make_volume(make_geometry("axial"), spheres=[(SPHERE_INDEX, 6.0)])
    config = PrepareConfig(pixel_mm=0.8, size=(64, 64))  # native: both grids are the source's
    via_ras = prepare_volume(volume, config)
    data = volume_to_dict(volume)
    data[IMAGE_KEY] = MetaTensor(
        data[IMAGE_KEY].as_tensor(),
        meta={"affine": torch.as_tensor(volume.affine), "space": "LPS", "original_channel_dim": 0},
    )
    via_lps = PreparedVolume.from_dict(build_preparation(config)(data), config)
    np.testing.assert_allclose(via_lps.affine_lps, via_ras.affine_lps, atol=1e-9)
    torch.testing.assert_close(via_lps.image, via_ras.image)


def test_index_lps_round_trip() -> None:
    volume = make_volume(make_geometry("oblique"))
    prepared = prepare_volume(volume, PrepareConfig(size=(32, 48)))
    points = np.random.default_rng(1).uniform(-100, 100, size=(50, 3))
    np.testing.assert_allclose(prepared.index_to_lps(prepared.lps_to_index(points)), points)


# -- spacing, shape, windows, pad/crop ----------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "shape", "spacing"),
    [
        (PrepareConfig(pixel_mm=1.0, size=(48, 80)), (1, 12, 48, 80), (3.0, 1.0, 1.0)),
        (
            PrepareConfig(pixel_mm=0.5, slice_mm=1.5, size=(40, 40)),
            (1, 23, 40, 40),
            (1.5, 0.5, 0.5),
        ),
        (
            PrepareConfig(slice_mm=6.0, size=(32, 32), windows=(SOFT_TISSUE_WINDOW, LUNG_WINDOW)),
            (2, 6, 32, 32),
            (6.0, 1.0, 1.0),
        ),
    ],
)
def test_output_shape_and_spacing(
    config: PrepareConfig, shape: tuple[int, ...], spacing: tuple[float, float, float]
) -> None:
    prepared = prepare_volume(make_volume(make_geometry("axial")), config)
    assert tuple(prepared.image.shape) == shape
    assert prepared.image.dtype == torch.float32
    np.testing.assert_allclose(prepared.geometry.spacing, spacing, atol=1e-6)
    assert len(prepared.source_slice_indices) == shape[1]


def test_window_maps_level_minus_and_plus_half_width_to_0_and_1() -> None:
    geometry = make_geometry("axial", spacing=(2.0, 1.0, 1.0))
    values = np.array([-1000.0, -160.0, 40.0, 240.0, 2000.0], dtype=np.float32)
    voxels = np.broadcast_to(values[:, None, None], (5, 16, 16))
    volume = make_volume(geometry, voxels)
    config = PrepareConfig(size=(16, 16), windows=(SOFT_TISSUE_WINDOW, LUNG_WINDOW))
    prepared = prepare_volume(volume, config)
    per_slice = prepared.image.mean(dim=(2, 3)).numpy()  # (C, S)
    np.testing.assert_allclose(per_slice[0], [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-6)
    lung = np.clip((values - (-600.0 - 750.0)) / 1500.0, 0.0, 1.0)
    np.testing.assert_allclose(per_slice[1], lung, atol=1e-6)
    assert float(prepared.image.min()) >= 0.0 and float(prepared.image.max()) <= 1.0


@pytest.mark.parametrize("in_plane", [(30, 50), (31, 51)])
def test_pad_or_crop_keeps_the_centre_and_pads_with_air(in_plane: tuple[int, int]) -> None:
    rows, columns = in_plane
    geometry = make_geometry("axial", spacing=(2.0, 1.0, 1.0))
    volume = make_volume(geometry, np.zeros((4, rows, columns), dtype=np.float32))  # water
    config = PrepareConfig(size=(40, 40), windows=(SOFT_TISSUE_WINDOW, LUNG_WINDOW))
    prepared = prepare_volume(volume, config)
    assert prepared.shape == (4, 40, 40)

    centre = prepared.lps_to_index(geometry.index_to_lps([1.5, (rows - 1) / 2, (columns - 1) / 2]))
    np.testing.assert_allclose(centre[1:], [19.5, 19.5], atol=0.5)
    # rows were padded (with air: 0 in every window), columns were cropped (no padding)
    pad_before = round(float(centre[1]) - (rows - 1) / 2)
    assert pad_before > 0
    assert torch.all(prepared.image[:, :, :pad_before, :] == 0)
    assert torch.all(prepared.image[:, :, pad_before + rows :, :] == 0)
    inside = prepared.image[:, :, pad_before : pad_before + rows, :]
    torch.testing.assert_close(inside[0], torch.full_like(inside[0], 0.4))  # 0 HU, soft tissue


def test_resampling_pads_with_air_not_water() -> None:
    volume = make_volume(make_geometry("oblique"), np.zeros(SHAPE, dtype=np.float32))  # water
    prepared = prepare_volume(volume, PrepareConfig(size=(96, 96)))
    image = prepared.image[0]
    assert float(image.max()) <= 0.4 + 1e-5
    assert float((image == 0).float().mean()) > 0.2  # outside the rotated volume: air


# -- slice selection and the way back to source slices ------------------------------------------
@pytest.mark.parametrize(
    ("config", "kept"),
    [
        (PrepareConfig(size=(64, 64), slices=(2, 4, 6)), (2, 4, 6)),
        (PrepareConfig(size=(64, 64), slices=(6, 4, 2)), (6, 4, 2)),
        (PrepareConfig(size=(64, 64), slices=(-1,)), (11,)),
        (PrepareConfig(size=(64, 64), slice_stride=5), (0, 5, 10)),
    ],
)
def test_slice_selection_keeps_the_affine_exact(
    config: PrepareConfig, kept: tuple[int, ...]
) -> None:
    geometry = make_geometry("axial")
    volume = make_volume(geometry, spheres=[((4.0, 30.0, 30.0), 4.0), ((6.0, 30.0, 30.0), 4.0)])
    full = prepare_volume(volume, PrepareConfig(size=(64, 64)))
    prepared = prepare_volume(volume, config)
    assert prepared.source_slice_indices == kept
    torch.testing.assert_close(prepared.image, full.image[:, list(kept)])
    for k, source in enumerate(kept):
        np.testing.assert_allclose(
            prepared.index_to_lps([k, 7.0, 9.0]), full.index_to_lps([source, 7.0, 9.0])
        )


def test_source_slice_indices_follow_reversed_slice_order() -> None:
    volume = make_volume(make_geometry("axial_reversed_slices"))
    prepared = prepare_volume(volume, PrepareConfig(size=(32, 32)))
    assert prepared.source_slice_indices == tuple(range(SHAPE[0] - 1, -1, -1))


def test_source_slice_indices_are_the_nearest_source_slices() -> None:
    geometry = make_geometry("axial")
    prepared = prepare_volume(make_volume(geometry), PrepareConfig(slice_mm=1.0, size=(32, 32)))
    indices = np.asarray(prepared.source_slice_indices)
    assert indices[0] == 0 and indices[-1] == SHAPE[0] - 1
    assert np.all(np.diff(indices) >= 0)
    centres = prepared.index_to_lps([[k, 15.5, 15.5] for k in range(prepared.shape[0])])
    source_z = geometry.index_to_lps(np.stack([indices, indices * 0, indices * 0], axis=1))[:, 2]
    assert np.all(np.abs(source_z - centres[:, 2]) <= SPACING[0] / 2 + 1e-6)


def test_select_slices_array_function() -> None:
    plain = torch.arange(2 * 5 * 2 * 2, dtype=torch.float32).reshape(2, 5, 2, 2)
    torch.testing.assert_close(select_slices(plain, [4, 1]), plain[:, [4, 1]])

    affine = torch.as_tensor(np.diag([2.0, 3.0, 4.0, 1.0]))
    meta = MetaTensor(plain, affine=affine)
    out = select_slices(meta, (1, 3))
    assert isinstance(out, MetaTensor)
    np.testing.assert_allclose(out.affine.numpy()[:, 0], [4.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(out.affine.numpy()[:, 3], [2.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(meta.affine.numpy(), affine.numpy())  # input untouched
    with pytest.raises(ValueError, match="evenly spaced"):
        select_slices(meta, (0, 1, 3))
    assert resolve_slice_indices(5, (-1, -3)) == (4, 2)
    assert resolve_slice_indices(5, None, 2) == (0, 2, 4)
    with pytest.raises(ValueError, match="out of range"):
        resolve_slice_indices(5, (5,))
    with pytest.raises(ValueError, match="twice"):
        resolve_slice_indices(5, (1, -4))
    with pytest.raises(ValueError, match="stride"):
        SelectSlicesd(keys=IMAGE_KEY, stride=0)
    with pytest.raises(ValueError, match=r"SelectSlicesd.*\(C, S, R, C\)"):
        SelectSlicesd(keys=IMAGE_KEY)({IMAGE_KEY: torch.zeros(3, 4, 4)})


# -- dictionaries: missing keys, no mutation, determinism, the augmentation slot ----------------
def test_dictionary_transforms_name_the_missing_key_and_transform() -> None:
    image = MetaTensor(torch.zeros(1, 3, 4, 4))
    with pytest.raises(KeyError, match=r"image.*SelectSlicesd"):
        SelectSlicesd(keys=IMAGE_KEY)({"img": image})

    with pytest.raises(RuntimeError) as info:  # MONAI's Compose wraps the KeyError
        build_preparation(PrepareConfig())({"img": image})
    assert isinstance(info.value.__cause__, KeyError)
    assert "image" in str(info.value.__cause__) and "EnsureChannelFirstd" in str(
        info.value.__cause__
    )

    data = volume_to_dict(make_volume(make_geometry("axial")))
    del data[SOURCE_AFFINE_KEY]
    with pytest.raises(KeyError, match=r"source_affine_lps.*PreparedVolume.from_dict"):
        PreparedVolume.from_dict(data, PrepareConfig())
    with pytest.raises(TypeError, match="MetaTensor"):
        PreparedVolume.from_dict({IMAGE_KEY: torch.zeros(1, 2, 3, 4)}, PrepareConfig())


def test_input_dictionary_and_volume_are_not_mutated() -> None:
    volume = make_volume(make_geometry("oblique"), spheres=[(SPHERE_INDEX, 6.0)])
    voxels_before = volume.voxels.copy()
    data = volume_to_dict(volume)
    image_before = data[IMAGE_KEY].as_tensor().clone()
    affine_before = data[IMAGE_KEY].affine.clone()
    meta_keys_before = set(data[IMAGE_KEY].meta)
    keys_before = set(data)

    config = PrepareConfig(size=(48, 48), windows=(SOFT_TISSUE_WINDOW, LUNG_WINDOW), slices=(1,))
    out = build_preparation(config)(data)
    assert out is not data and out[IMAGE_KEY] is not data[IMAGE_KEY]

    assert set(data) == keys_before
    torch.testing.assert_close(data[IMAGE_KEY].as_tensor(), image_before)
    torch.testing.assert_close(data[IMAGE_KEY].affine, affine_before)
    assert set(data[IMAGE_KEY].meta) == meta_keys_before
    assert len(data[IMAGE_KEY].applied_operations) == 0
    np.testing.assert_array_equal(volume.voxels, voxels_before)
    prepare_volume(volume, config)
    np.testing.assert_array_equal(volume.voxels, voxels_before)


def test_volume_to_dict() -> None:
    volume = make_volume(make_geometry("sagittal"))
    data = volume_to_dict(volume)
    image = data[IMAGE_KEY]
    assert isinstance(image, MetaTensor)
    assert tuple(image.shape) == (1, *SHAPE) and image.dtype == torch.float32
    np.testing.assert_allclose(image.affine.numpy(), LPS_TO_RAS @ volume.affine)
    assert image.meta["space"] == "RAS"
    np.testing.assert_allclose(data[SOURCE_AFFINE_KEY], volume.affine)
    assert not np.shares_memory(image.numpy(), volume.voxels)


def test_preparation_is_deterministic() -> None:
    volume = make_volume(make_geometry("gantry_tilt"), spheres=[(SPHERE_INDEX, 6.0)])
    config = PrepareConfig(pixel_mm=0.7, slice_mm=2.0, size=(64, 64))
    first, second = prepare_volume(volume, config), prepare_volume(volume, config)
    torch.testing.assert_close(first.image, second.image, rtol=0, atol=0)
    np.testing.assert_array_equal(first.affine_lps, second.affine_lps)


def test_augmentations_run_on_the_resampled_hu_image_before_selection() -> None:
    seen: list[tuple[tuple[int, ...], float]] = []

    def record(data: dict[Hashable, Any]) -> dict[Hashable, Any]:
        seen.append((tuple(data[IMAGE_KEY].shape), float(data[IMAGE_KEY].min())))
        return data

    config = PrepareConfig(size=(32, 32), slices=(0,))
    data = volume_to_dict(make_volume(make_geometry("axial")))
    out = build_preparation(config, augmentations=[record])(data)
    assert len(seen) == 1
    shape, minimum = seen[0]
    assert shape == (1, 12, 51, 51)  # 64 rows of 0.8 mm at 1 mm: 51 rows (and columns)
    assert minimum == pytest.approx(AIR, abs=1e-3)  # still HU, not yet windowed
    assert tuple(out[IMAGE_KEY].shape) == (1, 1, 32, 32)


# -- errors ---------------------------------------------------------------------------------------
def test_single_axial_slice_is_prepared() -> None:
    geometry = make_geometry("axial")
    volume = make_volume(geometry, shape=(1, 64, 64), spheres=[((0.0, 20.0, 30.0), 5.0)])
    prepared = prepare_volume(volume, PrepareConfig(size=(64, 64)))
    assert prepared.shape == (1, 64, 64)
    expected = prepared.lps_to_index(geometry.index_to_lps([0.0, 20.0, 30.0]))
    np.testing.assert_allclose(centre_of_mass(prepared.image), expected, atol=0.5)


@pytest.mark.parametrize(
    ("shape", "orientation", "config", "message"),
    [
        ((1, 64, 64), "axial", PrepareConfig(slice_mm=2.0), "single slice"),
        ((1, 64, 64), "sagittal", PrepareConfig(), "single sagittal slice"),
        ((1, 64, 64), "gantry_tilt", PrepareConfig(), "cannot be reformatted"),
        (SHAPE, "axial", PrepareConfig(slices=(12,)), "out of range"),
        (SHAPE, "axial", PrepareConfig(slices=(0, 5, -1)), "unevenly spaced"),
    ],
)
def test_unusable_volumes_raise_preparation_error(
    shape: tuple[int, int, int], orientation: str, config: PrepareConfig, message: str
) -> None:
    volume = make_volume(make_geometry(orientation), shape=shape)
    with pytest.raises(PreparationError, match=message):
        prepare_volume(volume, config)


def test_non_finite_voxels_raise_preparation_error() -> None:
    voxels = np.full(SHAPE, AIR, dtype=np.float32)
    voxels[3, 4, 5] = np.nan
    with pytest.raises(PreparationError, match="NaN"):
        prepare_volume(make_volume(make_geometry("axial"), voxels), PrepareConfig())


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"pixel_mm": 0.0}, "pixel_mm"),
        ({"pixel_mm": True}, "pixel_mm"),
        ({"pixel_mm": math.nan}, "pixel_mm"),
        ({"slice_mm": -1.0}, "slice_mm"),
        ({"size": (0, 10)}, "size"),
        ({"size": (10,)}, "size"),
        ({"size": (10.5, 10)}, "size"),
        ({"window": (40.0, 0.0)}, "window"),
        ({"window": (40.0,)}, "window"),
        ({"windows": ()}, "windows"),
        ({"windows": ((40.0, -1.0),)}, r"windows\[0\]"),
        ({"windows": (LUNG_WINDOW,), "window": (0.0, 100.0)}, "windows"),
        ({"slices": ()}, "slices"),
        ({"slices": (1, 1)}, "slices"),
        ({"slices": (1, 2, 4)}, "slices"),
        ({"slices": (1,), "slice_stride": 2}, "slice_stride"),
        ({"slice_stride": 0}, "slice_stride"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        PrepareConfig(**kwargs)


def test_config_normalises_and_derives() -> None:
    config = PrepareConfig(
        pixel_mm=1,
        size=[128, 96],  # type: ignore[arg-type]
        windows=[SOFT_TISSUE_WINDOW, LUNG_WINDOW],  # type: ignore[arg-type]
        slices=[0, 2],
    )
    assert config.pixel_mm == 1.0 and config.size == (128, 96) and config.slices == (0, 2)
    assert config.channels == 2
    assert config.pad_value == -1350.0  # the lung window's minimum: air is 0 in both channels
    same = PrepareConfig(
        pixel_mm=1.0, size=(128, 96), windows=(SOFT_TISSUE_WINDOW, LUNG_WINDOW), slices=(0, 2)
    )
    assert config == same and hash(config) == hash(same)


def test_prepared_volume_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="channels"):
        PreparedVolume(
            image=torch.zeros(2, 3, 4, 4),
            affine_lps=np.eye(4),
            source_slice_indices=(0, 1, 2),
            config=PrepareConfig(),
        )
    with pytest.raises(ValueError, match="source_slice_indices"):
        PreparedVolume(
            image=torch.zeros(1, 3, 4, 4),
            affine_lps=np.eye(4),
            source_slice_indices=(0, 1),
            config=PrepareConfig(),
        )


# -- package surface ------------------------------------------------------------------------------
def test_package_exports_prepare_lazily() -> None:
    assert ingestion.prepare_volume is prepare_volume
    code = (
        "import sys, ingestion; ingestion.Volume; "
        "assert 'torch' not in sys.modules and 'monai' not in sys.modules, 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
