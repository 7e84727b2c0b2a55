"""``app.measuring.measure_at_and_store`` (``radcaliper measure --at``): the answers at clicked
points are one run of their own, stored once per model, input and points (in order), never taken
for the whole study's run; a model error at one point leaves the others answered; nothing is
stored when no point was answered. Real stores (SQLite and PostgreSQL); the model is a stand-in
that answers from the phantom's truth (what is tested is the storing, not the model)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import select

from app.measuring import (
    NOTHING_HERE,
    Point,
    clicks_identity,
    measure_at_and_store,
    run_identity,
    store_measured,
)
from db.engine import Store
from db.models import Run
from db.store import input_fingerprint
from ingestion.errors import ModelError
from ingestion.volume import Volume
from model.measurer.results import (
    FindingKind,
    Measurement,
    MeasurementName,
    ModelInfo,
    StudyFinding,
    StudyResult,
)

from tests.support.db import make_result

NOW = datetime.now(UTC)

A: Point = (1.0, 2.0, 3.0)
B: Point = (-4.5, 6.0, 7.25)
C: Point = (8.0, -9.0, 10.0)


class _Clicks:
    """A measurer that answers a lesion (with its caliper) at ``lesions``, fails at ``failing``
    and sees nothing elsewhere."""

    info = ModelInfo("radcaliper-test", "1.0.0", "rned_corr")
    checkpoint_hash = "c" * 64

    def __init__(self, lesions: Sequence[Point], failing: Sequence[Point] = ()) -> None:
        self.lesions, self.failing = list(lesions), list(failing)

    def measure(self, volume: Volume, *, source: str) -> StudyResult:
        raise AssertionError("measure --at never measures the whole study")

    def measure_at(self, volume: Volume, point_lps_mm: Point) -> StudyFinding | None:
        if point_lps_mm in self.failing:
            raise ModelError("the model's answer at this point was malformed")
        if point_lps_mm not in self.lesions:
            return None
        x, y, z = point_lps_mm
        long_axis = ((x - 5, y, z), (x + 5, y, z))
        short_axis = ((x, y - 3, z), (x, y + 3, z))
        return StudyFinding(
            1,
            FindingKind.LESION,
            point_lps_mm,
            2,
            (
                Measurement(MeasurementName.LONG_AXIS, 10.0, (9.0, 11.0), 0.9),
                Measurement(MeasurementName.SHORT_AXIS, 6.0, (5.0, 7.0), 0.9),
            ),
            (long_axis, short_axis),
        )


def _runs(store: Store) -> list[Run]:
    with store.reader() as session:
        return list(session.execute(select(Run).order_by(Run.id)).scalars())


def test_clicks_are_a_run_of_their_own_stored_once(store: Store, volume: Volume) -> None:
    measurer = _Clicks([A, C])
    first = measure_at_and_store(measurer, volume, [A, B, C], source="s", store=store, actor="t")
    assert [(c.at_lps_mm, c.finding_id) for c in first.clicks] == [(A, 1), (B, None), (C, 2)]
    assert first.clicks[1].nothing_measurable == (
        f"{NOTHING_HERE}: the model sees no lesion or vessel at this point"
    )
    assert [f.id for f in first.result.findings] == [1, 2] and first.answered == 3
    assert first.stored is not None and first.stored.created

    again = measure_at_and_store(measurer, volume, [A, B, C], source="s", store=store, actor="t")
    assert again.stored is not None and not again.stored.created
    assert again.stored.run_id == first.stored.run_id
    reordered = measure_at_and_store(
        measurer, volume, [C, B, A], source="s", store=store, actor="t"
    )
    assert reordered.stored is not None and reordered.stored.created
    whole = store_measured(
        store, measurer, make_result(volume), volume, started_at=NOW, actor="t", pseudonym_key=None
    )
    assert whole.created  # the whole study's run is not the clicks' run

    runs = _runs(store)
    assert [r.id for r in runs] == [
        first.stored.run_id,
        reordered.stored.run_id,
        whole.run_id,
    ]
    clicked = runs[0]
    assert clicked.settings == {
        "inference": "at",
        "at_lps_mm": [list(A), list(B), list(C)],
        "volume_fingerprint": input_fingerprint(volume),
    }
    assert clicked.warnings == {
        "warnings": [
            f"point 2 at (-4.5, 6.0, 7.2) mm: {NOTHING_HERE}: the model sees no lesion or "
            "vessel at this point"
        ]
    }
    assert runs[2].input_fingerprint == input_fingerprint(volume)
    with store.reader() as session:
        stored = session.get(Run, clicked.id)
        assert stored is not None
        findings = sorted(stored.findings, key=lambda f: f.number)
        assert [(f.number, f.center_x_mm) for f in findings] == [(1, A[0]), (2, C[0])]
        for finding, answer in zip(findings, first.result.findings, strict=True):
            assert answer.axes_lps_mm is not None
            assert finding.axes_lps_mm == {
                "segments": [[list(p) for p in segment] for segment in answer.axes_lps_mm]
            }
            values = sorted((m.name, m.value_mm) for m in finding.measurements)
            assert values == [("long_axis", 10.0), ("short_axis", 6.0)]


def test_a_model_error_at_one_point_leaves_the_others_answered(
    store: Store, volume: Volume
) -> None:
    measurer = _Clicks([A, C], failing=[B])
    measured = measure_at_and_store(measurer, volume, [A, B, C], source="s", store=store, actor="t")
    assert [c.finding_id for c in measured.clicks] == [1, None, 2] and measured.answered == 2
    assert measured.clicks[1].nothing_measurable == (
        f"{NOTHING_HERE}: the model's answer at this point was malformed"
    )
    assert measured.stored is not None and measured.stored.created

    failing = _Clicks([], failing=[A, B])
    none = measure_at_and_store(failing, volume, [A, B], source="s", store=store, actor="t")
    assert none.answered == 0 and none.stored is None and none.result.findings == ()
    assert all(c.nothing_measurable for c in none.clicks)
    assert len(_runs(store)) == 1  # nothing stored for points the model answered at none of


def test_the_identity_of_clicks_names_the_points_in_order(volume: Volume) -> None:
    fingerprint = input_fingerprint(volume)
    measurer = _Clicks([])
    one = clicks_identity(measurer, fingerprint, [A, B])
    assert one == clicks_identity(measurer, fingerprint, [(1, 2, 3), B])  # the same numbers
    others = [
        clicks_identity(measurer, fingerprint, [B, A]),
        clicks_identity(measurer, fingerprint, [A]),
        clicks_identity(measurer, fingerprint, [A, (B[0], B[1], math.nextafter(B[2], 99))]),
        clicks_identity(measurer, "0" * 64, [A, B]),
        run_identity(measurer, fingerprint),
    ]
    prints = {one.input_fingerprint} | {o.input_fingerprint for o in others}
    assert len(prints) == 1 + len(others)
    assert all(len(p) == 64 for p in prints)  # fits the runs table's column
