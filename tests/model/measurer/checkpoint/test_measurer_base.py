"""The real-checkpoint path (model.measurer.checkpoint.base): a tiny Qwen2.5-VL saved to a temporary
directory, as a local checkpoint would be, loads without a hub, gains [NUM], trains a projector
stage then LoRA, resumes, and saves a merged checkpoint that loads and measures without peft."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ingestion.errors import ModelError
from ingestion.phantoms import generate_phantom, study_seed
from model.backbone import QWEN_SPECIAL_TOKENS, published_qwen2_5_vl_kwargs
from model.measurer.checkpoint.base import (
    add_lora,
    base_weights_hash,
    load_base_model,
    lora_parameters,
    merge_lora,
    qwen_like_tokenizer,
    write_random_base_model,
)
from model.measurer.checkpoint.settings import BaseReference, MeasurerSettings, NumericMode
from model.measurer.checkpoint.weights import (
    export_checkpoint,
    load_checkpoint,
    save_delta_checkpoint,
)
from model.measurer.data.sources import PhantomSource
from model.measurer.infer.pipeline import CheckpointMeasurer
from model.measurer.inputs.data import phantom_volume
from model.measurer.tasks.tokenizer import NUM
from model.measurer.train.config import StepReport
from model.measurer.train.loop import train

from tests.support.measurer import small_base_config


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
    """Projector stage: the vision merger, the numeric head and the [NUM] logit row, held
    apart from the frozen embedding matrices; LoRA stage: the same plus the adapters. The
    checkpoint has the adapters merged and the row written into the output embeddings (shared
    with the input ones when tied): every other row stays as released, bit for bit. No numeric
    head reads the [NUM] input row (RNED puts the value's rotary encoding in its place, xVal
    its own scaled vector), so an untied input matrix stays as released."""
    base = write_random_base_model(tmp_path / "base", "tiny", tied=tied, seed=0)
    # one projector step, one LoRA step
    config = small_base_config(base, numeric_mode=mode, steps=2, seed=3)
    snapshots: list[dict[str, torch.Tensor]] = []

    def keep(report: StepReport) -> None:
        assert report.lm is not None
        snapshots.append({n: t.detach().clone() for n, t in report.lm.state_dict().items()})

    out = train(config, tmp_path / "run", PhantomSource(1), on_step=keep)
    start, tokenizer = load_base_model(base)  # as training starts: [NUM] added
    num = tokenizer.convert_tokens_to_ids(NUM)
    before = {"model." + n: t for n, t in start.state_dict().items()}
    before["num_row.weight"] = start.get_output_embeddings().weight.detach()[num].clone()
    embed, head = "model.language_model.embed_tokens.weight", "lm_head.weight"
    rows = {embed, head}  # state-dict names (one matrix when tied)
    trained = {head, embed} if tied else {head}

    after_projector = snapshots[0]
    changed = _changed(before, after_projector)
    assert "num_row.weight" in changed
    assert changed - {"num_row.weight"} == {n for n in changed if ".visual.merger." in n} != set()

    final = load_checkpoint(out).model.state_dict()
    changed = _changed(
        {n[len("model.") :]: t for n, t in before.items() if n[:6] == "model."}, final
    )
    projections = {n for n in changed if n.endswith("proj.weight") and "language_model" in n}
    assert projections  # LoRA merged into the decoder's projections
    assert changed - projections - trained == {n for n in changed if ".visual.merger." in n}
    for name in rows:
        others = torch.ones(final[name].shape[0], dtype=torch.bool)
        others[num] = False
        assert torch.equal(start.state_dict()[name][others], final[name][others]), name
    assert torch.equal(final[head][num], snapshots[-1]["num_row.weight"])


def _size(directory: Path, pattern: str = "*") -> int:
    return sum(f.stat().st_size for f in directory.glob(pattern) if f.is_file())


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_fine_tuned_checkpoint_holds_what_changed_and_exports_standalone(
    tmp_path: Path, tied: bool
) -> None:
    """The checkpoint of a base-model run (the 3B's vocabulary and ids at narrow widths, tied
    and untied): the adapters, the merger, the [NUM] rows and the head, at most 10 % of the
    model's weights; it needs its base (hash checked; a moved base is named), and
    ``export_checkpoint`` writes the same model standalone, bit for bit, which transformers'
    Auto classes load once radcaliper's model package is imported."""
    base = write_random_base_model(tmp_path / "base", "3b", narrow=True, tied=tied, seed=0)
    config = small_base_config(base, steps=2, seed=4)
    out = train(config, tmp_path / "run", PhantomSource(1))
    files = {f.name for f in out.iterdir()}
    assert "delta.safetensors" in files and not files & {"model.safetensors", "config.json"}
    settings = json.loads((out / "radcaliper.json").read_text())
    assert settings["format_version"] == 2
    assert settings["base_model"]["path"] == str(base.resolve())
    assert settings["base_model"]["lora_rank"] == 4
    weights = _size(out, "*.safetensors")
    assert weights <= 0.10 * _size(base, "*.safetensors"), (weights, _size(base))

    loaded = load_checkpoint(out)
    standalone = load_checkpoint(export_checkpoint(out, tmp_path / "export"))
    assert (tmp_path / "export" / "model.safetensors").is_file()
    assert "base_model" not in json.loads((tmp_path / "export" / "radcaliper.json").read_text())
    for (name, x), (_, y) in zip(
        loaded.model.state_dict().items(), standalone.model.state_dict().items(), strict=True
    ):
        assert torch.equal(x, y), name
    assert dataclasses.replace(loaded.settings, base_model=None) == standalone.settings
    from transformers import AutoModelForImageTextToText  # registered by radcaliper's import

    auto = AutoModelForImageTextToText.from_pretrained(tmp_path / "export", local_files_only=True)
    assert type(auto) is type(standalone.model)
    for name, tensor in auto.state_dict().items():
        assert torch.equal(tensor, standalone.model.state_dict()[name]), name

    moved = tmp_path / "moved"
    base.rename(moved)
    with pytest.raises(ModelError, match="which is not there"):
        load_checkpoint(out)
    assert torch.equal(
        load_checkpoint(out, base_model=moved).model.lm_head.weight, loaded.model.lm_head.weight
    )
    other = write_random_base_model(tmp_path / "other", "3b", narrow=True, tied=tied, seed=1)
    with pytest.raises(ModelError, match="other weights"):
        load_checkpoint(out, base_model=other)


def test_a_run_started_from_a_checkpoint_saves_a_standalone_model(tmp_path: Path) -> None:
    """--init from a fine-tuned checkpoint: its merged weights are not the base's, so the
    result cannot be a delta of the base model; it is saved whole."""
    base = write_random_base_model(tmp_path / "base", "tiny", tied=False, seed=0)
    config = small_base_config(base, steps=2, seed=4, lora_rank=1, lora_alpha=2)
    first = train(config, tmp_path / "first", PhantomSource(1))
    again = small_base_config(
        base, steps=2, seed=5, lora_rank=1, lora_alpha=2, init_from=str(first)
    )
    out = train(again, tmp_path / "second", PhantomSource(1))
    assert (out / "model.safetensors").is_file() and not (out / "delta.safetensors").exists()
    assert "base_model" not in json.loads((out / "radcaliper.json").read_text())
    load_checkpoint(out)


def test_a_delta_is_stored_in_its_base_models_dtype(tmp_path: Path) -> None:
    """bf16 base weights: the delta is stored in bf16 (as precise as what it changes), and
    the dtype is read from the safetensors headers, mostly-bf16 winning over a float32 rest."""
    from safetensors.torch import save_file

    from model.measurer.checkpoint.base import base_weights_dtype

    save_file(
        {"a": torch.zeros(64, dtype=torch.bfloat16), "b": torch.zeros(8)},
        tmp_path / "x.safetensors",
    )
    save_file({"c": torch.zeros(64, dtype=torch.bfloat16)}, tmp_path / "y.safetensors")
    assert base_weights_dtype(tmp_path) == torch.bfloat16
    with pytest.raises(ModelError, match="no floating-point"):
        base_weights_dtype(tmp_path / "nothing")

    base = write_random_base_model(tmp_path / "base", "tiny", seed=0)
    model, tokenizer = load_base_model(base)
    add_lora(model, rank=2, alpha=4)
    settings = MeasurerSettings(
        "m",
        "1",
        NumericMode.RNED_CORR,
        base_model=BaseReference(str(base), base_weights_hash(base), 2, 4),
    )
    num = tokenizer.convert_tokens_to_ids(NUM)
    out = save_delta_checkpoint(
        tmp_path / "d", model, None, tokenizer, settings, num, dtype=torch.bfloat16
    )
    delta = load_file(out / "delta.safetensors")
    assert delta and {t.dtype for t in delta.values()} == {torch.bfloat16}
    assert any("lora_A" in n for n in delta) and "num_rows.output" in delta


def test_a_real_checkpoints_prompts_are_in_its_chat_format(tmp_path: Path) -> None:
    """With a chat template (Qwen's stand-in here; a released tokenizer brings its own) a
    prompt is Qwen2.5-VL's system and user turns with the image first, then the opening of
    the assistant's turn; only the answer and its <|im_end|> are labels; the saved tokenizer
    keeps the template, so a trained checkpoint prompts the same way."""
    from tokenizers import AddedToken

    from model.measurer.inputs.data import MeasureExample, encode_example
    from model.measurer.tasks.tokenizer import build_tokenizer, chat_prompt, special_ids

    tokenizer = qwen_like_tokenizer(released_ids=False)
    tokenizer.add_tokens([AddedToken(NUM, normalized=False, special=False)])  # as loading does
    assert chat_prompt(tokenizer, "measure the lesion") == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "<|vision_start|><|image_pad|><|vision_end|>measure the lesion<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    images = torch.zeros((1, 3, 56, 56), dtype=torch.float32)
    example = MeasureExample("lesion", images, "measure the lesion", "32.5 x 18 mm")
    encoded = encode_example(example, tokenizer, numeric=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded.input_ids)
    n = tokens.count("<|image_pad|>")
    assert n == 4 and tokens[:7] == [
        "<|im_start|>",
        "system",
        "You",
        "are",
        "a",
        "helpful",
        "assistant",
    ]
    start = tokens.index("<|vision_start|>")
    assert tokens[start - 2 : start] == ["<|im_start|>", "user"]
    labelled = [t for t, label in zip(tokens, encoded.labels, strict=True) if label != -100]
    assert labelled == [NUM, "x", NUM, "mm", "<|im_end|>"]
    assert tokens[-len(labelled) - 2 : -len(labelled)] == ["<|im_start|>", "assistant"]
    assert encoded.num_values == (32.5, 18.0)

    tokenizer.save_pretrained(tmp_path / "tok")
    from model.measurer.tasks.tokenizer import load_tokenizer

    assert chat_prompt(load_tokenizer(tmp_path / "tok"), "x") == chat_prompt(tokenizer, "x")
    plain = build_tokenizer()  # the default model: the bare layout, as it was trained
    assert chat_prompt(plain, "x") is None
    bare = encode_example(example, plain, numeric=True)
    ids = special_ids(plain)
    assert bare.input_ids[:2] == [ids["bos"], ids["vision_start"]]
    tokenizer.chat_template = "{{ messages[0]['content'][1]['text'] }}"  # renders no image
    with pytest.raises(ValueError, match="one image"):
        encode_example(example, tokenizer)
