"""Benchmark: Circle-RoPE position ids and the forward cost of AGE vs vanilla Qwen2.5-VL on a CPU.

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_circle_rope.py [--threads 2] [--repeats 200] [--rounds 100]
                                           [--sizes 64x2,256x4] [--budget 45] [--seed 0]
                                           [--quick]

Input: a 1,000-token prompt holding four images, each ``<|vision_start|>`` + 64 image tokens +
``<|vision_end|>`` (pre-merge grid (1, 16, 16), spatial merge 2: 8 x 8 merged tokens), the other
736 tokens random text split over the five gaps around the images. The batch of 8 is eight such
rows of 1,000 columns, some left padded (0, 3, 0, 5, 0, 2, 0 and 7 pad tokens: those rows have
that much less text). Models are built from ``model.backbone.tiny_qwen2_5_vl_kwargs`` (vocabulary
300, 4 heads / 2 kv heads, one-block vision tower of width 32, float32, sdpa, eval); ``--sizes``
lists ``hidden x layers`` of the text model. Nothing is downloaded. ``--threads N`` sets torch's
threads (default 2, the size of the target machine).

1. Position ids, batch 1 and batch 8, each function called once per repetition with the calls
   interleaved (``--repeats`` repetitions after a warm-up); median and min per call of
   (a) ``circle_rope_position_ids`` (alpha 0.5, radius 10), (b) ``multimodal_position_ids`` (both
   geometries; batch 1 only), (c) transformers' ``Qwen2_5_VLModel.get_rope_index`` of a stock
   tiny model with ``mm_token_type_ids = (input_ids == image_token_id)``, the reference point.
   The M-RoPE ids of (b) are checked equal to (c)'s.
2. Forward time, batch 1, ``torch.no_grad()``: vanilla ``Qwen2_5_VLForConditionalGeneration``
   vs AGE (``CircleRopeQwen2_5_VLForConditionalGeneration.from_qwen2_5_vl(vanilla,
   circle_rope_strategy="alternate")``: the same weights, layers 0, 2, ... Circle-RoPE):

   - ``full``: ``model(input_ids, attention_mask, pixel_values, image_grid_thw,
     mm_token_type_ids)`` with random ``pixel_values`` (1024, 1176): vision tower, embedding
     scatter, position ids computed inside the forward (``get_rope_index``), decoder, lm_head over
     all 1,000 positions (the model's default ``use_cache`` applies to both).
   - ``decoder``: ``model.model.language_model(inputs_embeds, attention_mask, position_ids)`` with
     precomputed inputs: the same embeddings (text + image features) for both, vanilla given its
     (3, 1, L) ``get_rope_index`` ids, AGE its (6, 1, L) ids (M-RoPE rows then Circle rows).

   Each round times all four calls once; vanilla and AGE alternate, and the order flips every
   round (AB, BA, ...), so a slow phase of the shared machine hits both alike. ``--rounds``
   rounds after a warm-up, or fewer (an even number, printed) where the timed rounds of one model
   size pass ``--budget`` seconds, which keeps a run on a busy machine to a few minutes; min and
   median per call over rounds, AGE / vanilla of each, and the median of the per-round ratios.
   Target (printed as MET / MISSED): AGE within 5 % of vanilla, i.e. the ratio of the minima and
   the ratio of the medians both <= 1.05.

Everything is printed as markdown with the command, date, machine and library versions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _machine import load, machine

from model.backbone import tiny_qwen2_5_vl_kwargs
from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
from model.circle_rope.positions import circle_rope_position_ids, multimodal_position_ids

TARGET = 1.05  # AGE / vanilla
LENGTH = 1000  # tokens per row
IMAGES = 4  # per row
GRID = (1, 16, 16)  # pre-merge (t, h, w) of every image
MERGE = 2
PADS = (0, 3, 0, 5, 0, 2, 0, 7)  # left padding of the batch-8 rows
ALPHA, RADIUS = 0.5, 10.0


def image_tokens() -> int:
    t, h, w = GRID
    return t * (h // MERGE) * (w // MERGE)


def prompt_row(ids: dict[str, int], pad: int, generator: torch.Generator) -> torch.Tensor:
    """(LENGTH,) int64: ``pad`` pad tokens, then text and IMAGES images, LENGTH tokens in all."""
    per_image = 2 + image_tokens()  # vision_start + image tokens + vision_end
    text_len = LENGTH - pad - IMAGES * per_image
    if text_len < IMAGES + 1:
        raise ValueError(f"{LENGTH} tokens cannot hold {IMAGES} images and {pad} pad tokens")
    text = torch.randint(10, ids["image"] - 10, (text_len,), generator=generator)
    gaps = [text_len // (IMAGES + 1)] * (IMAGES + 1)
    gaps[0] += text_len - sum(gaps)
    chunks = text.split(gaps)
    image = torch.tensor([ids["vision_start"], *[ids["image"]] * image_tokens(), ids["vision_end"]])
    parts = [torch.full((pad,), ids["pad"])]
    for k in range(IMAGES):
        parts += [chunks[k], image]
    parts.append(chunks[IMAGES])
    return torch.cat(parts)


def batch_inputs(
    ids: dict[str, int], pads: tuple[int, ...], seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> input_ids (B, LENGTH), attention_mask (B, LENGTH), image_grid_thw (B * IMAGES, 3)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.stack([prompt_row(ids, pad, generator) for pad in pads])
    mask = torch.ones_like(input_ids)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    grid = torch.tensor([GRID] * (IMAGES * len(pads)))
    return input_ids, mask, grid


def special_ids(kw: dict[str, object]) -> dict[str, int]:
    text = kw["text_config"]
    assert isinstance(text, dict)
    return {
        "pad": int(text["pad_token_id"]),
        "image": int(kw["image_token_id"]),  # type: ignore[call-overload]
        "vision_start": int(kw["vision_start_token_id"]),  # type: ignore[call-overload]
        "vision_end": int(kw["vision_end_token_id"]),  # type: ignore[call-overload]
    }


def interleaved(
    calls: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int,
    flip: bool = False,
    budget: float = float("inf"),
) -> dict[str, list[float]]:
    """Seconds per call of each function: every round calls each once (``flip``: the order
    reverses every other round); ``warmup`` untimed rounds first. Stops early, after an even
    number of timed rounds, once the timed rounds have taken ``budget`` seconds."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    items = list(calls.items())
    gc.collect()
    began = time.perf_counter()
    for r in range(warmup + repeats):
        if r == warmup:
            began = time.perf_counter()
        elif r > warmup and (r - warmup) % 2 == 0 and time.perf_counter() - began > budget:
            break
        order = items[::-1] if flip and r % 2 else items
        for name, fn in order:
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            if r >= warmup:
                times[name].append(elapsed)
    return times


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def bench_positions(repeats: int, seed: int) -> bool:
    kw = tiny_qwen2_5_vl_kwargs()
    ids = special_ids(kw)
    torch.manual_seed(seed)
    stock = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**kw)).eval()
    settings = {
        "spatial_merge_size": MERGE,
        "image_token_id": ids["image"],
        "vision_start_token_id": ids["vision_start"],
    }
    print(
        f"\n### 1. Position ids: {LENGTH} tokens per row, {IMAGES} images of grid {GRID} "
        f"({image_tokens()} merged tokens each), median / min of {repeats} interleaved calls\n"
    )
    print("| batch | function | median | min | median / transformers |")
    print("|---|---|---|---|---|")
    agree = True
    for pads in ((0,), PADS):
        input_ids, mask, grid = batch_inputs(ids, pads, seed)
        types = (input_ids == ids["image"]).int()
        calls: dict[str, Callable[[], object]] = {
            "(a) circle_rope_position_ids": lambda i=input_ids, m=mask, g=grid: (
                circle_rope_position_ids(i, g, m, alpha=ALPHA, radius=RADIUS, **settings)
            ),
        }
        if len(pads) == 1:
            calls["(b) multimodal_position_ids"] = lambda i=input_ids, m=mask, g=grid: (
                multimodal_position_ids(i, g, m, alpha=ALPHA, radius=RADIUS, **settings)
            )
        calls["(c) transformers get_rope_index"] = lambda i=input_ids, m=mask, g=grid, t=types: (
            stock.model.get_rope_index(i, t, image_grid_thw=g, attention_mask=m)
        )
        with torch.no_grad():
            ours = multimodal_position_ids(input_ids, grid, mask, **settings)
            theirs, deltas = stock.model.get_rope_index(
                input_ids, types, image_grid_thw=grid, attention_mask=mask
            )
            times = interleaved(calls, repeats, warmup=5)
        same = torch.equal(ours.mrope, theirs) and torch.equal(
            ours.mrope_deltas, deltas.view(-1, 1)
        )
        agree &= same
        reference = statistics.median(times["(c) transformers get_rope_index"])
        for name, runs in times.items():
            median = statistics.median(runs)
            print(
                f"| {len(pads)} | {name} | {ms(median)} | {ms(min(runs))} "
                f"| {median / reference:.2f} |"
            )
    print(
        f"\nM-RoPE ids of `multimodal_position_ids` equal transformers' `get_rope_index` "
        f"(ids and deltas, batch 1 and 8): {'yes' if agree else 'NO'}"
    )
    return agree


def bench_forward(
    hidden: int, layers: int, rounds: int, budget: float, seed: int, notes: list[str]
) -> list[tuple[str, bool]]:
    kw = tiny_qwen2_5_vl_kwargs(hidden_size=hidden, num_layers=layers)
    ids = special_ids(kw)
    torch.manual_seed(seed)
    vanilla = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**kw)).eval()
    age = CircleRopeQwen2_5_VLForConditionalGeneration.from_qwen2_5_vl(
        vanilla, circle_rope_strategy="alternate"
    ).eval()
    input_ids, mask, grid = batch_inputs(ids, (0,), seed)
    types = (input_ids == ids["image"]).int()
    patch = 3 * 2 * 14 * 14  # channels x temporal patch x patch x patch
    pixels = torch.randn(
        int(grid.prod(dim=1).sum()), patch, generator=torch.Generator().manual_seed(seed + 1)
    )
    with torch.no_grad():
        embeds = vanilla.model.get_input_embeddings()(input_ids)  # (1, L, D)
        features = torch.cat(vanilla.model.get_image_features(pixels, grid).pooler_output)
        image_mask = (input_ids == ids["image"])[..., None].expand_as(embeds)
        embeds = embeds.masked_scatter(image_mask, features)
        vanilla_ids, _ = vanilla.model.get_rope_index(
            input_ids, types, image_grid_thw=grid, attention_mask=mask
        )  # (3, 1, L) int64
        age_ids, _ = age.model.get_rope_index(input_ids, image_grid_thw=grid, attention_mask=mask)
        assert age_ids.shape[0] == 6, tuple(age_ids.shape)  # (6, 1, L) float32

        def full(m: torch.nn.Module) -> Callable[[], object]:
            return lambda: m(
                input_ids=input_ids,
                attention_mask=mask,
                pixel_values=pixels,
                image_grid_thw=grid,
                mm_token_type_ids=types,
            )

        def decoder(m: torch.nn.Module, positions: torch.Tensor) -> Callable[[], object]:
            lm = m.model.language_model  # type: ignore[union-attr]
            return lambda: lm(inputs_embeds=embeds, attention_mask=mask, position_ids=positions)

        logits_v = full(vanilla)().logits  # type: ignore[attr-defined]
        logits_a = full(age)().logits  # type: ignore[attr-defined]
        calls: dict[str, Callable[[], object]] = {
            "full/vanilla": full(vanilla),
            "full/age": full(age),
            "decoder/vanilla": decoder(vanilla, vanilla_ids),
            "decoder/age": decoder(age, age_ids),
        }
        times = interleaved(calls, rounds, warmup=3, flip=True, budget=budget)
    finite = bool(torch.isfinite(logits_a).all())
    name = f"hidden {hidden}, {layers} layers"
    notes.append(
        f"{name}: max |logit AGE - logit vanilla| = {float((logits_a - logits_v).abs().max()):.3g} "
        f"(non-zero: the Circle layers are active); AGE logits finite: {'yes' if finite else 'NO'}"
    )
    checks = []
    for what in ("full", "decoder"):
        v, a = times[f"{what}/vanilla"], times[f"{what}/age"]
        r_min = min(a) / min(v)
        r_med = statistics.median(a) / statistics.median(v)
        ok = r_min <= TARGET and r_med <= TARGET
        checks.append((f"{name}, {what}: AGE <= {TARGET:.2f} x vanilla", ok))
        print(
            f"| {name} | {what} | {len(v)} | {ms(min(v))} / {ms(statistics.median(v))} "
            f"| {ms(min(a))} / {ms(statistics.median(a))} | {r_min:.3f} | {r_med:.3f} "
            f"| {statistics.median(x / y for x, y in zip(a, v, strict=True)):.3f} "
            f"| {'MET' if ok else 'MISSED'} |"
        )
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--repeats", type=int, default=200, help="calls per position-id function")
    parser.add_argument("--rounds", type=int, default=100, help="interleaved forward rounds")
    parser.add_argument(
        "--sizes", default="64x2,256x4", help="text model sizes, hidden x layers, comma separated"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=45.0,
        help="seconds of timed forward rounds per model size before stopping early (default 45)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="20 repeats, 5 rounds: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.rounds = min(args.repeats, 20), min(args.rounds, 5)
    sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    began = time.perf_counter()

    print("## Circle-RoPE benchmark\n")
    print(f"- command: `{shlex.join([Path(sys.executable).name, *sys.argv])}`")
    print(f"- date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"- machine: {machine()}")
    print(
        f"- torch {torch.__version__}, transformers {transformers.__version__}, "
        f"Python {platform.python_version()}"
    )
    print(f"- load average (1/5/15 min) at start: {load()}")
    print(
        f"- {args.repeats} position-id repeats, up to {args.rounds} forward rounds "
        f"(at most {args.budget:g} s per model size), seed {args.seed}"
    )

    checks = [("M-RoPE ids equal transformers'", bench_positions(args.repeats, args.seed))]

    print(
        f"\n### 2. Forward, batch 1, {LENGTH} tokens with {IMAGES} images, float32, "
        f"up to {args.rounds} interleaved rounds or {args.budget:g} s per model "
        "(AGE = strategy alternate)\n"
    )
    print(
        "| model | call | rounds | vanilla min / median | AGE min / median | AGE / vanilla (min) "
        "| AGE / vanilla (median) | median of per-round ratios | AGE within 5 % |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    notes: list[str] = []
    for hidden, layers in sizes:
        checks += bench_forward(hidden, layers, args.rounds, args.budget, args.seed, notes)
    print()
    for note in notes:
        print(f"- {note}")

    print("\n| acceptance criterion | |\n|---|---|")
    for name, ok in checks:
        print(f"| {name} | {'MET' if ok else 'MISSED'} |")
    print(
        f"\nload average at end: {load()}; benchmark run time {time.perf_counter() - began:.1f} s"
    )


if __name__ == "__main__":
    main()
