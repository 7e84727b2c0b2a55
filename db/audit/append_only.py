"""The audit log's append-only triggers, as schema 0001 creates them, and the check that they
are still in place.

The triggers refuse UPDATE and DELETE of audit events (SQLite: two triggers that abort;
PostgreSQL: one row trigger calling a function that raises). The hash chain detects an edited or
deleted event whatever the triggers do, but someone who can drop them can also cut the log's
tail and move its head: a missing, disabled or altered trigger is a sign of tampering, which
``audit verify`` reports (and which refuses a migration).
"""

from __future__ import annotations

import re

from sqlalchemy import Connection, text

__all__ = ["APPEND_ONLY_MESSAGE", "append_only_problem"]

APPEND_ONLY_MESSAGE = "audit events are append-only"

_SQLITE = {
    f"audit_events_no_{verb}": f"CREATE TRIGGER audit_events_no_{verb} BEFORE {verb.upper()} ON "
    f"audit_events BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END"
    for verb in ("update", "delete")
}
_POSTGRES_TRIGGER = "audit_events_append_only"
_POSTGRES_FUNCTION = "audit_events_append_only"
_POSTGRES_BODY = f"BEGIN RAISE EXCEPTION '{APPEND_ONLY_MESSAGE}'; END"
_SPACES = re.compile(r"\s+")


def _plain(sql: str | None) -> str:
    return _SPACES.sub(" ", sql or "").strip()


def append_only_problem(connection: Connection) -> str | None:
    """What is wrong with the append-only triggers of ``connection``'s audit log (missing,
    disabled or not what radcaliper created), or None when they are in place."""
    if connection.dialect.name == "postgresql":
        return _postgres(connection)
    return _sqlite(connection)


def _sqlite(connection: Connection) -> str | None:
    rows = connection.execute(
        text(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' "
            "AND tbl_name = 'audit_events'"
        )
    )
    found = {str(name): str(sql) for name, sql in rows}
    for name, sql in _SQLITE.items():
        if name not in found:
            return _missing(name)
        if _plain(found[name]) != _plain(sql):
            return _altered(name)
    return None


def _postgres(connection: Connection) -> str | None:
    rows = connection.execute(
        text(
            "SELECT t.tgname, t.tgenabled, pg_get_triggerdef(t.oid), p.proname, p.prosrc "
            "FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
            "WHERE t.tgrelid = to_regclass('audit_events') AND NOT t.tgisinternal"
        )
    )
    found = {str(row[0]): tuple(row[1:]) for row in rows}
    if _POSTGRES_TRIGGER not in found:
        return _missing(_POSTGRES_TRIGGER)
    enabled, definition, function, body = found[_POSTGRES_TRIGGER]
    if str(enabled) not in ("O", "A"):
        return (
            f"the audit log's append-only trigger {_POSTGRES_TRIGGER} is disabled: events can "
            "be changed or deleted (it was disabled outside radcaliper)"
        )
    wanted = ("BEFORE DELETE OR UPDATE ON", "FOR EACH ROW EXECUTE FUNCTION")
    if (
        function != _POSTGRES_FUNCTION
        or not all(part in _plain(definition) for part in wanted)
        or _plain(body) != _POSTGRES_BODY
    ):
        return _altered(_POSTGRES_TRIGGER)
    return None


def _missing(name: str) -> str:
    return (
        f"the audit log's append-only trigger {name} is missing: events can be changed or "
        "deleted (it was dropped outside radcaliper)"
    )


def _altered(name: str) -> str:
    return (
        f"the audit log's append-only trigger {name} is not the one radcaliper created: "
        "events may be changed or deleted (it was replaced outside radcaliper)"
    )
