"""Contrast proposals (model.measurer.proposals): regions that differ from the tissue around
them, on hand-made planes and on real phantoms prepared as the find step prepares them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ingestion.phantoms import generate_phantom, study_seed
from model.measurer.data import phantom_volume
from model.measurer.find import FindInputs, prepare_for_find
from model.measurer.grouping import GroupedFinding
from model.measurer.proposals import (
    ProposalRule,
    contrast_proposals,
    uncovered,
    window_to_hu,
)
from model.measurer.results import FindingKind

TISSUE, FAT, AIR = 45.0, -100.0, -200.0  # the find step's wide window clips air to -200 HU
SIZE, CENTRE, BODY_RADIUS, RIM = 200, 100.0, 85.0, 12.0


def _planes(
    blobs: list[tuple[float, float, float, float, float]],
    *,
    planes: int = 5,
    noise: float = 20.0,
    seed: int = 0,
) -> np.ndarray:
    """(planes, 200, 200) HU at 1 mm/px: a round body with a fat rim and tissue inside, noise,
    and elliptic blobs (row, column, long semi-axis, short semi-axis, HU) on the middle
    three planes."""
    rows, columns = np.mgrid[0:SIZE, 0:SIZE].astype(float)
    radius = np.hypot(rows - CENTRE, columns - CENTRE)
    plane = np.full((SIZE, SIZE), AIR)
    plane[radius <= BODY_RADIUS] = FAT
    plane[radius <= BODY_RADIUS - RIM] = TISSUE
    out = np.repeat(plane[None], planes, axis=0)
    for r, c, a, b, hu in blobs:
        inside = ((rows - r) / b) ** 2 + ((columns - c) / a) ** 2 <= 1.0
        out[planes // 2 - 1 : planes // 2 + 2, inside] = hu
    body = out > AIR
    out[body] += np.random.default_rng(seed).normal(0.0, noise, int(body.sum()))
    return np.clip(out, AIR, 400.0)


def test_noise_tissue_and_the_fat_rim_propose_nothing() -> None:
    for seed in range(3):
        assert contrast_proposals(_planes([], noise=25.0, seed=seed), 1.0) == []


def test_a_brighter_and_a_darker_lesion_are_proposed_at_their_centres() -> None:
    blobs = [(70.0, 80.0, 8.0, 4.0, TISSUE + 50.0), (130.0, 120.0, 10.0, 6.0, TISSUE - 60.0)]
    found = contrast_proposals(_planes(blobs), 1.0)
    assert len(found) == 2
    dark, bright = found  # largest first
    for proposal, (r, c, a, _, hu) in zip((bright, dark), blobs, strict=True):
        assert math.hypot(proposal.row - r, proposal.column - c) < 1.0
        assert proposal.plane == 2 or proposal.plane in (1, 3)
        assert proposal.planes == (1, 2, 3)
        assert abs(proposal.size_mm - 2 * a) <= 3.0
        assert proposal.contrast_hu == pytest.approx(hu - TISSUE, abs=12.0)
    assert bright.contrast_hu > 0 > dark.contrast_hu


def test_touching_bright_and_dark_lesions_stay_two_proposals() -> None:
    blobs = [(100.0, 88.0, 8.0, 8.0, TISSUE + 80.0), (100.0, 112.0, 8.0, 8.0, TISSUE - 80.0)]
    found = contrast_proposals(_planes(blobs), 1.0)
    assert sorted(round(p.column) for p in found) == [88, 112]


def test_faint_small_and_huge_regions_are_not_proposed() -> None:
    faint = (80.0, 80.0, 10.0, 6.0, TISSUE + 12.0)  # under the threshold
    small = (120.0, 120.0, 1.5, 1.5, TISSUE + 80.0)  # ~7 mm^2: noise-sized
    assert contrast_proposals(_planes([faint, small], noise=8.0), 1.0) == []
    huge = (100.0, 100.0, 40.0, 30.0, TISSUE + 80.0)  # 80 mm across: no finding of the spec
    assert contrast_proposals(_planes([huge]), 1.0, ProposalRule(max_size_mm=75.0)) == []
    assert len(contrast_proposals(_planes([huge]), 1.0, ProposalRule(max_size_mm=90.0))) == 1


def test_a_bright_lesion_inside_the_fat_rim_is_proposed_but_the_rim_is_not() -> None:
    in_rim = (CENTRE, CENTRE + BODY_RADIUS - 6.0, 5.0, 4.0, TISSUE + 60.0)
    (proposal,) = contrast_proposals(_planes([in_rim]), 1.0)
    assert math.hypot(proposal.row - in_rim[0], proposal.column - in_rim[1]) < 1.5


def test_the_largest_proposals_are_kept_first() -> None:
    blobs = [(60.0 + 20 * k, 100.0, 4.0 + k, 4.0, TISSUE + 70.0) for k in range(4)]
    found = contrast_proposals(_planes(blobs), 1.0, ProposalRule(max_proposals=2))
    assert [round(p.row) for p in found] == [120, 100]
    assert contrast_proposals(_planes(blobs), 1.0, ProposalRule(max_proposals=0)) == []


def test_pixel_size_scales_the_millimetre_rules() -> None:
    blob = (100.0, 100.0, 4.0, 2.5, TISSUE + 70.0)  # 31 px^2: 8 mm^2 at 0.5 mm/px
    assert len(contrast_proposals(_planes([blob]), 1.0)) == 1
    assert contrast_proposals(_planes([blob]), 0.5) == []


def test_window_to_hu_inverts_the_window() -> None:
    window = (100.0, 600.0)  # -200..400 HU
    assert window_to_hu([0.0, 0.5, 1.0], window).tolist() == [-200.0, 100.0, 400.0]


@pytest.mark.parametrize(
    ("hu", "pixel_mm", "message"),
    [
        (np.zeros((4, 4)), 1.0, "planes, rows, columns"),
        (np.zeros((1, 4, 4)), float("nan"), "pixel_mm"),
        (np.zeros((1, 4, 4)), 0.0, "pixel_mm"),
    ],
)
def test_bad_input_is_refused_with_the_value_named(
    hu: np.ndarray, pixel_mm: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        contrast_proposals(hu, pixel_mm)


@pytest.mark.parametrize(
    "change",
    [
        {"smooth_mm": 0.0},
        {"min_contrast_hu": float("nan")},
        {"min_area_mm2": -1.0},
        {"rim_margin_mm": -1.0},
        {"max_proposals": -1},
    ],
)
def test_a_rule_outside_its_range_is_refused(change: dict) -> None:
    (name,) = change
    with pytest.raises(ValueError, match=name):
        ProposalRule(**change)


def test_an_empty_or_bodiless_stack_proposes_nothing() -> None:
    assert contrast_proposals(np.zeros((0, 8, 8)), 1.0) == []
    assert contrast_proposals(np.full((2, 8, 8), AIR), 1.0) == []


@pytest.mark.parametrize("index", range(6))
def test_on_real_phantoms_every_finding_is_proposed_and_nothing_else(index: int) -> None:
    """Phantoms prepared as the demo checkpoint's find step prepares them (1 mm/px, planes
    about 2 mm apart): each vessel and each lesion >= 10 mm has a proposal within the spec's
    match radius, and every proposal lies on a finding of the phantom."""
    inputs = FindInputs(pixel_mm=1.0, size=280)
    phantom = generate_phantom(study_seed(9191, index))
    prepared = prepare_for_find(phantom_volume(phantom), inputs)
    stride = max(1, round(2.0 / prepared.geometry.slice_spacing))
    planes = list(range(0, prepared.shape[0], stride))
    hu = window_to_hu(prepared.image[1, planes].numpy(), inputs.wide_window)
    found = contrast_proposals(hu, inputs.pixel_mm)
    centres = [prepared.index_to_lps([planes[p.plane], p.row, p.column]) for p in found]
    on_finding = [False] * len(found)
    for truth in phantom.findings:
        size = truth.long_axis_mm or truth.diameter_mm or 0.0
        near = [
            k
            for k, c in enumerate(centres)
            if math.dist(c[:2], truth.center_lps_mm[:2]) <= max(10.0, size / 2)
        ]
        for k in near:
            on_finding[k] = True
        if truth.kind == "vessel" or size >= 10.0:
            assert near, (index, truth)
    assert all(on_finding), (index, found)


def _candidate(kind: FindingKind, xyz: tuple[float, float, float], size: float) -> GroupedFinding:
    return GroupedFinding(kind, xyz, (0, 1), size)


def test_proposals_a_candidate_covers_are_left_out() -> None:
    lesion, vessel = FindingKind.LESION, FindingKind.VESSEL
    proposals = [
        _candidate(lesion, (0.0, 0.0, 0.0), 12.0),  # on a lesion candidate
        _candidate(lesion, (0.0, 0.0, 40.0), 12.0),  # same place, far along z
        _candidate(lesion, (60.0, 9.0, 90.0), 12.0),  # on the vessel, any z
        _candidate(lesion, (-40.0, 0.0, 0.0), 12.0),  # nothing near
    ]
    candidates = [
        _candidate(lesion, (8.0, 0.0, 4.0), 20.0),
        _candidate(vessel, (60.0, 0.0, 0.0), 30.0),
    ]
    left = uncovered(proposals, candidates, plane_spacing_mm=2.0)
    assert [p.center_lps_mm for p in left] == [(0.0, 0.0, 40.0), (-40.0, 0.0, 0.0)]
    assert uncovered(proposals, [], 2.0) == proposals
