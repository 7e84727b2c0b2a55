"""One report per object: vessel pieces and lesion duplicates are dropped, neighbours are kept."""

from __future__ import annotations

import dataclasses

import pytest

from model.measurer.consolidate import (
    AIR_MAX_HU,
    TUBE_MIN_HU,
    VESSEL_MIN_HU,
    centred_in_air,
    consolidate,
    is_tube,
    long_lesions_as_vessels,
    short_vessels_as_lesions,
)
from model.measurer.grouping import GroupedFinding
from model.measurer.inference import MeasureOutcome
from model.measurer.results import MEASUREMENTS_OF, FindingKind, Measurement, Segment3

LESION, VESSEL = FindingKind.LESION, FindingKind.VESSEL
EXAMINED = 20  # planes the find step examined


def _found(
    kind: FindingKind, xyz: tuple[float, float, float], planes: int = 3, size: float = 20.0
) -> GroupedFinding:
    return GroupedFinding(kind, xyz, tuple(range(planes)), size)


def _measured(kind: FindingKind, *values: float | None) -> MeasureOutcome:
    names = MEASUREMENTS_OF[kind]
    if values[0] is None:
        return MeasureOutcome(
            tuple(Measurement.not_measurable(n, "malformed") for n in names), "?", False
        )
    return MeasureOutcome(
        tuple(Measurement(n, v) for n, v in zip(names, values, strict=True)), "", True
    )


def test_vessel_pieces_along_z_are_one_vessel_seen_on_the_most_planes() -> None:
    findings = [
        _found(VESSEL, (10.0, 10.0, 0.0), planes=4),
        _found(VESSEL, (11.0, 9.0, 60.0), planes=12),
        _found(VESSEL, (12.0, 10.0, -40.0), planes=2),
    ]
    outcomes = [_measured(VESSEL, 24.0), _measured(VESSEL, 25.0), _measured(VESSEL, 23.0)]
    assert consolidate(findings, outcomes, EXAMINED) == [1]


def test_two_vessels_side_by_side_are_both_kept() -> None:
    findings = [_found(VESSEL, (0.0, 0.0, 0.0)), _found(VESSEL, (30.0, 0.0, 0.0))]
    outcomes = [_measured(VESSEL, 20.0), _measured(VESSEL, 20.0)]  # 30 mm apart > 10 mm
    assert consolidate(findings, outcomes, EXAMINED) == [0, 1]


def test_a_lesion_inside_a_larger_one_is_the_same_lesion() -> None:
    findings = [
        _found(LESION, (0.0, 0.0, 0.0)),  # the big one, measured 58 x 44 mm
        _found(LESION, (12.0, 0.0, 2.0)),  # its centre 12 mm off: inside (< 22 mm)
        _found(LESION, (60.0, 0.0, 0.0)),  # another lesion
    ]
    outcomes = [
        _measured(LESION, 58.0, 44.0),
        _measured(LESION, 30.0, 20.0),
        _measured(LESION, 12.0, 8.0),
    ]
    assert consolidate(findings, outcomes, EXAMINED) == [0, 2]
    # the order of the reports does not matter: the longer one is kept
    assert consolidate(findings[::-1], outcomes[::-1], EXAMINED) == [0, 2]


@pytest.mark.parametrize(
    ("second", "why"),
    [
        ((25.0, 0.0, 0.0), "outside the cross-section (25 >= 22 mm)"),
        ((5.0, 0.0, 20.0), "stacked along z (20 >= 0.3 x 58 mm)"),
    ],
)
def test_lesions_that_can_both_exist_are_kept(second: tuple[float, float, float], why: str) -> None:
    findings = [_found(LESION, (0.0, 0.0, 0.0)), _found(LESION, second)]
    outcomes = [_measured(LESION, 58.0, 44.0), _measured(LESION, 14.0, 9.0)]
    assert consolidate(findings, outcomes, EXAMINED) == [0, 1], why


def test_a_lesion_next_to_a_vessel_is_not_touched() -> None:
    findings = [_found(VESSEL, (0.0, 0.0, 0.0)), _found(LESION, (20.0, 0.0, 0.0))]
    outcomes = [_measured(VESSEL, 30.0), _measured(LESION, 10.0, 6.0)]  # 20 mm >= 15 mm
    assert consolidate(findings, outcomes, EXAMINED) == [0, 1]


def test_a_lesion_inside_a_vessel_through_the_study_is_a_piece_of_it() -> None:
    outcomes = [_measured(VESSEL, 30.0), _measured(LESION, 28.0, 25.0)]
    # a vessel seen on 10 of 20 planes, a "lesion" 4 mm from its axis: the vessel alone
    findings = [_found(VESSEL, (0.0, 0.0, 0.0), planes=10), _found(LESION, (4.0, 0.0, 0.0))]
    assert consolidate(findings, outcomes, EXAMINED) == [0]
    # a "vessel" on 9 of 20 planes may be a lesion seen as a vessel: both are kept
    findings = [_found(VESSEL, (0.0, 0.0, 0.0), planes=9), _found(LESION, (4.0, 0.0, 0.0))]
    assert consolidate(findings, outcomes, EXAMINED) == [0, 1]


def test_not_measurable_findings_use_their_box_size() -> None:
    findings = [
        _found(LESION, (0.0, 0.0, 0.0), size=40.0),
        _found(LESION, (10.0, 0.0, 0.0), size=15.0),
    ]
    outcomes = [_measured(LESION, None), _measured(LESION, 15.0, 10.0)]
    # 40 mm box: half of it (20 mm) stands in for half the short axis; 10 mm is inside
    assert consolidate(findings, outcomes, EXAMINED) == [0]


def test_findings_and_outcomes_must_pair_up() -> None:
    with pytest.raises(ValueError, match="2 findings but 1 outcomes"):
        consolidate(
            [_found(LESION, (0, 0, 0)), _found(LESION, (9, 9, 9))], [_measured(LESION, 9, 5)], 9
        )


def test_a_contrast_filled_lesion_inside_a_short_vessel_is_a_piece_of_it() -> None:
    outcomes = [_measured(VESSEL, 30.0), _measured(LESION, 28.0, 25.0)]
    findings = [_found(VESSEL, (0.0, 0.0, 0.0), planes=9), _found(LESION, (4.0, 0.0, 0.0))]
    # the "lesion" is as dense as a vessel: a piece of the vessel, whatever the vessel's planes
    assert consolidate(findings, outcomes, EXAMINED, [250.0, VESSEL_MIN_HU]) == [0]
    # below the vessels' HU it may be a lesion: kept (the vessel's own HU does not matter)
    assert consolidate(findings, outcomes, EXAMINED, [250.0, VESSEL_MIN_HU - 1]) == [0, 1]
    # a dense lesion next to (not inside) a vessel is kept
    apart = [findings[0], _found(LESION, (20.0, 0.0, 0.0))]
    assert consolidate(apart, outcomes, EXAMINED, [250.0, 260.0]) == [0, 1]


def test_a_tube_is_contrast_filled_on_nearly_every_slice() -> None:
    soft, filled = 45.0, TUBE_MIN_HU
    assert is_tube([filled] * 10)
    assert is_tube([filled] * 8 + [soft] * 2)  # a centre a few mm off on some slices
    assert not is_tube([filled] * 7 + [soft] * 3)  # a lesion spans part of the study
    assert not is_tube([TUBE_MIN_HU - 1] * 10)  # a lesion's interior, however long
    assert is_tube([60.0] * 10, min_hu=50.0)
    with pytest.raises(ValueError, match="at least one slice"):
        is_tube([])


def test_with_tubes_a_lesion_inside_a_vessel_is_dropped_only_where_a_centre_is_a_tube() -> None:
    # a hyperdense lesion (160 HU) that the find step also saw as a "vessel" at its centre
    findings = [_found(VESSEL, (0.0, 0.0, 0.0), planes=9), _found(LESION, (2.0, 0.0, 0.0))]
    outcomes = [_measured(VESSEL, 30.0), _measured(LESION, 36.0, 33.0)]
    hu = [160.0, 160.0]
    assert consolidate(findings, outcomes, EXAMINED, hu) == [0]  # without tubes: dropped
    assert consolidate(findings, outcomes, EXAMINED, hu, tubes=[False, False]) == [0, 1]
    # the vessel's centre (or the lesion's) contrast-filled through the study: a piece of it
    assert consolidate(findings, outcomes, EXAMINED, hu, tubes=[True, False]) == [0]
    assert consolidate(findings, outcomes, EXAMINED, hu, tubes=[False, True]) == [0]
    # tubes alone decide: a vessel seen on every plane does not make a lesion a piece of it
    everywhere = [_found(VESSEL, (0.0, 0.0, 0.0), planes=EXAMINED), findings[1]]
    assert consolidate(everywhere, outcomes, EXAMINED, [120.0, 120.0]) == [0]
    assert consolidate(everywhere, outcomes, EXAMINED, tubes=[False, False]) == [0, 1]
    with pytest.raises(ValueError, match="2 findings but 1 tube flags"):
        consolidate(findings, outcomes, EXAMINED, tubes=[True])


def test_with_tubes_a_vessel_is_a_lesion_exactly_when_its_centre_is_no_tube() -> None:
    findings = [
        _found(VESSEL, (0.0, 0.0, 0.0), planes=EXAMINED),  # seen everywhere, but no tube
        _found(VESSEL, (80.0, 0.0, 0.0), planes=2),  # seen on 2 planes, but a tube
        _found(LESION, (50.0, 50.0, 0.0)),  # lesions stay lesions
    ]
    hu = [60.0, 60.0, 60.0]
    out = short_vessels_as_lesions(findings, EXAMINED, hu, tubes=[False, True, True])
    assert [f.kind for f in out] == [LESION, VESSEL, LESION]
    assert [f.planes for f in out] == [f.planes for f in findings]
    # without tubes the planes and the centre HU decide as before
    assert [f.kind for f in short_vessels_as_lesions(findings, EXAMINED, hu)] == [
        VESSEL,
        LESION,
        LESION,
    ]
    with pytest.raises(ValueError, match="3 findings but 2 tube flags"):
        short_vessels_as_lesions(findings, EXAMINED, hu, tubes=[True, True])


def test_centre_hu_must_pair_up() -> None:
    with pytest.raises(ValueError, match="1 findings but 2 centre HU values"):
        consolidate([_found(LESION, (0, 0, 0))], [_measured(LESION, 9, 5)], 9, [1.0, 2.0])
    with pytest.raises(ValueError, match="1 findings but 0 centre HU values"):
        short_vessels_as_lesions([_found(VESSEL, (0, 0, 0))], 9, [])


def test_a_short_vessel_that_is_not_contrast_filled_is_a_lesion() -> None:
    findings = [
        _found(VESSEL, (0.0, 0.0, 0.0), planes=9),  # 9 of 20 planes, 60 HU: a lesion
        _found(VESSEL, (80.0, 0.0, 0.0), planes=9),  # 9 of 20 planes but 220 HU: a vessel
        _found(VESSEL, (0.0, 80.0, 0.0), planes=10),  # half the planes: a vessel
        _found(LESION, (50.0, 50.0, 0.0)),
    ]
    out = short_vessels_as_lesions(findings, EXAMINED, [60.0, 220.0, 60.0, 40.0])
    assert [f.kind for f in out] == [LESION, VESSEL, VESSEL, LESION]
    assert [f.center_lps_mm for f in out] == [f.center_lps_mm for f in findings]
    assert out[0].planes == findings[0].planes and out[0].size_mm == findings[0].size_mm
    # without HU values, the planes alone decide
    no_hu = short_vessels_as_lesions(findings, EXAMINED)
    assert [f.kind for f in no_hu] == [LESION, LESION, VESSEL, LESION]


def test_vessel_pieces_count_together() -> None:
    # two pieces of one vessel at the same place, 6 + 6 planes of 20 (different planes): a vessel
    a = GroupedFinding(VESSEL, (0.0, 0.0, -30.0), tuple(range(6)), 24.0)
    b = GroupedFinding(VESSEL, (3.0, 0.0, 30.0), tuple(range(14, 20)), 24.0)
    assert [f.kind for f in short_vessels_as_lesions([a, b], EXAMINED, [60.0, 60.0])] == [
        VESSEL,
        VESSEL,
    ]
    # the same pieces 40 mm apart are two short "vessels": lesions
    far = GroupedFinding(VESSEL, (40.0, 0.0, 30.0), b.planes, 24.0)
    assert [f.kind for f in short_vessels_as_lesions([a, far], EXAMINED, [60.0, 60.0])] == [
        LESION,
        LESION,
    ]


def _axes_along(dx: float, dy: float, long: float, short: float) -> tuple[Segment3, ...]:
    """Axes through the origin, the long one along (dx, dy)."""
    n = (dx * dx + dy * dy) ** 0.5
    ux, uy = dx / n, dy / n
    a, b = long / 2, short / 2
    return (
        ((-a * ux, -a * uy, 0.0), (a * ux, a * uy, 0.0)),
        ((b * uy, -b * ux, 0.0), (-b * uy, b * ux, 0.0)),
    )


def test_a_report_inside_the_measured_ellipse_is_the_same_lesion() -> None:
    """A 40 x 12 mm lesion along x: a second report 15 mm along its long axis is inside it
    (the disk of the short axis, 6 mm, would keep it); one 15 mm across it is another lesion."""
    big = _found(LESION, (0.0, 0.0, 0.0))
    along, across = _found(LESION, (15.0, 0.0, 1.0)), _found(LESION, (0.0, 15.0, 1.0))
    outcomes = [_measured(LESION, 40.0, 12.0), _measured(LESION, 20.0, 10.0)]
    axes = [_axes_along(1.0, 0.0, 40.0, 12.0), _axes_along(1.0, 0.0, 20.0, 10.0)]
    assert consolidate([big, along], outcomes, EXAMINED, axes=axes) == [0]
    assert consolidate([big, along], outcomes, EXAMINED) == [0, 1]  # no axes: the disk
    assert consolidate([big, across], outcomes, EXAMINED, axes=axes) == [0, 1]
    # the same along a diagonal long axis
    diagonal = [_axes_along(1.0, 1.0, 40.0, 12.0), axes[1]]
    on_it = _found(LESION, (10.0, 10.0, 0.0))  # 14 mm along the axis
    assert consolidate([big, on_it], outcomes, EXAMINED, axes=diagonal) == [0]
    off_it = _found(LESION, (10.0, -10.0, 0.0))  # 14 mm across it
    assert consolidate([big, off_it], outcomes, EXAMINED, axes=diagonal) == [0, 1]
    # a report stacked along z beyond 0.3 x the long axis (12 mm) is kept
    stacked = _found(LESION, (15.0, 0.0, 13.0))
    assert consolidate([big, stacked], outcomes, EXAMINED, axes=axes) == [0, 1]
    with pytest.raises(ValueError, match="2 findings but 1 axes"):
        consolidate([big, along], outcomes, EXAMINED, axes=axes[:1])


def test_a_contrast_filled_tube_called_a_lesion_is_a_vessel() -> None:
    tube = GroupedFinding(LESION, (0.0, 0.0, 0.0), tuple(range(20)), 25.0)  # 40 mm along z
    lesion = GroupedFinding(LESION, (60.0, 0.0, 0.0), tuple(range(4, 12)), 25.0)
    squat = GroupedFinding(LESION, (0.0, 60.0, 0.0), tuple(range(20)), 30.0)  # 40 < 1.5 x 30
    out = long_lesions_as_vessels([tube, lesion, squat], EXAMINED, 2.0, [220.0, 220.0, 220.0])
    assert [f.kind for f in out] == [VESSEL, LESION, LESION]
    assert out[0].center_lps_mm == tube.center_lps_mm and out[0].planes == tube.planes
    # not contrast-filled: stays a lesion
    assert long_lesions_as_vessels([tube], EXAMINED, 2.0, [VESSEL_MIN_HU - 1])[0].kind is LESION
    # a vessel stays a vessel
    vessel = dataclasses.replace(tube, kind=VESSEL)
    assert long_lesions_as_vessels([vessel], EXAMINED, 2.0, [60.0])[0].kind is VESSEL


def test_air_centred_findings_are_flagged() -> None:
    assert centred_in_air([-1000.0, -100.0, 40.0, AIR_MAX_HU - 1, AIR_MAX_HU]) == [
        True,
        False,
        False,
        True,
        False,
    ]
