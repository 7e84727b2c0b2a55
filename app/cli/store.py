"""The store's commands: ``radcaliper db``, ``radcaliper users`` and ``radcaliper audit``.

Every command takes ``--db URL`` (else ``RADCALIPER_DATABASE_URL``, else the SQLite file in the
data dir). Database errors are one line with what to do, and a non-zero exit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.table import Table

from app.console import (
    EXIT_NOTHING,
    EXIT_OK,
    EXIT_PARTIAL,
    cli_actor,
    err,
    out,
    printable,
    safe,
    settings_of,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from app.report import JSONValue
    from db.engine import Store

__all__ = ["DbOption", "audit_app", "checked", "db_app", "open_database", "users_app"]

T = TypeVar("T")

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL (default: RADCALIPER_DATABASE_URL, else SQLite in the data dir).",
    ),
]
FormatOption = Annotated[str, typer.Option("--format", help="table, csv or json.")]
SinceOption = Annotated[
    str | None, typer.Option("--since", help="From this date or time (ISO 8601, UTC).")
]
UntilOption = Annotated[
    str | None, typer.Option("--until", help="Before this date or time (ISO 8601, UTC).")
]
LimitOption = Annotated[int | None, typer.Option("--limit", min=1, help="At most this many rows.")]

db_app = typer.Typer(help="Create and migrate the measurement database.", no_args_is_help=True)
users_app = typer.Typer(
    help="Users of the review UI (reviewer, auditor, admin).", no_args_is_help=True
)
audit_app = typer.Typer(
    help="What was measured, by which model, who changed what; and proof the log is intact.",
    no_args_is_help=True,
)


def _url(ctx: typer.Context, db: str | None) -> tuple[str, bool]:
    settings = settings_of(ctx)
    if db:
        return db, False
    return settings.effective_database_url, settings.default_database


def checked(action: Callable[[], T]) -> T:
    """Run a database action (or one on the data dir); one clear line and exit 2 when it fails
    (``StorageError``, ``ConfigurationError``: e.g. a data dir or database file of another user).
    SQLAlchemy is imported only when the action fails (a command without a store never loads
    it)."""
    from ingestion.errors import ConfigurationError, StorageError

    try:
        return action()
    except (StorageError, ConfigurationError) as exc:
        err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from exc
    except Exception as exc:
        if "sqlalchemy" not in sys.modules:  # then it cannot be SQLAlchemy's error
            raise
        from sqlalchemy.exc import SQLAlchemyError

        if not isinstance(exc, SQLAlchemyError):
            raise
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        err.print(f"[red]error:[/red] database: {safe(reason)}", highlight=False)
        raise typer.Exit(EXIT_NOTHING) from exc


def open_database(
    ctx: typer.Context, db: str | None, *, create: bool = False, earlier_schema: bool = False
) -> Store:
    """The store at ``--db`` / the settings' URL, schema-checked; exits 2 with the reason when
    it cannot be used. A database without any table (a new SQLite file, an empty PostgreSQL
    database) gets the schema when ``create`` (commands that store) or when it is the default
    SQLite file; one at another schema version is refused ("run radcaliper db upgrade"), or
    with ``earlier_schema`` one at a later schema only (``audit verify``)."""
    from app.files import owner_only_dir
    from db.engine import open_store

    url, default = _url(ctx, db)
    if default:
        checked(lambda: owner_only_dir(settings_of(ctx).data_dir))
    return checked(
        lambda: open_store(url, create_if_empty=create or default, earlier_schema=earlier_schema)
    )


def _when(name: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        err.print(
            f"[red]error:[/red] {name} {safe(repr(value))} is not a date or time (use 2026-11-23)"
        )
        raise typer.Exit(EXIT_NOTHING) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _print_rows(rows: Sequence[Mapping[str, JSONValue]], fmt: str, columns: Sequence[str]) -> None:
    from app.report import rows_csv, rows_json

    fmt = fmt.lower()
    if fmt == "json":  # valid JSON whatever is stored (app.report: no Infinity / NaN tokens)
        sys.stdout.write(rows_json(rows))
    elif fmt == "csv":  # text without control characters, which a terminal would obey
        sys.stdout.write(rows_csv([_printable_row(row) for row in rows], columns))
    elif fmt == "table":
        table = Table(show_lines=False)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*(_cell(row.get(c)) for c in columns))
        out.print(table)
        out.print(f"{len(rows)} row(s)")
    else:
        err.print(f"[red]error:[/red] --format {safe(repr(fmt))}: use table, csv or json")
        raise typer.Exit(EXIT_NOTHING)


def _printable_row(row: Mapping[str, JSONValue]) -> dict[str, JSONValue]:
    return {k: printable(v) if isinstance(v, str) else v for k, v in row.items()}


def _cell(value: JSONValue) -> str:
    """A table cell: stored text with its markup escaped and control characters shown as
    escapes (``app.console.safe``), whoever wrote it into the database."""
    return safe(_cell_text(value))


def _cell_text(value: JSONValue) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ", ".join(_cell_text(v) for v in value)
    return printable(value)


# --- db ------------------------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(
    ctx: typer.Context,
    db: DbOption = None,
    revision: Annotated[str, typer.Option(help="Target revision.")] = "head",
) -> None:
    """Create the tables, or migrate them to this radcaliper's schema.

    Before it migrates a database that has a schema, it checks that the audit log vouches for
    what the database holds (as 'audit verify' does, at the database's schema) and refuses,
    exit 2 naming the first difference, when it does not: a migration never records rows
    changed outside radcaliper as trusted. The migration is recorded in the audit log.
    """
    from db.engine import current, redacted
    from db.migrate import upgrade

    url, _ = _url(ctx, db)
    checked(lambda: upgrade(url, revision, actor=cli_actor()))
    out.print(f"{safe(redacted(url))} is at schema {checked(lambda: current(url))}")


@db_app.command("downgrade")
def db_downgrade(
    ctx: typer.Context,
    revision: Annotated[str, typer.Argument(help="Target revision ('base': drop all tables).")],
    db: DbOption = None,
) -> None:
    """Migrate the schema back to REVISION (the data of dropped tables and columns is lost).

    Like 'db upgrade', it first checks that the audit log vouches for the database (exit 2
    naming the first difference when it does not), and records the migration in the log.
    """
    from db.engine import current, redacted
    from db.migrate import downgrade

    url, _ = _url(ctx, db)
    checked(lambda: downgrade(url, revision, actor=cli_actor()))
    now = checked(lambda: current(url))
    out.print(f"{safe(redacted(url))} is at schema {now or 'base (no tables)'}")


@db_app.command("current")
def db_current(ctx: typer.Context, db: DbOption = None) -> None:
    """Show the database's schema revision and the one this radcaliper needs."""
    from db.engine import current, redacted
    from db.migrate import head_revision

    url, _ = _url(ctx, db)
    revision = checked(lambda: current(url))
    out.print(
        f"{safe(redacted(url))}: schema {revision or 'none'}; "
        f"this radcaliper needs {head_revision()}"
    )


# --- users ---------------------------------------------------------------------------------------


@users_app.command("add")
def users_add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Login name.")],
    role: Annotated[str, typer.Option("--role", help="reviewer, auditor or admin.")],
    password_stdin: Annotated[
        bool,
        typer.Option("--password-stdin", help="Read the password from standard input (one line)."),
    ] = False,
    db: DbOption = None,
) -> None:
    """Add a user. Without --password-stdin the user cannot log in to the UI yet."""
    from db.users import add_user

    password = None
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")

    def change(session: Session) -> str:
        user = add_user(session, name, role, password=password, actor=cli_actor())
        return f"Added {user.role.value} {safe(repr(user.name))}"

    _administer(ctx, db, change, create=True)


@users_app.command("list")
def users_list(ctx: typer.Context, db: DbOption = None) -> None:
    """List users: role, whether enabled, whether they have a password and must change it,
    and the locks of their logins now in force (name from address, until when). Addresses
    locked for every name are listed after the users."""
    from sqlalchemy import select

    from db.logins import login_locks
    from db.models import User

    settings = settings_of(ctx)
    store = open_database(ctx, db)
    try:
        with store.reader() as session:
            users = session.execute(select(User).order_by(User.name)).scalars().all()
            locks = login_locks(session, settings.login_limits, datetime.now(UTC))
    finally:
        store.dispose()
    held: dict[str, list[str]] = {}
    for lock in locks:
        until = lock.until.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        held.setdefault(lock.user or "", []).append(f"from {lock.address} until {until}")
    rows: list[dict[str, JSONValue]] = [
        {
            "name": u.name,
            "role": u.role.value,
            "active": u.active,
            "password": u.password_hash is not None,
            "must change": u.must_change_password,
            "locked": "; ".join(held.get(u.name, [])),
        }
        for u in users
    ]
    _print_rows(rows, "table", ["name", "role", "active", "password", "must change", "locked"])
    for text in held.get("", []):
        out.print(f"address locked for every name: {safe(text)}")


def _administer(
    ctx: typer.Context, db: str | None, change: Callable[[Session], str], *, create: bool = False
) -> None:
    """Run one change to the users in a write transaction: print what it says, or exit 2 with
    one line (an unknown user, the last admin, a refused password, ...)."""
    store = open_database(ctx, db, create=create)
    try:
        with store.writer() as session:
            try:
                said = checked(lambda: change(session))
            except ValueError as exc:
                err.print(f"[red]error:[/red] {safe(exc)}", highlight=False)
                raise typer.Exit(EXIT_NOTHING) from exc
            checked(session.commit)
    finally:
        store.dispose()
    out.print(said)


UserName = Annotated[str, typer.Argument(help="The user's login name.")]


@users_app.command("unlock")
def users_unlock(
    ctx: typer.Context,
    name: UserName,
    address: Annotated[
        str | None,
        typer.Option("--address", help="Only the lock from this client address."),
    ] = None,
    db: DbOption = None,
) -> None:
    """End the locks of NAME's logins (forget its failed logins, from every address or one).
    An audit event."""
    from db.users import unlock_user

    def change(session: Session) -> str:
        count = unlock_user(session, name, actor=cli_actor(), address=address)
        where = "" if address is None else f" from {safe(address)}"
        return f"Unlocked {safe(repr(name))}{where}: {count} failed login(s) forgotten"

    _administer(ctx, db, change)


@users_app.command("disable")
def users_disable(ctx: typer.Context, name: UserName, db: DbOption = None) -> None:
    """Disable NAME: they can no longer log in, and their open sessions end at their next
    request. The last enabled admin cannot be disabled. An audit event."""
    from db.users import set_active

    _administer(
        ctx,
        db,
        lambda s: f"Disabled {safe(repr(set_active(s, name, False, actor=cli_actor()).name))}",
    )


@users_app.command("enable")
def users_enable(ctx: typer.Context, name: UserName, db: DbOption = None) -> None:
    """Enable NAME again. An audit event."""
    from db.users import set_active

    _administer(
        ctx,
        db,
        lambda s: f"Enabled {safe(repr(set_active(s, name, True, actor=cli_actor()).name))}",
    )


@users_app.command("passwd")
def users_passwd(
    ctx: typer.Context,
    name: UserName,
    password_stdin: Annotated[
        bool,
        typer.Option("--password-stdin", help="Read the password from standard input (one line)."),
    ] = False,
    db: DbOption = None,
) -> None:
    """Set NAME's password as an administrator: NAME must choose a new one at the next login,
    and their open sessions end. Users change their own password in the UI (Change password).
    At least 8 characters, not containing the user name. An audit event (never the password)."""
    from db.users import reset_password

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        import getpass

        password = getpass.getpass(f"new password for {name}: ")
        if getpass.getpass("again: ") != password:
            err.print("[red]error:[/red] the two passwords differ; nothing changed")
            raise typer.Exit(EXIT_NOTHING)

    def change(session: Session) -> str:
        user = reset_password(session, name, password, actor=cli_actor())
        return f"Password of {safe(repr(user.name))} set: they must change it at the next login"

    _administer(ctx, db, change)


@users_app.command("role")
def users_role(
    ctx: typer.Context,
    name: UserName,
    role: Annotated[str, typer.Argument(help="reviewer, auditor or admin.")],
    db: DbOption = None,
) -> None:
    """Give NAME another role; their open sessions end. The last enabled admin cannot be
    demoted. An audit event."""
    from db.users import set_role

    def change(session: Session) -> str:
        user = set_role(session, name, role, actor=cli_actor())
        return f"{safe(repr(user.name))} is now {user.role.value}"

    _administer(ctx, db, change)


# --- audit ---------------------------------------------------------------------------------------

MEASUREMENT_COLUMNS = (
    "study_instance_uid",
    "patient_id",
    "finding_id",
    "kind",
    "name",
    "value_mm",
    "range_mm",
    "model_version",
    "status",
    "reviewed_value_mm",
    "reviewer",
    "reviewed_at",
)


@audit_app.command("measurements")
def audit_measurements(
    ctx: typer.Context,
    patient: Annotated[str | None, typer.Option("--patient", help="Patient ID.")] = None,
    study: Annotated[str | None, typer.Option("--study", help="StudyInstanceUID.")] = None,
    since: SinceOption = None,
    until: UntilOption = None,
    model_version: Annotated[
        str | None, typer.Option("--model-version", help="Model version.")
    ] = None,
    status: Annotated[
        str | None,
        typer.Option("--status", help="pending, accepted, corrected or rejected."),
    ] = None,
    reviewer: Annotated[str | None, typer.Option("--reviewer", help="Reviewer's name.")] = None,
    limit: LimitOption = None,
    fmt: FormatOption = "table",
    db: DbOption = None,
) -> None:
    """Stored measurements with their review state; dates filter when they were measured."""
    from db.models import ReviewStatus
    from db.queries import MeasurementFilter, measurement_rows

    try:
        checked_status = None if status is None else ReviewStatus(status)
    except ValueError:
        err.print(
            f"[red]error:[/red] --status {safe(repr(status))}: use pending, accepted, corrected "
            "or rejected"
        )
        raise typer.Exit(EXIT_NOTHING) from None
    filters = MeasurementFilter(
        patient_id=patient,
        study_instance_uid=study,
        since=_when("--since", since),
        until=_when("--until", until),
        model_version=model_version,
        status=checked_status,
        reviewer=reviewer,
        limit=limit,
    )
    key = settings_of(ctx).pseudonym_key
    store = open_database(ctx, db)
    try:
        with store.reader() as session:
            rows = checked(lambda: measurement_rows(session, filters, pseudonym_key=key))
    finally:
        store.dispose()
    _print_rows(rows, fmt, MEASUREMENT_COLUMNS)


@audit_app.command("log")
def audit_log(
    ctx: typer.Context,
    actor: Annotated[str | None, typer.Option("--actor", help="Who (user or cli:<user>).")] = None,
    action: Annotated[
        str | None, typer.Option("--action", help="e.g. review.correct, run.stored.")
    ] = None,
    object_type: Annotated[
        str | None, typer.Option("--object", help="run, measurement, review or user.")
    ] = None,
    since: SinceOption = None,
    until: UntilOption = None,
    limit: LimitOption = None,
    fmt: FormatOption = "table",
    db: DbOption = None,
) -> None:
    """The audit log: who did what, when, to which object."""
    from db.queries import LogFilter, audit_log_rows

    filters = LogFilter(
        actor=actor,
        action=action,
        object_type=object_type,
        since=_when("--since", since),
        until=_when("--until", until),
        limit=limit,
    )
    store = open_database(ctx, db)
    try:
        with store.reader() as session:
            rows = checked(lambda: audit_log_rows(session, filters))
    finally:
        store.dispose()
    _print_rows(rows, fmt, ("id", "at", "actor", "action", "object_type", "object_id"))


def _default_processes() -> int:
    """Two processes for a large verify where this process may use two CPUs (its affinity)."""
    from app.threads import usable_cpus

    return 2 if usable_cpus() >= 2 else 1


@audit_app.command("verify")
def audit_verify(
    ctx: typer.Context,
    head: Annotated[
        str | None,
        typer.Option(
            "--head", help="A head hash kept from an earlier verify: it must still be the head."
        ),
    ] = None,
    since_head: Annotated[
        str | None,
        typer.Option(
            "--since-head",
            metavar="HASH",
            help="Check only the events appended after the event with this hash (a head an "
            "earlier verify printed): that event's own hash, the chain after it (ids, "
            "prev_hash, hashes, the head) and the rows those later events recorded. It does "
            "not re-check earlier events or the rows recorded before that head, nor look for "
            "rows added outside radcaliper: run a full verify for that. Exit 2 when no event "
            "has this hash.",
        ),
    ] = None,
    processes: Annotated[
        int,
        typer.Option(
            "--processes",
            min=1,
            help="A full verify of a large log (50,000 events and more) shares the work with "
            "a second process when this is 2 or more (the default on machines with 2 CPUs "
            "or more).",
        ),
    ] = _default_processes(),
    db: DbOption = None,
) -> None:
    """Check the hash chain of the audit log and every stored row it covers against it.

    Covered: users, studies, series, runs, findings, measurements and reviews (every fact a
    result, an SR or an audit answer is built from). Also checked: one audit head row, the
    log's append-only triggers, and that the schema the log says the database was migrated to
    is the one it says it is at. A database at an earlier schema (before 'db upgrade') is
    checked as that schema's log covers it. Exit status: 0 intact (the head hash is
    printed: keep it elsewhere and pass it back with --head next time, or with --since-head
    for a quick check of what was added since), 1 tampered (the first problem is named: the
    event, or the table, row and field that differs), 2 the check could not run (e.g. an
    unknown --since-head hash).
    """
    from db.audit import verify

    store = open_database(ctx, db, earlier_schema=True)
    try:
        with store.reader() as session:
            report = checked(
                lambda: verify(
                    session, expected_head=head, since_head=since_head, processes=processes
                )
            )
    finally:
        store.dispose()
    if report.ok:
        since = "" if since_head is None else f" since {safe(since_head[:16])}..."
        out.print(f"intact: {report.events} events{since}; head {report.head_hash}")
        raise typer.Exit(EXIT_OK)
    err.print(f"[red]TAMPERED:[/red] {safe(report.problem)}", highlight=False)
    raise typer.Exit(EXIT_PARTIAL)
