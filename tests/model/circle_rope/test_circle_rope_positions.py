"""Circle-RoPE and M-RoPE position ids (model.circle_rope.positions).

Acceptance checks: with Circle-RoPE off the ids are transformers' ``get_rope_index`` exactly (text
only, one image, two images, left-padded batch); the per-token distance (paper eq. 1) between the
text and each image is 0 with Circle-RoPE and > 0 with M-RoPE for several grids; radius "auto" is
max((W-1)/2, (H-1)/2). Also: an independent implementation of the paper's appendix-C pseudocode
agrees with ours, multi-frame images (paper sec. 4.3), left padding, and bad input.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel

from model.backbone import tiny_qwen2_5_vl_kwargs
from model.circle_rope.positions import (
    circle_coordinates,
    circle_rope_position_ids,
    mrope_position_ids,
    multimodal_position_ids,
    per_token_distance,
    resolve_radius,
)

KW = tiny_qwen2_5_vl_kwargs()
IMAGE, START, END = KW["image_token_id"], KW["vision_start_token_id"], KW["vision_end_token_id"]
PAD = KW["text_config"]["pad_token_id"]
MERGE = 2
IDS = {"image_token_id": IMAGE, "vision_start_token_id": START}


@pytest.fixture(scope="module")
def stock() -> Qwen2_5_VLModel:
    """transformers' own Qwen2.5-VL (its get_rope_index is the reference for M-RoPE)."""
    torch.manual_seed(0)
    return Qwen2_5_VLModel(Qwen2_5_VLConfig(**KW)).eval()


def image_tokens(grid: tuple[int, int, int]) -> list[int]:
    """<|vision_start|> image tokens <|vision_end|> for a pre-merge (t, h, w) grid."""
    t, h, w = grid
    return [START] + [IMAGE] * (t * h * w // MERGE**2) + [END]


def sequence(*parts: list[int] | tuple[int, int, int]) -> list[int]:
    """Text token lists and pre-merge image grids, in order."""
    out: list[int] = []
    for part in parts:
        out += image_tokens(part) if isinstance(part, tuple) else part
    return out


def batch(rows: list[list[int]], left: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad rows to one length (left or right) -> (ids, attention mask)."""
    length = max(len(r) for r in rows)
    ids, mask = [], []
    for r in rows:
        pad = [PAD] * (length - len(r))
        ids.append(pad + r if left else r + pad)
        ones, zeros = [1] * len(r), [0] * len(pad)
        mask.append(zeros + ones if left else ones + zeros)
    return torch.tensor(ids), torch.tensor(mask)


def grids(*g: tuple[int, int, int]) -> torch.Tensor | None:
    return torch.tensor(g) if g else None


def transformers_ids(
    stock: Qwen2_5_VLModel, ids: torch.Tensor, grid: torch.Tensor | None, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    types = (ids == IMAGE).int()
    position_ids, deltas = stock.get_rope_index(
        ids, types, image_grid_thw=grid, attention_mask=mask
    )
    return position_ids, deltas


TEXT = [10, 11, 12, 13, 14]

CASES = {
    "text only": ([sequence(TEXT)], ()),
    "one image": ([sequence(TEXT, (1, 4, 6), [20, 21])], ((1, 4, 6),)),
    "two images": (
        [sequence([10], (1, 4, 4), [20, 21, 22], (1, 8, 6), [30])],
        ((1, 4, 4), (1, 8, 6)),
    ),
    "left-padded batch": (
        [
            sequence(TEXT, (1, 4, 4), [20]),
            sequence([10], (1, 6, 4), [20, 21, 22, 23], (1, 2, 2), [30, 31]),
            sequence(TEXT + TEXT),
        ],
        ((1, 4, 4), (1, 6, 4), (1, 2, 2)),
    ),
    "multi-frame image": ([sequence([10], (3, 4, 6), [20, 21])], ((3, 4, 6),)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mrope_ids_equal_transformers_get_rope_index(stock: Qwen2_5_VLModel, case: str) -> None:
    rows, g = CASES[case]
    ids, mask = batch(rows)
    expected, expected_deltas = transformers_ids(stock, ids, grids(*g), mask)
    ours, deltas = mrope_position_ids(ids, grids(*g), mask, spatial_merge_size=MERGE, **IDS)
    assert ours.dtype == expected.dtype == torch.int64
    assert torch.equal(ours, expected)
    assert torch.equal(deltas, expected_deltas.to(deltas.dtype))


def positions_of(position_ids: torch.Tensor, row: int, where: torch.Tensor) -> torch.Tensor:
    """(3, B, L) ids, a row and a (L,) bool mask -> (n, 3) points."""
    return position_ids[:, row, where].T


GRIDS = [(1, 2, 2), (1, 4, 4), (1, 4, 6), (1, 6, 4), (1, 2, 8), (1, 10, 14), (1, 16, 16)]


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize("radius", [10.0, "auto", "auto-2", 3.5])
def test_per_token_distance_is_zero_with_circle_rope(
    grid: tuple[int, int, int], radius: float | str
) -> None:
    ids, mask = batch([sequence(TEXT, grid, TEXT, [40, 41])])
    circle, _ = circle_rope_position_ids(
        ids, grids(grid), mask, spatial_merge_size=MERGE, radius=radius, **IDS
    )
    mrope, _ = mrope_position_ids(ids, grids(grid), mask, spatial_merge_size=MERGE, **IDS)
    is_image = ids[0] == IMAGE
    is_text = ~is_image  # vision start / end tokens are text positions too
    ptd_circle = per_token_distance(
        positions_of(circle, 0, is_text), positions_of(circle, 0, is_image)
    )
    ptd_mrope = per_token_distance(
        positions_of(mrope, 0, is_text).float(), positions_of(mrope, 0, is_image).float()
    )
    assert ptd_circle <= 1e-5
    if grid[1] * grid[2] > MERGE**2:  # one image token is trivially equidistant
        assert ptd_mrope > 0.05


def test_per_token_distance_is_zero_for_each_of_several_images() -> None:
    g = ((1, 4, 6), (1, 8, 8), (1, 6, 2))
    ids, mask = batch([sequence(TEXT, g[0], [20], g[1], [30, 31, 32], g[2], TEXT)])
    circle, _ = circle_rope_position_ids(ids, grids(*g), mask, spatial_merge_size=MERGE, **IDS)
    is_image = ids[0] == IMAGE
    starts = (ids[0] == START).nonzero().flatten().tolist()
    text = positions_of(circle, 0, ~is_image)
    for start, grid in zip(starts, g, strict=True):
        size = grid[0] * grid[1] * grid[2] // MERGE**2
        image = circle[:, 0, start + 1 : start + 1 + size].T
        assert per_token_distance(text, image) <= 1e-5
    # ... but not between the text and all images together: their centres differ
    assert per_token_distance(text, positions_of(circle, 0, is_image)) > 0.1


def test_per_token_distance_definition() -> None:
    """Eq. 1 by hand: text at 0 and 1 on a line, image tokens at 1 and 3."""
    text = torch.tensor([[0.0], [1.0]])
    image = torch.tensor([[1.0], [3.0]])
    # distances: t=0 -> (1, 3), mean 2, |dev| 1, 1; t=1 -> (0, 2), mean 1, |dev| 1, 1
    assert per_token_distance(text, image) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least one"):
        per_token_distance(text, image[:0])


@pytest.mark.parametrize(("h", "w"), [(4, 4), (4, 10), (12, 6), (1, 7), (9, 1), (1, 1)])
def test_auto_radius_is_the_largest_centred_coordinate(h: int, w: int) -> None:
    expected = max((w - 1) / 2, (h - 1) / 2)
    assert resolve_radius("auto", h, w) == expected
    assert resolve_radius("auto-2", h, w) == 2 * expected
    assert resolve_radius("auto-0.5", h, w) == 0.5 * expected
    assert resolve_radius(7, h, w) == 7.0
    # the image tokens lie at that distance from the circle's centre (p, p, p)
    grid = (1, MERGE * h, MERGE * w)
    ids, mask = batch([sequence(TEXT, grid, [20])])
    circle, _ = circle_rope_position_ids(
        ids, grids(grid), mask, spatial_merge_size=MERGE, radius="auto", **IDS
    )
    p = len(TEXT) + 1  # after the text and <|vision_start|>
    image = positions_of(circle, 0, ids[0] == IMAGE).double()
    torch.testing.assert_close(
        (image - p).norm(dim=1),
        torch.full((h * w,), expected, dtype=torch.float64),
        atol=1e-5,
        rtol=0,
    )


# --- agreement with the paper's appendix-C pseudocode, written independently here ---------------


def paper_cip(h: int, w: int, alpha: float, radius: float) -> torch.Tensor:
    """Appendix C of the paper in float64: (H W, 3) projected points in (x=w, y=h, z=t) order."""
    jj, ii = torch.meshgrid(torch.arange(w), torch.arange(h), indexing="xy")  # (H, W): j, i
    c = torch.stack((jj.flatten(), ii.flatten()), dim=1).double()  # (N, 2) (x, y), row-major
    c_prime = c - 0.5 * (c.max(dim=0).values + c.min(dim=0).values) + 0.0
    raw = torch.atan2(c_prime[:, 1], c_prime[:, 0])
    delta = raw.max() - raw.min()
    theta_sa = (raw - raw.min()) / delta * 2 * torch.pi if delta > 0 else torch.zeros_like(raw)
    n_tokens = c.shape[0]
    theta_ga = torch.arange(n_tokens).double() / n_tokens * 2 * torch.pi
    theta = alpha * theta_sa + (1 - alpha) * theta_ga
    circ = torch.stack((radius * theta.cos(), radius * theta.sin()), dim=-1)  # (N, 2)
    v_text = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    n = v_text / v_text.norm()
    u = torch.tensor([-n[1], n[0], 0.0], dtype=torch.float64)
    u = u / u.norm()
    v = torch.linalg.cross(n, u)
    return circ[:, :1] * u + circ[:, 1:] * v  # (N, 3)


@pytest.mark.parametrize(("h", "w"), [(2, 2), (4, 6), (6, 4), (1, 5), (8, 8), (7, 3)])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 0.3])
def test_matches_the_paper_pseudocode(h: int, w: int, alpha: float) -> None:
    grid = (1, MERGE * h, MERGE * w)
    ids, mask = batch([sequence([10, 11, 12], grid, [20])])
    circle, deltas = circle_rope_position_ids(
        ids, grids(grid), mask, spatial_merge_size=MERGE, alpha=alpha, radius=10.0, **IDS
    )
    p = 4.0  # three text tokens and <|vision_start|>
    reference = paper_cip(h, w, alpha, 10.0) + p  # (N, 3) in (w, h, t) order
    ours = positions_of(circle, 0, ids[0] == IMAGE).double()  # (N, 3) in (t, h, w) order
    torch.testing.assert_close(ours, reference.flip(1), atol=2e-6, rtol=0)
    # the text after the image continues at the image's largest coordinate + 1
    after = ids.shape[1] - 2  # <|vision_end|>
    assert float(circle[0, 0, after]) == pytest.approx(float(reference.max()) + 1, abs=1e-5)
    assert torch.equal(circle[0, 0, after:], circle[1, 0, after:])  # text rows agree
    length = ids.shape[1]
    assert float(deltas[0, 0]) == pytest.approx(float(circle[0, 0, -1]) + 1 - length, abs=1e-5)


def test_in_plane_coordinates() -> None:
    ab = circle_coordinates(4, 6, 0.5, "auto")
    assert ab.shape == (24, 2)
    torch.testing.assert_close(
        torch.from_numpy(ab).norm(dim=1), torch.full((24,), 2.5, dtype=torch.float64)
    )
    # alpha 0: pure grid angle, evenly spaced from angle 0 in row-major order
    angles = torch.from_numpy(circle_coordinates(2, 3, 0.0, 1.0))
    expected = torch.arange(6, dtype=torch.float64) / 6 * 2 * math.pi
    torch.testing.assert_close(angles[:, 0], expected.cos())
    torch.testing.assert_close(angles[:, 1], expected.sin())


# --- batches, padding, frames ------------------------------------------------------------------


def test_left_padding_gives_each_row_its_unpadded_positions() -> None:
    rows = [sequence(TEXT, (1, 4, 4), [20]), sequence([10], (1, 6, 4), [20, 21, 22, 23])]
    g = ((1, 4, 4), (1, 6, 4))
    ids, mask = batch(rows)
    circle, deltas = circle_rope_position_ids(ids, grids(*g), mask, spatial_merge_size=MERGE, **IDS)
    assert circle.dtype == deltas.dtype == torch.float32
    assert circle.shape == (3, 2, ids.shape[1]) and deltas.shape == (2, 1)
    for row, (tokens, grid) in enumerate(zip(rows, g, strict=True)):
        alone, alone_deltas = circle_rope_position_ids(
            torch.tensor([tokens]), grids(grid), None, spatial_merge_size=MERGE, **IDS
        )
        valid = mask[row].bool()
        assert torch.equal(circle[:, row, valid], alone[:, 0])
        assert torch.equal(circle[:, row, ~valid], torch.zeros(3, int((~valid).sum())))
        assert torch.equal(deltas[row], alone_deltas[0])
    # right padding too
    ids_r, mask_r = batch(rows, left=False)
    right, _ = circle_rope_position_ids(ids_r, grids(*g), mask_r, spatial_merge_size=MERGE, **IDS)
    for row in range(2):
        assert torch.equal(right[:, row, mask_r[row].bool()], circle[:, row, mask[row].bool()])


@pytest.mark.parametrize("stride", [1.0, 2.5])
def test_multi_frame_image_shifts_each_frame_along_the_text_axis(stride: float) -> None:
    """Paper sec. 4.3: frame f's circle is frame 0's moved by f * stride * [1, 1, 1]."""
    frames, h, w = 3, 4, 6
    ids, mask = batch([sequence(TEXT, (frames, MERGE * h, MERGE * w), [20, 21])])
    p = multimodal_position_ids(
        ids,
        grids((frames, MERGE * h, MERGE * w)),
        mask,
        spatial_merge_size=MERGE,
        frame_stride=stride,
        **IDS,
    )
    image = positions_of(p.circle, 0, ids[0] == IMAGE).double().reshape(frames, h * w, 3)
    for f in range(1, frames):
        torch.testing.assert_close(image[f], image[0] + f * stride, atol=1e-5, rtol=0)
    text = positions_of(p.circle, 0, ids[0] != IMAGE)
    for f in range(frames):  # every frame is equidistant from every text token
        assert per_token_distance(text, image[f]) <= 1e-5
    # the text after continues above the last frame
    after = int((ids[0] == END).nonzero()[0, 0])
    assert float(p.circle[0, 0, after]) == pytest.approx(float(image.max()) + 1, abs=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    h=st.integers(1, 12),
    w=st.integers(1, 12),
    alpha=st.floats(0, 1),
    radius=st.one_of(st.floats(0.5, 40), st.sampled_from(["auto", "auto-2", "auto-0.75"])),
    text_before=st.integers(0, 30),
)
def test_cone_geometry_property(
    h: int, w: int, alpha: float, radius: float | str, text_before: int
) -> None:
    """For any grid and setting: image tokens on a circle of the resolved radius around
    (p, p, p), in the plane orthogonal to [1, 1, 1], so the text sees them equidistant."""
    grid = (1, MERGE * h, MERGE * w)
    ids, mask = batch([sequence(list(range(10, 10 + text_before)), grid, [20, 21])])
    circle, _ = circle_rope_position_ids(
        ids, grids(grid), mask, spatial_merge_size=MERGE, alpha=alpha, radius=radius, **IDS
    )
    p = text_before + 1
    image = positions_of(circle, 0, ids[0] == IMAGE).double() - p  # (N, 3)
    r = resolve_radius(radius, h, w)
    torch.testing.assert_close(
        image.norm(dim=1), torch.full((h * w,), r, dtype=torch.float64), atol=1e-4, rtol=1e-6
    )
    torch.testing.assert_close(
        image.sum(dim=1), torch.zeros(h * w, dtype=torch.float64), atol=1e-4, rtol=0
    )
    text = positions_of(circle, 0, ids[0] != IMAGE)
    assert per_token_distance(text, image + p) <= 1e-5


# --- bad input ----------------------------------------------------------------------------------


def call(ids: torch.Tensor, g: torch.Tensor | None, **kwargs: object) -> None:
    settings_: dict[str, object] = {"spatial_merge_size": MERGE, **IDS, **kwargs}
    circle_rope_position_ids(ids, g, None, **settings_)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rows", "g", "kwargs", "message"),
    [
        ([sequence(TEXT, (1, 4, 4))], ((1, 4, 6),), {}, "should have 6 image tokens"),
        ([sequence(TEXT, (1, 4, 4))], ((1, 4, 4), (1, 4, 4)), {}, "open only 1"),
        ([sequence(TEXT, (1, 4, 4), (1, 4, 4))], ((1, 4, 4),), {}, "more images than"),
        ([[10, IMAGE, IMAGE, 11]], (), {}, "opened by a vision_start"),
        ([sequence(TEXT, (1, 4, 4))], ((1, 4, 5),), {}, "multiples of spatial_merge_size"),
        ([sequence(TEXT, (1, 4, 4))], ((1, 4, 4),), {"alpha": 1.5}, "alpha"),
        ([sequence(TEXT, (1, 4, 4))], ((1, 4, 4),), {"radius": "big"}, "radius 'big'"),
        ([sequence(TEXT, (1, 4, 4))], ((1, 4, 4),), {"radius": "auto-0"}, "positive scale"),
        ([sequence(TEXT, (1, 4, 4))], ((1, 4, 4),), {"radius": -1.0}, ">= 0"),
        ([sequence(TEXT, (1, 4, 4))], ((1, 4, 4),), {"radius": math.inf}, ">= 0"),
    ],
)
def test_bad_input_is_a_clear_error(
    rows: list[list[int]], g: tuple[tuple[int, int, int], ...], kwargs: dict, message: str
) -> None:
    ids, _ = batch(rows)
    with pytest.raises(ValueError, match=message):
        call(ids, grids(*g), **kwargs)


def test_bad_shapes() -> None:
    ids, mask = batch([sequence(TEXT, (1, 4, 4))])
    with pytest.raises(ValueError, match=r"\(batch, length\)"):
        circle_rope_position_ids(ids[0], grids((1, 4, 4)), **IDS)
    with pytest.raises(ValueError, match="does not match"):
        circle_rope_position_ids(ids, grids((1, 4, 4)), mask[:, 1:], **IDS)
    with pytest.raises(ValueError, match=r"\(num_images, 3\)"):
        circle_rope_position_ids(ids, torch.tensor([1, 4, 4]), mask, **IDS)
