"""Server-side login sessions of the review UI.

A session is a random token (the ``radcaliper_session`` cookie: HttpOnly, SameSite=Lax) that
maps, in the server's memory, to a user name, role and expiry time. Nothing about the user is in
the cookie, so it cannot be forged or extended by the browser; logging out or expiring removes
it on the server. A restart of the server logs everyone out.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass

__all__ = ["COOKIE", "Session", "Sessions"]

COOKIE = "radcaliper_session"


@dataclass(frozen=True)
class Session:
    user: str
    role: str
    expires: float  # time.monotonic() deadline


class Sessions:
    """The open sessions; ``lifetime_s`` from login (a fixed lifetime, not sliding)."""

    def __init__(self, lifetime_s: float = 1800.0) -> None:
        self.lifetime_s = lifetime_s
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, user: str, role: str) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[token] = Session(user, role, time.monotonic() + self.lifetime_s)
        return token

    def get(self, token: str | None) -> Session | None:
        """The live session of ``token``; an expired one is removed and gives None."""
        if not token:
            return None
        with self._lock:
            session = self._sessions.get(token)
            if session is None:
                return None
            if session.expires <= time.monotonic():
                del self._sessions[token]
                return None
            return session

    def close(self, token: str | None) -> None:
        if token:
            with self._lock:
                self._sessions.pop(token, None)
