"""Find-task inputs (model.measurer.inputs.find) and their grouping into 3-D findings
(model.measurer.infer.grouping): labels drawn from the truth land where the findings are."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from ingestion.phantoms import Phantom, TruthFinding, generate_phantom
from model.measurer.infer.grouping import (
    Detection,
    GroupedFinding,
    GroupingRule,
    group_detections,
    merge_duplicates,
    merge_groups,
    plane_detections,
)
from model.measurer.inputs.data import encode_example, phantom_volume
from model.measurer.inputs.find import (
    VISIBLE_FRACTION,
    FindInputs,
    find_frames,
    find_planes,
    plane_images,
    plane_labels,
    prepare_find_field,
    with_context,
)
from model.measurer.inputs.images import image_token_count, patchify_frames
from model.measurer.results import FindingKind
from model.measurer.tasks.text import parse_find
from model.measurer.tasks.tokenizer import build_tokenizer, special_ids
from model.numeric.text import to_num_text

INPUTS = FindInputs()


@pytest.fixture(scope="module")
def phantom() -> Phantom:
    return generate_phantom(11)  # two lesions and a vessel, 1 mm slices


@pytest.fixture(scope="module")
def prepared(phantom: Phantom):  # type: ignore[no-untyped-def]
    return prepare_find_field(phantom_volume(phantom), INPUTS)


def test_images_have_a_content_and_a_coordinate_frame(prepared) -> None:  # type: ignore[no-untyped-def]
    images = plane_images(prepared, INPUTS)
    planes = prepared.image.shape[1]
    assert images.shape == (planes, 2, 3, 168, 168)
    content, coords = images[:, 0], images[:, 1]
    torch.testing.assert_close(content[:, 1], 1.0 - content[:, 0])
    assert torch.equal(content[:, 0], prepared.image[0]) and torch.equal(
        content[:, 2], prepared.image[1]
    )
    assert float(coords[0, 0, 0, 0]) == 0.0 and float(coords[0, 0, -1, 0]) == 1.0
    assert float(coords[0, 1, 0, -1]) == 1.0 and torch.all(coords[:, 2] == 0.5)
    still = plane_images(prepared, dataclasses.replace(INPUTS, coordinates=False))
    assert torch.equal(still[:, 0], still[:, 1])


def test_a_plane_is_one_image_of_36_tokens(phantom: Phantom) -> None:
    planes = find_planes(
        phantom_volume(phantom), phantom.findings, INPUTS, np.random.default_rng(0), planes=3
    )
    example = planes[0].example(INPUTS)
    tokenizer = build_tokenizer()
    encoded = encode_example(example, tokenizer)
    assert image_token_count(encoded.image_grid_thw) == 36
    assert encoded.input_ids.count(special_ids(tokenizer)["image"]) == 36
    assert example.answer is not None and parse_find(example.answer, num_images=1).success
    assert len(encoded.num_values) == len(to_num_text(example.answer).values)


def _box_center_lps(prepared, plane: int, box) -> np.ndarray:  # type: ignore[no-untyped-def]
    row0, col0, row1, col1 = box
    index = np.array([plane, (row0 + row1) / 2 - 0.5, (col0 + col1) / 2 - 0.5])
    return prepared.geometry.index_to_lps(index)


def test_labels_put_boxes_around_the_true_cross_sections(phantom: Phantom, prepared) -> None:  # type: ignore[no-untyped-def]
    labels = plane_labels(phantom.findings, prepared)
    assert len(labels) == prepared.image.shape[1]
    pixel = prepared.geometry.row_spacing
    for finding in phantom.findings:
        planes = [
            k
            for k, found in enumerate(labels)
            if any(f.kind.value == finding.kind and _near(f, finding, prepared, k) for f in found)
        ]
        if finding.kind == "vessel":
            assert planes == list(range(len(labels)))  # on every plane
        else:
            assert finding.cc_extent_mm is not None
            z = [float(prepared.geometry.index_to_lps((k, 0, 0))[2]) for k in planes]
            visible = finding.cc_extent_mm * math.sqrt(1 - VISIBLE_FRACTION**2)
            span = max(z) - min(z)
            assert visible - 2 * prepared.geometry.slice_spacing <= span <= visible + 2.5
            assert abs((max(z) + min(z)) / 2 - finding.center_lps_mm[2]) <= 1.0
        k = round(float(prepared.geometry.lps_to_index(finding.center_lps_mm)[0]))
        (box,) = [
            f.box
            for f in labels[k]
            if f.kind.value == finding.kind and _near(f, finding, prepared, k)
        ]
        center = _box_center_lps(prepared, k, box)
        assert np.hypot(*(center[:2] - np.asarray(finding.center_lps_mm[:2]))) < 0.1
        if finding.kind == "vessel":
            assert finding.diameter_mm is not None
            assert (box[2] - box[0]) * pixel == pytest.approx(finding.diameter_mm, abs=0.2)
    for found in labels:  # reading order
        keys = [((f.box[0] + f.box[2]) / 2, (f.box[1] + f.box[3]) / 2) for f in found]
        assert keys == sorted(keys)


def _near(found, finding: TruthFinding, prepared, plane: int) -> bool:  # type: ignore[no-untyped-def]
    center = _box_center_lps(prepared, plane, found.box)
    return bool(np.hypot(*(center[:2] - np.asarray(finding.center_lps_mm[:2]))) < 5.0)


@pytest.mark.parametrize(("rotation", "long_along"), [(0.0, "columns"), (90.0, "rows")])
def test_a_rotated_lesion_box_follows_its_long_axis(
    prepared, rotation: float, long_along: str
) -> None:  # type: ignore[no-untyped-def]
    center = prepared.geometry.index_to_lps((10, 100, 90))
    lesion = TruthFinding(
        kind="lesion",
        center_lps_mm=tuple(center),
        slice_index=10,
        long_axis_mm=30.0,
        short_axis_mm=15.0,
        cc_extent_mm=20.0,
        rotation_deg=rotation,
        contrast_hu=60.0,
    )
    ((found,),) = [plane_labels([lesion], prepared)[10]]
    row0, col0, row1, col1 = found.box
    pixel = prepared.geometry.row_spacing
    rows, columns = (row1 - row0) * pixel, (col1 - col0) * pixel
    long_mm, short_mm = (columns, rows) if long_along == "columns" else (rows, columns)
    assert long_mm == pytest.approx(30.0, abs=0.2) and short_mm == pytest.approx(15.0, abs=0.2)


def test_planes_prefer_lesions_and_are_seeded(phantom: Phantom) -> None:
    volume = phantom_volume(phantom)
    a = find_planes(volume, phantom.findings, INPUTS, np.random.default_rng(4), planes=6)
    b = find_planes(volume, phantom.findings, INPUTS, np.random.default_rng(4), planes=6)
    assert [p.findings for p in a] == [p.findings for p in b]
    assert all(p.windows.dtype == torch.float16 and p.windows.shape == (2, 168, 168) for p in a)
    with_lesion = sum(any(f.kind is FindingKind.LESION for f in p.findings) for p in a)
    assert with_lesion >= 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pixel_mm": 0.0}, "pixel_mm"),
        ({"size": 100}, "multiple of 28"),
        ({"soft_window": (40.0, 0.0)}, "soft_window"),
        ({"context_mm": -1.0}, "context_mm"),
    ],
)
def test_bad_find_inputs(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FindInputs(**kwargs)


# --- grouping ------------------------------------------------------------------------------------


def test_labels_group_back_into_the_true_findings(phantom: Phantom, prepared) -> None:  # type: ignore[no-untyped-def]
    labels = plane_labels(phantom.findings, prepared)
    planes = list(range(len(labels)))
    detections = plane_detections(labels, planes, prepared.geometry)
    grouped = group_detections(detections, prepared.geometry.slice_spacing)
    assert sorted(g.kind.value for g in grouped) == sorted(f.kind for f in phantom.findings)
    for finding in phantom.findings:
        (match,) = [
            g
            for g in grouped
            if g.kind.value == finding.kind
            and np.hypot(
                g.center_lps_mm[0] - finding.center_lps_mm[0],
                g.center_lps_mm[1] - finding.center_lps_mm[1],
            )
            < 0.5
        ]
        if finding.kind == "lesion":
            assert abs(match.center_lps_mm[2] - finding.center_lps_mm[2]) <= 1.0


def _detection(kind: str, plane: int, x: float, size: float = 20.0) -> Detection:
    return Detection(FindingKind(kind), plane, (x, 0.0, plane * 2.0), (size, size))


def test_grouping_links_neighbours_of_one_kind_only() -> None:
    detections = [
        _detection("lesion", 0, 0.0),
        _detection("lesion", 1, 1.0),
        _detection("lesion", 3, 2.0),  # one plane missed: still the same lesion
        _detection("vessel", 1, 0.5),  # another kind at the same place
        _detection("lesion", 1, 40.0),  # far away in-plane
        _detection("lesion", 2, 40.0),
    ]
    grouped = group_detections(detections, 2.0, GroupingRule(min_plane_fraction=0.0))
    shapes = sorted((g.kind.value, g.planes) for g in grouped)
    assert shapes == [("lesion", (0, 1, 3)), ("lesion", (1, 2)), ("vessel", (1,))]
    far = group_detections(
        [_detection("lesion", 0, 0.0), _detection("lesion", 4, 0.0)],
        2.0,
        GroupingRule(min_plane_fraction=0.0),
    )
    assert len(far) == 2  # more than max_plane_gap planes apart


def test_a_large_box_on_one_plane_only_is_dropped_as_noise() -> None:
    # a 40 mm lesion must span >= 0.4 * 40 + 1 = 17 mm: 17 planes at 1 mm
    speck = [_detection("lesion", 5, 0.0, size=40.0)]
    assert group_detections(speck, 1.0) == []
    assert group_detections(speck, 5.0) == []  # it spans >= 21 mm: 4 planes of 5 mm
    small = [_detection("lesion", 5, 0.0, size=10.0)]  # spans >= 9 mm: one or two planes
    assert len(group_detections(small, 5.0)) == 1
    weighted = group_detections(
        [_detection("lesion", 0, 0.0, 10.0), _detection("lesion", 1, 3.0, 30.0)], 5.0
    )
    (only,) = weighted
    assert only.center_lps_mm[0] == pytest.approx(3.0 * 900 / 1000)  # area-weighted


def test_findings_split_along_z_merge_into_the_larger_one() -> None:
    """Same kind, centres together in-plane, z within half the size: one finding (the larger
    box); apart in-plane, too far in z or another kind: kept apart."""
    lesion, vessel = FindingKind.LESION, FindingKind.VESSEL
    big = GroupedFinding(lesion, (0.0, 0.0, -100.0), (3, 4, 5), 40.0)
    split = GroupedFinding(lesion, (2.0, 1.0, -88.0), (9, 10), 30.0)  # 12 mm above: same lesion
    far_z = GroupedFinding(lesion, (0.0, 0.0, -40.0), (30,), 30.0)  # 60 mm away: another
    beside = GroupedFinding(lesion, (30.0, 0.0, -100.0), (4,), 20.0)
    other_kind = GroupedFinding(vessel, (0.0, 0.0, -99.0), (4, 5), 20.0)
    merged = merge_duplicates([split, big, far_z, beside, other_kind], plane_spacing_mm=2.0)
    assert [(f.kind, f.center_lps_mm) for f in merged] == [
        (lesion, (0.0, 0.0, -100.0)),
        (lesion, (30.0, 0.0, -100.0)),
        (lesion, (0.0, 0.0, -40.0)),
        (vessel, (0.0, 0.0, -99.0)),
    ]
    assert merged[0].planes == (3, 4, 5, 9, 10) and merged[0].size_mm == 40.0
    assert merge_duplicates([], 2.0) == []
    # merge_groups says which inputs each merged finding is made of
    groups = merge_groups([split, big, far_z, beside, other_kind], plane_spacing_mm=2.0)
    assert [g for g, _ in groups] == merged
    assert [m for _, m in groups] == [(0, 1), (3,), (2,), (4,)]


def test_a_shifted_plane_moves_its_content_and_its_boxes(phantom: Phantom) -> None:
    volume = phantom_volume(phantom)
    planes = find_planes(volume, phantom.findings, INPUTS, np.random.default_rng(4), planes=6)
    plane = next(p for p in planes if p.findings)
    still, moved = plane.example(INPUTS), plane.example(INPUTS, (9, -5))
    assert torch.equal(moved.images[0, :, 9:, :-5], still.images[0, :, :-9, 5:])
    assert torch.equal(moved.images[1], still.images[1])  # the coordinate frame stays put
    before = parse_find(still.answer or "", num_images=1).findings
    after = parse_find(moved.answer or "", num_images=1).findings
    assert len(after) == len(before)
    by_box = sorted(after, key=lambda f: f.box), sorted(before, key=lambda f: f.box)
    for a, b in zip(*by_box, strict=True):
        assert a.kind is b.kind
        expected = (b.box[0] + 9, max(0.0, b.box[1] - 5), b.box[2] + 9, b.box[3] - 5)
        assert a.box == pytest.approx(expected, abs=0.11)  # the text's 0.1 grid


@dataclasses.dataclass(frozen=True)
class _Finding:
    """A true finding (``TrueFinding``) of a real dataset: a z range of its own."""

    kind: str
    center_lps_mm: tuple[float, float, float]
    long_axis_mm: float | None
    short_axis_mm: float | None
    diameter_mm: float | None
    rotation_deg: float | None
    cc_extent_mm: float | None
    z_range_lps_mm: tuple[float, float] | None
    slice_index: int = 0


def test_training_planes_are_tiles_of_the_whole_field_with_their_labels() -> None:
    """A 220 mm field and 56 mm tiles: each training plane is one tile at a random place, a
    lesion's box is moved into the tile (or left out where most of it lies outside), and a
    finding is labelled only on the planes of its z range."""
    from ingestion.geometry import Geometry
    from ingestion.volume import Volume

    inputs = FindInputs(pixel_mm=1.0, size=56)
    geometry = Geometry(
        (0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (2.0, 1.0, 1.0)
    )
    volume = Volume.in_memory(np.full((10, 220, 220), 40.0, np.float32), geometry)
    lesion = _Finding("lesion", (180.0, 30.0, 10.0), 12.0, 12.0, None, 0.0, 40.0, None)
    short_vessel_z = _Finding(
        "vessel", (40.0, 180.0, 4.0), None, None, 10.0, None, None, (0.0, 6.0)
    )
    planes = find_planes(volume, [lesion, short_vessel_z], inputs, np.random.default_rng(3))
    assert len(planes) == 10
    for k, plane in enumerate(planes):
        assert plane.windows.shape == (2, 56, 56)
        for found in plane.findings:
            row0, col0, row1, col1 = found.box
            assert 0 <= row0 < row1 <= 56 and 0 <= col0 < col1 <= 56
            if found.kind is FindingKind.VESSEL:
                assert k * 2.0 <= 6.0 + 1.0  # only planes within its z range (+ half a slab)
    rng = np.random.default_rng(4)
    seen = 0
    for _ in range(30):
        for plane in find_planes(volume, [lesion], inputs, rng, planes=2):
            seen += any(f.kind is FindingKind.LESION for f in plane.findings)
    assert seen > 0  # the lesion, 180 mm from the field's edge, is seen in some tiles


def test_context_planes_ride_with_each_plane_and_become_a_second_temporal_patch() -> None:
    """With context_mm, a plane carries the windows of the planes nearest context_mm below and
    above (clamped at the ends); its image has four frames, twice the tokens of a still one."""
    from ingestion.geometry import Geometry
    from ingestion.volume import Volume

    planes = torch.arange(5, dtype=torch.float32).view(5, 1, 1, 1).expand(5, 2, 56, 56) / 10
    context = with_context(planes, 2)  # (5, 6, 56, 56)
    assert context.shape == (5, 6, 56, 56)
    assert [round(float(context[k, 2, 0, 0]) * 10) for k in range(5)] == [0, 0, 0, 1, 2]
    assert [round(float(context[k, 4, 0, 0]) * 10) for k in range(5)] == [2, 3, 4, 4, 4]
    assert with_context(planes, 0) is planes
    with pytest.raises(ValueError, match="offset"):
        with_context(planes, -1)

    inputs = FindInputs(pixel_mm=1.0, size=56, context_mm=4.0)
    assert inputs.windows == 6 and inputs.context_planes(2.0) == 2
    assert inputs.context_planes(5.0) == 1 and FindInputs().context_planes(2.0) == 0
    with pytest.raises(ValueError, match=r"\(S, 6, H, W\) for context_mm 4"):
        find_frames(planes, inputs)
    images = find_frames(context, inputs)
    assert images.shape == (5, 4, 3, 56, 56)
    soft_below = context[:, 2, 0, 0]
    assert torch.equal(images[:, 2, 0, 0, 0], soft_below)  # frame 2: the plane below
    assert torch.equal(images[:, 3, 2, 0, 0], context[:, 5, 0, 0])  # frame 3: above, wide
    _, still_grid = patchify_frames(find_frames(planes, FindInputs(size=56)))
    _, grid = patchify_frames(images)
    assert image_token_count(grid) == 2 * image_token_count(still_grid)

    # training planes: the same layout, from the planes of the whole field
    geometry = Geometry(
        (0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (2.0, 1.0, 1.0)
    )
    voxels = np.stack([np.full((60, 60), -100.0 + 40.0 * k, np.float32) for k in range(6)])
    volume = Volume.in_memory(voxels, geometry)
    prepared = prepare_find_field(volume, inputs)  # as find_planes prepares it
    trained = find_planes(volume, [], inputs, np.random.default_rng(0))
    assert len(trained) == 6
    for k, plane in enumerate(trained):
        assert plane.windows.shape == (6, 56, 56)
        for slot, source in enumerate((k, max(0, k - 2), min(5, k + 2))):
            expected = prepared.image[:, source, 10, 10].to(torch.float16)
            assert torch.equal(plane.windows[2 * slot : 2 * slot + 2, 10, 10], expected)
        assert plane.example(inputs).images.shape == (4, 3, 56, 56)
