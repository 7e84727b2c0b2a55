"""Click placement (``model.measurer.evaluate.clicks``): the primary click central in the largest
section, the extra clicks inside and distinct, the negative click in lung and clear of the
lesion, all deterministic for a seed, on plain, anisotropic and oblique grids."""

from __future__ import annotations

import numpy as np
import pytest

from ingestion.geometry import Geometry
from model.measurer.evaluate.clicks import LUNG_HU, ClickPoints, lesion_clicks, negative_click

AXIAL = Geometry(
    origin=(-20.0, 10.0, 5.0),
    row_direction=(1.0, 0.0, 0.0),
    column_direction=(0.0, 1.0, 0.0),
    slice_direction=(0.0, 0.0, 1.0),
    spacing=(2.0, 0.5, 1.0),  # slices 2 mm apart; rows 0.5 mm, columns 1 mm
)
_C, _S = np.cos(np.radians(30)), np.sin(np.radians(30))
OBLIQUE = Geometry(
    origin=(3.0, -7.0, 11.0),
    row_direction=(_C, _S, 0.0),
    column_direction=(0.0, 0.0, -1.0),
    slice_direction=(-_S, _C, 0.0),
    spacing=(1.5, 0.8, 0.6),
)


def ellipse_mask(
    shape: tuple[int, int, int],
    geometry: Geometry,
    centre_rc: tuple[float, float],
    semi_mm: dict[int, tuple[float, float]],
) -> np.ndarray:
    """A stack of ellipses (semi-axes in mm along rows and columns) on the given slices."""
    mask = np.zeros(shape, dtype=bool)
    rows, cols = np.mgrid[: shape[1], : shape[2]]
    dr = (rows - centre_rc[0]) * geometry.row_spacing
    dc = (cols - centre_rc[1]) * geometry.column_spacing
    for s, (a, b) in semi_mm.items():
        mask[s] = (dr / a) ** 2 + (dc / b) ** 2 <= 1.0
    return mask


def to_index(geometry: Geometry, point: tuple[float, float, float]) -> tuple[int, int, int]:
    index = geometry.lps_to_index(np.asarray(point))
    assert np.allclose(index, np.rint(index), atol=1e-6)  # a voxel centre
    s, r, c = (int(v) for v in np.rint(index))
    return s, r, c


@pytest.mark.parametrize("geometry", [AXIAL, OBLIQUE], ids=["anisotropic", "oblique"])
def test_primary_is_the_centre_of_the_largest_section(geometry: Geometry) -> None:
    # 8 mm round in mm on slice 2 (the largest), smaller on 1 and 3: centred at (30, 20)
    mask = ellipse_mask((5, 61, 41), geometry, (30, 20), {1: (3, 3), 2: (8, 8), 3: (5, 5)})
    clicks = lesion_clicks(mask, geometry, rng=np.random.default_rng(1))
    assert isinstance(clicks, ClickPoints)
    assert clicks.slice_index == 2
    assert to_index(geometry, clicks.primary_lps_mm) == (2, 30, 20)


def test_the_primary_is_deepest_in_mm_not_in_pixels() -> None:
    # rows 0.5 mm, columns 1 mm. Block A: 20 rows x 8 columns (10 x 8 mm): 4 px deep, 4 mm.
    # Block B: 10 rows x 14 columns (5 x 14 mm): 5 px deep but 2.5 mm. The click goes to A.
    mask = np.zeros((1, 40, 30), dtype=bool)
    mask[0, 2:22, 2:10] = True
    mask[0, 25:35, 12:26] = True
    clicks = lesion_clicks(mask, AXIAL, rng=np.random.default_rng(0))
    s, r, c = to_index(AXIAL, clicks.primary_lps_mm)
    assert s == 0 and 2 <= r < 22 and 2 <= c < 10
    assert c in (5, 6)  # the middle columns of A (4 mm from its sides)


def test_slice_ties_go_to_the_centroid_then_the_lower_index() -> None:
    mask = np.zeros((4, 20, 20), dtype=bool)
    mask[1, 5:10, 5:10] = True
    mask[2, 5:10, 5:10] = True  # equal areas on 1 and 2; the centroid slice is 1.5
    assert lesion_clicks(mask, AXIAL, rng=np.random.default_rng(0)).slice_index == 1
    mask[3, 8:10, 8:10] = True  # centroid moves towards 2
    assert lesion_clicks(mask, AXIAL, rng=np.random.default_rng(0)).slice_index == 2


@pytest.mark.parametrize("geometry", [AXIAL, OBLIQUE], ids=["anisotropic", "oblique"])
def test_extra_clicks_are_inside_distinct_and_seeded(geometry: Geometry) -> None:
    mask = ellipse_mask((3, 61, 41), geometry, (30, 20), {1: (9, 6)})
    interior = mask[1].copy()
    interior[1:-1, 1:-1] = (
        mask[1, 1:-1, 1:-1]
        & mask[1, :-2, 1:-1]
        & mask[1, 2:, 1:-1]
        & mask[1, 1:-1, :-2]
        & mask[1, 1:-1, 2:]
        & mask[1, :-2, :-2]
        & mask[1, 2:, 2:]
        & mask[1, :-2, 2:]
        & mask[1, 2:, :-2]
    )
    first = lesion_clicks(mask, geometry, extra=5, rng=np.random.default_rng(7))
    again = lesion_clicks(mask, geometry, extra=5, rng=np.random.default_rng(7))
    other = lesion_clicks(mask, geometry, extra=5, rng=np.random.default_rng(8))
    assert first == again
    assert first.primary_lps_mm == other.primary_lps_mm
    assert first.extra_lps_mm != other.extra_lps_mm
    voxels = [to_index(geometry, p) for p in first.extra_lps_mm]
    assert len(voxels) == 5 and len(set(voxels)) == 5
    assert to_index(geometry, first.primary_lps_mm) not in voxels
    assert all(s == 1 and interior[r, c] for s, r, c in voxels)  # a pixel inside the edge


def test_a_section_without_interior_gives_its_other_pixels() -> None:
    mask = np.zeros((1, 10, 10), dtype=bool)
    mask[0, 4:6, 4:7] = True  # 2 x 3 pixels: none a pixel inside the edge
    clicks = lesion_clicks(mask, AXIAL, extra=10, rng=np.random.default_rng(0))
    voxels = {to_index(AXIAL, p) for p in clicks.extra_lps_mm}
    assert len(voxels) == 5  # every pixel but the primary
    assert to_index(AXIAL, clicks.primary_lps_mm) not in voxels
    assert all(mask[v] for v in voxels)
    assert lesion_clicks(mask, AXIAL, extra=0, rng=np.random.default_rng(0)).extra_lps_mm == ()


@pytest.mark.parametrize(
    ("mask", "extra", "message"),
    [
        (np.zeros((2, 5, 5), dtype=bool), 2, "non-empty"),
        (np.ones((5, 5), dtype=bool), 2, "shape"),
        (np.ones((2, 5, 5), dtype=bool), -1, "extra must be >= 0"),
    ],
)
def test_bad_masks_are_refused(mask: np.ndarray, extra: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lesion_clicks(mask, AXIAL, extra=extra, rng=np.random.default_rng(0))


def lung_with_nodule(geometry: Geometry, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A lung-like volume (-850 HU +- 40) with a 10 mm nodule (20 HU) near a chest wall
    (40 HU, the last 12 columns) and a band of air (-1000 HU, rows 0-3)."""
    rng = np.random.default_rng(seed)
    shape = (5, 81, 61)
    image = rng.normal(-850.0, 40.0, shape)
    image[:, :, -12:] = 40.0
    image[:, :4, :] = -1000.0
    mask = ellipse_mask(shape, geometry, (40, 30), {1: (3, 3), 2: (5, 5), 3: (4, 4)})
    image[mask] = 20.0
    return image, mask


@pytest.mark.parametrize("geometry", [AXIAL, OBLIQUE], ids=["anisotropic", "oblique"])
def test_the_negative_click_is_in_lung_and_clear_of_the_lesion(geometry: Geometry) -> None:
    image, mask = lung_with_nodule(geometry)
    point = negative_click(image, mask, geometry, rng=np.random.default_rng(3))
    assert point is not None
    s, r, c = to_index(geometry, point)
    assert s == 2  # the lesion's largest slice has lung far enough away
    assert LUNG_HU[0] <= image[s, r, c] <= LUNG_HU[1]
    lesion = geometry.index_to_lps(np.argwhere(mask).astype(float))
    assert np.linalg.norm(lesion - np.asarray(point), axis=1).min() >= 5.0
    assert min(r, 80 - r) * geometry.row_spacing >= 5.0
    assert min(c, 60 - c) * geometry.column_spacing >= 5.0
    assert negative_click(image, mask, geometry, rng=np.random.default_rng(3)) == point
    drawn = {negative_click(image, mask, geometry, rng=np.random.default_rng(k)) for k in range(5)}
    assert len(drawn) > 1  # drawn, not fixed


def test_the_negative_click_moves_to_the_nearest_slice_with_lung() -> None:
    image, mask = lung_with_nodule(AXIAL)
    image[2][~mask[2]] = 40.0  # no lung on the largest slice
    point = negative_click(image, mask, AXIAL, rng=np.random.default_rng(0))
    assert point is not None and to_index(AXIAL, point)[0] == 1  # nearer below first


def test_no_negative_click_where_the_crop_has_no_lung_clear_of_the_lesion() -> None:
    _, mask = lung_with_nodule(AXIAL)
    solid = np.where(mask, 20.0, 40.0)  # soft tissue all round
    assert negative_click(solid, mask, AXIAL, rng=np.random.default_rng(0)) is None
    small = np.zeros((1, 24, 12), dtype=bool)  # 12 x 12 mm: nothing 5 mm clear of edge and lesion
    small[0, 10:14, 5:7] = True
    lung = np.full(small.shape, -850.0)
    assert negative_click(lung, small, AXIAL, rng=np.random.default_rng(0)) is None


def test_negative_click_refuses_bad_input() -> None:
    image, mask = lung_with_nodule(AXIAL)
    with pytest.raises(ValueError, match="differ"):
        negative_click(image[:, :-1], mask, AXIAL, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="margin_mm must be > 0"):
        negative_click(image, mask, AXIAL, rng=np.random.default_rng(0), margin_mm=0.0)
    with pytest.raises(ValueError, match="non-empty"):
        negative_click(image, np.zeros_like(mask), AXIAL, rng=np.random.default_rng(0))
