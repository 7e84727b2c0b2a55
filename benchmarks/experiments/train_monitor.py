"""Exploratory (issue 5): train the measurer with model.measurer.train.loop and watch held-out
quality while it trains (find: per-plane box recall / false boxes by generation; measure:
teacher-forced MAE). Not a product benchmark; the product's evaluation is `radcaliper evaluate`.

Usage: python benchmarks/experiments/train_monitor.py OUT STEPS1 STEPS2 [key=value ...]
  keys: hidden, layers, vhidden, vdepth, mb (measure batch), fb (find batch), pb (point
        batch), ab (axes batch), click (click fraction), lr, every, pool, rate (studies per
        step), threads
"""

import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from ingestion.phantoms import generate_phantom, study_seed
from model.measurer.data.sources import PhantomSource
from model.measurer.inputs.data import collate, encode_example, finding_patches, phantom_volume
from model.measurer.inputs.find import find_planes
from model.measurer.tasks.text import parse_find, with_values
from model.measurer.tasks.tokenizer import special_ids
from model.measurer.train.config import BackboneSize, PoolSettings, Stage, TrainConfig
from model.measurer.train.loop import train

out = sys.argv[1]
s1, s2 = int(sys.argv[2]), int(sys.argv[3])
kv = dict(a.split("=") for a in sys.argv[4:])
g = lambda k, d: type(d)(kv.get(k, d))  # noqa: E731
config = TrainConfig(
    seed=0,
    size=BackboneSize(
        hidden_size=g("hidden", 128),
        num_layers=g("layers", 4),
        vision_hidden=g("vhidden", 64),
        vision_depth=g("vdepth", 2),
    ),
    stages=(
        Stage("from scratch", s1, g("lr", 1e-3), sigma=(3.0, 1.0)),
        Stage("refine", s2, g("lr", 1e-3) / 5, sigma=(1.0, 0.5), warmup_steps=50),
    ),
    measure_batch=g("mb", 32),
    find_batch=g("fb", 8),
    point_batch=g("pb", 8),
    axes_batch=g("ab", 0),
    pool=PoolSettings(
        size=g("pool", 600),
        initial=g("initial", 200),
        studies_per_step=g("rate", 0.25),
        click_fraction=g("click", 0.0),
    ),
    checkpoint_every=g("every", 500),
    threads=g("threads", 2),
    lambda_ramp_steps=g("ramp", 1000),
)
# held-out material
held_rng = np.random.default_rng(5)
held_patches, held_planes = [], []
for i in range(g("held", 40)):
    ph = generate_phantom(study_seed(90210, i))
    v = phantom_volume(ph)
    held_patches += finding_patches(v, ph.findings, config.measure_inputs)
    held_planes += find_planes(v, ph.findings, config.find_inputs, held_rng, planes=3)
print(f"held out: {len(held_patches)} findings, {len(held_planes)} planes", flush=True)


def monitor(lm, tokenizer):
    lm.eval()
    ids = special_ids(tokenizer)
    errs = {"long_axis": [], "short_axis": [], "diameter": []}
    rng = np.random.default_rng(1)
    with torch.no_grad():
        for i in range(0, len(held_patches), 32):
            exs = [p.example(config.measure_inputs, rng) for p in held_patches[i : i + 32]]
            b = collate([encode_example(e, tokenizer) for e in exs], ids["pad"])
            o = lm(
                b.input_ids,
                b.attention_mask,
                b.num_values,
                labels=b.labels,
                pixel_values=b.pixel_values,
                image_grid_thw=b.image_grid_thw,
            )
            pred = lm.numeric_head.decode(o.num_hidden).tolist()
            true = b.num_values.tolist()
            k = 0
            for e in exs:
                names = ["long_axis", "short_axis"] if e.kind.value == "lesion" else ["diameter"]
                for n in names:
                    errs[n].append(abs(pred[k] - true[k]))
                    k += 1
        # find: generation
        ok = hit = miss = false = 0
        cerr = []
        for i in range(0, len(held_planes), 16):
            planes = held_planes[i : i + 16]
            exs = [p.example(config.find_inputs) for p in planes]
            enc = [encode_example(type(e)(e.images, e.prompt, None), tokenizer) for e in exs]
            b = collate(enc, ids["pad"])
            gen = lm.generate(
                b.input_ids,
                b.attention_mask,
                b.num_values,
                max_new_tokens=72,
                eos_token_id=ids["eos"],
                pad_token_id=ids["pad"],
                pixel_values=b.pixel_values,
                image_grid_thw=b.image_grid_thw,
            )
            for r, p in enumerate(planes):
                text = tokenizer.decode(gen.new_tokens[r].tolist(), skip_special_tokens=True)
                text = with_values(text.strip(), gen.values[r].tolist())
                parsed = parse_find(text, num_images=1)
                ok += parsed.success
                found = list(parsed.findings) if parsed.success else []
                used = set()
                for t in p.findings:
                    tc = ((t.box[0] + t.box[2]) / 2, (t.box[1] + t.box[3]) / 2)
                    best, bd = None, 1e9
                    for j, f in enumerate(found):
                        if j in used or f.kind != t.kind:
                            continue
                        fc = ((f.box[0] + f.box[2]) / 2, (f.box[1] + f.box[3]) / 2)
                        d = np.hypot(fc[0] - tc[0], fc[1] - tc[1]) * config.find_inputs.pixel_mm
                        if d < bd:
                            best, bd = j, d
                    if best is not None and bd <= max(
                        10.0, (t.box[2] - t.box[0]) * config.find_inputs.pixel_mm / 2
                    ):
                        used.add(best)
                        hit += 1
                        cerr.append(bd)
                    else:
                        miss += 1
                false += len(found) - len(used)
    lm.train()
    mae = {k: round(float(np.mean(v)), 2) for k, v in errs.items() if v}
    print(
        f"  eval measure MAE {mae} | find parse {ok}/{len(held_planes)} hit {hit} miss {miss} "
        f"false {false} centre err {np.mean(cerr) if cerr else float('nan'):.1f} mm",
        flush=True,
    )


t0 = time.time()


def on_step(r):
    if r.step % 100 == 0 or r.step == 1:
        print(
            f"step {r.step}/{r.total} {r.stage} loss {r.loss:.3f} "
            f"measure {r.measure_loss:.3f} point {r.point_loss:.3f} axes {r.axes_loss} "
            f"find {r.find_loss:.3f} num {r.numeric_loss} t {r.seconds:.0f}s",
            flush=True,
        )
    if r.step % g("eval", 500) == 0 or r.step == r.total:
        monitor(r.lm, r.tokenizer)  # the public hook: StepReport carries the model in training


studies = [0]
train(
    config,
    out,
    PhantomSource(seed=0),
    on_step=on_step,
    on_study=lambda i: studies.__setitem__(0, i),
)
print("done", time.time() - t0, flush=True)
