# ruff: noqa: E501 - the card is a markdown template whose table rows are long lines
"""Write the demo checkpoint's model card (README.md in the checkpoint) from its radcaliper.json
and a held-out evaluation written by ``benchmarks/bench_measurer.py --json``.

Usage: python benchmarks/experiments/model_card.py [--trained-as VERSION] [--versions FILE]
           [--eval-seed SEED] CHECKPOINT_DIR EVALUATION_JSON BENCH_COMMAND CALIBRATE_COMMAND
           CONFIG [CONFIG ...]

The CONFIGs are the training runs in order (``radcaliper train --config``); each after the first
starts from the previous run's weights (``init_from``). ``--trained-as``: the version the last
run was tagged with when the checkpoint's version has moved on without new weights (inference or
calibration changed); ``--versions``: a markdown list of what changed in each version;
``--eval-seed``: the run seed of the held-out evaluation (default 2026). A run's output folder is
the ``init_from`` of the next run where that is under ``runs/``, else ``runs/<config name>``.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from model.measurer.checkpoint.settings import MeasurerSettings
from model.measurer.infer.stages import default_stages
from model.measurer.infer.state import InferenceOptions

# what each inference stage does (``model.measurer.infer.stages``), for the card
STAGE_TEXT = {
    "find": f"the find task on planes {InferenceOptions().find_plane_mm:g} mm apart over the "
    "whole field of view, in overlapping tiles of the trained size, boxes joined into "
    "candidates in 3-D (`model.measurer.infer.grouping`)",
    "verify": "the point task at each candidate's centre: `none` drops it, a kind replaces the "
    "find step's; a malformed answer is no confirmation",
    "recentre": "the axes task moves each candidate's axial centre to the middle of the long "
    "axis (or diameter) it draws",
    "merge": "candidates of one kind split along z by missed planes become one",
    "measure": "the measure task; a lesion also on neighbouring planes, keeping the plane where "
    "its long axis is longest (RECIST, `model.measurer.infer.planes`)",
    "axes": "the axes task at the measured centre, drawn for the reviewer",
    "dedupe": "one report per object, decided on the model's own reports (`model.measurer.infer.dedupe`)",
    "calibrate": "the calibrated range around every value",
}

args = sys.argv[1:]
trained_as = versions = None
eval_seed = "2026"
while args and args[0] in ("--trained-as", "--versions", "--eval-seed"):
    flag, value, args = args[0], args[1], args[2:]
    if flag == "--trained-as":
        trained_as = value
    elif flag == "--eval-seed":
        eval_seed = value
    else:
        versions = Path(value).read_text()
sys.argv = [sys.argv[0], *args]
root = Path(sys.argv[1])
settings = json.loads((root / "radcaliper.json").read_text())
evaluation = json.loads(Path(sys.argv[2]).read_text())
bench_command = sys.argv[3]
calibrate_command = sys.argv[4]
chain = [(path, json.loads(Path(path).read_text())) for path in sys.argv[5:]]
if not chain:
    raise SystemExit("name the training configurations in order")
training = settings["training"]
config = training["config"]
calibration = settings["calibration"] or {}
second_window = settings["measure_inputs"].get("second_window")
second = "" if second_window is None else f" and a second window {second_window} (third channel)"
stage_lines = "\n".join(
    f"  {i}. `{stage.name}`: {STAGE_TEXT.get(stage.name, 'see `model.measurer.infer.stages`')}"
    for i, stage in enumerate(default_stages(MeasurerSettings.from_json(settings)), start=1)
)


def num(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def output_of(index):
    """Where run ``index`` (1-based) wrote its checkpoint, and a note where the next run started
    from a copy of it."""
    stem = Path(chain[index - 1][0]).stem
    if index == len(chain):
        return f"runs/{stem}", ""
    following = chain[index][1].get("init_from") or ""
    if following.startswith("runs/"):
        return following, ""
    return f"runs/{stem}", f"; its weights are kept as `{following}`"


def run_lines(index, path, run, last):
    stages = "; ".join(
        f"{st['name']}: {st['steps']} steps, lr {st['lr']:g}, trainable {st['trainable']}, "
        f"label sigma {st['sigma'][0]:g} -> {st['sigma'][1]:g} mm"
        + (
            " (batches " + ", ".join(f"{n} {task}" for task, n in st["batches"]) + ")"
            if st.get("batches")
            else ""
        )
        for st in run["stages"]
    )
    start = "from scratch" if not run.get("init_from") else f"from `{run['init_from']}`"
    out, kept = output_of(index)
    return (
        f"{index}. `radcaliper train {out} --config {path} --threads 2"
        + (f" --version-tag {trained_as or settings['version']}" if last else "")
        + f"` ({start}, "
        f"phantom run seed {run['seed']}): {stages}; batches per step {run['measure_batch']} "
        f"measure, {run['find_batch']} find, {run['point_batch']} point, {run['axes_batch']} axes"
        + kept
    )


runs = "\n".join(
    run_lines(i, path, run, i == len(chain)) for i, (path, run) in enumerate(chain, start=1)
)
total_steps = sum(st["steps"] for _, run in chain for st in run["stages"])
size = config["size"]
seeds = ", ".join(str(run["seed"]) for _, run in chain)
voting = settings.get("find_voting") or {"shifts": [[0, 0]], "votes": 1}
if len(voting["shifts"]) > 1:
    passes = (
        f"each plane is asked in {len(voting['shifts'])} passes, its content shifted by "
        + ", ".join(f"({r}, {c})" for r, c in voting["shifts"])
        + f" pixels, and a box is kept where {voting['votes']} passes agree"
        + (
            " or where a lone box is no agreed box's one-token alias"
            if voting.get("keep_unaliased")
            else ""
        )
        + " (`model.measurer.inputs.voting`)"
    )
else:
    passes = "one find pass per plane"
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
- Tasks: {", ".join(settings["tasks"])} (`model.measurer.tasks.text`, `model.measurer.tasks.axes`).
- Inference runs as named stages (`model.measurer.infer.stages`), each a step from one study state to
  the next; for this checkpoint, in order:
{stage_lines}

  No stage reads HU thresholds: what a region is, is the model's answer.
- Inputs: find images {settings["find_inputs"]["size"]} px at {settings["find_inputs"]["pixel_mm"]}
  mm/px with a coordinate frame ({passes}); measure crops {settings["measure_inputs"]["size"]} px at
  {settings["measure_inputs"]["pixel_mm"]} mm/px, window {settings["measure_inputs"]["window"]}{second}.
- Files: `model.safetensors` (weights), `numeric_head.safetensors` (RNED codec),
  `tokenizer.json`, `config.json`, `radcaliper.json` (settings, calibration, provenance),
  `training_config.json` (the exact training configuration).

## How it was trained
- Data: phantoms generated on the fly (each run its own run seed, `study_seed(seed, i)`, the
  seeds `radcaliper phantoms --seed` uses; seeds {seeds}, never the calibration's 7001 or the
  evaluation's {eval_seed}), a rolling pool of {config["pool"]["size"]} studies,
  {config["pool"]["studies_per_step"]} new per step; AdamW, weight decay {config["weight_decay"]};
  2 CPU threads; {total_steps} steps in all. The runs, in order, from the repository root (each is
  deterministic for its seed and resumable; `init_from` names the previous run's output):

{runs}

  The first run learns all four tasks; the later ones weight the find task more (its recall was
  the weakest) at a lower rate; each stage's name says what it was for.
  `training_config.json` is the last run's configuration.
- Calibration: `{calibrate_command}` (split conformal on held-out phantoms of run seed 7001):

| measurement | rule | quantile | n | MAE mm | coverage (calibration set) | mean width mm |
|---|---|---|---|---|---|---|
{rules}

## Held-out evaluation
`{bench_command}`: {evaluation["studies"]} phantoms of run seed {eval_seed} (never used in training,
calibration or validation), written as DICOM and read back through ingestion.

| metric | value | target (issue 5) |
|---|---|---|
| lesions >= 10 mm found (recall) | {num(evaluation["lesion_recall_10mm"], 3)} ({evaluation["lesions_10mm"]} lesions) | >= 0.95 |
| false findings per study | {num(evaluation["false_findings_per_study"], 3)} | <= 0.2 |
| vessels found (recall) | {num(evaluation["vessel_recall"], 3)} ({evaluation["vessels"]} vessels) | |
| MAE long axis | {num(mae.get("long_axis"))} mm | <= 2.0 mm |
| MAE short axis | {num(mae.get("short_axis"))} mm | <= 2.0 mm |
| MAE vessel diameter | {num(mae.get("diameter"))} mm | <= 1.5 mm |
| 90 % range coverage (long / short / diameter) | {num(coverage.get("long_axis"), 3)} / {num(coverage.get("short_axis"), 3)} / {num(coverage.get("diameter"), 3)} | 0.88-0.92 |
| measurements whose answer parsed | {num(evaluation["answers_parsed"], 4)} ({evaluation["malformed_find_answers"]} find answers, one per examined plane, were malformed: those planes' boxes are dropped) | >= 0.99 |
| seconds per study (median, 2 CPU threads) | {num(evaluation["seconds_median"])} | <= 3 |
| model load (fresh process, median of 3) | {num(sorted(evaluation["load_seconds"])[1])} s | <= 5 s |

The MAE and coverage are over matched findings (found within the spec's radius); see
`benchmarks/RESULTS.md` for the full record.

{"## Versions" + chr(10) + versions + chr(10) if versions else ""}## Limits
Phantoms are simple: uniform ellipsoids and cylinders on soft tissue with Gaussian noise. Real CT
has other anatomy, textures and artefacts; this model's numbers say nothing about them. MR is
refused; so are spacings far outside the phantom spec.
"""
(root / "README.md").write_text(card)
(root / "training_config.json").write_text(json.dumps(config, indent=2) + "\n")
print("wrote", root / "README.md")
