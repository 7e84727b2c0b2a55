"""The dataset format: true findings from any annotation source, one folder that training,
calibration and evaluation all read.

A dataset is a folder::

    dataset.json        {"format": "radcaliper-dataset", "version": 1}
    studies.jsonl       one line per (series, input): the image to load and what was annotated
    findings.jsonl      one line per true finding (or negative example)
    import_report.jsonl one line per input item that was not imported: file, reason

Every line says where it came from (:class:`Provenance`: source type, input path, the item in
the input, annotator, licence). Lines are sorted and written with sorted keys, and every
identifier is a hash of the input's identity, so importing the same input twice gives the same
files byte for byte. Importing an input replaces the lines of an earlier import of that same
input (same source type and path) and keeps every other line: a dataset grows source by source.

Coordinates are DICOM patient coordinates (LPS, mm). A lesion's truth is RECIST: long axis and
short axis on its measured slice (``ingestion.dataset.recist``), centre = the long axis'
midpoint; a vessel's is one cross-section's diameter and centre. ``z_range_lps_mm`` is the
finding's extent along z, used by the matching rule (``model.measurer.evaluate.scoring``).

Optional keys, written only when set (a dataset that uses none of them is byte for byte what it
was before they existed): a study's ``patient_id`` (the patient the series belongs to: the
patient-level split, ``ingestion.dataset.split``, reads it), a lesion's ``reads`` (each
reader's long and short axis, :class:`Read`, where the row's own axes are the readers' median)
and a finding's ``mask`` (the label map it came from, :class:`MaskRef`).

The source types, labels, :class:`Provenance`, :class:`ImageRef`, :class:`Read` and
:class:`MaskRef` are defined in
:mod:`ingestion.dataset._provenance` (with the checks of the values read back) and are part of
this module's public surface: import them from here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ingestion.dataset._provenance import (
    KINDS,
    ImageRef,
    KindName,
    Label,
    MaskRef,
    Provenance,
    Read,
    Segment,
    SourceType,
    Vector3,
    _number,
    _point,
    _positive,
    _segment,
    _text,
)
from ingestion.errors import ConfigurationError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Dataset",
    "DatasetFinding",
    "DatasetStudy",
    "ImageRef",
    "ImportProgress",
    "ImportResult",
    "KindName",
    "Label",
    "MaskRef",
    "Provenance",
    "Read",
    "Segment",
    "Skipped",
    "SourceType",
    "TrueFinding",
    "Vector3",
    "finding_id",
    "read_dataset",
    "write_import",
]

FORMAT_NAME = "radcaliper-dataset"
FORMAT_VERSION = 1
INFO_NAME = "dataset.json"
STUDIES_NAME = "studies.jsonl"
FINDINGS_NAME = "findings.jsonl"
REPORT_NAME = "import_report.jsonl"


ImportProgress = Callable[[int, int, str], None]
"""Called by an importer before each item of a folder: (items done, items in all, the item)."""


class TrueFinding(Protocol):
    """What training and evaluation read of a true finding: a dataset row
    (:class:`DatasetFinding`) or a phantom's truth (``ingestion.phantoms.TruthFinding``)."""

    @property
    def kind(self) -> str: ...  # "lesion" or "vessel"

    @property
    def center_lps_mm(self) -> Vector3: ...

    @property
    def slice_index(self) -> int: ...

    @property
    def long_axis_mm(self) -> float | None: ...

    @property
    def short_axis_mm(self) -> float | None: ...

    @property
    def diameter_mm(self) -> float | None: ...

    @property
    def rotation_deg(self) -> float | None: ...  # long axis from +x towards +y, [0, 180)

    @property
    def cc_extent_mm(self) -> float | None: ...  # lesion: extent along z

    @property
    def z_range_lps_mm(self) -> tuple[float, float] | None: ...  # None: unbounded


@dataclass(frozen=True)
class DatasetStudy:
    """One annotated series, as one input gives it.

    Args:
        study_instance_uid, series_instance_uid: the series' identity (NIfTI: the UIDs
            radcaliper derives from the file's content, ``Identifiers.uids_derived``).
        image: the image to load.
        annotated: the kinds of finding annotated exhaustively in this series: a report of a
            kind not listed is neither right nor wrong (it is not counted as false).
        provenance: the input (its ``item`` is empty).
        patient_id: the patient the series belongs to, where the input says (the
            patient-level split reads it); written only when set.
    """

    study_instance_uid: str
    series_instance_uid: str
    image: ImageRef
    annotated: tuple[KindName, ...]
    provenance: Provenance
    patient_id: str | None = None

    def __post_init__(self) -> None:
        _text("study_instance_uid", self.study_instance_uid)
        _text("series_instance_uid", self.series_instance_uid)
        if self.patient_id is not None:
            _text("patient_id", self.patient_id)
        kinds = tuple(sorted(set(self.annotated)))
        for kind in kinds:
            if kind not in KINDS:
                raise ValueError(f"annotated kinds must be lesion or vessel, got {kind!r}")
        object.__setattr__(self, "annotated", kinds)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "study_instance_uid": self.study_instance_uid,
            "series_instance_uid": self.series_instance_uid,
            "image": self.image.to_json(),
            "annotated": list(self.annotated),
            "provenance": self.provenance.to_json(),
        }
        if self.patient_id is not None:
            data["patient_id"] = self.patient_id
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DatasetStudy:
        return cls(
            data["study_instance_uid"],
            data["series_instance_uid"],
            ImageRef.from_json(data["image"]),
            tuple(data["annotated"]),
            Provenance.from_json(data["provenance"]),
            data.get("patient_id"),
        )


def finding_id(provenance: Provenance, series_instance_uid: str, key: str) -> str:
    """A row's identity: a hash of its input, series and its ``key`` within the input."""
    text = "\x1f".join((provenance.source.value, provenance.path, series_instance_uid, key))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class DatasetFinding:
    """One row of ``findings.jsonl``: a true finding (or a negative example) of one series.

    Args:
        id: :func:`finding_id` (stable across imports of the same input).
        study_instance_uid, series_instance_uid: the series it is on.
        image: the image of that series.
        kind: "lesion" or "vessel".
        label: a finding, or a negative example (a reviewer rejected a finding reported here;
            no measurement is true of it).
        name: the annotation's own name ("aorta", "GTV-1", "finding 2").
        center_lps_mm: lesion: the long axis' midpoint; vessel: the cross-section's centre.
        slice_index: the measured slice (0-based, in the series' slice order).
        z_range_lps_mm: (low, high) extent along z; None where unknown (e.g. an SR measurement).
        long_axis_mm, short_axis_mm: lesion (a negative example has neither).
        diameter_mm: vessel.
        long_axis_lps_mm, short_axis_lps_mm, diameter_lps_mm: the axes' end points, where known.
        provenance: where the row came from.
        reads: a lesion's readers' own measurements, one per reader, where the row's long and
            short axis are their median (the truth); written only when there are any.
        mask: the label map the finding came from, on the image's grid; written only when set.
    """

    id: str
    study_instance_uid: str
    series_instance_uid: str
    image: ImageRef
    kind: KindName
    label: Label
    name: str
    center_lps_mm: Vector3
    slice_index: int
    provenance: Provenance
    z_range_lps_mm: tuple[float, float] | None = None
    long_axis_mm: float | None = None
    short_axis_mm: float | None = None
    diameter_mm: float | None = None
    long_axis_lps_mm: Segment | None = None
    short_axis_lps_mm: Segment | None = None
    diameter_lps_mm: Segment | None = None
    reads: tuple[Read, ...] = ()
    mask: MaskRef | None = None

    def __post_init__(self) -> None:
        _text("id", self.id)
        _text("study_instance_uid", self.study_instance_uid)
        _text("series_instance_uid", self.series_instance_uid)
        if self.kind not in KINDS:
            raise ValueError(f"kind must be lesion or vessel, got {self.kind!r}")
        object.__setattr__(self, "label", Label(self.label))
        _text("name", self.name, empty=True)
        object.__setattr__(self, "center_lps_mm", _point("center_lps_mm", self.center_lps_mm))
        index = self.slice_index
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"slice_index must be an integer >= 0, got {index!r}")
        if self.z_range_lps_mm is not None:
            low, high = (_number("z_range_lps_mm", v) for v in self.z_range_lps_mm)
            if low > high:
                raise ValueError(f"z_range_lps_mm must be (low, high), got {self.z_range_lps_mm}")
            object.__setattr__(self, "z_range_lps_mm", (low, high))
        for name in ("long_axis_mm", "short_axis_mm", "diameter_mm"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        for name in ("long_axis_lps_mm", "short_axis_lps_mm", "diameter_lps_mm"):
            object.__setattr__(self, name, _segment(name, getattr(self, name)))
        if self.label is Label.FINDING:
            if self.kind == "lesion" and (self.long_axis_mm is None or self.short_axis_mm is None):
                raise ValueError("a lesion needs long_axis_mm and short_axis_mm")
            if self.kind == "lesion" and self.short_axis_mm > self.long_axis_mm + 1e-9:  # type: ignore[operator]
                raise ValueError(
                    f"short axis {self.short_axis_mm} mm exceeds long axis {self.long_axis_mm} mm"
                )
            if self.kind == "vessel" and self.diameter_mm is None:
                raise ValueError("a vessel needs diameter_mm")
        wrong = ("diameter_mm",) if self.kind == "lesion" else ("long_axis_mm", "short_axis_mm")
        for name in wrong:
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is for the other kind of finding, not a {self.kind}")
        reads = tuple(self.reads)
        if not all(isinstance(r, Read) for r in reads):
            raise ValueError(f"reads must be Read values, got {self.reads!r}")
        if reads and (self.kind != "lesion" or self.label is not Label.FINDING):
            raise ValueError("reads are a lesion finding's readers' axes; this row is not one")
        object.__setattr__(self, "reads", reads)
        if self.mask is not None and not isinstance(self.mask, MaskRef):
            raise ValueError(f"mask must be a MaskRef, got {self.mask!r}")

    # -- what training reads (TrueFinding) ------------------------------------------------------
    @property
    def rotation_deg(self) -> float | None:
        """The long axis' angle in the axial plane, from +x towards +y, in [0, 180); 0 where
        the end points are not known."""
        if self.kind != "lesion":
            return None
        if self.long_axis_lps_mm is None:
            return 0.0
        (x0, y0, _), (x1, y1, _) = self.long_axis_lps_mm
        return math.degrees(math.atan2(y1 - y0, x1 - x0)) % 180.0

    @property
    def cc_extent_mm(self) -> float | None:
        """A lesion's extent along z (its long axis where the extent is not known)."""
        if self.kind != "lesion":
            return None
        if self.z_range_lps_mm is not None:
            low, high = self.z_range_lps_mm
            return max(high - low, 1e-3)
        return self.long_axis_mm

    def to_json(self) -> dict[str, Any]:
        def segment(value: Segment | None) -> list[list[float]] | None:
            return None if value is None else [list(value[0]), list(value[1])]

        data: dict[str, Any] = {
            "id": self.id,
            "study_instance_uid": self.study_instance_uid,
            "series_instance_uid": self.series_instance_uid,
            "image": self.image.to_json(),
            "kind": self.kind,
            "label": self.label.value,
            "name": self.name,
            "center_lps_mm": [round(v, 4) for v in self.center_lps_mm],
            "slice_index": self.slice_index,
            "z_range_lps_mm": None if self.z_range_lps_mm is None else list(self.z_range_lps_mm),
            "long_axis_mm": self.long_axis_mm,
            "short_axis_mm": self.short_axis_mm,
            "diameter_mm": self.diameter_mm,
            "long_axis_lps_mm": segment(self.long_axis_lps_mm),
            "short_axis_lps_mm": segment(self.short_axis_lps_mm),
            "diameter_lps_mm": segment(self.diameter_lps_mm),
            "provenance": self.provenance.to_json(),
        }
        if self.reads:
            data["reads"] = [r.to_json() for r in self.reads]
        if self.mask is not None:
            data["mask"] = self.mask.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DatasetFinding:
        z_range = data.get("z_range_lps_mm")
        return cls(
            id=data["id"],
            study_instance_uid=data["study_instance_uid"],
            series_instance_uid=data["series_instance_uid"],
            image=ImageRef.from_json(data["image"]),
            kind=data["kind"],
            label=Label(data["label"]),
            name=data.get("name", ""),
            center_lps_mm=data["center_lps_mm"],
            slice_index=data["slice_index"],
            provenance=Provenance.from_json(data["provenance"]),
            z_range_lps_mm=None if z_range is None else (z_range[0], z_range[1]),
            long_axis_mm=data.get("long_axis_mm"),
            short_axis_mm=data.get("short_axis_mm"),
            diameter_mm=data.get("diameter_mm"),
            long_axis_lps_mm=data.get("long_axis_lps_mm"),
            short_axis_lps_mm=data.get("short_axis_lps_mm"),
            diameter_lps_mm=data.get("diameter_lps_mm"),
            reads=tuple(Read.from_json(r) for r in data.get("reads", ())),
            mask=None if data.get("mask") is None else MaskRef.from_json(data["mask"]),
        )


@dataclass(frozen=True)
class Skipped:
    """An input item that was not imported, and why (one line of the import report)."""

    source: SourceType
    path: str  # the input as imported
    file: str  # the file at fault (may be inside the input)
    item: str  # what was left out ("label 2, component 3"; "" for the whole file)
    reason: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", SourceType(self.source))

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source.value,
            "path": self.path,
            "file": self.file,
            "item": self.item,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Skipped:
        return cls(
            SourceType(data["source"]), data["path"], data["file"], data["item"], data["reason"]
        )

    def line(self) -> str:
        """One line for a person: file, item, reason."""
        where = f"{self.file} ({self.item})" if self.item else self.file
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class ImportResult:
    """What one importer made of one input."""

    source: SourceType
    path: str
    studies: tuple[DatasetStudy, ...] = ()
    findings: tuple[DatasetFinding, ...] = ()
    skipped: tuple[Skipped, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", SourceType(self.source))
        for provenance in [s.provenance for s in self.studies] + [
            f.provenance for f in self.findings
        ]:
            if (provenance.source, provenance.path) != (self.source, self.path):
                raise ValueError(
                    f"a row from {provenance.source.value} {provenance.path} is not "
                    f"from this import ({self.source.value} {self.path})"
                )
        ids = [f.id for f in self.findings]
        if len(set(ids)) != len(ids):
            raise ValueError("two findings of one import have the same id")


@dataclass(frozen=True)
class Dataset:
    """A dataset folder in memory (module doc)."""

    root: Path
    studies: tuple[DatasetStudy, ...] = ()
    findings: tuple[DatasetFinding, ...] = ()
    skipped: tuple[Skipped, ...] = field(default=(), repr=False)

    def series(self) -> list[str]:
        """Series UIDs in a stable order: by image path, then UID."""
        return list(self._studies_by_series)

    def study(self, series_instance_uid: str) -> DatasetStudy:
        """The series' study entry (the first by input path where several inputs give it), with
        the kinds any of them annotated."""
        return self._studies_by_series[series_instance_uid]

    def findings_of(self, series_instance_uid: str) -> tuple[DatasetFinding, ...]:
        return self._findings_by_series.get(series_instance_uid, ())

    @functools.cached_property
    def _studies_by_series(self) -> dict[str, DatasetStudy]:
        """One entry per series (``study``), in ``series`` order: built once, not per call."""
        entries: dict[str, list[DatasetStudy]] = {}
        for s in self.studies:
            entries.setdefault(s.series_instance_uid, []).append(s)
        merged = {}
        for uid, group in entries.items():
            group.sort(key=lambda s: (s.provenance.source.value, s.provenance.path))
            kinds = tuple(sorted({k for s in group for k in s.annotated}))
            merged[uid] = replace(group[0], annotated=kinds)
        order = {uid: min((s.image.path, uid) for s in group) for uid, group in entries.items()}
        return {uid: merged[uid] for uid in sorted(merged, key=order.__getitem__)}

    @functools.cached_property
    def _findings_by_series(self) -> dict[str, tuple[DatasetFinding, ...]]:
        rows: dict[str, list[DatasetFinding]] = {}
        for f in self.findings:
            rows.setdefault(f.series_instance_uid, []).append(f)
        return {uid: tuple(group) for uid, group in rows.items()}


def _jsonl(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise ConfigurationError(f"{path}:{number}: not JSON ({error})") from error
        if not isinstance(row, dict):
            raise ConfigurationError(f"{path}:{number}: not a JSON object")
        rows.append(row)
    return rows


def read_dataset(root: str | Path) -> Dataset:
    """Read the dataset folder ``root``.

    Raises:
        ConfigurationError: ``root`` is not a dataset folder (no or another ``dataset.json``),
            or a line of it cannot be read (file and line number named).
    """
    root = Path(root)
    info_path = root / INFO_NAME
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigurationError(
            f"{root} is not a radcaliper dataset ({info_path.name}: {error}); make one with "
            "'radcaliper dataset import SOURCE OUT'"
        ) from error
    if not isinstance(info, dict) or info.get("format") != FORMAT_NAME:
        raise ConfigurationError(f"{info_path}: not a {FORMAT_NAME} description")
    if info.get("version") != FORMAT_VERSION:
        raise ConfigurationError(
            f"{info_path}: format version {info.get('version')!r}; this radcaliper reads "
            f"version {FORMAT_VERSION}: import the sources again"
        )
    parsed: dict[str, list[Any]] = {}
    for name, parse in (
        (STUDIES_NAME, DatasetStudy.from_json),
        (FINDINGS_NAME, DatasetFinding.from_json),
        (REPORT_NAME, Skipped.from_json),
    ):
        path = root / name
        items: list[Any] = []
        for number, row in enumerate(_read_lines(path), 1):
            try:
                items.append(parse(row))
            except (KeyError, TypeError, ValueError) as error:
                raise ConfigurationError(f"{path}: line {number}: {error}") from error
        parsed[name] = items
    return Dataset(
        root,
        tuple(parsed[STUDIES_NAME]),
        tuple(parsed[FINDINGS_NAME]),
        tuple(parsed[REPORT_NAME]),
    )


def _study_key(s: DatasetStudy) -> tuple[str, ...]:
    return (s.series_instance_uid, s.provenance.source.value, s.provenance.path)


def _finding_key(f: DatasetFinding) -> tuple[str, ...]:
    return (f.study_instance_uid, f.series_instance_uid, f.kind, f.provenance.path, f.id)


def _skipped_key(s: Skipped) -> tuple[str, ...]:
    return (s.source.value, s.path, s.file, s.item, s.reason)


def write_import(root: str | Path, results: Sequence[ImportResult]) -> Dataset:
    """Add ``results`` to the dataset folder ``root`` (made if missing): the rows of earlier
    imports of the same inputs are replaced, every other row is kept. Returns the dataset."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise ConfigurationError(f"{root} is a file; give a folder for the dataset")
    old = read_dataset(root) if (root / INFO_NAME).is_file() else Dataset(root)
    replaced = {(r.source, r.path) for r in results}

    def kept(source: SourceType, path: str) -> bool:
        return (source, path) not in replaced

    studies = [s for s in old.studies if kept(s.provenance.source, s.provenance.path)]
    findings = [f for f in old.findings if kept(f.provenance.source, f.provenance.path)]
    skipped = [s for s in old.skipped if kept(s.source, s.path)]
    for result in results:
        studies.extend(result.studies)
        findings.extend(result.findings)
        skipped.extend(result.skipped)
    ids = [f.id for f in findings]
    if len(set(ids)) != len(ids):
        raise ConfigurationError("two rows of the dataset would have the same id")
    studies.sort(key=_study_key)
    findings.sort(key=_finding_key)
    skipped.sort(key=_skipped_key)
    root.mkdir(parents=True, exist_ok=True)
    info = {"format": FORMAT_NAME, "version": FORMAT_VERSION}
    files = {
        INFO_NAME: json.dumps(info, sort_keys=True, indent=2) + "\n",
        STUDIES_NAME: _jsonl(s.to_json() for s in studies),
        FINDINGS_NAME: _jsonl(f.to_json() for f in findings),
        REPORT_NAME: _jsonl(s.to_json() for s in skipped),
    }
    for name, text in files.items():
        temporary = root / f".{name}.tmp"
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(root / name)
    return Dataset(root, tuple(studies), tuple(findings), tuple(skipped))
