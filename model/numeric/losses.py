"""Numeric losses for RNED heads at [NUM] targets, and the linear lambda ramp.

All losses take the codec, hidden states ``(N, D)`` at positions whose next token is [NUM] (the
final normed hidden state, any float dtype) and the true values ``(N,)``, and return a scalar
that the trainer adds to the cross-entropy as ``L = L_CE + lambda(step) * L_num``. They are
computed in float64 (the tensors are small: N x D plus a few hundred candidates x D) and returned
in float32, or float64 for float64 input. An empty batch gives a zero that still has a graph.

``score_mse_loss``
    The paper's ``(S(h, p) - S(m, p))^2``. Its gradient is ``2 (S(h) - S(m)) u`` with the fixed
    vector ``u = omega^-p x_base``: it trains one direction of ``h`` and nothing else, which is
    all the RND decoder reads, and leaves the rest of ``h`` (what the correlation decoder reads)
    untouched. ``S`` spans only ``score_range`` (~2.4 at d = 2048, p = 0.3, scale 0.02) and
    candidates are ~1e-5 of that apart, so by default the difference is divided by
    ``codec.score_range`` (loss 1 = an error of the whole range); ``normalize=False`` is the
    paper's form as is.
``rotation_cosine_loss``
    ``1 - cos(h, R(m Omega) x_base)``: the whole direction of ``h``; scale-invariant, so it does
    not fight the final RMSNorm, and zero exactly at the target direction.
``candidate_softmax_loss``
    Cross-entropy of ``softmax(kappa cos(h, R(m' Omega) x_base))`` over candidates ``m'``
    against Gaussian labels ``exp(-(m' - m)^2 / 2 sigma^2)``: a window of full-step candidates
    within ``window`` of the truth plus ``negatives`` grid values drawn at random (shared by the
    batch). Memory is bounded by using ``<h, R(m') x> = <R(-m Omega) h, R((m' - m) Omega) x>``: the
    window costs one table of ``2W + 1`` rotated base vectors, not one per row.

Default of ``RnedHead``: softmax for ``corr``, score-MSE for ``rnd``
--------------------------------------------------------------------
Reproduce with ``python benchmarks/bench_codec.py --loss-experiment`` (d = 2048, Adam lr 1e-3,
targets on the grid in [0, 300]; "exact" = decoded value equals the target).

(a) 64 free vectors ``h`` from N(0, 0.02^2 I) (``|h| ~ |x_base|``), 300 steps:

==============================  ================  ============  ===================  =======
loss                            corr 100 % exact  corr @ 50     RND exact / MAE      |h|/|x|
==============================  ================  ============  ===================  =======
score-MSE (either form) [*]_    never (0 %)       0 %           92 % / 0.07          1.55
cosine                          step 80           70 %          0 % / 132            1.11
softmax kappa=64 sigma=0.5      step 50           100 %         0 % / 2607           0.81
softmax kappa=16 sigma=0.5      step 70           98 %          0 % / 2607           0.67
softmax kappa=256 sigma=0.5     step 60           98 %          0 % / 2607           1.13
softmax kappa=64 sigma=2        never (98 %)      41 %          0 % / 2607           1.03
cosine + score-MSE              step 190          0 %           0 % / 6.0            1.32
==============================  ================  ============  ===================  =======

.. [*] identical: Adam is invariant to the scale of the loss.

(b) capacity-limited: ``h = phi(m) W`` with ``phi`` = cos/sin of 256 random frequencies, so
``W`` cannot reproduce ``R(m Omega) x_base`` and the loss decides which error is left; 4000
steps of batch 64 on 1024 values, MAE (exact) of the correlation decoder:

==============================  ==============  ===============  ========================
loss                            train           held-out         RND held-out
==============================  ==============  ===============  ========================
score-MSE                       149 (0 %)       153 (0 %)        52.9 (0 %)
cosine                          0.12 (27 %)     0.14 (27 %)      153 (0 %)
softmax kappa=64 sigma=0.5      0.05 (58 %)     0.05 (57 %)      2586 (0 %)
softmax kappa=64 sigma=0.2      0.02 (77 %)     0.02 (82 %)      2586 (0 %)
==============================  ==============  ===============  ========================

Reading: score-MSE never makes the correlation decoder usable (it moves ``h`` along ``u``
only), and even for RND it reached only 53 mm on held-out values in (b). With free vectors the
cosine and softmax losses both get there; with limited capacity the cosine loss plateaus (it
spends the capacity on every component of the direction, most of which do not matter for the
argmax) while the softmax keeps improving, on held-out values too: it trains exactly what the
decoder reads, the margin of the truth over its neighbours and over far aliases (the random
negatives). It needs ``sigma`` (label width: smaller is sharper and was better with exact
labels; 0.5 mm is kept as a prior on annotation precision) and ``kappa`` (16-256 all worked at
sigma 0.5; 256 with sigma 2 was worst). Neither whole-vector loss constrains ``|h|``, and RND
is not scale-invariant (1 % gain error = 44-65 mm MAE, rned-notes.md; after training with them
RND is useless here, MAE 132-2607), so a head decoding with RND trains with the paper's
score-MSE. Norms drift mildly under Adam with the scale-invariant losses (0.7-1.3x); the
model's final RMSNorm sets the norm of real hidden states anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.numeric.codec import RotaryNumberCodec, Values, rotate_blocks

__all__ = [
    "LambdaRamp",
    "candidate_softmax_loss",
    "rotation_cosine_loss",
    "score_mse_loss",
]

_MASKED = -1e30  # logit of a masked candidate: finite, so 0 * log-probability stays 0


def score_mse_loss(
    codec: RotaryNumberCodec,
    hidden: torch.Tensor,
    values: Values,
    *,
    normalize: bool = True,
) -> torch.Tensor:
    """Mean over targets of ``((S(h, p) - S(m, p)) / score_range)^2``; the paper's form when
    ``normalize=False``. hidden (N, D), values (N,) -> scalar."""
    h, m = _inputs(codec, hidden, values)  # (N, D) float64, (N,) float64
    if h.shape[0] == 0:
        return _zero(hidden)
    diff = h @ codec.score_vector - codec.target_score(m)  # (N,)
    if normalize:
        diff = diff / codec.score_range
    return diff.square().mean().to(_out_dtype(hidden))


def rotation_cosine_loss(
    codec: RotaryNumberCodec, hidden: torch.Tensor, values: Values
) -> torch.Tensor:
    """Mean of ``1 - cos(h, R(m Omega) x_base)``. hidden (N, D), values (N,) -> scalar in [0, 2]."""
    h, m = _inputs(codec, hidden, values)  # (N, D), (N,)
    if h.shape[0] == 0:
        return _zero(hidden)
    target = _rotated_base(codec, m)  # (N, D)
    cos = torch.nn.functional.cosine_similarity(h, target, dim=-1, eps=1e-30)  # (N,)
    return (1.0 - cos).mean().to(_out_dtype(hidden))


def candidate_softmax_loss(
    codec: RotaryNumberCodec,
    hidden: torch.Tensor,
    values: Values,
    *,
    kappa: float = 64.0,
    sigma: float = 0.5,
    window: float | None = None,
    negatives: int = 256,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Soft-label cross-entropy over candidates with logits ``kappa cos(h, R(m' Omega) x_base)``.

    Args:
        kappa: inverse temperature of the cosine logits (> 0).
        sigma: label width in value units (> 0), ``label(m') ~ exp(-(m' - m)^2 / 2 sigma^2)``.
        window: half-width in value units of the full-step window around each truth
            (default ``4 sigma``); window candidates outside [lo, hi] are dropped.
        negatives: grid values drawn uniformly (with ``generator``) and shared by the batch;
            those inside a row's window are dropped (the window has them already).

    hidden (N, D), values (N,) -> scalar. Memory: (N + 2W + 1 + negatives) x D.
    """
    for name, value in (("kappa", kappa), ("sigma", sigma)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    half = 4.0 * sigma if window is None else window
    if not half >= 0:
        raise ValueError(f"window must be >= 0, got {window!r}")
    if negatives < 0:
        raise ValueError(f"negatives must be >= 0, got {negatives!r}")
    h, m = _inputs(codec, hidden, values)  # (N, D), (N,)
    if h.shape[0] == 0:
        return _zero(hidden)
    x = codec.x_base.detach().to(torch.float64)  # (D,)
    omega = codec.omega  # (J,)
    scale = kappa / (h.norm(dim=-1).clamp_min(1e-30) * x.norm())  # (N,)

    steps = int(half / codec.step + 1e-9)
    offsets = torch.arange(-steps, steps + 1, dtype=torch.float64, device=h.device) * codec.step
    window_table = rotate_blocks(x, offsets[:, None] * omega)  # (2W+1, D)  R(delta) x
    h_back = rotate_blocks(h, -m[:, None] * omega)  # (N, D)  R(-m) h
    logits = [scale[:, None] * (h_back @ window_table.T)]  # (N, 2W+1)
    distance = [offsets.expand(h.shape[0], -1)]  # (N, 2W+1)
    shifted = m[:, None] + offsets  # (N, 2W+1)
    valid = [(shifted >= codec.lo) & (shifted <= codec.hi)]

    if negatives:
        draw = torch.randint(codec.num_candidates, (negatives,), generator=generator)  # (K,)
        far = codec.candidates[draw.to(h.device)]  # (K,)
        negative_table = rotate_blocks(x, far[:, None] * omega)  # (K, D)
        logits.append(scale[:, None] * (h @ negative_table.T))  # (N, K)
        distance.append(far[None, :] - m[:, None])  # (N, K)
        valid.append(distance[-1].abs() > steps * codec.step + 0.5 * codec.step)

    logit = torch.cat(logits, dim=-1)  # (N, 2W+1+K)
    keep = torch.cat(valid, dim=-1)  # (N, 2W+1+K)
    labels = torch.exp(-torch.cat(distance, dim=-1).square() / (2 * sigma**2)) * keep
    labels = labels / labels.sum(dim=-1, keepdim=True)  # the truth itself is always kept
    log_p = torch.log_softmax(logit.masked_fill(~keep, _MASKED), dim=-1)
    return -(labels * log_p).sum(dim=-1).mean().to(_out_dtype(hidden))


@dataclass(frozen=True)
class LambdaRamp:
    """``lambda(step)``: 0 until ``start_step``, linear up to ``max_lambda`` at ``end_step``.

    Flat at ``max_lambda`` after ``end_step``; ``end_step == start_step`` is a step function.
    """

    start_step: int
    end_step: int
    max_lambda: float

    def __post_init__(self) -> None:
        if self.start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {self.start_step!r}")
        if self.end_step < self.start_step:
            raise ValueError(
                f"end_step must be >= start_step, got {self.end_step!r} < {self.start_step!r}"
            )
        if not (self.max_lambda >= 0 and self.max_lambda < float("inf")):
            raise ValueError(f"max_lambda must be finite and >= 0, got {self.max_lambda!r}")

    def __call__(self, step: int) -> float:
        if step < self.start_step:
            return 0.0
        if step >= self.end_step:
            return float(self.max_lambda)
        return float(self.max_lambda) * (step - self.start_step) / (self.end_step - self.start_step)


def _inputs(
    codec: RotaryNumberCodec, hidden: torch.Tensor, values: Values
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, D) hidden, (N,) values -> float64 hidden on the codec's device (graph kept), values."""
    if not isinstance(hidden, torch.Tensor) or not hidden.is_floating_point():
        raise ValueError(f"hidden must be a floating-point tensor, got {type(hidden)!r}")
    if hidden.dim() != 2 or hidden.shape[1] != codec.dim:
        raise ValueError(f"hidden must have shape (N, {codec.dim}), got {tuple(hidden.shape)}")
    m = codec.as_values(values) if hidden.shape[0] else torch.zeros(0, dtype=torch.float64)
    if m.shape[0] != hidden.shape[0]:
        raise ValueError(f"values has {m.shape[0]} entries but hidden has {hidden.shape[0]} rows")
    return hidden.to(device=codec.x_base.device, dtype=torch.float64), m


def _rotated_base(codec: RotaryNumberCodec, m: torch.Tensor) -> torch.Tensor:
    """(N,) values -> (N, D) float64 ``R(m Omega) x_base`` (no graph: the base is a buffer)."""
    x = codec.x_base.detach().to(torch.float64)  # (D,)
    return rotate_blocks(x, m[:, None] * codec.omega)


def _out_dtype(hidden: torch.Tensor) -> torch.dtype:
    return torch.float64 if hidden.dtype == torch.float64 else torch.float32


def _zero(hidden: torch.Tensor) -> torch.Tensor:
    return (hidden.sum() * 0).to(_out_dtype(hidden))
