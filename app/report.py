"""How the command line shows measurer output: result tables, training progress, evaluations;
and how stored rows are exported (JSON, CSV) by the CLI and the review UI.

Only presentation lives here; the commands in ``app.cli`` wire the stages together.

Exports carry every stored value, whatever it is: a float JSON cannot carry (infinite or NaN,
possible only in a database edited outside radcaliper) is written as the string ``"Infinity"``,
``"-Infinity"`` or ``"NaN"`` (in JSON and CSV alike), never as null (null means "no value", e.g.
not measurable) and never as the bare ``Infinity`` / ``NaN`` tokens that are not JSON.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from rich.console import Console
from rich.table import Table

from app.console import safe

if TYPE_CHECKING:
    from model.measurer.evaluate.scoring import Evaluation
    from model.measurer.results import StudyResult

__all__ = [
    "JSONValue",
    "comparison_markdown",
    "evaluation_table",
    "exportable",
    "print_result",
    "rows_csv",
    "rows_json",
]

# A value JSON can carry: stored rows as the exports and ``--json`` print them
JSONValue: TypeAlias = str | int | float | bool | list["JSONValue"] | dict[str, "JSONValue"] | None


def exportable(value: Any) -> Any:
    """``value`` with every float JSON cannot carry replaced by its name (``"Infinity"``,
    ``"-Infinity"``, ``"NaN"``), in lists, tuples and dicts too (tuples become lists)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {k: exportable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [exportable(v) for v in value]
    return value


def rows_json(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a JSON array (valid JSON whatever the values: see the module doc)."""
    return json.dumps([exportable(dict(r)) for r in rows], indent=2, allow_nan=False) + "\n"


def rows_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """The rows as CSV with a header (the first row's keys, else ``columns``); lists and dicts
    as JSON text, None as an empty cell, non-finite floats by name (see the module doc)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else list(columns))
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {
                k: json.dumps(v, allow_nan=False) if isinstance(v, list | dict) else v
                for k, v in exportable(dict(row)).items()
            }
        )
    return buffer.getvalue()


def _value(measurement: Any) -> str:
    if measurement.value_mm is None:
        return f"not measurable ({measurement.reason})"
    text = f"{measurement.value_mm:.1f} mm"
    if measurement.range_mm is not None:
        low, high = measurement.range_mm
        text += f"  [{low:.1f}, {high:.1f}] ({measurement.coverage:.0%})"
    return text


def print_result(console: Console, result: StudyResult) -> None:
    """A study's findings as a table, with the model named and its clinical status."""
    model = result.model
    console.print(
        f"[bold]{safe(model.name)} {safe(model.version)}[/bold] (numbers: {model.numeric_mode})"
        + ("  [red]NOT FOR CLINICAL USE[/red]" if model.not_for_clinical_use else ""),
    )
    console.print(
        f"study {safe(result.study_instance_uid)}  series {safe(result.series_instance_uid)}",
        highlight=False,
    )
    if not result.findings:
        console.print("No findings.")
    else:
        table = Table(show_lines=False)
        for column in ("#", "kind", "slice", "centre LPS mm", "measurement", "value [range]"):
            table.add_column(column)
        for finding in result.findings:
            center = ", ".join(f"{c:.1f}" for c in finding.center_lps_mm)
            for k, m in enumerate(finding.measurements):
                first = k == 0
                table.add_row(
                    str(finding.id) if first else "",
                    finding.kind.value if first else "",
                    str(finding.slice_index) if first else "",
                    center if first else "",
                    m.name.value.replace("_", " "),
                    _value(m),
                )
        console.print(table)
    for warning in result.warnings:
        console.print(f"[yellow]note[/yellow] {safe(warning)}", highlight=False)


def _mm(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def evaluation_table(evaluation: Evaluation, title: str) -> Table:
    """The issue's metrics of an evaluation as one table."""
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("studies (refused)", f"{evaluation.studies} ({evaluation.refused})"),
        (
            "lesions >= 10 mm found",
            f"{evaluation.lesions_10mm_found}/{evaluation.lesions_10mm} "
            f"({evaluation.lesion_recall:.3f})",
        ),
        (
            "vessels found",
            f"{evaluation.vessels_found}/{evaluation.vessels} ({evaluation.vessel_recall:.3f})",
        ),
        ("false findings per study", f"{evaluation.false_per_study:.3f}"),
    ]
    for name, mae in evaluation.mae_mm.items():
        rows.append(
            (f"MAE {name.replace('_', ' ')} (n)", f"{_mm(mae)} ({evaluation.counts[name]})")
        )
    for name, coverage in evaluation.coverage.items():
        width = evaluation.mean_width_mm[name]
        rows.append(
            (f"range coverage {name.replace('_', ' ')}", f"{coverage:.3f} (width {width:.2f})")
        )
    rows.append(("answers parsed", f"{evaluation.answers_parsed:.4f}"))
    rows.append(("malformed find answers", str(evaluation.malformed_find_answers)))
    rows.append(("seconds per study (median)", _mm(evaluation.seconds_median)))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _num(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def _ci(row: dict[str, Any], metric: str, digits: int = 2) -> str:
    low, high = row["ci95"].get(metric, (math.nan, math.nan))
    return f"{_num(row[metric], digits)} [{_num(low, digits)}, {_num(high, digits)}]"


def comparison_markdown(
    numeric: list[dict[str, Any]], positional: list[dict[str, Any]], header: list[str]
) -> str:
    """The evaluation's tables and verdicts as markdown (for benchmarks/RESULTS.md)."""
    lines = [*header, ""]
    columns = (
        "| mode | success | single MAE mm [95 % CI] | single R^2 | long MAE | short MAE | "
        "dual MAE mm^2 [95 % CI] | dual R^2 | single / long MAE on common items | "
        "lesion recall | precision | coverage @ 0.90 (width mm) |"
    )
    rule = "|" + "---|" * 12
    for title, rows in (("Numeric modes", numeric), ("Positional modes", positional)):
        lines += [f"#### {title}", "", columns, rule]
        for r in rows:
            common = r["common"]
            detection = r["detection"]
            lines.append(
                f"| {r['mode']} | {_num(r['success'], 3)} | {_ci(r, 'single_mae')} | "
                f"{_num(r['single_r2'], 3)} | {_num(r['long_mae'])} | {_num(r['short_mae'])} | "
                f"{_ci(r, 'dual_mae_mm2', 1)} | {_num(r['dual_r2'], 3)} | "
                f"{_num(common.get('single_mae'))} / {_num(common.get('long_mae'))} "
                f"(n = {r['common_items']}) | {_num(detection['lesion_recall_10mm'], 3)} | "
                f"{_num(detection['precision'], 3)} | {_num(r['coverage_90'], 3)} "
                f"({_num(r['mean_width_90_mm'])}) |"
            )
        lines.append("")
    by_mode = {r["mode"]: r for r in numeric}
    standard = by_mode.get("standard_tokens")
    rned = [by_mode[m] for m in ("rned_corr", "rned_rnd") if m in by_mode]
    if standard and rned:
        best = min(rned, key=lambda r: r["single_mae"] if math.isfinite(r["single_mae"]) else 1e9)
        ratio = best["single_mae"] / standard["single_mae"] if standard["single_mae"] else math.nan
        met = math.isfinite(ratio) and ratio <= 0.8 and best["success"] >= 0.99
        lines.append(
            f"RNED's best decoder ({best['mode']}): single MAE {_num(best['single_mae'])} mm = "
            f"{_num(ratio)} x standard tokens' {_num(standard['single_mae'])} mm (target <= 0.80), "
            f"success {_num(best['success'], 3)} (target >= 0.99): "
            f"{'MET' if met else 'NOT MET'}."
        )
    return "\n".join(lines) + "\n"
