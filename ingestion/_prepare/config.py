"""What a prepared model input looks like: :class:`PrepareConfig` and the window presets.

This module imports neither torch nor MONAI, so a settings object can hold a config cheaply.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BONE_WINDOW",
    "LUNG_WINDOW",
    "SOFT_TISSUE_WINDOW",
    "PrepareConfig",
    "Window",
]

Window = tuple[float, float]
"""Intensity window (level, width): ``level - width/2`` maps to 0 and ``level + width/2`` to 1."""

SOFT_TISSUE_WINDOW: Window = (40.0, 400.0)
LUNG_WINDOW: Window = (-600.0, 1500.0)
BONE_WINDOW: Window = (400.0, 1800.0)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return number


def _positive(name: str, value: object) -> float:
    number = _number(name, value)
    if number <= 0:
        raise ValueError(f"{name} must be > 0 mm, got {value!r}")
    return number


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _window(name: str, value: object) -> Window:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        raise ValueError(f"{name} must be (level, width) in HU, got {value!r}")
    level = _number(f"{name} level", value[0])
    width = _number(f"{name} width", value[1])
    if width <= 0:
        raise ValueError(f"{name} width must be > 0, got {value!r}")
    return (level, width)


@dataclass(frozen=True)
class PrepareConfig:
    """How a :class:`~ingestion.volume.Volume` becomes model images (see :mod:`ingestion.prepare`).

    Args:
        pixel_mm: in-plane spacing (mm) of the prepared rows and columns, so that one pixel the
            model counts is ``pixel_mm`` millimetres.
        slice_mm: spacing (mm) of the prepared slices; ``None`` keeps the native spacing of the
            source axis that becomes the (axial) slice axis: the slice spacing for an axial
            series, the row spacing for a sagittal or coronal one.
        size: in-plane (rows, columns) of every prepared slice; the resampled slice is padded
            (with air, see :attr:`pad_value`) or cropped around its centre to this size.
        window: (level, width) in HU mapped to [0, 1] and clipped: one image channel.
        windows: several (level, width) windows, one channel each (e.g. soft tissue, lung,
            bone); when given it replaces ``window``, which must then keep its default.
        slices: indices into the *resampled* slice axis (after orientation and ``slice_mm``,
            before pad/crop; 0 is the most inferior slice, negatives count from the superior end)
            to keep, in the given order. They must be evenly spaced (one index, or a constant
            step) so that the prepared volume keeps a single affine. ``None`` keeps all slices
            (subject to ``slice_stride``).
        slice_stride: keep every ``slice_stride``-th resampled slice starting from the most
            inferior one (0, stride, 2*stride, ...); only with ``slices=None``.

    Raises:
        ValueError: naming the field, when a value is unusable.
    """

    pixel_mm: float = 1.0
    slice_mm: float | None = None
    size: tuple[int, int] = (256, 256)
    window: Window = SOFT_TISSUE_WINDOW
    windows: tuple[Window, ...] | None = None
    slices: Sequence[int] | None = None
    slice_stride: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "pixel_mm", _positive("pixel_mm", self.pixel_mm))
        if self.slice_mm is not None:
            object.__setattr__(self, "slice_mm", _positive("slice_mm", self.slice_mm))
        self._check_size()
        object.__setattr__(self, "window", _window("window", self.window))
        self._check_windows()
        self._check_slices()

    def _check_size(self) -> None:
        size = self.size
        if not isinstance(size, Sequence) or isinstance(size, str) or len(size) != 2:
            raise ValueError(f"size must be (rows, columns), got {size!r}")
        rows, columns = (_integer("size", n) for n in size)
        if rows < 1 or columns < 1:
            raise ValueError(f"size must be >= 1 pixel along rows and columns, got {size!r}")
        object.__setattr__(self, "size", (rows, columns))

    def _check_windows(self) -> None:
        if self.windows is None:
            return
        windows = self.windows
        if not isinstance(windows, Sequence) or isinstance(windows, str) or not windows:
            raise ValueError(
                f"windows must be a non-empty sequence of (level, width), got {windows!r}"
            )
        if self.window != SOFT_TISSUE_WINDOW:
            raise ValueError(
                f"windows replaces window: give one of them, not both (window={self.window!r})"
            )
        checked = tuple(_window(f"windows[{i}]", w) for i, w in enumerate(windows))
        object.__setattr__(self, "windows", checked)

    def _check_slices(self) -> None:
        stride = _integer("slice_stride", self.slice_stride)
        if stride < 1:
            raise ValueError(f"slice_stride must be >= 1, got {self.slice_stride!r}")
        object.__setattr__(self, "slice_stride", stride)
        if self.slices is None:
            return
        if stride != 1:
            raise ValueError("slices and slice_stride select slices two ways: give one of them")
        if not isinstance(self.slices, Sequence) or isinstance(self.slices, str) or not self.slices:
            raise ValueError(f"slices must be a non-empty sequence of indices, got {self.slices!r}")
        indices = tuple(_integer("slices", i) for i in self.slices)
        if len(set(indices)) != len(indices):
            raise ValueError(f"slices must not repeat an index, got {indices}")
        same_sign = all(i >= 0 for i in indices) or all(i < 0 for i in indices)
        if same_sign and len({b - a for a, b in itertools.pairwise(indices)}) > 1:
            raise ValueError(
                f"slices must be evenly spaced (a constant step) so that the prepared volume "
                f"keeps one affine, got {indices}; prepare each group of slices separately"
            )
        object.__setattr__(self, "slices", indices)

    @property
    def channel_windows(self) -> tuple[Window, ...]:
        """The (level, width) window of each output channel, in channel order."""
        return self.windows if self.windows is not None else (self.window,)

    @property
    def channels(self) -> int:
        """Number of image channels (one per window)."""
        return len(self.channel_windows)

    @property
    def pad_value(self) -> float:
        """Intensity (HU) given to voxels outside the source volume: the lowest window minimum,
        so that padding maps to 0 in every channel (air does too)."""
        return min(level - width / 2.0 for level, width in self.channel_windows)
