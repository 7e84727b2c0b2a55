"""First start of the review UI: a few phantom studies and one real CT measured with the demo
model, a real lung nodule measured by a click, and demo users with random passwords, so that
``make run`` shows something real (labelled demo, not for clinical use).

The real CT (:data:`DEMO_REAL_CASE`: an abdominal CT, 20 slices, from TotalSegmentator's test
files, Apache-2.0) and the nodule (:data:`DEMO_CLICK_CASE`: a LIDC-IDRI crop of a test patient
of the split, CC BY 3.0, clicked where its readers' mask is deepest, as a radiologist points at
it) are read in place from the shared data folder where the machine has one
(:func:`demo_real_study`, :func:`demo_click_study`); they are never copied into the
repository. Without it the demo shows phantoms only and says so."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from db.engine import Store
from db.models import Role, Study, User

if TYPE_CHECKING:
    from model.measurer.protocol import Measurer

__all__ = [
    "DEMO_CLICK_CASE",
    "DEMO_REAL_CASE",
    "DEMO_SEED",
    "DEMO_USERS",
    "DemoClick",
    "demo_click_study",
    "demo_real_study",
    "seed_demo",
]

logger = logging.getLogger(__name__)

DEMO_SEED = 7
DEMO_STUDIES = 3
DEMO_USERS = (("reviewer", Role.REVIEWER), ("auditor", Role.AUDITOR), ("admin", Role.ADMIN))
DEMO_REAL_CASE = "ts_abdomen_dicom"
DEMO_CLICK_CASE = "LIDC-IDRI-0014_R_1"  # 17.7 mm by its readers' median; a test patient


@dataclass(frozen=True)
class DemoClick:
    """The nodule the demo measures by a click: its image and the clicked point (LPS mm)."""

    image: Path
    point_lps_mm: tuple[float, float, float]


def demo_real_study(shared: Path | None = None) -> Path | None:
    """The real CT's DICOM folder in the shared data folder (``$RADCALIPER_SHARED_DATA``, else
    ``../shared/data`` beside the repository), or None where this machine has none."""
    from ingestion.errors import ConfigurationError
    from model.measurer.data.hybrid import shared_data_root

    try:
        root = shared_data_root(shared)
    except ConfigurationError:
        return None
    folder = root / "real-ct" / DEMO_REAL_CASE / "dicom"
    return folder if folder.is_dir() else None


def demo_click_study(shared: Path | None = None) -> DemoClick | None:
    """The demo nodule's image and click (the deepest point of its readers' mask on its largest
    section), or None where this machine has no shared data folder with it."""
    import numpy as np

    from ingestion.errors import ConfigurationError, RadcaliperError
    from ingestion.load import load_path
    from model.measurer.data.hybrid import shared_data_root
    from model.measurer.evaluate.clicks import lesion_clicks

    try:
        root = shared_data_root(shared)
    except ConfigurationError:
        return None
    image = root / "lidc-nodules" / "image" / f"{DEMO_CLICK_CASE}.nii.gz"
    mask_file = root / "lidc-nodules" / "mask" / f"{DEMO_CLICK_CASE}.nii.gz"
    if not (image.is_file() and mask_file.is_file()):
        return None
    try:
        mask = load_path(mask_file).volumes[0]
    except (RadcaliperError, IndexError) as error:
        logger.warning("the demo nodule's mask cannot be read: %s", error)
        return None
    clicks = lesion_clicks(mask.voxels > 0, mask.geometry, extra=0, rng=np.random.default_rng(0))
    return DemoClick(image, clicks.primary_lps_mm)


def _count(store: Store, table: type) -> int:
    with store.reader() as session:
        return int(session.execute(select(func.count()).select_from(table)).scalar_one())


def seed_demo(
    store: Store,
    measurer: Measurer,
    data_dir: Path,
    *,
    on_step: Callable[[str], None] | None = None,
    real_study: Path | None = None,
    click_study: DemoClick | None = None,
) -> dict[str, str]:
    """Fill an empty store: phantom studies (written under ``data_dir/demo-studies``) and the
    real CT folder ``real_study`` (where given) measured and stored, and the demo users;
    the nodule ``click_study`` (where given) measured at its click and stored; returns the new
    users' passwords (also written to ``data_dir/demo-users.txt``, readable by
    the owner only). Does nothing to a store that holds studies or users already. A real study
    the model refuses is logged and left out; the phantoms are still stored."""
    from app.measuring import measure_and_store, measure_at_and_store
    from db.users import add_user
    from ingestion.errors import RadcaliperError
    from ingestion.load import load_path
    from ingestion.phantoms import write_phantoms
    from ingestion.volume import Modality

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
        if real_study is not None:
            step(f"measuring the real CT demo study ({DEMO_REAL_CASE})")
            for volume in load_path(real_study).volumes:
                try:
                    measure_and_store(
                        measurer, volume, source=str(real_study), store=store, actor="demo"
                    )
                except RadcaliperError as error:
                    logger.warning("the real demo study was not stored: %s", error)
        if click_study is not None:
            step(f"measuring a real lung nodule by a click ({DEMO_CLICK_CASE})")
            try:
                # a NIfTI records no modality: these crops are CT in Hounsfield units
                for volume in load_path(click_study.image, Modality.CT).volumes:
                    measure_at_and_store(
                        measurer,
                        volume,
                        [click_study.point_lps_mm],
                        source=str(click_study.image),
                        store=store,
                        actor="demo",
                    )
            except RadcaliperError as error:
                logger.warning("the demo nodule was not stored: %s", error)
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
