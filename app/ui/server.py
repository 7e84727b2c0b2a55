"""The review UI's web server: our login page and sessions in front of the Gradio app.

Routes: ``GET /login`` (a form), ``POST /login`` (checks the user table's scrypt hash, opens a
server-side session, sets the ``radcaliper_session`` cookie), ``GET /logout``, ``GET /``
(redirects), ``/healthz``; the Gradio app lives under ``/app`` and is mounted with an
``auth_dependency``, so Gradio itself answers 401 to every page, file and API request without a
live session. Sessions expire after ``session_minutes`` whatever the browser does. Every login,
failed login and logout is an audit event.
"""

from __future__ import annotations

import html
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from app.ui.context import UiContext
from app.ui.sessions import COOKIE, Sessions

__all__ = ["APP_PATH", "create_app"]

logger = logging.getLogger(__name__)

APP_PATH = "/app"

_LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>radcaliper: log in</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 24rem; margin: 6rem auto; }}
input {{ display: block; width: 100%; margin: 0.3rem 0 1rem; padding: 0.4rem; }}
.error {{ color: #b00; }} .note {{ color: #555; font-size: 0.9rem; }}
</style></head>
<body><h1>radcaliper</h1>
<p class="note">Measurements for review. The bundled demo model is <b>not for clinical use</b>.</p>
{error}
<form method="post" action="/login">
<label for="username">User</label><input id="username" name="username" autocomplete="username">
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password">
<button type="submit" id="login">Log in</button>
</form></body></html>
"""


def create_app(context: UiContext, *, session_minutes: float = 30.0) -> FastAPI:
    """The FastAPI application (login, sessions, the mounted Gradio UI)."""
    import gradio as gr

    from app.ui.views import build_blocks
    from db.audit import append_event
    from db.users import get_user, verify_password

    sessions = Sessions(session_minutes * 60.0)
    app = FastAPI(title="radcaliper review", docs_url=None, redoc_url=None, openapi_url=None)

    def audit(actor: str, action: str, details: dict[str, Any]) -> None:
        with context.store.writer() as session:
            append_event(
                session,
                actor=actor,
                action=action,
                object_type="session",
                object_id=None,
                details=details,
            )
            session.commit()

    @app.get("/login", response_class=HTMLResponse)
    def login_page(error: str | None = None) -> HTMLResponse:
        message = f'<p class="error">{html.escape(error)}</p>' if error else ""
        return HTMLResponse(_LOGIN_PAGE.format(error=message))

    @app.post("/login")
    def login(username: str = Form(""), password: str = Form("")) -> Any:
        with context.store.reader() as session:
            user = get_user(session, username.strip())
        if user is None or not user.active or not verify_password(user.password_hash, password):
            audit(username.strip()[:64] or "?", "login.refused", {})
            return RedirectResponse("/login?error=Wrong+user+or+password", status_code=303)
        token = sessions.open(user.name, user.role.value)
        audit(user.name, "login", {"role": user.role.value})
        response = RedirectResponse(f"{APP_PATH}/", status_code=303)
        response.set_cookie(
            COOKIE,
            token,
            httponly=True,
            samesite="lax",
            max_age=int(sessions.lifetime_s),
            path="/",
        )
        return response

    @app.get("/logout")
    def logout(request: Request) -> Any:
        found = sessions.get(request.cookies.get(COOKIE))
        sessions.close(request.cookies.get(COOKIE))
        if found is not None:
            audit(found.user, "logout", {})
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @app.get("/")
    def root(request: Request) -> Any:
        live = sessions.get(request.cookies.get(COOKIE)) is not None
        return RedirectResponse(f"{APP_PATH}/" if live else "/login", status_code=303)

    @app.get("/healthz")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    def current_user(request: Request) -> str | None:
        session = sessions.get(request.cookies.get(COOKIE))
        return None if session is None else session.user

    blocks = build_blocks(context)
    mounted: FastAPI = gr.mount_gradio_app(
        app,
        blocks,
        path=APP_PATH,
        auth_dependency=current_user,
        footer_links=[],
        max_file_size=context.max_upload_bytes,
        allowed_paths=[str(Path(context.upload_dir))],
    )
    return mounted
