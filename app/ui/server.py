"""The review UI's web server: our login page and sessions in front of the Gradio app.

Routes: ``GET /login`` (a form), ``POST /login`` (checks the user table's scrypt hash, opens a
server-side session, sets the ``radcaliper_session`` cookie: HttpOnly, SameSite=Lax, Secure
with ``secure_cookies``), ``GET /logout``, ``GET /`` (redirects), ``/healthz``; the Gradio app
lives under ``/app``. Sessions expire after ``session_minutes`` whatever the browser does.

Every request passes ``app.ui.security.WebGuard`` first: everything under ``/app`` answers 401
without a live session ("Your session ended, log in again."), state-changing requests from
another site are refused (403), and every response forbids framing. Failed logins are throttled
(``app.ui.throttle``: a user name or an address with too many failures is locked for a while,
the right password too); an unknown user costs the same password check as a known one, so the
answer's timing does not tell them apart. Every login, failed login, lock and logout is an audit
event (one ``login.locked`` per lock, not per refused attempt).

The UI's temporary files (Gradio's cache: rendered slices, uploads in transit, exports) live in
a private folder (``app.ui.tempfiles``), set when the app is built, swept while it runs and
emptied when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import math
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from app.ui.context import UiContext
from app.ui.security import WebGuard
from app.ui.sessions import COOKIE, Sessions
from app.ui.tempfiles import PrivateFolder
from app.ui.throttle import LoginLimits, LoginThrottle

__all__ = ["APP_PATH", "create_app"]

logger = logging.getLogger(__name__)

APP_PATH = "/app"
SWEEP_EVERY_S = 60.0
# Run by the page when it loads: a request the server refuses for want of a session (401: the
# session ended, by logging out in another tab or by expiry) takes the tab to the login page,
# which says so, instead of leaving the outputs of the refused action marked "Error".
_ON_SESSION_END = """() => {
    const fetched = window.fetch.bind(window);
    window.fetch = async (...request) => {
        const answer = await fetched(...request);
        if (answer.status === 401) {
            window.location.assign("/login?error=ended");
        }
        return answer;
    };
}"""
_MESSAGES = {
    "wrong": "Wrong user or password.",
    "locked": "Too many failed logins for this user or from this address: logging in is "
    "locked for {minutes} more minute(s). Try again then, or ask an admin.",
    "ended": "Your session ended, log in again.",
}

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


def create_app(
    context: UiContext,
    *,
    session_minutes: float = 30.0,
    login_limits: LoginLimits | None = None,
    secure_cookies: bool = False,
    trusted_origins: Sequence[str] = (),
) -> FastAPI:
    """The FastAPI application (login, sessions, the mounted Gradio UI).

    ``login_limits``: the throttling of failed logins (default :class:`LoginLimits`);
    ``secure_cookies``: send the session cookie over HTTPS only (on behind an HTTPS proxy);
    ``trusted_origins``: origins (``https://host[:port]``) besides the request's own host whose
    pages may send state-changing requests (a proxy that rewrites ``Host``).
    """
    import gradio as gr

    from app.ui.views import build_blocks
    from db.audit import append_event
    from db.users import get_user, verify_password

    sessions = Sessions(session_minutes * 60.0)
    throttle = LoginThrottle(login_limits)
    verify_password(None, "")  # makes the dummy hash now, not during the first login
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

    def locked_page(seconds: float) -> RedirectResponse:
        minutes = max(1, math.ceil(seconds / 60.0))
        return RedirectResponse(f"/login?error=locked&minutes={minutes}", status_code=303)

    @app.get("/login", response_class=HTMLResponse)
    def login_page(error: str | None = None, minutes: int = 1) -> HTMLResponse:
        text = _MESSAGES.get(error or "", "")  # codes only: no text of the URL is shown
        shown = html.escape(text.format(minutes=max(1, minutes)))
        message = f'<p class="error">{shown}</p>' if text else ""
        return HTMLResponse(_LOGIN_PAGE.format(error=message))

    @app.post("/login")
    def login(request: Request, username: str = Form(""), password: str = Form("")) -> Any:
        name = username.strip()
        actor = name[:64] or "?"
        address = request.client.host if request.client is not None else "unknown"
        waiting = throttle.locked_for(name, address)
        if waiting > 0:  # not checked, not counted, not audited: the lock was, once
            logger.info("login refused: locked for %.0f s more", waiting)
            return locked_page(waiting)
        with context.store.reader() as session:
            user = get_user(session, name)
        usable = user if user is not None and user.active else None
        # one scrypt check whoever asks (a dummy hash without a usable user): the same time
        right = verify_password(None if usable is None else usable.password_hash, password)
        if usable is None or not right:
            audit(actor, "login.refused", {})
            lockouts = throttle.failed(name, address)
            for lockout in lockouts:
                audit(
                    actor,
                    "login.locked",
                    {
                        "scope": lockout.scope,
                        "user": name[:64],
                        "address": address,
                        "failures": lockout.failures,
                        "window_minutes": throttle.limits.window_s / 60.0,
                        "locked_minutes": lockout.seconds / 60.0,
                    },
                )
                logger.warning(
                    "login locked for %.0f min after %d failed logins (%s)",
                    lockout.seconds / 60.0,
                    lockout.failures,
                    lockout.scope,
                )
            if lockouts:
                return locked_page(max(lockout.seconds for lockout in lockouts))
            return RedirectResponse("/login?error=wrong", status_code=303)
        throttle.succeeded(name)
        token = sessions.open(usable.name, usable.role.value)
        audit(usable.name, "login", {"role": usable.role.value})
        response = RedirectResponse(f"{APP_PATH}/", status_code=303)
        response.set_cookie(
            COOKIE,
            token,
            httponly=True,
            samesite="lax",
            secure=secure_cookies,
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
        response.delete_cookie(
            COOKIE, path="/", secure=secure_cookies, httponly=True, samesite="lax"
        )
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

    folder = PrivateFolder(context.temp_dir)
    context.temp_dir = folder.prepare()
    # Gradio reads its cache folder when each component and the app are made: set it first
    os.environ["GRADIO_TEMP_DIR"] = str(context.temp_dir)
    blocks = build_blocks(context)
    max_age_s = int(max(sessions.lifetime_s, SWEEP_EVERY_S))
    blocks.delete_cache = (int(SWEEP_EVERY_S), max_age_s)  # Gradio forgets the files it made
    mounted: FastAPI = gr.mount_gradio_app(
        app,
        blocks,
        path=APP_PATH,
        auth_dependency=current_user,
        footer_links=[],
        js=_ON_SESSION_END,
        max_file_size=context.max_upload_bytes,
        allowed_paths=[str(Path(context.upload_dir))],
    )
    _clean_up_while_running(mounted, folder, max_age_s)
    mounted.add_middleware(
        WebGuard,
        is_live=lambda token: sessions.get(token) is not None,
        cookie=COOKIE,
        protected=APP_PATH,
        trusted_origins=tuple(trusted_origins),
    )
    return mounted


def _clean_up_while_running(app: FastAPI, folder: PrivateFolder, max_age_s: float) -> None:
    """Sweep ``folder`` every minute while the app runs, and empty it when it stops."""
    inner = app.router.lifespan_context

    async def sweep_forever() -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            await asyncio.to_thread(folder.sweep, max_age_s)

    @contextlib.asynccontextmanager
    async def lifespan(running: FastAPI) -> AsyncIterator[Any]:
        sweeper = asyncio.create_task(sweep_forever())
        try:
            async with inner(running) as state:
                yield state
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            folder.close()

    app.router.lifespan_context = lifespan
