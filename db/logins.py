"""The login back-off: failed logins slow down guessing without letting anyone lock an account.

Every failed login is a row of ``login_failures`` (the name tried, the client address, when;
unknown names too, so a lock says nothing about which users exist). From them:

- **A name from an address backs off.** After ``free_failures`` failed logins of one name from
  one address, that name is locked *for that address only*, first for ``first_lock_s``, and each
  further failure doubles it, up to ``max_lock_s``. During a lock every login of that name from
  that address is refused (the right password too, with the same answer) and not counted, so a
  lock ends on time and each lock is one ``login.locked`` audit event. A successful login from
  the address forgets that name's failures from it.
- **An address backs off.** After ``address_failures`` failed logins from one address (any
  names: spraying), the address is locked the same way for every name.
- **A name under attack slows, never locks.** When one name has ``name_failures`` failed logins
  within ``window_s`` from anywhere (a distributed guess), a login of that name from an address
  that is not itself backing off is answered after ``name_delay_s``: guessing slows, while the
  owner, from an address with no failures, still gets in.

So an attacker can lock only their own address, never a known account (an administrator's
included); a lock lasts at most ``max_lock_s``. Failures are remembered ``memory_s`` (a
lock's count starts again after that) and pruned as new ones come. ``users unlock NAME``
forgets a name's failures (from one address, or all), as an audited event.

The state is in the database, so the command line sees the server's locks (``users list``) and
several servers share them. Times are the caller's clock (``now``), for tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import ColumnElement, delete, func, select
from sqlalchemy.orm import Session

from db.models import LoginFailure

__all__ = [
    "Lockout",
    "LoginLimits",
    "LoginLock",
    "LoginState",
    "forget_failures",
    "login_locks",
    "login_state",
    "record_failure",
    "record_success",
]

NAME_LENGTH, ADDRESS_LENGTH = 64, 128


@dataclass(frozen=True)
class LoginLimits:
    """How failed logins back off (see the module doc); 0 failures: no limit of that kind."""

    free_failures: int = 5
    address_failures: int = 30
    name_failures: int = 10
    first_lock_s: float = 30.0
    max_lock_s: float = 15 * 60.0
    window_s: float = 15 * 60.0
    name_delay_s: float = 3.0
    memory_s: float = 24 * 3600.0

    def __post_init__(self) -> None:
        for name in ("free_failures", "address_failures", "name_failures"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} {value!r}: use a whole number >= 0 (0: no limit)")
        for name in ("first_lock_s", "max_lock_s", "window_s", "memory_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} {value!r}: use a number of seconds > 0")
        delay = self.name_delay_s
        if not isinstance(delay, int | float) or not math.isfinite(delay) or not 0 <= delay <= 60:
            raise ValueError(f"name_delay_s {delay!r}: use a number of seconds in 0..60")
        if self.max_lock_s < self.first_lock_s:
            raise ValueError(
                f"max_lock_s {self.max_lock_s!r} is shorter than first_lock_s "
                f"{self.first_lock_s!r}: the longest lock cannot be shorter than the first"
            )

    def lock_s(self, failures: int, free: int) -> float:
        """How long ``failures`` failures lock, when ``free`` are free (0 s below)."""
        if free == 0 or failures < free:
            return 0.0
        doublings = failures - free
        if doublings >= 62:
            return self.max_lock_s
        return min(self.max_lock_s, self.first_lock_s * float(1 << doublings))


@dataclass(frozen=True)
class LoginState:
    """What a login of a name from an address must wait: refused for ``locked_s`` more seconds
    (0: not locked), else answered after ``delay_s`` (the name is under attack)."""

    locked_s: float = 0.0
    delay_s: float = 0.0


@dataclass(frozen=True)
class Lockout:
    """A lock that a failed login has just started."""

    scope: str  # "user" (the name from this address) or "address" (every name)
    user: str
    address: str
    failures: int
    seconds: float


@dataclass(frozen=True)
class LoginLock:
    """A lock in force (``users list``, the admin page): the name from the address, or the
    address (``user`` None) for every name."""

    user: str | None
    address: str
    failures: int
    until: datetime


def _key(name: str, address: str) -> tuple[str, str]:
    return name[:NAME_LENGTH], address[:ADDRESS_LENGTH]


def _since(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)


def _count(
    session: Session, *where: ColumnElement[bool], since: datetime
) -> tuple[int, datetime | None]:
    """How many failures match ``where`` since ``since``, and the last one's time."""
    row = session.execute(
        select(func.count(), func.max(LoginFailure.at)).where(LoginFailure.at >= since, *where)
    ).one()
    return int(row[0]), _aware(row[1])


def _aware(value: datetime | None) -> datetime | None:
    """SQLite gives naive datetimes (stored in UTC)."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _remaining(last: datetime | None, seconds: float, now: datetime) -> float:
    if last is None or seconds <= 0:
        return 0.0
    return max(0.0, (last + timedelta(seconds=seconds) - now).total_seconds())


def login_state(
    session: Session, name: str, address: str, limits: LoginLimits, now: datetime
) -> LoginState:
    """Whether a login of ``name`` from ``address`` is locked now, or to be slowed."""
    name, address = _key(name, address)
    memory = _since(now, limits.memory_s)
    pair, pair_last = _count(
        session, LoginFailure.user_name == name, LoginFailure.address == address, since=memory
    )
    spray, spray_last = _count(session, LoginFailure.address == address, since=memory)
    locked = max(
        _remaining(pair_last, limits.lock_s(pair, limits.free_failures), now),
        _remaining(spray_last, limits.lock_s(spray, limits.address_failures), now),
    )
    if locked > 0:
        return LoginState(locked_s=locked)
    if limits.name_failures == 0 or limits.name_delay_s == 0:
        return LoginState()
    attack, _ = _count(session, LoginFailure.user_name == name, since=_since(now, limits.window_s))
    return LoginState(delay_s=limits.name_delay_s if attack >= limits.name_failures else 0.0)


def record_failure(
    session: Session, name: str, address: str, limits: LoginLimits, now: datetime
) -> list[Lockout]:
    """Count a failed login (the caller commits); the locks it starts. Failures older than
    ``limits.memory_s`` are pruned."""
    name, address = _key(name, address)
    session.execute(delete(LoginFailure).where(LoginFailure.at < _since(now, limits.memory_s)))
    session.add(LoginFailure(user_name=name, address=address, at=now))
    session.flush()
    memory = _since(now, limits.memory_s)
    pair, _ = _count(
        session, LoginFailure.user_name == name, LoginFailure.address == address, since=memory
    )
    spray, _ = _count(session, LoginFailure.address == address, since=memory)
    found = []
    for scope, failures, free in (
        ("user", pair, limits.free_failures),
        ("address", spray, limits.address_failures),
    ):
        seconds = limits.lock_s(failures, free)
        if seconds > 0:
            found.append(Lockout(scope, name, address, failures, seconds))
    return found


def record_success(session: Session, name: str, address: str) -> None:
    """A successful login: forget the name's failures from this address (not the address's
    failures for other names: one good account must not reset guessing from it)."""
    name, address = _key(name, address)
    session.execute(
        delete(LoginFailure).where(LoginFailure.user_name == name, LoginFailure.address == address)
    )


def forget_failures(session: Session, name: str, address: str | None = None) -> int:
    """Forget the failed logins of ``name`` (from ``address`` only, or from anywhere): how many
    (the caller audits and commits)."""
    where = [LoginFailure.user_name == name[:NAME_LENGTH]]
    if address is not None:
        where.append(LoginFailure.address == address[:ADDRESS_LENGTH])
    count = session.execute(select(func.count()).where(*where)).scalar_one()
    session.execute(delete(LoginFailure).where(*where))
    return int(count)


def login_locks(
    session: Session, limits: LoginLimits, now: datetime, names: Sequence[str] | None = None
) -> list[LoginLock]:
    """The locks in force now: each name locked from an address (of ``names``, or all), and
    each address locked for every name."""
    memory = _since(now, limits.memory_s)
    found: list[LoginLock] = []
    pairs = (
        select(
            LoginFailure.user_name,
            LoginFailure.address,
            func.count(),
            func.max(LoginFailure.at),
        )
        .where(LoginFailure.at >= memory)
        .group_by(LoginFailure.user_name, LoginFailure.address)
    )
    if names is not None:
        pairs = pairs.where(LoginFailure.user_name.in_(list(names)))
    for name, address, count, last in session.execute(pairs):
        seconds = limits.lock_s(int(count), limits.free_failures)
        until = _aware(last)
        if until is not None and _remaining(until, seconds, now) > 0:
            found.append(LoginLock(name, address, int(count), until + timedelta(seconds=seconds)))
    addresses = (
        select(LoginFailure.address, func.count(), func.max(LoginFailure.at))
        .where(LoginFailure.at >= memory)
        .group_by(LoginFailure.address)
    )
    for address, count, last in session.execute(addresses):
        seconds = limits.lock_s(int(count), limits.address_failures)
        until = _aware(last)
        if until is not None and _remaining(until, seconds, now) > 0:
            found.append(LoginLock(None, address, int(count), until + timedelta(seconds=seconds)))
    return sorted(found, key=lambda lock: (lock.user or "", lock.address))
