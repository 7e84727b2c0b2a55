"""Rotary number codec: RNE encoding and two decoders (the paper's RND and a correlation decoder).

A value ``m`` becomes the [NUM] input embedding ``R(m Omega) x_base``: block ``j`` (the adjacent
pair ``x[2j], x[2j+1]``) of a fixed base vector is rotated by ``m * omega_j`` with
``omega_j = base ** (-2j / dim)`` (paper, section "RNE"; conventions from
``shared/design/rned-notes.md``). Rotation keeps the norm, so the token looks like any other
embedding to the model's norms.

Two decoders read a hidden state ``h`` (D,) back into a value on the candidate grid
``M = {lo, lo + step, ..., hi}``:

``rnd`` (the paper)
    ``S(h, p) = sum_j omega_j^-p <h_j, x_base_j>`` is matched to the cached target scores
    ``S(m, p)`` of every candidate: ``argmin_m (S(h) - S(m))^2``. The targets are sorted once and
    searched with ``torch.searchsorted``, so a lookup is O(log |M|). ``S(m, p)`` is not monotone
    (hundreds of extrema) and adjacent sorted targets are ~1e-5 of the range apart, so the cache
    and ``S(h)`` are float64. At the default grid no two targets coincide to float64 precision
    (smallest gap 5e-12 of the range over d = 64..2048, p = 0..0.5), which makes the noiseless
    float64 round trip exact; float32 rounding of the embedding alone already moves ``S(h)`` by
    more than the smallest gaps, see the tests.

``corr`` (maximum likelihood under Gaussian noise)
    ``argmax_m <h, R(m Omega) x_base> = argmax_m sum_j alpha_j cos(m w_j) + beta_j sin(m w_j)``
    with ``alpha_j = <h_j, x_j>``, ``beta_j = h_j[1] x_j[0] - h_j[0] x_j[1]``.

How the correlation search is exact and fast, and the NumPy path of small CPU batches: the
design in :mod:`model.numeric._codec_tables`' docstring (the search tables and functions live
there; :class:`RotaryNumberCodec` drives them).

Device and dtype. ``x_base`` is a persistent buffer (saved in ``state_dict``, moved and cast by
``.to()``); every derived table is float64 on ``x_base``'s device and is rebuilt whenever the module
is moved or cast (``_apply``) or a state dict is loaded, so the decoders always match what
``encode`` produces. ``encode`` returns ``x_base``'s dtype; decoders upcast hidden states.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from model.numeric._codec_tables import (
    _ENCODE_ROWS,
    _HOST_DTYPES,
    _HOST_MAX_DIM,
    _MAX_CANDIDATES,
    _TOP_CELLS,
    _cell_tables,
    _coarse_to_fine,
    _full_search_tables,
    _grid,
    _grid_correlation,
    _host_cells,
    _host_full,
    _host_rnd,
    _host_tables,
    _HostTables,
    _Tables,
)
from model.numeric._small_grid import dense_argmax

__all__ = [
    "DECODE_WORKSPACE_BYTES",
    "DEFAULT_SCALE",
    "SMALL_BATCH",
    "DecodeMethod",
    "RotaryNumberCodec",
    "Values",
    "rotary_frequencies",
    "rotate_blocks",
]

#: Temporary memory of the correlation search per chunk of rows (rows are chunked to fit). Small
#: chunks are also faster on CPU: their temporaries stay in cache and need no fresh pages.
DECODE_WORKSPACE_BYTES = 16 * 1024 * 1024

#: Default per-element std of the base vector. 0.02 is the ``initializer_range`` of Qwen2 /
#: Qwen2.5(-VL), LLaMA and GPT-2 configs, so ``|x_base| ~ 0.02 sqrt(dim)`` (0.9 at d = 2048) is the
#: norm of a freshly initialised token embedding. A model should pass the std of its own input
#: embedding matrix (``model.get_input_embeddings().weight.std()``) so that [NUM] tokens have the
#: norm of the tokens around them.
DEFAULT_SCALE = 0.02


#: ``decode`` of at most this many rows, on the CPU, runs the NumPy small-batch path.
SMALL_BATCH = 8

DecodeMethod: TypeAlias = Literal["rnd", "corr"]
Values: TypeAlias = float | Sequence[float] | npt.NDArray[Any] | torch.Tensor


def rotary_frequencies(dim: int, base: float) -> torch.Tensor:
    """``omega_j = base ** (-2j / dim)`` for j = 0..dim/2-1, float64 (dim/2,)."""
    j = torch.arange(dim // 2, dtype=torch.float64)  # (J,)
    return torch.pow(torch.tensor(float(base), dtype=torch.float64), -2.0 * j / dim)


def rotate_blocks(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent pair ``(x[..., 2j], x[..., 2j+1])`` by ``angles[..., j]``.

    ``x`` (..., D) and ``angles`` (..., D/2) broadcast against each other; returns (..., D) in
    their promoted dtype. ``rotate_blocks(x, a)`` is ``R(a) x`` of the paper (a block-diagonal
    rotation), and ``rotate_blocks(x, -a)`` its inverse.
    """
    x0, x1 = x[..., 0::2], x[..., 1::2]  # (..., J)
    cos, sin = angles.cos(), angles.sin()  # (..., J)
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)  # (..., J, 2)
    return out.flatten(-2)  # (..., D)


class RotaryNumberCodec(nn.Module):
    """Encode values as rotated [NUM] embeddings; decode hidden states with RND or correlation.

    Args:
        dim: embedding size D (even, >= 2); blocks are adjacent pairs.
        base: frequency base B > 1, ``omega_j = B ** (-2j / D)`` (paper: 5e5).
        p: score weighting exponent >= 0 of the RND decoder (paper: 0.2-0.3).
        lo, hi: candidate range; values outside it are rejected, never clamped.
        step: grid step > 0; ``(hi - lo) / step`` must be a whole number.
        seed: seed of the base vector's generator (same seed, same base vector, any device).
        scale: per-element std of the base vector, ``x_base ~ N(0, scale^2 I)`` so
            ``|x_base| ~ scale sqrt(D)``; see ``DEFAULT_SCALE``.

    ``x_base`` is a buffer (in ``state_dict``, not a parameter, not tied to any vocabulary row:
    with tied input/output embeddings a [NUM] row would make the p = 0 score the [NUM] logit).
    It is drawn in float64 on the CPU and stored in the default dtype.
    """

    x_base: torch.Tensor  # (D,)

    def __init__(
        self,
        dim: int,
        base: float = 5e5,
        p: float = 0.3,
        lo: float = 0.0,
        hi: float = 3000.0,
        step: float = 0.1,
        seed: int = 0,
        *,
        scale: float = DEFAULT_SCALE,
    ) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
            raise ValueError(f"dim must be an even integer >= 2, got {dim!r}")
        _check_finite("base", base)
        if base <= 1:
            raise ValueError(f"base must be > 1, got {base!r}")
        _check_finite("p", p)
        if p < 0:
            raise ValueError(f"p must be >= 0, got {p!r}")
        _check_finite("lo", lo)
        _check_finite("hi", hi)
        if hi <= lo:
            raise ValueError(f"hi must be > lo, got lo={lo!r}, hi={hi!r}")
        _check_finite("step", step)
        if step <= 0:
            raise ValueError(f"step must be > 0, got {step!r}")
        intervals = (hi - lo) / step
        n_intervals = round(intervals)
        if n_intervals < 1 or abs(intervals - n_intervals) > 1e-6 * max(1.0, intervals):
            raise ValueError(
                f"step must divide hi - lo into a whole number of steps, got "
                f"(hi - lo) / step = ({hi!r} - {lo!r}) / {step!r} = {intervals!r}"
            )
        if n_intervals + 1 > _MAX_CANDIDATES:
            raise ValueError(
                f"step {step!r} gives {n_intervals + 1} candidates, more than {_MAX_CANDIDATES}; "
                "use a coarser step or a narrower [lo, hi]"
            )
        _check_finite("scale", scale)
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")

        self.dim, self.base, self.p = dim, float(base), float(p)
        self.lo, self.hi, self.step = float(lo), float(hi), float(step)
        self.seed, self.scale = seed, float(scale)
        self.num_candidates = n_intervals + 1

        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(dim, generator=generator, dtype=torch.float64) * scale  # (D,)
        self.register_buffer("x_base", x.to(torch.get_default_dtype()))
        self._tables: _Tables | None = None
        self._host: _HostTables | None = None
        self._build_tables()

    # ----------------------------------------------------------------------------------------
    # Tables: built from x_base, rebuilt whenever x_base moves, changes dtype or is loaded
    # ----------------------------------------------------------------------------------------

    def _build_tables(self) -> None:
        device = self.x_base.device
        if device.type == "meta":  # e.g. a model built on the meta device, weights loaded later
            self._tables = self._host = None
            return
        f64 = torch.float64
        dim, n = self.dim, self.num_candidates
        omega = rotary_frequencies(dim, self.base).to(device=device, dtype=f64)  # (J,)
        weight = omega.pow(-self.p)  # (J,)
        x64 = self.x_base.detach().to(device=device, dtype=f64)  # (D,)
        energy = weight * x64.view(-1, 2).square().sum(-1)  # (J,)
        candidates = _grid(self.lo, self.step, n, self.hi).to(device)  # (n,)

        start_cos, start_sin, offset_table = _full_search_tables(candidates, omega, self.step)
        zeros = torch.zeros_like(energy)[None]  # (1, J)
        targets = _grid_correlation(energy[None], zeros, start_cos, start_sin, offset_table, n)
        sorted_scores, sorted_index = torch.sort(targets[0])  # (n,) S(m, p) of every candidate
        split, half_width, coarse_table, fine_table = _cell_tables(candidates, omega, self.step)
        self._tables = _Tables(
            omega=omega,
            x64=x64,
            score_vector=weight.repeat_interleave(2) * x64,
            energy=energy,
            candidates=candidates,
            start_cos=start_cos,
            start_sin=start_sin,
            offset_table=offset_table,
            sorted_scores=sorted_scores,
            sorted_index=sorted_index,
            split=split,
            half_width=half_width,
            coarse_table=coarse_table,
            fine_table=fine_table,
        )
        cpu = device.type == "cpu" and dim <= _HOST_MAX_DIM
        self._host = _host_tables(self._tables, dim, self.step) if cpu else None

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        """Move/cast the buffer as ``nn.Module`` does, then rebuild the float64 tables from it
        (not when the buffer stayed as it was: ``.to()`` to its own device and dtype)."""
        before = self.x_base
        out = super()._apply(fn, recurse)
        if self.x_base is not before or self._tables is None:
            self._build_tables()
        return out

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Load as ``nn.Module`` does, then rebuild the tables (not when the loaded base vector
        is the one they were built from: a checkpoint of the same seed and scale)."""
        before = self.x_base.detach().clone()
        super()._load_from_state_dict(*args, **kwargs)
        same = self.x_base.dtype == before.dtype and torch.equal(self.x_base, before)
        if not same or self._tables is None:
            self._build_tables()

    @property
    def _t(self) -> _Tables:
        if self._tables is None:
            raise ValueError(
                "x_base is on the meta device: load a state dict or call .to_empty() and "
                "load one before encoding or decoding"
            )
        return self._tables

    # ----------------------------------------------------------------------------------------
    # Read-only views
    # ----------------------------------------------------------------------------------------

    @property
    def candidates(self) -> torch.Tensor:
        """The candidate grid ``{lo, lo + step, ..., hi}``, float64 (n,) (a copy)."""
        return self._t.candidates.clone()

    @property
    def grid_scores(self) -> torch.Tensor:
        """The cached RND targets ``S(m, p)`` of every candidate, float64 (n,), candidate order."""
        t = self._t
        return torch.empty_like(t.sorted_scores).scatter_(0, t.sorted_index, t.sorted_scores)

    @property
    def omega(self) -> torch.Tensor:
        """Block frequencies ``omega_j``, float64 (D/2,) (a copy)."""
        return self._t.omega.clone()

    @property
    def score_vector(self) -> torch.Tensor:
        """``u`` (D,) float64 with ``S(h, p) = h @ u`` (a copy)."""
        return self._t.score_vector.clone()

    @property
    def score_range(self) -> float:
        """``max_m S(m, p) - min_m S(m, p)`` over the grid: the natural unit of score errors."""
        scores = self._t.sorted_scores
        return float(scores[-1] - scores[0])

    @property
    def cache_nbytes(self) -> int:
        """Bytes held by ``x_base`` and every cached table (the decoders' fixed memory)."""
        host = 0 if self._host is None else self._host.nbytes()
        return self._t.nbytes() + host + self.x_base.numel() * self.x_base.element_size()

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, base={self.base:g}, p={self.p:g}, lo={self.lo:g}, hi={self.hi:g}, "
            f"step={self.step:g}, candidates={self.num_candidates}, seed={self.seed}, "
            f"scale={self.scale:g}"
        )

    # ----------------------------------------------------------------------------------------
    # Encode and scores
    # ----------------------------------------------------------------------------------------

    def encode(self, values: Values) -> torch.Tensor:
        """(N,) values in [lo, hi] -> (N, D) embeddings ``R(m Omega) x_base`` in ``x_base``'s dtype.

        Angles ``m omega_j`` and the rotation are float64 (in bf16, m = 3000 moves in steps of
        16), then cast. A scalar gives (1, D). Out-of-range or NaN values raise ``ValueError``.
        """
        t = self._t
        m = self.as_values(values)  # (N,) float64
        if m.shape[0] <= _ENCODE_ROWS:  # one chunk (e.g. generation's few values): no buffer
            return rotate_blocks(t.x64, m[:, None] * t.omega).to(self.x_base.dtype)
        out = torch.empty(m.shape[0], self.dim, dtype=self.x_base.dtype, device=m.device)
        for s in range(0, m.shape[0], _ENCODE_ROWS):
            angles = m[s : s + _ENCODE_ROWS, None] * t.omega  # (n, J)
            out[s : s + _ENCODE_ROWS] = rotate_blocks(t.x64, angles)  # (n, D)
        return out

    def target_score(self, values: Values) -> torch.Tensor:
        """(N,) values -> (N,) float64 ``S(m, p) = sum_j omega_j^-p |x_j|^2 cos(m omega_j)``."""
        t = self._t
        m = self.as_values(values)  # (N,)
        out = torch.empty_like(m)
        for s in range(0, m.shape[0], _ENCODE_ROWS):
            angles = m[s : s + _ENCODE_ROWS, None] * t.omega  # (n, J)
            out[s : s + _ENCODE_ROWS] = angles.cos() @ t.energy  # (n,)
        return out

    def score(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states -> (N,) float64 ``S(h, p) = sum_j omega_j^-p <h_j, x_base_j>``.

        Differentiable; non-finite hidden states raise ``ValueError``.
        """
        h = self._hidden(hidden)  # (N, D) float64
        return h @ self._t.score_vector  # (N,)

    # ----------------------------------------------------------------------------------------
    # Decode
    # ----------------------------------------------------------------------------------------

    def decode(self, hidden: torch.Tensor, method: DecodeMethod = "rnd") -> torch.Tensor:
        """(N, D) hidden states (any float dtype; upcast) -> (N,) float64 grid values.

        ``method="rnd"``: the paper's nearest target score; ``"corr"``: the correlation
        (maximum-likelihood) decoder, an exact full-grid argmax. Up to ``SMALL_BATCH`` rows on
        the CPU take the NumPy path (module doc, "Small batches on the CPU"): the same values.
        """
        if method not in ("rnd", "corr"):
            raise ValueError(f"method must be 'rnd' or 'corr', got {method!r}")
        if (
            self._host is not None
            and isinstance(hidden, torch.Tensor)
            and hidden.is_cpu
            and hidden.is_floating_point()
            and hidden.dim() == 2
            and 0 < hidden.shape[0] <= SMALL_BATCH
            and hidden.shape[1] == self.dim
        ):
            values = self._host_decode(hidden, method)
            if values is not None:
                return values
        with torch.no_grad():
            h = self._hidden(hidden)  # (N, D) float64
            if h.shape[0] == 0:
                return torch.zeros(0, dtype=torch.float64, device=h.device)
            index = self._rnd_index(h) if method == "rnd" else self._corr_index(h)  # (N,)
            return self._t.candidates[index]

    def confidence(self, hidden: torch.Tensor, values: Values) -> torch.Tensor:
        """(N, D) hidden states, (N,) their decoded values -> (N,) float64 peak correlation.

        The cosine between ``h`` and the codeword of its value, ``<h, R(m Omega) x_base> /
        (|h| |x_base|)``: the correlation decoder's peak, scale-free. 1 where ``h`` is a
        codeword; a hidden state that lies between codewords (a number the model is unsure of)
        or off the codebook altogether (nothing like a number) scores low. A zero ``h`` scores 0.
        """
        with torch.no_grad():
            h = self._hidden(hidden)  # (N, D) float64
            m = self.as_values(values)  # (N,)
            if m.shape[0] != h.shape[0]:
                raise ValueError(f"{h.shape[0]} hidden states but {m.shape[0]} values")
            t = self._t
            codewords = rotate_blocks(t.x64, m[:, None] * t.omega)  # (N, D), norm |x_base|
            norms = h.norm(dim=-1) * t.x64.norm()  # (N,)
            peak = (h * codewords).sum(dim=-1)  # (N,)
            return torch.where(norms > 0, peak / norms.clamp_min(1e-300), torch.zeros_like(peak))

    def _host_decode(self, hidden: torch.Tensor, method: DecodeMethod) -> torch.Tensor | None:
        """The NumPy path of ``decode`` for (N, D) CPU hidden states, N <= SMALL_BATCH.

        None where the batch needs the torch path: non-finite entries (it raises the error), a
        peak ``max_i |h_i|`` that could overflow, or a row whose ``sum_j r_j`` is so small that
        the torch path must normalise it first (see ``_HOST_RANGE``).
        """
        f = self._host
        assert f is not None
        if hidden.dtype not in _HOST_DTYPES:
            hidden = hidden.to(torch.float64)
        h = np.ascontiguousarray(hidden.numpy(force=True), dtype=np.float64)  # (N, D)
        if method == "corr" and f.dense is not None:  # checks its own range (max_total)
            picks = []
            for row in h:
                pick = dense_argmax(f.dense, row, f.min_total)
                if pick is None:
                    return None
                picks.append(pick)
            return torch.from_numpy(f.candidates[picks])
        index = np.zeros(h.shape[0], dtype=np.int64)
        magnitude = np.abs(h)
        if not float(magnitude.flat[magnitude.argmax()]) < f.max_peak:  # a NaN fails too
            return None
        if method == "rnd":
            return torch.from_numpy(f.candidates.take(_host_rnd(f, h)))
        hc = h.view(np.complex128)  # (N, J) h_2j + i h_2j+1
        rest = []  # rows for the full search
        for i, row in enumerate(hc):
            # r_j = |alpha_j + i beta_j| = |x_j| |hc_j|: the bound's constant and sum_j r_j
            constant, total = np.dot(np.abs(row), f.bound_weights).tolist()
            if not total > f.min_total:
                return None
            if f.cells:
                index[i] = _host_cells(f, row, constant, total)
            else:
                rest.append(i)
        for i in rest:
            index[i] = _host_full(f, hc[i])
        return torch.from_numpy(f.candidates.take(index))

    def _rnd_index(self, h: torch.Tensor) -> torch.Tensor:
        """(N, D) float64 -> (N,) candidate indices of the nearest cached target score."""
        t = self._t
        s = h @ t.score_vector  # (N,)
        n = t.sorted_scores.shape[0]
        right = torch.searchsorted(t.sorted_scores, s).clamp(1, n - 1)  # (N,)
        left = right - 1
        pick_right = (t.sorted_scores[right] - s).abs() < (s - t.sorted_scores[left]).abs()
        return t.sorted_index[torch.where(pick_right, right, left)]

    def _corr_index(self, h: torch.Tensor) -> torch.Tensor:
        """(N, D) float64 -> (N,) candidate indices maximising ``<h, R(m Omega) x_base>``."""
        h = h / h.abs().amax(dim=-1, keepdim=True).clamp_min(1e-300)  # argmax is scale-free
        alpha, beta = self._alpha_beta(h)  # (N, J) each
        index, certified = self._corr_search(alpha, beta)  # (N,), (N,)
        if not bool(certified.all()):
            rest = (~certified).nonzero()[:, 0]  # (R,) rows the bounds could not certify
            index[rest] = self._corr_full(alpha[rest], beta[rest])
        return index

    def _corr_search(
        self, alpha: torch.Tensor, beta: torch.Tensor, top: int = _TOP_CELLS
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Certified coarse-to-fine: (N, J) x 2 -> (N,) indices and (N,) bool "is the argmax".

        Rows whose fine winner beats the bound of every cell not among the ``top`` refined are
        exact; the others (``certified`` False) need more cells or ``_corr_full``. Without coarse
        tables (small grids), or with fewer than ``top + 1`` cells, nothing is certified.
        """
        t = self._t
        rows = alpha.shape[0]
        if t.coarse_table.numel() == 0 or t.coarse_table.shape[1] <= top + 1:
            return torch.zeros(rows, dtype=torch.int64, device=alpha.device), torch.zeros(
                rows, dtype=torch.bool, device=alpha.device
            )
        per_row = 8 * (4 * t.coarse_table.shape[1] + 6 * top * self.dim)
        chunk = max(1, DECODE_WORKSPACE_BYTES // per_row)
        parts = [
            _coarse_to_fine(alpha[s : s + chunk], beta[s : s + chunk], t, top)
            for s in range(0, rows, chunk)
        ]
        return torch.cat([i for i, _ in parts]), torch.cat([c for _, c in parts])

    def _corr_full(self, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """Factorised full search: (N, J) x 2 -> (N,) indices of the full-grid argmax."""
        t = self._t
        k, c = t.start_cos.shape[0], t.offset_table.shape[1]
        per_row = 8 * (4 * k * self.dim + 2 * k * c)  # p_re, p_im, cat, temporaries + scores
        chunk = max(1, DECODE_WORKSPACE_BYTES // per_row)
        out = torch.empty(alpha.shape[0], dtype=torch.int64, device=alpha.device)
        for s in range(0, alpha.shape[0], chunk):
            scores = _grid_correlation(
                alpha[s : s + chunk],
                beta[s : s + chunk],
                t.start_cos,
                t.start_sin,
                t.offset_table,
                self.num_candidates,
            )  # (chunk, n)
            out[s : s + chunk] = scores.argmax(dim=-1)
        return out

    def _alpha_beta(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, D) -> alpha_j = <h_j, x_j>, beta_j = h_j[1] x_j[0] - h_j[0] x_j[1], (N, J) each."""
        x = self._t.x64.view(-1, 2)  # (J, 2)
        hb = h.view(h.shape[0], self.dim // 2, 2)  # (N, J, 2)
        alpha = hb[..., 0] * x[:, 0] + hb[..., 1] * x[:, 1]
        beta = hb[..., 1] * x[:, 0] - hb[..., 0] * x[:, 1]
        return alpha, beta

    # ----------------------------------------------------------------------------------------
    # Input checks
    # ----------------------------------------------------------------------------------------

    def as_values(self, values: Values) -> torch.Tensor:
        """Any scalar / sequence / array / tensor -> validated (N,) float64 on the codec's device.

        Raises ``ValueError`` naming the first value outside [lo, hi] (NaN included), or for
        non-numeric input or more than one dimension. A scalar gives shape (1,).
        """
        device = self.x_base.device
        if isinstance(values, torch.Tensor):
            m = values.detach()
            if m.dtype != torch.float64 or m.device != device:
                m = m.to(device=device, dtype=torch.float64)
        else:
            try:
                m = torch.as_tensor(np.asarray(values, dtype=np.float64), device=device)
            except (TypeError, ValueError) as error:
                raise ValueError(f"values must be numbers, got {values!r}") from error
        if m.dim() == 0:
            m = m[None]
        if m.dim() != 1:
            raise ValueError(f"values must be a scalar or 1-D, got shape {tuple(m.shape)}")
        if m.shape[0] <= SMALL_BATCH and m.is_cpu:  # a few values: no tensor ops
            inside = all(self.lo <= v <= self.hi for v in m.tolist())
        else:
            inside = bool(((m >= self.lo) & (m <= self.hi)).all())
        if not inside:
            bad = ~((m >= self.lo) & (m <= self.hi))  # NaN fails both comparisons
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"values[{i}] = {float(m[i])!r} is outside the codec range "
                f"[lo, hi] = [{self.lo:g}, {self.hi:g}]; filter or rescale it before encoding"
            )
        return m

    def _hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Validated (N, D) float64 on the codec's device (differentiable)."""
        if not isinstance(hidden, torch.Tensor) or not hidden.is_floating_point():
            raise ValueError(f"hidden must be a floating-point tensor, got {type(hidden)!r}")
        if hidden.dim() != 2 or hidden.shape[1] != self.dim:
            raise ValueError(f"hidden must have shape (N, {self.dim}), got {tuple(hidden.shape)}")
        h = hidden.to(device=self.x_base.device, dtype=torch.float64)
        finite = torch.isfinite(h).all(dim=-1)  # (N,)
        if not bool(finite.all()):
            i = int((~finite).nonzero()[0, 0])
            raise ValueError(f"hidden[{i}] has non-finite entries (NaN or inf); cannot decode")
        return h


def _check_finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
