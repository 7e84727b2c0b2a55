"""Train and score a click model (issue 44's experiments): the view that fits the lesion.

    python benchmarks/experiments/click_caliper.py train OUT --dataset DIR [--steps N]
    python benchmarks/experiments/click_caliper.py score MODEL --dataset DIR --side validation

Trains on the dataset's train side only (``ingestion.dataset.split``); scores with the click
evaluation (``app.evaluation.clicks``) beside the baseline.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

logger = logging.getLogger("click_caliper")


def _train(args: argparse.Namespace) -> None:
    from ingestion.dataset.format import read_dataset
    from ingestion.dataset.split import Side, select_side
    from model.measurer.data.reads import ReadsClicks
    from model.measurer.inputs.view import LesionView
    from model.measurer.train.clicks import ClickTrainConfig, train_click_model

    data = select_side(read_dataset(args.dataset), Side.TRAIN)
    view = LesionView()
    began = time.monotonic()
    examples = ReadsClicks.from_dataset(data, view)
    if args.hybrid:
        from model.measurer.data.hybrid import HybridSource, choose_backgrounds, shared_data_root
        from model.measurer.data.reads import hybrid_lesions

        held = tuple(h for h in args.hold_out.split(",") if h)
        source = HybridSource(choose_backgrounds(shared_data_root()), args.seed, held_out=held)
        extra = hybrid_lesions(source, range(args.hybrid))
        logger.info("%d hybrid lesions from %d studies", len(extra), args.hybrid)
        examples = ReadsClicks([*examples.lesions, *extra], view)
    logger.info("%d lesions loaded in %.0f s", len(examples.lesions), time.monotonic() - began)
    config = ClickTrainConfig(
        steps=args.steps,
        lr=args.lr,
        axes_batch=args.axes_batch,
        point_batch=args.point_batch,
        seed=args.seed,
        view=view,
    )

    def report(step: object) -> None:
        s = step
        if s.step % 50 == 0 or s.step == s.total:  # type: ignore[attr-defined]
            logger.info("%s", s)

    train_click_model(
        args.init_from,
        args.out,
        examples,
        config,
        name="radcaliper-demo-click",
        version=args.version,
        provenance={"command": " ".join(sys.argv)},
        on_step=report,
    )


def _score(args: argparse.Namespace) -> None:
    from app.evaluation.clicks import evaluate_clicks, write_click_outputs
    from ingestion.dataset.format import read_dataset
    from ingestion.dataset.split import Side
    from model.baseline import ClickSegmentation
    from model.measurer.infer.click import ClickCaliper
    from model.measurer.infer.pipeline import CheckpointMeasurer

    loaded = CheckpointMeasurer.load(args.model)
    view = loaded.settings.lesion_view
    assert view is not None
    if args.view:
        import dataclasses

        view = dataclasses.replace(view, **json.loads(args.view))

    class Named:
        info = loaded.info

        def __init__(self) -> None:
            self.caliper = ClickCaliper(loaded, view, loaded.settings.calibration)

        def measure_at(self, volume, point):  # type: ignore[no-untyped-def]
            return self.caliper.measure_at(volume, point)

    measurers = {"model": Named(), "baseline": ClickSegmentation()}
    evaluation = evaluate_clicks(
        measurers, read_dataset(args.dataset), [Side(args.side)], seed=args.seed
    )
    write_click_outputs(evaluation, Path(args.out))
    print((Path(args.out) / "click_evaluation.md").read_text())


def _score_hybrid(args: argparse.Namespace) -> None:
    """Clicks on the inserted lesions of held-out hybrid studies (mask truth), model and
    baseline, per size bin."""
    import numpy as np

    from model.baseline import ClickSegmentation
    from model.measurer.data.hybrid import HybridSource, choose_backgrounds, shared_data_root
    from model.measurer.data.reads import hybrid_lesions
    from model.measurer.evaluate.click_scores import SIZE_BINS_MM
    from model.measurer.evaluate.clicks import lesion_clicks
    from model.measurer.infer.click import ClickCaliper
    from model.measurer.infer.pipeline import CheckpointMeasurer

    loaded = CheckpointMeasurer.load(args.model)
    view = loaded.settings.lesion_view
    assert view is not None
    if args.view:
        import dataclasses

        view = dataclasses.replace(view, **json.loads(args.view))
    model = ClickCaliper(loaded, view, loaded.settings.calibration)
    baseline = ClickSegmentation()
    held = tuple(args.backgrounds.split(","))
    source = HybridSource(choose_backgrounds(shared_data_root()), args.seed, held_out=held)
    lesions = hybrid_lesions(source.validation(), range(args.n))
    rows = []
    for i, lesion in enumerate(lesions):
        if lesion.long_mm < args.min_mm:
            continue
        clicks = lesion_clicks(
            lesion.mask, lesion.volume.geometry, extra=2, rng=np.random.default_rng([args.seed, i])
        )
        for point in (clicks.primary_lps_mm, *clicks.extra_lps_mm):
            for label, measurer in (("model", model), ("baseline", baseline)):
                found = measurer.measure_at(lesion.volume, point)
                values = None if found is None else [m.value_mm for m in found.measurements]
                ranges = None if found is None else [m.range_mm for m in found.measurements]
                rows.append(
                    {
                        "lesion": i,
                        "label": label,
                        "true": [lesion.long_mm, lesion.short_mm],
                        "values": values,
                        "ranges": ranges,
                        "name": lesion.name,
                    }
                )
    Path(args.out).write_text(json.dumps(rows))
    for label in ("model", "baseline"):
        print(f"## {label}")
        for name, low, high in (*SIZE_BINS_MM, ("all >= 10", 10.0, 1e9)):
            chosen = [r for r in rows if r["label"] == label and low <= r["true"][0] < high]
            got = [r for r in chosen if r["values"] and None not in r["values"]]
            if not chosen:
                continue
            long_err = [r["values"][0] - r["true"][0] for r in got]
            short_err = [r["values"][1] - r["true"][1] for r in got]
            cover = [
                r["ranges"][0][0] <= r["true"][0] <= r["ranges"][0][1]
                for r in got
                if r["ranges"] and r["ranges"][0]
            ]
            print(
                f"{name}: measured {len(got)}/{len(chosen)}; long MAE "
                f"{np.mean(np.abs(long_err)) if got else float('nan'):.2f} bias "
                f"{np.mean(long_err) if got else float('nan'):+.2f}; short MAE "
                f"{np.mean(np.abs(short_err)) if got else float('nan'):.2f} bias "
                f"{np.mean(short_err) if got else float('nan'):+.2f}; coverage long "
                f"{np.mean(cover) if cover else float('nan'):.2f} (n {len(cover)})"
            )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(2)
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train")
    train.add_argument("out")
    train.add_argument("--dataset", required=True)
    train.add_argument("--init-from", default="model/weights/radcaliper-demo")
    train.add_argument("--steps", type=int, default=1500)
    train.add_argument("--lr", type=float, default=2e-4)
    train.add_argument("--axes-batch", type=int, default=16)
    train.add_argument("--point-batch", type=int, default=8)
    train.add_argument("--seed", type=int, default=44)
    train.add_argument("--version", default="0.4.0-dev")
    train.add_argument("--hybrid", type=int, default=0, help="hybrid studies to add")
    train.add_argument("--hold-out", default="lidc0314_nodule,ct_ge_abdomen_derived")
    score = sub.add_parser("score")
    score.add_argument("model")
    score.add_argument("--dataset", required=True)
    score.add_argument("--side", default="validation")
    score.add_argument("--seed", type=int, default=0)
    score.add_argument("--out", required=True)
    score.add_argument("--view", default="", help="JSON: LesionView fields to change")
    hybrid = sub.add_parser("score-hybrid")
    hybrid.add_argument("model")
    hybrid.add_argument("--backgrounds", default="lidc0314_nodule,ct_ge_abdomen_derived")
    hybrid.add_argument("--n", type=int, default=20)
    hybrid.add_argument("--seed", type=int, default=9001)
    hybrid.add_argument("--min-mm", type=float, default=10.0)
    hybrid.add_argument("--out", required=True)
    hybrid.add_argument("--view", default="", help="JSON: LesionView fields to change")
    args = parser.parse_args()
    {"train": _train, "score": _score, "score-hybrid": _score_hybrid}[args.command](args)


if __name__ == "__main__":
    main()
