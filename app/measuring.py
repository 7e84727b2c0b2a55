"""Measuring one series and storing the result: what ``radcaliper measure``, ``radcaliper
batch`` and the UI's upload share (one transaction per series, or per study for batch; storing
is idempotent). ``radcaliper measure --at`` measures at clicked points instead
(:func:`measure_at_and_store`): a run of its own, whose identity includes the points.

The store's modules (SQLAlchemy) are imported by the functions that store: ``radcaliper measure
--no-store`` does not import them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from app.report import JSONValue
    from db.engine import Store
    from db.store import RunIdentity, StoreOutcome
    from ingestion.volume import Volume
    from model.measurer.protocol import Measurer
    from model.measurer.results import ModelInfo, StudyFinding, StudyResult

__all__ = [
    "NOTHING_HERE",
    "RUN_SETTINGS",
    "Click",
    "Measured",
    "MeasuredClicks",
    "NamedModel",
    "Point",
    "clicks_identity",
    "measure_and_store",
    "measure_at_and_store",
    "run_identity",
    "store_measured",
    "store_study",
]

logger = logging.getLogger(__name__)

# What a stored run records as its settings; part of no identity check (see db.store.find_run).
RUN_SETTINGS = {"inference": "default"}

#: how a click's answer begins when no finding was measured there
NOTHING_HERE = "nothing measurable here"

Point = tuple[float, float, float]  # LPS mm


@dataclass(frozen=True)
class Measured:
    result: StudyResult
    stored: StoreOutcome | None  # None: not stored (no store given)


class NamedModel(Protocol):
    """What names a stored run's model: a batch skips the studies stored before by it.
    a measurer (``model.measurer.protocol.Measurer``), ``app.batch.measure.DeferredMeasurer``
    or ``app.batch.ray_engine.ModelIdentity``."""

    @property
    def info(self) -> ModelInfo: ...

    @property
    def checkpoint_hash(self) -> str: ...


def run_identity(measurer: NamedModel, fingerprint: str) -> RunIdentity:
    """The identity of ``measurer``'s run on an input with this fingerprint."""
    from db.store import RunIdentity

    return RunIdentity(
        checkpoint_hash=measurer.checkpoint_hash,
        input_fingerprint=fingerprint,
        settings=dict(RUN_SETTINGS),
    )


def store_study(
    store: Store,
    measurer: Measurer,
    measured: Sequence[tuple[StudyResult, Volume, str]],
    *,
    started_at: datetime,
    actor: str,
    pseudonym_key: str | None,
) -> list[StoreOutcome]:
    """Store the results of one study's series, ``(result, volume, input fingerprint)`` each,
    in one transaction: all of them or (on an error) none. Idempotent per series."""
    from db.store import store_result

    with store.writer() as session:
        outcomes = [
            store_result(
                session,
                result,
                volume,
                run_identity(measurer, fingerprint),
                actor=actor,
                started_at=started_at,
                pseudonym_key=pseudonym_key,
            )
            for result, volume, fingerprint in measured
        ]
        session.commit()
    return outcomes


def store_measured(
    store: Store,
    measurer: Measurer,
    result: StudyResult,
    volume: Volume,
    *,
    started_at: datetime,
    actor: str,
    pseudonym_key: str | None,
) -> StoreOutcome:
    """Store a result the measurer made from ``volume`` (idempotent)."""
    from db.store import input_fingerprint

    measured = [(result, volume, input_fingerprint(volume))]
    (outcome,) = store_study(
        store,
        measurer,
        measured,
        started_at=started_at,
        actor=actor,
        pseudonym_key=pseudonym_key,
    )
    return outcome


def measure_and_store(
    measurer: Measurer,
    volume: Volume,
    *,
    source: str,
    store: Store | None,
    actor: str,
    pseudonym_key: str | None = None,
) -> Measured:
    """Measure ``volume`` (``ModelError`` when the model refuses it) and store the result."""
    started = datetime.now(UTC)
    result = measurer.measure(volume, source=source)
    if store is None:
        return Measured(result, None)
    outcome = store_measured(
        store,
        measurer,
        result,
        volume,
        started_at=started,
        actor=actor,
        pseudonym_key=pseudonym_key,
    )
    return Measured(result, outcome)


# --- measuring at clicked points (``radcaliper measure --at``) -----------------------------------


@dataclass(frozen=True)
class Click:
    """One clicked point's answer: the finding measured there (its id in the result), or why
    nothing was (``NOTHING_HERE``: the reason)."""

    at_lps_mm: Point
    finding_id: int | None
    nothing_measurable: str | None

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "at_lps_mm": list(self.at_lps_mm),
            "finding_id": self.finding_id,
            "nothing_measurable": self.nothing_measurable,
        }


@dataclass(frozen=True)
class MeasuredClicks:
    """The answers at clicked points: a result whose findings are the clicks' findings in click
    order, one :class:`Click` per point, and the stored run (None: not stored: no store, or
    no click was answered)."""

    result: StudyResult
    clicks: tuple[Click, ...]
    stored: StoreOutcome | None
    answered: int  # clicks the model answered (a finding, or nothing there); the rest failed


def clicks_identity(measurer: NamedModel, fingerprint: str, points: Sequence[Point]) -> RunIdentity:
    """The identity of ``measurer``'s run at ``points`` (in this order) on an input with this
    fingerprint: its own input fingerprint (sha256 of the input's and the points), so that it is
    neither the run of the whole study nor one at other points, and the same clicks are stored
    once per model and input. Its settings name the points and the input's fingerprint."""
    from db.queries import CLICKED
    from db.store import RunIdentity

    at = [[float(c) for c in point] for point in points]
    digest = hashlib.sha256(b"radcaliper measure --at\0")
    digest.update(fingerprint.encode())
    digest.update(json.dumps(at).encode())  # repr of each float: exact
    return RunIdentity(
        checkpoint_hash=measurer.checkpoint_hash,
        input_fingerprint=digest.hexdigest(),
        settings={"inference": CLICKED, "at_lps_mm": at, "volume_fingerprint": fingerprint},
    )


def _answer_at(
    measurer: Measurer, volume: Volume, point: Point
) -> tuple[StudyFinding | None, str | None, bool]:
    """The finding at ``point`` or the reason there is none, and whether the model answered
    (False: it failed with a ``ModelError``)."""
    from ingestion.errors import ModelError

    try:
        finding = measurer.measure_at(volume, point)
    except ModelError as exc:
        logger.warning("nothing measured at %s: %s", point, exc)
        return None, f"{NOTHING_HERE}: {exc}", False
    if finding is None:
        return None, f"{NOTHING_HERE}: the model sees no lesion or vessel at this point", True
    return finding, None, True


def measure_at_and_store(
    measurer: Measurer,
    volume: Volume,
    points: Sequence[Point],
    *,
    source: str,
    store: Store | None,
    actor: str,
    pseudonym_key: str | None = None,
) -> MeasuredClicks:
    """Measure ``volume`` at each of ``points`` (LPS mm, inside the volume) and store the
    answers as one run (:func:`clicks_identity`), unless no click was answered.

    A click where the model fails (``ModelError``) is not measurable with the reason; the others
    still answer. The result's findings are the clicks' findings, numbered in click order; the
    stored run also names the clicks with nothing measurable, with the reason, in its warnings
    (and the points in its settings).
    """
    from model.measurer.results import StudyResult, renumber

    started = datetime.now(UTC)
    findings: list[StudyFinding] = []
    answers: list[tuple[Point, int | None, str | None]] = []
    answered = 0
    for point in points:
        finding, nothing, ok = _answer_at(measurer, volume, point)
        answered += ok
        if finding is not None:
            findings.append(finding)
        answers.append((point, len(findings) if finding is not None else None, nothing))
    clicks = tuple(Click(point, number, nothing) for point, number, nothing in answers)
    identifiers = volume.identifiers
    result = StudyResult(
        study_instance_uid=identifiers.study_instance_uid,
        series_instance_uid=identifiers.series_instance_uid,
        patient_id=identifiers.patient_id or "",
        source=source,
        model=measurer.info,
        findings=renumber(findings),
    )
    if store is None or not answered:
        return MeasuredClicks(result, clicks, None, answered)
    from db.store import input_fingerprint, store_result

    identity = clicks_identity(measurer, input_fingerprint(volume), points)
    unanswered = tuple(  # the run keeps the points without a finding in its warnings
        f"point {k} at ({', '.join(f'{c:.1f}' for c in click.at_lps_mm)}) mm: "
        f"{click.nothing_measurable}"
        for k, click in enumerate(clicks, start=1)
        if click.nothing_measurable is not None
    )
    with store.writer() as session:
        outcome = store_result(
            session,
            dataclasses.replace(result, warnings=result.warnings + unanswered),
            volume,
            identity,
            actor=actor,
            started_at=started,
            pseudonym_key=pseudonym_key,
        )
        session.commit()
    return MeasuredClicks(result, clicks, outcome, answered)
