"""Exploratory (issue 5): can a tiny Circle-RoPE Qwen2.5-VL learn to measure phantom crops?

Not a product benchmark: the script that produced the figures in the issue-5 note and in
benchmarks/RESULTS.md ("Measurer feasibility"). Each training example is a 112 x 112 crop at
0.75 mm/px (soft-tissue window) through a lesion's or vessel's centre slice, centre jittered by
N(0, 4 mm), with the prompt "measure lesion|vessel" and the answer "[NUM] x [NUM] mm" / "[NUM] mm".
Teacher-forced training of CE + lambda (ramped) x numeric loss; evaluation: MAE of the values
decoded at the [NUM] targets of held-out crops (seeds 90000+).

Usage:
  python benchmarks/experiments/measure_feasibility.py HIDDEN LAYERS STEPS VISION_HIDDEN HEAD LR
  HEAD: softmax | cosine | score_mse (RNED, correlation decoder) or xval
  environment: KIND=all|lesion|vessel, CHAN=inv (contrast channels (w, 1-w, 0.5); else grey),
  SIGMA (softmax label width, mm; SIGMA_END: anneal to it linearly), CHI (codec hi),
  XHI (xVal hi), INIT (initializer range),
  EVAL (steps between evaluations), CACHE (data cache file, default /tmp/radcaliper_feasibility.pt;
  delete it when changing WIN or NPH), WIN (window width in HU around level 40, default 400),
  NPH (training phantoms, seeds 1000.., default 2000)
"""

import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from ingestion.phantoms import generate_phantom
from model.backbone import tiny_qwen2_5_vl_kwargs
from model.circle_rope.config import CircleRopeQwen2_5_VLConfig
from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
from model.numeric.codec import RotaryNumberCodec
from model.numeric.hf import NumericLM
from model.numeric.rned_head import RnedHead

torch.set_num_threads(2)
HID = int(sys.argv[1]) if len(sys.argv) > 1 else 128
LAYERS = int(sys.argv[2]) if len(sys.argv) > 2 else 4
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 600
VH = int(sys.argv[4]) if len(sys.argv) > 4 else 64
MM, SIZE = 0.75, 112
PAD, BOS, EOS, NUM = 0, 1, 2, 3
W_LESION, W_VESSEL, W_MEASURE, W_X, W_MM = 10, 11, 12, 13, 14
INIT = float(os.environ.get("INIT", "0.02"))
KIND = os.environ.get("KIND", "all")
kw = tiny_qwen2_5_vl_kwargs(
    hidden_size=HID, num_layers=LAYERS, vocab_size=64, vision_hidden=VH, initializer_range=INIT
)
kw["vision_config"]["depth"] = 2
IMG, VS, VE = kw["image_token_id"], kw["vision_start_token_id"], kw["vision_end_token_id"]


def crop(ph, f, rng, jitter=4.0):
    hu = torch.from_numpy(ph.hu[f.slice_index].astype(np.float32))
    g = ph.geometry
    _s, r, c = g.lps_to_index(f.center_lps_mm)
    p = g.spacing[1]
    dr, dc = rng.normal(0, jitter, 2) / p
    rr = r + dr
    cc = c + dc
    off = (np.arange(SIZE) - (SIZE - 1) / 2) * MM / p
    ys = (rr + off) / (hu.shape[0] - 1) * 2 - 1
    xs = (cc + off) / (hu.shape[1] - 1) * 2 - 1
    gy, gx = torch.meshgrid(
        torch.tensor(ys, dtype=torch.float32), torch.tensor(xs, dtype=torch.float32), indexing="ij"
    )
    grid = torch.stack((gx, gy), -1)[None]
    out = F.grid_sample(
        hu[None, None], grid, mode="bilinear", padding_mode="border", align_corners=True
    )[0, 0]
    width = float(os.environ.get("WIN", "400"))
    return ((out - (40 - width / 2)) / width).clamp(0, 1)


def patchify(img):  # (H, W) -> (grid_h*grid_w, 3*2*14*14) Qwen layout
    x = img[None, None].expand(2, 3, SIZE, SIZE)  # T=2 frames (temporal patch), C=3
    gh = gw = SIZE // 14
    x = x.reshape(1, 2, 3, gh // 2, 2, 14, gw // 2, 2, 14)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gh * gw, 3 * 2 * 14 * 14)


def example(ph, f, rng):
    img = crop(ph, f, rng)
    ntok = (SIZE // 28) ** 2
    if f.kind == "lesion":
        prompt = [BOS, VS] + [IMG] * ntok + [VE, W_MEASURE, W_LESION]
        ans = [NUM, W_X, NUM, W_MM, EOS]
        vals = [round(f.long_axis_mm, 1), round(f.short_axis_mm, 1)]
    else:
        prompt = [BOS, VS] + [IMG] * ntok + [VE, W_MEASURE, W_VESSEL]
        ans = [NUM, W_MM, EOS]
        vals = [round(f.diameter_mm, 1)]
    return patchify(img), prompt + ans, len(prompt), vals


def make_set(seeds, rng):
    out = []
    for s in seeds:
        ph = generate_phantom(int(s))
        for f in ph.findings:
            out.append(example(ph, f, rng))
    return out


def collate(items):
    L = max(len(t) for _, t, _, _ in items)
    ids = torch.full((len(items), L), PAD)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    vals = []
    for i, (_, t, p, v) in enumerate(items):
        ids[i, L - len(t) :] = torch.tensor(t)
        mask[i, L - len(t) :] = 1
        labels[i, L - len(t) + p :] = torch.tensor(t[p:])
        vals += v
    pix = torch.cat([x for x, _, _, _ in items])
    grid = torch.tensor([[1, SIZE // 14, SIZE // 14]] * len(items))
    return ids, mask, labels, torch.tensor(vals, dtype=torch.float64), pix, grid


rng = np.random.default_rng(0)
t0 = time.time()
CACHE = os.environ.get("CACHE", "/tmp/radcaliper_feasibility.pt")
if os.path.exists(CACHE):
    train, test = torch.load(CACHE, weights_only=False)
else:  # the cache holds grey crops of every kind; channels and kinds are chosen below
    train = make_set(range(1000, 1000 + int(os.environ.get("NPH", "2000"))), rng)
    test = make_set(range(90000, 90060), np.random.default_rng(1))
    torch.save((train, test), CACHE)
if os.environ.get("CHAN") == "inv":

    def fix(pix):
        p = pix.reshape(pix.shape[0], 3, 2 * 14 * 14).clone()
        p[:, 1] = 1 - p[:, 0]
        p[:, 2] = 0.5
        return p.reshape(pix.shape[0], -1)

    train = [(fix(a), b, c, d) for a, b, c, d in train]
    test = [(fix(a), b, c, d) for a, b, c, d in test]
if KIND != "all":
    n = 1 if KIND == "vessel" else 2
    train = [t for t in train if len(t[3]) == n]
    test = [t for t in test if len(t[3]) == n]
print(f"data {len(train)} train {len(test)} test in {time.time() - t0:.1f}s", flush=True)
torch.manual_seed(0)
cfg = CircleRopeQwen2_5_VLConfig(circle_rope_strategy="alternate", **kw)
model = CircleRopeQwen2_5_VLForConditionalGeneration(cfg)
codec = RotaryNumberCodec(
    HID,
    lo=0.0,
    hi=float(os.environ.get("CHI", "3000")),
    scale=float(model.get_input_embeddings().weight.std()),
)
HEAD = sys.argv[5] if len(sys.argv) > 5 else "softmax"
LR = float(sys.argv[6]) if len(sys.argv) > 6 else 1e-3
if HEAD == "xval":
    from model.numeric.xval import XValHead

    head = XValHead(HID, lo=0.0, hi=float(os.environ.get("XHI", "300")))
else:
    opts = (
        {"sigma": float(os.environ["SIGMA"])}
        if "SIGMA" in os.environ and HEAD == "softmax"
        else None
    )
    head = RnedHead(codec, method="corr", loss=HEAD, loss_options=opts)
lm = NumericLM(model, head, NUM)
params = [p for p in lm.parameters() if p.requires_grad]
print("params", sum(p.numel() for p in params), flush=True)
opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.01)
B = 32
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 200))


def evaluate():
    lm.eval()
    errs = {"long": [0.0], "short": [0.0], "diam": [0.0]}
    with torch.no_grad():
        for i in range(0, len(test), 32):
            items = test[i : i + 32]
            ids, mask, labels, vals, pix, grid = collate(items)
            out = lm(ids, mask, vals, labels=labels, pixel_values=pix, image_grid_thw=grid)
            pred = head.decode(out.num_hidden)
            true = vals  # label values in order
            k = 0
            for _, _t, _p, v in items:
                names = ["long", "short"] if len(v) == 2 else ["diam"]
                for n in names:
                    errs[n].append(abs(float(pred[k]) - float(true[k])))
                    k += 1
    lm.train()
    return {k: round(float(np.mean(v)), 2) for k, v in errs.items()}


t0 = time.time()
for step in range(STEPS):
    idx = rng.integers(0, len(train), B)
    ids, mask, labels, vals, pix, grid = collate([train[i] for i in idx])
    lam = min(1.0, step / (0.2 * STEPS)) * 1.0
    if "SIGMA_END" in os.environ and HEAD == "softmax":  # anneal the label width linearly
        s0, s1 = float(os.environ["SIGMA"]), float(os.environ["SIGMA_END"])
        head.loss_options["sigma"] = s0 + (s1 - s0) * step / max(1, STEPS - 1)
    out = lm(ids, mask, vals, labels=labels, lambda_=lam, pixel_values=pix, image_grid_thw=grid)
    opt.zero_grad()
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    if step % 100 == 0 or step == STEPS - 1:
        print(
            f"step {step} loss {out.loss.item():.3f} ce {out.ce_loss.item():.3f} "
            f"num {out.numeric_loss.item():.3f} t {time.time() - t0:.0f}s",
            flush=True,
        )
    if (
        step % int(os.environ.get("EVAL", "500")) == int(os.environ.get("EVAL", "500")) - 1
        or step == STEPS - 1
    ):
        print("eval", evaluate(), flush=True)
