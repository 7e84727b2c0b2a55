"""Slice selection on a channel-first ``(C, S, R, C)`` image, MONAI style.

MONAI's crops keep a contiguous block (``SpatialCrop`` refuses slice steps), so selecting every
n-th slice or a given list needs this small transform: :func:`select_slices` on one image and
:class:`SelectSlicesd` on a dictionary. When the image is a ``MetaTensor`` its affine is updated
so that index -> world stays exact; this is why the kept slices must be evenly spaced.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
import torch
from monai.config.type_definitions import KeysCollection
from monai.data.meta_tensor import MetaTensor
from monai.transforms.transform import MapTransform
from monai.utils.enums import MetaKeys

__all__ = ["SelectSlicesd", "resolve_slice_indices", "select_slices"]


def resolve_slice_indices(
    n_slices: int, slices: Sequence[int] | None = None, stride: int = 1
) -> tuple[int, ...]:
    """Turn a selection into non-negative indices of a slice axis of length ``n_slices``.

    ``slices`` (negatives count from the end) wins when given; otherwise every ``stride``-th
    slice from 0. The result is evenly spaced (a constant step, possibly negative).

    Raises:
        ValueError: an index out of range, a repeated index, uneven spacing or stride < 1.
    """
    if n_slices < 1:
        raise ValueError(f"cannot select slices from an axis of length {n_slices}")
    if slices is None:
        if stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        return tuple(range(0, n_slices, stride))
    if len(slices) == 0:
        raise ValueError("slices must name at least one slice")
    resolved: list[int] = []
    for index in slices:
        if not -n_slices <= index < n_slices:
            raise ValueError(
                f"slice index {index} is out of range for {n_slices} prepared slices "
                f"(valid: {-n_slices} to {n_slices - 1})"
            )
        resolved.append(index % n_slices)
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"slices {tuple(slices)} name the same slice twice ({tuple(resolved)})")
    steps = {b - a for a, b in itertools.pairwise(resolved)}
    if len(steps) > 1:
        raise ValueError(
            f"slices {tuple(slices)} resolve to unevenly spaced indices {tuple(resolved)}; "
            "the prepared volume needs one affine, so pick a constant step"
        )
    return tuple(resolved)


def select_slices(image: torch.Tensor, indices: Sequence[int]) -> torch.Tensor:
    """Keep slices ``indices`` (axis 1) of a channel-first ``(C, S, R, C)`` image, in that order.

    ``indices`` must come from :func:`resolve_slice_indices` (in range, evenly spaced). The
    result is a new tensor; for a ``MetaTensor`` its affine becomes ``affine @ M`` where ``M``
    maps a new slice index ``k`` to the old ``indices[0] + k * step``.
    """
    if image.ndim != 4:
        raise ValueError(f"image must be (C, S, R, C), got shape {tuple(image.shape)}")
    if not indices:
        raise ValueError("indices must name at least one slice")
    index = torch.as_tensor(list(indices), dtype=torch.long, device=image.device)
    if not isinstance(image, MetaTensor):
        return image[:, index]  # (C, S', R, C); advanced indexing copies
    step = indices[1] - indices[0] if len(indices) > 1 else 1
    if any(b - a != step for a, b in itertools.pairwise(indices)):
        raise ValueError(f"indices must be evenly spaced to keep one affine, got {tuple(indices)}")
    kept_to_old = np.eye(4)
    kept_to_old[0, 0] = step
    kept_to_old[0, 3] = indices[0]
    affine = image.affine.detach().cpu().numpy().astype(np.float64) @ kept_to_old
    data = image.as_tensor()[:, index]  # (C, S', R, C)
    meta = dict(image.meta)
    meta[MetaKeys.AFFINE] = torch.as_tensor(affine, dtype=torch.float64)
    meta[MetaKeys.SPATIAL_SHAPE] = np.asarray(data.shape[1:])
    return MetaTensor(data, meta=meta, applied_operations=list(image.applied_operations))


class SelectSlicesd(MapTransform):
    """Dictionary wrapper of :func:`select_slices`: keep some slices of each image in ``keys``.

    Args:
        keys: keys of channel-first ``(C, S, R, C)`` images.
        slices: indices into axis 1 (negatives count from the end), evenly spaced; ``None`` for
            every ``stride``-th slice from 0 (all slices with the default stride).
        stride: step between kept slices when ``slices`` is ``None``.
        allow_missing_keys: skip missing keys instead of raising ``KeyError``.

    Not invertible: the dropped slices are gone.
    """

    def __init__(
        self,
        keys: KeysCollection,
        slices: Sequence[int] | None = None,
        stride: int = 1,
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        if stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        self.slices = None if slices is None else tuple(slices)
        self.stride = stride

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        for key in self.key_iterator(d):
            image = d[key]
            if image.ndim != 4:
                raise ValueError(
                    f"{type(self).__name__}: {key!r} must be (C, S, R, C), "
                    f"got shape {tuple(image.shape)}"
                )
            indices = resolve_slice_indices(int(image.shape[1]), self.slices, self.stride)
            d[key] = select_slices(image, indices)
        return d
