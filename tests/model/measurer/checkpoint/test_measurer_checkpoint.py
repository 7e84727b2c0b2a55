"""Measurer checkpoints: save / load round trip from a local directory, and clear errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ingestion.errors import ModelError
from ingestion.phantoms import generate_phantom
from model.backbone import tiny_qwen2_5_vl_kwargs
from model.circle_rope.config import CircleRopeQwen2_5_VLConfig
from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
from model.measurer.calibrate.calibration import DecodeCheck, fit_calibration
from model.measurer.checkpoint.settings import SETTINGS_NAME, MeasurerSettings, NumericMode
from model.measurer.checkpoint.weights import build_head, load_checkpoint, save_checkpoint
from model.measurer.inputs.data import MeasureInputs, collate, encode_example, phantom_examples
from model.measurer.inputs.voting import FindVoting
from model.measurer.tasks.tokenizer import VOCAB, build_tokenizer, special_ids
from model.numeric.hf import NumericLM

INPUTS = MeasureInputs(pixel_mm=1.5, size=56, window=(40.0, 160.0), jitter_mm=0.0)


@pytest.mark.parametrize("mode", list(NumericMode))
def test_round_trip(tmp_path: Path, mode: NumericMode) -> None:
    tokenizer = build_tokenizer()
    ids = special_ids(tokenizer)
    kwargs = tiny_qwen2_5_vl_kwargs(vocab_size=len(VOCAB), special_ids=ids)
    torch.manual_seed(0)
    model = CircleRopeQwen2_5_VLForConditionalGeneration(CircleRopeQwen2_5_VLConfig(**kwargs))
    options = {"hi": 300.0, "scale": 0.1} if mode.value.startswith("rned") else {"hi": 100.0}
    head = build_head(mode, 64, {} if mode == NumericMode.STANDARD else options)
    pairs = [("diameter", float(v), float(v) + 0.5) for v in range(20)]
    settings = MeasurerSettings(
        name="radcaliper-test",
        version="0.0.1",
        numeric_mode=mode,
        measure_inputs=INPUTS,
        head={} if head is None else options,
        calibration=fit_calibration(pairs),
        decode_check=DecodeCheck(0.42, 0.01, 120),
        find_prompts=(("lesion",), ("vessel",)),
        find_voting=FindVoting.half_token(votes=2),
        training={"seed": 0},
    )
    save_checkpoint(tmp_path, model, head, tokenizer, settings)
    loaded = load_checkpoint(tmp_path)
    assert loaded.settings == settings
    assert (loaded.head is None) == (head is None)

    numeric = mode != NumericMode.STANDARD
    examples = phantom_examples(generate_phantom(3), INPUTS, np.random.default_rng(0))
    batch = collate([encode_example(e, tokenizer, numeric=numeric) for e in examples], ids["pad"])
    inputs = {"pixel_values": batch.pixel_values, "image_grid_thw": batch.image_grid_thw}
    before = NumericLM(model.eval(), head, ids["num"] if numeric else None)
    after = NumericLM(loaded.model, loaded.head, ids["num"] if numeric else None)
    with torch.no_grad():
        a = before(batch.input_ids, batch.attention_mask, batch.num_values, **inputs)
        b = after(batch.input_ids, batch.attention_mask, batch.num_values, **inputs)
    assert torch.equal(a.logits, b.logits)
    if head is not None and loaded.head is not None:
        assert torch.equal(head.decode(a.num_hidden), loaded.head.decode(b.num_hidden))
    assert loaded.tokenizer.encode("measure the lesion") == tokenizer.encode("measure the lesion")


def test_a_second_measure_window_round_trips_and_old_settings_have_none() -> None:
    inputs = dataclasses.replace(INPUTS, second_window=(-600.0, 1500.0))
    settings = MeasurerSettings(
        "radcaliper-test", "0.0.1", NumericMode.RNED_CORR, measure_inputs=inputs
    )
    data = json.loads(json.dumps(settings.to_json()))  # as written to radcaliper.json
    assert data["measure_inputs"]["second_window"] == [-600.0, 1500.0]
    assert MeasurerSettings.from_json(data) == settings
    del data["measure_inputs"]["second_window"]  # a checkpoint from before the option
    assert MeasurerSettings.from_json(data).measure_inputs.second_window is None


def test_settings_without_find_voting_run_one_find_pass() -> None:
    """A radcaliper.json written before shifted find passes existed reads as one plain pass."""
    settings = MeasurerSettings("radcaliper-test", "0.0.1", NumericMode.RNED_CORR)
    data = settings.to_json()
    assert data["find_voting"] == {"shifts": [[0, 0]], "votes": 1, "keep_unaliased": False}
    del data["find_voting"]
    assert MeasurerSettings.from_json(data).find_voting == FindVoting()


def test_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=f"{SETTINGS_NAME} is missing"):
        load_checkpoint(tmp_path)
    (tmp_path / SETTINGS_NAME).write_text(json.dumps({"format_version": 99}))
    with pytest.raises(ModelError, match="format_version 99"):
        load_checkpoint(tmp_path)


def test_settings_need_a_name() -> None:
    with pytest.raises(ValueError, match="name and a version"):
        MeasurerSettings(name="", version="1", numeric_mode=NumericMode.XVAL)


def _save_tiny_checkpoint(directory: Path, mode: NumericMode) -> None:
    """A tiny untrained measurer checkpoint of ``mode`` (its head included) in ``directory``."""
    tokenizer = build_tokenizer()
    kwargs = tiny_qwen2_5_vl_kwargs(vocab_size=len(VOCAB), special_ids=special_ids(tokenizer))
    torch.manual_seed(0)
    model = CircleRopeQwen2_5_VLForConditionalGeneration(CircleRopeQwen2_5_VLConfig(**kwargs))
    settings = MeasurerSettings(
        name="radcaliper-test",
        version="0.0.1",
        numeric_mode=mode,
        measure_inputs=INPUTS,
        head={},
        calibration=None,
        training={"seed": 0},
    )
    head = build_head(mode, kwargs["text_config"]["hidden_size"], settings.head)
    save_checkpoint(directory, model, head, tokenizer, settings)


def test_weights_that_do_not_match_the_model_are_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    _save_tiny_checkpoint(tmp_path, NumericMode.STANDARD)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(str(weights))
    dropped = next(name for name in tensors if "layers.1." in name)
    del tensors[dropped]
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(ModelError, match="1 missing"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("damage", ["missing", "cut short"])
@pytest.mark.parametrize("file", ["model.safetensors", "numeric_head.safetensors"])
def test_weights_missing_or_cut_short_are_named(tmp_path: Path, file: str, damage: str) -> None:
    _save_tiny_checkpoint(tmp_path, NumericMode.XVAL)
    damaged = tmp_path / file
    if damage == "missing":
        damaged.unlink()
    else:
        damaged.write_bytes(damaged.read_bytes()[:1000])
    head_missing = (damage, file) == ("missing", "numeric_head.safetensors")
    expected = "is missing" if head_missing else "cannot be read"
    with pytest.raises(ModelError, match=expected) as raised:
        load_checkpoint(tmp_path)
    assert str(tmp_path) in str(raised.value)
