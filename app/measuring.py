"""Measuring one series and storing the result: what ``radcaliper measure``, ``radcaliper
batch`` and the UI's upload share (one transaction per series, or per study for batch; storing
is idempotent).

The store's modules (SQLAlchemy) are imported by the functions that store: ``radcaliper measure
--no-store`` does not import them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from db.engine import Store
    from db.store import RunIdentity, StoreOutcome
    from ingestion.volume import Volume
    from model.measurer.protocol import Measurer
    from model.measurer.results import ModelInfo, StudyResult

__all__ = [
    "RUN_SETTINGS",
    "Measured",
    "NamedModel",
    "measure_and_store",
    "run_identity",
    "store_measured",
    "store_study",
]

# What a stored run records as its settings; part of no identity check (see db.store.find_run).
RUN_SETTINGS = {"inference": "default"}


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
