"""What a verify of the audit log answers: :class:`VerifyReport`, and :class:`UnknownHeadError`
for a ``since_head`` that names no event (kept apart from the verification modules, which load
numpy, so that readers of a report do not)."""

from __future__ import annotations

from dataclasses import dataclass

from ingestion.errors import StorageError

__all__ = ["UnknownHeadError", "VerifyReport"]


class UnknownHeadError(StorageError):
    """``since_head`` is the hash of no event in the log."""


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`db.audit.verify`; for a row that differs from the log, its table,
    row id and field (None when the whole row was added or deleted)."""

    ok: bool
    events: int
    head_hash: str
    problem: str | None = None
    table: str | None = None
    row_id: int | None = None
    field: str | None = None


def _bad(
    count: int,
    head: str,
    problem: str,
    table: str | None = None,
    row_id: int | None = None,
    field: str | None = None,
) -> VerifyReport:
    return VerifyReport(False, count, head, problem, table, row_id, field)
