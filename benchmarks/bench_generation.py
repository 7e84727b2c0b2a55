"""Benchmark: cost of decoding one [NUM] value vs one generation step of a tiny model.

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_generation.py [--threads 1] [--steps 64] [--repeats 15]
                                          [--batch 1] [--hidden 64] [--layers 2]
                                          [--model DIR]

Model: the tiny random Qwen2.5-VL of ``tests/support/models.py`` (hidden 64, 2 layers,
4 heads / 2 kv heads, vocabulary 300, float32, sdpa, eval); ``--hidden`` / ``--layers`` scale the
text model (heads stay 4 / 2). Nothing is downloaded. ``--threads N`` sets torch's threads and,
before NumPy loads, ``OPENBLAS_NUM_THREADS`` (the codec's small-batch decode path runs in NumPy),
so ``--threads 1`` is a one-thread measurement throughout; it is the primary figure.

Timing: ``time.perf_counter`` in this process, after warm-up. The machine is shared, so every
quantity is measured once per round, the rounds interleave all of them (``--repeats`` rounds),
and each figure is the fastest round: other processes only ever add time, and a slow phase of
the machine hits the step and the decodes alike instead of only whichever ran during it.

- Generation step: ``NumericLM.generate`` in standard mode (no head), a 16-token text prompt,
  ``(t(1 + steps) - t(1)) / steps``: the prefill is subtracted, what remains is the per-token
  loop (model call with the KV cache, lm_head, argmax, next embedding, bookkeeping).
- Decode: ``head.decode(hidden)`` on one (1, D) float32 hidden state, which is what the loop
  calls for each step in which a row emits [NUM]; the mean over 16 hidden states of each kind:

  * ``untrained``: the untrained model's own final-norm hidden states (the lm_head inputs) at the
    16 prompt positions. They carry no value: for RNED ``corr`` the coarse-to-fine certificate
    mostly fails and the exact full search runs (the ``certified`` column counts the rows it
    certified).
  * ``trained``: what a trained model would feed: the head's own embedding of a value
    (``head.embed``, 16 values spread over its range) plus Gaussian noise at 20 dB SNR, re-normed
    to an RMS of 1 per element like the output of the final RMSNorm (a freshly initialised
    Qwen2.5-VL's, unit weight: |h| = sqrt(D)), instead of the embedding scale (RMS ~ 0.02).
    The correlation decoder is scale-free and RND's cost does not depend on the scale; the
    re-norm only keeps the input realistic. At 20 dB every row is certified.

  Heads: RNED ``rnd`` (sorted-score binary search), RNED ``corr`` (correlation argmax, certified
  coarse-to-fine with an exact full-search fallback), xVal (MLP); RNED on the default grid
  ``[0, 3000]`` step 0.1 (30,001 candidates).
- [NUM] path in the loop: ``NumericLM.generate`` with the head, once with a logits processor that
  forces [NUM] at every step and once with one that bans it, ``(t_num - t_text) / steps``:
  everything a [NUM] adds to a step (decode of the untrained model's hidden state, ``embed`` of
  the value, scatter, bookkeeping). The decode column is timed back to back, with warm caches;
  inside the loop each [NUM] runs between model calls that evict its code and tables, so its
  share of this column is larger than the decode column.

``--model DIR``: a trained measurer checkpoint instead (e.g. the bundled demo,
``model/weights/radcaliper-demo``): its own Circle-RoPE Qwen2.5-VL times the generation step
(the same 16-token text prompt from its own vocabulary) and its own head decodes ``real``
hidden states: the final-norm states at which it said [NUM] while measuring held-out phantoms
(captured from ``head.decode``'s input), 16 of them.

Target (printed as MET / MISSED): decode <= 2 % of a tiny-model generation step, per head and
hidden-state kind.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # NumPy's OpenBLAS reads its thread count once, when it loads
    for i, arg in enumerate(sys.argv[:-1]):
        if arg == "--threads" and sys.argv[i + 1].isdigit() and int(sys.argv[i + 1]) > 0:
            os.environ["OPENBLAS_NUM_THREADS"] = sys.argv[i + 1]

import argparse
import math
import platform
import time
from collections.abc import Callable
from unittest.mock import patch

import torch
import transformers
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from model.backbone import tiny_qwen2_5_vl_kwargs
from model.numeric import _small_grid
from model.numeric.codec import RotaryNumberCodec
from model.numeric.hf import NumericLM
from model.numeric.protocol import NumericHead
from model.numeric.rned_head import RnedHead
from model.numeric.xval import XValHead

TARGET = 0.02  # decode / step
BOS, EOS, PAD, NUM = 1, 2, 0, 3
STATES = 16  # hidden states per kind
SNR_DB = 20.0


def tiny_model(hidden: int, layers: int) -> Qwen2_5_VLForConditionalGeneration:
    kwargs = tiny_qwen2_5_vl_kwargs(
        hidden_size=hidden,
        num_layers=layers,
        special_ids={"bos": BOS, "eos": EOS, "pad": PAD},
    )
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**kwargs)).eval()


def timed(fn: Callable[[], object], inner: int = 1) -> float:
    """Seconds per call of ``fn``, over ``inner`` calls."""
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def untrained_states(lm: NumericLM, prompt: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The untrained model's final-norm hidden states at the prompt's positions, (P, D)."""
    embeds, positions = lm.prepare_inputs(prompt[:1], mask[:1], None, None, None)
    with torch.no_grad():
        _, hidden, _ = lm.run_model(embeds, mask[:1], positions)
    return hidden[0].float()


def trained_states(head: NumericHead, lo: float, hi: float) -> torch.Tensor:
    """The head's embeddings of STATES values in [lo, hi] plus 20 dB noise, RMS 1, (STATES, D)."""
    values = torch.linspace(lo, hi, STATES + 2, dtype=torch.float64)[1:-1]
    values = (values * 10).round() / 10  # on the 0.1 grid
    clean = head.embed(values).double()  # (S, D)
    generator = torch.Generator().manual_seed(0)
    power = clean.square().mean(-1, keepdim=True) / 10 ** (SNR_DB / 10)  # per element
    noise = torch.randn(clean.shape, generator=generator, dtype=torch.float64)
    noisy = clean + noise * power.sqrt()
    return (noisy / noisy.square().mean(-1, keepdim=True).sqrt()).float()


def certified(head: NumericHead, states: torch.Tensor) -> str:
    """How many rows the correlation decoder certified at once ("-" for other heads): on a small
    grid the dense cells of ``model.numeric._small_grid`` (one round of fine scores), else the
    wide-cell coarse-to-fine."""
    if not isinstance(head, RnedHead) or head.method != "corr":
        return "-"
    codec = head.codec
    if codec._host is not None and codec._host.dense is not None:
        at_once = 0
        with patch.object(_small_grid, "_scores", wraps=_small_grid._scores) as spy:
            for row in states:
                before = spy.call_count
                codec.decode(row[None], "corr")
                at_once += spy.call_count - before == 1
        return f"{at_once}/{states.shape[0]}"
    alpha, beta = codec._alpha_beta(states.double())
    return f"{int(codec._corr_search(alpha, beta)[1].sum())}/{states.shape[0]}"


def checkpoint_states(directory: str) -> tuple[torch.nn.Module, NumericHead, int, torch.Tensor]:
    """A checkpoint's model, its head, its [NUM] id, and STATES real hidden states at which it
    said [NUM] while measuring held-out phantoms (run seed 4242)."""
    from model.measurer.data.sources import PhantomSource
    from model.measurer.infer.pipeline import CheckpointMeasurer

    measurer = CheckpointMeasurer.load(directory, device="cpu")
    head = measurer.lm.numeric_head
    if head is None:
        raise SystemExit(f"{directory} has no numeric head (standard tokens): nothing to time")
    captured: list[torch.Tensor] = []
    original = head.decode

    def recording(hidden: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        captured.extend(
            row.detach().float().clone() for row in hidden.reshape(-1, hidden.shape[-1])
        )
        return original(hidden, *args, **kwargs)

    head.decode = recording  # type: ignore[method-assign]
    source = PhantomSource(4242)
    study = 0
    while len(captured) < STATES and study < 20:
        phantom = source.study(study)
        measurer.measure(phantom.volume, source=phantom.name)
        study += 1
    head.decode = original  # type: ignore[method-assign]
    if len(captured) < STATES:
        raise SystemExit(f"only {len(captured)} [NUM] states in {study} studies")
    step = max(1, len(captured) // STATES)
    return measurer.lm.model, head, measurer.ids["num"], torch.stack(captured[::step][:STATES])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=64, help="generated tokens per timing")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--batch", type=int, default=1, help="rows generated together")
    parser.add_argument("--hidden", type=int, default=64, help="text hidden size")
    parser.add_argument("--layers", type=int, default=2, help="text decoder layers")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--model", default=None, help="a trained checkpoint (real states)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    num_id = NUM
    if args.model:
        model, own_head, num_id, real = checkpoint_states(args.model)
        args.hidden = int(real.shape[-1])
        args.layers = int(model.config.text_config.num_hidden_layers)
    else:
        model = tiny_model(args.hidden, args.layers)
    lm = NumericLM(model, None, None)
    prompt = torch.tensor([[BOS, *range(10, 25)]] * args.batch)  # (B, 16)
    mask = torch.ones_like(prompt)

    def generate(n: int, numeric: NumericLM = lm, force: bool = False) -> Callable[[], object]:
        def process(_: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            scores[:, num_id] = 1e9 if force else float("-inf")
            return scores

        return lambda: numeric.generate(
            prompt, mask, max_new_tokens=n, eos_token_id=[], logits_processor=process
        )

    lo, hi = 0.0, 3000.0
    heads: dict[str, NumericHead] = {
        "rned_rnd": RnedHead(RotaryNumberCodec(args.hidden, lo=lo, hi=hi), method="rnd"),
        "rned_corr": RnedHead(RotaryNumberCodec(args.hidden, lo=lo, hi=hi), method="corr"),
        "xval": XValHead(args.hidden, lo=lo, hi=hi),
    }
    untrained = untrained_states(lm, prompt, mask)  # (16, D)
    states = {
        (name, kind): rows
        for name, head in heads.items()
        for kind, rows in (("untrained", untrained), ("trained", trained_states(head, lo, hi)))
    }
    if args.model:  # the checkpoint's own head on its own states
        heads = {"checkpoint": own_head}
        states = {("checkpoint", "real"): real}

    # every timed quantity once per round, rounds interleaved; the fastest round of each counts
    timings: dict[str, Callable[[], float]] = {
        "prefill": lambda: timed(generate(1)),
        "total": lambda: timed(generate(1 + args.steps)),
    }
    for (name, kind), rows in states.items():
        head, calls = heads[name], [row[None] for row in rows]  # one (1, D) state per call

        def decode_all(h: NumericHead = head, calls: list[torch.Tensor] = calls) -> None:
            for row in calls:
                h.decode(row)

        inner = 2 if name == "rned_corr" and kind == "untrained" else 20
        timings[f"{name}/{kind}"] = lambda f=decode_all, i=inner: timed(f, i) / STATES
    for name, head in heads.items():
        numeric = NumericLM(model, head, num_id)
        timings[f"{name}/text"] = lambda n=numeric: timed(generate(1 + args.steps, n))
        timings[f"{name}/num"] = lambda n=numeric: timed(generate(1 + args.steps, n, force=True))

    best = dict.fromkeys(timings, math.inf)
    with torch.no_grad():
        for fn in timings.values():  # warm-up
            fn()
        for _ in range(args.repeats):
            for key, fn in timings.items():
                best[key] = min(best[key], fn())
    step = (best["total"] - best["prefill"]) / args.steps

    print(
        f"python {platform.python_version()}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {torch.get_num_threads()} torch threads, "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
        f"{platform.processor() or platform.machine()}"
    )
    print(
        f"model: Qwen2.5-VL text hidden {args.hidden}, {args.layers} layers, batch {args.batch}; "
        f"prefill (16 tokens) {best['prefill'] * 1e3:.3f} ms; generation step {step * 1e3:.3f} ms; "
        f"fastest of {args.repeats} interleaved rounds"
    )
    print(f"{'head':<10} {'hidden':<10} {'decode us':>10} {'of step':>8} {'certified':>10}  target")
    met = {kind: True for _, kind in states}
    for (name, kind), rows in states.items():
        decode = best[f"{name}/{kind}"]
        ok = decode / step <= TARGET
        met[kind] &= ok
        print(
            f"{name:<10} {kind:<10} {decode * 1e6:>10.1f} {decode / step:>8.2%} "
            f"{certified(heads[name], rows):>10}  {'MET' if ok else 'MISSED'} "
            f"(<= {TARGET:.0%})"
        )
    print("[NUM] path per step (decode of the model's own state + embed + scatter + bookkeeping):")
    for name in heads:
        path = (best[f"{name}/num"] - best[f"{name}/text"]) / args.steps
        print(f"  {name:<10} {path * 1e6:>8.1f} us {path / step:>8.2%} of a step")
    for kind, ok in met.items():
        print(
            f"decode <= {TARGET:.0%} of a generation step for every head, {kind} hidden states: "
            f"{'MET' if ok else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
