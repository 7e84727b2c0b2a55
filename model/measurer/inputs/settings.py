"""How a checkpoint's model inputs are made: the settings its ``radcaliper.json`` stores.

:class:`MeasureInputs` (the measure crops, ``model.measurer.inputs.data``), :class:`FindInputs` (the
find images, ``model.measurer.inputs.find``), :class:`FindVoting` (the shifted find passes,
``model.measurer.inputs.voting``), and the rules they check their values with. Pure Python: reading
a checkpoint's settings (``model.measurer.checkpoint.settings.read_settings``: its name, version and
identity, e.g. for a batch whose studies are all stored already) imports neither torch nor
transformers. The modules that make the inputs re-export these names.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ingestion.prepare import PrepareConfig

__all__ = [
    "MERGE",
    "PATCH",
    "SIDE_MULTIPLE",
    "FindInputs",
    "FindVoting",
    "MeasureInputs",
    "hu_window",
]

PATCH = 14
"""Side (pixels) of one vision patch."""
MERGE = 2
"""Patches merged per side into one language-model token."""
SIDE_MULTIPLE = PATCH * MERGE
"""Image heights and widths must be multiples of this (28)."""


def _finite(value: object) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def hu_window(name: str, value: object) -> tuple[float, float]:
    """``value`` as a (level, width) HU window of floats; ``ValueError`` naming ``name`` unless
    it is two finite numbers with width > 0 (every window setting is checked here)."""
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        raise ValueError(f"{name} must be (level, width) in HU, got {value!r}")
    if not (_finite(value[0]) and _finite(value[1])):
        raise ValueError(f"{name} must be two finite numbers (level, width), got {value!r}")
    level, width = float(value[0]), float(value[1])
    if width <= 0:
        raise ValueError(f"{name} width must be > 0 HU, got {value!r}")
    return (level, width)


@dataclass(frozen=True)
class MeasureInputs:
    """How a measure crop is made (stored with a checkpoint: inference must match training).

    Args:
        pixel_mm: mm per crop pixel, so that the numbers the model says are mm.
        size: crop side in pixels (multiple of 28); ``size * pixel_mm`` must hold the largest
            finding (60 mm lesions, 45 mm vessels in the phantom spec).
        window: (level, width) HU window of the crop's (first) intensity channel.
        second_window: None, or a second (level, width) HU window, given to the model as the
            third channel: ``(w, 1 - w, w2)`` (``images.two_window_channels``, the find
            image's encoding). One window cannot show every tissue: a solid lung nodule's
            partial-volume rim (-600..-100 HU) is black in a soft-tissue window, while a lung
            window flattens a hypodense liver lesion. Needs ``contrast``.
        frames: axial planes in the crop (1: the finding's slice only), ``slice_mm`` apart.
        slice_mm: distance between frames; None: the volume's own slice spacing.
        contrast: encode the window as ``(w, 1 - w, 0.5)`` (``images.contrast_channels``; for a
            vision tower trained from scratch) instead of grey.
        jitter_mm: training only: standard deviation of the random shift of the crop centre in
            each axial direction (the find step's centres are not exact).
        jitter_z_mm: training only: standard deviation of the shift along z (the find step's
            slice of a lesion's centre is not exact either).
    """

    pixel_mm: float = 0.75
    size: int = 112
    window: tuple[float, float] = (40.0, 400.0)
    frames: int = 1
    slice_mm: float | None = None
    contrast: bool = True
    jitter_mm: float = 4.0
    jitter_z_mm: float = 0.0
    second_window: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        windows = [("window", self.window)]
        if self.second_window is not None:
            windows.append(("second_window", self.second_window))
            if not self.contrast:
                raise ValueError(
                    "second_window needs contrast (the channels are (w, 1 - w, w2)); "
                    "set contrast to true or drop second_window"
                )
        for name, value in windows:
            object.__setattr__(self, name, hu_window(name, value))
        if not (math.isfinite(self.pixel_mm) and self.pixel_mm > 0):
            raise ValueError(f"pixel_mm must be > 0, got {self.pixel_mm}")
        if self.size % 28 or self.size < 28:
            raise ValueError(f"size must be a positive multiple of 28, got {self.size}")
        if self.frames < 1:
            raise ValueError(f"frames must be >= 1, got {self.frames}")
        for name in ("jitter_mm", "jitter_z_mm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be >= 0, got {value}")


@dataclass(frozen=True)
class FindInputs:
    """How find images are made (stored with a checkpoint: inference must match training).

    Args:
        pixel_mm: mm per image pixel.
        size: image side in pixels (a multiple of 28); ``size * pixel_mm`` should cover the field
            of view (the phantom spec's largest is 288 mm).
        soft_window: (level, width) HU of frame 0's first two channels.
        wide_window: (level, width) HU of frame 0's third channel.
        coordinates: add the coordinate frame (for vision towers trained from scratch); without
            it frame 1 repeats frame 0 (a still image, as the processor makes it).
        context_mm: > 0: the planes nearest this far below and above are frames 2 and 3 (3-D
            context, module doc); 0: a one-plane image.
    """

    pixel_mm: float = 1.75
    size: int = 168
    soft_window: tuple[float, float] = (40.0, 160.0)
    wide_window: tuple[float, float] = (100.0, 600.0)
    coordinates: bool = True
    context_mm: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.pixel_mm) and self.pixel_mm > 0):
            raise ValueError(f"pixel_mm must be > 0, got {self.pixel_mm}")
        if not (math.isfinite(self.context_mm) and self.context_mm >= 0):
            raise ValueError(f"context_mm must be finite mm >= 0, got {self.context_mm}")
        if self.size % 28 or self.size < 28:
            raise ValueError(f"size must be a positive multiple of 28, got {self.size}")
        for name in ("soft_window", "wide_window"):
            object.__setattr__(self, name, hu_window(name, getattr(self, name)))

    @property
    def windows(self) -> int:
        """Window channels of one plane as the find step carries it: 2 (soft, wide), or 6
        with its context planes."""
        return 6 if self.context_mm > 0 else 2

    def context_planes(self, spacing_mm: float) -> int:
        """How many prepared planes ``spacing_mm`` apart the context planes lie from the plane
        (the nearest to ``context_mm``, at least 1; 0 without context)."""
        if self.context_mm <= 0:
            return 0
        return max(1, round(self.context_mm / spacing_mm))

    def prepare_config(self) -> PrepareConfig:
        """The ``ingestion.prepare`` configuration of these inputs (native slice spacing)."""
        from ingestion.prepare import PrepareConfig

        return PrepareConfig(
            pixel_mm=self.pixel_mm,
            size=(self.size, self.size),
            windows=(self.soft_window, self.wide_window),
        )


@dataclass(frozen=True)
class FindVoting:
    """Which shifted find passes to run and how many must agree on a box.

    Args:
        shifts: (rows, columns) pixel shifts of the plane's content, one pass each; the
            first is usually ``(0, 0)``. Each must be smaller than a merged token
            (``SIDE_MULTIPLE`` pixels) in absolute value.
        votes: passes that must agree on a box for it to be kept, 1..len(shifts).
    """

    shifts: tuple[tuple[int, int], ...] = ((0, 0),)
    votes: int = 1
    keep_unaliased: bool = False

    def __post_init__(self) -> None:
        shifts = tuple((int(r), int(c)) for r, c in self.shifts)
        if not shifts:
            raise ValueError("FindVoting.shifts needs at least one (rows, columns) shift")
        for r, c in shifts:
            if abs(r) >= SIDE_MULTIPLE or abs(c) >= SIDE_MULTIPLE:
                raise ValueError(
                    f"find shift {(r, c)} must be smaller than a merged token "
                    f"({SIDE_MULTIPLE} pixels) in each direction"
                )
        if len(set(shifts)) != len(shifts):
            raise ValueError(f"find shifts must differ from each other, got {shifts}")
        if isinstance(self.votes, bool) or not 1 <= int(self.votes) <= len(shifts):
            raise ValueError(
                f"FindVoting.votes must be between 1 and the number of shifts ({len(shifts)}), "
                f"got {self.votes!r}"
            )
        object.__setattr__(self, "shifts", shifts)
        object.__setattr__(self, "votes", int(self.votes))

    @classmethod
    def half_token(cls, votes: int = 2) -> FindVoting:
        """Four passes: unshifted and shifted by half a token down, right, and both."""
        half = SIDE_MULTIPLE // 2
        return cls(((0, 0), (half, 0), (0, half), (half, half)), votes)

    @property
    def single(self) -> bool:
        """One unshifted pass: plain find."""
        return self.shifts == ((0, 0),)

    def to_json(self) -> dict[str, object]:
        return {
            "shifts": [list(s) for s in self.shifts],
            "votes": self.votes,
            "keep_unaliased": self.keep_unaliased,
        }

    @classmethod
    def from_json(cls, data: object) -> FindVoting:
        if not isinstance(data, dict) or "shifts" not in data:
            raise ValueError(
                f"find_voting must be {{'shifts': [[r, c], ...], 'votes': n}}, got {data!r}"
            )
        shifts = tuple((int(r), int(c)) for r, c in data["shifts"])
        return cls(
            shifts,
            int(data.get("votes", 1)),
            bool(data.get("keep_unaliased", False)),
        )
