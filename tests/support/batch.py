"""A PACS-export-like test tree for ``radcaliper batch``: phantom studies (real DICOM from the
phantom generator) plus what real exports carry: a DICOMDIR media copy of one study, a plain
duplicate copy of another, SR / SEG / RTSTRUCT objects, a scout series, a secondary capture, a
thicker reconstruction, a derived reformat, an MR series, an incomplete series, a text file and
20 corrupt files of ten kinds, each with the words its rejection reason must contain."""

from __future__ import annotations

import copy
import gzip
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.fileset import FileSet
from pydicom.uid import ExplicitVRLittleEndian
from sqlalchemy import select

from db.engine import Store
from db.models import Run, Series, Study
from ingestion.phantoms import PhantomSpec, write_phantoms

from tests.support.series import fixed_uid

# small phantoms for tests about the batch machinery (the model still runs on them)
SMALL = PhantomSpec.small()


@dataclass
class Tree:
    """What :func:`build_tree` wrote and what a batch must make of it."""

    root: Path
    study_uids: list[str]  # the phantom studies: exactly these must be stored
    corrupt: dict[Path, str] = field(default_factory=dict)  # file -> words of its reason
    skipped: dict[Path, str] = field(default_factory=dict)  # file -> words of its reason
    series_left_out: dict[str, str] = field(default_factory=dict)  # series uid -> words
    duplicates: list[Path] = field(default_factory=list)  # the copies left out
    chosen: dict[str, str] = field(default_factory=dict)  # study uid -> measured series uid


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == ".dcm")


def by_position(folder: Path) -> list[Dataset]:
    datasets = [pydicom.dcmread(p) for p in _files(folder)]
    return sorted(datasets, key=lambda d: float(d.ImagePositionPatient[2]))


def rewrite_series(datasets: list[Dataset], folder: Path, **changes: object) -> list[Path]:
    """Save copies of ``datasets`` as a new series (new series and SOP instance UIDs, derived
    from the sources, the folder's name and the changes: the same bytes on every run)."""
    folder.mkdir(parents=True, exist_ok=True)
    series_uid = fixed_uid(
        "rewrite", folder.name, *(str(d.SOPInstanceUID) for d in datasets), sorted(changes.items())
    )
    paths = []
    for i, source in enumerate(datasets):
        ds = copy.deepcopy(source)
        ds.SeriesInstanceUID = series_uid
        ds.SOPInstanceUID = fixed_uid(series_uid, i)
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        for keyword, value in changes.items():
            setattr(ds, keyword, value)
        if "SOPClassUID" in changes:
            ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
        path = folder / f"IM{i:04d}.dcm"
        ds.save_as(path, enforce_file_format=True)
        paths.append(path)
    return paths


def _object(folder: Path, name: str, sop_class: str, modality: str, study_uid: str) -> Path:
    """A minimal non-image object (SR, SEG, RTSTRUCT) of the study."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = fixed_uid(study_uid, name, "instance")
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID = study_uid
    ds.SeriesInstanceUID = fixed_uid(study_uid, name, "series")
    ds.Modality = modality
    ds.PatientID = "PHANTOM"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    ds.save_as(path, enforce_file_format=True)
    return path


def build_tree(root: Path, *, n: int, seed: int = 11, spec: PhantomSpec | None = SMALL) -> Tree:
    """Write the tree (module doc) with ``n`` >= 8 phantom studies under ``root``."""
    if n < 8:
        raise ValueError("the tree needs at least 8 phantom studies")
    studies = write_phantoms(root / "studies", n=n, seed=seed, spec=spec)
    uids = [json.loads((s / "truth.json").read_text())["study_instance_uid"] for s in studies]
    truth = [json.loads((s / "truth.json").read_text()) for s in studies]
    tree = Tree(root, uids)
    tree.chosen = {t["study_instance_uid"]: t["series_instance_uid"] for t in truth}
    for study in studies:
        tree.skipped[study / "truth.json"] = "not DICOM (a .json file)"
    slices = [by_position(s / "dicom") for s in studies[:4]]

    # study 0: a thicker reconstruction of the same scan (every other slice): not chosen
    thick = rewrite_series(slices[0][::2], studies[0] / "thick", SeriesNumber=2)
    tree.series_left_out[pydicom.dcmread(thick[0]).SeriesInstanceUID] = "not chosen"
    # study 1: a derived reformat: left out
    mpr = rewrite_series(slices[1], studies[1] / "mpr", ImageType=["DERIVED", "SECONDARY", "MPR"])
    tree.series_left_out[pydicom.dcmread(mpr[0]).SeriesInstanceUID] = "derived images"
    # study 2: a second reconstruction with one file cut in its pixel data: incomplete
    broken = rewrite_series(slices[2][::2], studies[2] / "recon", SeriesNumber=3)
    data = broken[3].read_bytes()
    broken[3].write_bytes(data[: len(data) - 1000])
    tree.corrupt[broken[3]] = "truncated pixel data"
    tree.series_left_out[pydicom.dcmread(broken[0]).SeriesInstanceUID] = "incomplete"
    # study 3: the same images as MR: not this batch's modality
    mr = rewrite_series(
        slices[3], studies[3] / "mr", Modality="MR", SOPClassUID="1.2.840.10008.5.1.4.1.1.4"
    )
    tree.series_left_out[pydicom.dcmread(mr[0]).SeriesInstanceUID] = "modality MR"

    # study 4: a DICOMDIR media copy (the copies are duplicates, used once)
    media = FileSet()
    media.UID = fixed_uid("media", seed)  # not a random one: the same bytes on every run
    for path in _files(studies[4] / "dicom"):
        media.add(path)
    media.write(root / "media")
    media._stage["t"].cleanup()  # pydicom's staging folder, else removed (with a warning) at exit
    tree.skipped[root / "media" / "DICOMDIR"] = "DICOMDIR"
    copies = sorted(p for p in (root / "media").rglob("*") if p.is_file() and p.name != "DICOMDIR")
    tree.duplicates += [*copies, *_files(studies[4] / "dicom")]  # one of each pair is used
    # study 5: a plain duplicate copy of the whole study folder
    shutil.copytree(studies[5] / "dicom", root / "copy" / "study5")
    tree.duplicates += [*_files(root / "copy" / "study5"), *_files(studies[5] / "dicom")]

    # non-image objects, a scout series, a secondary capture, a text file: skipped
    uid6 = uids[6]
    sr = _object(studies[6] / "objects", "sr.dcm", "1.2.840.10008.5.1.4.1.1.88.33", "SR", uid6)
    seg = _object(studies[6] / "objects", "seg.dcm", "1.2.840.10008.5.1.4.1.1.66.4", "SEG", uid6)
    rts = _object(
        studies[6] / "objects", "rtstruct.dcm", "1.2.840.10008.5.1.4.1.1.481.3", "RTSTRUCT", uid6
    )
    tree.skipped.update({sr: "structured report", seg: "segmentation", rts: "RT structure set"})
    six = by_position(studies[6] / "dicom")
    scout = rewrite_series(
        six[:2],
        studies[6] / "scout",
        ImageType=["ORIGINAL", "PRIMARY", "LOCALIZER"],
        ImageOrientationPatient=["1", "0", "0", "0", "0", "-1"],
    )
    tree.skipped.update({p: "localizer/scout" for p in scout})
    (capture,) = rewrite_series(
        six[:1], studies[6] / "capture", SOPClassUID="1.2.840.10008.5.1.4.1.1.7"
    )
    tree.skipped[capture] = "secondary capture"
    (root / "README.txt").write_text("Export of the phantom archive.\n")
    tree.skipped[root / "README.txt"] = "not DICOM (a .txt file)"

    _corrupt_files(tree, root / "broken", six[0], studies[7])
    return tree


def _corrupt_files(tree: Tree, folder: Path, template: Dataset, study: Path) -> None:
    """The other 19 corrupt files (the 20th is the cut slice of study 2's second series)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(3)
    raw = (next(iter(_files(study / "dicom")))).read_bytes()
    corrupt = tree.corrupt
    for name in ("empty_0.dcm", "empty_1.dcm"):
        (folder / name).write_bytes(b"")
        corrupt[folder / name] = "empty file (0 bytes)"
    (study / "dicom" / "zero.dcm").write_bytes(b"")
    corrupt[study / "dicom" / "zero.dcm"] = "empty file (0 bytes)"
    for name in ("random_0.dcm", "random_1.dcm", "RANDOM2"):
        (folder / name).write_bytes(rng.bytes(4096))
        corrupt[folder / name] = "not a DICOM file"
    for name in ("slice.dcm.gz", "IMG0001"):
        (folder / name).write_bytes(gzip.compress(raw))
        corrupt[folder / name] = "gzip-compressed"
    for i, cut in enumerate((400, 700)):
        (folder / f"cut_header_{i}.dcm").write_bytes(raw[:cut])
        corrupt[folder / f"cut_header_{i}.dcm"] = "truncated or damaged"
    (folder / "cut_meta.dcm").write_bytes(raw[:150])  # inside the file meta group
    corrupt[folder / "cut_meta.dcm"] = "truncated DICOM header: the file ends inside the file meta"
    (folder / "garbage.dcm").write_bytes(b"\0" * 128 + b"DICM" + rng.bytes(2000))
    corrupt[folder / "garbage.dcm"] = "truncated or corrupt DICOM header"
    for i in range(2):
        (path,) = rewrite_series([template], folder / f"cut_pixels_{i}")
        path.write_bytes(path.read_bytes()[:-2000])
        corrupt[path] = "truncated pixel data"
    for i in range(2):
        (path,) = rewrite_series([template], folder / f"no_position_{i}")
        ds = pydicom.dcmread(path)
        del ds.ImagePositionPatient
        ds.save_as(path, enforce_file_format=True)
        corrupt[path] = "missing ImagePositionPatient"
    (path,) = rewrite_series([template], folder / "no_spacing")
    ds = pydicom.dcmread(path)
    del ds.PixelSpacing
    ds.save_as(path, enforce_file_format=True)
    corrupt[path] = "missing PixelSpacing"
    (path,) = rewrite_series(
        [template],
        folder / "bad_orientation",
        ImageOrientationPatient=["1", "0", "0", "1", "0", "0"],
    )
    corrupt[path] = "not perpendicular"
    (folder / "notes.dcm").write_text("scanned at 10:00, contrast 80 ml\n" * 40)
    corrupt[folder / "notes.dcm"] = "not a DICOM file"


def _j(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def stored_rows(store: Store) -> dict[str, list[tuple[object, ...]]]:
    """Everything a batch stores, by content (no ids, no times), sorted: studies, series, runs
    (with their input fingerprints), findings and measurements."""
    out: dict[str, list[tuple[object, ...]]] = {}
    with store.reader() as session:
        out["studies"] = sorted(
            (s.study_instance_uid, s.patient_id, s.study_date)
            for s in session.scalars(select(Study))
        )
        out["series"] = sorted(
            (
                s.series_instance_uid,
                s.study.study_instance_uid,
                s.modality,
                s.source_format,
                _j(s.shape),
                _j(s.spacing_mm),
                _j(s.sop_instance_uids),
                _j(s.geometry),
            )
            for s in session.scalars(select(Series))
        )
        runs = list(session.scalars(select(Run)))
        out["runs"] = sorted(
            (
                r.series.series_instance_uid,
                r.model_name,
                r.model_version,
                r.checkpoint_hash,
                r.numeric_mode,
                r.input_fingerprint,
                r.source,
                str(r.status),
                _j(r.settings),
                _j(r.warnings),
            )
            for r in runs
        )
        out["findings"] = sorted(
            (
                r.input_fingerprint,
                f.number,
                f.kind,
                f.center_x_mm,
                f.center_y_mm,
                f.center_z_mm,
                f.slice_index,
                f.sop_instance_uid,
                _j(f.axes_lps_mm),
            )
            for r in runs
            for f in r.findings
        )
        out["measurements"] = sorted(
            (
                r.input_fingerprint,
                f.number,
                m.name,
                m.value_mm,
                m.range_low_mm,
                m.range_high_mm,
                m.coverage,
                m.qualifier,
                m.reason,
                str(m.status),
                m.version,
            )
            for r in runs
            for f in r.findings
            for m in f.measurements
        )
    return out
