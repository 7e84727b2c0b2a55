"""Users (reviewer, auditor, admin) and their passwords (scrypt, a memory-hard KDF).

Hash format: ``scrypt$<n>$<r>$<p>$<salt b64>$<key b64>`` with a 16-byte random salt and a 32-byte
key; verification is constant-time, and checking a password for a user without one (or an
unknown user: pass None) costs the same scrypt work as a wrong password, so the time of a login
answer does not tell whether the user exists. Adding a user is an audit event.
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
from db.coverage import states_detail
from db.models import Role, User
from ingestion.errors import StorageError

__all__ = ["add_user", "get_user", "hash_password", "verify_password"]

_N, _R, _P = 2**14, 8, 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
MIN_PASSWORD = 8


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
    try:
        checked = Role(role)
    except ValueError:
        raise ValueError(f"role {role!r}: use reviewer, auditor or admin") from None
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
