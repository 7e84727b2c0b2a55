"""The device check (issue 24): a real Qwen2.5-VL shape trained and measuring on a lent GPU.

Run through ``benchmarks/gpu_check.sh`` (which sets up the machine); the steps, each timed:

1. **build**: a Qwen2.5-VL directory with random weights at the published 3B shape
   (``model.measurer.checkpoint.base.write_random_base_model``: no weights can be downloaded),
   saved in bfloat16 as released;
2. **train**: ``radcaliper``'s own ``train`` on it, ``--steps`` LoRA steps (rank 128, alpha
   256, the projector and numeric head trained too) on phantom studies, the default batches:
   seconds per step (the first, warm-up, step left out), peak GPU memory, and the seconds
   spent loading the model and saving the checkpoint (today: full weights and optimizer state);
3. **measure**: the saved checkpoint loaded as a site would (``CheckpointMeasurer``, bfloat16
   on a GPU) and ``--studies`` phantom studies measured: seconds per study (the first left
   out). With random weights every answer runs to its token cap, so this is the slow end of
   inference, not a typical study. Measuring stops early after ``--measure-budget-s``; the line
   says how many studies fitted;
4. **tests**: the ``gpu``-marked tests (``pytest -m gpu``), on a GPU only (run first; warnings
   are shown, not raised: the machine's torch is not the one the suite pins).

It ends with one line of figures (``gpu_check: ...``), also written to ``--json``. Without a GPU
(``--narrow``, the CPU fallback that the suite runs) every step runs at the same shape with
narrow widths and depths, in float32.

Usage::

    python benchmarks/gpu_check.py --shape 3b --work /tmp/gpu-check --json gpu_check.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ingestion.phantoms import generate_phantom, study_seed
from model.backbone import QWEN2_5_VL_SHAPES
from model.measurer.checkpoint.base import write_random_base_model
from model.measurer.data.sources import PhantomSource
from model.measurer.infer.pipeline import CheckpointMeasurer
from model.measurer.inputs.data import phantom_volume
from model.measurer.train.config import PoolSettings, Stage, StepReport, TrainConfig
from model.measurer.train.loop import train
from model.measurer.train.memory import estimate_training_memory, model_shape

logger = logging.getLogger("gpu_check")

ROOT = Path(__file__).resolve().parents[1]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(QWEN2_5_VL_SHAPES), default="3b")
    parser.add_argument(
        "--narrow", action="store_true", help="the shape's layout at narrow widths (CPU fallback)"
    )
    parser.add_argument("--steps", type=int, default=20, help="LoRA training steps (default 20)")
    parser.add_argument("--studies", type=int, default=20, help="phantom studies to measure")
    parser.add_argument(
        "--measure-budget-s",
        type=float,
        default=120.0,
        help="stop measuring after this many seconds (default 120)",
    )
    parser.add_argument(
        "--batch", type=int, help="examples per task per step (default: the training defaults)"
    )
    parser.add_argument("--work", type=Path, required=True, help="a scratch directory")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--no-tests", action="store_true", help="skip the gpu-marked tests (on a GPU)"
    )
    return parser


def _peak_gib(device: torch.device) -> float | None:
    """Peak GPU memory allocated since the last reset, GiB (None on a CPU)."""
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2)


def _train(base: Path, out: Path, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    config = TrainConfig.for_base_model(
        str(base),
        steps=args.steps,
        seed=0,
        pool=PoolSettings(size=8, initial=8, studies_per_step=0.0, planes_per_study=2),
        checkpoint_every=args.steps,
    )
    if args.batch is not None:
        config = dataclasses.replace(
            config,
            measure_batch=args.batch,
            find_batch=args.batch,
            point_batch=args.batch,
            axes_batch=args.batch,
        )
    lora = config.stages[-1]  # the LoRA stage alone, at the documented learning rate and sigma
    config = dataclasses.replace(
        config, stages=(Stage("lora", args.steps, lora.lr, trainable="lora", sigma=lora.sigma),)
    )
    ends: list[float] = []
    parameters: list[int] = []
    began = time.monotonic()

    def on_step(report: StepReport) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ends.append(time.monotonic())
        if not parameters and report.lm is not None:
            weights = list(report.lm.parameters())
            parameters.append(sum(int(p.numel()) for p in weights))
            parameters.append(sum(int(p.numel()) for p in weights if p.requires_grad))
        logger.info("step %d/%d: loss %.3f", report.step, report.total, report.loss)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    train(config, out, PhantomSource(7), on_step=on_step, device=device, name="gpu-check")
    done = time.monotonic()
    steps = [b - a for a, b in itertools.pairwise(ends)]
    return {
        "parameters": parameters[0],
        "trainable": parameters[1],
        "steps": len(ends),
        "s_per_step": round(sum(steps) / len(steps), 3) if steps else None,
        "first_step_s": round(ends[0] - began, 1),  # loading, pool, first step
        "save_s": round(done - ends[-1], 1),
        "peak_gib": _peak_gib(device),
        # what `radcaliper train --dry-run` estimates for this run (allocated, no reserve)
        "estimated_gib": round(
            estimate_training_memory(
                config, model_shape(config), weights_dtype=config.resolved_weights_dtype("cuda")
            ).allocated
            / 2**30,
            2,
        ),
        "checkpointing": config.gradient_checkpointing,
        "weights_dtype": config.resolved_weights_dtype(device.type),
        "checkpoint_mib": round(
            sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 2**20, 1
        ),
    }


def _measure(out: Path, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    began = time.monotonic()
    measurer = CheckpointMeasurer.load(out, device=device)
    loaded = time.monotonic()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times: list[float] = []
    findings = 0
    for index in range(args.studies):
        volume = phantom_volume(generate_phantom(study_seed(2026, index)))
        start = time.monotonic()
        result = measurer.measure(volume, source="phantom")
        times.append(time.monotonic() - start)
        findings += len(result.findings)
        logger.info("study %d: %.1f s, %d findings", index, times[-1], len(result.findings))
        if time.monotonic() - loaded > args.measure_budget_s:
            break
    steady = times[1:] or times
    return {
        "load_s": round(loaded - began, 1),
        "studies": len(times),
        "s_per_study": round(sum(steady) / len(steady), 2),
        "first_study_s": round(times[0], 1),
        "findings": findings,
        "prompts": measurer.prompts_answered,
        "peak_gib": _peak_gib(device),
    }


def _gpu_tests() -> str:
    """The ``gpu``-marked tests' summary line (``3 passed in 20.1s``)."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"),
            *(
                "-W",
                "default",
                "tests/model/numeric/test_gpu.py",
                "tests/model/numeric/test_codec.py",
            ),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    sys.stdout.write(done.stdout[-4000:])
    sys.stderr.write(done.stderr[-2000:])
    lines = [line for line in done.stdout.splitlines() if re.search(r"passed|failed|error", line)]
    return lines[-1].strip("= ") if lines else f"pytest exit {done.returncode}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.narrow:
        logger.error(
            "no GPU here: the full %s shape needs one; pass --narrow (gpu_check.sh --tiny)",
            args.shape,
        )
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    import transformers

    figures: dict[str, Any] = {
        "device": name,
        "shape": args.shape + (" narrow" if args.narrow else ""),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    began = time.monotonic()
    if device.type == "cuda" and not args.no_tests:  # first: they take a minute, the rest more
        figures["gpu_tests"] = _gpu_tests()
        logger.info("gpu tests: %s", figures["gpu_tests"])
    built = time.monotonic()
    base = write_random_base_model(
        args.work / "base", args.shape, narrow=args.narrow, seed=0, device=device
    )
    figures["build_s"] = round(time.monotonic() - built, 1)
    logger.info("built %s in %.1f s", base, figures["build_s"])
    figures["train"] = _train(base, args.work / "trained", args, device)
    logger.info("train: %s", figures["train"])
    figures["measure"] = _measure(args.work / "trained", args, device)
    logger.info("measure: %s", figures["measure"])
    figures["total_s"] = round(time.monotonic() - began, 1)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    t, m = figures["train"], figures["measure"]
    print(
        f"gpu_check: {name} | Qwen2.5-VL {figures['shape']} random-init, "
        f"{t['parameters'] / 1e9:.2f} B parameters ({t['trainable'] / 1e6:.1f} M trainable) | "
        f"train {t['steps']} LoRA steps ({t['weights_dtype']} weights, checkpointing "
        f"{'on' if t['checkpointing'] else 'off'}): {t['s_per_step']} s/step, peak "
        f"{t['peak_gib']} GiB (estimated {t['estimated_gib']}), save {t['save_s']} s, "
        f"checkpoint {t['checkpoint_mib']} MiB | measure: load {m['load_s']} s, "
        f"{m['s_per_study']} s/study "
        f"({m['studies']} phantoms, {m['prompts']} prompts), peak {m['peak_gib']} GiB | "
        f"gpu tests: {figures.get('gpu_tests', 'not run')} | total {figures['total_s']} s | "
        f"torch {figures['torch']}, transformers {figures['transformers']}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
