"""Login throttling: too many failed logins lock a user name, or an address, for a while.

Two counters, each over a sliding window (``window_s``): failed logins of one user name (from
anywhere) and failed logins from one client address (for any names). When one reaches its limit,
that name or address is locked for ``lockout_s``: every login for it is refused, the right
password too, with the same message whatever the password was. The failures that led to a lock
are forgotten when it starts, and attempts during a lock are not counted, so a lock ends on time
and each lock is reported once (the server writes one ``login.locked`` audit event per lock). A
successful login forgets its user name's failures (not its address's: one good account must not
reset the guessing from that address).

Names are counted whether or not such a user exists, so a lock says nothing about which users
exist. The state lives in the server's memory: a restart clears it (and logs everyone out, see
``app.ui.sessions``). At most ``max_keys`` names and addresses are remembered; beyond that the
least recently seen unlocked ones are forgotten first.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Lockout", "LoginLimits", "LoginThrottle"]

Scope = Literal["user", "address"]


@dataclass(frozen=True)
class LoginLimits:
    """How many failed logins lock a user name or an address, and for how long (0 failures:
    no limit of that kind)."""

    user_failures: int = 10
    address_failures: int = 30
    window_s: float = 15 * 60.0
    lockout_s: float = 15 * 60.0

    def __post_init__(self) -> None:
        for name in ("user_failures", "address_failures"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} {value!r}: use a whole number >= 0 (0: no limit)")
        for name in ("window_s", "lockout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} {value!r}: use a number of seconds > 0")


@dataclass(frozen=True)
class Lockout:
    """A lock that a failed login has just started."""

    scope: Scope
    key: str  # the user name or the address
    failures: int
    seconds: float


@dataclass
class _Entry:
    failures: deque[float] = field(default_factory=deque)
    locked_until: float = -math.inf


class _Counter:
    """Failures and locks of one kind of key (user names, or addresses)."""

    def __init__(self, scope: Scope, limit: int, limits: LoginLimits, max_keys: int) -> None:
        self.scope: Scope = scope
        self.limit = limit
        self.limits = limits
        self.max_keys = max_keys
        self.entries: OrderedDict[str, _Entry] = OrderedDict()

    def remaining(self, key: str, now: float) -> float:
        entry = self.entries.get(key)
        return 0.0 if entry is None else max(0.0, entry.locked_until - now)

    def failed(self, key: str, now: float) -> Lockout | None:
        if self.limit == 0:
            return None
        entry = self.entries.pop(key, None) or _Entry()
        self.entries[key] = entry  # most recently seen last
        while entry.failures and entry.failures[0] <= now - self.limits.window_s:
            entry.failures.popleft()
        entry.failures.append(now)
        lockout = None
        if len(entry.failures) >= self.limit:
            entry.locked_until = now + self.limits.lockout_s
            lockout = Lockout(self.scope, key, len(entry.failures), self.limits.lockout_s)
            entry.failures.clear()
        self._forget_old(now)
        return lockout

    def forget(self, key: str) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            entry.failures.clear()

    def _forget_old(self, now: float) -> None:
        if len(self.entries) <= self.max_keys:
            return
        for key in list(self.entries):
            entry = self.entries[key]
            stale = not entry.failures or entry.failures[-1] <= now - self.limits.window_s
            if entry.locked_until <= now and stale:
                del self.entries[key]
        for key in list(self.entries):  # still too many: least recently seen unlocked first
            if len(self.entries) <= self.max_keys:
                break
            if self.entries[key].locked_until <= now:
                del self.entries[key]


class LoginThrottle:
    """The failed logins the server has seen (thread-safe; the clock is injectable for tests)."""

    def __init__(
        self,
        limits: LoginLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        self.limits = limits or LoginLimits()
        self._clock = clock
        self._lock = threading.Lock()
        self._users = _Counter("user", self.limits.user_failures, self.limits, max_keys)
        self._addresses = _Counter("address", self.limits.address_failures, self.limits, max_keys)

    def locked_for(self, user: str, address: str) -> float:
        """Seconds until ``user`` may try again from ``address`` (0: not locked)."""
        with self._lock:
            now = self._clock()
            return max(self._users.remaining(user, now), self._addresses.remaining(address, now))

    def failed(self, user: str, address: str) -> list[Lockout]:
        """Count a failed login; the locks it starts (none, or one per reached limit)."""
        with self._lock:
            now = self._clock()
            found = (self._users.failed(user, now), self._addresses.failed(address, now))
        return [lockout for lockout in found if lockout is not None]

    def succeeded(self, user: str) -> None:
        """A successful login: forget the user name's failures."""
        with self._lock:
            self._users.forget(user)
