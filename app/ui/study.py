"""The review UI's study view and upload handlers (``app.ui.views`` lays them out): the
image with its outlines, the measurements table, reviews and corrections, a clicked
measurement, and an uploaded study measured and stored. Each checks the acting user."""

# No ``from __future__ import annotations`` here: Gradio reads the handlers' annotations to
# inject ``gr.Request``, ``gr.SelectData`` and ``gr.Progress``, and needs them evaluated.

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict, TypeGuard

import gradio as gr
from PIL import Image

from app.report import exportable
from app.ui.context import UiContext
from app.ui.escaping import markdown_text
from app.ui.render import WINDOWS, Overlay, index_of, render_slice
from db.engine import Store
from db.models import ReviewAction, Role
from ingestion.errors import RadcaliperError, StaleEditError

__all__ = [
    "REVIEWERS",
    "OpenedStudy",
    "ReviewOutputs",
    "StudyState",
    "TableRow",
    "Update",
    "click",
    "open_study",
    "range_span",
    "redraw",
    "review",
    "study_overlays",
    "study_state",
    "upload",
    "user_name",
]

logger = logging.getLogger(__name__)

REVIEWERS = (Role.REVIEWER, Role.ADMIN)

Update = dict[str, object]  # a component's new properties: what gr.update() and gr.skip() return
TableRow = list[int | str]  # a row of the measurements table


class MeasurementState(TypedDict):
    """A stored measurement as the study view holds it (``db.queries.study_measurements``)."""

    id: int
    name: str
    value_mm: float | None
    range_mm: tuple[float, float] | None
    status: str
    reviewed_value_mm: float | None
    reviewer: str | None
    version: int


class FindingState(TypedDict):
    """A stored finding with its measurements."""

    number: int
    kind: str
    slice_index: int
    center_lps_mm: tuple[float, float, float]
    axes_lps_mm: tuple[tuple[tuple[float, float, float], ...], ...] | None
    measurements: list[MeasurementState]


class StudyState(TypedDict):
    """The open study (the page's ``gr.State``): its latest run with findings and measurements."""

    run_id: int
    series_instance_uid: str
    source: str
    model: str
    not_for_clinical_use: bool
    findings: list[FindingState]
    study_instance_uid: str


# open_study's outputs: the tab, the study, the slider, the image, the table, the measurement
# choice, the title
OpenedStudy = tuple[gr.Tabs, StudyState, Update, Image.Image, list[TableRow], Update, str]
# review's outputs: the study, the table, the image, the status line, the value field
ReviewOutputs = tuple[
    StudyState | Update, list[TableRow] | Update, Image.Image | Update, str, str | Update
]


def user_name(request: gr.Request | None) -> str | None:
    """The logged-in user's name (None outside a session)."""
    return None if request is None else getattr(request, "username", None)


# --- study view ----------------------------------------------------------------------------------


def _study_state(context: UiContext, study_uid: str) -> StudyState:
    return study_state(context.store, study_uid)


def study_state(store: Store, study_uid: str) -> StudyState:
    """What the study view shows of a stored study: its latest run's findings (``gr.Error``
    when it is not stored)."""
    from db.queries import study_measurements

    with store.reader() as session:
        study = study_measurements(session, study_uid)
    if study is None:
        raise gr.Error(f"study {study_uid} is not stored")
    return StudyState(
        run_id=study["run_id"],
        series_instance_uid=study["series_instance_uid"],
        source=study["source"],
        model=study["model"],
        not_for_clinical_use=study["not_for_clinical_use"],
        findings=study["findings"],
        study_instance_uid=study_uid,
    )


def _mm(value: object) -> str:
    """A stored value for the tables, with one decimal. Any value shows, even one the checks
    would refuse today (1e308, inf, NaN from an old or edited database), and a value that is no
    number at all (text written into the column by hand) as invalid: never a failed query."""
    if value is None:
        return ""
    if not _is_number(value):
        return f"invalid ({str(value)[:24]!r})"
    if not math.isfinite(value):
        return str(exportable(value))
    return f"{value:.1f}" if abs(value) < 1e6 else f"{value:g}"


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def range_span(range_mm: Sequence[object] | None) -> str:
    return "" if range_mm is None else f"{_mm(range_mm[0])}-{_mm(range_mm[1])}"


def _table(study: StudyState) -> list[TableRow]:
    rows: list[TableRow] = []
    for finding in study["findings"]:
        for m in finding["measurements"]:
            value = "not measurable" if m["value_mm"] is None else _mm(m["value_mm"])
            shown = m["reviewed_value_mm"]
            if shown is not None:
                value += f" -> {_mm(shown)}"
            span = range_span(m["range_mm"])
            rows.append(
                [
                    m["id"],
                    finding["number"],
                    finding["kind"],
                    m["name"].replace("_", " "),
                    value,
                    span,
                    m["status"],
                    m["reviewer"] or "",
                ]
            )
    return rows


def _valid_axes(axes: object) -> bool:
    """Stored axes as the overlay draws them: lists of points of three numbers."""
    sequence = (list, tuple)
    return isinstance(axes, sequence) and all(
        isinstance(line, sequence)
        and all(isinstance(p, sequence) and len(p) == 3 and all(map(_is_number, p)) for p in line)
        for line in axes
    )


def study_overlays(study: StudyState, selected: int | None) -> list[Overlay]:
    """What the study image draws of each finding: its stored end points, exactly (a finding
    without a valid stored place is not drawn; axes that are not numbers are not drawn)."""
    out = []
    for finding in study["findings"]:
        ids = [m["id"] for m in finding["measurements"]]
        diameter = next(
            (m["value_mm"] for m in finding["measurements"] if m["name"] == "diameter"), None
        )
        if diameter is not None and not _is_number(diameter):
            diameter = None  # an invalid stored value draws no circle (the table says invalid)
        center, axes = finding["center_lps_mm"], finding["axes_lps_mm"]
        if not all(_is_number(c) for c in center) or not isinstance(finding["slice_index"], int):
            logger.warning("finding %s: its stored position is not numbers: not drawn", ids)
            continue  # geometry is never guessed: a finding without a valid place is not drawn
        if axes is not None and not _valid_axes(axes):
            axes = None
        out.append(
            Overlay(
                number=finding["number"],
                kind=finding["kind"],
                slice_index=finding["slice_index"],
                center_lps_mm=(*center,),
                axes_lps_mm=axes,
                diameter_mm=diameter,
                selected=selected in ids,
            )
        )
    return out


def _window(preset: str, level: float, width: float) -> tuple[float, float]:
    if preset in WINDOWS:
        return WINDOWS[preset]
    if not width or width <= 0:
        raise gr.Error("a custom window needs a width > 0 HU")
    return (float(level), float(width))


def _image(
    context: UiContext,
    study: StudyState,
    index: int,
    preset: str,
    level: float,
    width: float,
    zoom: float,
    selected: int | None,
) -> Image.Image:
    volume = context.volume(study["source"], study["series_instance_uid"])
    index = max(0, min(int(index), volume.shape[0] - 1))
    return render_slice(
        volume, index, _window(preset, level, width), zoom, study_overlays(study, selected)
    )


def open_study(
    context: UiContext, study_uid: str | None, preset: str, level: float, width: float,
    zoom: float, request: gr.Request,
) -> OpenedStudy:  # fmt: skip
    user = context.user(user_name(request))
    if not study_uid:
        raise gr.Error("choose a study in the worklist first")
    study = _study_state(context, study_uid)
    volume = context.volume(study["source"], study["series_instance_uid"])
    first = study["findings"][0]["slice_index"] if study["findings"] else volume.shape[0] // 2
    measurement_ids = [m[0] for m in _table(study)]
    banner = f"{study['model']}" + (
        "  —  NOT FOR CLINICAL USE" if study["not_for_clinical_use"] else ""
    )
    return (
        gr.Tabs(selected="study"),
        study,
        gr.update(maximum=volume.shape[0] - 1, value=first),
        _image(context, study, first, preset, level, width, zoom, None),
        _table(study),
        gr.update(choices=measurement_ids, value=measurement_ids[0] if measurement_ids else None),
        f"**{markdown_text(study_uid)}** — {markdown_text(banner)}; logged in as "
        f"{markdown_text(user.name)} ({user.role.value})",
    )


def redraw(
    context: UiContext, study: StudyState | None, index: int, preset: str, level: float,
    width: float, zoom: float, selected: int | None, request: gr.Request,
) -> Image.Image | None:  # fmt: skip
    context.user(user_name(request))
    if not study:
        return None
    return _image(context, study, index, preset, level, width, zoom, selected)


def _corrected_value(action: str, value: str | float | None) -> float | None:
    """The corrected value typed in the field (text, parsed here so that anything typed gets a
    clear message); None unless the action is a correction. Plausibility is the store's check
    (``db.review``), so every caller gets the same rule."""
    if action != "correct":
        return None
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError("a correction needs the corrected value: type it in mm, e.g. 23.5")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        raise ValueError(
            f"{str(value).strip()[:40]!r} is not a number: type the corrected value in mm, "
            "e.g. 23.5 (with a decimal point)"
        ) from None


def review(
    context: UiContext, study: StudyState | None, measurement_id: int | None, action: str,
    value: str | float | None, reason: str, index: int, preset: str, level: float, width: float,
    zoom: float, request: gr.Request,
) -> ReviewOutputs:  # fmt: skip
    """Save one review. A refused input (no value, text, 0, 1e308, NaN, ...) or a stale edit
    changes nothing on the page but the status line, which says why (no error overlay on the
    image and the table); a stale edit also shows the measurement as it is now."""
    from db.review import review_measurement

    user = context.user(user_name(request), *REVIEWERS)
    if not study or measurement_id is None:
        raise gr.Error("open a study and choose a measurement first")
    seen = None
    for finding in study["findings"]:
        for m in finding["measurements"]:
            if m["id"] == int(measurement_id):
                seen = m["version"]
    if seen is None:
        raise gr.Error(f"measurement {measurement_id} is not in this study")
    try:
        corrected = _corrected_value(action, value)
        with context.store.writer() as session:
            review_measurement(
                session,
                int(measurement_id),
                action=ReviewAction(action),
                reviewer=user,
                seen_version=seen,
                value_mm=corrected,
                reason=(reason or "").strip() or None,
                limits=context.correction_limits,
            )
            session.commit()
    except ValueError as error:  # one message, in the status line; the page stays as it was
        return gr.skip(), gr.skip(), gr.skip(), f"**Not saved:** {markdown_text(error)}", gr.skip()
    except StaleEditError as error:
        fresh = _study_state(context, study["study_instance_uid"])
        image = _image(context, fresh, index, preset, level, width, zoom, int(measurement_id))
        return fresh, _table(fresh), image, f"**Not saved:** {markdown_text(error)}", gr.skip()
    fresh = _study_state(context, study["study_instance_uid"])
    message = f"{action} of measurement {measurement_id} saved by {user.name}"
    return (
        fresh,
        _table(fresh),
        _image(context, fresh, index, preset, level, width, zoom, int(measurement_id)),
        message,
        "",  # the next correction starts from an empty field
    )


def click(
    context: UiContext, study: StudyState | None, index: int, zoom: float,
    evt: gr.SelectData, request: gr.Request,
) -> str:  # fmt: skip
    from db.audit import append_event

    user = context.user(user_name(request), *REVIEWERS)
    if not study:
        raise gr.Error("open a study first")
    volume = context.volume(study["source"], study["series_instance_uid"])
    x, y = (float(v) for v in evt.index)
    row, column = index_of(volume, zoom, x, y)
    lps = volume.geometry.index_to_lps((int(index), row, column))
    point = (float(lps[0]), float(lps[1]), float(lps[2]))
    finding = context.measurer().measure_at(volume, point)
    text = (
        "the model sees nothing it can measure there"
        if finding is None
        else f"{finding.kind.value}: "
        + ", ".join(
            f"{m.name.value.replace('_', ' ')} "
            + ("not measurable" if m.value_mm is None else f"{m.value_mm:.1f} mm")
            + ("" if m.range_mm is None else f" [{m.range_mm[0]:.1f}, {m.range_mm[1]:.1f}]")
            for m in finding.measurements
        )
    )
    with context.store.writer() as session:
        append_event(
            session,
            actor=user.name,
            action="point.measured",
            object_type="run",
            object_id=int(study["run_id"]),
            details={
                "point_lps_mm": list(point),
                "slice_index": int(index),
                "result": None if finding is None else finding.to_json(),
            },
        )
        session.commit()
    return f"At ({point[0]:.1f}, {point[1]:.1f}, {point[2]:.1f}) mm: {text}"


# --- upload --------------------------------------------------------------------------------------


def upload(context: UiContext, file: str | None, request: gr.Request, progress: gr.Progress) -> str:
    from app.measuring import measure_and_store
    from app.ui.uploads import receive_upload
    from ingestion.load import load_path

    user = context.user(user_name(request), *REVIEWERS)
    if not file:
        raise gr.Error("choose a zipped DICOM folder or a NIfTI file first")
    progress(0.05, desc="checking the upload")
    kept = receive_upload(
        Path(file), context.upload_dir, max_bytes=context.max_upload_bytes, on_step=None
    )
    progress(0.2, desc="reading the images")
    loaded = load_path(kept.path, context.nifti_modality)
    if not loaded.volumes:
        reasons = "; ".join(r.reason for r in loaded.rejected[:3]) or "no images"
        raise gr.Error(f"the upload holds no usable CT series ({reasons})")
    measurer = context.measurer()
    lines = []
    for k, volume in enumerate(loaded.volumes):
        progress(0.3 + 0.6 * k / len(loaded.volumes), desc=f"measuring series {k + 1}")
        try:
            measured = measure_and_store(
                measurer,
                volume,
                source=str(kept.path),
                store=context.store,
                actor=user.name,
                pseudonym_key=context.pseudonym_key,
            )
        except RadcaliperError as error:
            lines.append(f"series {volume.identifiers.series_instance_uid}: not measured: {error}")
            continue
        result = measured.result
        lines.append(f"study {result.study_instance_uid}: {len(result.findings)} finding(s) stored")
    progress(1.0, desc="done")
    return "\n".join(lines)
