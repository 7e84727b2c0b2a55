"""First start of the review UI: a few phantom studies measured with the demo model, and demo
users with random passwords, so that ``make run`` shows something real (labelled demo, not for
clinical use)."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import func, select

from db.engine import Store
from db.models import Role, Study, User

__all__ = ["DEMO_SEED", "DEMO_USERS", "seed_demo"]

logger = logging.getLogger(__name__)

DEMO_SEED = 7
DEMO_STUDIES = 3
DEMO_USERS = (("reviewer", Role.REVIEWER), ("auditor", Role.AUDITOR), ("admin", Role.ADMIN))


def _count(store: Store, table: type) -> int:
    with store.reader() as session:
        return int(session.execute(select(func.count()).select_from(table)).scalar_one())


def seed_demo(
    store: Store,
    measurer: object,
    data_dir: Path,
    *,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """Fill an empty store: phantom studies (written under ``data_dir/demo-studies``) measured
    and stored, and the demo users; returns the new users' passwords (also written to
    ``data_dir/demo-users.txt``, readable by the owner only). Does nothing to a store that
    holds studies or users already."""
    from app.measuring import measure_and_store
    from db.users import add_user
    from ingestion.load import load_path
    from ingestion.phantoms import write_phantoms

    def step(text: str) -> None:
        if on_step is not None:
            on_step(text)

    passwords: dict[str, str] = {}
    if _count(store, Study) == 0:
        folder = data_dir / "demo-studies"
        if not folder.exists():
            step(f"writing {DEMO_STUDIES} phantom CT studies")
            write_phantoms(folder, n=DEMO_STUDIES, seed=DEMO_SEED)
        studies = sorted(p for p in folder.iterdir() if p.is_dir())
        for number, study in enumerate(studies, start=1):
            step(f"measuring demo study {number}/{len(studies)} ({study.name})")
            for volume in load_path(study / "dicom").volumes:
                measure_and_store(
                    measurer, volume, source=str(study / "dicom"), store=store, actor="demo"
                )
    if _count(store, User) == 0:
        step("creating the demo users")
        with store.writer() as session:
            for name, role in DEMO_USERS:
                passwords[name] = secrets.token_urlsafe(9)
                add_user(session, name, role, password=passwords[name], actor="demo")
            session.commit()
        note = data_dir / "demo-users.txt"
        note.write_text(
            "radcaliper demo users (created on first start; change them for real use)\n"
            + "".join(f"{n}: {p}\n" for n, p in passwords.items())
        )
        os.chmod(note, 0o600)
    return passwords
