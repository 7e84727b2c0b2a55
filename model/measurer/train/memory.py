"""How much GPU memory fine-tuning a Qwen2.5-VL takes: an estimate from shapes, no weights.

``radcaliper train --dry-run`` prints :func:`estimate_training_memory` for the run it would start,
before anything is loaded: a site learns whether its card fits a 3B or 7B run (and with which
batch, checkpointing and accumulation) without a failed run. The estimate counts, in bytes:

- **weights**: the frozen weights in their dtype (``TrainConfig.weights_dtype``), the trainable
  ones (LoRA adapters, vision merger, the ``[NUM]`` logit row) in float32;
- **optimizer**: the trainable parameters' gradients and AdamW's two moments (float32);
- **weight casts**: under bf16 autocast, float32 frozen weights are cast to bf16 for every
  matmul and the cast is kept for the backward pass, so a float32 model holds a bf16 copy of
  its decoder and output matrix per task's forward pass (one backward pass follows the tasks'
  forwards); none for bf16 weights;
- **activations**: what autograd keeps per token and decoder layer (:func:`layer_bytes_per_token`:
  the RMSNorm inputs in float32, the bf16 inputs of the seven adapted projections, the LoRA
  intermediates, the attention's q, k, v and output with memory-efficient SDPA (no L x L
  scores) and the four MLP intermediates); with gradient checkpointing only each layer's input
  is kept, plus one layer's activations while it is recomputed;
- **logits**: the float32 log-softmax of every trained position over the vocabulary (kept for
  the backward pass), plus the gradients of the largest task's logits at the start of the
  backward pass;
- **vision**: the merger's inputs (the frozen tower keeps nothing: no gradient flows into it);
- **reserve**: the CUDA context, cuBLAS workspaces and allocator fragmentation (a fixed
  1 GiB plus 10 %).

The per-token terms are checked against autograd's own saved tensors at narrow widths in the
tests; the totals against the GPU figures of ``benchmarks/gpu_check.sh`` (RESULTS.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingestion.errors import ModelError
from model.measurer.train.config import TASK_NAMES, TrainConfig

__all__ = [
    "GIB",
    "MemoryEstimate",
    "ModelShape",
    "estimate_training_memory",
    "layer_bytes_per_token",
    "model_shape",
    "tokens_per_example",
]

GIB = 2**30
_RESERVE_FIXED = 1 * GIB
_RESERVE_FRACTION = 0.10
_LORA_PROJECTIONS = 7  # q, k, v, o, gate, up, down
# text tokens per example: prompt and answer with the measurer's tokenizer (counted on phantoms;
# a find answer grows by 12 tokens per finding: three findings, the longest row of a batch)
_TEXT_TOKENS = {"measure": 11, "point": 11, "axes": 35, "find": 60}
_PATCH, _MERGE = 14, 2


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Qwen2.5-VL that decide its memory."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool
    vision_hidden: int
    vision_intermediate: int
    vision_depth: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """From a Qwen2.5-VL ``config.json`` (or ``Qwen2_5_VLConfig`` keyword arguments)."""
        text = dict(config.get("text_config") or config)
        vision = dict(config["vision_config"])
        tied = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        return cls(
            vocab=int(text["vocab_size"]),
            hidden=int(text["hidden_size"]),
            intermediate=int(text["intermediate_size"]),
            layers=int(text["num_hidden_layers"]),
            heads=int(text["num_attention_heads"]),
            kv_heads=int(text["num_key_value_heads"]),
            tied=bool(tied),
            vision_hidden=int(vision["hidden_size"]),
            vision_intermediate=int(vision["intermediate_size"]),
            vision_depth=int(vision["depth"]),
        )

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    def decoder_parameters(self) -> int:
        """The decoder layers' parameters (projections with q, k, v biases, and norms)."""
        h, i, kv = self.hidden, self.intermediate, self.kv_width
        attention = h * h + h + 2 * (h * kv + kv) + h * h
        return self.layers * (attention + 3 * h * i + 2 * h)

    def merger_parameters(self) -> int:
        wide = self.vision_hidden * _MERGE**2
        return self.vision_hidden + wide * wide + wide + wide * self.hidden + self.hidden

    def parameters(self) -> int:
        """Every parameter as released (before ``[NUM]`` is added)."""
        c, iv = self.vision_hidden, self.vision_intermediate
        block = 2 * c + 3 * c * c + 3 * c + c * c + c + 2 * c * iv + 2 * iv + iv * c + c
        vision = 3 * 2 * _PATCH * _PATCH * c + self.vision_depth * block + self.merger_parameters()
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.decoder_parameters() + self.hidden + vision

    def lora_parameters(self, rank: int) -> int:
        h, i, kv = self.hidden, self.intermediate, self.kv_width
        per_layer = rank * ((h + h) + 2 * (h + kv) + (h + h) + 3 * (h + i))
        return self.layers * per_layer


def layer_bytes_per_token(shape: ModelShape, lora_rank: int) -> int:
    """Bytes autograd keeps per token in one decoder layer under bf16 autocast (module doc):
    2 RMSNorms (float32 input and statistics), the bf16 inputs of q, k, v, o, gate and up, the
    MLP's gate, up, activation and product (bf16), q, k, v and the attention output (bf16),
    the attention's float32 log-sum-exp, and each adapter's rank-wide intermediate."""
    h, i, kv = shape.hidden, shape.intermediate, shape.kv_width
    norms = 2 * (4 * h + 4)
    inputs = 6 * 2 * h
    mlp = 4 * 2 * i
    attention = 2 * h + 2 * 2 * kv + 2 * h + 4 * shape.heads  # q, k, v, output, logsumexp
    lora = _LORA_PROJECTIONS * 2 * lora_rank if lora_rank else 0
    return norms + inputs + mlp + attention + lora


def tokens_per_example(config: TrainConfig) -> dict[str, int]:
    """Tokens of one example of each task: its image's merged tokens plus text (module doc)."""
    measure = config.measure_inputs
    crop = (measure.size // (_PATCH * _MERGE)) ** 2 * max(1, math.ceil(measure.frames / 2))
    find = config.find_inputs
    plane = (find.size // (_PATCH * _MERGE)) ** 2 * (2 if find.context_mm else 1)
    images = {"measure": crop, "point": crop, "axes": crop, "find": plane}
    return {task: images[task] + _TEXT_TOKENS[task] for task in TASK_NAMES}


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated peak GPU memory of one training step, in bytes, by what holds it."""

    weights: int
    optimizer: int
    weight_casts: int
    activations: int
    logits: int
    vision: int
    reserve: int
    trainable_parameters: int
    tokens_per_step: int

    @property
    def allocated(self) -> int:
        """What torch allocates at the peak (``torch.cuda.max_memory_allocated``): the total
        less the reserve."""
        return self.total - self.reserve

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.optimizer
            + self.weight_casts
            + self.activations
            + self.logits
            + self.vision
            + self.reserve
        )

    def rows(self) -> list[tuple[str, float]]:
        """(what, GiB) for a table, the total last."""
        parts = (
            ("weights", self.weights),
            ("gradients and AdamW moments", self.optimizer),
            ("bf16 copies of float32 weights", self.weight_casts),
            ("activations", self.activations),
            ("logits", self.logits),
            ("vision merger inputs", self.vision),
            ("CUDA context, workspaces, fragmentation", self.reserve),
            ("total (peak)", self.total),
        )
        return [(what, value / GIB) for what, value in parts]


def estimate_training_memory(
    config: TrainConfig, shape: ModelShape, *, weights_dtype: str | None = None
) -> MemoryEstimate:
    """The peak GPU memory of a LoRA step of ``config`` (its batches, inputs, LoRA rank,
    gradient checkpointing and accumulation) on a model of ``shape``, with bf16 autocast.

    ``weights_dtype``: the frozen weights' dtype (``float32`` or ``bfloat16``); default the
    config's as it would resolve on a GPU.
    """
    dtype = weights_dtype or config.resolved_weights_dtype("cuda")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"weights dtype {dtype!r}: float32 or bfloat16")
    weight_bytes = 4 if dtype == "float32" else 2
    lora = config.lora_rank if any(s.trainable == "lora" for s in config.stages) else 0
    trainable = shape.lora_parameters(lora) + shape.merger_parameters() + shape.hidden
    frozen = shape.parameters() - shape.merger_parameters()
    if any(s.trainable == "all" for s in config.stages):  # the default model, from scratch
        trainable, frozen = shape.parameters(), 0
    weights = frozen * weight_bytes + trainable * 4
    optimizer = trainable * 3 * 4

    # the largest stage's examples, split into micro-batches
    per_example = tokens_per_example(config)
    counts = [config.batches(stage) for stage in config.stages]
    step = max(counts, key=lambda c: sum(c[t] * per_example[t] for t in TASK_NAMES))
    micro = max(1, config.accumulation)
    tokens = {t: math.ceil(step[t] / micro) * per_example[t] for t in TASK_NAMES}
    total_tokens = sum(tokens.values())
    casts = 0
    if weight_bytes == 4:  # bf16 copies of the decoder and output weights, per task's forward
        forwards = sum(1 for t in TASK_NAMES if tokens[t])
        casts = forwards * 2 * (shape.decoder_parameters() + shape.vocab * shape.hidden)

    layer = layer_bytes_per_token(shape, lora)
    rotary = 2 * 4 * (shape.hidden // shape.heads)  # cos and sin, float32, shared by the layers
    if config.gradient_checkpointing:
        residual = weight_bytes * shape.hidden  # each layer's input, in the stream's dtype
        activations = total_tokens * (shape.layers * residual + layer + rotary)
    else:
        activations = total_tokens * (shape.layers * layer + rotary)
    vocab = shape.vocab
    logits = 4 * vocab * total_tokens + 10 * vocab * max(tokens.values())
    merged = sum(
        math.ceil(step[t] / micro) * (per_example[t] - _TEXT_TOKENS[t]) for t in TASK_NAMES
    )
    vision = merged * shape.vision_hidden * _MERGE**2 * (4 + 2)
    subtotal = weights + optimizer + casts + activations + logits + vision
    reserve = _RESERVE_FIXED + int(_RESERVE_FRACTION * subtotal)
    return MemoryEstimate(
        weights=weights,
        optimizer=optimizer,
        weight_casts=casts,
        activations=activations,
        logits=logits,
        vision=vision,
        reserve=reserve,
        trainable_parameters=trainable,
        tokens_per_step=sum(step[t] * per_example[t] for t in TASK_NAMES),
    )


def model_shape(config: TrainConfig) -> ModelShape:
    """The shape of the model ``config`` trains: its base model's ``config.json`` (nothing
    else is read), or the default model's size.

    Raises:
        ModelError: the base model folder has no readable ``config.json``.
    """
    import json
    from pathlib import Path

    if config.base_model is None:
        from model.measurer.tasks.tokenizer import build_tokenizer
        from model.measurer.train.loop import default_model_kwargs

        return ModelShape.from_config(default_model_kwargs(config.size, build_tokenizer()))
    path = Path(config.base_model) / "config.json"
    try:
        return ModelShape.from_config(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError) as error:
        raise ModelError(
            f"--base-model {path}: not a readable Qwen2.5-VL config ({error})"
        ) from error
