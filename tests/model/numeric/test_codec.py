"""RotaryNumberCodec: encoding, scores, both decoders, input checks, device/dtype and memory."""

from __future__ import annotations

import math
import statistics
import time
from unittest.mock import patch

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from model.numeric import _small_grid
from model.numeric.codec import (
    DECODE_WORKSPACE_BYTES,
    SMALL_BATCH,
    DecodeMethod,
    RotaryNumberCodec,
    rotary_frequencies,
    rotate_blocks,
)

N_GRID = 30001  # default grid: 0, 0.1, ..., 3000
PROPERTY = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def codec() -> RotaryNumberCodec:
    return RotaryNumberCodec(256)


@pytest.fixture(scope="module")
def codec64() -> RotaryNumberCodec:
    """float64 buffer: encode output carries no rounding, so noiseless round trips are exact."""
    return RotaryNumberCodec(128, seed=3).double()


def brute_force_corr(codec: RotaryNumberCodec, hidden: torch.Tensor) -> torch.Tensor:
    """Full-grid argmax of <h, R(m Omega) x_base>, chunk by chunk, straight from cos and sin."""
    h = hidden.double()  # (N, D)
    x = codec.x_base.double().view(-1, 2)  # (J, 2)
    hb = h.view(h.shape[0], -1, 2)  # (N, J, 2)
    alpha = hb[..., 0] * x[:, 0] + hb[..., 1] * x[:, 1]  # (N, J)
    beta = hb[..., 1] * x[:, 0] - hb[..., 0] * x[:, 1]  # (N, J)
    omega, grid = codec.omega, codec.candidates
    best = torch.full((h.shape[0],), -math.inf, dtype=torch.float64)
    arg = torch.zeros(h.shape[0], dtype=torch.int64)
    for s in range(0, grid.shape[0], 2048):
        angles = grid[s : s + 2048, None] * omega  # (c, J)
        scores = alpha @ angles.cos().T + beta @ angles.sin().T  # (N, c)
        value, index = scores.max(dim=-1)
        better = value > best
        best, arg = torch.where(better, value, best), torch.where(better, index + s, arg)
    return arg


def with_snr(x: torch.Tensor, snr_db: float, generator: torch.Generator) -> torch.Tensor:
    """x (N, D) plus Gaussian noise with |x|^2 / E|noise|^2 = 10^(snr/10)."""
    power = x.double().square().sum(-1, keepdim=True) / 10 ** (snr_db / 10) / x.shape[1]
    noise = torch.randn(x.shape, generator=generator, dtype=torch.float64) * power.sqrt()
    return x.double() + noise


# --- construction --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"dim": 7}, "dim"),
        ({"dim": 0}, "dim"),
        ({"dim": 2.0}, "dim"),
        ({"dim": 8, "base": 1.0}, "base"),
        ({"dim": 8, "base": float("nan")}, "base"),
        ({"dim": 8, "p": -0.1}, "p"),
        ({"dim": 8, "lo": 5.0, "hi": 5.0}, "hi"),
        ({"dim": 8, "hi": float("inf")}, "hi"),
        ({"dim": 8, "step": 0.0}, "step"),
        ({"dim": 8, "step": 0.7}, "step"),  # 3000 / 0.7 is not a whole number of steps
        ({"dim": 8, "step": 1e-5}, "step"),  # 3e8 candidates
        ({"dim": 8, "scale": 0.0}, "scale"),
        ({"dim": 8, "seed": 1.5}, "seed"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        RotaryNumberCodec(**kwargs)  # type: ignore[arg-type]


def test_base_vector_is_a_seeded_buffer_not_a_parameter() -> None:
    a, b, c = RotaryNumberCodec(64, seed=1), RotaryNumberCodec(64, seed=1), RotaryNumberCodec(64)
    assert list(a.parameters()) == []
    assert set(a.state_dict()) == {"x_base"}
    assert torch.equal(a.x_base, b.x_base)
    assert not torch.equal(a.x_base, c.x_base)
    assert a.x_base.dtype == torch.get_default_dtype()


def test_base_vector_norm_matches_the_scale() -> None:
    for scale in (0.02, 0.5):
        x = RotaryNumberCodec(2048, scale=scale).x_base
        assert abs(float(x.norm()) / (scale * math.sqrt(2048)) - 1) < 0.05
        assert abs(float(x.std()) / scale - 1) < 0.05


def test_frequencies_and_blocks() -> None:
    omega = rotary_frequencies(8, 5e5)
    assert torch.allclose(omega, torch.tensor([5e5 ** (-2 * j / 8) for j in range(4)]).double())
    x = torch.tensor([1.0, 0.0, 0.0, 2.0])
    y = rotate_blocks(x, torch.tensor([math.pi / 2, math.pi / 2]))
    assert torch.allclose(y, torch.tensor([0.0, 1.0, -2.0, 0.0]), atol=1e-7)


def test_grid_is_exact_decimals_from_lo_to_hi() -> None:
    codec = RotaryNumberCodec(8)
    grid = codec.candidates
    assert grid.dtype == torch.float64 and grid.shape == (N_GRID,) == (codec.num_candidates,)
    assert grid[0] == 0.0 and grid[-1] == 3000.0
    assert grid[415] == 41.5 and grid[3] == 0.3 and grid[29999] == 2999.9
    odd = RotaryNumberCodec(8, lo=-1.25, hi=1.25, step=0.25).candidates
    assert odd.tolist() == [-1.25 + 0.25 * k for k in range(11)]


def test_construction_time_at_2048() -> None:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        RotaryNumberCodec(2048)
        times.append(time.perf_counter() - start)
    assert statistics.median(times) < 1.0, times


def test_memory_at_2048_is_bounded() -> None:
    codec = RotaryNumberCodec(2048)
    # x_base, score vector, sorted targets, factorised and coarse-to-fine tables: ~26 MiB
    assert codec.cache_nbytes < 32 * 2**20
    assert codec.cache_nbytes + DECODE_WORKSPACE_BYTES < 256 * 2**20


# --- encode and scores ---------------------------------------------------------------------------


@PROPERTY
@given(st.lists(st.floats(0.0, 3000.0), min_size=1, max_size=16))
@example([0.0, 3000.0, 1e-300, 2999.999999])
def test_encode_preserves_the_norm(codec: RotaryNumberCodec, values: list[float]) -> None:
    out = codec.encode(values)  # (N, D) float32
    assert out.dtype == torch.float32 and out.shape == (len(values), 256)
    ratio = out.double().norm(dim=-1) / codec.x_base.double().norm()
    assert float((ratio - 1).abs().max()) <= 1e-5


def test_encode_rotates_each_block() -> None:
    codec = RotaryNumberCodec(64).double()
    m = 1234.5
    out = codec.encode(m)[0].view(-1, 2)  # (J, 2)
    x = codec.x_base.view(-1, 2)
    angles = m * codec.omega
    expect_0 = x[:, 0] * angles.cos() - x[:, 1] * angles.sin()
    expect_1 = x[:, 0] * angles.sin() + x[:, 1] * angles.cos()
    assert torch.allclose(out, torch.stack((expect_0, expect_1), -1), rtol=0, atol=1e-15)
    assert torch.equal(codec.encode(0.0)[0], codec.x_base)


@PROPERTY
@given(st.lists(st.floats(0.0, 3000.0), min_size=1, max_size=16))
def test_score_of_an_encoded_value_is_its_target_score(
    codec64: RotaryNumberCodec, values: list[float]
) -> None:
    scale = float(codec64.grid_scores.abs().max())
    assert torch.allclose(
        codec64.score(codec64.encode(values)),
        codec64.target_score(values),
        rtol=0,
        atol=1e-13 * scale,
    )


@PROPERTY
@given(st.lists(st.integers(0, N_GRID - 1), min_size=1, max_size=16))
def test_cached_grid_scores_equal_target_scores(
    codec64: RotaryNumberCodec, indices: list[int]
) -> None:
    grid = codec64.candidates[indices]
    cached = codec64.grid_scores[indices]
    scale = float(codec64.grid_scores.abs().max())
    assert torch.allclose(cached, codec64.target_score(grid), rtol=0, atol=1e-13 * scale)
    assert torch.allclose(cached, codec64.score(codec64.encode(grid)), rtol=0, atol=1e-13 * scale)


@pytest.mark.parametrize("dim", [64, 128, 256, 2048])
@pytest.mark.parametrize("p", [0.0, 0.2, 0.3, 0.5])
def test_no_two_grid_scores_collide(dim: int, p: float) -> None:
    """RND's noiseless exactness rests on this: the smallest gap between sorted target scores is
    >= 5e-12 of the score range at every tested setting (float64 errors are ~1e-15)."""
    scores = RotaryNumberCodec(dim, p=p).grid_scores.sort().values
    gap = float(scores.diff().min()) / float(scores[-1] - scores[0])
    assert gap > 1e-12


# --- decode --------------------------------------------------------------------------------------

GRID_INDICES = st.lists(st.integers(0, N_GRID - 1), min_size=1, max_size=16)


@PROPERTY
@given(GRID_INDICES)
@example([0, N_GRID - 1])
def test_noiseless_round_trip_is_exact_float64(
    codec64: RotaryNumberCodec, indices: list[int]
) -> None:
    values = codec64.candidates[indices]
    hidden = codec64.encode(values)  # float64
    for method in ("rnd", "corr"):
        decoded = codec64.decode(hidden, method)  # type: ignore[arg-type]
        assert decoded.dtype == torch.float64
        assert torch.equal(decoded, values), method


@PROPERTY
@given(GRID_INDICES)
@example([0, N_GRID - 1])
def test_noiseless_corr_round_trip_is_exact_float32_and_bf16(
    codec: RotaryNumberCodec, indices: list[int]
) -> None:
    values = codec.candidates[indices]
    hidden = codec.encode(values)  # float32
    assert torch.equal(codec.decode(hidden, "corr"), values)
    assert torch.equal(codec.decode(hidden.bfloat16(), "corr"), values)


def test_rnd_round_trip_float32_is_exact_but_for_rare_aliases() -> None:
    """What is true for RND at float32: rounding the embedding to float32 moves S(h) by ~1e-8 of
    the range, more than the smallest gaps between target scores, so a few grid values decode to
    a distant alias (33 of 30,001 at d = 2048, errors up to ~560). In float64 it is exact."""
    codec = RotaryNumberCodec(256)
    grid = codec.candidates
    decoded = codec.decode(codec.encode(grid), "rnd")
    wrong = int((decoded != grid).sum())
    assert wrong / N_GRID < 0.005, wrong
    assert torch.equal(codec.double().decode(codec.encode(grid), "rnd"), grid)


@pytest.mark.parametrize("dim", [64, 256])
def test_corr_decoder_is_the_full_grid_argmax_on_noisy_inputs(dim: int) -> None:
    codec = RotaryNumberCodec(dim, seed=dim)
    generator = torch.Generator().manual_seed(dim)
    values = codec.candidates[torch.randint(0, N_GRID, (48,), generator=generator)]
    clean = codec.encode(values)
    hidden = torch.cat(
        [with_snr(clean, snr, generator) for snr in (-10, -5, 0, 5, 10, 20, 30)]
        + [
            torch.randn(16, dim, generator=generator, dtype=torch.float64),  # pure noise
            7.5 * clean[:8].double(),  # gain
            -clean[:8].double(),  # flipped
            torch.zeros(1, dim, dtype=torch.float64),  # degenerate: every candidate ties
        ]
    )
    expected = codec.candidates[brute_force_corr(codec, hidden)]
    assert torch.equal(codec.decode(hidden, "corr"), expected)


def test_corr_coarse_to_fine_is_certified_or_falls_back() -> None:
    """The fast path alone: certified rows are exact; at very low SNR some rows are not certified
    (and go to the full search in decode)."""
    codec = RotaryNumberCodec(2048, seed=5)
    generator = torch.Generator().manual_seed(5)
    values = codec.candidates[torch.randint(0, 3001, (12,), generator=generator)]
    clean = codec.encode(values)
    hidden = torch.cat([with_snr(clean, snr, generator) for snr in (-15, 0, 20)])
    alpha, beta = codec._alpha_beta(hidden)
    index, certified = codec._corr_search(alpha, beta)
    expected = brute_force_corr(codec, hidden)
    assert torch.equal(index[certified], expected[certified])
    assert bool(certified[12:].all())  # 0 and 20 dB: all certified
    assert not bool(certified[:12].all())  # -15 dB: the fallback is exercised
    assert torch.equal(codec.decode(hidden, "corr"), codec.candidates[expected])


def test_corr_on_a_small_grid_uses_the_full_search() -> None:
    codec = RotaryNumberCodec(32, lo=10.0, hi=20.0, step=0.5)
    generator = torch.Generator().manual_seed(0)
    hidden = with_snr(codec.encode(codec.candidates), 0.0, generator)
    assert torch.equal(
        codec.decode(hidden, "corr"), codec.candidates[brute_force_corr(codec, hidden)]
    )


def test_rnd_decodes_to_the_nearest_target_score(codec: RotaryNumberCodec) -> None:
    generator = torch.Generator().manual_seed(1)
    hidden = with_snr(codec.encode([10.0, 500.0, 2500.0]), 20.0, generator)
    s = codec.score(hidden)  # (N,)
    brute = codec.candidates[(codec.grid_scores[None, :] - s[:, None]).abs().argmin(dim=-1)]
    assert torch.equal(codec.decode(hidden, "rnd"), brute)
    # far outside the score range: the extreme candidates
    big = codec.score_vector[None, :].float() * 1e6
    assert codec.decode(torch.cat((big, -big)), "rnd").tolist() == [
        float(codec.candidates[codec.grid_scores.argmax()]),
        float(codec.candidates[codec.grid_scores.argmin()]),
    ]


def test_confidence_is_the_scale_free_peak_correlation(codec: RotaryNumberCodec) -> None:
    """1 on a codeword at any scale; it falls as noise grows and for a state halfway between
    two distant numbers; 0 for a zero state; checked against the codeword's cosine."""
    values = torch.tensor([12.5, 480.0, 2200.0], dtype=torch.float64)
    words = codec.encode(values).double()
    exact = codec.confidence(words * 7.0, values)
    assert torch.allclose(exact, torch.ones(3, dtype=torch.float64), atol=1e-6)
    generator = torch.Generator().manual_seed(4)
    by_snr = []
    for snr in (20.0, 5.0, -5.0):
        noisy = with_snr(words, snr, generator)
        by_snr.append(float(codec.confidence(noisy, codec.decode(noisy, "corr")).mean()))
    assert 1.0 > by_snr[0] > by_snr[1] > by_snr[2] > 0.0
    both = codec.encode([40.0]).double() + codec.encode([900.0]).double()  # (1, D)
    between = codec.confidence(both, codec.decode(both, "corr"))
    assert 0.5 < float(between) < 0.9  # distant codewords are partly correlated
    cosine = torch.nn.functional.cosine_similarity(both, codec.encode(codec.decode(both, "corr")))
    assert float(between) == pytest.approx(float(cosine), abs=1e-6)
    assert codec.confidence(torch.zeros(1, codec.dim), [5.0]).tolist() == [0.0]
    with pytest.raises(ValueError, match="2 hidden states but 1 values"):
        codec.confidence(words[:2], [5.0])


# --- input checks --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "bad"),
    [
        (-0.1, r"values\[0\] = -0\.1"),
        (3000.0001, r"values\[0\] = 3000\.0001"),
        ([1.0, float("nan")], r"values\[1\] = nan"),
        (np.array([5.0, 6.0, float("inf")]), r"values\[2\] = inf"),
        (torch.tensor([4000.0]), r"values\[0\] = 4000\.0"),
    ],
)
def test_out_of_range_or_nan_values_raise(
    codec: RotaryNumberCodec, values: object, bad: str
) -> None:
    with pytest.raises(ValueError, match=bad):
        codec.encode(values)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=bad):
        codec.target_score(values)  # type: ignore[arg-type]


def test_malformed_values_raise(codec: RotaryNumberCodec) -> None:
    with pytest.raises(ValueError, match="1-D"):
        codec.encode([[1.0, 2.0]])
    with pytest.raises(ValueError, match="numbers"):
        codec.encode(["a"])  # type: ignore[list-item]


def test_value_types_are_accepted(codec: RotaryNumberCodec) -> None:
    expected = codec.encode(torch.tensor([12.5], dtype=torch.float64))
    for values in (12.5, [12.5], (12.5,), np.array([12.5]), np.float32(12.5), torch.tensor(12.5)):
        assert torch.equal(codec.encode(values), expected)  # type: ignore[arg-type]
    assert torch.equal(codec.encode(7), codec.encode(torch.tensor([7], dtype=torch.int64)))
    assert codec.encode([]).shape == (0, 256)
    assert codec.decode(torch.zeros(0, 256), "corr").shape == (0,)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_hidden_states_raise(codec: RotaryNumberCodec, bad: float) -> None:
    hidden = codec.encode([1.0, 2.0]).clone()
    hidden[1, 5] = bad
    for method in ("rnd", "corr"):
        with pytest.raises(ValueError, match=r"hidden\[1\] has non-finite"):
            codec.decode(hidden, method)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-finite"):
        codec.score(hidden)


def test_malformed_hidden_and_method_raise(codec: RotaryNumberCodec) -> None:
    with pytest.raises(ValueError, match=r"shape \(N, 256\)"):
        codec.decode(torch.zeros(3, 128))
    with pytest.raises(ValueError, match=r"shape \(N, 256\)"):
        codec.decode(torch.zeros(256))
    with pytest.raises(ValueError, match="floating-point"):
        codec.decode(torch.zeros(1, 256, dtype=torch.int64))
    with pytest.raises(ValueError, match="method"):
        codec.decode(torch.zeros(1, 256), "argmax")  # type: ignore[arg-type]


# --- device, dtype, state -------------------------------------------------------------------------


def test_dtype_follows_the_module_and_decoders_upcast() -> None:
    codec = RotaryNumberCodec(128)
    values = codec.candidates[[0, 123, 4567, 30000]]
    bf16 = codec.to(torch.bfloat16)
    assert bf16.x_base.dtype == torch.bfloat16
    hidden = bf16.encode(values)
    assert hidden.dtype == torch.bfloat16
    assert torch.equal(bf16.decode(hidden, "corr"), values)
    assert bf16.decode(hidden, "rnd").dtype == torch.float64
    # the tables were rebuilt from the bf16 base vector: its noiseless float64 round trip is exact
    assert torch.equal(bf16.double().decode(bf16.encode(values), "rnd"), values)


def test_state_dict_round_trip_rebuilds_the_tables() -> None:
    source, target = RotaryNumberCodec(128, seed=1), RotaryNumberCodec(128, seed=2)
    target.load_state_dict(source.state_dict())
    values = source.candidates[[5, 9999, 25000]]
    hidden = source.encode(values)
    for method in ("rnd", "corr"):
        assert torch.equal(target.decode(hidden, method), values)  # type: ignore[arg-type]


def test_the_tables_are_rebuilt_only_when_the_base_vector_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loading a checkpoint moves the head to its device and loads its state: neither rebuilds
    the tables when the base vector stays what it was (start-up, issue 26)."""
    codec, other = RotaryNumberCodec(64, seed=3), RotaryNumberCodec(64, seed=4)
    builds: list[int] = []
    build = RotaryNumberCodec._build_tables

    def counting(self: RotaryNumberCodec) -> None:
        builds.append(1)
        build(self)

    monkeypatch.setattr(RotaryNumberCodec, "_build_tables", counting)
    codec.to("cpu").to(torch.get_default_dtype())
    codec.load_state_dict(codec.state_dict())
    assert builds == []
    codec.load_state_dict(other.state_dict())
    assert len(builds) == 1 and torch.equal(codec.encode(12.5), other.encode(12.5))
    codec.double()
    assert len(builds) == 2 and codec.decode(codec.encode(12.5), "rnd").item() == 12.5


def test_meta_device_codec_works_after_loading() -> None:
    reference = RotaryNumberCodec(64, seed=4)
    codec = RotaryNumberCodec(64).to("meta")
    with pytest.raises(ValueError, match="meta"):
        codec.encode(1.0)
    codec = codec.to_empty(device="cpu")
    codec.load_state_dict(reference.state_dict())
    assert torch.equal(codec.encode(12.5), reference.encode(12.5))
    assert torch.equal(codec.decode(reference.encode(12.5), "rnd"), torch.tensor([12.5]).double())


def test_outputs_live_on_the_codec_device(codec: RotaryNumberCodec) -> None:
    assert codec.encode(1.0).device == codec.x_base.device
    assert codec.decode(codec.encode(1.0), "corr").device == codec.x_base.device


@pytest.mark.gpu
@pytest.mark.gpu  # deselected by `make test` (-m "not gpu"); run with `pytest -m gpu` on a GPU
def test_cuda_matches_cpu() -> None:
    cpu = RotaryNumberCodec(256)
    gpu = RotaryNumberCodec(256).to("cuda")
    values = cpu.candidates[torch.randint(0, N_GRID, (64,))]
    hidden = with_snr(cpu.encode(values), 0.0, torch.Generator().manual_seed(0))
    for method in ("rnd", "corr"):
        decoded = gpu.decode(hidden.cuda(), method)  # type: ignore[arg-type]
        assert decoded.device.type == "cuda"
        assert torch.equal(decoded.cpu(), cpu.decode(hidden, method))  # type: ignore[arg-type]
    assert torch.allclose(gpu.encode(values.cuda()).cpu(), cpu.encode(values), atol=1e-6)


# --- small batches on the CPU: the NumPy path ---------------------------------------------------


METHODS: tuple[DecodeMethod, ...] = ("rnd", "corr")


def torch_path(
    codec: RotaryNumberCodec, hidden: torch.Tensor, method: DecodeMethod
) -> torch.Tensor:
    """``decode`` by the torch path: the rows padded past SMALL_BATCH (rows are independent)."""
    pad = hidden.new_zeros(SMALL_BATCH + 1, hidden.shape[1])
    return codec.decode(torch.cat((hidden, pad)), method)[: hidden.shape[0]]


def host_path(codec: RotaryNumberCodec, hidden: torch.Tensor, method: DecodeMethod) -> torch.Tensor:
    """The NumPy path itself, row by row (rows it cannot certify use the torch path's full
    search); it must not turn any of these rows away to the whole torch path."""
    assert codec._host is not None
    out = [codec._host_decode(row[None], method) for row in hidden]
    assert all(v is not None for v in out), "the NumPy path turned a row away"
    return torch.cat([v for v in out if v is not None])


def hard_inputs(codec: RotaryNumberCodec, seed: int) -> torch.Tensor:
    """(R, D) float64 hidden states: encodings of random values and of both grid ends (the last
    one alone in its cell) at SNRs from -15 to 40 dB, float32-rounded copies, pure noise, gain,
    flipped, one block only, a single coordinate. Low SNRs and noise fail the certificate at
    every dimension, so the full search runs too."""
    generator = torch.Generator().manual_seed(seed)
    n = codec.num_candidates
    picks = torch.cat((torch.randint(0, n, (6,), generator=generator), torch.tensor([0, n - 1])))
    clean = codec.encode(codec.candidates[picks]).double()  # (8, D)
    one_block = torch.zeros(2, codec.dim, dtype=torch.float64)
    one_block[0, :2], one_block[1, -2:] = torch.tensor([0.3, -1.1]), torch.tensor([2.0, 0.5])
    coordinate = torch.zeros(1, codec.dim, dtype=torch.float64)
    coordinate[0, codec.dim // 2] = 1.0
    noisy = torch.cat([with_snr(clean, snr, generator) for snr in (-15, -5, 0, 10, 20, 40)])
    return torch.cat(
        [
            noisy,
            noisy[::5].float().double(),  # what a float32 model feeds
            torch.randn(8, codec.dim, generator=generator, dtype=torch.float64),
            3.7 * clean[:2],
            -clean[:2],
            one_block,
            coordinate,
        ]
    )


@pytest.mark.parametrize("dim", [8, 64, 256, 2048])
def test_small_batch_path_equals_the_torch_path_and_brute_force(dim: int) -> None:
    codec = RotaryNumberCodec(dim, seed=dim)
    hidden = hard_inputs(codec, dim)  # (R, D)
    alpha, beta = codec._alpha_beta(hidden)
    certified = codec._corr_search(alpha, beta)[1]
    assert bool(certified.any()) and not bool(certified.all())  # both corr branches run
    expected = {
        "corr": codec.candidates[brute_force_corr(codec, hidden)],
        "rnd": codec.candidates[
            (codec.grid_scores[None, :] - codec.score(hidden)[:, None]).abs().argmin(dim=-1)
        ],
    }
    for method in METHODS:
        fast = host_path(codec, hidden, method)
        assert fast.dtype == torch.float64
        assert torch.equal(fast, torch_path(codec, hidden, method)), method
        assert torch.equal(fast, expected[method]), method
        # through decode, in batches of SMALL_BATCH rows
        batched = torch.cat([codec.decode(b, method) for b in hidden.split(SMALL_BATCH)])
        assert torch.equal(batched, expected[method]), method


# grids small enough for the dense-cell path (model/numeric/_small_grid.py): the demo measurer's
# 0-300 mm, a grid whose last cell overlaps the one before, tiny grids refined whole
SMALL_GRIDS = [
    (8, 0.0, 300.0, 0.1),
    (64, 0.0, 300.0, 0.1),
    (128, 0.0, 300.0, 0.1),
    (512, 0.0, 300.0, 0.1),
    (64, -5.0, 37.3, 0.1),
    (32, 10.0, 20.0, 0.5),
    (16, 0.0, 1.0, 0.5),
]


@pytest.mark.parametrize(("dim", "lo", "hi", "step"), SMALL_GRIDS)
def test_small_grid_path_is_the_full_grid_argmax(
    dim: int, lo: float, hi: float, step: float
) -> None:
    codec = RotaryNumberCodec(dim, lo=lo, hi=hi, step=step, seed=dim)
    assert codec._host is not None and codec._host.dense is not None
    hidden = hard_inputs(codec, dim)  # (R, D)
    rounds: list[int] = []
    original = _small_grid._scores

    def counting(*args: object) -> object:
        rounds[-1] += 1
        return original(*args)  # type: ignore[arg-type]

    with patch.object(_small_grid, "_scores", side_effect=counting):
        fast = []
        for row in hidden:
            rounds.append(0)
            fast.append(host_path(codec, row[None], "corr"))
    expected = codec.candidates[brute_force_corr(codec, hidden)]
    assert torch.equal(torch.cat(fast), expected)
    assert torch.equal(torch_path(codec, hidden, "corr"), expected)
    cells = codec._host.dense.starts.shape[0]
    if cells > 20:  # both branches ran: certified at once, and refined further
        assert min(rounds) == 1 and max(rounds) > 1, rounds


def test_small_grid_path_certifies_noisy_states_at_once() -> None:
    """The tight bound of small cells: at 10 dB every row of the demo-sized codec (d = 128,
    0-300 mm) is certified by the first Q cells (the wide-cell path certified half of the demo
    checkpoint's real states)."""
    codec = RotaryNumberCodec(128, hi=300.0, seed=4)
    generator = torch.Generator().manual_seed(4)
    values = codec.candidates[torch.randint(0, codec.num_candidates, (32,), generator=generator)]
    hidden = with_snr(codec.encode(values), 10.0, generator)
    with patch.object(_small_grid, "_scores", wraps=_small_grid._scores) as spy:
        decoded = host_path(codec, hidden, "corr")
    assert spy.call_count == 32
    assert torch.equal(decoded, codec.candidates[brute_force_corr(codec, hidden)])


def test_small_grid_path_is_only_for_small_grids() -> None:
    assert RotaryNumberCodec(128, hi=300.0)._host.dense is not None  # type: ignore[union-attr]
    assert RotaryNumberCodec(128)._host.dense is None  # type: ignore[union-attr]
    assert RotaryNumberCodec(2048, hi=300.0)._host.dense is None  # type: ignore[union-attr]


def test_small_batch_path_runs_for_small_cpu_batches_only() -> None:
    codec = RotaryNumberCodec(64)
    values = codec.candidates[[5, 500, 5000, 25000]]
    hidden = codec.encode(values)
    with patch.object(codec, "_host_decode", wraps=codec._host_decode) as spy:
        for method in METHODS:
            assert torch.equal(codec.decode(hidden, method), values)
        assert spy.call_count == 2
        codec.decode(hidden.repeat(3, 1), "corr")  # 12 rows: the torch path
        codec.decode(hidden[:0], "corr")  # no rows
        assert spy.call_count == 2


def test_small_batch_path_masks_the_partial_last_cell() -> None:
    """The last cell of [0, 3000] step 0.1 holds one candidate (3000) and 49 points past hi; a
    hidden state whose correlation peaks past hi makes one of those win the fine stage, and it
    must be masked as in the torch path: the answer is the best candidate <= hi."""
    codec = RotaryNumberCodec(64, seed=7)
    wider = RotaryNumberCodec(64, seed=7, hi=3010.0)  # the same base vector, a longer grid
    assert torch.equal(codec.x_base, wider.x_base)
    hidden = wider.encode([3001.2, 3002.0, 3004.9]).double()  # peaks inside the last cell
    generator = torch.Generator().manual_seed(7)
    hidden = torch.cat((hidden, with_snr(hidden, 30.0, generator)))
    expected = codec.candidates[brute_force_corr(codec, hidden)]
    assert bool((expected <= 3000.0).all())
    assert torch.equal(host_path(codec, hidden, "corr"), expected)
    assert torch.equal(torch_path(codec, hidden, "corr"), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_small_batch_path_accepts_every_float_dtype_and_layout(dtype: torch.dtype) -> None:
    codec = RotaryNumberCodec(128, seed=2)
    generator = torch.Generator().manual_seed(2)
    clean = codec.encode(codec.candidates[torch.randint(0, N_GRID, (6,), generator=generator)])
    hidden = with_snr(clean, 10.0, generator).to(dtype)
    strided = torch.stack((hidden, hidden), dim=1)[:, 1]  # rows 2 D apart
    columns = hidden.T.contiguous().T  # column-major
    grad = hidden.clone().requires_grad_(True)
    for method in METHODS:
        expected = torch_path(codec, hidden.double(), method)
        for h in (hidden, strided, columns, grad):
            assert torch.equal(codec.decode(h, method), expected), (method, h.stride())


@pytest.mark.parametrize("hi", [3000.0, 3000.0 / 8])
def test_small_batch_path_hands_edge_cases_to_the_torch_path(hi: float) -> None:
    """Zero, tiny and huge rows (normalised by the torch path) decode as the torch path does,
    with no floating-point warnings (pytest turns them into errors); non-finite rows raise.
    On the default grid and on a small one (the dense-cell path)."""
    codec = RotaryNumberCodec(64, seed=3, hi=hi)
    assert (codec._host is not None and codec._host.dense is not None) == (hi < 3000)
    clean = codec.encode([123.4, 322.2]).double()
    for hidden in (
        torch.zeros(1, 64, dtype=torch.float64),
        clean * 1e-200,
        clean * 1e200,
        torch.full((1, 64), 1e308, dtype=torch.float64),
        torch.cat((clean, torch.zeros(1, 64, dtype=torch.float64))),  # one zero row among others
    ):
        for method in METHODS:
            assert torch.equal(codec.decode(hidden, method), torch_path(codec, hidden, method))
    assert codec.decode(clean * 1e-200, "corr").tolist() == [123.4, 322.2]
    assert codec.decode(clean * 1e200, "corr").tolist() == [123.4, 322.2]
    for bad in (float("nan"), float("inf")):
        hidden = clean.clone()
        hidden[1, 3] = bad
        for method in METHODS:
            with pytest.raises(ValueError, match=r"hidden\[1\] has non-finite"):
                codec.decode(hidden, method)


def test_small_batch_tables_follow_the_module() -> None:
    """The NumPy tables are rebuilt with the torch tables: after a cast, a state-dict load and a
    round trip through the meta device the fast path still matches the torch path."""
    source = RotaryNumberCodec(96, seed=11)
    codec = RotaryNumberCodec(96, seed=12)
    generator = torch.Generator().manual_seed(11)
    values = source.candidates[torch.randint(0, N_GRID, (5,), generator=generator)]
    hidden = with_snr(source.encode(values).double(), 5.0, generator)

    def check() -> None:
        for method in METHODS:
            assert torch.equal(host_path(codec, hidden, method), torch_path(codec, hidden, method))

    codec.load_state_dict(source.state_dict())
    check()
    assert torch.equal(codec.decode(source.encode(values), "corr"), values)
    codec = codec.double()
    check()
    codec = codec.to(torch.bfloat16)
    check()
    codec = codec.to("meta")
    assert codec._host is None
    codec = codec.to_empty(device="cpu")
    codec.load_state_dict(source.state_dict())
    check()
    # memory: the NumPy path's own arrays are counted; views of the torch tables are not
    assert codec._host is not None
    owned = codec._host.nbytes()
    assert 0 < owned < 2 * 2**20
    x_bytes = codec.x_base.numel() * codec.x_base.element_size()
    assert codec.cache_nbytes == codec._t.nbytes() + owned + x_bytes
