"""``audit verify`` streams: the batched chain walk, the compact per-row record of the last
logged state, the second process and ``--since-head``, at small sizes with the batch sizes made
tiny so that every multi-batch path runs. Every kind of tampering is still named exactly as the
one-process, one-batch verify names it."""

from __future__ import annotations

import contextlib
import json
import math
import random
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select, text
from typer.testing import CliRunner

import db.audit.chain as verify_chain
import db.audit.fork as verify_fork
import db.audit.reading as verify_reading
import db.audit.rows as verify_rows
import db.audit.verification as verification
from app.cli import app
from db.audit import GENESIS, UnknownHeadError, VerifyReport, verify
from db.audit.coverage import digest
from db.engine import Store
from db.models import Measurement, ReviewAction, User
from db.review import review_measurement
from db.store import RunIdentity, input_fingerprint, store_result
from ingestion.volume import Volume

from tests.support.db import as_attacker as _as_attacker
from tests.support.db import make_result, store_one

runner = CliRunner()
SEED = 20261127


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 7 rows, 5 logged entries before a sort, 3 ids per IN list, and a second
    process whatever the log's size."""
    monkeypatch.setattr(verify_reading, "_BATCH", 7)
    monkeypatch.setattr(verify_rows, "_PENDING", 5)
    monkeypatch.setattr(verify_rows, "_IN_LIST", 3)
    monkeypatch.setattr(verification, "_PARALLEL_MIN_EVENTS", 0)

    def gave_way(part: str) -> None:
        raise AssertionError(f"the second process did not check {part}")

    monkeypatch.setattr(verification, "_alone", gave_way)


@pytest.fixture
def filled(store: Store, volume: Volume, users: dict[str, User]) -> Store:
    """Six runs (6 x 3 measurements) and reviews of four measurements (rows logged again,
    later and out of id order)."""
    rng = random.Random(SEED)
    for k in range(6):
        values = tuple(round(rng.uniform(5, 60), 2) for _ in range(3))
        store_one(store, make_result(volume, version=f"1.{k}", values=values), volume)
    with store.writer() as session:
        ids = session.execute(select(Measurement.id).order_by(Measurement.id)).scalars().all()
        for mid in (ids[9], ids[2], ids[15], ids[2]):
            current = session.get(Measurement, mid)
            assert current is not None
            review_measurement(
                session,
                mid,
                action=ReviewAction.ACCEPT,
                reviewer=users["alice"],
                seen_version=current.version,
            )
        session.commit()
    return store


def _verify(store: Store, *, processes: int = 1, **options: Any) -> VerifyReport:
    with store.reader() as session:
        return verify(session, processes=processes, **options)


def _both(store: Store) -> VerifyReport:
    """The report of one process and of two, which must be the same."""
    alone = _verify(store)
    assert _verify(store, processes=2) == alone
    return alone


def _ids(store: Store, table: str) -> list[int]:
    with store.engine.connect() as connection:
        return list(connection.execute(text(f"SELECT id FROM {table} ORDER BY id")).scalars())


def _last_event(store: Store) -> int:
    with store.engine.connect() as connection:
        return int(connection.execute(text("SELECT max(id) FROM audit_events")).scalar_one())


# --- the full verify, in batches and in two processes -------------------------------------------


@pytest.mark.usefixtures("small_batches")
def test_an_intact_log_verifies_in_batches_and_in_two_processes(filled: Store) -> None:
    report = _both(filled)
    assert report.ok and report.events == _last_event(filled)
    assert _verify(filled, expected_head=report.head_hash, processes=2).ok


@pytest.mark.usefixtures("small_batches")
def test_a_tampered_field_is_named(filled: Store) -> None:
    rng = random.Random(SEED)
    ids = _ids(filled, "measurements")
    first, second = sorted(rng.sample(ids[1:], 2))
    with filled.engine.begin() as connection:
        connection.execute(text(f"UPDATE measurements SET coverage = 0.5 WHERE id = {second}"))
        connection.execute(text(f"UPDATE measurements SET value_mm = 99.5 WHERE id = {first}"))
    report = _both(filled)
    assert not report.ok
    assert (report.table, report.row_id, report.field) == ("measurements", first, "value_mm")
    assert f"table measurements, row {first}, field value_mm: 99.5 in the table" in (
        report.problem or ""
    )


def test_a_logged_null_set_to_infinity_is_named(filled: Store) -> None:
    """orjson writes a non-finite float as null: a null in the log and Infinity in the table
    must still differ (such a row is compared exactly)."""
    infinity = "9e999" if filled.backend == "sqlite" else "'Infinity'::float8"
    with filled.engine.begin() as connection:
        row = connection.execute(
            text("SELECT min(id) FROM measurements WHERE reviewed_value_mm IS NULL")
        ).scalar_one()
        connection.execute(
            text(f"UPDATE measurements SET reviewed_value_mm = {infinity} WHERE id = {row}")
        )
    report = _both(filled)
    assert not report.ok
    assert (report.table, report.row_id, report.field) == (
        "measurements",
        row,
        "reviewed_value_mm",
    )


def test_a_null_in_a_json_column_set_to_infinity_is_named(filled: Store, volume: Volume) -> None:
    """The same inside a JSON column: 1e999 is valid JSON that reads as Infinity (SQLite's text
    and PostgreSQL's json alike), which orjson would digest as the logged null."""
    with filled.writer() as session:
        settings = {"threads": 1, "tile": None}
        stored = store_result(
            session,
            make_result(volume, version="2.0", values=(7.0, 8.0, 9.0)),
            volume,
            RunIdentity("d" * 64, input_fingerprint(volume), settings),
            actor="cli:test",
            started_at=datetime.now(UTC),
        )
        session.commit()
    assert _both(filled).ok
    tampered = '{"threads": 1, "tile": 1e999}'
    with filled.engine.begin() as connection:
        connection.execute(
            text("UPDATE runs SET settings = :s WHERE id = :id"),
            {"s": tampered, "id": stored.run_id},
        )
    report = _both(filled)
    assert not report.ok
    assert (report.table, report.row_id) == ("runs", stored.run_id)


@pytest.mark.usefixtures("small_batches")
def test_a_field_changed_in_a_reviewed_row_is_compared_with_its_last_state(filled: Store) -> None:
    """The measurement reviewed twice: its first state differs from the table, its last does
    not; a change shows against the last."""
    reviewed = _ids(filled, "measurements")[2]
    assert _both(filled).ok
    with filled.engine.begin() as connection:
        connection.execute(text(f"UPDATE measurements SET version = 1 WHERE id = {reviewed}"))
    report = _both(filled)
    assert (report.table, report.row_id, report.field) == ("measurements", reviewed, "version")
    assert "1 in the table but 3 in the audit log" in (report.problem or "")


@pytest.mark.usefixtures("small_batches")
def test_a_deleted_row_is_named(filled: Store) -> None:
    finding = _ids(filled, "findings")[4]
    with filled.engine.begin() as connection:
        connection.execute(text(f"DELETE FROM measurements WHERE finding_id = {finding}"))
        connection.execute(text(f"DELETE FROM findings WHERE id = {finding}"))
    report = _both(filled)
    assert (report.ok, report.table, report.row_id, report.field) == (
        False,
        "findings",
        finding,
        None,
    )
    assert "but not in the table: it was deleted" in (report.problem or "")


@pytest.mark.usefixtures("small_batches")
def test_an_added_row_is_named_before_a_deleted_one(filled: Store) -> None:
    """A row added outside radcaliper (the highest id) comes before a deleted row of the same
    table, as in the one-batch verify."""
    measurements = _ids(filled, "measurements")
    with filled.engine.begin() as connection:
        connection.execute(text(f"DELETE FROM measurements WHERE id = {measurements[3]}"))
        connection.execute(
            text(
                "INSERT INTO measurements (finding_id, name, value_mm, unit, source, status, "
                "version) SELECT finding_id, name, 1.0, unit, source, status, 1 "
                f"FROM measurements WHERE id = {measurements[0]}"
            )
        )
    added = _ids(filled, "measurements")[-1]
    report = _both(filled)
    assert (report.table, report.row_id, report.field) == ("measurements", added, None)
    assert "not in the audit log: it was added outside radcaliper" in (report.problem or "")


@pytest.mark.usefixtures("small_batches")
def test_an_edited_event_is_named(filled: Store) -> None:
    rng = random.Random(SEED + 1)
    edited = rng.randrange(2, _last_event(filled))
    _as_attacker(filled, f"UPDATE audit_events SET actor = 'mallory' WHERE id = {edited}")
    report = _both(filled)
    assert not report.ok and report.events == edited
    assert re.search(rf"audit event {edited} \(.* by mallory\) was edited", report.problem or "")


@pytest.mark.usefixtures("small_batches")
def test_an_event_with_a_changed_value_in_its_details_is_named(filled: Store) -> None:
    """The fast hash (orjson) fails, and so does the exact one: the event is named edited."""
    with filled.engine.connect() as connection:
        event_id, details = connection.execute(
            text(
                "SELECT id, details FROM audit_events WHERE action = 'measurement.created' "
                "ORDER BY id DESC LIMIT 1"
            )
        ).one()
    changed = json.loads(details) if isinstance(details, str) else details
    changed["state"]["value_mm"] = 1.0
    _as_attacker(
        filled,
        f"UPDATE audit_events SET details = '{json.dumps(changed)}' WHERE id = {event_id}",
    )
    report = _both(filled)
    assert f"audit event {event_id} (measurement.created by cli:test) was edited" in (
        report.problem or ""
    )


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_deleted_event_is_named(filled: Store, where: str) -> None:
    last = _last_event(filled)
    deleted = {"first": 1, "middle": last // 2 + 1, "last": last}[where]
    _as_attacker(filled, f"DELETE FROM audit_events WHERE id = {deleted}")
    report = _both(filled)
    assert not report.ok
    if where == "last":
        assert f"the log ends at event {last - 1} but the head says event {last}" in (
            report.problem or ""
        )
    else:
        assert f"audit events {deleted}..{deleted} are missing" in (report.problem or "")
        assert report.events == deleted


@pytest.mark.usefixtures("small_batches")
def test_a_replaced_event_at_the_second_process_split_is_named(filled: Store) -> None:
    """The first event the second process reads does not follow the first process's last."""
    after = _last_event(filled) // 2 + 1
    _as_attacker(filled, f"UPDATE audit_events SET prev_hash = '{'1' * 64}' WHERE id = {after}")
    report = _both(filled)
    assert f"audit event {after} does not follow event {after - 1}" in (report.problem or "")


@pytest.mark.usefixtures("small_batches")
def test_with_hashes_not_randomized_the_digests_are_blake2b(
    filled: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With PYTHONHASHSEED fixed, Python's hash has a known key: states are digested with keyed
    BLAKE2b instead, and a change is still named."""
    monkeypatch.setattr(verify_reading, "_randomized_hashes", lambda: False)
    assert verify_reading._StateDigest(b"k" * 16).of_text != hash
    assert _both(filled).ok
    finding = _ids(filled, "findings")[-1]
    with filled.engine.begin() as connection:
        connection.execute(text(f"UPDATE findings SET slice_index = 99 WHERE id = {finding}"))
    report = _both(filled)
    assert (report.table, report.row_id, report.field) == ("findings", finding, "slice_index")


@pytest.mark.usefixtures("small_batches")
def test_the_second_process_gives_way_when_the_database_moved_on(
    filled: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite the second process cannot read the first one's snapshot: when the head it
    sees differs, the first process does its part itself (simulated here on both backends)."""

    def moved_on(shared: verify_fork._Shared) -> Iterator[None]:
        yield None

    monkeypatch.setattr(verify_fork, "_shared_source", contextlib.contextmanager(moved_on))
    alone: list[str] = []
    monkeypatch.setattr(verification, "_alone", alone.append)
    measurement = _ids(filled, "measurements")[-1]
    assert _verify(filled, processes=2).ok
    with filled.engine.begin() as connection:
        connection.execute(text(f"UPDATE measurements SET unit = 'cm' WHERE id = {measurement}"))
    report = _verify(filled, processes=2)
    assert (report.table, report.row_id, report.field) == ("measurements", measurement, "unit")
    assert alone == ["the events after the split", "the upper half of each table"] * 2


# --- --since-head -------------------------------------------------------------------------------


def _review_one_more(store: Store, user: str = "bob") -> int:
    with store.writer() as session:
        reviewer = session.execute(select(User).where(User.name == user)).scalar_one()
        row = (
            session.execute(
                select(Measurement).where(Measurement.version == 1).order_by(Measurement.id.desc())
            )
            .scalars()
            .first()
        )
        assert row is not None
        review_measurement(
            session, row.id, action=ReviewAction.ACCEPT, reviewer=reviewer, seen_version=1
        )
        session.commit()
        return row.id


@pytest.mark.usefixtures("small_batches")
def test_since_head_checks_only_what_was_appended(filled: Store) -> None:
    head = _verify(filled).head_hash
    for _ in range(3):
        _review_one_more(filled)
    report = _verify(filled, since_head=head)
    assert report.ok and report.events == 6  # 3 x (review + measurement)
    assert report.head_hash == _verify(filled).head_hash
    assert _verify(filled, since_head=report.head_hash).events == 0


@pytest.mark.usefixtures("small_batches")
def test_since_head_names_a_row_recorded_after_it_that_changed(filled: Store) -> None:
    head = _verify(filled).head_hash
    reviewed = _review_one_more(filled)
    with filled.engine.begin() as connection:
        connection.execute(
            text(f"UPDATE measurements SET status = 'pending' WHERE id = {reviewed}")
        )
    report = _verify(filled, since_head=head)
    assert (report.table, report.row_id, report.field) == ("measurements", reviewed, "status")
    with filled.engine.begin() as connection:
        connection.execute(text(f"DELETE FROM reviews WHERE measurement_id = {reviewed}"))
        connection.execute(
            text(f"UPDATE measurements SET status = 'accepted' WHERE id = {reviewed}")
        )
    report = _verify(filled, since_head=head)
    assert (report.table, report.field) == ("reviews", None)
    assert "but not in the table: it was deleted" in (report.problem or "")


@pytest.mark.usefixtures("small_batches")
def test_since_head_leaves_earlier_rows_to_the_full_verify(filled: Store) -> None:
    """A row recorded before the head is not read again by --since-head; a full verify names
    its change."""
    head = _verify(filled).head_hash
    first = _ids(filled, "measurements")[0]
    with filled.engine.begin() as connection:
        connection.execute(text(f"UPDATE measurements SET value_mm = 1.5 WHERE id = {first}"))
    assert _verify(filled, since_head=head).ok
    report = _both(filled)
    assert (report.table, report.row_id, report.field) == ("measurements", first, "value_mm")


@pytest.mark.usefixtures("small_batches")
def test_since_head_names_a_later_event_that_was_tampered_with(filled: Store) -> None:
    head = _verify(filled).head_hash
    _review_one_more(filled)
    _review_one_more(filled)
    later = _last_event(filled) - 1
    _as_attacker(filled, f"UPDATE audit_events SET actor = 'mallory' WHERE id = {later}")
    report = _verify(filled, since_head=head)
    assert not report.ok
    assert re.search(rf"audit event {later} \(.* by mallory\) was edited", report.problem or "")


@pytest.mark.usefixtures("small_batches")
def test_since_head_names_the_head_event_itself_when_it_was_edited(filled: Store) -> None:
    report = _verify(filled)
    last = _last_event(filled)
    _as_attacker(filled, f"UPDATE audit_events SET actor = 'mallory' WHERE id = {last}")
    since = _verify(filled, since_head=report.head_hash)
    assert not since.ok and f"audit event {last} " in (since.problem or "")
    assert "the given head, was edited" in (since.problem or "")


def test_since_head_with_an_unknown_hash_is_refused(filled: Store) -> None:
    with pytest.raises(UnknownHeadError, match="no audit event has the hash 'abc123'"):
        _verify(filled, since_head="abc123")
    assert _verify(filled, since_head=GENESIS) == _verify(filled)


# --- the command line ---------------------------------------------------------------------------


def test_the_command_line_since_head(filled: Store) -> None:
    full = runner.invoke(app, ["audit", "verify", "--db", filled.url])
    assert full.exit_code == 0, full.output
    head = full.stdout.split("head ")[1].strip()
    _review_one_more(filled)
    since = runner.invoke(app, ["audit", "verify", "--db", filled.url, "--since-head", head])
    assert since.exit_code == 0, since.output
    assert f"intact: 2 events since {head[:16]}...; head " in since.stdout
    new_head = since.stdout.split("head ")[1].strip()
    both = ["--since-head", head, "--head", new_head]
    assert runner.invoke(app, ["audit", "verify", "--db", filled.url, *both]).exit_code == 0
    unknown = "f" * 64
    refused = runner.invoke(app, ["audit", "verify", "--db", filled.url, "--since-head", unknown])
    assert refused.exit_code == 2
    assert f"no audit event has the hash '{unknown}'" in " ".join(refused.output.split())
    _as_attacker(
        filled, f"UPDATE audit_events SET actor = 'mallory' WHERE id = {_last_event(filled)}"
    )
    tampered = runner.invoke(app, ["audit", "verify", "--db", filled.url, "--since-head", head])
    assert tampered.exit_code == 1 and "TAMPERED" in tampered.output


def test_the_command_line_help_says_what_since_head_leaves_out() -> None:
    shown = runner.invoke(app, ["audit", "verify", "--help"])
    flat = " ".join(shown.output.replace("│", " ").split())
    assert "--since-head" in flat and "does not re-check earlier events" in flat
    assert "rows recorded before that head" in flat


# --- the fast paths are exact -------------------------------------------------------------------

TRICKY_JSON = [
    '{"a": 1, "a": 2}', "-0", "-0.0", "1e400", "-1e400", "18446744073709551616",
    "9223372036854775808", "-9223372036854775809", "NaN", '"\\ud800"', "1E2", "0.1",
    "4.9e-324", "1e-400", '" \\u00e9"', '{"a" : [1, 2.50, null, true] }', "123456789012345678",
    "1234567890123456789", "0.30000000000000004441", '"\\/"', '["2.25.1234567890123456789012"]',
]  # fmt: skip


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-(2**70), 2**70) if rng.random() < 0.2 else rng.randint(-999, 999)
    if kind == 2:
        return rng.choice([rng.uniform(-1e6, 1e6), rng.uniform(0, 1e-5), 10 ** rng.uniform(-8, 25)])
    if kind in (3, 4):
        return "".join(rng.choice('ab"\\/\n\x7fé€0123456789 ') for _ in range(rng.randrange(8)))
    if kind in (5, 6):
        return {
            f"k{rng.randrange(9)}": _random_json(rng, depth + 1) for _ in range(rng.randrange(4))
        }
    return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types (``1`` is not ``1.0``; NaN is NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_the_fast_json_reader_reads_what_json_reads() -> None:
    rng = random.Random(SEED)
    texts = TRICKY_JSON + [
        json.dumps(_random_json(rng), separators=rng.choice([(",", ":"), (", ", ": ")]))
        for _ in range(3000)
    ]
    for text_ in texts:
        try:
            expected = json.loads(text_)
        except ValueError:
            with pytest.raises(ValueError):
                verify_reading._load_json(text_)
            continue
        assert _same(verify_reading._load_json(text_), expected), text_


def test_a_fast_digest_equal_to_a_stored_one_means_the_same_value() -> None:
    """Where orjson spells a value as ``json`` does, the fast digest is the stored one; where
    it does not, it is no stored digest at all (the row is then compared exactly)."""
    rng = random.Random(SEED)
    values = [_random_json(rng) for _ in range(3000)]
    stored = {digest(value): value for value in values}
    fast_path = 0
    for value in values:
        fast = verify_reading._fast_digest(value)
        if fast in stored:
            assert _same(stored[fast], value)
            fast_path += fast == digest(value)
    assert fast_path > len(values) // 2
    plain = {"uids": [f"2.25.{k}" for k in range(40)], "frames": [None] * 40, "n": 1.5}
    assert verify_reading._fast_digest(plain) == digest(plain)
    assert verify_reading._fast_digest({"x": 1e-05}) != digest({"x": 1e-05})  # orjson: 0.00001


def test_the_fast_event_hash_is_the_exact_one(
    filled: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every event of a real log passes the fast check (orjson) without the exact one, which
    agrees; an edited event fails both."""
    exact = verify_chain._exact_details
    with filled.reader() as session:
        source = verify_reading._Source(session)
        with source.batches(verify_chain._event_sql(source, "1 = 1") + " ORDER BY 1") as batches:
            rows = [row for batch in batches for row in batch]
        assert all(exact(source, row) is not None for row in rows)
        monkeypatch.setattr(verify_chain, "_exact_details", lambda *_: pytest.fail("not fast"))
        assert all(verify_chain._intact_details(source, row) is not None for row in rows)
        edited = (*rows[-1][:2], "mallory", *rows[-1][3:])
        monkeypatch.setattr(verify_chain, "_exact_details", exact)
        assert verify_chain._intact_details(source, edited) is None
    assert len(rows) == _last_event(filled)


def test_logged_rows_keep_the_last_state_of_each_row() -> None:
    """Entries sorted in chunk by chunk: a row logged again keeps its latest event, rows in any
    id order end sorted."""
    rng = random.Random(SEED)
    rows = verify_rows._LoggedRows()
    latest: dict[int, int] = {}
    for event in range(1, 400):
        row_id = rng.choice([rng.randrange(50), 1000 + event])  # again, or new and increasing
        rows.new_ids.append(row_id)
        rows.new_events.append(event)
        rows.new_shapes.append(event % 3)
        rows.new_digests.append(event)
        latest[row_id] = event
        if len(rows.new_ids) >= rng.randrange(1, 40):
            rows.compact()
    rows.compact()
    assert rows.ids.tolist() == sorted(latest)
    assert rows.events.tolist() == [latest[i] for i in sorted(latest)]
    assert rows.digests.tolist() == [latest[i] for i in sorted(latest)]
    assert rows.shapes.tolist() == [latest[i] % 3 for i in sorted(latest)]
