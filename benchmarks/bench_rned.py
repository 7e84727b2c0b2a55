"""The RNED comparison where the paper makes its claim: the measure task given the finding,
trained until validation stops improving, several seeds per numeric mode.

Modes: RNED with the paper's RND decoder at p in {0, 0.2, 0.3, 0.5}, RNED with the correlation
decoder, standard tokens (digits) and xVal; each at the same data, backbone (the demo's size),
batch, schedule and step cap, from scratch. Every run trains on measure crops only (no find or
point task; the finding's true centre, jittered as in training), is validated every
``--eval-every`` steps on held-out phantoms measured at their true centres, keeps its best
weights, and stops after ``--patience`` validations without improvement (or at ``--max-steps``);
the best weights are then scored on other held-out phantoms (the test set).

The validation score is the mean absolute error over every true value (lesion long and short
axes, vessel diameters), an unparsable answer counting as an error of the value's own size (as
if it had answered 0), so a mode cannot win by failing to answer.

Results go to ``--json`` after every run; a run already there is not repeated (stop and start
again to resume). Runs go seed by seed, every mode at a seed before the next seed, so a partial
file compares the modes at equal seeds. ``--summary`` prints the markdown table (mean and SD
over seeds per mode) of whatever the file holds.

    python benchmarks/bench_rned.py --json benchmarks/results/rned_converged.json \\
        --work runs/rned --seeds 0,1,2 --threads 2
    python benchmarks/bench_rned.py --json benchmarks/results/rned_converged.json --summary

Observes the product through public API only (``train``'s ``on_step`` report, ``measure_findings``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from model.measurer.checkpoint.settings import NumericMode
from model.measurer.data.sources import PhantomSource
from model.measurer.infer.inference import measure_findings
from model.measurer.inputs.data import MeasureExample, measure_example
from model.measurer.train.config import PoolSettings, Stage, StepReport, TrainConfig
from model.measurer.train.loop import train

logger = logging.getLogger("bench_rned")

MODES: dict[str, tuple[NumericMode, dict[str, Any]]] = {
    "rned_rnd_p0": (NumericMode.RNED_RND, {"p": 0.0}),
    "rned_rnd_p0.2": (NumericMode.RNED_RND, {"p": 0.2}),
    "rned_rnd_p0.3": (NumericMode.RNED_RND, {"p": 0.3}),
    "rned_rnd_p0.5": (NumericMode.RNED_RND, {"p": 0.5}),
    "rned_corr": (NumericMode.RNED_CORR, {}),
    "standard_tokens": (NumericMode.STANDARD, {}),
    "xval": (NumericMode.XVAL, {}),
}


class _Stop(Exception):
    """Validation stopped improving."""


def _held_out(
    seed: int, studies: int, config: TrainConfig
) -> tuple[list[MeasureExample], list[tuple[str, float]]]:
    """Measure crops at the true centres of ``studies`` phantoms of run seed ``seed``, and
    the (measurement, true value) pairs their answers are scored on, in order."""
    source = PhantomSource(seed)
    examples: list[MeasureExample] = []
    truths: list[tuple[str, float]] = []
    inputs = dataclasses.replace(config.measure_inputs, jitter_mm=0.0, jitter_z_mm=0.0)
    for index in range(studies):
        study = source.study(index)
        for finding in study.findings:
            examples.append(
                measure_example(study.volume, finding.center_lps_mm, finding.kind, inputs)
            )
            if finding.kind == "lesion":
                assert finding.long_axis_mm is not None and finding.short_axis_mm is not None
                truths += [
                    ("long_axis", finding.long_axis_mm),
                    ("short_axis", finding.short_axis_mm),
                ]
            else:
                assert finding.diameter_mm is not None
                truths.append(("diameter", finding.diameter_mm))
    return examples, truths


def _score(
    report: StepReport, examples: Sequence[MeasureExample], truths: Sequence[tuple[str, float]]
) -> dict[str, Any]:
    """MAE per measurement and overall (failures at their value's size), success rate."""
    lm, tokenizer = report.lm, report.tokenizer
    assert lm is not None and tokenizer is not None
    was = lm.training
    lm.eval()
    try:
        outcomes = measure_findings(lm, tokenizer, examples, batch_size=64)
    finally:
        lm.train(was)
    errors: dict[str, list[float]] = {"long_axis": [], "short_axis": [], "diameter": []}
    penalised: list[float] = []
    answered = 0
    at = 0
    for outcome in outcomes:
        values = [m.value_mm for m in outcome.measurements]
        ok = outcome.parsed and all(v is not None for v in values)
        answered += ok
        count = 2 if truths[at][0] == "long_axis" else 1
        for k in range(count):
            name, truth = truths[at + k]
            if ok:
                error = abs(float(values[k]) - truth)  # type: ignore[arg-type]
                errors[name].append(error)
                penalised.append(error)
            else:
                penalised.append(truth)
        at += count
    return {
        "score": statistics.fmean(penalised),
        "success": answered / len(outcomes),
        "mae": {k: (statistics.fmean(v) if v else None) for k, v in errors.items()},
        "mae_all": statistics.fmean([e for v in errors.values() for e in v])
        if any(errors.values())
        else None,
    }


def _config(mode: str, seed: int, args: argparse.Namespace) -> TrainConfig:
    numeric_mode, extra = MODES[mode]
    return TrainConfig(
        seed=seed,
        numeric_mode=numeric_mode,
        stages=(Stage("measure", args.max_steps, 1e-3, sigma=(3.0, 0.5), warmup_steps=200),),
        measure_batch=args.batch,
        find_batch=0,
        point_batch=0,
        axes_batch=0,
        pool=PoolSettings(size=300, initial=120, studies_per_step=0.25),
        checkpoint_every=args.max_steps + 1,
        threads=args.threads,
        head_extra=extra,
    )


def _run(mode: str, seed: int, args: argparse.Namespace, sets: dict[str, Any]) -> dict[str, Any]:
    config = _config(mode, seed, args)
    best: dict[str, Any] = {"score": math.inf}
    history: list[tuple[int, float]] = []
    since = 0
    kept: dict[str, Any] = {}
    began = time.monotonic()

    def on_step(report: StepReport) -> None:
        nonlocal since
        kept["report"] = report
        if report.step % args.eval_every:
            return
        scored = _score(report, *sets["val"])
        history.append((report.step, round(scored["score"], 3)))
        logger.info(
            "%s seed %d step %d: validation %.3f mm (success %.2f)",
            mode,
            seed,
            report.step,
            scored["score"],
            scored["success"],
        )
        if scored["score"] < best["score"]:
            assert report.lm is not None
            best.update(
                scored,
                step=report.step,
                state={k: v.detach().clone() for k, v in report.lm.state_dict().items()},
            )
            since = 0
        else:
            since += 1
            if since >= args.patience:
                raise _Stop

    stopped = "cap"
    try:
        train(
            config,
            args.work / f"{mode}-s{seed}",
            PhantomSource(1000 + seed),
            name="rned-compare",
            on_step=on_step,
            resume=False,
        )
    except _Stop:
        stopped = "patience"
    report = kept["report"]
    assert report.lm is not None
    report.lm.load_state_dict(best["state"])
    test = _score(report, *sets["test"])
    return {
        "mode": mode,
        "seed": seed,
        "best_step": best["step"],
        "steps_run": report.step,
        "stopped": stopped,
        "validation": round(best["score"], 3),
        "test": test,
        "history": history,
        "seconds": round(time.monotonic() - began, 1),
    }


def _stat(values: Sequence[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {sd:.2f}"


def _summary(results: Sequence[dict[str, Any]]) -> str:
    rows = [
        "| mode | seeds | test score mm (mean ± SD) | long axis MAE | short axis MAE | diameter MAE"
        " | answered | best step (mean) | stopped by patience |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        runs = [r for r in results if r["mode"] == mode]
        if not runs:
            continue
        mae = {
            name: [r["test"]["mae"][name] for r in runs if r["test"]["mae"][name] is not None]
            for name in ("long_axis", "short_axis", "diameter")
        }
        cells = [
            mode,
            str(len(runs)),
            _stat([r["test"]["score"] for r in runs]),
            _stat(mae["long_axis"]),
            _stat(mae["short_axis"]),
            _stat(mae["diameter"]),
            _stat([r["test"]["success"] for r in runs]),
            f"{statistics.fmean([r['best_step'] for r in runs]):.0f}",
            f"{sum(r['stopped'] == 'patience' for r in runs)}/{len(runs)}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--json", type=Path, required=True, help="results file (read, then appended to)"
    )
    parser.add_argument(
        "--work", type=Path, default=Path("runs/rned"), help="scratch folder for the runs"
    )
    parser.add_argument("--seeds", default="0,1,2", help="training seeds (default 0,1,2)")
    parser.add_argument("--modes", default=",".join(MODES), help="modes to run (default all)")
    parser.add_argument(
        "--max-steps", type=int, default=6000, help="step cap per run (default 6000)"
    )
    parser.add_argument(
        "--eval-every", type=int, default=250, help="validate every N steps (default 250)"
    )
    parser.add_argument(
        "--patience",
        type=int,
        default=4,
        help="validations without improvement before stopping (default 4)",
    )
    parser.add_argument("--batch", type=int, default=32, help="measure crops per step (default 32)")
    parser.add_argument(
        "--val", type=int, default=40, help="validation phantoms, run seed 2027 (default 40)"
    )
    parser.add_argument(
        "--test", type=int, default=100, help="test phantoms, run seed 2029 (default 100)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--summary", action="store_true", help="print the table of --json and stop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    results: list[dict[str, Any]] = json.loads(args.json.read_text()) if args.json.is_file() else []
    if args.summary:
        sys.stdout.write(_summary(results) + "\n")
        return 0
    torch.set_num_threads(args.threads)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    probe = _config(modes[0], 0, args)
    sets = {"val": _held_out(2027, args.val, probe), "test": _held_out(2029, args.test, probe)}
    logger.info("validation: %d crops; test: %d crops", len(sets["val"][0]), len(sets["test"][0]))
    done = {(r["mode"], r["seed"]) for r in results}
    for seed in (int(s) for s in args.seeds.split(",")):
        for mode in modes:
            if (mode, seed) in done:
                continue
            result = _run(mode, seed, args, sets)
            results.append(result)
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")
            logger.info(
                "%s seed %d: test %.3f mm, best step %d (%s)",
                mode,
                seed,
                result["test"]["score"],
                result["best_step"],
                result["stopped"],
            )
    sys.stdout.write(_summary(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
