"""Benchmark: the demo model's inference on a real CT against its arithmetic floor.

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_inference.py [--study PATH] [--model DIR] [--threads 2]
                                         [--repeats 3] [--malloc-defaults]

``--study`` defaults to the shared real abdominal CT (``real-ct/ts_abdomen_dicom``, 20 slices of
512 x 512). The measurer (``CheckpointMeasurer``, the bundled demo by default) measures it once
to warm up, then ``--repeats`` times; the figure is the fastest run of ``measure()`` (model and
volume loading not included). As in ``radcaliper measure`` and a batch's measuring processes,
malloc keeps what inference frees (``app.heap``); ``--malloc-defaults`` leaves glibc's
defaults, to compare.

The floor is :func:`model.flops.generation_flops` of every prompt the model answered (collected
with ``NumericLM.subscribe``: prompt tokens, image grids, new tokens) divided by this machine's
matrix-multiply speed at the same thread count (the fastest of five 2048 x 2048 x 2048 float32
products). Target: inference <= 4 x the floor.

Run alone: timings beside another job are meaningless on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import load, machine

from app.heap import keep_freed_memory
from ingestion.load import load_path
from ingestion.volume import Modality
from model.flops import AnsweredRow, Flops, TextShape, VisionShape, answered_rows, generation_flops
from model.measurer.checkpoint.settings import default_checkpoint
from model.measurer.data.hybrid import shared_data_root
from model.measurer.infer.pipeline import CheckpointMeasurer
from model.numeric.hf import GenerateCall

TARGET = 4.0


def matmul_speed(size: int = 2048, repeats: int = 5) -> float:
    """Operations per second of the fastest of ``repeats`` float32 square products."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - began)
    return 2 * size**3 / best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", type=Path, default=None, help="a study (default: shared CT)")
    parser.add_argument("--model", type=Path, default=None, help="checkpoint (default: demo)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--malloc-defaults", action="store_true", help="leave glibc's malloc as it is"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    kept = False if args.malloc_defaults else keep_freed_memory()
    path = args.study or shared_data_root() / "real-ct" / "ts_abdomen_dicom" / "image.nii.gz"
    os.environ.setdefault("RADCALIPER_NIFTI_MODALITY", "CT")
    (volume,) = load_path(path, nifti_modality=Modality.CT).volumes
    measurer = CheckpointMeasurer.load(args.model or default_checkpoint())
    config = measurer.lm.model.config
    text = TextShape.of(config.get_text_config())
    vision = VisionShape.of(config.vision_config)
    rows: list[AnsweredRow] = []

    def observe(call: GenerateCall) -> None:
        prompt_length = call.input_ids.shape[1]
        rows.extend(
            answered_rows(
                call.attention_mask,
                call.generation.attention_mask[:, prompt_length:],
                call.input_ids == config.image_token_id,
                call.image_grid_thw,
                config.vision_config.spatial_merge_size,
            )
        )

    measurer.measure(volume, source="bench")  # warm-up
    unsubscribe = measurer.lm.subscribe(observe)
    measurer.measure(volume, source="bench")
    unsubscribe()
    flops: Flops = generation_flops(text, vision, rows)
    times = []
    for _ in range(args.repeats):
        began = time.perf_counter()
        result = measurer.measure(volume, source="bench")
        times.append(time.perf_counter() - began)
    speed = matmul_speed()
    floor = flops.seconds(speed)
    best = min(times)
    print(f"- command: `python benchmarks/bench_inference.py {' '.join(argv or sys.argv[1:])}`")
    print(f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load before: {load()}")
    print(f"- machine: {machine()}")
    print(f"- model: {measurer.info.name} {measurer.info.version}")
    print(f"- malloc keeps freed memory (app.heap): {'yes' if kept else 'no'}")
    print(f"- study: {path} ({volume.shape[0]} slices); {len(result.findings)} findings")
    print(
        f"- prompts: {len(rows)}; new tokens: {sum(r.new_tokens for r in rows)}; "
        f"matrix-multiply speed {speed / 1e9:.1f} GFLOP/s\n"
    )
    print("| | GFLOP | seconds |\n|---|---|---|")
    print(f"| vision | {flops.vision / 1e9:.2f} | |")
    print(f"| prefill | {flops.prefill / 1e9:.2f} | |")
    print(f"| decode | {flops.decode / 1e9:.2f} | |")
    print(f"| **floor** | **{flops.total / 1e9:.2f}** | **{floor:.3f}** |")
    print(f"| inference (fastest of {args.repeats}) | | {best:.3f} |")
    ratio = best / floor
    verdict = "MET" if ratio <= TARGET else "MISSED"
    print(f"\n{ratio:.2f} x the floor (target <= {TARGET:g} x): {verdict}")
    print(f"runs: {', '.join(f'{t:.2f}' for t in times)} s; load after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
