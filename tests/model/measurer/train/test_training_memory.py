"""Memory that fits: the estimator (model.measurer.train.memory) against the released shapes and
against autograd's own saved tensors, and the levers it counts (gradient checkpointing,
accumulation, bf16 frozen weights) on a tiny local Qwen2.5-VL, trained on the CPU."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from model.backbone import published_qwen2_5_vl_kwargs
from model.measurer.checkpoint.base import add_lora, load_base_model, write_random_base_model
from model.measurer.checkpoint.weights import load_checkpoint
from model.measurer.data.sources import PhantomSource
from model.measurer.train.config import StepReport, TrainConfig
from model.measurer.train.loop import train
from model.measurer.train.memory import (
    GIB,
    ModelShape,
    estimate_training_memory,
    layer_bytes_per_token,
)

from tests.support.measurer import small_base_config


@pytest.mark.parametrize(
    ("shape", "parameters", "merger", "lora"),
    [
        ("3b", 3_754_622_976, 36_708_608, 239_468_544),
        ("7b", 8_292_166_656, 44_574_464, 322_961_408),
    ],
)
def test_the_shape_counts_the_released_parameters(
    shape: str, parameters: int, merger: int, lora: int
) -> None:
    """The counts the estimate rests on equal the real classes' (built on the meta device;
    LoRA rank 128 as peft injects it)."""
    from model.circle_rope.config import CircleRopeQwen2_5_VLConfig
    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration

    kwargs = published_qwen2_5_vl_kwargs(shape)
    counted = ModelShape.from_config(kwargs)
    with torch.device("meta"):
        model = CircleRopeQwen2_5_VLForConditionalGeneration(CircleRopeQwen2_5_VLConfig(**kwargs))
    assert sum(p.numel() for p in model.parameters()) == counted.parameters() == parameters
    assert counted.merger_parameters() == merger
    assert add_lora(model, rank=128, alpha=256) == counted.lora_parameters(128) == lora


def _saved_bytes_per_token(model: Any, lengths: tuple[int, int]) -> float:
    """Bytes autograd keeps per token of the language model under bf16 autocast: the
    difference of two sequence lengths, so that saved weights cancel out."""
    sizes = []
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    vocab = model.get_input_embeddings().weight.shape[0]
    for length in lengths:
        seen.clear()
        ids = torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(0))
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            torch.autocast("cpu", dtype=torch.bfloat16),
        ):
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
        sizes.append(sum(seen.values()))
    return (sizes[1] - sizes[0]) / (2 * (lengths[1] - lengths[0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rank", [4, 16])
def test_the_activations_per_token_are_what_autograd_keeps(
    tmp_path: Path, dtype: torch.dtype, rank: int
) -> None:
    """layer_bytes_per_token x layers is within 5 % of the bytes autograd saves per token in
    the real decoder (the 3B's layout at narrow widths, LoRA on every projection)."""
    base = write_random_base_model(tmp_path / "base", "3b", narrow=True, seed=0)
    model, _ = load_base_model(base, dtype=dtype)
    add_lora(model, rank=rank, alpha=2 * rank)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("lora_" in name)
    shape = ModelShape.from_config(json.loads((base / "config.json").read_text()))
    measured = _saved_bytes_per_token(model.model.language_model, (40, 80))
    estimated = shape.layers * layer_bytes_per_token(shape, rank)
    assert estimated == pytest.approx(measured, rel=0.05)


def test_the_estimate_counts_the_levers() -> None:
    """3B and 7B at the documented defaults (bf16 weights, checkpointing, the default batch):
    checkpointing and accumulation cut the activations, bf16 weights drop the casts, the 7B
    needs more than the 3B; every part is positive where it should be."""
    shapes = {k: ModelShape.from_config(published_qwen2_5_vl_kwargs(k)) for k in ("3b", "7b")}
    config = TrainConfig.for_base_model("unused")
    assert config.gradient_checkpointing and config.resolved_weights_dtype("cuda") == "bfloat16"
    three = estimate_training_memory(config, shapes["3b"])
    seven = estimate_training_memory(config, shapes["7b"])
    assert 0 < three.total < seven.total
    assert three.weight_casts == 0 and three.weights < 8 * GIB  # 3.75 B in bf16: 7 GiB
    no_checkpointing = dataclasses.replace(config, gradient_checkpointing=False)
    full = estimate_training_memory(no_checkpointing, shapes["3b"])
    assert full.activations > 10 * three.activations
    halves = estimate_training_memory(
        dataclasses.replace(no_checkpointing, accumulation=2), shapes["3b"]
    )
    assert halves.activations == pytest.approx(full.activations / 2, rel=0.1)
    fp32 = estimate_training_memory(config, shapes["3b"], weights_dtype="float32")
    frozen = shapes["3b"].parameters() - shapes["3b"].merger_parameters()
    assert fp32.weight_casts > 5 * GIB and fp32.weights - three.weights == 2 * frozen
    assert three.trainable_parameters == 239_468_544 + 36_708_608 + 2048
    assert [what for what, _ in three.rows()][-1] == "total (peak)"
    with pytest.raises(ValueError, match="bfloat16"):
        estimate_training_memory(config, shapes["3b"], weights_dtype="float16")


def _final_state(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(out).model.state_dict()


def test_checkpointing_trains_the_same_weights(tmp_path: Path) -> None:
    """Recomputing activations in the backward pass changes memory, not the result."""
    base = write_random_base_model(tmp_path / "base", "tiny", seed=0)
    plain = small_base_config(base, steps=2, seed=6, gradient_checkpointing=False)
    checkpointed = dataclasses.replace(plain, gradient_checkpointing=True)
    a = _final_state(train(plain, tmp_path / "plain", PhantomSource(1)))
    b = _final_state(train(checkpointed, tmp_path / "checkpointed", PhantomSource(1)))
    for name, tensor in a.items():
        torch.testing.assert_close(tensor, b[name], rtol=1e-5, atol=1e-6, msg=name)

    # and it is on: per token, the decoder keeps each layer's input, not its activations
    from model._transformers import enable_checkpointing

    model, _ = load_base_model(base)
    add_lora(model, rank=4, alpha=8)
    model.train()
    language = model.model.language_model
    full = _saved_bytes_per_token(language, (40, 80))
    enable_checkpointing(model)
    kept = _saved_bytes_per_token(language, (40, 80))
    shape = ModelShape.from_config(json.loads((base / "config.json").read_text()))
    assert kept < full / 3 and kept >= shape.layers * 4 * shape.hidden


def test_accumulation_splits_the_step_into_micro_batches(tmp_path: Path) -> None:
    """Two micro-batches see the same examples as one batch: the step's loss agrees (each
    part weighted by its share of the examples), and the run trains."""
    base = write_random_base_model(tmp_path / "base", "tiny", seed=0)
    config = small_base_config(base, steps=2, seed=6, measure_batch=4, point_batch=2)
    losses: dict[int, list[float]] = {1: [], 2: []}
    for parts in (1, 2):

        def keep(report: StepReport, parts: int = parts) -> None:
            losses[parts].append(report.loss)

        run = dataclasses.replace(config, accumulation=parts)
        train(run, tmp_path / f"acc{parts}", PhantomSource(1), on_step=keep)
    assert losses[2][0] == pytest.approx(losses[1][0], rel=0.05)
    assert all(torch.isfinite(torch.tensor(losses[2])))
    with pytest.raises(ValueError, match="accumulation"):
        dataclasses.replace(config, accumulation=0)


def test_bf16_frozen_weights_train_float32_parameters(tmp_path: Path) -> None:
    """weights_dtype bfloat16: the frozen weights are held in bf16, everything trained (the
    merger, the adapters, the [NUM] row, the head) in float32, under bf16 autocast."""
    base = write_random_base_model(tmp_path / "base", "tiny", seed=0)
    config = small_base_config(base, steps=2, seed=6, weights_dtype="bfloat16")
    dtypes: dict[str, torch.dtype] = {}
    trained: set[str] = set()

    def keep(report: StepReport) -> None:
        assert report.lm is not None
        for name, parameter in report.lm.named_parameters():
            dtypes[name] = parameter.dtype
            if parameter.requires_grad:
                trained.add(name)

    out = train(config, tmp_path / "run", PhantomSource(1), on_step=keep)
    assert trained and all(dtypes[n] == torch.float32 for n in trained)
    frozen = {n for n in dtypes if n not in trained}
    assert frozen and all(dtypes[n] == torch.bfloat16 for n in frozen)
    assert any("lora_" in n for n in trained) and "num_row.weight" in trained
    load_checkpoint(out)
    with pytest.raises(ValueError, match="needs a base model"):
        TrainConfig(weights_dtype="bfloat16")
