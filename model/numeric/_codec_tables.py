"""The search tables and functions of :class:`model.numeric.codec.RotaryNumberCodec`: the
torch path's factorised full search and certified coarse-to-fine search, and the NumPy path of
small CPU batches (:class:`_HostTables`).

Design of the correlation search (exact, memory-bounded, no loop over candidates)
--------------------------------------------------------------------------------
A direct table of ``cos/sin(m w_j)`` for 30,001 candidates at d = 2048 is 30,001 x 2,048 values
(234 MiB in float32, twice that in float64), and a plain full search costs |M| x D = 61 M
multiply-adds per value. Two exact pieces replace it:

1. *Factorised full search* (the reference, and the fallback). Candidate ``q = k C + i`` is
   ``start_k + i step`` with ``C`` = 1024 offsets and ``K = ceil(|M| / C)`` chunk starts, so by
   angle addition ``c(m_q) = Re sum_j z_j e^{i start_k w_j} e^{i i step w_j}`` with
   ``z_j = alpha_j - i beta_j``: one real matmul ``(N K, 2J) @ (2J, C)`` against a shared
   ``[cos; sin](i step w_j)`` table. Tables are ``(K + C) x D`` float64 (17 MiB at d = 2048), rows
   are chunked to keep the workspace under ``DECODE_WORKSPACE_BYTES``. It evaluates every
   candidate in float64. The same engine builds the RND target cache (``alpha_j = w_j^-p |x_j|^2``,
   ``beta = 0``) in milliseconds instead of the paper's ~20 s.

2. *Certified coarse-to-fine* (the fast path). Blocks are split at ``w_c = 0.5 / hw`` into high
   frequencies H and low frequencies L, and the grid into cells of G = 50 candidates of half-width
   ``hw = 24.5 step``. Coarse stage: the low-frequency part ``c_L`` and its slope ``c_L'`` at every
   cell centre (one matmul over the 601 centres x |L| blocks). A Taylor bound gives, for every
   cell, an upper bound on the *full* correlation anywhere in it::

       max_cell c <= c_L(centre) + |c_L'(centre)| hw + (sum_L w_j^2 r_j) hw^2 / 2 + sum_H r_j,

   with ``r_j = |z_j|`` (``|c_H| <= sum_H r_j``, ``|c_L''| <= sum_L w_j^2 r_j``). Fine stage: all
   blocks, full step, in the Q = 8 cells with the largest bounds. The fine winner is the exact
   full-grid argmax as soon as its correlation exceeds the (Q+1)-th largest bound, which is
   checked per row; rows where it does not hold go to the factorised full search. At d = 2048
   every row is certified down to 0 dB (99.8 % at -5 dB, ~6 % at -10 dB); at d = 256, 100 % at
   0 dB, 86 % at -5 dB. So the result is the full-grid argmax (up to float64 rounding, ~1e-15 of
   the score) at every noise level, and the common case costs ~3 M instead of 61 M
   multiply-adds per value (~0.2-0.3 ms instead of ~1 ms per row in a batch on two CPU cores).
   Tests compare both paths with a brute-force search on noisy, aliased and degenerate inputs.

   The same fine winner *without* the certificate (a plain coarse-to-fine) is wrong on 8 % of
   the rows at -10 dB and 22 % at -15 dB at d = 256 (1.3 % at -15 dB at d = 2048): the dropped
   high-frequency blocks carry ~12 % of the energy. A float32 search with a float64 re-rank of
   the top-k (~2x faster than the float64 full search) was not taken: its error bound is voided
   by TF32 (CUDA) or bf16 (oneDNN) "float32" matmul modes.

Small batches on the CPU (``decode`` of at most ``SMALL_BATCH`` = 8 rows)
------------------------------------------------------------------------
During generation a step decodes the one or few rows that emitted [NUM]. There the torch path
costs PyTorch's per-operation overhead (3-10 us per call, ~50 calls for ``corr``) rather than
arithmetic, so small CPU batches run the same algorithms in NumPy float64, in ~15 NumPy calls
per row, on NumPy views of the tables (shared memory; built with them in ``_build_tables``, so
rebuilt on ``_apply`` and state-dict loads, and absent off the CPU) and a few derived tables:

- RND: one dot product, one ``searchsorted``, the nearer neighbour in Python floats (the float64
  operations of the torch path).
- corr: a row's blocks are complex numbers ``h_c,j = h_2j + i h_2j+1``, and the phasor tables
  carry ``conj(x_2j + i x_2j+1)``, so ``alpha_j + i beta_j`` is never formed. The bound's
  constant and ``sum_j r_j`` are one dot product of ``|h_c|``. Coarse stage: cell ``q = a B + b``
  has the centre ``centre_aB + b G step``, so its phasors factorise into 8 start rows times
  B ~ cells / 8 offsets, and the start rows carry ``1 -+ i hw w_j``: one elementwise product and
  one (16, 2L) @ (2L, B) matmul give ``c_L +- hw c_L'`` at every centre, whose maximum is
  ``c_L + hw |c_L'|``. The matmul streams a table 8x smaller than the torch path's (cells, L)
  one (34 KiB at d = 64). One ``argpartition`` gives the Q cells and the (Q+1)-th bound; the fine
  stage is one (Q, 2J) @ (2J, G) matmul on the Q cells' start phasors (a (cells, J) table up to
  4 MiB, i.e. d <= ~870 at the default grid, else factorised like the centres). Same bound,
  margin and Q, hence the same certificate. A row it fails is not sent to the full search:
  the other cells are refined in order of decreasing bound, 32 at a time, until the best
  correlation found beats every bound left; cells never refined are then bounded below it, so
  the result is the full-grid argmax, at a cost set by how many cells could hold it (a few
  dozen for an untrained model's states instead of all 601). Complex arrays meet real tables
  through their float64 view (real and imaginary parts interleaved) and tables whose rows
  alternate ``Re K_j, -Im K_j``, as ``Re(P K) = Re P Re K - Im P Im K``: no copies in between.
- corr on a small grid (up to 256 cells of ~sqrt(n / 4) candidates, e.g. the demo measurer's
  0-300 mm at d = 128): dense cells, ``model.numeric._small_grid``. Narrow cells let a Taylor
  bound cover (nearly) every block instead of treating the fastest as constants, so the
  certificate holds for the noisy states a small trained model emits (all 16 real demo states,
  where the wide cells above certified 8), in ~6 NumPy calls per row. Same exactness: rows it
  cannot certify at once refine further cells by decreasing bound.
- The torch path first divides ``h`` by ``max_i |h_i|``. The argmax and the margin are
  scale-free, so the NumPy path skips that and hands the torch path what it could not process
  as safely: non-finite entries (the torch path raises the error), peaks that could overflow a
  float64 sum, and rows with ``sum_j r_j`` below 1e-150.
- Threads: NumPy's OpenBLAS runs large products on threads of its own, which compete with
  torch's for the cores (with the full search in NumPy, a 2-core generation loop that emits
  [NUM] at every step ran ~7x slower). So matrix products over 2^19 multiply-adds go through
  torch (its MKL is also faster there): the full search's (d > 16 at the default grid), the
  coarse and fine stages' above d ~ 500 and ~ 1300; and the NumPy path stops at d = 8192,
  beyond which OpenBLAS threads even RND's dot product.

The two paths differ by float64 rounding only (summation order, cos/sin implementations, the
angles a factorised phasor adds up): scores by ~1e-16 to ~1e-14 of ``sum_j r_j``, as much as the
torch path's factorised searches already differ from a direct evaluation (~3e-14), bounds by as
little against the certification margin (1e-9). So they return the same values unless two
candidates tie to ~1e-14 (the tests compare both paths and a brute-force search on noisy,
aliased and degenerate inputs at d = 8 to 2048). Batch 1, one thread, d = 64: RND ~10 us,
certified corr ~28 us, with the full search ~95 us (torch path: ~46, ~260 and ~510 us);
d = 2048: ~23 us, ~0.29 ms, ~2.8 ms (torch path: ~68 us, ~0.9 ms, ~3.7 ms). Larger batches and
other devices keep the torch path, whose batched operations amortise the overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import numpy as np
import numpy.typing as npt
import torch

from model.numeric._small_grid import DenseCells, dense_cells

__all__: list[str] = []  # internals of model.numeric.codec

_OFFSETS = 1024  # C: offsets per chunk in the factorised full search
_CELL = 50  # G: candidates per coarse cell
_TOP_CELLS = 8  # Q: cells refined at full resolution per row
_SMOOTH = 0.5  # w_c hw: low-frequency blocks turn by at most 0.5 rad across half a cell
_MARGIN = 1e-9  # certification margin, in units of sum_j r_j (float64 rounding is ~1e-15)
_MAX_CANDIDATES = 1 << 24
_ENCODE_ROWS = 4096  # rows per float64 chunk in encode / target_score
_CELL_PHASE_BYTES = 4 * 1024 * 1024  # small-batch path: cache per-cell phasors up to this size
_COARSE_STARTS = 8  # small-batch path: A, rows of the factorised coarse stage
_HOST_RANGE = 1e150  # small-batch path: D max|h_i| max(|x_i|, |u_i|) < R, sum_j r_j > 1/R
_NUMPY_PRODUCT = 1 << 19  # small-batch path: larger matrix products go through torch (_dot)
_HOST_MAX_DIM = 8192  # small-batch path up to this D (beyond, even RND's product is threaded)
_EXTRA_CELLS = 32  # small-batch path: cells refined per round once the certificate fails
_F64: TypeAlias = npt.NDArray[np.float64]
_C128: TypeAlias = npt.NDArray[np.complex128]
_I64: TypeAlias = npt.NDArray[np.int64]


@dataclass(frozen=True)
class _Tables:
    """Everything derived from ``x_base``; float64 on ``x_base``'s device."""

    omega: torch.Tensor  # (J,) block frequencies
    x64: torch.Tensor  # (D,) base vector
    score_vector: torch.Tensor  # (D,) u with S(h) = h @ u, u = omega^-p (repeated) * x_base
    energy: torch.Tensor  # (J,) omega_j^-p |x_j|^2: S(m) = sum_j energy_j cos(m omega_j)
    candidates: torch.Tensor  # (n,) the grid
    start_cos: torch.Tensor  # (K, J) cos(start_k omega_j), start_k = candidates[k C]
    start_sin: torch.Tensor  # (K, J)
    offset_table: torch.Tensor  # (2J, C) [cos; sin](i step omega_j), i = 0..C-1
    sorted_scores: torch.Tensor  # (n,) target scores S(m, p), ascending
    sorted_index: torch.Tensor  # (n,) int64 candidate index of each sorted score
    split: int  # first low-frequency block: omega_j <= w_c for j >= split
    half_width: float  # hw: half-width of a coarse cell in value units
    coarse_table: torch.Tensor  # (2L, cells) [cos; sin](centre_q omega_j), j >= split
    fine_table: torch.Tensor  # (2J, G) [cos; sin](i step omega_j), i = 0..G-1

    def nbytes(self) -> int:
        fields = [getattr(self, name) for name in self.__dataclass_fields__]
        return sum(t.numel() * t.element_size() for t in fields if isinstance(t, torch.Tensor))


def _grid(lo: float, step: float, n: int, hi: float) -> torch.Tensor:
    """The n candidates lo + k step, float64 (n,).

    When lo and step are short decimals (0.1, 2.5, ...), every candidate is computed as
    integer / 10**d, which is the float nearest to the decimal: decoded values print as 41.5, not
    41.50000000000001. The last candidate is hi exactly.
    """
    k = torch.arange(n, dtype=torch.float64)
    grid = lo + step * k
    for digits in range(10):
        scale = 10.0**digits
        lo_i, step_i = round(lo * scale), round(step * scale)
        if (
            step_i > 0
            and abs(lo * scale - lo_i) <= 1e-9 * max(1.0, abs(lo * scale))
            and abs(step * scale - step_i) <= 1e-9 * max(1.0, step * scale)
            and abs(lo_i) + step_i * n < 2**52
        ):
            grid = (lo_i + step_i * k) / scale
            break
    grid[-1] = hi
    return grid


def _full_search_tables(
    candidates: torch.Tensor, omega: torch.Tensor, step: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Factorised grid: (n,), (J,) -> start cos/sin (K, J) at every C-th candidate and the offset
    table (2J, C) ``[cos; sin](i step omega)``, i = 0..C-1, float64."""
    offsets = min(_OFFSETS, candidates.shape[0])  # C
    start = candidates[::offsets][:, None] * omega  # (K, J)
    phase = torch.arange(offsets, dtype=omega.dtype, device=omega.device)[:, None] * step * omega
    return start.cos(), start.sin(), torch.cat((phase.cos().T, phase.sin().T))  # (2J, C)


def _cell_tables(
    candidates: torch.Tensor, omega: torch.Tensor, step: float
) -> tuple[int, float, torch.Tensor, torch.Tensor]:
    """Coarse-to-fine tables: the low-frequency split, the cell half-width, the coarse table
    (2L, cells) ``[cos; sin](centre_q omega_j)`` for j >= split and the fine table (2J, G).

    Empty tables (grid too small to gain from cells) switch the coarse-to-fine path off.
    """
    cells = math.ceil(candidates.shape[0] / _CELL)
    half_width = (_CELL - 1) / 2 * step
    split = int((omega > _SMOOTH / half_width).sum())  # omega is decreasing
    if cells <= 2 * (_TOP_CELLS + 1):
        empty = torch.empty(0, 0, dtype=omega.dtype, device=omega.device)
        return split, half_width, empty, empty
    centres = candidates[::_CELL][:, None] + half_width  # (cells, 1)
    coarse = centres * omega[split:]  # (cells, L)
    fine = torch.arange(_CELL, dtype=omega.dtype, device=omega.device)[:, None] * step * omega
    return (
        split,
        half_width,
        torch.cat((coarse.cos().T, coarse.sin().T)),  # (2L, cells)
        torch.cat((fine.cos().T, fine.sin().T)),  # (2J, G)
    )


def _phasor_scores(
    alpha: torch.Tensor, beta: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """``[Re P, -Im P]`` with ``P = (alpha - i beta) e^{i theta}``: (R, J) x 2, (R|1, K, J) x 2 ->
    (R, K, 2J). A dot with ``[cos; sin](phi)`` then gives ``Re(P e^{i phi})``, i.e. the
    correlation at angle ``theta + phi``.
    """
    a, b = alpha[:, None, :], beta[:, None, :]  # (R, 1, J)
    p_re = a * cos + b * sin  # (R, K, J)
    p_im = a * sin - b * cos  # (R, K, J)
    return torch.cat((p_re, -p_im), dim=-1)  # (R, K, 2J)


def _grid_correlation(
    alpha: torch.Tensor,
    beta: torch.Tensor,
    start_cos: torch.Tensor,
    start_sin: torch.Tensor,
    offset_table: torch.Tensor,
    n: int,
) -> torch.Tensor:
    """``c(m_q) = sum_j alpha_j cos(m_q w_j) + beta_j sin(m_q w_j)`` at every grid point, float64.

    alpha, beta (R, J); start_cos/sin (K, J); offset_table (2J, C) -> (R, n), n <= K C.
    Angle addition: ``c(start_k + i step) = Re(z e^{i start_k w} e^{i i step w})``, so the
    phasors at every chunk start meet the shared offset table in one matmul.
    """
    rows = alpha.shape[0]
    p = _phasor_scores(alpha, beta, start_cos, start_sin)  # (R, K, 2J)
    scores = p.reshape(-1, p.shape[-1]) @ offset_table  # (R K, C)
    return scores.reshape(rows, -1)[:, :n]  # (R, n)


def _coarse_to_fine(
    alpha: torch.Tensor, beta: torch.Tensor, t: _Tables, top: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Certified coarse-to-fine argmax of the correlation (see the module docstring), refining
    the ``top`` cells with the largest bounds.

    alpha, beta (R, J) -> (R,) candidate indices, (R,) bool certified.
    """
    n, cell = t.candidates.shape[0], t.fine_table.shape[1]
    s, hw = t.split, t.half_width
    r = torch.hypot(alpha, beta)  # (R, J) block amplitudes |z_j|
    amp_high = r[:, :s].sum(-1)  # (R,) bound on |c_H|
    curvature = (t.omega[s:].square() * r[:, s:]).sum(-1)  # (R,) bound on |c_L''|
    a_low, b_low, w_low = alpha[:, s:], beta[:, s:], t.omega[s:]  # (R, L), (R, L), (L,)
    lhs = torch.cat(
        (
            torch.cat((a_low, b_low), dim=-1),  # c_L = a cos + b sin
            torch.cat((w_low * b_low, -w_low * a_low), dim=-1),  # c_L' = w (b cos - a sin)
        )
    )  # (2R, 2L)
    value, slope = (lhs @ t.coarse_table).chunk(2)  # (R, cells) each
    upper = value + slope.abs() * hw + (curvature * hw * hw / 2 + amp_high)[:, None]
    top_upper, cells = upper.topk(top + 1, dim=-1)  # (R, Q+1)
    cells = cells[:, :top]  # (R, Q)

    theta = t.candidates[cells * cell][..., None] * t.omega  # (R, Q, J) cell start angles
    scores = _phasor_scores(alpha, beta, theta.cos(), theta.sin()) @ t.fine_table  # (R, Q, G)
    index = cells[..., None] * cell + torch.arange(cell, device=cells.device)  # (R, Q, G)
    scores = scores.masked_fill(index >= n, -math.inf).flatten(1)  # (R, Q G)
    best, arg = scores.max(dim=-1)  # (R,)
    certified = top_upper[:, -1] < best - _MARGIN * r.sum(-1)
    return index.flatten(1).gather(1, arg[:, None])[:, 0], certified


@dataclass(frozen=True)
class _HostTables:
    """NumPy tables of the small-batch CPU decoders (module doc, "Small batches on the CPU").

    Views of the CPU ``_Tables`` where the torch path has the same table (shared memory), plus
    small derived arrays. With ``h_c,j = h_2j + i h_2j+1`` and ``xbar_j = x_2j - i x_2j+1``,
    block ``j``'s phasor is ``w_j = xbar_j h_c,j = alpha_j + i beta_j`` and the correlation at
    angles ``theta_j`` is ``Re sum_j w_j e^{-i theta_j}``. The complex tables carry ``xbar_j``
    already, so a row's complex view ``h_c`` multiplies them directly. A complex (..., J) array
    viewed as float64 is (..., 2J) with real and imaginary parts interleaved, and
    ``Re(P K) = [Re P, Im P] . [Re K; -Im K]``: one matmul with ``_real_rows(K)`` sums
    ``Re(P_j K_j)`` over the blocks, with no copy in between.
    """

    score_vector: _F64  # (D,) view: S(h) = h @ u
    sorted_scores: _F64  # (n,) view
    sorted_index: _I64  # (n,) view
    candidates: _F64  # (n,) view
    max_peak: float  # every |h_i| below it, else the torch path: nothing can overflow
    min_total: float  # corr: sum_j r_j above it, else the torch path (it normalises h)
    bound_weights: _F64  # (J, 2) |x_j| [1 (j < split) or hw^2 w_j^2 / 2, 1], see _host_decode
    split: int  # first low-frequency block
    cells: int  # number of coarse cells; 0: nothing is certified (as in _corr_search)
    coarse_start: _C128  # (2A, L) xbar_j (1 -+ i hw w_j) e^{-i centre_aB w_j}, j >= split
    coarse_offset: _F64  # (2L, B) _real_rows(e^{-i d_b w_j}), j >= split
    cell_phase: _C128  # (cells, J) xbar_j e^{-i start_q w_j}, or if too big (A, J) for q = aB
    cell_offset: _C128 | None  # None, or (B, J) e^{-i b G step w_j}: then q = aB + b is a product
    fine_table: _F64  # (2J, G) _real_rows(e^{-i g step w_j}): rows cos, sin alternating
    start_phase: _C128  # (K, J) xbar_j e^{-i start_k w_j}: the full search's chunk starts
    offset_table: _F64  # (2J, C) view: [cos; sin](c step w_j), stacked as in the torch path
    dense: DenseCells | None  # corr on a small grid (``_small_grid``), else None

    #: fields that are views of the torch tables (their bytes are counted there)
    VIEWS: ClassVar[frozenset[str]] = frozenset(
        {"score_vector", "sorted_scores", "sorted_index", "candidates", "offset_table"}
    )

    def nbytes(self) -> int:
        """Bytes of the arrays this object adds to the torch tables."""
        fields = [
            getattr(self, name) for name in self.__dataclass_fields__ if name not in self.VIEWS
        ]
        dense = 0 if self.dense is None else self.dense.nbytes()
        return dense + sum(a.nbytes for a in fields if isinstance(a, np.ndarray))


def _real_rows(k: _C128) -> _F64:
    """(J, M) complex -> (2J, M) float64 with rows Re k_0, -Im k_0, Re k_1, -Im k_1, ..."""
    return np.stack((k.real, -k.imag), axis=1).reshape(2 * k.shape[0], k.shape[1])


def _host_tables(t: _Tables, dim: int, step: float) -> _HostTables:
    """The small-batch path's tables from CPU ``_Tables`` (see ``_HostTables``)."""
    x, omega, u = t.x64.numpy(), t.omega.numpy(), t.score_vector.numpy()
    candidates, s, hw = t.candidates.numpy(), t.split, t.half_width
    n, blocks = candidates.shape[0], omega.shape[0]
    x_conj = x[0::2] - 1j * x[1::2]  # (J,)
    bound_weights = np.ones((blocks, 2))
    bound_weights[s:, 0] = omega[s:] ** 2 * (hw * hw / 2)

    # Coarse cells q = a B + b (A = _COARSE_STARTS): centre_q = centre_aB + d_b with
    # d_b = b G step, so e^{-i centre_q w} = e^{-i centre_aB w} e^{-i d_b w} and (A + B) x L
    # phasors replace the torch path's (cells, L) table. The cell bound less its constant is
    # c_L + hw |c_L'| = max(c_L + hw c_L', c_L - hw c_L'), and d/dc multiplies a phasor by
    # -i w_j, so start phasors times (1 -+ i hw w_j) give both in one matmul, as halves.
    use_cells = t.coarse_table.numel() > 0 and t.coarse_table.shape[1] > _TOP_CELLS + 1
    cells = math.ceil(n / _CELL) if use_cells else 0
    n_offsets = max(1, math.ceil(cells / _COARSE_STARTS))  # B
    d = np.arange(n_offsets) * (_CELL * step)  # (B,) d_b
    w_low = omega[s:]  # (L,)
    centres = candidates[:: _CELL * n_offsets] + hw  # (A,) centre of every B-th cell
    start = x_conj[s:] * np.exp(-1j * (centres[:, None] * w_low))  # (A, L)
    signs = np.array([1.0, -1.0])[:, None, None] * (1j * hw * w_low)  # (2, 1, L)
    # the fine stage's phasors at the cells' first candidates: a (cells, J) table, or if that
    # is too big, factorised in the same way: (A, J) at every B-th cell times (B, J) offsets
    factorised = cells * blocks * 16 > _CELL_PHASE_BYTES
    cell_start = candidates[: cells * _CELL : _CELL * (n_offsets if factorised else 1)]
    fine = t.fine_table.numpy()  # (2J, G) stacked [cos; sin]
    scale = dim * max(float(np.abs(x).max()), float(np.abs(u).max()), 1e-300)
    return _HostTables(
        score_vector=u,
        sorted_scores=t.sorted_scores.numpy(),
        sorted_index=t.sorted_index.numpy(),
        candidates=candidates,
        max_peak=_HOST_RANGE / scale,
        min_total=1 / _HOST_RANGE,
        bound_weights=np.abs(x_conj)[:, None] * bound_weights,
        split=s,
        cells=cells,
        coarse_start=((1 - signs) * start).reshape(-1, w_low.shape[0]),
        coarse_offset=_real_rows(np.exp(-1j * (w_low[:, None] * d))),
        cell_phase=x_conj * np.exp(-1j * (cell_start[:, None] * omega)),
        cell_offset=np.exp(-1j * (d[:, None] * omega)) if factorised else None,
        fine_table=_real_rows(fine[:blocks] - 1j * fine[blocks:]),
        start_phase=x_conj * (t.start_cos.numpy() - 1j * t.start_sin.numpy()),
        offset_table=t.offset_table.numpy(),
        dense=dense_cells(x, omega, candidates, step),
    )


_HOST_DTYPES = (torch.float64, torch.float32, torch.float16)  # NumPy has them (not bfloat16)


def _dot(a: _F64, b: _F64) -> _F64:
    """(M, K) @ (K, N) float64. Up to ``_NUMPY_PRODUCT`` multiply-adds in NumPy, beyond through
    torch: NumPy's OpenBLAS runs large products on threads of its own, which then compete with
    torch's for the cores (module doc, "Small batches on the CPU")."""
    if a.shape[0] * a.shape[1] * b.shape[1] <= _NUMPY_PRODUCT:
        out: _F64 = np.dot(a, b)
        return out
    return torch.from_numpy(a).mm(torch.from_numpy(b)).numpy()


def _host_rnd(f: _HostTables, h: _F64) -> _I64:
    """RND: one dot product, one binary search, then the nearer neighbour (ties go left), row by
    row in Python floats: the same float64 operations as ``_rnd_index``."""
    s = h @ f.score_vector  # (N,) a matrix-vector product, on one thread in OpenBLAS
    scores, last = f.sorted_scores, f.sorted_scores.shape[0] - 1
    picks = []
    for value, right in zip(s.tolist(), scores.searchsorted(s).tolist(), strict=True):
        right = min(max(right, 1), last)
        nearer = abs(scores[right] - value) < abs(value - scores[right - 1])
        picks.append(right if nearer else right - 1)
    return f.sorted_index.take(picks)


def _host_full(f: _HostTables, hc: _C128) -> int:
    """``_corr_full`` for one row, ``hc`` (J,) its complex view: the full-grid argmax."""
    p = hc * f.start_phase  # (K, J) phasors at the chunk starts
    scores = _dot(np.concatenate((p.real, p.imag), axis=1), f.offset_table)  # (K, C)
    return int(scores.ravel()[: f.candidates.shape[0]].argmax())


def _host_cell_scores(f: _HostTables, hc: _C128, cells: _I64) -> _F64:
    """Correlations at every candidate of ``cells`` (k,): (k G,) in cell order, candidates past
    ``hi`` (the last cell may be partial) at -inf."""
    if f.cell_offset is None:
        phase = f.cell_phase.take(cells, axis=0)  # (k, J) xbar_j e^{-i start_q w_j}
    else:
        a_index, b_index = np.divmod(cells, f.cell_offset.shape[0])
        phase = f.cell_phase.take(a_index, axis=0) * f.cell_offset.take(b_index, axis=0)
    scores = _dot((hc * phase).view(np.float64), f.fine_table).ravel()  # (k G)
    cell, n = f.fine_table.shape[1], f.candidates.shape[0]
    if int(cells.max()) * cell + cell > n:  # a partial last cell: mask the points past hi
        scores[(cells[:, None] * cell + np.arange(cell)).ravel() >= n] = -np.inf
    return scores


def _host_cells(f: _HostTables, hc: _C128, constant: float, total: float) -> int:
    """``_coarse_to_fine`` for one row, ``hc`` (J,) its complex view, made exact by refining
    more cells: the full-grid argmax. ``constant`` is the bound's ``sum_H r_j + hw^2 / 2
    sum_L w_j^2 r_j``, ``total`` the margin's unit ``sum_j r_j``.

    The Q cells with the largest bounds are refined first; when the best of them does not beat
    the (Q+1)-th bound (the certificate of the torch path), the other cells follow in order of
    decreasing bound, ``_EXTRA_CELLS`` at a time, until the best correlation found beats the
    largest bound left (or no cell is left). Every cell not refined then has a bound, hence a
    maximum, below the best: the result is the full-grid argmax, as the full search's, at a
    cost that grows with how many cells could hold it (a few dozen for an untrained model's
    hidden states instead of all of them).
    """
    cell, top = f.fine_table.shape[1], _TOP_CELLS
    # coarse: c_L +- hw c_L' at every centre, (2A, 2L) @ (2L, B) -> (2A, B)
    coarse = _dot((hc[f.split :] * f.coarse_start).view(np.float64), f.coarse_offset)
    a = coarse.shape[0] // 2
    upper = np.maximum(coarse[:a], coarse[a:]).ravel()[: f.cells]  # c_L + hw |c_L'|
    order = upper.argpartition(-(top + 1))  # (cells,) the Q + 1 largest bounds last
    cells = order[-top:]  # (Q,) the refined cells, any order
    scores = _host_cell_scores(f, hc, cells)
    best = int(scores.argmax())
    index: int = int(cells[best // cell]) * cell + best % cell
    value = float(scores[best])
    margin = _MARGIN * total
    if float(upper[order[-(top + 1)]]) + constant < value - margin:
        return index  # certified, as in the torch path
    rest = order[:-top]
    rest = rest[np.argsort(-upper[rest], kind="stable")]  # unrefined cells, largest bound first
    for start in range(0, rest.shape[0], _EXTRA_CELLS):
        chunk = rest[start : start + _EXTRA_CELLS]
        if float(upper[chunk[0]]) + constant < value - margin:
            break  # every cell left is bounded below the best
        scores = _host_cell_scores(f, hc, chunk)
        best = int(scores.argmax())
        if float(scores[best]) > value:
            index, value = int(chunk[best // cell]) * cell + best % cell, float(scores[best])
    return index
