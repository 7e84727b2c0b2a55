"""The real-checkpoint path (model.measurer.base): a tiny Qwen2.5-VL saved to a temporary
directory, as a local checkpoint would be, loads without a hub, gains [NUM], trains a projector
stage then LoRA, resumes, and saves a merged checkpoint that loads and measures without peft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ingestion.errors import ModelError
from ingestion.phantoms import generate_phantom, study_seed
from model.backbone import QWEN_SPECIAL_TOKENS, published_qwen2_5_vl_kwargs
from model.measurer.base import (
    add_lora,
    load_base_model,
    lora_parameters,
    merge_lora,
    qwen_like_tokenizer,
    write_random_base_model,
)
from model.measurer.checkpoint import NumericMode, load_checkpoint
from model.measurer.data import phantom_volume
from model.measurer.pipeline import CheckpointMeasurer
from model.measurer.pool import PhantomSource
from model.measurer.tokenizer import NUM
from model.measurer.train import StepReport, train

from measurer_helpers import small_base_config


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_base_model(tmp_path_factory.mktemp("qwen2_5_vl_tiny"), "tiny", seed=0)


def test_a_local_qwen_directory_loads_with_num_added(qwen_dir: Path) -> None:
    model, tokenizer = load_base_model(qwen_dir)
    assert NUM in tokenizer.get_vocab()
    num = tokenizer.convert_tokens_to_ids(NUM)
    rows = model.get_input_embeddings().weight
    assert rows.shape[0] == len(tokenizer) == num + 1
    torch.testing.assert_close(rows[num], rows[:-1].mean(dim=0))
    assert model.config.model_type == "circle_rope_qwen2_5_vl"
    assert tokenizer.tokenize("[NUM] x 18 mm")[0] == NUM


def test_lora_injects_and_merges_to_the_same_function(qwen_dir: Path) -> None:
    model, _ = load_base_model(qwen_dir)
    count = add_lora(model, rank=4, alpha=8)
    assert count == sum(p.numel() for p in lora_parameters(model)) > 0
    with torch.no_grad():
        for p in lora_parameters(model):
            p.normal_(0, 0.05)  # B starts at zero: make the adapters do something
    ids = torch.tensor([[1, 30, 31, 2]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        assert merge_lora(model) == 2 * 7  # 2 layers x 7 projections
        after = model(input_ids=ids).logits
    assert not lora_parameters(model)
    torch.testing.assert_close(before, after, atol=1e-5, rtol=1e-5)


def test_bad_base_directories_are_named(tmp_path: Path, qwen_dir: Path) -> None:
    with pytest.raises(ModelError, match="not a directory"):
        load_base_model(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"missing .*safetensors.*tokenizer"):
        load_base_model(tmp_path)
    odd = tmp_path / "odd"
    odd.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (odd / name).write_bytes((qwen_dir / name).read_bytes())
    processor = json.loads((qwen_dir / "preprocessor_config.json").read_text())
    processor["patch_size"] = 16
    (odd / "preprocessor_config.json").write_text(json.dumps(processor))
    with pytest.raises(ModelError, match="patch_size"):
        load_base_model(odd)


def test_projector_then_lora_training_resumes_and_ships_merged(
    qwen_dir: Path, tmp_path: Path
) -> None:
    config = small_base_config(qwen_dir, steps=4, seed=2, checkpoint_every=1)
    assert [s.trainable for s in config.stages] == ["projector", "lora"]
    whole = train(config, tmp_path / "whole", PhantomSource(1))

    class Stop(Exception):
        pass

    def stop(report: StepReport) -> None:
        if report.step == 4:  # inside the LoRA stage, state saved at step 3
            raise Stop

    with pytest.raises(Stop):
        train(config, tmp_path / "cut", PhantomSource(1), on_step=stop)
    train(config, tmp_path / "cut", PhantomSource(1))
    a, b = load_checkpoint(whole), load_checkpoint(tmp_path / "cut")
    for (name, x), (_, y) in zip(
        a.model.state_dict().items(), b.model.state_dict().items(), strict=True
    ):
        assert torch.equal(x, y), name
    assert not any("lora_" in n for n in a.model.state_dict())
    base, _ = load_base_model(qwen_dir)
    trained = a.model.state_dict()
    changed = [
        n for n, w in base.state_dict().items() if "layers" in n and not torch.equal(w, trained[n])
    ]
    assert changed and all("proj" in n for n in changed)  # LoRA merged into the projections
    assert torch.equal(  # the vision tower's blocks were frozen
        base.state_dict()["model.visual.blocks.0.attn.qkv.weight"],
        trained["model.visual.blocks.0.attn.qkv.weight"],
    )
    measurer = CheckpointMeasurer.load(whole)
    phantom = generate_phantom(study_seed(5, 0))
    result = measurer.measure(phantom_volume(phantom), source="phantom")
    assert result.model.numeric_mode == "rned_corr" and result.model.not_for_clinical_use


@pytest.mark.parametrize(
    ("shape", "parameters", "tied"), [("3b", 3_754_622_976, True), ("7b", 8_292_166_656, False)]
)
def test_published_shapes_have_the_released_sizes(shape: str, parameters: int, tied: bool) -> None:
    """3.75 B and 8.29 B parameters as released (built on the meta device: no memory)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    kwargs = published_qwen2_5_vl_kwargs(shape)
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**kwargs))
    assert sum(p.numel() for p in model.parameters()) == parameters
    output = model.get_output_embeddings()
    assert output is not None
    assert (output.weight is model.get_input_embeddings().weight) is tied
    assert kwargs["text_config"]["rope_parameters"]["mrope_section"] == [16, 24, 24]
    assert kwargs["image_token_id"] == QWEN_SPECIAL_TOKENS["<|image_pad|>"] == 151655
    with pytest.raises(ValueError, match=r"unknown Qwen2\.5-VL shape '13b'"):
        published_qwen2_5_vl_kwargs("13b")


def test_a_narrow_published_shape_loads_with_qwens_ids_and_num_after_them(tmp_path: Path) -> None:
    base = write_random_base_model(tmp_path, "3b", narrow=True, seed=0)
    model, tokenizer = load_base_model(base)
    vocab = tokenizer.get_vocab()
    assert {t: vocab[t] for t in QWEN_SPECIAL_TOKENS} == QWEN_SPECIAL_TOKENS
    assert vocab[NUM] == len(tokenizer) - 1 == max(QWEN_SPECIAL_TOKENS.values()) + 1
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert model.config.vision_config.fullatt_block_indexes == [1]  # block 0 uses windows
    assert tokenizer.tokenize("[NUM] x 18 mm") == [NUM, "x", "1", "8", "mm"]


def test_the_stand_in_tokenizer_puts_qwens_tokens_at_released_ids_or_after_the_words() -> None:
    released, compact = qwen_like_tokenizer(), qwen_like_tokenizer(released_ids=False)
    assert len(released) == max(QWEN_SPECIAL_TOKENS.values()) + 1 == 151657
    ids = [compact.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS]
    assert ids == list(range(len(compact) - len(QWEN_SPECIAL_TOKENS), len(compact)))
    assert NUM not in released.get_vocab() and NUM not in compact.get_vocab()


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    return {n for n, w in before.items() if not torch.equal(w, after[n])}


@pytest.mark.parametrize(
    ("tied", "mode"),
    [(False, NumericMode.RNED_CORR), (True, NumericMode.RNED_CORR), (False, NumericMode.XVAL)],
    ids=["untied-rned", "tied-rned", "untied-xval"],
)
def test_the_stages_train_their_parameters_and_the_num_rows_nothing_else(
    tmp_path: Path, tied: bool, mode: NumericMode
) -> None:
    """Projector stage: the vision merger, the numeric head and the [NUM] row of the output
    embeddings (shared with the input ones when tied); every other row stays as released, bit
    for bit. LoRA stage: the same plus the adapters, merged into the decoder's projections at
    the end. No numeric head reads the [NUM] input row (RNED puts the value's rotary encoding
    in its place, xVal its own scaled vector), so an untied input matrix stays as released."""
    base = write_random_base_model(tmp_path / "base", "tiny", tied=tied, seed=0)
    # one projector step, one LoRA step
    config = small_base_config(base, numeric_mode=mode, steps=2, seed=3)
    after_projector: dict[str, torch.Tensor] = {}

    def keep(report: StepReport) -> None:
        if report.step == 1 and report.lm is not None:
            for name, tensor in report.lm.model.state_dict().items():
                after_projector[name] = tensor.detach().clone()

    out = train(config, tmp_path / "run", PhantomSource(1), on_step=keep)
    start, tokenizer = load_base_model(base)  # as training starts: [NUM] added
    num = tokenizer.convert_tokens_to_ids(NUM)
    before = start.state_dict()
    embed, head = "model.language_model.embed_tokens.weight", "lm_head.weight"
    rows = {embed, head}  # state-dict names (one matrix when tied)
    trained = {head, embed} if tied else {head}

    changed = _changed(before, after_projector)
    assert {n for n in changed if ".visual.merger." not in n} == trained
    assert any(".visual.merger." in n for n in changed)
    for name in rows:
        others = torch.ones(before[name].shape[0], dtype=torch.bool)
        others[num] = False
        assert torch.equal(before[name][others], after_projector[name][others]), name

    final = load_checkpoint(out).model.state_dict()
    changed = _changed(before, final)
    projections = {n for n in changed if n.endswith("proj.weight") and "language_model" in n}
    assert projections  # LoRA merged into the decoder's projections
    assert changed - projections - trained == {n for n in changed if ".visual.merger." in n}
    for name in rows:
        others = torch.ones(before[name].shape[0], dtype=torch.bool)
        others[num] = False
        assert torch.equal(before[name][others], final[name][others]), name
