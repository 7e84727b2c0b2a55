"""Training the measurer: both tasks, two stages, deterministic and resumable.

Each step draws a batch of measure crops and a batch of find planes from the :class:`StudyPool`
(the step's own generator, so a resumed run draws the same batches), runs ``NumericLM`` on each
and minimises the sum of their losses, each ``CE + lambda * numeric loss`` with ``lambda``
ramped linearly (``LambdaRamp``) over the first :attr:`TrainConfig.lambda_ramp_steps`.

Stages (:class:`Stage`) run one after the other with their own optimiser and schedule (linear
warm-up, cosine decay to 10 %): the default model, trained from scratch, has stage 1 with a wide
RNED label (``sigma`` 3 -> 1 mm: the candidate softmax has no coarse signal from scratch with a
narrow one) and stage 2 refining at a lower rate with a narrow label (1 -> 0.5 mm). A real
Qwen2.5-VL (``model.measurer.base``) trains the projector first, then LoRA adapters.

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
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from ingestion.errors import ConfigurationError
from ingestion.phantoms import PhantomSpec
from ingestion.volume import Modality, Volume
from model.measurer.checkpoint import (
    BaseReference,
    MeasurerSettings,
    NumericMode,
    build_head,
    save_checkpoint,
    save_delta_checkpoint,
)
from model.measurer.data import MeasureInputs, collate, encode_example
from model.measurer.domain import DataSource, Domain, DomainContrast
from model.measurer.find import FindInputs
from model.measurer.pool import (
    DatasetSource,
    FolderSource,
    MixedSource,
    PhantomSource,
    StudyPool,
    StudySource,
    load_dataset_volume,
)
from model.measurer.tasks import find_kinds
from model.measurer.tokenizer import VOCAB, build_tokenizer, special_ids
from model.measurer.voting import FindVoting
from model.numeric.hf import NumericLM
from model.numeric.losses import LambdaRamp

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
    from model.measurer.data import Prompted

__all__ = [
    "BackboneSize",
    "PoolSettings",
    "Stage",
    "StepReport",
    "TrainConfig",
    "build_default_model",
    "default_model_kwargs",
    "domain_for_training",
    "train",
]

logger = logging.getLogger(__name__)

NUM_ROW = "num_row"  # the NumericLM submodule holding a real checkpoint's [NUM] logit row
STATE_DIR = "train_state"
STATE_NAME = "state.json"
LM_NAME = "lm.safetensors"
OPTIMIZER_NAME = "optimizer.safetensors"


@dataclass(frozen=True)
class BackboneSize:
    """The default model's size: transformers' Qwen2.5-VL classes, tiny."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    vision_hidden: int = 64
    vision_depth: int = 2
    initializer_range: float = 0.02
    circle_rope_strategy: str = "alternate"


@dataclass(frozen=True)
class Stage:
    """One training stage.

    Args:
        name: for logs and the model card.
        steps: optimiser steps.
        lr: peak learning rate (AdamW), after ``warmup_steps``; cosine decay to 10 % at the end.
        trainable: ``all`` (from scratch), ``projector`` (vision merger, [NUM] row and head) or
            ``lora`` (LoRA adapters plus the projector; real checkpoints only).
        sigma: (start, end) label width (mm) of RNED's candidate softmax, linear over the stage.
        batches: examples per step of the tasks named here (``measure``, ``find``, ``point``,
            ``axes``) in this stage, in place of the run's; e.g. ``{"find": 4, "point": 32}``
            spends a stage on the clicked measurement, whose images are a twentieth of a find
            plane's. Stored as sorted ``(task, count)`` pairs.
    """

    name: str
    steps: int
    lr: float
    trainable: str = "all"
    sigma: tuple[float, float] = (3.0, 1.0)
    warmup_steps: int = 200
    batches: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.steps < 0 or not (self.lr > 0):
            raise ValueError(f"stage {self.name}: steps >= 0 and lr > 0 needed")
        if self.trainable not in ("all", "projector", "lora"):
            raise ValueError(f"stage {self.name}: trainable must be all, projector or lora")
        object.__setattr__(self, "sigma", tuple(float(s) for s in self.sigma))
        pairs = self.batches.items() if isinstance(self.batches, Mapping) else self.batches
        batches = tuple(sorted((str(task), int(count)) for task, count in pairs))
        for task, count in batches:
            if task not in TASK_NAMES:
                raise ValueError(
                    f"stage {self.name}: unknown task {task!r} in batches; "
                    f"tasks: {', '.join(TASK_NAMES)}"
                )
            if count < 0:
                raise ValueError(f"stage {self.name}: batch of {task} must be >= 0, got {count}")
        if len({task for task, _ in batches}) != len(batches):
            raise ValueError(f"stage {self.name}: a task named twice in batches")
        object.__setattr__(self, "batches", batches)


@dataclass(frozen=True)
class PoolSettings:
    """The rolling pool (``model.measurer.pool``)."""

    size: int = 600
    initial: int = 200
    studies_per_step: float = 0.25
    planes_per_study: int = 6
    background_per_study: int = 2
    click_fraction: float = 0.0  # > 0: clicks anywhere inside a finding (model.measurer.data)
    near_background_fraction: float = 0.0  # background clicks beside a finding (data module)
    find_shift_px: int = 0  # find planes shifted by up to this many pixels (model.measurer.pool)
    scoped_find_fraction: float = 0.0  # planes of both kinds asked for one (model.measurer.pool)


# the trained tasks, in the order a step draws them
TASK_NAMES = ("measure", "find", "point", "axes")


def _default_stages() -> tuple[Stage, ...]:
    return (
        Stage("from scratch", 12000, 1e-3, sigma=(3.0, 1.0)),
        Stage("refine", 3000, 2e-4, sigma=(1.0, 0.5), warmup_steps=50),
    )


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides a training run (stored with the checkpoint)."""

    seed: int = 0
    numeric_mode: NumericMode = NumericMode.RNED_CORR
    size: BackboneSize = field(default_factory=BackboneSize)
    stages: tuple[Stage, ...] = field(default_factory=_default_stages)
    measure_batch: int = 32
    find_batch: int = 8
    point_batch: int = 8
    axes_batch: int = 0  # the axes task (model.measurer.axes); 0: not trained
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    lambda_max: float = 1.0
    lambda_ramp_steps: int = 1000
    number_hi: float = 300.0  # RNED codec / xVal range [0, number_hi] (mm and pixels)
    measure_inputs: MeasureInputs = field(
        default_factory=lambda: MeasureInputs(window=(40.0, 160.0), jitter_mm=4.0, jitter_z_mm=1.0)
    )
    find_inputs: FindInputs = field(default_factory=FindInputs)
    pool: PoolSettings = field(default_factory=PoolSettings)
    # how the checkpoint's find step runs at inference (shifted passes; stored with it)
    find_voting: FindVoting = field(default_factory=FindVoting)
    # the kinds each inference find prompt asks for (stored with the checkpoint)
    find_prompts: tuple[tuple[str, ...], ...] = (("lesion", "vessel"),)
    checkpoint_every: int = 1000
    threads: int | None = None
    base_model: str | None = None  # a local Qwen2.5-VL directory instead of the default model
    init_from: str | None = None  # start from this checkpoint's weights (same model and mode)
    lora_rank: int = 128
    lora_alpha: int = 256
    # memory (model.measurer.memory): recompute each decoder layer in the backward pass
    gradient_checkpointing: bool = False
    accumulation: int = 1  # micro-batches per step: each task's examples split this many ways
    # the frozen weights' dtype: float32, bfloat16, or auto (bfloat16 for a real checkpoint on a
    # GPU, else float32); trainable parameters are float32 whatever it is
    weights_dtype: str = "auto"
    # numeric head constructor options over the defaults of head_options(), e.g. {"p": 0.5}
    # for the RNED codec's score weighting (the RND decoder's p ablation)
    head_extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "numeric_mode", NumericMode(self.numeric_mode))
        if self.accumulation < 1:
            raise ValueError(f"accumulation must be >= 1, got {self.accumulation}")
        if self.weights_dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"weights_dtype {self.weights_dtype!r}: use auto, float32 or bfloat16")
        if self.weights_dtype == "bfloat16" and self.base_model is None:
            raise ValueError(
                "weights_dtype bfloat16 needs a base model: the default model trains every "
                "weight, in float32"
            )
        if not self.stages:
            raise ValueError("a training run needs at least one stage")
        batches = (self.measure_batch, self.find_batch, self.point_batch, self.axes_batch)
        if min(batches) < 0 or not any(batches):
            raise ValueError("the batch sizes must be >= 0, not all 0")
        for stage in self.stages:
            counts = self.batches(stage)
            if not any(counts.values()):
                raise ValueError(f"stage {stage.name}: the batch sizes must not all be 0")
            if counts["axes"] and not self.axes_batch:
                # the pool and the checkpoint's task list follow the run's axes_batch
                raise ValueError(
                    f"stage {stage.name}: trains the axes task, which needs axes_batch > 0"
                )
        prompts = tuple(tuple(str(k) for k in kinds) for kinds in self.find_prompts)
        object.__setattr__(self, "find_prompts", prompts)
        if not prompts:
            raise ValueError("find_prompts needs at least one prompt")
        for kinds in prompts:
            find_kinds(kinds)  # ValueError naming an unknown kind

    @classmethod
    def for_base_model(cls, directory: str, *, steps: int = 4000, **changes: Any) -> TrainConfig:
        """Defaults for a real Qwen2.5-VL: a projector-only stage (a quarter of the steps), then
        LoRA (rank 128, alpha 256); grey images without the coordinate frame, as its
        pretrained vision tower expects; gradient checkpointing, and frozen weights in
        bfloat16 on a GPU."""
        first = max(1, steps // 4)
        values: dict[str, Any] = {
            "base_model": str(directory),
            "gradient_checkpointing": True,
            "stages": (
                Stage("projector", first, 1e-3, trainable="projector", sigma=(3.0, 1.0)),
                Stage("lora", steps - first, 2e-4, trainable="lora", sigma=(1.0, 0.5)),
            ),
            "measure_inputs": MeasureInputs(
                window=(40.0, 160.0), contrast=False, jitter_mm=4.0, jitter_z_mm=1.0
            ),
            "find_inputs": FindInputs(coordinates=False),
        }
        values.update(changes)
        return cls(**values)

    @classmethod
    def tiny(cls, **changes: Any) -> TrainConfig:
        """A configuration of the same classes and code at a size that trains a few steps in
        seconds on a CPU (tests, ``radcaliper evaluate --quick``); ``changes`` override fields."""
        values: dict[str, Any] = {
            "seed": 1,
            "size": BackboneSize(hidden_size=64, num_layers=2, vision_hidden=32, vision_depth=1),
            "stages": (
                Stage("a", 2, 1e-3, warmup_steps=1),
                Stage("b", 1, 1e-4, warmup_steps=1),
            ),
            "measure_batch": 2,
            "find_batch": 1,
            "point_batch": 1,
            "axes_batch": 1,
            "measure_inputs": MeasureInputs(pixel_mm=1.5, size=56, window=(40.0, 160.0)),
            "find_inputs": FindInputs(pixel_mm=3.0, size=112),
            "pool": PoolSettings(size=2, initial=2, studies_per_step=0.0, planes_per_study=1),
            "threads": 1,
        }
        values.update(changes)
        return cls(**values)

    def batches(self, stage: Stage) -> dict[str, int]:
        """Examples per step of each task in ``stage``: the run's, overridden by the stage's."""
        counts = dict(
            zip(
                TASK_NAMES,
                (self.measure_batch, self.find_batch, self.point_batch, self.axes_batch),
                strict=True,
            )
        )
        counts.update(stage.batches)
        return counts

    @property
    def saves_delta(self) -> bool:
        """Whether the run's checkpoint and ``train_state`` hold only what it trains (a base
        model's run; not one started from another checkpoint, whose weights are not the
        base's)."""
        return self.base_model is not None and self.init_from is None

    def resolved_weights_dtype(self, device_type: str) -> str:
        """``weights_dtype`` on a device of this type (``cuda``, ``cpu``)."""
        if self.weights_dtype != "auto":
            return self.weights_dtype
        real = self.base_model is not None
        return "bfloat16" if real and device_type == "cuda" else "float32"

    @property
    def total_steps(self) -> int:
        return sum(stage.steps for stage in self.stages)

    def head_options(self) -> dict[str, Any]:
        """The numeric head's constructor options (saved in ``radcaliper.json``)."""
        if self.numeric_mode == NumericMode.STANDARD:
            return {}
        if self.numeric_mode == NumericMode.XVAL:
            return {"lo": 0.0, "hi": self.number_hi, **self.head_extra}
        options: dict[str, Any] = {"lo": 0.0, "hi": self.number_hi, "seed": self.seed}
        options["scale"] = self.size.initializer_range
        if self.numeric_mode == NumericMode.RNED_CORR:
            options["loss"] = "softmax"
        options.update(self.head_extra)
        return options

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainConfig:
        values = dict(data)
        values["size"] = BackboneSize(**values["size"])
        values["stages"] = tuple(Stage(**s) for s in values["stages"])
        values["measure_inputs"] = MeasureInputs(**values["measure_inputs"])  # windows -> tuples
        values["find_inputs"] = FindInputs(**values["find_inputs"])
        values["pool"] = PoolSettings(**values["pool"])
        if "find_voting" in values:
            values["find_voting"] = FindVoting.from_json(values["find_voting"])
        return cls(**values)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "value") and isinstance(getattr(value, "value", None), str):
        return value.value
    return value


@dataclass(frozen=True)
class StepReport:
    """What the progress callback gets after each step."""

    step: int  # 1-based, over all stages
    total: int
    stage: str
    loss: float
    measure_loss: float | None
    find_loss: float | None
    point_loss: float | None
    numeric_loss: float | None
    seconds: float  # since this process started training
    axes_loss: float | None = None
    # the model being trained and its tokenizer, for monitors that evaluate it during training
    # (read them, never step them: training goes on with the same objects)
    lm: NumericLM | None = field(default=None, repr=False, compare=False)
    tokenizer: PreTrainedTokenizerBase | None = field(default=None, repr=False, compare=False)


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


@dataclass
class _Run:
    """What the loop works on."""

    lm: NumericLM
    tokenizer: PreTrainedTokenizerBase
    pool: StudyPool
    config: TrainConfig
    pad_id: int
    numeric: bool
    device: torch.device
    autocast: bool = False  # bf16 autocast (a GPU, or bf16 frozen weights)


def _trainable(lm: NumericLM, stage: Stage) -> list[nn.Parameter]:
    """Set ``requires_grad`` for the stage and return the trainable parameters.

    ``projector`` and ``lora`` (a real checkpoint) train the vision merger, the numeric head and
    the ``[NUM]`` logit row (``NUM_ROW``, a :class:`~model.measurer.base.NumLogitRow`; the
    embedding matrices stay frozen), and ``lora`` the adapters too (:func:`_tuned`)."""
    for name, parameter in lm.named_parameters():
        parameter.requires_grad_(stage.trainable == "all" or _tuned(name))
    return [p for p in lm.parameters() if p.requires_grad]


def _tuned(name: str) -> bool:
    """Whether a ``NumericLM`` state entry is one a real checkpoint's stages train (and so
    what its ``train_state`` holds): the head, the ``[NUM]`` row, the merger, the adapters."""
    from model.measurer.base import fine_tuned

    return name.startswith(("numeric_head.", NUM_ROW + ".")) or fine_tuned(name)


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


def _save_state(out: Path, run: _Run, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Write ``OUT/train_state`` atomically: the NumericLM's parameters and buffers (a real
    checkpoint's run: only what its stages train, :func:`_tuned`), the AdamW moments and
    ``state.json``."""
    from safetensors.torch import save_file, save_model

    state_dir = out / STATE_DIR
    partial = out / (STATE_DIR + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    if not run.config.saves_delta:
        save_model(run.lm, str(partial / LM_NAME))  # shared (tied) tensors saved once
    else:
        saved = {
            name: tensor.detach().contiguous()
            for name, tensor in run.lm.state_dict().items()
            if _tuned(name)
        }
        save_file(saved, str(partial / LM_NAME))
    names = {id(p): n for n, p in run.lm.named_parameters()}
    moments: dict[str, torch.Tensor] = {}
    steps: dict[str, float] = {}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            state = optimizer.state.get(parameter)
            if not state:
                continue
            name = names[id(parameter)]
            moments[f"{name}::exp_avg"] = state["exp_avg"].contiguous()
            moments[f"{name}::exp_avg_sq"] = state["exp_avg_sq"].contiguous()
            steps[name] = float(state["step"])
    save_file(moments, str(partial / OPTIMIZER_NAME))
    state_json = {"step": step, "config": run.config.to_json(), "adam_steps": steps}
    (partial / STATE_NAME).write_text(json.dumps(state_json, indent=1) + "\n")
    if state_dir.exists():
        old = out / (STATE_DIR + ".old")
        if old.exists():
            shutil.rmtree(old)
        state_dir.rename(old)
        partial.rename(state_dir)
        shutil.rmtree(old)
    else:
        partial.rename(state_dir)


def _load_state(state_dir: Path, lm: NumericLM, config: TrainConfig) -> None:
    """Load ``train_state``'s model state into ``lm`` (built as at the start, LoRA added
    where the run had reached it)."""
    from safetensors.torch import load_file, load_model

    if not config.saves_delta:
        load_model(lm, str(state_dir / LM_NAME))
        return
    saved = load_file(str(state_dir / LM_NAME))
    expected = {name for name in lm.state_dict() if _tuned(name)}
    if set(saved) != expected:
        raise ConfigurationError(
            f"{state_dir} does not fit this run's model ({len(expected - set(saved))} missing, "
            f"{len(set(saved) - expected)} unexpected entries); pass --no-resume to start over"
        )
    lm.load_state_dict(saved, strict=False)


def _load_moments(
    state_dir: Path, lm: NumericLM, optimizer: torch.optim.Optimizer, steps: Mapping[str, float]
) -> None:
    from safetensors.torch import load_file

    moments = load_file(str(state_dir / OPTIMIZER_NAME))
    named = dict(lm.named_parameters())
    for name, step in steps.items():
        parameter = named[name]
        if not parameter.requires_grad:
            continue
        optimizer.state[parameter] = {
            "step": torch.tensor(step),
            "exp_avg": moments[f"{name}::exp_avg"],
            "exp_avg_sq": moments[f"{name}::exp_avg_sq"],
        }


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


# How far a trained model's spacing domain reaches beyond the spacings it saw: low / first,
# high * second. The phantom spec's 0.6-1.0 mm pixels and 1-5 mm slices widen to
# Domain.legacy()'s 0.4-1.5 and 0.5-7.5 mm.
_PIXEL_MARGIN = (1.5, 1.5)
_SLICE_MARGIN = (2.0, 1.5)
_MIN_SLICES = 3  # what the find step needs, not a property of the data
_PHANTOM_LICENCE = "generated by radcaliper (no third-party data)"

# what a source shows of one study: modality, pixel spacing low and high, slice spacing, FOV
_Seen = tuple[Modality | None, float, float, float, float]


def _seen(volume: Volume) -> _Seen:
    slice_mm, row_mm, column_mm = volume.geometry.spacing
    _, rows, columns = volume.shape
    fov = max(rows * row_mm, columns * column_mm)
    return (volume.modality, min(row_mm, column_mm), max(row_mm, column_mm), slice_mm, fov)


def _leaves(source: StudySource) -> list[StudySource]:
    if isinstance(source, MixedSource):
        return [leaf for part in source.parts for leaf in _leaves(part)]
    return [source]


_HYBRID_SAMPLES = 12
"""Hybrid studies drawn to see the spacings and fields of view its augmentations make."""


def _part(source: StudySource) -> tuple[list[_Seen], list[DataSource], str | None]:
    """What one source shows (phantoms: the spec's extremes; folders and datasets: each
    study, loaded), its data sources with their licences, and its anatomy where known."""
    if isinstance(source, PhantomSource):
        spec = source.spec or PhantomSpec()
        (p0, p1), (m0, m1) = spec.pixel_spacing_mm, spec.matrix_size
        slices = spec.slice_spacings_mm
        spec_name = "phantom-spec.md defaults" if source.spec is None else "a custom spec"
        name = f"radcaliper phantoms, seed {source.seed} ({spec_name})"
        seen: list[_Seen] = [
            (Modality.CT, p0, p0, min(slices), m0 * p0),
            (Modality.CT, p1, p1, max(slices), m1 * p1),
        ]
        return seen, [DataSource(name, _PHANTOM_LICENCE, "phantoms")], "phantom"
    if isinstance(source, DatasetSource):
        chosen = set(source.series)
        inputs = sorted(
            {
                (s.provenance.path, s.provenance.licence, s.provenance.source.value)
                for s in source.dataset.studies
                if s.series_instance_uid in chosen
            }
        )
        seen = [_seen(load_dataset_volume(source.dataset, uid)) for uid in source.series]
        return seen, [DataSource(*item) for item in inputs], None
    if isinstance(source, FolderSource):
        seen = [_seen(source.study(i).volume) for i in range(len(source.folders))]
        return seen, [DataSource(str(source.root), "unknown", "folder")], None
    from model.measurer.hybrid import HybridSource

    if isinstance(source, HybridSource):
        # each background as it is, and what its augmentations make of it (a sample)
        seen = [_seen(source.background(ref).volume) for ref in source.training]
        seen += [_seen(source.study(i).volume) for i in range(_HYBRID_SAMPLES)]
        parts = [
            DataSource(
                f"{ref.id}: {ref.title} (real CT background; lesions synthetic, radcaliper)",
                ref.licence,
                "hybrid",
            )
            for ref in source.training
        ]
        return seen, parts, None
    raise ConfigurationError(
        f"the validated domain of a {type(source).__name__} training source is not known; "
        "pass train(..., domain=Domain(...)) stating what it holds"
    )


def domain_for_training(
    source: StudySource,
    *,
    contrast: DomainContrast | str = DomainContrast.ANY,
    anatomy: Sequence[str] | None = None,
) -> Domain:
    """The validated domain of a model trained on ``source``: the modalities of its studies;
    the range of their pixel and slice spacings widened by the margins above (phantoms: the
    spec's ranges, so a phantom run gets ``Domain.legacy()``'s spacings); the range of their
    in-plane fields of view; at least 3 slices; every data source with its licence;
    ``contrast`` as told (default any); ``anatomy`` as told, else "phantom" where every part is
    phantoms and not recorded otherwise (datasets do not record it). Folder and dataset
    sources are read here, each study once.

    Raises:
        ConfigurationError: a source of another kind, or studies with no modality recorded.
    """
    seen: list[_Seen] = []
    sources: list[DataSource] = []
    anatomies: list[str | None] = []
    for leaf in _leaves(source):
        part_seen, part_sources, part_anatomy = _part(leaf)
        seen += part_seen
        sources += [s for s in part_sources if s not in sources]
        anatomies.append(part_anatomy)
    modalities = tuple(sorted({m for m, *_ in seen if m is not None}))
    if not modalities:
        raise ConfigurationError(
            "no training study records its modality (NIfTI and NRRD do not): import the "
            "dataset again with its modality (CT or MR)"
        )
    if any(m is None for m, *_ in seen):
        logger.warning("some training studies record no modality; the domain names %s", modalities)
    pixel = (min(s[1] for s in seen), max(s[2] for s in seen))
    slices = (min(s[3] for s in seen), max(s[3] for s in seen))
    if anatomy is None:
        known = [a for a in anatomies if a is not None]
        anatomy = known if len(known) == len(anatomies) else []
    return Domain(
        modalities=modalities,
        pixel_mm=(pixel[0] / _PIXEL_MARGIN[0], pixel[1] * _PIXEL_MARGIN[1]),
        slice_mm=(slices[0] / _SLICE_MARGIN[0], slices[1] * _SLICE_MARGIN[1]),
        min_slices=_MIN_SLICES,
        fov_mm=(min(s[4] for s in seen), max(s[4] for s in seen)),
        contrast=DomainContrast(contrast),
        anatomy=tuple(anatomy),
        sources=tuple(sources),
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
        from model.measurer.base import load_base_model

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
        from model.measurer.checkpoint import load_checkpoint

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
    from model.measurer.base import NumLogitRow, add_lora, merge_lora

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
        from model.measurer.base import base_weights_dtype

        stored = base_weights_dtype(cast(str, config.base_model))
        save_delta_checkpoint(out, model, head, tokenizer, settings, lm.num_token_id, dtype=stored)
    else:
        merge_lora(model)
        save_checkpoint(out, model, head, tokenizer, settings)
    return out


def _base_reference(config: TrainConfig) -> BaseReference:
    from model.measurer.base import base_weights_hash

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
