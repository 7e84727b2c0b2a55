"""Audit exports and plots survive any stored value (issue 21): 1e308 mm and infinite values
written with SQL, as a database from before corrections were checked (or edited by hand) holds
them, on SQLite and PostgreSQL. The agreement figure leaves them out and says so; JSON stays
JSON (no ``Infinity`` / ``NaN`` tokens); CSV names them; the settings carry the limits."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from sqlalchemy import select, update
from typer.testing import CliRunner

from app.cli import app
from app.evaluation.plots import agreement_figure
from app.report import rows_csv, rows_json
from app.settings import Settings
from db.engine import Store
from db.models import Measurement, ReviewStatus, User
from db.queries import MeasurementFilter, measurement_rows
from db.review import CorrectionLimits, review_measurement

runner = CliRunner()


def _strict_json(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _extreme(store: Store, users: dict[str, User]) -> dict[str, int]:
    """Every measurement accepted, then with SQL: the long axis corrected to 1e308 mm, the short
    axis to infinity, the diameter's range up to infinity (its value stays plausible)."""
    with store.reader() as session:
        ids = {
            name: mid
            for mid, name in session.execute(select(Measurement.id, Measurement.name)).all()
        }
    for mid in ids.values():
        with store.writer() as session:
            review_measurement(
                session, mid, action="accept", reviewer=users["alice"], seen_version=1
            )
            session.commit()
    corrected = {"status": ReviewStatus.CORRECTED}
    with store.writer() as session:
        for name, values in (
            ("long_axis", {**corrected, "reviewed_value_mm": 1e308}),
            ("short_axis", {**corrected, "reviewed_value_mm": float("inf")}),
            ("diameter", {"range_high_mm": float("inf")}),
        ):
            session.execute(update(Measurement).where(Measurement.id == ids[name]).values(values))
        session.commit()
    return ids


def _rows(store: Store) -> list[dict[str, Any]]:
    with store.reader() as session:
        return measurement_rows(session, MeasurementFilter())


def test_the_agreement_figure_leaves_implausible_values_out(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    ids = _extreme(store, users)
    figure, summary = agreement_figure(_rows(store))
    assert summary.startswith("1 reviewed measurements: model - reviewer bias +0.00 mm")
    assert summary.endswith(
        "; 2 left out with an implausible value (not finite, not > 0 or over the limit: "
        "long/short axis 500/500 mm, diameter 100 mm): measurement "
        f"{ids['long_axis']}, {ids['short_axis']}"
    )
    png = io.BytesIO()
    figure.savefig(png, format="png")  # it draws, too
    assert png.getvalue().startswith(b"\x89PNG")


def test_json_and_csv_exports_carry_every_value(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    ids = _extreme(store, users)
    rows = _rows(store)
    exported = {r["measurement_id"]: r for r in _strict_json(rows_json(rows))}
    assert exported[ids["long_axis"]]["reviewed_value_mm"] == 1e308
    assert exported[ids["short_axis"]]["reviewed_value_mm"] == "Infinity"
    assert exported[ids["diameter"]]["range_mm"] == [24.0, "Infinity"]
    table = {
        int(r["measurement_id"]): r for r in csv.DictReader(io.StringIO(rows_csv(rows, ["x"])))
    }
    assert table[ids["long_axis"]]["reviewed_value_mm"] == "1e+308"
    assert table[ids["short_axis"]]["reviewed_value_mm"] == "Infinity"
    assert json.loads(table[ids["diameter"]]["range_mm"]) == [24.0, "Infinity"]


def test_the_audit_command_writes_valid_json_and_csv(
    store: Store, stored: int, users: dict[str, User]
) -> None:
    ids = _extreme(store, users)
    command = ["audit", "measurements", "--db", str(store.url), "--format"]
    done = runner.invoke(app, [*command, "json"])
    assert done.exit_code == 0, done.output
    by_id = {r["measurement_id"]: r for r in _strict_json(done.stdout)}
    assert by_id[ids["long_axis"]]["reviewed_value_mm"] == 1e308
    assert by_id[ids["short_axis"]]["reviewed_value_mm"] == "Infinity"
    as_csv = runner.invoke(app, [*command, "csv"])
    assert as_csv.exit_code == 0 and ",Infinity," in as_csv.stdout


def test_settings_carry_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().correction_limits == CorrectionLimits()  # one set of defaults
    monkeypatch.setenv("RADCALIPER_MAX_DIAMETER_MM", "150")
    monkeypatch.setenv("RADCALIPER_MAX_LONG_AXIS_MM", "350.5")
    limits = Settings().correction_limits
    assert (limits.long_axis_mm, limits.short_axis_mm, limits.diameter_mm) == (350.5, 500, 150)
    for bad in ("0", "inf", "nan", "-5", "1e308", "10001"):
        monkeypatch.setenv("RADCALIPER_MAX_SHORT_AXIS_MM", bad)
        with pytest.raises(ValueError, match="max_short_axis_mm"):
            Settings()
