"""The review UI's pages (Gradio Blocks): worklist, study view, upload, audit, users.

Every handler checks the acting user on the server (``request.username`` set by the login
session; role from the user table), whatever the layout shows: a reviewer or admin may review,
an auditor may not (the controls are hidden and the handler refuses), only auditors and admins
query the audit log, only admins administer users (unlock, disable, enable, reset a password,
change a role: each an audit event; the last enabled admin stays). Refusals and bad input reach
the browser as ``gr.Error`` messages.
"""

# No ``from __future__ import annotations`` here: Gradio reads the handlers' annotations to
# inject ``gr.Request``, ``gr.SelectData`` and ``gr.Progress``, and needs them evaluated.
import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import ParamSpec, TypeVar

import gradio as gr
from PIL import Image

from app.report import exportable, rows_csv
from app.ui import study as study_view
from app.ui.context import UiContext
from app.ui.escaping import markdown_text
from app.ui.render import WINDOWS
from app.ui.study import (
    REVIEWERS,
    OpenedStudy,
    ReviewOutputs,
    StudyState,
    Update,
    range_span,
    user_name,
)
from app.ui.tempfiles import private_export
from db.models import Role
from ingestion.errors import RadcaliperError

__all__ = ["build_blocks"]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

AUDITORS = (Role.AUDITOR, Role.ADMIN)
USER_HEADERS = ["name", "role", "active", "password", "must change", "locked"]
USER_ACTIONS = ("unlock", "disable", "enable", "reset password", "set role")
WORKLIST_HEADERS = ["study", "patient", "date", "model", "measured", "findings", "to review"]
TABLE_HEADERS = ["id", "finding", "kind", "measurement", "value mm", "range mm", "status", "by"]
AUDIT_HEADERS = [
    "patient",
    "study",
    "finding",
    "name",
    "value mm",
    "range mm",
    "model",
    "status",
    "reviewed mm",
    "reviewer",
    "reviewed at",
]
DEMO_BANNER = (
    "**radcaliper review** — every value is a model output with its calibrated range. "
    "The bundled demo model is trained on synthetic phantoms and is **not for clinical use**."
)


def _errors_to_gradio(handler: Callable[P, R]) -> Callable[P, R]:
    """radcaliper's errors (refusals included) become a message in the browser."""

    @functools.wraps(handler)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return handler(*args, **kwargs)
        except gr.Error:
            raise
        except (RadcaliperError, ValueError) as error:
            raise gr.Error(str(error)) from error

    return wrapped


# --- worklist ------------------------------------------------------------------------------------


def _worklist(
    context: UiContext, patient: str, status: str, request: gr.Request
) -> tuple[list[list[object]], Update]:
    from db.queries import WorklistFilter, worklist_rows

    context.user(user_name(request))
    filters = WorklistFilter(
        patient_id=patient.strip() or None, status=None if status == "all" else status
    )
    with context.store.reader() as session:
        rows = worklist_rows(session, filters, pseudonym_key=context.pseudonym_key)
    table: list[list[object]] = [
        [
            r["study_instance_uid"],
            r["patient_id"],
            r["study_date"] or "",
            r["model"],
            r["measured_at"][:16].replace("T", " "),
            r["findings"],
            r["to_review"],
        ]
        for r in rows
    ]
    choices = [r["study_instance_uid"] for r in rows]
    return table, gr.update(choices=choices, value=choices[0] if choices else None)


# --- audit ---------------------------------------------------------------------------------------


def _parse_day(name: str, value: str) -> datetime | None:
    if not value.strip():
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise gr.Error(f"{name} {value!r} is not a date (use 2026-11-23)") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _audit(
    context: UiContext, patient: str, study: str, since: str, until: str, version: str,
    status: str, reviewer: str, request: gr.Request,
) -> tuple[list[list[object]], str, object, str]:  # fmt: skip
    from app.evaluation.plots import agreement_figure
    from db.models import ReviewStatus
    from db.queries import MeasurementFilter, measurement_rows

    context.user(user_name(request), *AUDITORS)
    filters = MeasurementFilter(
        patient_id=patient.strip() or None,
        study_instance_uid=study.strip() or None,
        since=_parse_day("since", since),
        until=_parse_day("until", until),
        model_version=version.strip() or None,
        status=None if status == "all" else ReviewStatus(status),
        reviewer=reviewer.strip() or None,
        limit=5000,
    )
    with context.store.reader() as session:
        rows = measurement_rows(session, filters, pseudonym_key=context.pseudonym_key)
    table: list[list[object]] = [
        [
            r["patient_id"],
            r["study_instance_uid"],
            r["finding_id"],
            r["name"],
            exportable(r["value_mm"]),  # exact, but inf / NaN by name (never a failed query)
            range_span(r["range_mm"]),
            r["model_version"],
            r["status"],
            exportable(r["reviewed_value_mm"]),
            r["reviewer"] or "",
            r["reviewed_at"] or "",
        ]
        for r in rows
    ]
    # owner-only, in the UI's private folder, which Gradio serves it from and sweeps
    path = private_export(context.temp_dir, "measurements.csv", rows_csv(rows, ["no rows"]))
    figure, summary = agreement_figure(rows, context.correction_limits)
    return table, str(path), figure, summary


# --- users (admins) ------------------------------------------------------------------------------


def _user_rows(context: UiContext) -> tuple[list[list[str]], list[str]]:
    from sqlalchemy import select

    from db.logins import login_locks
    from db.models import User

    with context.store.reader() as session:
        users = session.execute(select(User).order_by(User.name)).scalars().all()
        locks = login_locks(session, context.login_limits, datetime.now(UTC))
    held: dict[str, list[str]] = {}
    for lock in locks:
        until = lock.until.astimezone(UTC).strftime("%H:%M:%S UTC")
        held.setdefault(lock.user or "", []).append(f"from {lock.address} until {until}")
    table = [
        [
            u.name,
            u.role.value,
            "yes" if u.active else "no",
            "yes" if u.password_hash else "no",
            "yes" if u.must_change_password else "",
            "; ".join(held.get(u.name, [])),
        ]
        for u in users
    ]
    everyone = held.get("", [])
    if everyone:
        table.append(["(every name)", "", "", "", "", "; ".join(everyone)])
    return table, [u.name for u in users]


def _users(context: UiContext, request: gr.Request) -> tuple[list[list[str]], Update]:
    context.user(user_name(request), Role.ADMIN)
    table, names = _user_rows(context)
    return table, gr.update(choices=names)


def _administer(
    context: UiContext, action: str, name: str | None, role: str, password: str,
    request: gr.Request,
) -> tuple[list[list[str]], Update, str, str]:  # fmt: skip
    from db.users import reset_password, set_active, set_role, unlock_user

    admin = context.user(user_name(request), Role.ADMIN)
    if not name:
        raise gr.Error("choose a user first")
    with context.store.writer() as session:
        if action == "unlock":
            count = unlock_user(session, name, actor=admin.name)
            said = f"Unlocked {name}: {count} failed login(s) forgotten."
        elif action in ("disable", "enable"):
            set_active(session, name, action == "enable", actor=admin.name)
            said = f"{action.capitalize()}d {name}."
        elif action == "reset password":
            reset_password(session, name, password, actor=admin.name)
            said = f"Password of {name} set: they must change it at the next login."
        elif action == "set role":
            set_role(session, name, role, actor=admin.name)
            said = f"{name} is now {role}."
        else:
            raise gr.Error(f"unknown action {action!r}")
        session.commit()
    if action != "unlock" and action != "enable":
        context.end_sessions(name)  # here at once; other servers at the user's next request
    table, names = _user_rows(context)
    return table, gr.update(choices=names, value=name), markdown_text(said), ""


# --- layout --------------------------------------------------------------------------------------


def _roles(context: UiContext, request: gr.Request) -> tuple[str, Update, Update, Update, Update]:
    user = context.user(user_name(request))
    reviewer = user.role in REVIEWERS
    auditor = user.role in AUDITORS
    return (
        f"Logged in as **{markdown_text(user.name)}** ({user.role.value})",
        gr.update(visible=reviewer),
        gr.update(visible=reviewer),
        gr.update(visible=auditor),
        gr.update(visible=user.role is Role.ADMIN),
    )


# Log out is a POST (a link elsewhere cannot log anyone out): a form the button submits
_LOG_OUT = """() => {
    const form = document.createElement("form");
    form.method = "post";
    form.action = "/logout";
    document.body.appendChild(form);
    form.submit();
}"""


def build_blocks(context: UiContext) -> gr.Blocks:
    """The whole UI; mounted behind the login by ``app.ui.server``."""
    with gr.Blocks(title="radcaliper review") as blocks:
        gr.Markdown(DEMO_BANNER)
        with gr.Row(equal_height=True):
            who = gr.Markdown()
            gr.Button("Change password", link="/password", size="sm", scale=0, elem_id="password")
            # the server ends the session for every tab, whose next action then says so
            log_out = gr.Button("Log out", size="sm", scale=0, elem_id="logout")
        study_state = gr.State(None)
        with gr.Tabs() as tabs:
            with gr.Tab("Worklist", id="worklist"):
                with gr.Row():
                    patient_filter = gr.Textbox(label="patient ID", scale=2)
                    status_filter = gr.Radio(
                        ["all", "pending", "reviewed"], value="all", label="review status"
                    )
                    refresh = gr.Button("Refresh")
                worklist = gr.Dataframe(headers=WORKLIST_HEADERS, interactive=False, wrap=True)
                with gr.Row():
                    study_choice = gr.Dropdown(label="study", choices=[], scale=3)
                    open_button = gr.Button("Open study", variant="primary")
            with gr.Tab("Study", id="study"):
                title = gr.Markdown("Open a study from the worklist.")
                with gr.Row():
                    with gr.Column(scale=3):
                        image = gr.Image(
                            type="pil", interactive=False, label="slice", format="png",
                            elem_id="study-image",
                        )  # fmt: skip
                        slice_slider = gr.Slider(
                            0, 1, step=1, value=0, label="slice", elem_id="slice-slider"
                        )
                        with gr.Row():
                            preset = gr.Radio(
                                [*WINDOWS, "custom"], value="soft tissue", label="window"
                            )
                            level = gr.Number(value=40, label="level HU")
                            width = gr.Number(value=400, label="width HU")
                            zoom = gr.Slider(1.0, 4.0, step=0.25, value=1.0, label="zoom")
                        clicked = gr.Markdown("Click the image to ask the model to measure there.")
                    with gr.Column(scale=2):
                        table = gr.Dataframe(
                            headers=TABLE_HEADERS, interactive=False, wrap=True,
                            elem_id="study-table",
                        )  # fmt: skip
                        with gr.Group(visible=False) as review_box:
                            measurement = gr.Dropdown(label="measurement id", choices=[])
                            action = gr.Radio(
                                ["accept", "correct", "reject"], value="accept", label="action"
                            )
                            value = gr.Textbox(
                                label="corrected value (mm)", value="", placeholder="e.g. 23.5"
                            )  # text, empty at first: what is typed is checked on the server
                            reason = gr.Textbox(label="reason (needed to correct or reject)")
                            submit = gr.Button("Save review", variant="primary")
                        review_status = gr.Markdown(elem_id="review-status")
            with gr.Tab("Upload", visible=False) as upload_tab:
                upload = gr.File(label="zipped DICOM folder or NIfTI file", type="filepath")
                upload_button = gr.Button("Ingest and measure", variant="primary")
                upload_status = gr.Textbox(label="result", lines=4, interactive=False)
            with gr.Tab("Audit", visible=False) as audit_tab:
                with gr.Row():
                    a_patient = gr.Textbox(label="patient ID")
                    a_study = gr.Textbox(label="study UID")
                    a_since = gr.Textbox(label="measured since (YYYY-MM-DD)")
                    a_until = gr.Textbox(label="measured before (YYYY-MM-DD)")
                with gr.Row():
                    a_version = gr.Textbox(label="model version")
                    a_status = gr.Dropdown(
                        ["all", "pending", "accepted", "corrected", "rejected"],
                        value="all",
                        label="status",
                    )
                    a_reviewer = gr.Textbox(label="reviewer")
                    a_run = gr.Button("Query", variant="primary")
                audit_table = gr.Dataframe(headers=AUDIT_HEADERS, interactive=False, wrap=True)
                with gr.Row():
                    audit_csv = gr.DownloadButton("Download CSV")
                    agreement = gr.Markdown()
                audit_plot = gr.Plot(label="model vs reviewer (Bland-Altman)")
            with gr.Tab("Users", visible=False) as users_tab:
                users_table = gr.Dataframe(headers=USER_HEADERS, interactive=False, wrap=True)
                with gr.Row():
                    # any name may be sent: the handler checks the admin and the user
                    u_name = gr.Dropdown(label="user", choices=[], scale=2, allow_custom_value=True)
                    u_action = gr.Radio(list(USER_ACTIONS), value="unlock", label="action")
                with gr.Row():
                    u_role = gr.Dropdown(
                        [r.value for r in Role], value=Role.REVIEWER.value, label="new role"
                    )
                    u_password = gr.Textbox(
                        label="new password (the user must change it at the next login)",
                        type="password",
                    )
                with gr.Row():
                    u_apply = gr.Button("Apply", variant="primary")
                    u_refresh = gr.Button("Refresh")
                u_status = gr.Markdown(elem_id="users-status")

        view: list[gr.Slider | gr.Radio | gr.Number] = [slice_slider, preset, level, width, zoom]

        @_errors_to_gradio
        def roles(request: gr.Request) -> tuple[str, Update, Update, Update, Update]:
            return _roles(context, request)

        @_errors_to_gradio
        def worklist_rows(
            patient: str, status: str, request: gr.Request
        ) -> tuple[list[list[object]], Update]:
            return _worklist(context, patient, status, request)

        @_errors_to_gradio
        def open_study(
            study_uid: str | None, preset_: str, level_: float, width_: float, zoom_: float,
            request: gr.Request,
        ) -> OpenedStudy:  # fmt: skip
            return study_view.open_study(
                context, study_uid, preset_, level_, width_, zoom_, request
            )

        @_errors_to_gradio
        def redraw(
            study: StudyState | None, index: int, preset_: str, level_: float,
            width_: float, zoom_: float, selected: int | None, request: gr.Request,
        ) -> Image.Image | None:  # fmt: skip
            return study_view.redraw(
                context, study, index, preset_, level_, width_, zoom_, selected, request
            )

        @_errors_to_gradio
        def review(
            study: StudyState | None, measurement_id: int | None, action_: str,
            value_: str | None, reason_: str, index: int, preset_: str, level_: float,
            width_: float, zoom_: float, request: gr.Request,
        ) -> ReviewOutputs:  # fmt: skip
            return study_view.review(
                context, study, measurement_id, action_, value_, reason_, index, preset_,
                level_, width_, zoom_, request,
            )  # fmt: skip

        @_errors_to_gradio
        def click(
            study: StudyState | None, index: int, zoom_: float, evt: gr.SelectData,
            request: gr.Request,
        ) -> str:  # fmt: skip
            return study_view.click(context, study, index, zoom_, evt, request)

        @_errors_to_gradio
        def ingest(
            file: str | None,
            request: gr.Request,
            progress: gr.Progress = gr.Progress(),  # noqa: B008 - Gradio's progress bar
        ) -> str:
            return study_view.upload(context, file, request, progress)

        @_errors_to_gradio
        def audit(
            patient: str, study: str, since: str, until: str, version: str, status: str,
            reviewer: str, request: gr.Request,
        ) -> tuple[list[list[object]], str, object, str]:  # fmt: skip
            return _audit(context, patient, study, since, until, version, status, reviewer, request)

        @_errors_to_gradio
        def users(request: gr.Request) -> tuple[list[list[str]], Update]:
            return _users(context, request)

        @_errors_to_gradio
        def administer(
            action_: str, name_: str | None, role_: str, password_: str, request: gr.Request
        ) -> tuple[list[list[str]], Update, str, str]:
            return _administer(context, action_, name_, role_, password_, request)

        blocks.load(
            roles,
            outputs=[who, review_box, upload_tab, audit_tab, users_tab],
            api_visibility="private",
        )
        log_out.click(None, js=_LOG_OUT)
        u_refresh.click(users, outputs=[users_table, u_name], api_name="users")
        users_tab.select(users, outputs=[users_table, u_name], api_visibility="private")
        u_apply.click(
            administer,
            inputs=[u_action, u_name, u_role, u_password],
            outputs=[users_table, u_name, u_status, u_password],
            api_name="administer",
        )
        blocks.load(
            worklist_rows,
            inputs=[patient_filter, status_filter],
            outputs=[worklist, study_choice],
            api_visibility="private",
        )
        refresh.click(
            worklist_rows,
            inputs=[patient_filter, status_filter],
            outputs=[worklist, study_choice],
            api_name="worklist",
        )
        open_button.click(
            open_study,
            inputs=[study_choice, preset, level, width, zoom],
            outputs=[tabs, study_state, slice_slider, image, table, measurement, title],
            api_name="open_study",
        )
        for control in [*view, measurement]:  # user input only, not the updates open_study makes
            control.input(
                redraw,
                inputs=[study_state, *view, measurement],
                outputs=image,
                api_visibility="private",
            )
        submit.click(
            review,
            inputs=[study_state, measurement, action, value, reason, *view],
            outputs=[study_state, table, image, review_status, value],
            api_name="review",
        )
        image.select(
            click, inputs=[study_state, slice_slider, zoom], outputs=clicked, api_name="measure_at"
        )
        upload_button.click(ingest, inputs=[upload], outputs=upload_status, api_name="upload")
        a_run.click(
            audit,
            inputs=[a_patient, a_study, a_since, a_until, a_version, a_status, a_reviewer],
            outputs=[audit_table, audit_csv, audit_plot, agreement],
            api_name="audit",
        )
    built: gr.Blocks = blocks
    return built
