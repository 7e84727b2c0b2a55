"""xVal baseline (Golkar et al., 2023): a [NUM] embedding scaled by the value, and a number head.

The same harness as RNED (``NumericHead``), so the two compare on one backbone, data and parser.

- Normalisation: ``u = 2 (v - lo) / (hi - lo) - 1``, so ``[lo, hi]`` maps onto ``[-1, 1]``
  (xVal scales numbers into a fixed symmetric range).
- Input: ``embed(v) = u(v) * e_num`` with ``e_num`` a learned (D,) parameter. The norm of a [NUM]
  embedding is ``|u| |e_num|``: values near the middle of the range give near-zero embeddings and
  the sign carries which half the value is in. That is xVal's own design, and the norm change it
  implies is what RNED is compared against (paper, C3); this baseline keeps it on purpose.
- Output: a two-layer MLP on the final normed hidden state predicts ``u``; the loss is the MSE in
  ``u`` units at [NUM] targets; ``decode`` denormalises the prediction.
- Out of range: ``decode`` returns the raw denormalised prediction, never clamped, because a
  regression head that lands outside ``[lo, hi]`` has not measured anything in the calibrated
  range and a clamp would hide that. Callers flag such values with :meth:`XValHead.in_range` (e.g.
  as "not measurable"). ``embed`` accepts out-of-range values and extrapolates linearly (it is
  the same affine map); non-finite values are rejected everywhere.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["XValHead"]

_FEW = 8  # up to this many CPU values are checked in Python


class XValHead(nn.Module):
    """The xVal numeric head: implements ``NumericHead`` with ``name == "xval"``.

    Parameters are kept in float32 whatever the backbone's dtype; ``embed`` returns float32 (the
    caller casts to the embedding dtype) and ``loss`` / ``decode`` upcast ``hidden`` themselves.
    """

    name: str = "xval"

    def __init__(
        self,
        dim: int,
        *,
        lo: float = 0.0,
        hi: float = 3000.0,
        hidden_dim: int | None = None,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"need finite lo < hi, got lo={lo}, hi={hi}")
        if init_std <= 0:
            raise ValueError(f"init_std must be positive, got {init_std}")
        width = dim if hidden_dim is None else hidden_dim
        if width <= 0:
            raise ValueError(f"hidden_dim must be positive, got {hidden_dim}")
        self.dim = dim
        self.lo = float(lo)
        self.hi = float(hi)
        self.num_embedding = nn.Parameter(torch.randn(dim) * init_std)  # (D,) e_num
        self.number_head = nn.Sequential(nn.Linear(dim, width), nn.GELU(), nn.Linear(width, 1))

    # --- the affine map between values and xVal units -------------------------------------------

    def normalise(self, values: torch.Tensor) -> torch.Tensor:
        """(N,) values -> (N,) float64 ``u`` in [-1, 1] for values in [lo, hi]."""
        v = _check_values(values)
        return 2.0 * (v - self.lo) / (self.hi - self.lo) - 1.0

    def denormalise(self, u: torch.Tensor) -> torch.Tensor:
        """(N,) ``u`` -> (N,) float64 values (no clamp)."""
        half = 0.5 * (self.hi - self.lo)
        return u.double() * half + (self.lo + half)

    def in_range(self, values: torch.Tensor) -> torch.Tensor:
        """(N,) values -> (N,) bool: inside the calibrated range [lo, hi]."""
        return (values >= self.lo) & (values <= self.hi)

    # --- NumericHead ---------------------------------------------------------------------------

    def embed(self, values: torch.Tensor) -> torch.Tensor:
        """(N,) values -> (N, D) float32 input embeddings ``u(v) * e_num``."""
        u = self.normalise(values).to(self.num_embedding.dtype)  # (N,)
        return u[:, None] * self.num_embedding[None, :]  # (N, D)

    def predict(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states -> (N,) predicted ``u`` in the head's dtype (float32)."""
        if hidden.ndim != 2 or hidden.shape[1] != self.dim:
            raise ValueError(f"hidden must be (N, {self.dim}), got {tuple(hidden.shape)}")
        dtype = self.num_embedding.dtype
        out: torch.Tensor = self.number_head(hidden if hidden.dtype == dtype else hidden.to(dtype))
        return out.squeeze(-1)  # (N,)

    def loss(self, hidden: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states at [NUM] targets, (N,) true values -> scalar MSE in ``u`` units."""
        pred = self.predict(hidden)  # (N,)
        if values.shape != pred.shape:
            raise ValueError(
                f"values must be {tuple(pred.shape)} to match hidden, got {tuple(values.shape)}"
            )
        return F.mse_loss(pred, self.normalise(values).to(pred.dtype))

    def decode(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states -> (N,) float64 values, raw (see :meth:`in_range`)."""
        return self.denormalise(self.predict(hidden).detach())

    def confidence(self, hidden: torch.Tensor, values: torch.Tensor) -> None:
        """None: a regressed scalar carries no measure of how sure the model is."""
        return None


def _check_values(values: torch.Tensor) -> torch.Tensor:
    """(N,) finite values -> (N,) float64, or ValueError."""
    if values.ndim != 1:
        raise ValueError(f"values must be 1-D (N,), got shape {tuple(values.shape)}")
    v = values.double()
    if v.shape[0] <= _FEW and v.is_cpu:  # e.g. generation's values: no tensor ops
        finite = all(math.isfinite(x) for x in v.tolist())
    else:
        finite = bool(torch.isfinite(v).all())
    if not finite:
        raise ValueError("values must be finite; drop NaN/inf before embedding them")
    return v
