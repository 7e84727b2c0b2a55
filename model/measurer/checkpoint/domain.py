"""A checkpoint's validated domain: what it was trained and validated on, and whether a study
lies inside it (issue 23, "Honest refusal").

A :class:`Domain` is saved in the checkpoint's ``radcaliper.json`` under ``"domain"`` and listed
in its card (:meth:`Domain.card_markdown`). A checkpoint written before domains existed loads
with :meth:`Domain.legacy`: CT, pixels 0.4-1.5 mm, slices 0.5-7.5 mm apart, at least 3 slices
(the phantom spec's ranges with a margin), nothing recorded about field of view, contrast or
anatomy.

:func:`check` compares a study with a domain and answers a :class:`DomainCheck`:

- **refusals** (the study is not measured; each names the value, the model's range and what to
  do): an unknown modality; a modality outside the domain; a pixel spacing (row or column) or a
  slice spacing outside the domain's range; fewer slices than ``min_slices``; a contrast state
  the header *records* and the domain excludes (a study recorded as non-contrast for a
  contrast-only model, or recorded as contrast for a non-contrast-only one). These are what the
  model's inputs cannot stand for: another physics, another resolution, or another image
  content by the header's own statement.
- **flags** (the study is measured and every finding is flagged "outside the validated
  domain" with the reason): an in-plane field of view outside ``fov_mm`` (where recorded); a
  contrast state not recorded for a domain that requires one (most headers do not say:
  ``ingestion.contrast``); an anatomy that is unknown or not listed (where the domain lists
  anatomy). Each of these may or may not matter to the image the model sees, and none can be
  read reliably from every study, so refusing on them would refuse most real studies for want
  of a tag.

A field the domain does not record (``fov_mm`` None, ``anatomy`` empty, ``contrast`` "any") is
not checked.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingestion.contrast import Contrast
from ingestion.errors import ModelError
from ingestion.volume import Modality

if TYPE_CHECKING:
    from ingestion.volume import Volume

__all__ = [
    "DataSource",
    "Domain",
    "DomainCheck",
    "DomainContrast",
    "check",
]

Range = tuple[float, float]

_KEYS = (
    "modalities",
    "pixel_mm",
    "slice_mm",
    "min_slices",
    "fov_mm",
    "contrast",
    "anatomy",
    "sources",
)
_REQUIRED = ("modalities", "pixel_mm", "slice_mm")


class DomainContrast(enum.StrEnum):
    """The contrast state a model was validated on."""

    CONTRAST = "contrast"  # contrast-enhanced studies only
    NON_CONTRAST = "non-contrast"  # studies without a contrast agent only
    ANY = "any"  # both (or not recorded)


@dataclass(frozen=True)
class DataSource:
    """One source of the training or validation data.

    Args:
        name: what it is, e.g. the input folder or "radcaliper phantoms (seed 0)".
        licence: its licence or terms of use ("unknown" when not known).
        kind: its kind, e.g. "phantoms", "masks", "seg", "sr", "store", "folder".
    """

    name: str
    licence: str
    kind: str

    def __post_init__(self) -> None:
        for key in ("name", "licence", "kind"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"domain source {key} must be a non-empty string, got {value!r}")

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "licence": self.licence, "kind": self.kind}

    @classmethod
    def from_json(cls, data: object) -> DataSource:
        if not isinstance(data, Mapping):
            raise ValueError(f"domain.sources: each source must be an object, got {data!r}")
        unknown = sorted(set(data) - {"name", "licence", "kind"})
        if unknown:
            raise ValueError(f"domain.sources: unknown key {unknown[0]!r}")
        for key in ("name", "licence", "kind"):
            if key not in data:
                raise ValueError(f"domain.sources: a source has no {key!r}")
        return cls(data["name"], data["licence"], data["kind"])


def _range(key: str, value: object) -> Range:
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or len(value) != 2
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"domain.{key} must be two numbers (low, high) in mm, got {value!r}")
    low, high = float(value[0]), float(value[1])
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
        raise ValueError(f"domain.{key} must satisfy 0 < low <= high (mm), got {value!r}")
    return (low, high)


@dataclass(frozen=True)
class Domain:
    """What a checkpoint was trained and validated on (module doc).

    Args:
        modalities: the modalities it measures (at least one).
        pixel_mm: (low, high) in-plane pixel spacing, mm (row and column spacing each).
        slice_mm: (low, high) distance between slices, mm.
        min_slices: the fewest slices a study must have.
        fov_mm: (low, high) in-plane field of view, mm (the larger of rows x row spacing and
            columns x column spacing); None: not recorded.
        contrast: the contrast state it was validated on.
        anatomy: the body regions it was validated on, lower case ("chest", "abdomen",
            "phantom"); empty: not recorded.
        sources: every source of its training and validation data, with its licence.

    Raises:
        ValueError: a field is malformed; the message names it as ``domain.<key>``.
    """

    modalities: tuple[Modality, ...]
    pixel_mm: Range
    slice_mm: Range
    min_slices: int = 3
    fov_mm: Range | None = None
    contrast: DomainContrast = DomainContrast.ANY
    anatomy: tuple[str, ...] = ()
    sources: tuple[DataSource, ...] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.modalities, str) or not isinstance(self.modalities, Iterable):
            raise ValueError(
                f"domain.modalities must be a list such as ['CT'], got {self.modalities!r}"
            )
        modalities = []
        for value in self.modalities:
            try:
                modalities.append(Modality(value))
            except ValueError:
                names = ", ".join(m.value for m in Modality)
                raise ValueError(
                    f"domain.modalities: {value!r} is not a modality ({names})"
                ) from None
        if not modalities:
            raise ValueError("domain.modalities must name at least one modality, e.g. ['CT']")
        object.__setattr__(self, "modalities", tuple(dict.fromkeys(modalities)))
        object.__setattr__(self, "pixel_mm", _range("pixel_mm", self.pixel_mm))
        object.__setattr__(self, "slice_mm", _range("slice_mm", self.slice_mm))
        if self.fov_mm is not None:
            object.__setattr__(self, "fov_mm", _range("fov_mm", self.fov_mm))
        if (
            isinstance(self.min_slices, bool)
            or not isinstance(self.min_slices, int)
            or (self.min_slices < 1)
        ):
            raise ValueError(f"domain.min_slices must be an integer >= 1, got {self.min_slices!r}")
        try:
            object.__setattr__(self, "contrast", DomainContrast(self.contrast))
        except ValueError:
            choices = ", ".join(c.value for c in DomainContrast)
            raise ValueError(
                f"domain.contrast must be one of {choices}, got {self.contrast!r}"
            ) from None
        if isinstance(self.anatomy, str) or not all(
            isinstance(a, str) and a.strip() for a in self.anatomy
        ):
            raise ValueError(
                f"domain.anatomy must be a list of names such as ['chest'], got {self.anatomy!r}"
            )
        anatomy = tuple(dict.fromkeys(a.strip().lower() for a in self.anatomy))
        object.__setattr__(self, "anatomy", anatomy)
        sources = tuple(self.sources)
        if not all(isinstance(s, DataSource) for s in sources):
            raise ValueError("domain.sources must be DataSource objects")
        object.__setattr__(self, "sources", sources)

    @classmethod
    def legacy(cls) -> Domain:
        """The domain of a checkpoint whose ``radcaliper.json`` records none: what radcaliper
        accepted before domains were recorded (CT; pixels 0.4-1.5 mm; slices 0.5-7.5 mm; at
        least 3 slices; field of view, contrast, anatomy and sources not recorded)."""
        return cls((Modality.CT,), (0.4, 1.5), (0.5, 7.5), min_slices=3)

    def to_json(self) -> dict[str, Any]:
        return {
            "modalities": [m.value for m in self.modalities],
            "pixel_mm": list(self.pixel_mm),
            "slice_mm": list(self.slice_mm),
            "min_slices": self.min_slices,
            "fov_mm": None if self.fov_mm is None else list(self.fov_mm),
            "contrast": self.contrast.value,
            "anatomy": list(self.anatomy),
            "sources": [s.to_json() for s in self.sources],
        }

    @classmethod
    def from_json(cls, data: object) -> Domain:
        """The domain ``to_json`` wrote. Raises ``ValueError`` naming the bad key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"domain must be an object, got {data!r}")
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise ValueError(
                f"domain has an unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})"
            )
        for key in _REQUIRED:
            if key not in data:
                raise ValueError(f"domain.{key} is missing")
        for key in ("modalities", "anatomy", "sources"):
            if key in data and not isinstance(data[key], list):
                raise ValueError(f"domain.{key} must be a list, got {data[key]!r}")
        return cls(
            modalities=tuple(data["modalities"]),
            pixel_mm=data["pixel_mm"],
            slice_mm=data["slice_mm"],
            min_slices=data.get("min_slices", 3),
            fov_mm=data.get("fov_mm"),
            contrast=data.get("contrast", DomainContrast.ANY.value),
            anatomy=tuple(data.get("anatomy", ())),
            sources=tuple(DataSource.from_json(s) for s in data.get("sources", ())),
        )

    def card_markdown(self) -> str:
        """The model card's "Validated domain" section (markdown, every field and source)."""
        not_recorded = "not recorded (not checked)"
        lines = [
            "## Validated domain",
            "",
            "Studies outside these are refused with the reason (modality, spacing, slices, a "
            "recorded contrast state the model was not validated on) or measured with every "
            'finding flagged "outside the validated domain" (field of view, unrecorded '
            "contrast, anatomy).",
            "",
            f"- Modalities: {', '.join(m.value for m in self.modalities)}",
            f"- Pixel spacing: {_span(self.pixel_mm)} mm",
            f"- Slice spacing: {_span(self.slice_mm)} mm",
            f"- Slices: at least {self.min_slices}",
            "- In-plane field of view: "
            + (not_recorded if self.fov_mm is None else f"{_span(self.fov_mm)} mm"),
            f"- Contrast: {self.contrast.value}",
            "- Anatomy: " + (", ".join(self.anatomy) if self.anatomy else not_recorded),
            "",
            "### Data sources",
            "",
        ]
        if not self.sources:
            lines.append("Not recorded (a checkpoint written before its domain was recorded).")
        else:
            lines += ["| source | kind | licence |", "|---|---|---|"]
            lines += [
                f"| {_cell(s.name)} | {_cell(s.kind)} | {_cell(s.licence)} |" for s in self.sources
            ]
        return "\n".join(lines) + "\n"


def _span(values: Range) -> str:
    return f"{values[0]:g}-{values[1]:g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


@dataclass(frozen=True)
class DomainCheck:
    """What :func:`check` found: reasons to refuse the study, and reasons to flag its
    findings "outside the validated domain" (module doc)."""

    refusals: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def raise_if_refused(self) -> None:
        """``ModelError`` with every refusal's reason, if there is one."""
        if self.refusals:
            raise ModelError("; ".join(self.refusals))


_ARTICLE = {Modality.CT: "a CT in Hounsfield units", Modality.MR: "an MR"}


def check(
    domain: Domain,
    volume: Volume,
    contrast: Contrast,
    *,
    anatomy: str | None = None,
    model: str = "the model",
) -> DomainCheck:
    """Whether ``volume`` lies in ``domain`` (module doc: what refuses and what flags).

    Args:
        domain: the checkpoint's validated domain.
        volume: the study.
        contrast: what its header records (``ingestion.contrast.contrast_of``).
        anatomy: its body region where known (e.g. DICOM BodyPartExamined), else None.
        model: the model's name and version, for the messages.
    """
    refusals: list[str] = []
    flags: list[str] = []
    trained = " and ".join(m.value for m in domain.modalities)
    if volume.modality is None:
        hints = " or ".join(
            f"RADCALIPER_NIFTI_MODALITY={m.value} if it is {_ARTICLE[m]}" for m in domain.modalities
        )
        refusals.append(
            f"the volume's modality is unknown (NIfTI and NRRD record none); set {hints}"
        )
    elif volume.modality not in domain.modalities:
        refusals.append(
            f"{model} is trained on {trained} only and cannot measure {volume.modality.value} "
            f"studies; use a model validated for {volume.modality.value}"
        )
    slice_mm, row_mm, column_mm = volume.geometry.spacing
    low, high = domain.pixel_mm
    if not (low <= min(row_mm, column_mm) and max(row_mm, column_mm) <= high):
        pixel = f"{row_mm:g}" if row_mm == column_mm else f"{row_mm:g} x {column_mm:g}"
        refusals.append(
            f"pixel spacing {pixel} mm is outside what {model} was trained for "
            f"({_span(domain.pixel_mm)} mm); not measured: use a reconstruction with pixels in "
            "that range or a model validated for this one"
        )
    if not domain.slice_mm[0] <= slice_mm <= domain.slice_mm[1]:
        refusals.append(
            f"slice spacing {slice_mm:g} mm is outside what {model} was trained for "
            f"({_span(domain.slice_mm)} mm); not measured: use a reconstruction with slices in "
            "that range or a model validated for this one"
        )
    slices = volume.shape[0]
    if slices < domain.min_slices:
        refusals.append(
            f"{slices} slice(s): {model} needs at least {domain.min_slices} axial slices to "
            "find lesions; load the whole series"
        )
    _check_contrast(domain, contrast, model, refusals, flags)
    if domain.fov_mm is not None:
        _, rows, columns = volume.shape
        fov = max(rows * row_mm, columns * column_mm)
        if not domain.fov_mm[0] <= fov <= domain.fov_mm[1]:
            flags.append(
                f"outside the validated domain: field of view {fov:.0f} mm, {model} was "
                f"validated on {_span(domain.fov_mm)} mm"
            )
    if domain.anatomy:
        listed = ", ".join(domain.anatomy)
        if anatomy is None or not anatomy.strip():
            flags.append(
                f"outside the validated domain: the study's anatomy is not known; {model} was "
                f"validated on {listed}"
            )
        elif anatomy.strip().lower() not in domain.anatomy:
            flags.append(
                f"outside the validated domain: anatomy {anatomy.strip().lower()}, {model} was "
                f"validated on {listed}"
            )
    return DomainCheck(tuple(refusals), tuple(flags))


def _check_contrast(
    domain: Domain, contrast: Contrast, model: str, refusals: list[str], flags: list[str]
) -> None:
    contrast = Contrast(contrast)
    wanted = domain.contrast
    if wanted is DomainContrast.ANY:
        return
    if contrast is Contrast.UNKNOWN:
        flags.append(
            f"outside the validated domain: the header does not record whether a contrast agent "
            f"was given; {model} was validated on {wanted.value} studies only"
        )
        return
    if contrast.value != wanted.value:
        refusals.append(
            f"the header records a {contrast.value} study; {model} is validated on "
            f"{wanted.value} studies only; not measured: use a {wanted.value} series or a model "
            f"validated for {contrast.value} studies"
        )
