"""What a training run is told: the backbone size, the stages of training, the study pool's
settings and :class:`TrainConfig` (read from and written to ``training_config.json``), and the
:class:`StepReport` each step hands the progress callback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from model.measurer.checkpoint.settings import NumericMode
from model.measurer.inputs.data import MeasureInputs
from model.measurer.inputs.find import FindInputs
from model.measurer.inputs.voting import FindVoting
from model.measurer.tasks.text import find_kinds
from model.numeric.hf import NumericLM

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


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
    """The rolling pool (``model.measurer.data.pool``)."""

    size: int = 600
    initial: int = 200
    studies_per_step: float = 0.25
    planes_per_study: int = 6
    background_per_study: int = 2
    click_fraction: float = (
        0.0  # > 0: clicks anywhere inside a finding (model.measurer.inputs.data)
    )
    near_background_fraction: float = 0.0  # background clicks beside a finding (data module)
    find_shift_px: int = (
        0  # find planes shifted by up to this many pixels (model.measurer.data.pool)
    )
    scoped_find_fraction: float = (
        0.0  # planes of both kinds asked for one (model.measurer.data.pool)
    )


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
    axes_batch: int = 0  # the axes task (model.measurer.tasks.axes); 0: not trained
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
    # memory (model.measurer.train.memory): recompute each decoder layer in the backward pass
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


__all__ = [
    "TASK_NAMES",
    "BackboneSize",
    "PoolSettings",
    "Stage",
    "StepReport",
    "TrainConfig",
]
