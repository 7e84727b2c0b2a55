"""Measuring one series and storing the result: what ``radcaliper measure`` and the UI's upload
share (one transaction per series; storing is idempotent)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from db.engine import Store
from db.store import RunIdentity, StoreOutcome, input_fingerprint, store_result
from ingestion.volume import Volume
from model.measurer.results import StudyResult

__all__ = ["Measured", "measure_and_store", "store_measured"]


@dataclass(frozen=True)
class Measured:
    result: StudyResult
    stored: StoreOutcome | None  # None: not stored (no store given)


def store_measured(
    store: Store,
    measurer: Any,
    result: StudyResult,
    volume: Volume,
    *,
    started_at: datetime,
    actor: str,
    pseudonym_key: str | None,
) -> StoreOutcome:
    """Store a result the measurer made from ``volume`` (idempotent)."""
    identity = RunIdentity(
        checkpoint_hash=measurer.checkpoint_hash,
        input_fingerprint=input_fingerprint(volume),
        settings={"inference": "default"},
    )
    with store.writer() as session:
        outcome = store_result(
            session,
            result,
            volume,
            identity,
            actor=actor,
            started_at=started_at,
            pseudonym_key=pseudonym_key,
        )
        session.commit()
    return outcome


def measure_and_store(
    measurer: Any,
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
