"""Measure-task inputs (model.measurer.inputs.data): phantom crops, tokens, batches, and one
training step of the real tiny Circle-RoPE Qwen2.5-VL with the RNED head on them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ingestion.phantoms import Phantom, generate_phantom
from ingestion.volume import SourceFormat
from model.backbone import tiny_qwen2_5_vl_kwargs
from model.circle_rope.config import CircleRopeQwen2_5_VLConfig
from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
from model.measurer.inputs.data import (
    IGNORE,
    MeasureInputs,
    collate,
    encode_example,
    finding_patches,
    phantom_examples,
    phantom_volume,
)
from model.measurer.inputs.find import FindInputs
from model.measurer.inputs.images import image_token_count
from model.measurer.results import FindingKind
from model.measurer.tasks.text import parse_measure, with_values
from model.measurer.tasks.tokenizer import VOCAB, build_tokenizer, special_ids
from model.numeric.codec import RotaryNumberCodec
from model.numeric.hf import NumericLM
from model.numeric.rned_head import RnedHead

INPUTS = MeasureInputs(pixel_mm=1.5, size=56, jitter_mm=0.0)  # small and fast


@pytest.fixture(scope="module")
def phantom() -> Phantom:
    return generate_phantom(11)


def test_phantom_volume_is_the_phantom(phantom: Phantom) -> None:
    volume = phantom_volume(phantom)
    assert volume.source_format == SourceFormat.SYNTHETIC
    assert np.array_equal(volume.voxels, phantom.hu.astype(np.float32))
    assert volume.geometry == phantom.geometry
    assert volume.identifiers.patient_id == phantom.patient_id
    assert volume.identifiers.sop_instance_uids == tuple(phantom.sop_instance_uids)


def test_examples_carry_the_truth_and_a_centred_finding(phantom: Phantom) -> None:
    examples = phantom_examples(phantom, INPUTS, np.random.default_rng(0))
    assert len(examples) == len(phantom.findings)
    for example, finding in zip(examples, phantom.findings, strict=True):
        assert example.kind == FindingKind(finding.kind)
        assert example.images.shape == (1, 3, 56, 56)
        assert example.answer is not None
        parsed = parse_measure(example.answer, example.kind)
        assert parsed.success
        truth = (
            (finding.long_axis_mm, finding.short_axis_mm)
            if finding.kind == "lesion"
            else (finding.diameter_mm,)
        )
        assert parsed.values == pytest.approx(truth, abs=0.05)
        # the finding differs from its surroundings at the centre of the crop (contrast channel 0)
        image = example.images[0, 0]
        centre, corner = float(image[26:30, 26:30].mean()), float(image[:4, :4].mean())
        assert abs(centre - corner) > 0.05


def test_a_second_window_is_the_third_channel(phantom: Phantom) -> None:
    """With ``second_window`` the crop's third channel shows the HU through that window and
    the first two are the first window's contrast encoding; windows given as JSON lists are
    kept as tuples."""
    lung = MeasureInputs(
        pixel_mm=1.5, size=56, jitter_mm=0.0, window=[40, 160], second_window=[-600, 1500]
    )
    assert lung.window == (40.0, 160.0) and lung.second_window == (-600.0, 1500.0)
    one = dataclasses.replace(lung, second_window=None)
    rng = np.random.default_rng(0)
    two_windows = phantom_examples(phantom, lung, rng)
    one_window = phantom_examples(phantom, one, np.random.default_rng(0))
    volume = phantom_volume(phantom)
    for example, plain, finding in zip(two_windows, one_window, phantom.findings, strict=True):
        assert example.images.shape == plain.images.shape == (1, 3, 56, 56)
        torch.testing.assert_close(example.images[:, :2], plain.images[:, :2])
        torch.testing.assert_close(example.images[:, 1], 1.0 - example.images[:, 0])
        # the crop's centre pixel through the lung window [-1350, 150] HU
        index = np.rint(volume.geometry.lps_to_index(np.asarray(finding.center_lps_mm)))
        hu = float(volume.voxels[tuple(int(i) for i in index)])
        centre = float(example.images[0, 2, 27:29, 27:29].mean())
        assert centre == pytest.approx(min(max((hu + 1350.0) / 1500.0, 0.0), 1.0), abs=0.05)
    assert not torch.equal(two_windows[0].images[:, 2], one_window[0].images[:, 2])


def test_jitter_moves_the_crop_and_is_seeded(phantom: Phantom) -> None:
    jittered = MeasureInputs(pixel_mm=1.5, size=56, jitter_mm=6.0)
    a = phantom_examples(phantom, jittered, np.random.default_rng(3))
    b = phantom_examples(phantom, jittered, np.random.default_rng(3))
    c = phantom_examples(phantom, INPUTS, np.random.default_rng(3))
    assert all(torch.equal(x.images, y.images) for x, y in zip(a, b, strict=True))
    assert any(not torch.equal(x.images, y.images) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("numeric", [True, False], ids=["num-tokens", "standard-tokens"])
def test_encoding_and_collate(phantom: Phantom, numeric: bool) -> None:
    tokenizer = build_tokenizer()
    ids = special_ids(tokenizer)
    examples = phantom_examples(phantom, INPUTS, np.random.default_rng(0))
    encoded = [encode_example(e, tokenizer, numeric=numeric) for e in examples]
    for e, example in zip(encoded, examples, strict=True):
        assert e.input_ids.count(ids["image"]) == image_token_count(e.image_grid_thw)
        answer = [t for t, label in zip(e.input_ids, e.labels, strict=True) if label != IGNORE]
        assert answer[-1] == ids["eos"]
        text = tokenizer.decode(answer[:-1]).strip()
        if numeric:
            assert answer.count(ids["num"]) == len(e.num_values) > 0
            text = with_values(text, e.num_values)
        else:
            assert ids["num"] not in answer and e.num_values == ()
        assert (
            parse_measure(text, example.kind).values
            == parse_measure(example.answer or "", example.kind).values
        )
    batch = collate(encoded, ids["pad"])
    lengths = [len(e.input_ids) for e in encoded]
    assert batch.input_ids.shape == (len(encoded), max(lengths))
    assert batch.attention_mask.sum(dim=1).tolist() == lengths
    assert bool(batch.attention_mask[:, -1].all())  # left padded
    assert batch.num_values.tolist() == [v for e in encoded for v in e.num_values]
    assert batch.image_grid_thw.shape == (len(encoded), 3)
    with pytest.raises(ValueError, match="at least one"):
        collate([], 0)


def test_a_training_step_on_the_real_tiny_model(phantom: Phantom) -> None:
    """The batch drives NumericLM on the Circle-RoPE model: finite loss at the [NUM] targets,
    gradients reach the vision tower."""
    tokenizer = build_tokenizer()
    kwargs = tiny_qwen2_5_vl_kwargs(vocab_size=len(VOCAB), special_ids=special_ids(tokenizer))
    torch.manual_seed(0)
    model = CircleRopeQwen2_5_VLForConditionalGeneration(CircleRopeQwen2_5_VLConfig(**kwargs))
    codec = RotaryNumberCodec(64, hi=300.0, scale=0.1)
    lm = NumericLM(
        model, RnedHead(codec, loss_options={"sigma": 3.0}), special_ids(tokenizer)["num"]
    )
    examples = phantom_examples(phantom, INPUTS, np.random.default_rng(0))
    batch = collate([encode_example(e, tokenizer) for e in examples], special_ids(tokenizer)["pad"])
    out = lm(
        batch.input_ids,
        batch.attention_mask,
        batch.num_values,
        labels=batch.labels,
        pixel_values=batch.pixel_values,
        image_grid_thw=batch.image_grid_thw,
    )
    assert out.loss is not None and torch.isfinite(out.loss)
    assert out.num_hidden.shape[0] == batch.num_values.shape[0]
    out.loss.backward()
    patch_embed = model.model.visual.patch_embed.proj.weight
    assert patch_embed.grad is not None and float(patch_embed.grad.abs().sum()) > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pixel_mm": 0.0}, "pixel_mm"),
        ({"size": 50}, "multiple of 28"),
        ({"frames": 0}, "frames"),
        ({"jitter_mm": -1.0}, "jitter_mm"),
        ({"window": (40.0, 0.0)}, "window width must be > 0"),
        ({"window": (40.0, float("nan"))}, "window must be two finite numbers"),
        ({"second_window": (-600.0,)}, r"second_window must be \(level, width\)"),
        ({"second_window": (-600.0, -1.0)}, "second_window width must be > 0"),
        ({"second_window": (-600.0, 1500.0), "contrast": False}, "needs contrast"),
    ],
)
def test_bad_inputs_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MeasureInputs(**kwargs)


def test_find_windows_are_checked_and_read_from_json_lists_as_tuples() -> None:
    """Find and measure inputs check windows with the same rule (``images.hu_window``)."""
    find = FindInputs(soft_window=[40, 160], wide_window=[100, 600])  # as read from JSON
    assert find.soft_window == (40.0, 160.0) and find.wide_window == (100.0, 600.0)
    with pytest.raises(ValueError, match="wide_window width must be > 0"):
        FindInputs(wide_window=(100.0, 0.0))
    with pytest.raises(ValueError, match=r"soft_window must be \(level, width\)"):
        FindInputs(soft_window=(40.0, 160.0, 1.0))


@pytest.mark.parametrize(
    "inputs",
    [
        MeasureInputs(pixel_mm=1.5, size=56, jitter_mm=3.0),
        MeasureInputs(pixel_mm=0.75, size=112, window=(40.0, 160.0), frames=3, slice_mm=2.0),
    ],
)
def test_patches_give_the_crops_of_the_whole_phantom(
    phantom: Phantom, inputs: MeasureInputs
) -> None:
    """Without jitter a crop cut from a finding's patch equals the crop from the whole volume
    (same voxels, same interpolation); with jitter, crops are fresh per draw and seeded. Patches
    are far smaller than the phantom."""
    patches = finding_patches(phantom_volume(phantom), phantom.findings, inputs)
    assert [p.kind for p in patches] == [FindingKind(f.kind) for f in phantom.findings]
    still = dataclasses.replace(inputs, jitter_mm=0.0)
    whole = phantom_examples(phantom, still, np.random.default_rng(0))
    for patch, full in zip(patches, whole, strict=True):
        assert patch.hu.dtype == np.float16 and patch.hu.nbytes < phantom.hu.nbytes / 4
        cut = patch.example(still, np.random.default_rng(0))
        torch.testing.assert_close(cut.images, full.images, atol=1e-6, rtol=0)
        assert cut.answer == full.answer
        a = patch.example(inputs, np.random.default_rng(7)).images
        b = patch.example(inputs, np.random.default_rng(7)).images
        c = patch.example(inputs, np.random.default_rng(8)).images
        assert torch.equal(a, b) and not torch.equal(a, c)
