"""The ranges of the CT phantom specification (shared/design/phantom-spec.md) as one value."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

__all__ = ["PhantomSpec"]


def _number(name: str, value: object, *, integer: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    if integer and not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _range(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    integer: bool = False,
) -> tuple[float, float]:
    """Check a (min, max) pair: numbers, min <= max, within [low, high] (or (low, high])."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise ValueError(f"{name} must be a (min, max) pair, got {value!r}")
    lo, hi = (_number(name, v, integer=integer) for v in value)
    if lo > hi:
        raise ValueError(f"{name} must be (min, max) with min <= max, got {value!r}")
    if low is not None and (lo <= low if low_open else lo < low):
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    if high is not None and hi > high:
        raise ValueError(f"{name} must be <= {high:g}, got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class PhantomSpec:
    """Every range of the phantom spec; the defaults are the spec's. Ranges are (min, max).

    Distances are mm, intensities HU. Changing a field gives a phantom outside the spec (useful
    for tests and experiments); the generator samples uniformly within each range.

    Raises:
        ValueError: a field is malformed or out of its possible domain; the message names it.
    """

    matrix_size: tuple[int, int] = (224, 288)
    pixel_spacing_mm: tuple[float, float] = (0.6, 1.0)
    slice_spacings_mm: tuple[float, ...] = (1.0, 1.25, 2.0, 2.5, 3.0, 5.0)
    slice_count: tuple[int, int] = (20, 60)
    air_hu: float = -1000.0
    body_semi_axis_fraction: tuple[float, float] = (0.30, 0.45)
    fat_hu: float = -100.0
    fat_thickness_mm: tuple[float, float] = (5.0, 20.0)
    soft_tissue_hu: tuple[float, float] = (30.0, 60.0)
    noise_sd_hu: tuple[float, float] = (8.0, 25.0)
    lesion_count: tuple[int, int] = (1, 3)
    lesion_long_axis_mm: tuple[float, float] = (8.0, 60.0)
    lesion_short_axis_ratio: tuple[float, float] = (0.4, 1.0)
    lesion_cc_extent_ratio: tuple[float, float] = (0.5, 1.0)
    lesion_contrast_hu: tuple[float, float] = (40.0, 120.0)
    lesion_edge_margin_mm: float = 5.0
    lesion_gap_mm: float = 3.0
    vessel_probability: float = 0.7
    vessel_diameter_mm: tuple[float, float] = (15.0, 45.0)
    vessel_hu: tuple[float, float] = (150.0, 300.0)

    def __post_init__(self) -> None:
        # (field, lowest allowed, highest allowed, lowest excluded, integers only)
        checks: tuple[tuple[str, float | None, float | None, bool, bool], ...] = (
            ("matrix_size", 8, None, False, True),
            ("pixel_spacing_mm", 0.0, None, True, False),
            ("slice_count", 1, None, False, True),
            ("body_semi_axis_fraction", 0.0, 0.5, True, False),
            ("fat_thickness_mm", 0.0, None, False, False),
            ("soft_tissue_hu", None, None, False, False),
            ("noise_sd_hu", 0.0, None, False, False),
            ("lesion_count", 0, None, False, True),
            ("lesion_long_axis_mm", 0.0, None, True, False),
            ("lesion_short_axis_ratio", 0.0, 1.0, True, False),
            ("lesion_cc_extent_ratio", 0.0, None, True, False),
            ("lesion_contrast_hu", 0.0, None, False, False),
            ("vessel_diameter_mm", 0.0, None, True, False),
            ("vessel_hu", None, None, False, False),
        )
        for name, low, high, low_open, integer in checks:
            lo, hi = _range(
                name, getattr(self, name), low=low, high=high, low_open=low_open, integer=integer
            )
            pair = (int(lo), int(hi)) if integer else (lo, hi)
            object.__setattr__(self, name, pair)
        spacings = self.slice_spacings_mm
        if not isinstance(spacings, tuple | list) or not spacings:
            raise ValueError(f"slice_spacings_mm must be a non-empty sequence, got {spacings!r}")
        values = tuple(_number("slice_spacings_mm", v, integer=False) for v in spacings)
        if min(values) <= 0:
            raise ValueError(f"slice_spacings_mm must all be > 0, got {spacings!r}")
        object.__setattr__(self, "slice_spacings_mm", values)
        for name in ("air_hu", "fat_hu"):
            object.__setattr__(self, name, _number(name, getattr(self, name), integer=False))
        for name in ("lesion_edge_margin_mm", "lesion_gap_mm"):
            if _number(name, getattr(self, name), integer=False) < 0:
                raise ValueError(f"{name} must be >= 0 mm, got {getattr(self, name)!r}")
            object.__setattr__(self, name, float(getattr(self, name)))
        probability = _number("vessel_probability", self.vessel_probability, integer=False)
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"vessel_probability must be in [0, 1], got {probability!r}")
        object.__setattr__(self, "vessel_probability", probability)

    @classmethod
    def small(cls) -> PhantomSpec:
        """A quick variant for tests and quick benchmarks: 128 x 128 pixels, 20-24 slices at
        1-3 mm (every other slice is still <= 7.5 mm apart), lesions 8-25 mm, vessels 10-20 mm,
        fat 5-10 mm; everything else as the spec."""
        return cls(
            matrix_size=(128, 128),
            slice_spacings_mm=(1.0, 1.25, 2.0, 2.5, 3.0),
            slice_count=(20, 24),
            lesion_long_axis_mm=(8.0, 25.0),
            vessel_diameter_mm=(10.0, 20.0),
            fat_thickness_mm=(5.0, 10.0),
        )

    def to_json(self) -> dict[str, object]:
        """The spec as a JSON-ready dict (tuples become lists)."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out
