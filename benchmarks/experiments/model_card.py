# ruff: noqa: E501 - the card is a markdown template whose table rows are long lines
"""Write the demo checkpoint's model card (README.md in the checkpoint) from its radcaliper.json
and a held-out evaluation written by ``benchmarks/bench_measurer.py --json``.

Usage: python benchmarks/experiments/model_card.py CHECKPOINT_DIR EVALUATION_JSON BENCH_COMMAND
"""

import json
import sys
from pathlib import Path

root = Path(sys.argv[1])
settings = json.loads((root / "radcaliper.json").read_text())
evaluation = json.loads(Path(sys.argv[2]).read_text())
bench_command = sys.argv[3]
training = settings["training"]
config = training["config"]
calibration = settings["calibration"] or {}


def num(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


stages = "; ".join(
    f"{s['name']}: {s['steps']} steps, lr {s['lr']:g}, trainable {s['trainable']}, "
    f"label sigma {s['sigma'][0]:g} -> {s['sigma'][1]:g} mm"
    for s in config["stages"]
)
size = config["size"]
rules = "\n".join(
    f"| {name} | {r['kind']} | {num(r['quantile'], 3)} | {r['n']} | {num(r['mae_mm'])} | "
    f"{num(r['empirical_coverage'], 3)} | {num(r['mean_width_mm'])} |"
    for name, r in sorted(calibration.items())
)
mae = evaluation["mae_mm"]
coverage = evaluation["coverage"]
card = f"""# {settings["name"]} {settings["version"]}: the bundled demo measurer

**Not for clinical use.** Trained and evaluated on synthetic CT phantoms only
(`shared/design/phantom-spec.md`); it has never seen a patient image.

## What it is
- transformers' Qwen2.5-VL classes with Circle-RoPE (AGE strategy `{size["circle_rope_strategy"]}`)
  and the RNED numeric head (mode `{settings["numeric_mode"]}`: correlation decoder, candidate
  softmax loss), tiny: text hidden {size["hidden_size"]} x {size["num_layers"]} layers
  ({size["num_heads"]} heads, {size["num_kv_heads"]} KV heads), vision tower
  {size["vision_depth"]} blocks x {size["vision_hidden"]}; radcaliper's own 54-token tokenizer.
- Tasks: {", ".join(settings["tasks"])} (`model.measurer.tasks`, `model.measurer.axes`);
  candidates of the find step are confirmed by the point task: {settings["verify_candidates"]}.
- Inputs: find images {settings["find_inputs"]["size"]} px at {settings["find_inputs"]["pixel_mm"]}
  mm/px with a coordinate frame; measure crops {settings["measure_inputs"]["size"]} px at
  {settings["measure_inputs"]["pixel_mm"]} mm/px, window {settings["measure_inputs"]["window"]}.
- Files: `model.safetensors` (weights), `numeric_head.safetensors` (RNED codec),
  `tokenizer.json`, `config.json`, `radcaliper.json` (settings, calibration, provenance),
  `training_config.json` (the exact training configuration).

## How it was trained
- Data: phantoms generated on the fly, run seed {config["seed"]} (`study_seed({config["seed"]}, i)`,
  the seeds `radcaliper phantoms --seed {config["seed"]}` uses), a rolling pool of
  {config["pool"]["size"]} studies, {config["pool"]["studies_per_step"]} new per step.
- {stages}; batches per step: {config["measure_batch"]} measure crops, {config["find_batch"]} find
  planes, {config["point_batch"]} clicks, {config["axes_batch"]} axes crops; AdamW, weight decay
  {config["weight_decay"]}, lambda ramped to {config["lambda_max"]} over {config["lambda_ramp_steps"]}
  steps; 2 CPU threads.
- Command (deterministic for the seed; resumable):
  `radcaliper train OUT --config model/weights/radcaliper-demo/training_config.json`
- Calibration: `radcaliper calibrate OUT --n 400 --seed 7001` (split conformal on 400 held-out
  phantoms of run seed 7001):

| measurement | rule | quantile | n | MAE mm | coverage (calibration set) | mean width mm |
|---|---|---|---|---|---|---|
{rules}

## Held-out evaluation
`{bench_command}`: {evaluation["studies"]} phantoms of run seed 2026 (never used in training or
calibration), written as DICOM and read back through ingestion.

| metric | value | target (issue 5) |
|---|---|---|
| lesions >= 10 mm found (recall) | {num(evaluation["lesion_recall_10mm"], 3)} ({evaluation["lesions_10mm"]} lesions) | >= 0.95 |
| false findings per study | {num(evaluation["false_findings_per_study"], 3)} | <= 0.2 |
| vessels found (recall) | {num(evaluation["vessel_recall"], 3)} ({evaluation["vessels"]} vessels) | |
| MAE long axis | {num(mae.get("long_axis"))} mm | <= 2.0 mm |
| MAE short axis | {num(mae.get("short_axis"))} mm | <= 2.0 mm |
| MAE vessel diameter | {num(mae.get("diameter"))} mm | <= 1.5 mm |
| 90 % range coverage (long / short / diameter) | {num(coverage.get("long_axis"), 3)} / {num(coverage.get("short_axis"), 3)} / {num(coverage.get("diameter"), 3)} | 0.88-0.92 |
| answers that parsed | {num(evaluation["answers_parsed"], 4)} | >= 0.99 |
| seconds per study (median, 2 CPU threads) | {num(evaluation["seconds_median"])} | <= 3 |
| model load (fresh process, median of 3) | {num(sorted(evaluation["load_seconds"])[1])} s | <= 5 s |

The MAE and coverage are over matched findings (found within the spec's radius); see
`benchmarks/RESULTS.md` for the full record.

## Limits
Phantoms are simple: uniform ellipsoids and cylinders on soft tissue with Gaussian noise. Real CT
has other anatomy, textures and artefacts; this model's numbers say nothing about them. MR is
refused; so are spacings far outside the phantom spec.
"""
(root / "README.md").write_text(card)
(root / "training_config.json").write_text(json.dumps(config, indent=2) + "\n")
print("wrote", root / "README.md")
