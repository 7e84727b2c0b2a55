"""Shifted find passes: shifting planes and boxes, and the vote that drops one-token-off boxes."""

from __future__ import annotations

import pytest
import torch

from model.measurer.inputs.images import SIDE_MULTIPLE
from model.measurer.inputs.voting import (
    FindVoting,
    agreement_reach,
    is_alias,
    shift_planes,
    unshift_findings,
    vote_boxes,
)
from model.measurer.results import FindingKind
from model.measurer.tasks.text import FoundFinding

LESION, VESSEL = FindingKind.LESION, FindingKind.VESSEL
TOKEN = float(SIDE_MULTIPLE)


def _box(kind: FindingKind, row: float, col: float, side: float = 20.0) -> FoundFinding:
    half = side / 2
    return FoundFinding(kind, 0, (row - half, col - half, row + half, col + half))


def _centres(found: list[FoundFinding]) -> list[tuple[float, float]]:
    return [((f.box[0] + f.box[2]) / 2, (f.box[1] + f.box[3]) / 2) for f in found]


def test_shift_planes_moves_content_and_fills_air() -> None:
    planes = torch.zeros(1, 2, 56, 56)
    planes[0, :, 10, 20] = 1.0
    moved = shift_planes(planes, 14, -5)
    assert moved[0, 0, 24, 15] == 1.0 and moved[0, 1, 24, 15] == 1.0
    assert float(moved.sum()) == 2.0
    assert torch.all(moved[..., :14, :] == 0)  # uncovered rows are air (0)
    assert shift_planes(planes, 0, 0) is planes
    assert float(shift_planes(planes, 60, 0).sum()) == 0.0  # shifted out entirely


def test_unshift_maps_boxes_back_and_drops_boxes_outside() -> None:
    found = [FoundFinding(LESION, 0, (20.0, 30.0, 40.0, 50.0))]
    back = unshift_findings(found, 14, 7)
    assert back[0].box == (6.0, 23.0, 26.0, 43.0)
    assert back[0].kind is LESION
    clipped = unshift_findings([FoundFinding(VESSEL, 0, (5.0, 5.0, 25.0, 25.0))], 14, 0)
    assert clipped[0].box == (0.0, 5.0, 11.0, 25.0)
    assert unshift_findings([FoundFinding(VESSEL, 0, (5.0, 5.0, 12.0, 25.0))], 14, 0) == []


def test_reach_stays_under_half_a_token() -> None:
    assert agreement_reach((0.0, 0.0, 8.0, 8.0)) == 4.0
    assert agreement_reach((0.0, 0.0, 200.0, 200.0)) < TOKEN / 2


def test_alias_is_the_same_box_one_token_off() -> None:
    box = _box(LESION, 100.0, 100.0).box
    assert is_alias(_box(LESION, 100.0 + TOKEN, 100.0).box, box)
    assert is_alias(_box(LESION, 100.0 - TOKEN, 100.0 + TOKEN + 3).box, box)
    assert not is_alias(_box(LESION, 100.0, 100.0).box, box)  # the same place
    assert not is_alias(_box(LESION, 100.0 + 2 * TOKEN, 100.0).box, box)  # two tokens
    assert not is_alias(_box(LESION, 100.0 + TOKEN, 100.0, side=40.0).box, box)  # other size


def test_vote_keeps_agreed_boxes_as_their_median() -> None:
    passes = [
        [_box(LESION, 100.0, 100.0)],
        [_box(LESION, 102.0, 99.0)],
        [_box(LESION, 101.0, 104.0)],
        [],
    ]
    kept = vote_boxes(passes, 2)
    assert _centres(kept) == [(101.0, 100.0)]
    assert vote_boxes(passes, 4) == []


def test_vote_drops_a_one_token_off_box_that_others_outvote() -> None:
    right = [_box(LESION, 100.0, 100.0), _box(LESION, 101.0, 100.0), _box(LESION, 99.0, 101.0)]
    alias = _box(LESION, 100.0 + TOKEN, 100.0)
    passes = [[right[0]], [right[1]], [right[2]], [alias]]
    assert _centres(vote_boxes(passes, 2, keep_unaliased=True)) == [(100.0, 100.0)]


def test_vote_keeps_a_lone_box_that_is_nobody_s_alias_when_asked() -> None:
    lone = _box(LESION, 50.0, 200.0, side=12.0)  # one pass saw a small lesion
    agreed = [_box(VESSEL, 150.0, 150.0), _box(VESSEL, 151.0, 150.0)]
    passes = [[agreed[0], lone], [agreed[1]], [], []]
    assert _centres(vote_boxes(passes, 2)) == [(150.5, 150.0)]
    kept = vote_boxes(passes, 2, keep_unaliased=True)
    assert sorted(_centres(kept)) == [(50.0, 200.0), (150.5, 150.0)]
    # a lesion box does not agree with a vessel box at the same place
    mixed = [[_box(LESION, 80.0, 80.0)], [_box(VESSEL, 80.0, 80.0)]]
    assert vote_boxes(mixed, 2) == []


def test_vote_of_one_pass_is_that_pass() -> None:
    found = [_box(VESSEL, 150.0, 150.0), _box(LESION, 40.0, 60.0)]
    assert sorted(_centres(vote_boxes([found], 1))) == sorted(_centres(found))


def test_find_voting_checks_and_round_trips() -> None:
    voting = FindVoting.half_token(votes=2)
    assert voting.shifts == ((0, 0), (14, 0), (0, 14), (14, 14))
    assert not voting.single and FindVoting().single
    again = FindVoting.from_json(voting.to_json())
    assert again == voting
    with pytest.raises(ValueError, match="smaller than a merged token"):
        FindVoting(((0, 0), (28, 0)))
    with pytest.raises(ValueError, match="votes must be between 1 and"):
        FindVoting(((0, 0), (14, 0)), votes=3)
    with pytest.raises(ValueError, match="must differ"):
        FindVoting(((0, 0), (0, 0)))
    with pytest.raises(ValueError, match="at least one"):
        FindVoting(())
    with pytest.raises(ValueError, match="find_voting must be"):
        FindVoting.from_json([[0, 0]])
