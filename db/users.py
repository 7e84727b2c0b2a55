"""Users (reviewer, auditor, admin), their passwords (scrypt, a memory-hard KDF) and their
administration.

Hash format: ``scrypt$<n>$<r>$<p>$<salt b64>$<key b64>`` with a 16-byte random salt and a 32-byte
key; verification is constant-time, and checking a password for a user without one (or an
unknown user: pass None) costs the same scrypt work as a wrong password, so the time of a login
answer does not tell whether the user exists.

A password has at least :data:`MIN_PASSWORD` characters and does not contain the user's name
(:func:`check_password`). Administration: disable and enable a user, set their role, set a
password (an administrator's reset: the user must choose a new one at the next login; their own
change clears that), unlock their logins (``db.logins``). The last enabled administrator can be
neither disabled nor demoted. Every change is an audit event with the user's new state; a change
of role, password or active flag changes the user's :func:`credential_stamp`, which ends the
user's open sessions in the review UI.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os
import re
import secrets
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from db.audit import append_event
from db.audit.coverage import states_detail
from db.models import Role, User
from ingestion.errors import StorageError

__all__ = [
    "MIN_PASSWORD",
    "add_user",
    "change_own_password",
    "check_password",
    "credential_stamp",
    "get_user",
    "hash_password",
    "reset_password",
    "set_active",
    "set_role",
    "unlock_user",
    "verify_password",
]

_N, _R, _P = 2**14, 8, 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
MIN_PASSWORD = 8
MAX_PASSWORD = 1024  # scrypt of a longer text is only a way to make the server work


def hash_password(password: str) -> str:
    if len(password) < MIN_PASSWORD:
        raise ValueError(f"a password needs at least {MIN_PASSWORD} characters")
    salt = os.urandom(16)
    key = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    encode = base64.b64encode
    return f"scrypt${_N}${_R}${_P}${encode(salt).decode()}${encode(key).decode()}"


def verify_password(stored: str | None, password: str) -> bool:
    """True when ``password`` matches ``stored``.

    False for a user without a password (``stored`` None: pass None for an unknown or inactive
    user too) or with an unreadable hash, after the same scrypt work on a dummy hash: every
    answer takes as long as a wrong password's.
    """
    matched = _scrypt_matches(stored, password) if stored else None
    if matched is None:
        _scrypt_matches(_dummy_hash(), password)
        return False
    return matched


def _scrypt_matches(stored: str, password: str) -> bool | None:
    """Whether ``password`` matches the scrypt hash ``stored``; None when it is not one."""
    try:
        scheme, n, r, p, salt, key = stored.split("$")
        if scheme != "scrypt":
            return None
        expected = base64.b64decode(key)
        actual = hashlib.scrypt(
            password.encode(),
            salt=base64.b64decode(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
        )
    except (ValueError, TypeError):
        return None
    return hmac.compare_digest(actual, expected)


@functools.cache
def _dummy_hash() -> str:
    """The hash of a random password nobody knows, with today's scrypt parameters (made once,
    on first use: nothing heavy at import)."""
    return hash_password(secrets.token_urlsafe(24))


def get_user(session: Session, name: str) -> User | None:
    return session.execute(select(User).where(User.name == name)).scalar_one_or_none()


def check_password(name: str, password: str) -> None:
    """Refuse (``ValueError``, saying why) a password that is too short or contains the
    user's name (either way round, in any case)."""
    if len(password) < MIN_PASSWORD:
        raise ValueError(f"a password needs at least {MIN_PASSWORD} characters")
    if len(password) > MAX_PASSWORD:
        raise ValueError(f"a password has at most {MAX_PASSWORD} characters")
    folded = password.casefold()
    if len(name) >= 3 and (name.casefold() in folded or name.casefold()[::-1] in folded):
        raise ValueError(f"the password must not contain the user name {name!r}")


def credential_stamp(user: User) -> str:
    """What a login session holds of its user: it changes when the user is disabled or
    enabled, changes role or password, or must change it (the session then ends)."""
    return hashlib.sha256(
        "\x00".join(
            (
                str(user.id),
                user.name,
                user.role.value,
                "1" if user.active else "0",
                user.password_hash or "",
                "1" if user.must_change_password else "0",
            )
        ).encode()
    ).hexdigest()


def add_user(
    session: Session, name: str, role: Role | str, *, password: str | None, actor: str
) -> User:
    """Add a user (the caller commits). Raises ValueError for a bad name, role or password,
    StorageError when the name is taken."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"user name {name!r}: use 1-64 letters, digits, '.', '_', '@' or '-', starting with "
            "a letter or digit"
        )
    checked = _role(role)
    if password is not None:
        check_password(name, password)
    if get_user(session, name) is not None:
        raise StorageError(f"user {name!r} exists already")
    user = User(
        name=name,
        role=checked,
        password_hash=None if password is None else hash_password(password),
        active=True,
        created_at=datetime.now(UTC),
    )
    try:
        with session.begin_nested():
            session.add(user)
            session.flush()
    except IntegrityError as error:
        raise StorageError(f"user {name!r} exists already") from error
    append_event(
        session,
        actor=actor,
        action="user.added",
        object_type="user",
        object_id=user.id,
        details={
            "name": name,
            "role": checked.value,
            "password": password is not None,
            "rows": states_detail({"users": [user]}),
        },
    )
    return user


def _role(role: Role | str) -> Role:
    try:
        return Role(role)
    except ValueError:
        raise ValueError(f"role {role!r}: use reviewer, auditor or admin") from None


def _existing(session: Session, name: str) -> User:
    """The user ``name``, locked for this transaction (PostgreSQL: ``FOR UPDATE``)."""
    user = session.execute(
        select(User).where(User.name == name).with_for_update()
    ).scalar_one_or_none()
    if user is None:
        raise StorageError(f"there is no user {name!r} (radcaliper users list shows them)")
    return user


def _keep_an_admin(session: Session, user: User, action: str) -> None:
    """Refuse to leave no enabled administrator."""
    if user.role is not Role.ADMIN or not user.active:
        return
    admins = session.execute(
        select(User.id).where(User.role == Role.ADMIN, User.active.is_(True)).with_for_update()
    ).all()
    if len(admins) <= 1:
        raise StorageError(
            f"{user.name!r} is the last enabled admin: cannot {action} them (make another "
            "user admin first)"
        )


def _logged(session: Session, user: User, action: str, actor: str, **details: object) -> None:
    session.flush()
    append_event(
        session,
        actor=actor,
        action=action,
        object_type="user",
        object_id=user.id,
        details={**details, "rows": states_detail({"users": [user]})},
    )


def set_active(session: Session, name: str, active: bool, *, actor: str) -> User:
    """Enable or disable ``name`` (the caller commits); a disabled user cannot log in and
    their sessions end. StorageError for an unknown user or the last enabled admin."""
    user = _existing(session, name)
    if user.active == active:
        return user
    if not active:
        _keep_an_admin(session, user, "disable")
    user.active = active
    _logged(session, user, "user.enabled" if active else "user.disabled", actor)
    return user


def set_role(session: Session, name: str, role: Role | str, *, actor: str) -> User:
    """Give ``name`` another role (the caller commits); their sessions end. StorageError for
    an unknown user or demoting the last enabled admin, ValueError for a bad role."""
    checked = _role(role)
    user = _existing(session, name)
    if user.role is checked:
        return user
    if checked is not Role.ADMIN:
        _keep_an_admin(session, user, "demote")
    before = user.role.value
    user.role = checked
    _logged(session, user, "user.role_changed", actor, before=before, after=checked.value)
    return user


def reset_password(session: Session, name: str, password: str, *, actor: str) -> User:
    """An administrator sets ``name``'s password (the caller commits): the user must choose a
    new one at the next login, and their sessions end."""
    user = _existing(session, name)
    check_password(user.name, password)
    user.password_hash = hash_password(password)
    user.must_change_password = True
    _logged(session, user, "user.password_reset", actor)
    return user


def change_own_password(session: Session, name: str, current: str, new: str) -> User:
    """The user ``name`` changes their own password, giving the current one (the caller
    commits). StorageError when the current password is wrong (the same scrypt work either
    way), ValueError for a new one the rules refuse or equal to the current one."""
    user = _existing(session, name)
    if not user.active or not verify_password(user.password_hash, current):
        raise StorageError("the current password is wrong")
    check_password(user.name, new)
    if new == current:
        raise ValueError("the new password must differ from the current one")
    user.password_hash = hash_password(new)
    user.must_change_password = False
    _logged(session, user, "user.password_changed", user.name)
    return user


def unlock_user(session: Session, name: str, *, actor: str, address: str | None = None) -> int:
    """Forget ``name``'s failed logins (from ``address`` only, or all), which ends their locks
    (the caller commits): how many were forgotten. An audit event, for unknown names too (a
    lock says nothing about which users exist)."""
    from db.logins import forget_failures

    user = get_user(session, name)
    count = forget_failures(session, name, address)
    append_event(
        session,
        actor=actor,
        action="user.unlocked",
        object_type="user",
        object_id=None if user is None else user.id,
        details={"user": name[:64], "address": address, "failures": count},
    )
    return count
