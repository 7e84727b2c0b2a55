"""Benchmark: cost of decoding one [NUM] value vs one generation step of a tiny model.

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_generation.py [--steps 64] [--repeats 9] [--batch 1]
                                          [--hidden 64] [--layers 2] [--threads N]

Model: the tiny random Qwen2.5-VL of ``tests/model/test_numeric_lm.py`` (hidden 64, 2 layers,
4 heads / 2 kv heads, vocabulary 300, float32, sdpa, eval); ``--hidden`` / ``--layers`` scale the
text model (heads stay 4 / 2). Nothing is downloaded. Times are the fastest of ``--repeats`` runs,
``time.perf_counter`` in this process, after warm-up.

- Generation step: ``NumericLM.generate`` in standard mode (no head), a 16-token text prompt,
  ``(t(1 + steps) - t(1)) / steps``: the prefill is subtracted, what remains is the per-token
  loop (model call with the KV cache, lm_head, argmax, next embedding, bookkeeping).
- Decode: ``head.decode(hidden)`` on one (1, D) float32 hidden state, which is what the loop
  calls for each step in which a row emits [NUM] (only those rows are decoded). Heads: RNED
  ``rnd`` (sorted-score binary search), RNED ``corr`` (full-grid correlation argmax), xVal
  (MLP); RNED on the default grid ``[0, 3000]`` step 0.1 (30,001 candidates).
- [NUM] path in the loop: ``NumericLM.generate`` with the head, once with a logits processor
  that forces [NUM] at every step and once with one that bans it, ``(t_num - t_text) / steps``:
  everything a [NUM] adds to a step (decode, ``embed`` of the value, scatter, bookkeeping).

Target (printed as MET / MISSED): decode <= 2 % of a tiny-model generation step, per head.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

import torch
import transformers
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from model.numeric.codec import RotaryNumberCodec
from model.numeric.hf import NumericLM
from model.numeric.protocol import NumericHead
from model.numeric.rned_head import RnedHead
from model.numeric.xval import XValHead

TARGET = 0.02  # decode / step
BOS, EOS, PAD, NUM = 1, 2, 0, 3


def tiny_model(hidden: int, layers: int) -> Qwen2_5_VLForConditionalGeneration:
    head_dim = hidden // 4
    third = head_dim // 2 // 3
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": 300,
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "initializer_range": 0.1,
            "rope_parameters": {
                "rope_type": "default",
                "mrope_section": [head_dim // 2 - 2 * third, third, third],
            },
            "bos_token_id": BOS,
            "eos_token_id": EOS,
            "pad_token_id": PAD,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": hidden,
            "window_size": 56,
            "fullatt_block_indexes": [0],
        },
        image_token_id=290,
        video_token_id=291,
        vision_start_token_id=292,
        vision_end_token_id=293,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def best_time(fn: Callable[[], object], repeats: int, inner: int = 1) -> float:
    """Fastest of ``repeats`` timings of ``inner`` calls of ``fn``, per call (after a warm-up).

    The minimum, not the median: on a shared machine other processes only ever add time.
    """
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64, help="generated tokens per timing")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--batch", type=int, default=1, help="rows generated together")
    parser.add_argument("--hidden", type=int, default=64, help="text hidden size")
    parser.add_argument("--layers", type=int, default=2, help="text decoder layers")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = tiny_model(args.hidden, args.layers)
    lm = NumericLM(model, None, None)
    prompt = torch.tensor([[BOS, *range(10, 25)]] * args.batch)  # (B, 16)
    mask = torch.ones_like(prompt)

    def generate(n: int, numeric: NumericLM = lm, force: bool = False) -> Callable[[], object]:
        def process(_: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            scores[:, NUM] = 1e9 if force else float("-inf")
            return scores

        return lambda: numeric.generate(
            prompt, mask, max_new_tokens=n, eos_token_id=[], logits_processor=process
        )

    prefill = best_time(generate(1), args.repeats)
    total = best_time(generate(1 + args.steps), args.repeats)
    step = (total - prefill) / args.steps

    heads: dict[str, NumericHead] = {
        "rned_rnd": RnedHead(RotaryNumberCodec(args.hidden), method="rnd"),
        "rned_corr": RnedHead(RotaryNumberCodec(args.hidden), method="corr"),
        "xval": XValHead(args.hidden),
    }
    hidden = torch.randn(1, args.hidden)  # (1, D) one row emitting [NUM]

    print(
        f"python {platform.python_version()}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {torch.get_num_threads()} threads, {platform.processor()}"
    )
    print(
        f"model: Qwen2.5-VL text hidden {args.hidden}, {args.layers} layers, batch {args.batch}; "
        f"prefill (16 tokens) {prefill * 1e3:.3f} ms; generation step {step * 1e3:.3f} ms"
    )
    columns = ("decode us", "of step", "[NUM] path us", "of step")
    print(f"{'head':<10} {columns[0]:>10} {columns[1]:>8} {columns[2]:>14} {columns[3]:>8}  target")
    met = True
    for name, head in heads.items():
        with torch.no_grad():
            decode = best_time(lambda h=head: h.decode(hidden), args.repeats, inner=200)
        numeric = NumericLM(model, head, NUM)
        t_text = best_time(generate(1 + args.steps, numeric, force=False), args.repeats)
        t_num = best_time(generate(1 + args.steps, numeric, force=True), args.repeats)
        path = (t_num - t_text) / args.steps
        ok = decode / step <= TARGET
        met &= ok
        print(
            f"{name:<10} {decode * 1e6:>10.1f} {decode / step:>8.2%} {path * 1e6:>14.1f} "
            f"{path / step:>8.2%}  {'MET' if ok else 'MISSED'} (<= {TARGET:.0%})"
        )
    print(
        f"decode <= {TARGET:.0%} of a generation step for every head: {'MET' if met else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
