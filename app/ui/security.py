"""What the review UI's web server checks on every request, before any route sees it.

:class:`WebGuard` is one ASGI middleware in front of the whole application:

- **Sessions.** Every path under the Gradio app (``/app``) answers 401 without a live session,
  whatever route Gradio has there (its pages, assets, API, queue, ``reset``, ``cancel``,
  ``heartbeat``, ``startup-events``, files, ...): a new Gradio route is covered by construction.
  The answer says "Your session ended, log in again." (JSON ``{"detail": ...}``, which the
  Gradio page shows as the error of the action that was refused; an HTML page with a link to the
  login for a browser that loads a page).
- **Origin check.** A state-changing request (any method but GET and HEAD, and every WebSocket
  handshake) whose ``Origin`` header, or without one its ``Referer``, names another site is
  refused with 403. Same site means the same host and port as the request's ``Host`` header, or
  one of the configured trusted origins (a reverse proxy that rewrites ``Host``). ``Origin:
  null`` (sandboxed frames, opaque redirects) is another site. A request with neither header is
  let through deliberately: browsers send ``Origin`` on every cross-site POST, so such a request
  comes from a program (curl, a script) that holds its own session cookie, which is not the
  forgery this check is about.
- **Password changes first.** A live session whose user must change their password (an
  administrator set it) reaches nothing under ``/app`` but a redirect to the change page (a
  browser's page) or 403 (anything else) until they have.
- **Client address.** :func:`client_address` is the peer's address; a reverse proxy's
  ``X-Forwarded-For`` is believed only from the configured trusted proxies (the login back-off
  counts failures per address: a client must not choose its own).
- **Headers.** Every response says ``X-Frame-Options: DENY`` and ``Content-Security-Policy:
  frame-ancestors 'none'`` (no page may frame the UI: no clickjacking), ``X-Content-Type-Options:
  nosniff`` and ``Referrer-Policy: same-origin``; the Gradio API's answers (images, exports,
  data) also ``Cache-Control: no-store``, so the browser keeps no copy of them on disk.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "CHANGE_PASSWORD_FIRST",
    "SECURITY_HEADERS",
    "SESSION_ENDED",
    "WebGuard",
    "client_address",
    "same_origin",
]

SESSION_ENDED = "Your session ended, log in again."
CHANGE_PASSWORD_FIRST = "Change your password first (an administrator set it): /password"
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)
_SAFE_METHODS = frozenset({"GET", "HEAD"})
_ENDED_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>radcaliper: log in</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 30rem; margin: 6rem auto">
<p>{message} <a href="/login">Log in</a></p></body></html>
"""


def _origin_of(url: str) -> str:
    """``scheme://host[:port]`` of a URL or origin, lower case ('' when it has none)."""
    parts = urlsplit(url.strip())
    if not parts.scheme or not parts.netloc:
        return ""
    return f"{parts.scheme}://{parts.netloc}".lower()


def same_origin(headers: Headers, trusted: Iterable[str] = ()) -> bool | None:
    """Whether the request comes from a page of this site: True or False from its ``Origin``
    (else ``Referer``) header, None when it has neither (not a browser's request)."""
    claimed = headers.get("origin")
    if claimed is None:
        claimed = headers.get("referer")
        if claimed is None:
            return None
    origin = _origin_of(claimed)
    if not origin:  # "null", or not a URL
        return False
    host = headers.get("host", "").strip().lower()
    if host and urlsplit(origin).netloc == host:
        return True
    return origin in {_origin_of(t) for t in trusted}


def client_address(connection: HTTPConnection, trusted_proxies: Iterable[str] = ()) -> str:
    """The client's address: the peer's, or where the peer is a trusted proxy the last address
    of ``X-Forwarded-For`` that is not a trusted proxy ("unknown" without a peer)."""
    peer = connection.client.host if connection.client is not None else "unknown"
    trusted = set(trusted_proxies)
    if peer not in trusted:
        return peer
    forwarded = ",".join(connection.headers.getlist("x-forwarded-for"))
    hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
    for hop in reversed(hops):
        if hop not in trusted:
            return hop[:128]
    return peer


class WebGuard:
    """The checks of this module's doc, around ``app``; ``is_live(token)`` says whether a
    session cookie belongs to a live session, ``detour(token)`` where a live one must go first
    (None: nowhere)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        is_live: Callable[[str | None], bool],
        cookie: str,
        protected: str,
        trusted_origins: Iterable[str] = (),
        detour: Callable[[str | None], str | None] = lambda _: None,
    ) -> None:
        self.app = app
        self.is_live = is_live
        self.detour = detour
        self.cookie = cookie
        self.protected = protected.rstrip("/")
        self.trusted = tuple(trusted_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        send = self._with_headers(send, no_store=path.startswith(f"{self.protected}/gradio_api"))
        connection = HTTPConnection(scope)
        state_changing = scope["type"] == "websocket" or scope["method"] not in _SAFE_METHODS
        if state_changing and same_origin(connection.headers, self.trusted) is False:
            await self._refuse(scope, send, 403, "Refused: this request comes from another site.")
            return
        guarded = path == self.protected or path.startswith(f"{self.protected}/")
        if guarded:
            token = connection.cookies.get(self.cookie)
            if not self.is_live(token):
                await self._refuse(scope, send, 401, SESSION_ENDED)
                return
            elsewhere = self.detour(token)
            if elsewhere is not None:
                await self._send_elsewhere(scope, send, elsewhere)
                return
        await self.app(scope, receive, send)

    @classmethod
    async def _send_elsewhere(cls, scope: Scope, send: Send, path: str) -> None:
        """A browser's page goes to ``path``; anything else is refused (403)."""
        accept = Headers(scope=scope).get("accept", "")
        if scope["type"] == "http" and scope["method"] == "GET" and "text/html" in accept:
            await send(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [(b"location", path.encode()), (b"content-length", b"0")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        await cls._refuse(scope, send, 403, CHANGE_PASSWORD_FIRST)

    @staticmethod
    def _with_headers(send: Send, *, no_store: bool) -> Send:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                if no_store:
                    names.add(b"cache-control")
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                headers += SECURITY_HEADERS
                if no_store:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        return sending

    @staticmethod
    async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": message})
            return
        accept = Headers(scope=scope).get("accept", "")
        if "text/html" in accept and scope["method"] == "GET":
            body = _ENDED_PAGE.format(message=html.escape(message)).encode()
            kind = b"text/html; charset=utf-8"
        else:
            body = json.dumps({"detail": message}).encode()
            kind = b"application/json"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
