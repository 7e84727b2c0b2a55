"""The Circle-RoPE / AGE Qwen2.5-VL variant (model.circle_rope.modeling) on a tiny random model.

Acceptance checks: prefill + incremental decode with the KV cache gives the logits of one full
forward pass (Circle-RoPE with and without AGE, within 1e-4); which layers received which rotary
table; positions stay float32 through the rotary embedding under bf16 autocast; save / load from
a local directory. Also: strategy "off" is transformers' Qwen2.5-VL exactly, conversion of a
plain Qwen2.5-VL, multi-frame images, NumericLM generation on the variant, configuration errors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from model.backbone import tiny_qwen2_5_vl_kwargs
from model.circle_rope.config import AgeStrategy, CircleRopeQwen2_5_VLConfig, circle_layers
from model.circle_rope.modeling import (
    CircleRopeQwen2_5_VLForConditionalGeneration,
    CircleRopeRotaryEmbedding,
    split_position_ids,
)
from model.circle_rope.positions import multimodal_position_ids

ROOT = Path(__file__).resolve().parents[3]

LAYERS = 4
KW = tiny_qwen2_5_vl_kwargs(num_layers=LAYERS)
IMAGE, START, END = KW["image_token_id"], KW["vision_start_token_id"], KW["vision_end_token_id"]
PAD = KW["text_config"]["pad_token_id"]
PATCH = 3 * 2 * 14 * 14  # channels x temporal patch x patch x patch
TOL = 1e-4


def config(strategy: str = "alternate", **circle: Any) -> CircleRopeQwen2_5_VLConfig:
    return CircleRopeQwen2_5_VLConfig(circle_rope_strategy=strategy, **circle, **KW)


@pytest.fixture(scope="module")
def stock() -> Qwen2_5_VLForConditionalGeneration:
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**KW)).eval()


def circle_model(
    stock: Qwen2_5_VLForConditionalGeneration, strategy: str = "alternate", **circle: Any
) -> CircleRopeQwen2_5_VLForConditionalGeneration:
    return CircleRopeQwen2_5_VLForConditionalGeneration.from_qwen2_5_vl(
        stock, circle_rope_strategy=strategy, **{f"circle_rope_{k}": v for k, v in circle.items()}
    )


def image(grid: tuple[int, int, int]) -> list[int]:
    t, h, w = grid
    return [START] + [IMAGE] * (t * h * w // 4) + [END]


GRIDS = [(1, 4, 4), (1, 4, 6), (1, 6, 4), (2, 4, 4)]  # the last is one 2-frame image


def inputs() -> dict[str, torch.Tensor]:
    """A left-padded batch of 3: two images, one image, one 2-frame image; pixel values."""
    rows = [
        [10, 11, *image(GRIDS[0]), 12, 13, 14, *image(GRIDS[1]), 15],
        [20, *image(GRIDS[2]), 21, 22, 23, 24],
        [30, 31, 32, *image(GRIDS[3]), 33],
    ]
    length = max(len(r) for r in rows)
    ids = torch.tensor([[PAD] * (length - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (length - len(r)) + [1] * len(r) for r in rows])
    patches = sum(t * h * w for t, h, w in GRIDS)
    pixels = torch.randn(patches, PATCH, generator=torch.Generator().manual_seed(1))
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "pixel_values": pixels,
        "image_grid_thw": torch.tensor(GRIDS),
    }


def full_forward_logits(
    model: Qwen2_5_VLForConditionalGeneration, sequences: torch.Tensor, prompt: dict[str, Any]
) -> torch.Tensor:
    new = sequences.shape[1] - prompt["input_ids"].shape[1]
    mask = torch.cat([prompt["attention_mask"], torch.ones(len(sequences), new).long()], dim=1)
    model.model.rope_deltas = None  # a fresh forward, nothing remembered from generate
    with torch.no_grad():
        out = model(
            input_ids=sequences,
            attention_mask=mask,
            pixel_values=prompt["pixel_values"],
            image_grid_thw=prompt["image_grid_thw"],
        )
    return out.logits


@pytest.mark.parametrize("strategy", ["alternate", "all", "first_half", "second_half", "off"])
def test_incremental_decode_matches_one_full_forward(
    stock: Qwen2_5_VLForConditionalGeneration, strategy: str
) -> None:
    model = circle_model(stock, strategy)
    prompt = inputs()
    with torch.no_grad():
        out = model.generate(
            **prompt,
            max_new_tokens=8,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=PAD,
            eos_token_id=None,
        )
    steps = torch.stack(out.scores, dim=1)  # (B, T, V) incremental logits
    length = prompt["input_ids"].shape[1]
    full = full_forward_logits(model, out.sequences, prompt)[:, length - 1 : -1]
    assert steps.shape == full.shape and steps.shape[1] == 8
    assert float((steps - full).abs().max()) <= TOL
    # the check can fail: decoding with a wrong geometry's positions changes the logits
    if strategy != "off":
        wrong = full_forward_logits(stock, out.sequences, prompt)[:, length - 1 : -1]
        assert float((steps - wrong).abs().max()) > 1e-2


def test_off_is_transformers_qwen2_5_vl_exactly(stock: Qwen2_5_VLForConditionalGeneration) -> None:
    model = circle_model(stock, "off")
    prompt = inputs()
    types = (prompt["input_ids"] == IMAGE).int()
    with torch.no_grad():
        ours = model(**prompt).logits
        theirs = stock(**prompt, mm_token_type_ids=types).logits
    assert torch.equal(ours, theirs)
    ids, deltas = model.model.get_rope_index(
        prompt["input_ids"],
        image_grid_thw=prompt["image_grid_thw"],
        attention_mask=prompt["attention_mask"],
    )
    ref_ids, ref_deltas = stock.model.get_rope_index(
        prompt["input_ids"],
        types,
        image_grid_thw=prompt["image_grid_thw"],
        attention_mask=prompt["attention_mask"],
    )
    assert torch.equal(ids, ref_ids) and torch.equal(deltas, ref_deltas)


def test_circle_rope_changes_the_model(stock: Qwen2_5_VLForConditionalGeneration) -> None:
    prompt = inputs()
    with torch.no_grad():
        theirs = stock(**prompt, mm_token_type_ids=(prompt["input_ids"] == IMAGE).int()).logits
        ours = circle_model(stock, "alternate")(**prompt).logits
    valid = prompt["attention_mask"].bool()
    assert float((ours - theirs)[valid].abs().max()) > 1e-2


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("alternate", (True, False, True, False)),
        ("all", (True, True, True, True)),
        ("first_half", (True, True, False, False)),
        ("second_half", (False, False, True, True)),
        ("off", (False, False, False, False)),
    ],
)
def test_each_layer_receives_its_geometry_table(
    stock: Qwen2_5_VLForConditionalGeneration, strategy: str, expected: tuple[bool, ...]
) -> None:
    model = circle_model(stock, strategy)
    assert model.model.language_model.circle_layers == expected
    prompt = inputs()
    received: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [
        layer.register_forward_pre_hook(
            lambda _m, _a, kw, i=i: received.__setitem__(i, kw["position_embeddings"]),
            with_kwargs=True,
        )
        for i, layer in enumerate(model.model.language_model.layers)
    ]
    try:
        with torch.no_grad():
            model(**prompt)
    finally:
        for hook in hooks:
            hook.remove()
    p = multimodal_position_ids(
        prompt["input_ids"],
        prompt["image_grid_thw"],
        prompt["attention_mask"],
        image_token_id=IMAGE,
        vision_start_token_id=START,
    )
    rotary = model.model.language_model.rotary_emb
    x = torch.zeros(1, dtype=torch.float32)
    mrope_table, circle_table = rotary(x, p.mrope), rotary(x, p.circle)
    assert not torch.equal(mrope_table[0], circle_table[0])
    for i, uses_circle in enumerate(expected):
        table = circle_table if uses_circle else mrope_table
        assert torch.equal(received[i][0], table[0]) and torch.equal(received[i][1], table[1])


@pytest.mark.parametrize(("layers", "n_circle"), [(1, 1), (3, 2), (5, 3), (24, 12)])
def test_strategies_for_any_depth(layers: int, n_circle: int) -> None:
    assert sum(circle_layers("alternate", layers)) == n_circle
    assert circle_layers("alternate", layers)[0] is True
    assert circle_layers(AgeStrategy.ALL, layers) == (True,) * layers
    first = circle_layers("first_half", layers)
    second = circle_layers("second_half", layers)
    assert all(a != b for a, b in zip(first, second, strict=True))
    assert sum(first) == layers // 2


def test_positions_stay_float32_under_bf16_autocast(
    stock: Qwen2_5_VLForConditionalGeneration,
) -> None:
    model = circle_model(stock, "all").to(torch.bfloat16)
    rotary = model.model.language_model.rotary_emb
    assert isinstance(rotary, CircleRopeRotaryEmbedding)
    assert rotary.inv_freq.dtype == torch.float32  # .to(bfloat16) did not round it
    seen: list[torch.Tensor] = []
    hook = rotary.register_forward_pre_hook(lambda _m, args: seen.append(args[1]))
    prompt = inputs()
    prompt["pixel_values"] = prompt["pixel_values"].to(torch.bfloat16)
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(**prompt)
    finally:
        hook.remove()
    p = multimodal_position_ids(
        prompt["input_ids"],
        prompt["image_grid_thw"],
        prompt["attention_mask"],
        image_token_id=IMAGE,
        vision_start_token_id=START,
    )
    circle = [ids for ids in seen if ids.shape[0] == 3 and torch.equal(ids, p.circle)]
    assert circle and circle[0].dtype == torch.float32

    # the table is the float32 computation, rounded to bf16 only at the end
    x = torch.zeros(1, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cos, sin = rotary(x, p.circle)
    inv_freq = rotary.inv_freq.float()
    freqs = p.circle[..., None] * inv_freq  # (3, B, L, F) float32
    expected_cos = rotary.recomposition_frequencies(freqs.cos()).to(torch.bfloat16)
    assert cos.dtype == torch.bfloat16 and torch.equal(cos, expected_cos)
    assert torch.equal(sin, rotary.recomposition_frequencies(freqs.sin()).to(torch.bfloat16))
    # bf16 positions would be a different table: the check can fail
    rounded = p.circle.to(torch.bfloat16).float()[..., None] * inv_freq
    assert not torch.equal(cos, rotary.recomposition_frequencies(rounded.cos()).to(torch.bfloat16))


def test_save_and_load_from_a_local_directory(
    stock: Qwen2_5_VLForConditionalGeneration, tmp_path: Path
) -> None:
    model = circle_model(stock, "first_half", radius="auto-2", alpha=0.25, frame_stride=2.0)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "circle_rope_qwen2_5_vl"
    assert saved["circle_rope_radius"] == "auto-2" and saved["circle_rope_alpha"] == 0.25
    loaded = CircleRopeQwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.config.circle_rope_strategy == "first_half"
    assert loaded.config.circle_rope_frame_stride == 2.0
    assert loaded.model.language_model.circle_layers == (True, True, False, False)
    prompt = inputs()
    with torch.no_grad():
        assert torch.equal(loaded(**prompt).logits, model(**prompt).logits)


def test_a_saved_checkpoint_loads_with_the_auto_classes_after_importing_ours(
    stock: Qwen2_5_VLForConditionalGeneration, tmp_path: Path
) -> None:
    """transformers alone does not know the model type; importing radcaliper's modeling module
    registers it (run in a fresh process: this one has imported it already)."""
    model = circle_model(stock, "alternate")
    model.save_pretrained(tmp_path)
    script = f"""
import torch
from transformers import AutoConfig, AutoModelForImageTextToText
try:
    AutoConfig.from_pretrained({str(tmp_path)!r})
except ValueError as exc:
    print("unknown before:", "circle_rope_qwen2_5_vl" in str(exc))
import model.circle_rope.modeling
config = AutoConfig.from_pretrained({str(tmp_path)!r})
loaded = AutoModelForImageTextToText.from_pretrained({str(tmp_path)!r})
print(type(config).__name__, type(loaded).__name__, config.circle_rope_strategy)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.splitlines() == [
        "unknown before: True",
        "CircleRopeQwen2_5_VLConfig CircleRopeQwen2_5_VLForConditionalGeneration alternate",
    ]


def test_converts_a_plain_qwen2_5_vl_directory(
    stock: Qwen2_5_VLForConditionalGeneration, tmp_path: Path
) -> None:
    stock.save_pretrained(tmp_path)
    loaded = CircleRopeQwen2_5_VLForConditionalGeneration.from_pretrained(
        tmp_path, circle_rope_strategy="alternate"
    ).eval()
    assert loaded.config.model_type == "circle_rope_qwen2_5_vl"
    assert loaded.model.language_model.circle_layers == (True, False, True, False)
    ours = loaded.state_dict()
    for name, value in stock.state_dict().items():
        assert torch.equal(ours[name], value), name
    assert set(ours) == set(stock.state_dict())


def test_numeric_lm_generation_on_circle_rope(stock: Qwen2_5_VLForConditionalGeneration) -> None:
    """NumericLM's own loop continues both geometries: incremental == full forward."""
    from model.numeric.codec import RotaryNumberCodec
    from model.numeric.hf import NumericLM
    from model.numeric.rned_head import RnedHead

    model = circle_model(stock, "alternate")
    num = 3
    codec = RotaryNumberCodec(KW["text_config"]["hidden_size"], lo=0.0, hi=300.0, scale=0.1)
    head = RnedHead(codec, method="corr")
    lm = NumericLM(model, head, num)
    prompt = inputs()
    values = torch.empty(0, dtype=torch.float64)

    def force_num(sequences: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = sequences.shape[1] - prompt["input_ids"].shape[1]
        if step in (1, 3):
            scores = torch.full_like(scores, -1e9)
            scores[:, num] = 0
        return scores

    gen = lm.generate(
        prompt["input_ids"],
        prompt["attention_mask"],
        values,
        max_new_tokens=5,
        pixel_values=prompt["pixel_values"],
        image_grid_thw=prompt["image_grid_thw"],
        logits_processor=force_num,
        output_logits=True,
        eos_token_id=[],
        pad_token_id=PAD,
    )
    assert gen.logits is not None and sum(len(v) for v in gen.values) == 6
    with torch.no_grad():
        full = lm(
            gen.sequences,
            gen.attention_mask,
            gen.num_values,
            pixel_values=prompt["pixel_values"],
            image_grid_thw=prompt["image_grid_thw"],
        )
    p = gen.prompt_length
    diff = (full.logits[:, p - 1 : p - 1 + gen.logits.shape[1]] - gen.logits).abs().max()
    assert float(diff) <= TOL


def test_split_position_ids_layouts() -> None:
    ids = torch.arange(7 * 2 * 5, dtype=torch.float32).reshape(7, 2, 5)
    text, mrope, circle = split_position_ids(ids)
    assert text is not None and text.dtype == torch.int64 and torch.equal(text, ids[0].long())
    assert torch.equal(mrope, ids[1:4]) and circle is not None and torch.equal(circle, ids[4:])
    _, mrope, circle = split_position_ids(ids[1:])
    assert torch.equal(mrope, ids[1:4]) and circle is not None
    text, mrope, circle = split_position_ids(ids[:4])
    assert text is not None and circle is None and torch.equal(mrope, ids[1:4])
    _, mrope, circle = split_position_ids(ids[0])
    assert mrope.shape == (3, 2, 5) and circle is None
    with pytest.raises(ValueError, match="expected"):
        split_position_ids(ids[:5])


def test_videos_are_refused(stock: Qwen2_5_VLForConditionalGeneration) -> None:
    model = circle_model(stock)
    with pytest.raises(ValueError, match="videos are not supported"):
        model.model.get_rope_index(
            torch.tensor([[10, 11]]), video_grid_thw=torch.tensor([[2, 4, 4]])
        )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"circle_rope_strategy": "sometimes"}, "not one of: alternate, all"),
        ({"circle_rope_alpha": 1.5}, r"circle_rope_alpha must be in \[0, 1\]"),
        ({"circle_rope_radius": "huge"}, "radius 'huge' is not understood"),
        ({"circle_rope_radius": -2.0}, ">= 0"),
        ({"circle_rope_frame_stride": float("nan")}, "frame_stride must be finite"),
    ],
)
def test_bad_configuration_is_a_clear_error(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CircleRopeQwen2_5_VLConfig(**settings, **KW)


def test_conversion_rejects_unknown_settings(stock: Qwen2_5_VLForConditionalGeneration) -> None:
    with pytest.raises(ValueError, match="not Circle-RoPE settings"):
        CircleRopeQwen2_5_VLForConditionalGeneration.from_qwen2_5_vl(stock, strategy="all")


def test_hidden_states_as_transformers_returns_them_and_no_attention_weights(
    stock: Qwen2_5_VLForConditionalGeneration,
) -> None:
    """Without transformers' private output-capturing decorators the decoder still returns
    ``hidden_states`` when asked (the embeddings and each layer's output, the last one normed,
    as the stock model gives them: equal with strategy "off"); attention weights are refused
    by name rather than silently missing."""
    prompt = inputs()
    ours = circle_model(stock, "off")
    with torch.no_grad():
        mine = ours(**prompt, output_hidden_states=True)
        types = (prompt["input_ids"] == IMAGE).int()
        theirs = stock(**prompt, mm_token_type_ids=types, output_hidden_states=True)
        plain = ours(**prompt)
    layers = KW["text_config"]["num_hidden_layers"]
    assert len(mine.hidden_states) == len(theirs.hidden_states) == layers + 1
    for a, b in zip(mine.hidden_states, theirs.hidden_states, strict=True):
        assert torch.equal(a, b)
    assert plain.hidden_states is None
    with pytest.raises(ValueError, match="attention weights"), torch.no_grad():
        ours(**prompt, output_attentions=True)
