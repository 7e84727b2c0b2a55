"""Correlation decode of one row on a small candidate grid: dense cells with a Taylor certificate.

The codec's general small-batch path (``codec._host_cells``) is built for the default grid
(30,001 candidates): wide cells of 50 candidates whose bound treats the fastest blocks as a
constant ``r_j``. On a small grid (the demo measurer's 0-300 mm, 3,001 candidates at d = 128)
the whole grid fits in a few MiB, and a tighter bound pays more than a smaller table:

- Cells of G ~ sqrt(n / 4) candidates (27 for 3,001), half-width ``hw = (G - 1) / 2 step``.
- Coarse stage, one matmul ``h @ coarse`` (D,) @ (D, 2 cells): at every cell centre ``c_q`` the
  correlation ``c(c_q) = <h, R(c_q Omega) x>`` and ``hw c'(c_q)``, restricted to the "Taylor"
  blocks (``omega_j hw <= sqrt 2``; on a small grid usually all of them).
- Bound, for every candidate ``m`` of cell ``q`` (``|m - c_q| <= hw``)::

      c(m) <= c_T(c_q) + hw |c_T'(c_q)| + hw^2 / 2 sum_T omega_j^2 r_j + sum_{not T} r_j

  with ``r_j = |x_j| |h_j| <= |x_j| (|h_2j| + |h_2j+1|)``, so the two sums are one dot product
  of ``|h|`` with fixed weights (``|c_j''| <= omega_j^2 r_j``, ``|c_j| <= r_j``).
- Fine stage: every candidate of the Q = 4 cells with the largest bounds, from the dense
  (cells, G, D) table of ``R(m Omega) x`` rows, one matmul. The winner is the full-grid argmax
  when it beats the (Q+1)-th bound by the margin; else further cells are refined in order of
  decreasing bound until the best beats every bound left (exact, as ``codec._host_cells``).

On the demo checkpoint's real hidden states every row is certified with Q = 4 (the wide-cell
path certified half of them), at about a third of the time (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = ["DENSE_CELLS", "DENSE_TABLE_VALUES", "DenseCells", "dense_argmax", "dense_cells"]

_F64: TypeAlias = npt.NDArray[np.float64]
_C128: TypeAlias = npt.NDArray[np.complex128]
_I64: TypeAlias = npt.NDArray[np.int64]

#: This path is taken up to this many cells (grids up to ~260,000 candidates) and up to
#: ``DENSE_TABLE_VALUES`` entries of the coarse table (cells x dim): beyond, the wide cells of
#: ``codec._host_cells`` cost less (measured at d = 64 to 512, 3,001 and 30,001 candidates).
DENSE_CELLS = 256
DENSE_TABLE_VALUES = 1 << 17
_TOP = 4  # Q: cells refined first
_EXTRA = 8  # cells refined per round once the certificate fails
_MARGIN = 1e-9  # in units of the row's sum_j r_j bound, as the codec's certificate


@dataclass(frozen=True)
class DenseCells:
    """Tables of the small-grid correlation decode (module doc)."""

    coarse: _F64  # (D, 2 cells): [R(c_q Omega) x | hw d/dm R(m Omega) x at c_q], Taylor blocks
    weights: _F64  # (D, 2): |h| @ weights = (bound constant, sum_j r_j bound for the margin)
    phase: _C128  # (cells, J): xbar_j e^{-i start_q omega_j}, xbar_j = x_2j - i x_2j+1
    offsets: _F64  # (2J, G): rows Re, -Im of e^{-i g step omega_j}, alternating per block
    starts: _I64  # (cells,) first candidate of each cell; the last cell ends at the last one
    max_total: float  # rows whose sum_j r_j bound is not below it go to the torch path

    @property
    def size(self) -> int:
        return int(self.offsets.shape[1])

    def nbytes(self) -> int:
        arrays = (self.coarse, self.weights, self.phase, self.offsets, self.starts)
        return sum(a.nbytes for a in arrays)


def dense_cells(x: _F64, omega: _F64, candidates: _F64, step: float) -> DenseCells | None:
    """The tables for base vector ``x`` (D,), frequencies ``omega`` (J,) and the grid, or None
    when the grid is too large for this path (``DENSE_CELLS``, ``DENSE_TABLE_VALUES``)."""
    n, dim = candidates.shape[0], x.shape[0]
    size = min(n, max(2, round(math.sqrt(n / _TOP))))  # G
    cells = math.ceil(n / size)
    if cells > DENSE_CELLS or cells * dim > DENSE_TABLE_VALUES:
        return None
    starts = np.minimum(np.arange(cells) * size, n - size)  # the last cell may overlap
    hw = (size - 1) / 2 * step
    taylor = omega * hw <= math.sqrt(2)  # (J,)

    # c(m) = Re sum_j hc_j xbar_j e^{-i m w_j} with hc_j = h_2j + i h_2j+1 (module doc)
    x_bar = x[0::2] - 1j * x[1::2]  # (J,)
    centres = candidates[starts] + hw  # (cells,)
    value = x_bar * np.exp(-1j * centres[:, None] * omega) * taylor  # (cells, J)
    slope = value * (-1j * hw * omega)  # hw d/dm
    coarse = np.concatenate((_as_rows(value), _as_rows(slope))).T  # (D, 2 cells)

    x_norm = np.abs(x_bar)  # (J,) |x_j|
    bound = np.where(taylor, hw * hw / 2 * omega**2, 1.0) * x_norm  # (J,)
    offsets = np.exp(-1j * np.arange(size)[:, None] * step * omega).T  # (J, G)
    return DenseCells(
        coarse=np.ascontiguousarray(coarse),
        weights=np.stack((np.repeat(bound, 2), np.repeat(x_norm, 2)), axis=1),  # (D, 2)
        phase=x_bar * np.exp(-1j * candidates[starts][:, None] * omega),
        offsets=np.stack((offsets.real, -offsets.imag), axis=1).reshape(dim, size),
        starts=starts.astype(np.int64),
        max_total=1e300,
    )


def _as_rows(k: _C128) -> _F64:
    """(M, J) complex -> (M, 2J) float64 rows ``Re k_0, -Im k_0, Re k_1, ...``: ``h @`` one such
    row is ``Re sum_j hc_j k_j``."""
    return np.stack((k.real, -k.imag), axis=-1).reshape(k.shape[0], 2 * k.shape[1])


def _scores(d: DenseCells, hc: _C128, cells: _I64) -> _F64:
    """Correlations at every candidate of ``cells`` (k,): (k, G)."""
    out: _F64 = (hc * d.phase.take(cells, axis=0)).view(np.float64) @ d.offsets
    return out


def dense_argmax(d: DenseCells, h: _F64, min_total: float) -> int | None:
    """The full-grid argmax of ``<h, R(m Omega) x>`` for one row ``h`` (D,) float64, or None when
    the row's ``sum_j r_j`` bound is not in (``min_total``, ``max_total``) (NaN included): the
    caller's torch path normalises such a row or raises the error."""
    constant, total = (np.abs(h) @ d.weights).tolist()
    if not min_total < total < d.max_total:
        return None
    coarse = h @ d.coarse  # (2 cells,)
    cells_n = d.starts.shape[0]
    upper = coarse[:cells_n] + np.abs(coarse[cells_n:])  # (cells,) bound less its constant
    margin = _MARGIN * total + constant  # certified: upper < best - margin
    hc = h.view(np.complex128)  # (J,)
    top = min(_TOP, cells_n)
    if top == cells_n:
        order = cells = np.arange(cells_n)
    else:
        order = upper.argpartition(-(top + 1))  # the Q + 1 largest bounds last
        cells = order[-top:]
    scores = _scores(d, hc, cells)  # (Q, G)
    best = int(scores.argmax())
    value = float(scores.flat[best])
    index = int(d.starts[cells[best // d.size]]) + best % d.size
    if top == cells_n or float(upper[order[-(top + 1)]]) < value - margin:
        return index  # certified
    rest = order[:-top]
    rest = rest[np.argsort(-upper[rest], kind="stable")]  # unrefined, largest bound first
    for start in range(0, rest.shape[0], _EXTRA):
        chunk = rest[start : start + _EXTRA]
        if float(upper[chunk[0]]) < value - margin:
            break  # every cell left is bounded below the best
        scores = _scores(d, hc, chunk)
        best = int(scores.argmax())
        if float(scores.flat[best]) > value:
            value = float(scores.flat[best])
            index = int(d.starts[chunk[best // d.size]]) + best % d.size
    return index
