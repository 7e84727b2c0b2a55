"""Model image inputs: patches equal to transformers' processor, find images, measure crops."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from ingestion.geometry import Geometry
from ingestion.phantoms import Phantom, PhantomSpec, TruthFinding, generate_phantom
from ingestion.prepare import PrepareConfig, PreparedVolume, prepare_volume
from ingestion.volume import Volume
from model.backbone import tiny_qwen2_5_vl_kwargs
from model.measurer.inputs.images import (
    AIR_HU,
    CHANNELS,
    IMAGE_MEAN,
    IMAGE_STD,
    MERGE,
    PATCH,
    SIDE_MULTIPLE,
    TEMPORAL_PATCH,
    Crop,
    contrast_channels,
    crop_around,
    find_images,
    find_slice_indices,
    image_token_count,
    patchify,
    patchify_frames,
    two_window_channels,
)

from tests.support.series import volume_from_array

SOFT = (40.0, 400.0)
LUNG = (-600.0, 1500.0)
BONE = (400.0, 1800.0)
# The canonical crop directions in LPS, as columns: frame -> +z, row -> +y, column -> +x.
CANONICAL = np.array([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
PROPERTY = settings(max_examples=40, deadline=None)


def windowed(hu: float | np.ndarray, window: tuple[float, float]) -> np.ndarray:
    level, width = window
    return np.clip((np.asarray(hu, dtype=np.float64) - (level - width / 2)) / width, 0.0, 1.0)


def make_volume(voxels: np.ndarray, geometry: Geometry) -> Volume:
    return volume_from_array(voxels, geometry)


# -- patches ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def processor() -> Qwen2VLImageProcessorPil:
    """The stock processor (its own normalisation), without resizing or rescaling."""
    return Qwen2VLImageProcessorPil(
        do_resize=False,
        do_rescale=False,
        patch_size=PATCH,
        temporal_patch_size=TEMPORAL_PATCH,
        merge_size=MERGE,
    )


def processed(
    processor: Qwen2VLImageProcessorPil, images: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The processor's (pixel_values, image_grid_thw) for (N, C, H, W) images; one channel is
    given as its RGB conversion (the grey value in all three channels)."""
    n, _, h, w = images.shape
    rgb = images.expand(n, 3, h, w)
    out = processor(
        [image.numpy() for image in rgb], return_tensors="pt", input_data_format="channels_first"
    )
    return out["pixel_values"], out["image_grid_thw"]


def test_normalisation_is_the_qwen2_vl_processors(processor: Qwen2VLImageProcessorPil) -> None:
    assert IMAGE_MEAN == tuple(OPENAI_CLIP_MEAN) == tuple(processor.image_mean)
    assert IMAGE_STD == tuple(OPENAI_CLIP_STD) == tuple(processor.image_std)
    assert processor.do_normalize
    assert SIDE_MULTIPLE == 28


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("size", [(28, 56), (112, 112), (140, 84)])
def test_patchify_equals_the_processor(
    processor: Qwen2VLImageProcessorPil, size: tuple[int, int], n: int, channels: int
) -> None:
    gen = torch.Generator().manual_seed(size[0] * 10 + n + channels)
    images = torch.rand(n, channels, *size, generator=gen)
    pixel_values, grid = patchify(images)
    expected_values, expected_grid = processed(processor, images)

    assert pixel_values.dtype == torch.float32 and grid.dtype == torch.int64
    torch.testing.assert_close(pixel_values, expected_values.float(), rtol=0.0, atol=1e-6)
    assert torch.equal(grid, expected_grid)
    assert grid.tolist() == [[1, size[0] // PATCH, size[1] // PATCH]] * n


def video_processor_patchify(videos: torch.Tensor) -> tuple[torch.Tensor, list[list[int]]]:
    """Qwen2VLVideoProcessor.patchify + its grid, transcribed from transformers 5.x
    (``video_processing_qwen2_vl.py``), on already normalised (B, F, C, H, W) videos.

    The class itself needs torchvision, which this environment does not have.
    """
    b, f, c, h, w = videos.shape
    if pad := -f % TEMPORAL_PATCH:
        videos = torch.cat((videos, videos[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
        f += pad
    t, gh, gw = f // TEMPORAL_PATCH, h // PATCH, w // PATCH
    patches = videos.reshape(
        b, t, TEMPORAL_PATCH, c, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH
    ).permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    flat = patches.reshape(b * t * gh * gw, c * TEMPORAL_PATCH * PATCH * PATCH)
    return flat, [[t, gh, gw]] * b


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize(("n", "frames"), [(1, 2), (1, 3), (2, 4), (2, 5)])
def test_patchify_frames_is_the_video_processor_layout(n: int, frames: int, channels: int) -> None:
    gen = torch.Generator().manual_seed(frames * 7 + n + channels)
    videos = torch.rand(n, frames, channels, 56, 84, generator=gen)
    pixel_values, grid = patchify_frames(videos)

    mean = torch.tensor(IMAGE_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGE_STD).view(3, 1, 1)
    normalised = (videos.expand(n, frames, 3, 56, 84) - mean) / std
    expected_values, expected_grid = video_processor_patchify(normalised)
    torch.testing.assert_close(pixel_values, expected_values, rtol=0.0, atol=1e-6)
    assert grid.tolist() == expected_grid
    assert grid[0, 0] == math.ceil(frames / TEMPORAL_PATCH)


def test_paired_frames_are_the_processors_still_images(
    processor: Qwen2VLImageProcessorPil,
) -> None:
    """Frames (a, a, b, b, c, c) hold what the image processor makes of the stills a, b, c."""
    stills = torch.rand(3, 3, 84, 56, generator=torch.Generator().manual_seed(5))
    frames = stills.repeat_interleave(TEMPORAL_PATCH, dim=0)  # (6, 3, 84, 56)
    pixel_values, grid = patchify_frames(frames)
    expected_values, expected_grid = processed(processor, stills)
    torch.testing.assert_close(pixel_values, expected_values.float(), rtol=0.0, atol=1e-6)
    assert grid.tolist() == [[3, 6, 4]]
    assert expected_grid.tolist() == [[1, 6, 4]] * 3


def test_a_single_frame_is_a_still_image() -> None:
    image = torch.rand(1, 1, 56, 56, generator=torch.Generator().manual_seed(2))
    assert all(
        torch.equal(a, b) for a, b in zip(patchify_frames(image), patchify(image), strict=True)
    )


def test_image_token_count_matches_the_vision_tower() -> None:
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**tiny_qwen2_5_vl_kwargs()))
    values_a, grid_a = patchify(torch.rand(2, 1, 56, 84))
    values_b, grid_b = patchify_frames(torch.rand(3, 3, 28, 56))
    pixel_values, grid = torch.cat([values_a, values_b]), torch.cat([grid_a, grid_b])
    with torch.no_grad():
        features = model.model.get_image_features(pixel_values, grid)
    per_image = getattr(features, "pooler_output", features)
    assert [f.shape[0] for f in per_image] == [image_token_count(row) for row in grid]
    assert image_token_count(grid) == 6 + 6 + 4
    assert image_token_count((1, 8, 8)) == 16


@pytest.mark.parametrize(
    ("images", "match"),
    [
        (torch.rand(1, 28, 28), r"4-D tensor \(N, C, H, W\), got shape \(1, 28, 28\)"),
        (torch.rand(1, 1, 28, 28, dtype=torch.float64), "float32, got torch.float64"),
        (torch.rand(1, 2, 28, 28), "1 or 3 channels .*got 2"),
        (torch.rand(1, 1, 100, 28), "height must be a positive multiple of 28.*got 100; use 84"),
        (torch.rand(1, 1, 28, 30), "width must be a positive multiple of 28.*got 30"),
        (torch.full((1, 1, 28, 28), 1.5), r"values in \[0, 1\].*max 1.5"),
        (torch.full((1, 1, 28, 28), math.nan), r"values in \[0, 1\]"),
    ],
)
def test_patchify_rejects(images: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        patchify(images)


@pytest.mark.parametrize("grid", [(1, 3, 4), (0, 2, 2), [[1.0, 2.0, 2.0]], [(1, 2)]])
def test_image_token_count_rejects(grid: object) -> None:
    with pytest.raises(ValueError, match="grid_thw"):
        image_token_count(grid)  # type: ignore[arg-type]


# -- phantom ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def phantom() -> Phantom:
    """Seed 1 without noise: a 42 x 23 mm hyperdense lesion and a 38.7 mm vessel, 2.5 mm slices."""
    phantom = generate_phantom(1, PhantomSpec(noise_sd_hu=(0.0, 0.0)))
    assert [f.kind for f in phantom.findings] == ["lesion", "vessel"]
    return phantom


@pytest.fixture(scope="module")
def volume(phantom: Phantom) -> Volume:
    return make_volume(phantom.hu.astype(np.float32), phantom.geometry)


def blob(crop: Crop, finding: TruthFinding, phantom: Phantom) -> np.ndarray:
    """Fraction of each pixel of frame 0 that holds the finding: a 1 HU window halfway between
    soft tissue and the finding's HU, within the finding's reach (so that no neighbour counts)."""
    assert crop.windows[0][1] == 1.0
    image = crop.image[0, 0].numpy().astype(np.float64)  # (size, size)
    centre = crop.lps_to_pixel(np.asarray(finding.center_lps_mm))
    reach = ((finding.long_axis_mm or finding.diameter_mm or 0.0) / 2 + 2.0) / crop.pixel_mm
    rows, columns = np.indices(image.shape)
    image[np.hypot(rows - centre[1], columns - centre[2]) > reach] = 0.0
    return image


def blob_window(finding: TruthFinding, phantom: Phantom) -> tuple[float, float]:
    assert finding.hu is not None
    return ((phantom.body.soft_tissue_hu + finding.hu) / 2, 1.0)


def centroid(weights: np.ndarray) -> np.ndarray:
    rows, columns = np.indices(weights.shape)
    total = float(weights.sum())
    return np.array([(weights * rows).sum() / total, (weights * columns).sum() / total])


@pytest.mark.parametrize("pixel_mm", [0.4, 0.8])
@pytest.mark.parametrize("index", [0, 1])
def test_crop_is_centred_on_the_finding(
    phantom: Phantom, volume: Volume, index: int, pixel_mm: float
) -> None:
    finding = phantom.findings[index]
    window = blob_window(finding, phantom)
    crop = crop_around(volume, finding.center_lps_mm, pixel_mm=pixel_mm, size=112, window=window)
    assert crop.image.shape == (1, 1, 112, 112)
    weights = blob(crop, finding, phantom)
    np.testing.assert_allclose(centroid(weights), [55.5, 55.5], atol=0.5)
    assert crop.center_pixel == (0.0, 55.5, 55.5)
    np.testing.assert_allclose(crop.pixel_to_lps(crop.center_pixel), finding.center_lps_mm)


def test_crop_rows_run_posterior_and_columns_to_the_patient_left(
    phantom: Phantom, volume: Volume
) -> None:
    """Centred 8 mm to the patient's left (+x) and 5 mm anterior (-y) of the vessel, the crop
    shows the vessel 10 columns towards its left edge (the patient's right) and 6.25 rows
    towards its bottom edge (posterior)."""
    vessel = phantom.findings[1]
    centre = np.asarray(vessel.center_lps_mm) + np.array([8.0, -5.0, 0.0])
    crop = crop_around(volume, centre, pixel_mm=0.8, size=112, window=blob_window(vessel, phantom))
    np.testing.assert_allclose(crop.affine_lps[:3, :3], CANONICAL * [2.5, 0.8, 0.8])
    np.testing.assert_allclose(
        centroid(blob(crop, vessel, phantom)), [55.5 + 5 / 0.8, 55.5 - 8 / 0.8], atol=0.5
    )


def test_doubling_pixel_mm_halves_the_apparent_diameter(phantom: Phantom, volume: Volume) -> None:
    vessel = phantom.findings[1]
    assert vessel.diameter_mm is not None
    window = blob_window(vessel, phantom)
    diameters = []
    for pixel_mm in (0.4, 0.8):
        crop = crop_around(volume, vessel.center_lps_mm, pixel_mm=pixel_mm, size=112, window=window)
        diameter_px = 2 * math.sqrt(blob(crop, vessel, phantom).sum() / math.pi)
        assert diameter_px * pixel_mm == pytest.approx(vessel.diameter_mm, abs=pixel_mm)
        diameters.append(diameter_px)
    assert diameters[1] == pytest.approx(diameters[0] / 2, abs=1.0)


@pytest.mark.parametrize(("pixel_mm", "slice_mm"), [(0.8, None), (1.3, 2.0)])
def test_crop_equals_the_prepared_volume_on_its_grid(
    volume: Volume, pixel_mm: float, slice_mm: float | None
) -> None:
    """ingestion.prepare (MONAI) and the crop sample the same HU at the same LPS points."""
    prepared = prepare_volume(volume, PrepareConfig(pixel_mm=pixel_mm, slice_mm=slice_mm))
    last = prepared.shape[0] - 1
    for s, r0, c0 in ((last // 2, 50, 60), (0, 0, 0), (last, 144, 144)):
        centre = prepared.index_to_lps((s, r0 + 55.5, c0 + 55.5))
        crop = crop_around(
            volume,
            centre,
            pixel_mm=pixel_mm,
            size=112,
            window=SOFT,
            slices=3,
            slice_mm=prepared.geometry.slice_spacing,
        )
        np.testing.assert_allclose(crop.affine_lps[:3, :3], prepared.affine_lps[:3, :3])
        for f in range(3):
            if 0 <= s + f - 1 <= last:
                expected = prepared.image[0, s + f - 1, r0 : r0 + 112, c0 : c0 + 112]
                torch.testing.assert_close(crop.image[f, 0], expected, rtol=0.0, atol=1e-4)


def test_frames_are_axial_planes_slice_mm_apart(phantom: Phantom, volume: Volume) -> None:
    centre = np.asarray(phantom.findings[0].center_lps_mm)
    crop = crop_around(volume, centre, pixel_mm=0.7, size=56, window=SOFT, slices=3, slice_mm=1.5)
    assert crop.image.shape == (3, 1, 56, 56) and crop.slice_mm == 1.5 and crop.pixel_mm == 0.7
    for f in range(3):
        single = crop_around(
            volume, centre + np.array([0.0, 0.0, (f - 1) * 1.5]), pixel_mm=0.7, size=56, window=SOFT
        )
        torch.testing.assert_close(crop.image[f], single.image[0], rtol=0.0, atol=1e-6)
    native = crop_around(volume, centre, pixel_mm=0.7, size=56, window=SOFT, slices=2)
    assert native.slice_mm == phantom.geometry.slice_spacing
    np.testing.assert_allclose(native.pixel_to_lps(native.center_pixel), centre)


def test_each_window_is_a_channel(phantom: Phantom, volume: Volume) -> None:
    centre = phantom.findings[1].center_lps_mm
    crop = crop_around(volume, centre, pixel_mm=1.0, size=84, window=[SOFT, LUNG, BONE])
    assert crop.image.shape == (1, 3, 84, 84) and crop.windows == (SOFT, LUNG, BONE)
    for channel, window in enumerate((SOFT, LUNG, BONE)):
        single = crop_around(volume, centre, pixel_mm=1.0, size=84, window=window)
        torch.testing.assert_close(crop.image[:, channel], single.image[:, 0])
    patchify(crop.image)  # three windows feed the model as they are


def test_outside_the_volume_is_air(phantom: Phantom, volume: Volume) -> None:
    far = np.asarray(phantom.findings[0].center_lps_mm) + np.array([0.0, 0.0, 500.0])
    crop = crop_around(volume, far, pixel_mm=1.0, size=56, window=[SOFT, LUNG])
    expected = torch.tensor([windowed(AIR_HU, SOFT), windowed(AIR_HU, LUNG)])
    torch.testing.assert_close(crop.image[0], expected.float()[:, None, None].expand(2, 56, 56))

    # Centred on the first voxel: the part more than one voxel beyond the volume is air.
    corner = phantom.geometry.index_to_lps((phantom.shape[0] // 2, 0, 0))
    crop = crop_around(volume, corner, pixel_mm=1.0, size=56, window=LUNG)
    outside = crop.image[0, 0, :26, :26]  # rows and columns more than 1.5 mm outside
    torch.testing.assert_close(outside, torch.full_like(outside, windowed(AIR_HU, LUNG).item()))


# -- patient space, whatever the volume's orientation ------------------------------------------
BLOB_LPS = np.array([14.0, -9.0, 3.0])


def analytic_hu(lps: np.ndarray) -> np.ndarray:
    """A smooth, asymmetric HU field: a Gaussian blob off the crop centre on a linear ramp."""
    d2 = ((lps - BLOB_LPS) ** 2).sum(axis=-1)
    ramp = lps @ np.array([6.0, 2.5, -4.0])
    return np.asarray(700.0 * np.exp(-d2 / (2 * 7.0**2)) + ramp - 150.0)


def rotation(a: float, b: float, c: float) -> np.ndarray:
    rx = np.array([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]])
    ry = np.array([[math.cos(b), 0, math.sin(b)], [0, 1, 0], [-math.sin(b), 0, math.cos(b)]])
    rz = np.array([[math.cos(c), -math.sin(c), 0], [math.sin(c), math.cos(c), 0], [0, 0, 1]])
    return np.asarray(rz @ ry @ rx, dtype=np.float64)


_IN_PLANE = rotation(0.0, 0.0, math.radians(30.0))
_OBLIQUE = rotation(0.3, 0.4, -0.5)
_TILT = math.radians(20.0)
# name: (row_direction, column_direction, slice_direction), as in tests/ingestion/test_prepare.py
ORIENTATIONS: dict[str, tuple[Sequence[float], Sequence[float], Sequence[float]]] = {
    "axial": ((1, 0, 0), (0, 1, 0), (0, 0, 1)),
    "rows_along_minus_x": ((0, 1, 0), (-1, 0, 0), (0, 0, -1)),
    "flipped_in_plane": ((-1, 0, 0), (0, -1, 0), (0, 0, 1)),
    "rotated_in_plane": (tuple(_IN_PLANE[:, 0]), tuple(_IN_PLANE[:, 1]), (0, 0, 1)),
    "sagittal": ((0, 1, 0), (0, 0, -1), (-1, 0, 0)),
    "oblique": (tuple(_OBLIQUE[:, 0]), tuple(_OBLIQUE[:, 1]), tuple(_OBLIQUE[:, 2])),
    "gantry_tilt": ((1, 0, 0), (0, math.cos(_TILT), math.sin(_TILT)), (0, 0, 1)),
}
CROP_CENTRE = np.array([10.0, -5.0, 2.0])
SHAPE = (40, 60, 60)
SPACING = (1.25, 0.9, 0.9)


def oriented_volume(name: str) -> Volume:
    """The analytic field sampled on a (40, 60, 60) grid of that orientation centred on
    CROP_CENTRE: a 50 x 54 x 54 mm box that holds the crops below in every orientation."""
    row, column, slice_ = (tuple(float(v) for v in d) for d in ORIENTATIONS[name])
    directions = np.array([slice_, column, row]).T  # (3, 3) columns: slice, row, column axes
    half = (np.asarray(SHAPE) - 1) / 2 * np.asarray(SPACING)
    geometry = Geometry(
        origin=tuple(CROP_CENTRE - directions @ half),
        row_direction=row,  # type: ignore[arg-type]
        column_direction=column,  # type: ignore[arg-type]
        slice_direction=slice_,  # type: ignore[arg-type]
        spacing=SPACING,
    )
    lps = geometry.index_to_lps(np.indices(SHAPE).reshape(3, -1).T).reshape(*SHAPE, 3)
    return make_volume(analytic_hu(lps), geometry)


WIDE = (0.0, 2400.0)  # keeps the field unclipped


@pytest.fixture(scope="module")
def oriented_crops() -> dict[str, Crop]:
    return {
        name: crop_around(
            oriented_volume(name),
            CROP_CENTRE,
            pixel_mm=0.8,
            size=28,
            window=WIDE,
            slices=3,
            slice_mm=1.1,
        )
        for name in ORIENTATIONS
    }


@pytest.mark.parametrize("name", sorted(ORIENTATIONS))
def test_crop_is_in_patient_space(oriented_crops: dict[str, Crop], name: str) -> None:
    crop, axial = oriented_crops[name], oriented_crops["axial"]
    np.testing.assert_allclose(crop.affine_lps, axial.affine_lps)
    points = crop.pixel_to_lps(np.indices(crop.image[:, 0].shape).reshape(3, -1).T)
    truth = windowed(analytic_hu(points), WIDE).reshape(crop.image[:, 0].shape)
    image = crop.image[:, 0].numpy()
    # Trilinear error of the blob at <= 1.25 mm voxels is a few HU: < 0.004 of the window.
    np.testing.assert_allclose(image, truth, atol=4e-3)
    np.testing.assert_allclose(image, axial.image[:, 0].numpy(), atol=6e-3)
    mirrored = np.abs(image - image[:, :, ::-1]).max()
    assert mirrored > 0.05  # the field is asymmetric: a flipped crop could not pass


@pytest.mark.parametrize(
    ("name", "native"), [("axial", 1.25), ("rows_along_minus_x", 1.25), ("sagittal", 0.9)]
)
def test_native_slice_mm_is_that_of_the_axis_nearest_z(name: str, native: float) -> None:
    """As ingestion.prepare: the spacing of the volume axis nearest the patient's z."""
    crop = crop_around(oriented_volume(name), CROP_CENTRE, pixel_mm=1.0, size=28, window=WIDE)
    assert crop.slice_mm == native


# -- geometry round trips -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_volume() -> Volume:
    geometry = Geometry(
        origin=(-20.0, -20.0, -10.0),
        row_direction=(1.0, 0.0, 0.0),
        column_direction=(0.0, 1.0, 0.0),
        slice_direction=(0.0, 0.0, 1.0),
        spacing=(2.0, 1.0, 1.0),
    )
    return make_volume(np.zeros((10, 40, 40), dtype=np.float32), geometry)


@PROPERTY
@given(
    centre=st.tuples(*[st.floats(-500.0, 500.0)] * 3),
    pixel_mm=st.floats(0.05, 5.0),
    frames=st.integers(1, 4),
    slice_mm=st.floats(0.1, 10.0),
    size=st.sampled_from([28, 56]),
    pixels=st.lists(st.tuples(*[st.floats(-100.0, 100.0)] * 3), min_size=1, max_size=5),
)
def test_crop_pixel_lps_round_trip(
    small_volume: Volume,
    centre: tuple[float, float, float],
    pixel_mm: float,
    frames: int,
    slice_mm: float,
    size: int,
    pixels: list[tuple[float, float, float]],
) -> None:
    crop = crop_around(
        small_volume,
        centre,
        pixel_mm=pixel_mm,
        size=size,
        window=SOFT,
        slices=frames,
        slice_mm=slice_mm,
    )
    assert crop.image.shape == (frames, 1, size, size)
    np.testing.assert_allclose(crop.pixel_to_lps(crop.center_pixel), centre, atol=1e-9)
    np.testing.assert_allclose(crop.lps_to_pixel(centre), crop.center_pixel, atol=1e-9)
    back = crop.lps_to_pixel(crop.pixel_to_lps(np.asarray(pixels)))
    np.testing.assert_allclose(back, pixels, atol=1e-7)
    step = crop.pixel_to_lps(np.eye(3)) - crop.pixel_to_lps(np.zeros(3))  # frame, row, column
    np.testing.assert_allclose(step, np.diag([slice_mm, pixel_mm, pixel_mm]) @ CANONICAL.T)


def rejects(call: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": 100}, "size must be a positive multiple of 28.*got 100; use 84 or 112"),
        ({"size": 0}, "size must be a positive multiple of 28.*got 0; use 28$"),
        ({"size": 56.0}, "size must be an integer.*got 56.0"),
        ({"pixel_mm": 0.0}, "pixel_mm must be > 0, got 0.0"),
        ({"pixel_mm": -1.0}, "pixel_mm must be > 0, got -1.0"),
        ({"pixel_mm": math.nan}, "pixel_mm must be a finite number, got nan"),
        ({"center_lps_mm": (0.0, math.nan, 0.0)}, r"center_lps_mm .*got \(0.0, nan, 0.0\)"),
        ({"center_lps_mm": (0.0, 1.0)}, r"center_lps_mm must be three .*got \(0.0, 1.0\)"),
        ({"slices": 0}, "slices must be an integer >= 1, got 0"),
        ({"slice_mm": 0.0, "slices": 3}, "slice_mm must be > 0, got 0.0"),
        ({"window": (40.0, 0.0)}, r"window width must be > 0 HU, got \(40.0, 0.0\)"),
        ({"window": [SOFT, (1.0, -5.0)]}, r"window\[1\] width must be > 0"),
        ({"window": "soft"}, "window must be .*got 'soft'"),
        ({"window": ()}, r"window must be .*got \(\)"),
    ],
)
def test_crop_rejects(small_volume: Volume, kwargs: dict[str, object], match: str) -> None:
    arguments: dict[str, object] = {
        "center_lps_mm": (0.0, 0.0, 0.0),
        "pixel_mm": 1.0,
        "size": 28,
        "window": SOFT,
    }
    arguments.update(kwargs)
    rejects(lambda: crop_around(small_volume, **arguments), match)  # type: ignore[arg-type]


def test_crop_takes_numpy_scalars(small_volume: Volume) -> None:
    numpy_scalars: dict[str, Any] = {
        "pixel_mm": np.float32(0.5),
        "size": np.int64(28),
        "window": (np.float32(40.0), np.int32(400)),
        "slices": np.int64(2),
        "slice_mm": np.float32(1.5),
    }
    crop = crop_around(small_volume, np.array([1.0, 2.0, 3.0], dtype=np.float32), **numpy_scalars)
    assert crop.image.shape == (2, 1, 28, 28)
    assert (crop.pixel_mm, crop.slice_mm, crop.windows) == (0.5, 1.5, (SOFT,))


# -- find images --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prepared(volume: Volume) -> PreparedVolume:
    return prepare_volume(volume, PrepareConfig(pixel_mm=0.8, size=(224, 224)))


@pytest.mark.parametrize(
    ("n_slices", "num_slices", "expected"),
    [(21, 4, (2, 7, 13, 18)), (21, 1, (10,)), (5, 8, (0, 1, 2, 3, 4)), (6, 6, tuple(range(6)))],
)
def test_find_slice_indices(n_slices: int, num_slices: int, expected: tuple[int, ...]) -> None:
    assert find_slice_indices(n_slices, num_slices) == expected


@PROPERTY
@given(n_slices=st.integers(1, 400), num_slices=st.integers(1, 64))
def test_find_slice_indices_spread_evenly(n_slices: int, num_slices: int) -> None:
    indices = find_slice_indices(n_slices, num_slices)
    assert len(indices) == min(n_slices, num_slices)
    assert all(0 <= a < b < n_slices for a, b in itertools.pairwise(indices))
    if n_slices > 2 * num_slices:
        assert indices[0] > 0 and indices[-1] < n_slices - 1
    part = Fraction(n_slices, len(indices))  # slice i spans [i, i + 1): it holds its part's centre
    assert all(i <= (k + Fraction(1, 2)) * part < i + 1 for k, i in enumerate(indices))


def test_find_images_slices_and_mapping(prepared: PreparedVolume) -> None:
    assert prepared.shape == (21, 224, 224)
    found = find_images(prepared, 4)
    assert found.slice_indices == (2, 7, 13, 18)
    assert found.images.shape == (4, 1, 224, 224) and found.images.is_contiguous()
    for k, s in enumerate(found.slice_indices):
        assert torch.equal(found.images[k], prepared.image[:, s])
        assert found.source_slice_indices[k] == prepared.source_slice_indices[s]
    np.testing.assert_allclose(found.affine_lps, prepared.affine_lps, atol=1e-12)

    pixels = np.array([[0, 0, 0], [1, 10.5, 200.25], [3, 223, 17]], dtype=np.float64)
    slices = np.asarray(found.slice_indices, dtype=np.float64)[pixels[:, 0].astype(int)]
    homogeneous = np.stack([slices, pixels[:, 1], pixels[:, 2], np.ones(3)], axis=1)  # (3, 4)
    expected = (homogeneous @ prepared.affine_lps.T)[:, :3]
    lps = found.pixel_to_lps(pixels)
    np.testing.assert_allclose(lps, expected, atol=1e-9)
    np.testing.assert_allclose(found.lps_to_pixel(lps), pixels, atol=1e-9)

    # A point between images goes to the nearest one (prepared slice 9 -> image 1, slice 7).
    between = prepared.index_to_lps((9.0, 30.0, 40.0))
    np.testing.assert_allclose(found.lps_to_pixel(between), [1.0, 30.0, 40.0], atol=1e-9)
    patchify(found.images)  # ready for the model

    with pytest.raises(ValueError, match=r"whole numbers in \[0, 4\)"):
        found.pixel_to_lps([4, 0, 0])
    with pytest.raises(ValueError, match=r"whole numbers in \[0, 4\)"):
        found.pixel_to_lps([0.5, 0, 0])


def test_find_images_takes_all_slices_when_fewer(prepared: PreparedVolume) -> None:
    found = find_images(prepared, 64)
    assert found.slice_indices == tuple(range(21))
    assert torch.equal(found.images, prepared.image.permute(1, 0, 2, 3))


def test_find_images_rejects(prepared: PreparedVolume) -> None:
    rejects(lambda: find_images(prepared, 0), "num_slices must be an integer >= 1, got 0")
    cropped = dataclasses.replace(prepared, image=prepared.image[:, :, :100, :112].contiguous())
    rejects(lambda: find_images(cropped, 4), r"rows \(PrepareConfig.size\[0\]\).*got 100")
    two = dataclasses.replace(
        prepared,
        image=prepared.image.expand(2, -1, -1, -1).contiguous(),
        config=PrepareConfig(pixel_mm=0.8, size=(224, 224), windows=(SOFT, LUNG)),
    )
    rejects(lambda: find_images(two, 4), "has 2 channels; the model takes 1 or 3")


# -- channel encodings ----------------------------------------------------------------------------
def test_contrast_channels_keep_brightness_through_qwen_patch_embedding() -> None:
    """Why ``contrast_channels`` exists: with grey channels, uniform patches of different grey
    levels reach the first block (patch embedding without bias, then RMSNorm) as one vector."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionPatchEmbed,
        Qwen2_5_VLRMSNorm,
    )

    torch.manual_seed(0)
    embed = Qwen2_5_VisionPatchEmbed(PATCH, TEMPORAL_PATCH, CHANNELS, 32)
    norm = Qwen2_5_VLRMSNorm(32)
    levels = torch.tensor([0.55, 0.7, 0.9])  # flat patches brighter than CLIP's mean
    flat = levels.view(3, 1, 1, 1).expand(3, 1, 28, 28).contiguous()

    def first_block_input(images: torch.Tensor) -> torch.Tensor:
        pixel_values, _ = patchify(images)
        with torch.no_grad():
            return norm(embed(pixel_values))  # (patches, 32)

    grey = first_block_input(flat)
    contrast = first_block_input(contrast_channels(flat))
    per_image = 4  # 28 x 28 -> 2 x 2 patches

    def similarity(x: torch.Tensor) -> float:  # grey level 0.55 vs 0.9
        return float(torch.nn.functional.cosine_similarity(x[0], x[-per_image], dim=0))

    # grey: only CLIP's slightly different per-channel mean/std tell the levels apart
    assert similarity(grey) > 0.95
    assert similarity(contrast) < 0.8
    images = contrast_channels(torch.rand(2, 1, 28, 56))
    assert images.shape == (2, 3, 28, 56)
    torch.testing.assert_close(images[:, 1], 1 - images[:, 0])
    assert bool((images[:, 2] == 0.5).all())
    with pytest.raises(ValueError, match="one-window"):
        contrast_channels(torch.rand(2, 3, 28, 28))


def test_two_window_channels() -> None:
    images = torch.rand(4, 2, 28, 56, generator=torch.Generator().manual_seed(0))
    channels = two_window_channels(images)
    assert channels.shape == (4, 3, 28, 56)
    torch.testing.assert_close(channels[:, 0], images[:, 0])
    torch.testing.assert_close(channels[:, 1], 1 - images[:, 0])
    torch.testing.assert_close(channels[:, 2], images[:, 1])
    with pytest.raises(ValueError, match="two-window"):
        two_window_channels(torch.rand(2, 1, 28, 28))
