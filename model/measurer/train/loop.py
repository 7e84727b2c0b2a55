"""Training the measurer: both tasks, two stages, deterministic and resumable.

Each step draws a batch of measure crops and a batch of find planes from the :class:`StudyPool`
(the step's own generator, so a resumed run draws the same batches), runs ``NumericLM`` on each
and minimises the sum of their losses, each ``CE + lambda * numeric loss`` with ``lambda``
ramped linearly (``LambdaRamp``) over the first :attr:`TrainConfig.lambda_ramp_steps`.

Stages (:class:`Stage`) run one after the other with their own optimiser and schedule (linear
warm-up, cosine decay to 10 %): the default model, trained from scratch, has stage 1 with a wide
RNED label (``sigma`` 3 -> 1 mm: the candidate softmax has no coarse signal from scratch with a
narrow one) and stage 2 refining at a lower rate with a narrow label (1 -> 0.5 mm). A real
Qwen2.5-VL (``model.measurer.checkpoint.base``) trains the projector first, then LoRA adapters.

State (``OUT/train_state``) is written every :attr:`TrainConfig.checkpoint_every` steps and at
the end: the model and head as safetensors, the AdamW moments as safetensors, and
``state.json`` (step, stage, config). ``train(..., resume=True)`` continues from it; the
result equals an uninterrupted run on the same machine and thread count.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from ingestion.errors import ConfigurationError
from model.measurer.checkpoint.domain import Domain
from model.measurer.checkpoint.settings import BaseReference, MeasurerSettings
from model.measurer.checkpoint.weights import build_head, save_checkpoint, save_delta_checkpoint
from model.measurer.data.pool import StudyPool
from model.measurer.data.study import StudySource
from model.measurer.inputs.data import collate, encode_example
from model.measurer.tasks.tokenizer import VOCAB, build_tokenizer, special_ids
from model.measurer.train.config import (
    BackboneSize,
    Stage,
    StepReport,
    TrainConfig,
)
from model.measurer.train.domain import domain_for_training
from model.measurer.train.state import (
    NUM_ROW,
    STATE_DIR,
    STATE_NAME,
    _load_moments,
    _load_state,
    _Run,
    _save_state,
    _tuned,
)
from model.numeric.hf import NumericLM
from model.numeric.losses import LambdaRamp

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
    from model.measurer.inputs.data import Prompted

__all__ = [
    "build_default_model",
    "default_model_kwargs",
    "train",
]

logger = logging.getLogger(__name__)


def build_default_model(
    size: BackboneSize, tokenizer: PreTrainedTokenizerBase
) -> CircleRopeQwen2_5_VLForConditionalGeneration:
    """A fresh default model: tiny Circle-RoPE Qwen2.5-VL over the default tokenizer."""
    from model.circle_rope.config import CircleRopeQwen2_5_VLConfig
    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration

    kwargs = default_model_kwargs(size, tokenizer)
    config = CircleRopeQwen2_5_VLConfig(circle_rope_strategy=size.circle_rope_strategy, **kwargs)
    return CircleRopeQwen2_5_VLForConditionalGeneration(config)


def default_model_kwargs(size: BackboneSize, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """The default model's ``Qwen2_5_VLConfig`` keyword arguments at ``size``."""
    from model.backbone import tiny_qwen2_5_vl_kwargs

    kwargs = tiny_qwen2_5_vl_kwargs(
        hidden_size=size.hidden_size,
        num_layers=size.num_layers,
        num_heads=size.num_heads,
        num_kv_heads=size.num_kv_heads,
        vocab_size=len(VOCAB),
        special_ids=special_ids(tokenizer),
        initializer_range=size.initializer_range,
        vision_hidden=size.vision_hidden,
    )
    kwargs["vision_config"]["depth"] = size.vision_depth
    kwargs["vision_config"]["fullatt_block_indexes"] = list(range(size.vision_depth))
    return kwargs


# --- the loop ------------------------------------------------------------------------------------


def _trainable(lm: NumericLM, stage: Stage) -> list[nn.Parameter]:
    """Set ``requires_grad`` for the stage and return the trainable parameters.

    ``projector`` and ``lora`` (a real checkpoint) train the vision merger, the numeric head and
    the ``[NUM]`` logit row (``NUM_ROW``, a :class:`~model.measurer.checkpoint.base.NumLogitRow`;
    the embedding matrices stay frozen), and ``lora`` the adapters too (:func:`_tuned`)."""
    for name, parameter in lm.named_parameters():
        parameter.requires_grad_(stage.trainable == "all" or _tuned(name))
    return [p for p in lm.parameters() if p.requires_grad]


def _lr_factor(step_in_stage: int, stage: Stage) -> float:
    """Linear warm-up, then cosine from 1 to 0.1 over the rest of the stage."""
    if step_in_stage < stage.warmup_steps:
        return (step_in_stage + 1) / stage.warmup_steps
    rest = max(1, stage.steps - stage.warmup_steps)
    progress = min(1.0, (step_in_stage - stage.warmup_steps) / rest)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def _task_loss(
    run: _Run,
    examples: Sequence[Prompted],
    lambda_: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    encoded = [encode_example(e, run.tokenizer, numeric=run.numeric) for e in examples]
    batch = collate(encoded, run.pad_id)
    device = run.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=run.autocast):
        out = run.lm(
            batch.input_ids.to(device),
            batch.attention_mask.to(device),
            batch.num_values.to(device) if run.numeric else None,
            labels=batch.labels.to(device),
            lambda_=lambda_,
            pixel_values=batch.pixel_values.to(device),
            image_grid_thw=batch.image_grid_thw.to(device),
        )
    assert out.loss is not None
    return out.loss, out.numeric_loss


def _value(loss: torch.Tensor | None) -> float | None:
    return None if loss is None else float(loss.detach())


def _set_sigma(lm: NumericLM, stage: Stage, step_in_stage: int) -> None:
    head: Any = lm.numeric_head
    if head is None or getattr(head, "loss_name", None) != "softmax":
        return
    start, end = stage.sigma
    fraction = step_in_stage / max(1, stage.steps - 1)
    head.loss_options["sigma"] = start + (end - start) * min(1.0, fraction)


def _step_generators(seed: int, step: int) -> tuple[np.random.Generator, torch.Generator]:
    rng = np.random.default_rng([seed, step, 7])
    generator = torch.Generator().manual_seed(int(rng.integers(0, 2**62)))
    return rng, generator


def _settings(
    config: TrainConfig,
    name: str,
    version: str,
    head: Mapping[str, Any],
    provenance: Mapping[str, Any],
    domain: Domain,
) -> MeasurerSettings:
    return MeasurerSettings(
        name=name,
        version=version,
        numeric_mode=config.numeric_mode,
        measure_inputs=dataclasses.replace(config.measure_inputs, jitter_mm=0.0, jitter_z_mm=0.0),
        find_inputs=config.find_inputs,
        tasks=("find", "measure", "point", *(("axes",) if config.axes_batch else ())),
        # clicks anywhere on a finding train the point task to confirm off-centre candidates
        verify_candidates=config.pool.click_fraction > 0
        and any(config.batches(stage)["point"] for stage in config.stages),
        find_voting=config.find_voting,
        find_prompts=config.find_prompts,
        head=head,
        training={**provenance, "config": config.to_json()},
        domain=domain,
    )


def _build(
    config: TrainConfig, device: torch.device
) -> tuple[NumericLM, PreTrainedTokenizerBase, dict[str, Any]]:
    """The model to train (default or ``config.base_model``, its frozen weights in
    ``config.weights_dtype`` on ``device``), its tokenizer and head options."""
    torch.manual_seed(config.seed)
    options = config.head_options()
    tokenizer: PreTrainedTokenizerBase
    model: Any
    if config.base_model is None:
        tokenizer = build_tokenizer()
        model = build_default_model(config.size, tokenizer)
    else:
        from model.measurer.checkpoint.base import load_base_model

        dtype = getattr(torch, config.resolved_weights_dtype(device.type))
        model, tokenizer = load_base_model(
            config.base_model, circle_rope_strategy=config.size.circle_rope_strategy, dtype=dtype
        )
        model.model.visual.merger.float()  # trained: float32 whatever the frozen weights are
        if "scale" in options:  # the codec's base vector at the scale of the real embeddings
            options["scale"] = float(model.get_input_embeddings().weight.detach().float().std())
    dim = int(model.config.text_config.hidden_size)
    head = build_head(config.numeric_mode, dim, options)
    if config.init_from is not None:  # continue from a trained checkpoint's weights
        from model.measurer.checkpoint.weights import load_checkpoint

        start = load_checkpoint(config.init_from)
        if start.settings.numeric_mode != config.numeric_mode:
            raise ConfigurationError(
                f"--init {config.init_from} is a {start.settings.numeric_mode} model; this run "
                f"trains {config.numeric_mode}"
            )
        model.load_state_dict(start.model.state_dict())
        if head is not None and start.head is not None:
            module: Any = head
            module.load_state_dict(cast(Any, start.head).state_dict())
    num = special_ids(tokenizer)["num"] if head is not None else None
    return NumericLM(model, head, num), tokenizer, options


def _lora_from(config: TrainConfig) -> int | None:
    """The global step at which LoRA adapters are added (the first "lora" stage), or None."""
    begin = 0
    for stage in config.stages:
        if stage.trainable == "lora":
            return begin
        begin += stage.steps
    return None


def train(
    config: TrainConfig,
    out_dir: str | Path,
    source: StudySource,
    *,
    name: str | None = None,
    version: str = "0.1.0",
    provenance: Mapping[str, Any] | None = None,
    resume: bool = True,
    on_step: Callable[[StepReport], None] | None = None,
    on_study: Callable[[int], None] | None = None,
    device: str | torch.device | None = None,
    domain: Domain | None = None,
) -> Path:
    """Train the measurer on ``source`` into the checkpoint directory ``out_dir``.

    ``name``: the checkpoint's model name; default ``radcaliper-demo``, or
    ``radcaliper-<folder name>`` of ``config.base_model``.
    ``device``: default a CUDA GPU where there is one (bf16 autocast), else the CPU (float32).
    ``domain``: the validated domain written into the checkpoint; default
    :func:`domain_for_training` of ``source`` (read before the first step).

    With ``resume`` and a ``train_state`` in ``out_dir`` from the same configuration, training
    continues where it stopped. Returns ``out_dir`` holding the final checkpoint (LoRA merged;
    no calibration: run ``radcaliper calibrate`` next).

    Raises:
        ConfigurationError: ``out_dir`` holds the state of a run with another configuration.
        ModelError: ``config.base_model`` is not a usable local Qwen2.5-VL directory.
    """
    from model.measurer.checkpoint.base import NumLogitRow, add_lora, merge_lora

    out = Path(out_dir)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if config.threads:
        torch.set_num_threads(config.threads)
    lm, tokenizer, head_options = _build(config, device)  # a bad base fails before OUT exists
    if config.gradient_checkpointing:
        from model._transformers import enable_checkpointing

        enable_checkpointing(lm.model)
    if config.base_model is not None and lm.num_token_id is not None:
        output = cast(Any, lm.model).get_output_embeddings()
        lm.add_module(NUM_ROW, NumLogitRow(output, lm.num_token_id))
    out.mkdir(parents=True, exist_ok=True)
    head = lm.numeric_head
    extra = dict(provenance or {})
    extra["source"] = source.describe()
    if domain is None:
        domain = domain_for_training(source)
    if name is None:  # a base model's run is named after it, not after the demo
        name = "radcaliper-demo"
        if config.base_model is not None:
            name = "radcaliper-" + (Path(config.base_model).resolve().name or "base")
    settings = _settings(config, name, version, head_options, extra, domain)
    if config.saves_delta:  # the checkpoint holds what changed from this base model
        settings = dataclasses.replace(settings, base_model=_base_reference(config))
    lora_step = _lora_from(config)

    start = 0
    state_dir = out / STATE_DIR
    adam_steps: Mapping[str, float] = {}
    if resume and (state_dir / STATE_NAME).is_file():
        state = json.loads((state_dir / STATE_NAME).read_text())
        if state["config"] != config.to_json():
            raise ConfigurationError(
                f"{state_dir} holds a run with another configuration; choose a new output "
                "directory or pass --no-resume to start over"
            )
        start = int(state["step"])
        if lora_step is not None and start >= lora_step:
            add_lora(lm.model, rank=config.lora_rank, alpha=config.lora_alpha)
        _load_state(state_dir, lm, config)
        adam_steps = state["adam_steps"]
        logger.info("resuming at step %d of %d", start, config.total_steps)
    lm.train()

    pool = StudyPool(
        source,
        config.measure_inputs,
        config.find_inputs,
        size=config.pool.size,
        initial=config.pool.initial,
        studies_per_step=config.pool.studies_per_step,
        planes_per_study=config.pool.planes_per_study,
        background_per_study=config.pool.background_per_study,
        click_fraction=config.pool.click_fraction,
        near_background_fraction=config.pool.near_background_fraction,
        find_shift_px=config.pool.find_shift_px,
        scoped_find_fraction=config.pool.scoped_find_fraction,
        seed=config.seed,
        on_study=on_study,
    )
    lm.to(device)
    autocast = device.type == "cuda" or config.resolved_weights_dtype(device.type) == "bfloat16"
    run = _Run(
        lm,
        tokenizer,
        pool,
        config,
        special_ids(tokenizer)["pad"],
        head is not None,
        device,
        autocast,
    )
    ramp = LambdaRamp(0, config.lambda_ramp_steps, config.lambda_max)
    began = time.monotonic()

    stage_start = 0
    for stage in config.stages:
        stage_end = stage_start + stage.steps
        if start >= stage_end:
            stage_start = stage_end
            continue
        if stage.trainable == "lora" and not any("lora_" in n for n, _ in lm.named_parameters()):
            count = add_lora(lm.model, rank=config.lora_rank, alpha=config.lora_alpha)
            logger.info("LoRA rank %d: %d adapter parameters", config.lora_rank, count)
        parameters = _trainable(lm, stage)
        optimizer = torch.optim.AdamW(
            parameters, lr=stage.lr, weight_decay=config.weight_decay, foreach=False
        )
        if adam_steps and start > stage_start:
            _load_moments(state_dir, lm, optimizer, adam_steps)
        for step in range(max(start, stage_start), stage_end):
            total = _train_step(run, optimizer, parameters, stage, step - stage_start, step, ramp)
            done = step + 1
            if on_step is not None:
                on_step(
                    StepReport(
                        done,
                        config.total_steps,
                        stage.name,
                        sum(v for k, v in total.items() if k != "numeric"),
                        total.get("measure"),
                        total.get("find"),
                        total.get("point"),
                        total.get("numeric"),
                        time.monotonic() - began,
                        total.get("axes"),
                        run.lm,
                        run.tokenizer,
                    )
                )
            if done % config.checkpoint_every == 0 or done == stage_end:
                _save_state(out, run, optimizer, done)
        stage_start = stage_end
        adam_steps = {}

    if head is not None and getattr(head, "loss_name", None) == "softmax":
        final: Any = head
        final.loss_options.pop("generator", None)
        final.loss_options["sigma"] = config.stages[-1].sigma[1]
    row = getattr(lm, NUM_ROW, None)
    if isinstance(row, NumLogitRow):
        row.write_back()
    lm.eval()
    lm.to("cpu")
    model: Any = lm.model
    if config.saves_delta:
        from model.measurer.checkpoint.base import base_weights_dtype

        stored = base_weights_dtype(cast(str, config.base_model))
        save_delta_checkpoint(out, model, head, tokenizer, settings, lm.num_token_id, dtype=stored)
    else:
        merge_lora(model)
        save_checkpoint(out, model, head, tokenizer, settings)
    return out


def _base_reference(config: TrainConfig) -> BaseReference:
    from model.measurer.checkpoint.base import base_weights_hash

    assert config.base_model is not None
    path = Path(config.base_model).resolve()
    return BaseReference(
        path=str(path),
        sha256=base_weights_hash(path),
        lora_rank=config.lora_rank,
        lora_alpha=config.lora_alpha,
        circle_rope_strategy=config.size.circle_rope_strategy,
    )


def _train_step(
    run: _Run,
    optimizer: torch.optim.Optimizer,
    parameters: Sequence[nn.Parameter],
    stage: Stage,
    local: int,
    step: int,
    ramp: LambdaRamp,
) -> dict[str, float]:
    """One optimiser step over the three tasks' batches; returns their losses (and "numeric",
    the measure task's numeric loss)."""
    config, lm = run.config, run.lm
    for group in optimizer.param_groups:
        group["lr"] = stage.lr * _lr_factor(local, stage)
    _set_sigma(lm, stage, local)
    run.pool.advance(step)
    rng, generator = _step_generators(config.seed, step)
    head: Any = lm.numeric_head
    if head is not None and getattr(head, "loss_name", None) == "softmax":
        head.loss_options["generator"] = generator
    lambda_ = ramp(step)
    counts = config.batches(stage)
    draws = (
        ("measure", run.pool.measure_examples),
        ("find", run.pool.find_examples),
        ("point", run.pool.point_examples),
        ("axes", run.pool.axes_examples),
    )
    drawn = {task: draw(counts[task], rng) if counts[task] else [] for task, draw in draws}
    optimizer.zero_grad(set_to_none=True)
    parts = config.accumulation
    report: dict[str, float] = {}
    # micro-batches: each task's examples split ``parts`` ways, each part's loss weighted by
    # its share of the task's examples (one part: the step as it always was)
    for part in range(parts):
        losses: dict[str, torch.Tensor] = {}
        for task, examples in drawn.items():
            chunk = examples[part::parts] if parts > 1 else examples
            if not chunk:
                continue
            share = len(chunk) / len(examples)
            loss, numeric = _task_loss(run, chunk, lambda_)
            losses[task] = loss if parts == 1 else loss * share
            report[task] = report.get(task, 0.0) + share * float(loss.detach())
            if task == "measure" and numeric is not None:
                value = share * float(numeric.detach())
                report["numeric"] = report.get("numeric", 0.0) + value
        if losses:
            torch.stack(list(losses.values())).sum().backward()
    torch.nn.utils.clip_grad_norm_(parameters, config.grad_clip)
    optimizer.step()
    return report
