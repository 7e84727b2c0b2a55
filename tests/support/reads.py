"""Reads folders for the tests of ``ingestion.dataset.reads`` and ``dataset import --from
reads``: small synthetic CT crops with an elliptic lesion mask, and the rows of reads.csv; and
the shared data folder where the machine has it."""

from __future__ import annotations

import csv
import statistics
import zlib
from collections.abc import Sequence
from pathlib import Path

import nibabel as nib
import numpy as np

from ingestion.dataset.format import Dataset, read_dataset, write_import
from ingestion.dataset.reads import import_reads
from ingestion.errors import ConfigurationError

COLUMNS = (
    "case",
    "patient_id",
    "nodule_id",
    "n_reads",
    "reads_long_mm",
    "reads_short_mm",
    "median_read_long_mm",
    "median_read_short_mm",
)
SPACING_MM = (0.7, 0.7, 2.0)  # NIfTI (column, row, slice)
SHAPE = (24, 26, 5)
SEMI_AXES_PX = (6.0, 4.0)  # along columns, rows: the mask's long axis is 2 x 6 x 0.7 = 8.4 mm


def shared_or_none() -> Path | None:
    """The shared data folder (``shared_data_root``), None where this machine has none."""
    from model.measurer.data.hybrid import shared_data_root

    try:
        return shared_data_root()
    except ConfigurationError:
        return None


def write_crop(
    folder: Path,
    case: str,
    *,
    mask_value: int = 1,
    empty: bool = False,
    background_hu: float = 40.0,
    margin_px: int = 0,
) -> None:
    """image/CASE.nii.gz (``background_hu`` around, soft tissue at 40 HU by default, lung at
    about -800; the lesion at 120 HU; noise seeded by the case) and mask/CASE.nii.gz
    (``mask_value`` in an ellipse on the middle slice, 2, and a smaller disc on the slices
    beside it); ``margin_px`` more pixels on each in-plane side (room around the lesion)."""
    shape = (SHAPE[0] + 2 * margin_px, SHAPE[1] + 2 * margin_px, SHAPE[2])
    x, y = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    cx, cy = 11.5 + margin_px, 12.5 + margin_px
    a, b = SEMI_AXES_PX
    ellipse = ((x - cx) / a) ** 2 + ((y - cy) / b) ** 2 <= 1.0
    disc = (x - cx) ** 2 + (y - cy) ** 2 <= 9.0
    mask = np.zeros(shape, dtype=np.uint8)
    if not empty:
        mask[..., 2] = ellipse * mask_value
        for z in (1, 3):
            mask[..., z] = disc * mask_value
    seed = zlib.crc32(case.encode())  # each case its own noise (a byte sum would repeat)
    noise = np.random.default_rng(seed).normal(0.0, 5.0, shape)
    image = np.where(mask > 0, 120.0, background_hu) + noise
    affine = np.diag([*SPACING_MM, 1.0])
    affine[:3, 3] = (-8.0, 20.0, -50.0)
    for sub, data, dtype in (("image", image, np.int16), ("mask", mask, np.uint8)):
        (folder / sub).mkdir(parents=True, exist_ok=True)
        nib.save(nib.Nifti1Image(data.astype(dtype), affine), folder / sub / f"{case}.nii.gz")


def row(
    case: str,
    patient: str,
    longs: Sequence[float],
    shorts: Sequence[float],
    **overrides: str,
) -> dict[str, str]:
    """A reads.csv row with the reads' medians; ``overrides`` replace any column's text."""
    values = {
        "case": case,
        "patient_id": patient,
        "nodule_id": case.rsplit("_", 1)[-1],
        "n_reads": str(len(longs)),
        "reads_long_mm": ";".join(f"{v:.2f}" for v in longs),
        "reads_short_mm": ";".join(f"{v:.2f}" for v in shorts),
        "median_read_long_mm": f"{statistics.median(longs):.3f}",
        "median_read_short_mm": f"{statistics.median(shorts):.3f}",
    }
    values.update(overrides)
    return values


def write_table(
    folder: Path, rows: Sequence[dict[str, str]], columns: Sequence[str] = COLUMNS
) -> Path:
    """``folder/reads.csv`` with ``columns`` (a row's other keys are left out)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "reads.csv"
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_reads_folder(folder: Path) -> Path:
    """Three lesions of two patients, every one importable: LIDC-IDRI-0001 with two nodules
    (4 and 3 readers), LIDC-IDRI-0002 with one."""
    rows = [
        row("LIDC-IDRI-0001_R_1", "LIDC-IDRI-0001", [8.1, 9.0, 8.6, 7.9], [5.2, 6.0, 5.5, 5.0]),
        row("LIDC-IDRI-0001_R_2", "LIDC-IDRI-0001", [10.5, 11.2, 9.9], [7.1, 7.7, 6.6]),
        row("LIDC-IDRI-0002_R_1", "LIDC-IDRI-0002", [6.2, 6.8, 7.0, 6.4], [4.1, 4.4, 4.9, 4.0]),
    ]
    for r in rows:
        write_crop(folder, r["case"])
    write_table(folder, rows)
    return folder


# patients of the training side of the split (ingestion/dataset/patient_split.json)
TRAIN_ROWS = (
    ("LIDC-IDRI-0001_R_1", "LIDC-IDRI-0001", [8.1, 9.0, 8.6, 7.9], [5.2, 6.0, 5.5, 5.0]),
    ("LIDC-IDRI-0004_R_1", "LIDC-IDRI-0004", [12.5, 13.2, 11.9], [8.1, 8.7, 7.6]),
    ("LIDC-IDRI-0006_R_1", "LIDC-IDRI-0006", [4.2, 4.8, 5.0, 4.4], [3.1, 3.4, 3.9, 3.0]),
)


def reads_dataset(
    tmp: Path,
    rows: Sequence[tuple[str, str, list[float], list[float]]] = TRAIN_ROWS,
    margin_px: int = 12,
) -> Dataset:
    """A dataset of read lesions in lung (background -800 HU) with room around them."""
    folder = tmp / "reads"
    table = [row(case, patient, longs, shorts) for case, patient, longs, shorts in rows]
    for r in table:
        write_crop(folder, r["case"], background_hu=-800.0, margin_px=margin_px)
    write_table(folder, table)
    out = tmp / "dataset"
    write_import(out, [import_reads(folder)])
    return read_dataset(out)
