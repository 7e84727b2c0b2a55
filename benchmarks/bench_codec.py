"""Benchmark: the RNED codec (``model.numeric.codec.RotaryNumberCodec``) at d = 2048.

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_codec.py [--dim 2048] [--values 2000] [--repeats 7] [--seed 0]
                                     [--seeds 4] [--loss-experiment]

Candidates are the default grid {0, 0.1, ..., 3000} (30,001 values). What is measured:

1. Construction time of the codec (base vector + every cached table), median of ``--repeats``
   fresh constructions. Target: <= 1 s.
2. Accuracy: for each of ``--seeds`` base vectors, ``--values`` true values drawn uniformly
   from the grid points in [0, 300], encoded in float64, plus Gaussian noise at
   SNR = 10 log10(|x|^2 / E|noise|^2) dB, or only rounded to bf16. MAE in value units (mm) of
   the correlation decoder (targets: <= 0.1 at 30 dB, <= 1 at 10 dB) and of the paper's RND
   decoder at p = 0.2, 0.3, 0.5, next to the figures of ``shared/design/rned-notes.md``
   (target: within 2x of them). Also the share of rows the coarse-to-fine search certified
   (the rest went to the full search).
3. Decode time per value on the CPU, batches of 1 and 64 (median of ``--repeats`` calls after
   a warm-up), for RND, the correlation decoder at 30 dB (coarse-to-fine certifies every row)
   and at -10 dB (most rows fall back to the full search), and the full search alone.
4. ``--loss-experiment``: the experiments behind ``RnedHead``'s default loss (see
   ``model/numeric/losses.py``): (a) 64 free vectors h, Adam, each loss; steps until the
   correlation decoder is exact on all 64, the final RND accuracy and norm; (b) a
   capacity-limited linear map from random Fourier features of the value, MAE on training and
   held-out values.

Everything is printed as markdown with the command, date, machine and library versions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _machine import load, machine

from model.numeric.codec import RotaryNumberCodec, rotate_blocks
from model.numeric.losses import (
    candidate_softmax_loss,
    rotation_cosine_loss,
    score_mse_loss,
)

# rned-notes.md, d = 2048, MAE (mm) on [0, 300]: condition -> value
NOTES_RND = {
    0.2: {"bf16": 9.7, 40: 9.5, 30: 11.7, 20: 15.0, 10: 29.7},
    0.3: {"bf16": 5.1, 40: 6.0, 30: 8.9, 20: 17.8, 10: 47.3},
    0.5: {"bf16": 2.5, 40: 6.0, 30: 16.9, 20: 50.0, 10: 159.0},
}
NOTES_CORR = {"bf16": 0.00, 40: 0.00, 30: 0.00, 20: 0.00, 10: 0.02}
CONDITIONS: list[str | int] = ["bf16", 40, 30, 20, 10]


def noisy(clean: torch.Tensor, condition: str | int, generator: torch.Generator) -> torch.Tensor:
    """clean (N, D) float64 -> bf16-rounded, or plus Gaussian noise at ``condition`` dB."""
    if condition == "bf16":
        return clean.bfloat16()
    power = clean.square().sum(-1, keepdim=True) / 10 ** (float(condition) / 10) / clean.shape[1]
    return clean + torch.randn(clean.shape, generator=generator, dtype=torch.float64) * power.sqrt()


def exact_encoding(codec: RotaryNumberCodec, values: torch.Tensor) -> torch.Tensor:
    """(N,) -> (N, D) float64 ``R(m Omega) x_base`` (``encode`` would round to float32)."""
    return rotate_blocks(codec.x_base.double(), values[:, None] * codec.omega)


def median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_construction(dim: int, repeats: int) -> float:
    RotaryNumberCodec(dim)  # warm-up (imports, allocator)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        RotaryNumberCodec(dim)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(
        f"| construction, d = {dim} | median {median:.3f} s | min {min(times):.3f} s "
        f"| max {max(times):.3f} s | {'MET' if median <= 1.0 else 'MISSED'} (<= 1 s) |"
    )
    return median


def bench_accuracy(dim: int, count: int, seeds: int) -> dict[str, bool]:
    """MAE per decoder and condition, averaged over ``seeds`` base vectors (RND errors are
    aliasing jumps whose size depends on the base vector: one draw is not the method)."""
    rnd: dict[tuple[float, str | int], list[float]] = {}
    corr: dict[str | int, list[float]] = {}
    certified: dict[str | int, list[float]] = {}
    exact: dict[str | int, list[float]] = {}
    for seed in range(seeds):
        generator = torch.Generator().manual_seed(1000 + seed)
        codecs = {p: RotaryNumberCodec(dim, p=p, seed=seed) for p in (0.2, 0.3, 0.5)}
        base = codecs[0.3]  # same seed: every p shares the base vector
        truth = base.candidates[torch.randint(0, 3001, (count,), generator=generator)]
        clean = exact_encoding(base, truth)  # (N, D) float64, values on the grid in [0, 300]
        for c in [*CONDITIONS, 0, -10]:
            hidden = noisy(clean, c, generator)
            if c in CONDITIONS:
                for p, codec in codecs.items():
                    decoded = codec.decode(hidden, "rnd")
                    rnd.setdefault((p, c), []).append(float((decoded - truth).abs().mean()))
            decoded = base.decode(hidden, "corr")
            corr.setdefault(c, []).append(float((decoded - truth).abs().mean()))
            exact.setdefault(c, []).append(float((decoded == truth).double().mean()))
            alpha, beta = base._alpha_beta(hidden.double())
            certified.setdefault(c, []).append(
                float(base._corr_search(alpha, beta)[1].double().mean())
            )

    def heading(c: str | int) -> str:
        return "bf16 rounding only" if c == "bf16" else f"{c} dB"

    print(
        f"\nMAE (mm), mean over {seeds} base vectors x {count} values "
        "[min-max over base vectors]; ratio = ours / notes\n"
    )
    print("| decoder | " + " | ".join(heading(c) for c in CONDITIONS) + " |")
    print("|---|" + "---|" * len(CONDITIONS))
    checks = {}
    for p in (0.2, 0.3, 0.5):
        cells, ratios = [], []
        for c in CONDITIONS:
            runs, note = rnd[(p, c)], NOTES_RND[p][c]
            mean = statistics.fmean(runs)
            ratios.append(mean / note)
            cells.append(
                f"{mean:.1f} [{min(runs):.1f}-{max(runs):.1f}] vs {note:g}: x{mean / note:.2f}"
            )
        print(f"| RND p={p} | " + " | ".join(cells) + " |")
        checks[f"RND p={p} within 2x of the notes (mean)"] = all(0.5 <= r <= 2 for r in ratios)
    print(
        "| correlation | "
        + " | ".join(f"{statistics.fmean(corr[c]):.3f} vs {NOTES_CORR[c]:.2f}" for c in CONDITIONS)
        + " |"
    )
    checks["corr MAE <= 0.1 at 30 dB"] = statistics.fmean(corr[30]) <= 0.1
    checks["corr MAE <= 1 at 10 dB"] = statistics.fmean(corr[10]) <= 1.0

    print(
        "\nCorrelation decoder, and how often coarse-to-fine certified its answer (the other rows"
    )
    print("went to the full search):\n")
    print("| condition | corr MAE | exact | certified by coarse-to-fine |")
    print("|---|---|---|---|")
    for c in [*CONDITIONS, 0, -10]:
        print(
            f"| {heading(c)} | {statistics.fmean(corr[c]):.3f} "
            f"| {statistics.fmean(exact[c]):.1%} | {statistics.fmean(certified[c]):.1%} |"
        )
    return checks


def bench_decode_time(dim: int, repeats: int, seed: int) -> None:
    codec = RotaryNumberCodec(dim, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    truth = codec.candidates[torch.randint(0, 3001, (64,), generator=generator)]
    clean = exact_encoding(codec, truth)  # (N, D) float64
    cases = {
        "RND (p = 0.3)": (noisy(clean, 30, generator).float(), "rnd"),
        "corr, 30 dB (all certified)": (noisy(clean, 30, generator).float(), "corr"),
        "corr, -10 dB (mostly full search)": (noisy(clean, -10, generator).float(), "corr"),
    }
    print("\n| decoder | batch 1: per value | batch 64: per value |")
    print("|---|---|---|")
    for name, (hidden, method) in cases.items():
        one = median_time(lambda h=hidden, m=method: codec.decode(h[:1], m), repeats)
        many = median_time(lambda h=hidden, m=method: codec.decode(h, m), repeats) / 64
        print(f"| {name} | {one * 1e3:.3f} ms | {many * 1e3:.3f} ms |")
    hidden = noisy(clean, 30, generator)
    alpha, beta = codec._alpha_beta(hidden)
    one = median_time(lambda: codec._corr_full(alpha[:1], beta[:1]), repeats)
    many = median_time(lambda: codec._corr_full(alpha, beta), repeats) / 64
    print(f"| corr, full search only (reference) | {one * 1e3:.3f} ms | {many * 1e3:.3f} ms |")


def loss_experiment(dim: int, seed: int, steps: int = 300, lr: float = 1e-3) -> None:
    codec = RotaryNumberCodec(dim, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    truth = codec.candidates[torch.randint(0, 3001, (64,), generator=generator)]
    x_norm = float(codec.x_base.norm())

    def softmax(kappa: float, sigma: float) -> Callable[[torch.Tensor], torch.Tensor]:
        negatives = torch.Generator().manual_seed(seed + 1)
        return lambda h: candidate_softmax_loss(
            codec, h, truth, kappa=kappa, sigma=sigma, generator=negatives
        )

    losses: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "score-MSE (normalised)": lambda h: score_mse_loss(codec, h, truth),
        "score-MSE (paper form)": lambda h: score_mse_loss(codec, h, truth, normalize=False),
        "cosine": lambda h: rotation_cosine_loss(codec, h, truth),
        **{
            f"softmax kappa={k:g} sigma={s:g}": softmax(k, s)
            for k in (16.0, 64.0, 256.0)
            for s in (0.5, 2.0)
        },
        "cosine + score-MSE": lambda h: (
            rotation_cosine_loss(codec, h, truth) + score_mse_loss(codec, h, truth)
        ),
    }
    print(
        f"\n64 free vectors h ~ N(0, 0.02^2 I) (|h| ~ |x_base|), d = {dim}, Adam lr {lr:g}, "
        f"{steps} steps, targets uniform on the grid in [0, 300]; decoders checked every 10 "
        "steps.\n"
    )
    print(
        "| loss | corr: first step 100 % exact | corr exact @50 | corr exact / MAE @end "
        "| RND exact / MAE @end | norm h / norm x_base @end | time |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, fn in losses.items():
        h = torch.nn.Parameter(
            torch.randn(64, dim, generator=torch.Generator().manual_seed(seed + 2)) * 0.02
        )
        optimiser = torch.optim.Adam([h], lr=lr)
        first, at50 = None, 0.0
        start = time.perf_counter()
        for step in range(steps + 1):
            if step % 10 == 0:
                corr = codec.decode(h.detach(), "corr")
                exact = float((corr == truth).double().mean())
                first = step if exact == 1.0 and first is None else first
                at50 = exact if step == 50 else at50
            if step == steps:
                break
            optimiser.zero_grad()
            fn(h).backward()
            optimiser.step()
        rnd = codec.decode(h.detach(), "rnd")
        print(
            f"| {name} | {first if first is not None else 'never'} | {at50:.0%} "
            f"| {exact:.0%} / {float((corr - truth).abs().mean()):.2f} "
            f"| {float((rnd == truth).double().mean()):.0%} / "
            f"{float((rnd - truth).abs().mean()):.2f} "
            f"| {float(h.detach().norm(dim=-1).mean()) / x_norm:.3f} "
            f"| {time.perf_counter() - start:.1f} s |"
        )


def linear_map_experiment(dim: int, seed: int, steps: int = 4000, lr: float = 1e-3) -> None:
    """Capacity-limited: h = phi(m) W with 256 random Fourier frequencies (log-uniform in
    [2e-6, 1] rad/mm) as features, so W cannot reproduce R(m Omega) x_base exactly and the loss
    decides which error to leave. Trained on 1024 grid values in [0, 300], tested on 512 others."""
    codec = RotaryNumberCodec(dim, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(3001, generator=generator)
    train, test = codec.candidates[order[:1024]], codec.candidates[order[1024:1536]]
    freqs = torch.empty(256, dtype=torch.float64).uniform_(-13.12, 0.0, generator=generator).exp()

    def features(m: torch.Tensor) -> torch.Tensor:
        angles = m[:, None] * freqs  # (N, F)
        return torch.cat((angles.cos(), angles.sin()), dim=-1).float()  # (N, 2F)

    def softmax(kappa: float, sigma: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return lambda h, m: candidate_softmax_loss(codec, h, m, kappa=kappa, sigma=sigma)

    losses: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "score-MSE (normalised)": lambda h, m: score_mse_loss(codec, h, m),
        "cosine": lambda h, m: rotation_cosine_loss(codec, h, m),
        "softmax kappa=64 sigma=0.5": softmax(64.0, 0.5),
        "softmax kappa=64 sigma=0.2": softmax(64.0, 0.2),
    }
    print(
        f"\nLinear map h = phi(m) W, phi = cos/sin of 256 random frequencies, d = {dim}, "
        f"Adam lr {lr:g}, {steps} steps of batch 64 from 1024 training values; MAE (exact) "
        "on the 1024 training and 512 held-out grid values in [0, 300].\n"
    )
    print("| loss | corr train | corr test | RND train | RND test | time |")
    print("|---|---|---|---|---|---|")
    phi_train, phi_test = features(train), features(test)
    for name, fn in losses.items():
        torch.manual_seed(seed)  # the softmax negatives
        w = torch.nn.Parameter(
            torch.randn(512, dim, generator=torch.Generator().manual_seed(seed + 1)) * 0.02 / 22.6
        )
        optimiser = torch.optim.Adam([w], lr=lr)
        batches = torch.Generator().manual_seed(seed + 2)
        start = time.perf_counter()
        for _ in range(steps):
            rows = torch.randint(0, 1024, (64,), generator=batches)
            optimiser.zero_grad()
            fn(phi_train[rows] @ w, train[rows]).backward()
            optimiser.step()
        cells = []
        with torch.no_grad():
            for method in ("corr", "rnd"):
                for phi, m in ((phi_train, train), (phi_test, test)):
                    decoded = codec.decode(phi @ w, method)  # type: ignore[arg-type]
                    cells.append(
                        f"{float((decoded - m).abs().mean()):.2f} "
                        f"({float((decoded == m).double().mean()):.0%})"
                    )
        print(f"| {name} | " + " | ".join(cells) + f" | {time.perf_counter() - start:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--values", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0, help="base vector of the timings")
    parser.add_argument("--seeds", type=int, default=4, help="base vectors of the accuracy")
    parser.add_argument("--loss-experiment", action="store_true")
    args = parser.parse_args()
    began = time.perf_counter()

    print("## RNED codec benchmark\n")
    print(f"- command: `{shlex.join([Path(sys.executable).name, *sys.argv])}`")
    print(f"- date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"- machine: {machine()}")
    print(f"- torch {torch.__version__}, Python {platform.python_version()}")
    print(f"- load average (1/5/15 min) at start: {load()}")
    print(
        f"- d = {args.dim}, candidates 0..3000 step 0.1, {args.values} values, "
        f"{args.seeds} base vectors, {args.repeats} repeats\n"
    )

    print("| what | result | | | target |")
    print("|---|---|---|---|---|")
    built = bench_construction(args.dim, args.repeats)
    checks = {"construction <= 1 s": built <= 1.0}
    checks.update(bench_accuracy(args.dim, args.values, args.seeds))
    bench_decode_time(args.dim, args.repeats, args.seed)
    if args.loss_experiment:
        loss_experiment(args.dim, args.seed)
        linear_map_experiment(args.dim, args.seed)

    print("\n| acceptance criterion | |\n|---|---|")
    for name, ok in checks.items():
        print(f"| {name} | {'MET' if ok else 'MISSED'} |")
    print(
        f"\nload average at end: {load()}; benchmark run time {time.perf_counter() - began:.1f} s"
    )


if __name__ == "__main__":
    main()
