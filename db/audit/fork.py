"""The second process of a large full verify (:mod:`db.audit.verification`): a forked process that
reads the same snapshot (PostgreSQL's exported one, or an SQLite read transaction at the same
head) and does its half of the events, then of each table's rows.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from db.audit.chain import _Chain, _does_not_follow, _ids_jump, _walk
from db.audit.reading import _SNAPSHOT_ID, _head, _Source
from db.audit.rows import _compare_tables, _Logged, _LoggedParts, _TableOutcome
from db.engine import in_memory

__all__: list[str] = []  # internals of db.audit.verification

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


# --- a second process ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shared:
    """What a second process needs to read the snapshot this one reads: the URL, PostgreSQL's
    exported snapshot, or (SQLite) the head this snapshot has, to compare with its own."""

    url: str
    snapshot: str | None
    head: tuple[int, str] | None


def _share(session: Session) -> _Shared | None:
    """None where a second process cannot share this session's snapshot."""
    bind = session.get_bind()
    url = bind.engine.url.render_as_string(hide_password=False)
    if bind.dialect.name != "postgresql":
        return None if in_memory(bind.engine.url) else _Shared(url, None, _head(session))
    level = session.connection().get_isolation_level()
    if level not in ("REPEATABLE READ", "SERIALIZABLE"):
        return None
    snapshot = session.execute(text("SELECT pg_export_snapshot()")).scalar_one()
    return _Shared(url, str(snapshot), None)


@contextlib.contextmanager
def _shared_source(shared: _Shared) -> Iterator[_Source | None]:
    """In the second process: a connection on the shared snapshot (None: the SQLite database
    has moved on since the first process's snapshot)."""
    from db.engine import connect

    engine = connect(shared.url)
    try:
        with Session(engine) as session:
            if shared.snapshot is not None and _SNAPSHOT_ID.fullmatch(shared.snapshot):
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                session.execute(text(f"SET TRANSACTION SNAPSHOT '{shared.snapshot}'"))
            elif _head(session) != shared.head:
                yield None
                return
            yield _Source(session)
    finally:
        engine.dispose()


class _Forked(Generic[_T]):
    """``work()`` in a forked process; :meth:`result` is its return value, or None when it
    failed (the caller then does the work itself). The child leaves the connections of the
    parent's ``engine`` to the parent (SQLAlchemy's rule for a forked process) and opens its
    own."""

    def __init__(self, work: Callable[[], _T | None], engine: Engine) -> None:
        context = multiprocessing.get_context("fork")
        self._receiver, sender = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_send_result, args=(work, sender, engine), daemon=True
        )
        self._process.start()
        sender.close()

    def result(self) -> _T | None:
        try:
            value: _T | None = self._receiver.recv()
        except (EOFError, OSError):
            value = None
        self._receiver.close()
        self._process.join()
        return value

    def cancel(self) -> None:
        """Stop the process if it still runs (safe after :meth:`result`)."""
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()
        self._receiver.close()


def _send_result(work: Callable[[], Any], sender: Connection, engine: Engine) -> None:
    engine.dispose(close=False)  # the parent's pooled connections are not this process's
    try:
        value = work()
    except Exception:  # the first process does the work itself
        logger.warning("audit verify: the second process failed", exc_info=True)
        value = None
    sender.send(value)
    sender.close()


def _can_fork() -> bool:
    """Linux only: elsewhere (macOS) forking a process that loaded system libraries is unsafe."""
    return sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()


@dataclass
class _UpperEvents:
    """What the second process found in the events after the split."""

    chain: _Chain
    problem: str | None
    parts: _LoggedParts


def _upper_events(shared: _Shared, key: bytes, split: int, path: str) -> _UpperEvents | None:
    with _shared_source(shared) as source:
        if source is None:
            return None
        logged = _Logged(key)
        chain = _Chain(split, "", first=(0, ""))
        problem = _walk(source, chain, logged)
        return _UpperEvents(chain, problem, logged.save(path))


def _join(lower: _Chain, upper: _UpperEvents) -> str | None:
    """Continue the chain with the second process's part: the linkage at the split, then its
    own first problem (counts and the last event carried over)."""
    if upper.chain.first is None:  # no event after the split
        return upper.problem
    first_id, first_prev = upper.chain.first
    lower.count += 1
    if first_id != lower.last_id + 1:
        return _ids_jump(lower.last_id, first_id)
    if first_prev != lower.last_hash:
        return _does_not_follow(first_id, lower.last_id)
    lower.count += upper.chain.count - 1
    if upper.problem is None or upper.chain.last_id >= first_id:
        lower.last_id, lower.last_hash = upper.chain.last_id, upper.chain.last_hash
    lower.follow(upper.chain)
    return upper.problem


def _upper_tables(
    shared: _Shared, logged: _Logged, whole: frozenset[str], splits: Mapping[str, int]
) -> list[_TableOutcome] | None:
    with _shared_source(shared) as source:
        return None if source is None else _compare_tables(source, logged, whole, low=splits)
