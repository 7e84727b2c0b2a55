"""The interface every numeric mode implements, so the model and the evaluation harness can swap
RNED (paper score-matching decoder or correlation decoder) and xVal behind one API.

The standard-token baseline has no numeric head: numbers stay text and are parsed after
generation (``model.numeric.text``); a model in that mode simply has ``numeric_head = None``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

__all__ = ["NumericHead"]


@runtime_checkable
class NumericHead(Protocol):
    """Turns values into [NUM] input embeddings and [NUM] hidden states back into values.

    ``hidden`` is always the final *normed* hidden state (the lm_head input) at the position
    whose next token is [NUM], upcast by the caller as the head needs.
    """

    name: str  # "rned_rnd" | "rned_corr" | "xval"

    def embed(self, values: torch.Tensor) -> torch.Tensor:
        """(N,) values -> (N, D) input embeddings for [NUM] tokens."""
        ...

    def loss(self, hidden: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states at [NUM] targets, (N,) true values -> scalar numeric loss."""
        ...

    def decode(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states -> (N,) float64 values (on the head's grid where it has one)."""
        ...

    def confidence(self, hidden: torch.Tensor, values: torch.Tensor) -> torch.Tensor | None:
        """(N, D) hidden states, (N,) their decoded values -> (N,) float64 decode confidence
        in [-1, 1] (higher: surer), or None where the head has no such measure."""
        ...
