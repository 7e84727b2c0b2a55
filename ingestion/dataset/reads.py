"""Import lesions that several readers measured: image crops, each lesion's mask and every
reader's long and short axis (``radcaliper dataset import FOLDER OUT --from reads``).

The folder is laid out as the shared LIDC-IDRI nodules are (``shared/data/lidc-nodules``)::

    reads.csv           one row per lesion; the columns of REQUIRED_COLUMNS (others are kept
                        out of the dataset and ignored)
    image/CASE.nii.gz   the CT crop the lesion lies in (HU, its real affine)
    mask/CASE.nii.gz    the lesion's mask on the crop's grid: 1 = lesion, 0 = outside

Each row gives one study (the crop: NIfTI, CT, ``patient_id`` = the row's patient, lesions
annotated) and one lesion finding:

- **values**: ``long_axis_mm`` / ``short_axis_mm`` are ``median_read_long_mm`` /
  ``median_read_short_mm``, the readers' median: the truth a measurement is scored against.
  Every reader's own pair is kept in ``reads`` (``reads_long_mm`` and ``reads_short_mm``,
  ``;``-separated, one per reader, ``n_reads`` of each); the medians are checked against them;
- **places**: the measured slice, the z range, the centre and the axes' END POINTS are the
  mask's, measured by :func:`ingestion.dataset.recist.lesion_axes` on the mask read onto the
  image's grid (nothing is resampled). The end points are the mask's and the values the
  readers': the segment between the long axis' end points is the mask's long axis, which may
  differ in length from ``long_axis_mm`` (on the 707 LIDC nodules, measured by ``lesion_axes``, the
  mask's long axis minus the readers' median is -0.06 mm median, +0.18 mm mean; the data's README
  gives 0.66 mm for its own measurement of the mask);
- ``mask`` = the mask file, label 1 (a click evaluation clicks inside it, negatives outside).

A row that cannot be used is one line of the import report naming the file, the row and the
reason, and the rest imports: an unreadable value, reads whose count is not ``n_reads``, a
median that is not the reads' median, a missing or unloadable image or mask, a mask on another
grid or with no lesion voxel. An image with no row is reported too. A folder without
``reads.csv``, or one whose header lacks a required column, is refused whole.

Identifiers: the series' UIDs are those radcaliper derives from the NIfTI's content
(``Identifiers.uids_derived``); a row's id is :func:`~ingestion.dataset.format.finding_id` of
the input, the series and the case, so importing the folder again gives the same rows.
"""

from __future__ import annotations

import csv
import logging
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ingestion.dataset._label_grid import GridMismatch, on_image_grid, read_label_map
from ingestion.dataset.format import (
    DatasetFinding,
    DatasetStudy,
    ImageRef,
    ImportProgress,
    ImportResult,
    Label,
    MaskRef,
    Provenance,
    Read,
    Skipped,
    SourceType,
    finding_id,
)
from ingestion.dataset.recist import lesion_axes
from ingestion.errors import ConfigurationError, IngestionError
from ingestion.load import load_path
from ingestion.volume import Modality, Volume

__all__ = [
    "LIDC_ANNOTATOR",
    "LIDC_LICENCE",
    "MEDIAN_TOLERANCE_MM",
    "READS_NAME",
    "REQUIRED_COLUMNS",
    "import_reads",
]

logger = logging.getLogger(__name__)

READS_NAME = "reads.csv"
REQUIRED_COLUMNS = (
    "case",
    "patient_id",
    "n_reads",
    "reads_long_mm",
    "reads_short_mm",
    "median_read_long_mm",
    "median_read_short_mm",
)
MEDIAN_TOLERANCE_MM = 0.01
"""A row's median may differ from its reads' median by this much (values written to two
decimals); more is a row that contradicts itself."""
LIDC_ANNOTATOR = "LIDC-IDRI readers"
LIDC_LICENCE = (
    "CC BY 3.0 (LIDC-IDRI, The Cancer Imaging Archive). Attribution: Armato III SG et al. "
    "(2015), Data From LIDC-IDRI, The Cancer Imaging Archive, "
    "https://doi.org/10.7937/K9/TCIA.2015.LO9QL9SX; Armato et al., Med Phys 38:915-931 (2011); "
    "Clark et al., J Digit Imaging 26:1045-1057 (2013)"
)
_SUFFIXES = (".nii.gz", ".nii")


class _RowError(Exception):
    """A row that cannot be imported; the message is the report line's reason."""


@dataclass(frozen=True)
class _Row:
    case: str
    patient_id: str
    reads: tuple[Read, ...]
    long_axis_mm: float
    short_axis_mm: float


def _number(row: Mapping[str, str], column: str) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise _RowError(f"{column} {text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise _RowError(f"{column} {text!r} must be a finite number > 0 mm")
    return value


def _numbers(row: Mapping[str, str], column: str) -> list[float]:
    parts = (row.get(column) or "").split(";")
    return [_number({column: part}, column) for part in parts]


def _parse(row: Mapping[str, str]) -> _Row:
    """The row's values, checked (module doc), or _RowError saying what is wrong."""
    case = (row.get("case") or "").strip()
    patient = (row.get("patient_id") or "").strip()
    if not case or Path(case).name != case:
        raise _RowError(f"case {case!r} must be a file name (image/CASE.nii.gz)")
    if not patient:
        raise _RowError("patient_id is empty")
    count_text = (row.get("n_reads") or "").strip()
    if not count_text.isdigit() or int(count_text) < 1:
        raise _RowError(f"n_reads {count_text!r} must be a whole number >= 1")
    count = int(count_text)
    longs, shorts = _numbers(row, "reads_long_mm"), _numbers(row, "reads_short_mm")
    if len(longs) != count or len(shorts) != count:
        raise _RowError(
            f"n_reads is {count} but reads_long_mm has {len(longs)} and reads_short_mm "
            f"{len(shorts)} values"
        )
    try:
        reads = tuple(Read(lo, sh) for lo, sh in zip(longs, shorts, strict=True))
    except ValueError as error:
        raise _RowError(str(error)) from None
    medians = []
    for column, values in (("median_read_long_mm", longs), ("median_read_short_mm", shorts)):
        median = _number(row, column)
        if abs(median - statistics.median(values)) > MEDIAN_TOLERANCE_MM + 1e-9:
            raise _RowError(
                f"{column} {median:g} is not the median of the reads "
                f"({statistics.median(values):g})"
            )
        medians.append(median)
    return _Row(case, patient, reads, medians[0], medians[1])


def _read_table(folder: Path) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) of ``reads.csv``; ConfigurationError for a folder that is not a
    reads folder."""
    path = folder / READS_NAME
    expected = (
        f"a reads folder holds {READS_NAME} (one row per lesion with the columns "
        f"{', '.join(REQUIRED_COLUMNS)}), image/CASE.nii.gz and mask/CASE.nii.gz"
    )
    if not folder.is_dir():
        raise ConfigurationError(f"{folder}: not a folder; {expected}")
    if not path.is_file():
        raise ConfigurationError(f"{path}: no such file; {expected}")
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise ConfigurationError(
                    f"{path}: no column {', '.join(missing)} (its header: "
                    f"{', '.join(header) or 'empty'}); {expected}"
                )
            rows = [(reader.line_num, dict(row)) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ConfigurationError(f"{path}: cannot be read as CSV ({error}); {expected}") from error
    if not rows:
        raise ConfigurationError(f"{path}: no rows; {expected}")
    return rows


def _file(folder: Path, case: str) -> Path:
    """``folder/CASE.nii.gz`` (or ``.nii``), the first name where neither exists."""
    candidates = [folder / f"{case}{suffix}" for suffix in _SUFFIXES]
    return next((p for p in candidates if p.is_file()), candidates[0])


def _load_crop(path: Path) -> Volume:
    try:
        loaded = load_path(path, nifti_modality=Modality.CT)
    except IngestionError as error:
        raise _RowError(f"image cannot be loaded: {error}") from None
    if len(loaded.volumes) != 1:
        reasons = sorted({r.reason for r in loaded.rejected}) or ["no image found"]
        raise _RowError(f"image cannot be loaded: {reasons[0]}")
    return loaded.volumes[0]


def _lesion_mask(path: Path, volume: Volume) -> npt.NDArray[np.bool_]:
    """The mask's lesion voxels on the image's grid, or _RowError saying why not."""
    try:
        labels, grid = read_label_map(path)
        labels = on_image_grid(labels, grid, volume.shape, volume.geometry)
    except GridMismatch as error:
        raise _RowError(
            f"mask grid differs from the image's: {error}; nothing is resampled"
        ) from None
    except Exception as error:  # MONAI's readers raise many types for a bad file
        first = next(iter(str(error).strip().splitlines()), "")
        raise _RowError(f"mask cannot be read ({type(error).__name__}: {first})") from None
    values = sorted(set(np.unique(labels).tolist()) - {0, 1})
    if values:
        raise _RowError(f"mask holds values other than 0 and 1 ({values[:5]}): not one lesion")
    mask: npt.NDArray[np.bool_] = labels == 1
    if not mask.any():
        raise _RowError("mask is empty: no lesion voxel (value 1)")
    return mask


def import_reads(
    folder: Path,
    *,
    on_item: ImportProgress | None = None,
    annotator: str = LIDC_ANNOTATOR,
    licence: str = LIDC_LICENCE,
) -> ImportResult:
    """Import a folder of crops, masks and readers' axes (module doc).

    Args:
        folder: the folder holding ``reads.csv``, ``image/`` and ``mask/``.
        on_item: progress, called before each row.
        annotator: who read the lesions; each row's provenance says "ANNOTATOR (median of N)".
        licence: the data's licence and attribution (default: LIDC-IDRI's, CC BY 3.0).

    Raises:
        ConfigurationError: ``folder`` is not a folder, or has no readable ``reads.csv`` with
            the columns of ``REQUIRED_COLUMNS`` and at least one row.
    """
    folder = Path(folder).resolve()
    table = _read_table(folder)
    csv_path = str(folder / READS_NAME)
    base = Provenance(SourceType.READS, str(folder), "", annotator, licence)
    studies: list[DatasetStudy] = []
    findings: list[DatasetFinding] = []
    skipped: list[Skipped] = []
    seen: set[str] = set()

    def skip(file: str, item: str, reason: str) -> None:
        skipped.append(Skipped(SourceType.READS, base.path, file, item, reason))

    for done, (line, raw) in enumerate(table):
        case = (raw.get("case") or "").strip()
        item = f"line {line} ({case or 'no case'})"
        if on_item is not None:
            on_item(done, len(table), case)
        image_path, mask_path = _file(folder / "image", case), _file(folder / "mask", case)
        file = csv_path
        try:
            row = _parse(raw)
            if row.case in seen:
                raise _RowError(f"case {row.case} is on an earlier line too")
            seen.add(row.case)
            for path, what in ((image_path, "image"), (mask_path, "mask")):
                if not path.is_file():
                    file = str(path)
                    raise _RowError(f"no {what}: expected {what}/{case}.nii.gz")
            file = str(image_path)
            volume = _load_crop(image_path)
            file = str(mask_path)
            axes = lesion_axes(_lesion_mask(mask_path, volume), volume.geometry)
        except _RowError as error:
            skip(file, item, str(error))
            continue
        ids = volume.identifiers
        image = ImageRef(str(image_path), "nifti", Modality.CT.value)
        studies.append(
            DatasetStudy(
                ids.study_instance_uid,
                ids.series_instance_uid,
                image,
                ("lesion",),
                base,
                patient_id=row.patient_id,
            )
        )
        provenance = Provenance(
            base.source, base.path, row.case, f"{annotator} (median of {len(row.reads)})", licence
        )
        findings.append(
            DatasetFinding(
                id=finding_id(base, ids.series_instance_uid, row.case),
                study_instance_uid=ids.study_instance_uid,
                series_instance_uid=ids.series_instance_uid,
                image=image,
                kind="lesion",
                label=Label.FINDING,
                name=row.case,
                center_lps_mm=axes.center_lps_mm,
                slice_index=axes.slice_index,
                provenance=provenance,
                z_range_lps_mm=axes.z_range_lps_mm,
                long_axis_mm=row.long_axis_mm,
                short_axis_mm=row.short_axis_mm,
                long_axis_lps_mm=axes.long_axis_lps_mm,
                short_axis_lps_mm=axes.short_axis_lps_mm,
                reads=row.reads,
                mask=MaskRef(str(mask_path), 1),
            )
        )
    listed = {(raw.get("case") or "").strip() for _, raw in table}
    images = folder / "image"
    for path in sorted(images.iterdir()) if images.is_dir() else ():
        name = next((path.name[: -len(s)] for s in _SUFFIXES if path.name.endswith(s)), None)
        if name is not None and name not in listed:
            skip(str(path), "", f"no row in {READS_NAME}: not imported")
    logger.info("reads import of %s: %d lesions, %d skipped", folder, len(findings), len(skipped))
    return ImportResult(
        SourceType.READS, base.path, tuple(studies), tuple(findings), tuple(skipped)
    )
