"""Benchmark: where the time goes on a full-size CT (512 x 512 x 300) on this machine's CPU.

No 300-slice study with a licence to use is at hand, so the volume is built from the shared real
abdominal CT (``real-ct/ts_abdomen_dicom``, 20 slices of 512 x 512): its slices repeated back
and forth to 300 and given 1 mm spacing. The anatomy repeats and is stretched along z: only the
timing means something. The measurer runs through its stages with the trace hook subscribed,
and the table gives each stage's seconds and prompts (find prompts carry one image of
``size / 28`` squared merged tokens; the others one measure crop).

Usage::

    python benchmarks/bench_real_speed.py [--model DIR] [--slices 300] [--threads 2]
        [--single-pass] [--plane-mm 2.0]

Run alone: timings beside another job are meaningless on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ingestion.geometry import Geometry
from ingestion.load import load_path
from ingestion.volume import Modality, Volume
from model.measurer.checkpoint.settings import default_checkpoint
from model.measurer.data.hybrid import shared_data_root
from model.measurer.infer.pipeline import CheckpointMeasurer
from model.measurer.infer.state import InferenceOptions, TraceEvent
from model.measurer.inputs.voting import FindVoting


def full_size_volume(slices: int, shared: Path | None = None) -> Volume:
    """The real abdominal CT's slices repeated back and forth to ``slices``, 1 mm apart."""
    path = shared_data_root(shared) / "real-ct" / "ts_abdomen_dicom" / "image.nii.gz"
    os.environ.setdefault("RADCALIPER_NIFTI_MODALITY", "CT")
    (volume,) = load_path(path, nifti_modality=Modality.CT).volumes
    n = volume.shape[0]
    cycle = np.arange(slices) % (2 * n)
    order = np.where(cycle < n, cycle, 2 * n - 1 - cycle)  # 0..n-1, n-1..0, 0..
    voxels = np.ascontiguousarray(volume.voxels[order])
    g = volume.geometry
    geometry = Geometry(
        g.origin, g.row_direction, g.column_direction, g.slice_direction, (1.0, *g.spacing[1:])
    )
    return Volume.in_memory(voxels, geometry, name=f"{path} x{slices / n:.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--slices", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--single-pass", action="store_true", help="one find pass, no voting")
    parser.add_argument("--plane-mm", type=float, default=2.0, help="find planes this far apart")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    volume = full_size_volume(args.slices)
    options = InferenceOptions(
        find_plane_mm=args.plane_mm,
        find_voting=FindVoting(((0, 0),), votes=1) if args.single_pass else None,
    )
    measurer = CheckpointMeasurer.load(args.model or default_checkpoint(), options=options)
    events: list[TraceEvent] = []
    began = time.perf_counter()
    result = measurer.measure(volume, source="bench", trace=events.append)
    total = time.perf_counter() - began
    find = measurer.settings.find_inputs
    voting = options.find_voting or measurer.settings.find_voting
    print(f"- command: `python benchmarks/bench_real_speed.py {' '.join(argv or sys.argv[1:])}`")
    print(f"- model: {measurer.info.name} {measurer.info.version}; torch threads {args.threads}")
    print(
        f"- volume: {volume.shape[1]} x {volume.shape[2]} x {volume.shape[0]} "
        f"({volume.geometry.spacing[1]:.2f} mm pixels, 1 mm slices); find: {args.plane_mm:g} mm "
        f"planes, {len(voting.shifts)} pass(es), {(find.size // 28) ** 2} image tokens per tile"
    )
    print(f"- total {total:.1f} s; {len(result.findings)} findings reported\n")
    print("| stage | seconds | prompts | candidates after |\n|---|---|---|---|")
    for e in events:
        print(f"| {e.stage} | {e.seconds:.1f} | {e.prompts} | {len(e.state.candidates)} |")
    print(f"| **total** | **{total:.1f}** | **{sum(e.prompts for e in events)}** | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
