"""Server-side login sessions of the review UI.

A session is a random token (the ``radcaliper_session`` cookie: HttpOnly, SameSite=Lax) that
maps, in the server's memory, to a user name, role, expiry time and the user's credential stamp
at login (``db.users.credential_stamp``). Nothing about the user is in the cookie, so it cannot
be forged or extended by the browser; logging out or expiring removes it on the server, and the
server ends it at the next request once the user's stamp changes (disabled, another role or
password, whether from the admin page or the command line). A restart of the server logs
everyone out.
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
    stamp: str = ""  # the user's credential stamp at login
    must_change_password: bool = False


class Sessions:
    """The open sessions; ``lifetime_s`` from login (a fixed lifetime, not sliding)."""

    def __init__(self, lifetime_s: float = 1800.0) -> None:
        self.lifetime_s = lifetime_s
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(
        self, user: str, role: str, *, stamp: str = "", must_change_password: bool = False
    ) -> str:
        token = secrets.token_urlsafe(32)
        session = Session(
            user, role, time.monotonic() + self.lifetime_s, stamp, must_change_password
        )
        with self._lock:
            self._sessions[token] = session
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

    def close_user(self, user: str) -> int:
        """End every session of ``user``: how many."""
        with self._lock:
            tokens = [t for t, s in self._sessions.items() if s.user == user]
            for token in tokens:
                del self._sessions[token]
        return len(tokens)
