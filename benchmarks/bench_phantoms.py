"""Benchmark: seconds per phantom study at the largest size of the spec (288 x 288 x 60).

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_phantoms.py [--n 10] [--seed 0] [--no-nifti] [--out DIR]

For each of ``--n`` studies (seeds ``study_seed(seed, i)``, the spec with the matrix fixed at 288
and the slice count at 60, every other range as in the spec) it times, with
``time.perf_counter`` in this one process: ``generate_phantom`` (layout, partial volume, noise),
``write_dicom`` (60 files) and ``write_nifti`` (``image.nii.gz``). Files go to a temporary folder
(or ``--out``, which must not exist) that is removed afterwards unless ``--out`` was given. The
first study is a warm-up and is not counted (imports, first-touch page faults).

Prints one line per stage and the total: mean and max seconds per study. Target: <= 1 s per
study for generate + DICOM (the NIfTI write is reported on its own line and in a second total).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ingestion.phantoms import PhantomSpec, generate_phantom, study_seed, write_dicom, write_nifti

LARGEST = PhantomSpec(matrix_size=(288, 288), slice_count=(60, 60))
TARGET_S = 1.0


def _run(out: Path, n: int, seed: int, nifti: bool) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"generate": [], "write_dicom": [], "write_nifti": []}
    for i in range(n + 1):  # study 0 warms up
        folder = out / f"study_{i:04d}"
        t0 = time.perf_counter()
        phantom = generate_phantom(study_seed(seed, i), LARGEST)
        t1 = time.perf_counter()
        write_dicom(phantom, folder / "dicom")
        t2 = time.perf_counter()
        if nifti:
            write_nifti(phantom, folder / "image.nii.gz")
        t3 = time.perf_counter()
        if i == 0:
            continue
        times["generate"].append(t1 - t0)
        times["write_dicom"].append(t2 - t1)
        if nifti:
            times["write_nifti"].append(t3 - t2)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10, help="studies to time (after one warm-up)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-nifti", action="store_true", help="skip the NIfTI write")
    parser.add_argument("--out", type=Path, default=None, help="keep the files here")
    args = parser.parse_args()
    nifti = not args.no_nifti
    if args.out is not None:
        if args.out.exists():
            parser.error(f"{args.out} exists; give a new folder")
        times = _run(args.out, args.n, args.seed, nifti)
    else:
        with tempfile.TemporaryDirectory(prefix="bench_phantoms_") as tmp:
            times = _run(Path(tmp), args.n, args.seed, nifti)

    print(
        f"bench_phantoms: {args.n} studies of 288 x 288 x 60, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}"
    )
    for stage, values in times.items():
        if values:
            print(
                f"  {stage:<12} mean {statistics.fmean(values):.3f} s/study, "
                f"max {max(values):.3f} s"
            )
    core = [g + d for g, d in zip(times["generate"], times["write_dicom"], strict=True)]
    verdict = "OK" if statistics.fmean(core) <= TARGET_S else "OVER TARGET"
    print(
        f"  generate + DICOM:        mean {statistics.fmean(core):.3f} s/study, "
        f"max {max(core):.3f} s (target <= {TARGET_S:g} s: {verdict})"
    )
    if nifti:
        full = [c + w for c, w in zip(core, times["write_nifti"], strict=True)]
        print(
            f"  generate + DICOM + NIfTI: mean {statistics.fmean(full):.3f} s/study, "
            f"max {max(full):.3f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
