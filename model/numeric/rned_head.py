"""``RnedHead``: the RNED numeric head behind the ``NumericHead`` protocol.

``embed`` is the codec's rotary encoding, ``decode`` one of its two decoders and ``loss`` one of
the numeric losses of ``model.numeric.losses``. The default loss follows the decoder: the paper's
score-MSE for ``method="rnd"`` (RND reads only ``S(h, p)``, and only score-MSE pins the norm of
``h`` along the score direction), the candidate softmax loss for ``method="corr"`` (it trains the
margin the correlation decoder reads; see the experiments in ``losses.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeAlias

import torch
from torch import nn

from model.numeric.codec import DecodeMethod, RotaryNumberCodec
from model.numeric.losses import candidate_softmax_loss, rotation_cosine_loss, score_mse_loss

__all__ = ["LossName", "RnedHead"]

LossName: TypeAlias = Literal["cosine", "softmax", "score_mse"]

_DEFAULT_LOSS: dict[str, LossName] = {"rnd": "score_mse", "corr": "softmax"}
_LOSS_OPTIONS: dict[str, frozenset[str]] = {
    "cosine": frozenset(),
    "softmax": frozenset({"kappa", "sigma", "window", "negatives", "generator"}),
    "score_mse": frozenset({"normalize"}),
}


class RnedHead(nn.Module):
    """Rotary number encoding with RND or correlation decoding.

    Args:
        codec: the ``RotaryNumberCodec`` (a submodule: ``.to()`` and ``state_dict`` include it).
        method: ``"corr"`` (correlation / maximum-likelihood decoder, name ``"rned_corr"``) or
            ``"rnd"`` (the paper's score matching, name ``"rned_rnd"``).
        loss: ``"cosine"``, ``"softmax"`` or ``"score_mse"``; default by method (module doc).
        loss_options: keyword arguments of the loss function (e.g. ``{"kappa": 64.0}`` for
            ``"softmax"``, ``{"normalize": False}`` for ``"score_mse"``).
    """

    def __init__(
        self,
        codec: RotaryNumberCodec,
        method: DecodeMethod = "corr",
        loss: LossName | None = None,
        loss_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(codec, RotaryNumberCodec):
            raise ValueError(f"codec must be a RotaryNumberCodec, got {type(codec).__name__}")
        if method not in _DEFAULT_LOSS:
            raise ValueError(f"method must be 'rnd' or 'corr', got {method!r}")
        chosen: LossName = _DEFAULT_LOSS[method] if loss is None else loss
        if chosen not in _LOSS_OPTIONS:
            raise ValueError(f"loss must be one of {sorted(_LOSS_OPTIONS)}, got {loss!r}")
        options = dict(loss_options or {})
        unknown = set(options) - _LOSS_OPTIONS[chosen]
        if unknown:
            raise ValueError(
                f"loss_options {sorted(unknown)} do not apply to loss {chosen!r}; "
                f"it takes {sorted(_LOSS_OPTIONS[chosen]) or 'none'}"
            )
        self.codec = codec
        self.method: DecodeMethod = method
        self.loss_name: LossName = chosen
        self.loss_options = options
        self.name = f"rned_{method}"

    def embed(self, values: torch.Tensor) -> torch.Tensor:
        """(N,) values in the codec's range -> (N, D) [NUM] input embeddings."""
        return self.codec.encode(values)

    def loss(self, hidden: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states at [NUM] targets, (N,) true values -> scalar numeric loss."""
        if self.loss_name == "cosine":
            return rotation_cosine_loss(self.codec, hidden, values)
        if self.loss_name == "softmax":
            return candidate_softmax_loss(self.codec, hidden, values, **self.loss_options)
        return score_mse_loss(self.codec, hidden, values, **self.loss_options)

    def decode(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states -> (N,) float64 values on the codec's grid."""
        return self.codec.decode(hidden, self.method)

    def confidence(self, hidden: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """(N,) float64 peak correlation of each hidden state with its value's codeword
        (``RotaryNumberCodec.confidence``); the same measure for either decoder."""
        return self.codec.confidence(hidden, values)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, loss={self.loss_name!r}, loss_options={self.loss_options}"
