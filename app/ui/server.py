"""The review UI's web server: our login page and sessions in front of the Gradio app.

Routes: ``GET /login`` (a form), ``POST /login`` (checks the user table's scrypt hash, opens a
server-side session, sets the ``radcaliper_session`` cookie: HttpOnly, SameSite=Lax, Secure
with ``secure_cookies``), ``GET /password`` and ``POST /password`` (a user changes their own
password, giving the current one; where an administrator set it, the only page the session
reaches until they have), ``POST /logout`` (``GET /logout`` only shows a button: a link or an
image elsewhere cannot log anyone out), ``GET /`` (redirects), ``/healthz``; the Gradio app
lives under ``/app``. Sessions expire after ``session_minutes`` whatever the browser does, and
end at the next request once their user is disabled or changes role or password (the user's
credential stamp, read from the database on every request, so a change made on the command line
counts too).

Every request passes ``app.ui.security.WebGuard`` first: everything under ``/app`` answers 401
without a live session ("Your session ended, log in again."), state-changing requests from
another site are refused (403), and every response forbids framing. Failed logins back off
(``db.logins``: a name from one address, or one address, is locked for a time that doubles with
each failure; a name under attack from many addresses is slowed, never locked, so its owner
gets in from another address); the client address is the peer's, a proxy's ``X-Forwarded-For``
only from ``trusted_proxies``. An unknown user costs the same password check as a known one, so
the answer's timing does not tell them apart. Every login, failed login, lock, password change
and logout is an audit event (one ``login.locked`` per lock, not per refused attempt).

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
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from fastapi import FastAPI, Form, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from app.ui.context import UiContext
from app.ui.security import WebGuard, client_address
from app.ui.sessions import COOKIE, Session, Sessions
from app.ui.tempfiles import PrivateFolder
from db.logins import Lockout, LoginLimits

if TYPE_CHECKING:
    from sqlalchemy.orm import Session as DbSession

__all__ = ["APP_PATH", "create_app"]

logger = logging.getLogger(__name__)

APP_PATH = "/app"
PASSWORD_PATH = "/password"
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
    "locked": "Too many failed logins for this user from this address, or from this address: "
    "logging in from here is locked for {minutes} more minute(s). Try again then, or ask an "
    "admin to unlock it.",
    "ended": "Your session ended, log in again.",
    "changed": "Your password was changed.",
}
_PASSWORD_MESSAGES = {
    "must": "An administrator set your password: choose a new one to go on.",
    "current": "The current password is wrong.",
    "repeat": "The new password and its repetition differ.",
    "locked": "Too many wrong passwords: try again in {minutes} minute(s).",
}

_STYLE = """<style>
body {{ font-family: system-ui, sans-serif; max-width: 24rem; margin: 6rem auto; }}
input {{ display: block; width: 100%; margin: 0.3rem 0 1rem; padding: 0.4rem; }}
.error {{ color: #b00; }} .note {{ color: #555; font-size: 0.9rem; }}
</style>"""
_LOGIN_PAGE = (
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>radcaliper: log in</title>
"""
    + _STYLE
    + """</head>
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
)
_PASSWORD_PAGE = (
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>radcaliper: change password</title>
"""
    + _STYLE
    + """</head>
<body><h1>Change your password</h1>
<p class="note">{user}: at least {minimum} characters, not containing your user name.</p>
{error}
<form method="post" action="/password">
<label for="current">Current password</label>
<input id="current" name="current" type="password" autocomplete="current-password">
<label for="new">New password</label>
<input id="new" name="new" type="password" autocomplete="new-password">
<label for="repeat">New password again</label>
<input id="repeat" name="repeat" type="password" autocomplete="new-password">
<button type="submit" id="change">Change password</button>
</form>{back}</body></html>
"""
)
_LOGOUT_PAGE = (
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>radcaliper: log out</title>
"""
    + _STYLE
    + """</head>
<body><form method="post" action="/logout"><button type="submit" id="logout">Log out</button>
</form></body></html>
"""
)


def _now() -> datetime:
    return datetime.now(UTC)


def create_app(
    context: UiContext,
    *,
    session_minutes: float = 30.0,
    login_limits: LoginLimits | None = None,
    secure_cookies: bool = False,
    trusted_origins: Sequence[str] = (),
    trusted_proxies: Sequence[str] = (),
    clock: Callable[[], datetime] = _now,
) -> FastAPI:
    """The FastAPI application (login, sessions, the mounted Gradio UI).

    ``login_limits``: the back-off of failed logins (default :class:`LoginLimits`; also what
    the admin page shows as locks); ``secure_cookies``: send the session cookie over HTTPS only
    (on behind an HTTPS proxy); ``trusted_origins``: origins (``https://host[:port]``) besides
    the request's own host whose pages may send state-changing requests (a proxy that rewrites
    ``Host``); ``trusted_proxies``: peers whose ``X-Forwarded-For`` names the client;
    ``clock``: the time failed logins are counted by (tests).
    """
    folder = PrivateFolder(context.temp_dir)
    context.temp_dir = folder.prepare()
    # Gradio reads its cache folder when each component and the app are made, and some of
    # its modules when they are imported (an empty vibe_edit_history folder, made 0755 in the
    # system's temporary folder otherwise): set it first
    os.environ["GRADIO_TEMP_DIR"] = str(context.temp_dir)
    import gradio as gr

    from app.ui.views import build_blocks
    from db.audit import append_event
    from db.logins import login_state, record_failure, record_success
    from db.users import MAX_PASSWORD, MIN_PASSWORD, credential_stamp, get_user, verify_password

    limits = login_limits or LoginLimits()
    context.login_limits = limits
    sessions = Sessions(session_minutes * 60.0)
    verify_password(None, "")  # makes the dummy hash now, not during the first login
    app = FastAPI(title="radcaliper review", docs_url=None, redoc_url=None, openapi_url=None)

    def session_event(
        session: DbSession, actor: str, action: str, details: Mapping[str, object]
    ) -> None:
        append_event(
            session,
            actor=actor,
            action=action,
            object_type="session",
            object_id=None,
            details=details,
        )

    def audit(actor: str, action: str, details: Mapping[str, object]) -> None:
        with context.store.writer() as session:
            session_event(session, actor, action, details)
            session.commit()

    def address_of(request: Request) -> str:
        return client_address(request, trusted_proxies)

    def minutes(seconds: float) -> int:
        return max(1, math.ceil(seconds / 60.0))

    def locked_page(seconds: float) -> RedirectResponse:
        return RedirectResponse(f"/login?error=locked&minutes={minutes(seconds)}", status_code=303)

    def failed(name: str, address: str, action: str) -> list[Lockout]:
        """Count a failure (and audit it, and the locks it starts): the locks."""
        actor = name[:64] or "?"
        with context.store.writer() as session:
            lockouts = record_failure(session, name, address, limits, clock())
            session_event(session, actor, action, {"address": address})
            for lockout in lockouts:
                lock = {
                    "scope": lockout.scope,
                    "user": lockout.user,
                    "address": lockout.address,
                    "failures": lockout.failures,
                    "locked_seconds": lockout.seconds,
                }
                session_event(session, actor, "login.locked", lock)
            session.commit()
        for lockout in lockouts:
            logger.warning(
                "login locked for %.0f s after %d failed logins (%s)",
                lockout.seconds,
                lockout.failures,
                lockout.scope,
            )
        return lockouts

    def live(token: str | None) -> Session | None:
        """The session of ``token`` while its user is as at login (else it ends now)."""
        found = sessions.get(token)
        if found is None:
            return None
        with context.store.reader() as session:
            user = get_user(session, found.user)
            stamp = None if user is None or not user.active else credential_stamp(user)
        if stamp != found.stamp:
            sessions.close(token)
            return None
        return found

    def detour(token: str | None) -> str | None:
        found = sessions.get(token)
        return PASSWORD_PATH if found is not None and found.must_change_password else None

    def with_cookie(response: RedirectResponse, token: str) -> RedirectResponse:
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

    @app.get("/login", response_class=HTMLResponse)
    def login_page(error: str | None = None, minutes: int = 1) -> HTMLResponse:
        text = _MESSAGES.get(error or "", "")  # codes only: no text of the URL is shown
        shown = html.escape(text.format(minutes=max(1, min(minutes, 10_000))))
        message = f'<p class="error">{shown}</p>' if text else ""
        return HTMLResponse(_LOGIN_PAGE.format(error=message))

    @app.post("/login")
    def login(
        request: Request, username: str = Form(""), password: str = Form("")
    ) -> RedirectResponse:
        name = username.strip()
        address = address_of(request)
        with context.store.reader() as session:
            state = login_state(session, name, address, limits, clock())
        if state.locked_s > 0:  # not checked, not counted, not audited: the lock was, once
            logger.info("login refused: locked for %.0f s more", state.locked_s)
            return locked_page(state.locked_s)
        if state.delay_s > 0:  # the name is under attack from elsewhere: slowed, not locked
            time.sleep(state.delay_s)
        with context.store.reader() as session:
            user = get_user(session, name)
        usable = user if user is not None and user.active else None
        # one scrypt check whoever asks (a dummy hash without a usable user): the same time
        stored = None if usable is None else usable.password_hash
        right = verify_password(stored, password[:MAX_PASSWORD]) and len(password) <= MAX_PASSWORD
        if usable is None or not right:
            lockouts = failed(name, address, "login.refused")
            if lockouts:
                return locked_page(max(lockout.seconds for lockout in lockouts))
            return RedirectResponse("/login?error=wrong", status_code=303)
        with context.store.writer() as session:
            record_success(session, name, address)
            session.commit()
        token = sessions.open(
            usable.name,
            usable.role.value,
            stamp=credential_stamp(usable),
            must_change_password=usable.must_change_password,
        )
        audit(usable.name, "login", {"role": usable.role.value, "address": address})
        target = PASSWORD_PATH + "?error=must" if usable.must_change_password else f"{APP_PATH}/"
        return with_cookie(RedirectResponse(target, status_code=303), token)

    @app.get(PASSWORD_PATH, response_class=HTMLResponse)
    def password_page(request: Request, error: str | None = None, minutes: int = 1) -> Response:
        found = live(request.cookies.get(COOKIE))
        if found is None:
            return RedirectResponse("/login?error=ended", status_code=303)
        text = _PASSWORD_MESSAGES.get(error or "", "")
        if not text and error:
            text = "The new password was refused: " + error[:200]
        shown = html.escape(text.format(minutes=max(1, min(minutes, 10_000))))
        back = "" if found.must_change_password else f'<p><a href="{APP_PATH}/">Back</a></p>'
        return HTMLResponse(
            _PASSWORD_PAGE.format(
                user=html.escape(found.user),
                minimum=MIN_PASSWORD,
                error=f'<p class="error">{shown}</p>' if text else "",
                back=back,
            )
        )

    @app.post(PASSWORD_PATH)
    def change_password(
        request: Request, current: str = Form(""), new: str = Form(""), repeat: str = Form("")
    ) -> RedirectResponse:
        from urllib.parse import quote

        from db.users import change_own_password
        from ingestion.errors import StorageError

        token = request.cookies.get(COOKIE)
        found = live(token)
        if found is None:
            return RedirectResponse("/login?error=ended", status_code=303)
        address = address_of(request)
        with context.store.reader() as session:
            state = login_state(session, found.user, address, limits, clock())
        if state.locked_s > 0:
            wait = minutes(state.locked_s)
            return RedirectResponse(f"{PASSWORD_PATH}?error=locked&minutes={wait}", status_code=303)
        if new != repeat:
            return RedirectResponse(f"{PASSWORD_PATH}?error=repeat", status_code=303)
        try:
            with context.store.writer() as session:
                changed = change_own_password(session, found.user, current[:MAX_PASSWORD], new)
                record_success(session, found.user, address)
                session.commit()
        except StorageError:  # the current password was wrong: counted like a failed login
            failed(found.user, address, "password.refused")
            return RedirectResponse(f"{PASSWORD_PATH}?error=current", status_code=303)
        except ValueError as error:
            return RedirectResponse(f"{PASSWORD_PATH}?error={quote(str(error))}", status_code=303)
        ended = sessions.close_user(found.user)  # every session of the old password
        logger.info("password changed: %d session(s) ended", ended)
        fresh = sessions.open(changed.name, changed.role.value, stamp=credential_stamp(changed))
        return with_cookie(RedirectResponse(f"{APP_PATH}/", status_code=303), fresh)

    @app.get("/logout", response_class=HTMLResponse)
    def logout_page() -> HTMLResponse:
        return HTMLResponse(_LOGOUT_PAGE)

    @app.post("/logout")
    def logout(request: Request) -> RedirectResponse:
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
    def root(request: Request) -> RedirectResponse:
        is_live = live(request.cookies.get(COOKIE)) is not None
        return RedirectResponse(f"{APP_PATH}/" if is_live else "/login", status_code=303)

    @app.get("/healthz")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    def current_user(request: Request) -> str | None:
        session = live(request.cookies.get(COOKIE))
        return None if session is None else session.user

    context.end_sessions = sessions.close_user
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
        # nothing outside Gradio's own cache (the private temp folder): an uploaded study,
        # kept in upload_dir, is never served back, to any role
    )
    _clean_up_while_running(mounted, folder, max_age_s)
    mounted.add_middleware(
        WebGuard,
        is_live=lambda token: live(token) is not None,
        cookie=COOKIE,
        protected=APP_PATH,
        trusted_origins=tuple(trusted_origins),
        detour=detour,
    )
    return mounted


def _clean_up_while_running(app: FastAPI, folder: PrivateFolder, max_age_s: float) -> None:
    """Sweep ``folder`` every minute while the app runs, and empty it when it stops."""
    inner = app.router.lifespan_context

    async def sweep_forever() -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            await asyncio.to_thread(folder.sweep, max_age_s)

    # yields the inner lifespan's state: None (stateless) or the state mapping (stateful)
    @contextlib.asynccontextmanager
    async def lifespan(running: FastAPI) -> AsyncIterator[Mapping[str, object] | None]:
        sweeper = asyncio.create_task(sweep_forever())
        try:
            async with inner(running) as state:
                yield state
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            folder.close()

    # Starlette types a lifespan as either stateless or stateful; this one is what inner is
    app.router.lifespan_context = lifespan  # type: ignore[assignment]
