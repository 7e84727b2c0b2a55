"""Training the click model: the point and axes tasks on views that fit the lesion, from reads.

The click model answers a click (``model.measurer.infer.click``): the point task at the first
look ("lesion" or "none") and the axes task, the caliper's end points in the view's own pixels
(``model.measurer.inputs.view``). It starts from a checkpoint's weights (the demo's: the
grammar and the image tower are learnt there) and trains on :class:`ReadsClicks` examples:
real lesions with their readers' reads, sizes balanced, negatives from the anatomy around them.

Each step draws its examples from its own generator (``[seed, step]``), so a run is the same on
the same machine and thread count. The RNED label's width ``sigma`` is in the answer's units,
view pixels, and narrows linearly over the run.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.measurer.checkpoint.weights import load_checkpoint, save_checkpoint
from model.measurer.data.reads import ReadsClicks
from model.measurer.inputs.data import Prompted, collate, encode_example
from model.measurer.inputs.view import LesionView
from model.measurer.tasks.tokenizer import special_ids
from model.numeric.hf import NumericLM

__all__ = ["ClickStep", "ClickTrainConfig", "train_click_model"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClickTrainConfig:
    """A click model's training run (stored in its checkpoint's ``training``)."""

    steps: int = 1500
    lr: float = 2e-4
    warmup_steps: int = 50
    axes_batch: int = 16
    point_batch: int = 8
    sigma: tuple[float, float] = (1.5, 0.5)  # view pixels
    seed: int = 44
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    numeric_weight: float = 1.0
    view: LesionView = field(default_factory=LesionView)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.axes_batch < 1 or self.point_batch < 0:
            raise ValueError(
                f"steps and axes_batch must be >= 1 and point_batch >= 0, got {self.steps}, "
                f"{self.axes_batch}, {self.point_batch}"
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be > 0, got {self.lr}")

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["view"] = self.view.to_json()
        data["sigma"] = list(self.sigma)
        return data


@dataclass(frozen=True)
class ClickStep:
    """One step's report."""

    step: int
    total: int
    axes_loss: float
    point_loss: float | None
    seconds: float


def _lr(step: int, config: ClickTrainConfig) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    rest = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / rest)
    return config.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _loss(
    lm: NumericLM, tokenizer: Any, examples: Sequence[Prompted], weight: float
) -> torch.Tensor:
    encoded = [encode_example(e, tokenizer, numeric=lm.numeric_head is not None) for e in examples]
    batch = collate(encoded, special_ids(tokenizer)["pad"])
    out = lm(
        batch.input_ids,
        batch.attention_mask,
        batch.num_values if lm.numeric_head is not None else None,
        labels=batch.labels,
        lambda_=weight,
        pixel_values=batch.pixel_values,
        image_grid_thw=batch.image_grid_thw,
    )
    loss: torch.Tensor | None = out.loss
    assert loss is not None
    return loss


def train_click_model(
    init_from: str | Path,
    out_dir: str | Path,
    examples: ReadsClicks,
    config: ClickTrainConfig,
    *,
    name: str,
    version: str,
    provenance: Mapping[str, Any] | None = None,
    on_step: Callable[[ClickStep], None] | None = None,
) -> Path:
    """Fine-tune ``init_from``'s weights into the click model at ``out_dir`` (module doc).

    Returns ``out_dir`` holding the checkpoint: its tasks ``point`` and ``axes``, its
    ``lesion_view`` the view it was trained on; not calibrated (``calibrate_click_model``).
    """
    loaded = load_checkpoint(init_from)
    lm = NumericLM(
        loaded.model,
        loaded.head,
        special_ids(loaded.tokenizer)["num"] if loaded.head is not None else None,
    )
    lm.train()
    parameters = [p for p in lm.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        parameters, lr=config.lr, weight_decay=config.weight_decay, foreach=False
    )
    head: Any = lm.numeric_head
    softmax = head is not None and getattr(head, "loss_name", None) == "softmax"
    began = time.monotonic()
    for step in range(config.steps):
        rng = np.random.default_rng([config.seed, step, 44])
        if softmax:
            start, end = config.sigma
            head.loss_options["sigma"] = start + (end - start) * step / max(1, config.steps - 1)
            head.loss_options["generator"] = torch.Generator().manual_seed(
                int(rng.integers(0, 2**62))
            )
        for group in optimizer.param_groups:
            group["lr"] = _lr(step, config)
        optimizer.zero_grad(set_to_none=True)
        axes = _loss(
            lm,
            loaded.tokenizer,
            examples.axes_examples(config.axes_batch, rng),
            config.numeric_weight,
        )
        total = axes
        point_value = None
        if config.point_batch:
            point = _loss(
                lm,
                loaded.tokenizer,
                examples.point_examples(config.point_batch, rng),
                config.numeric_weight,
            )
            total = total + point
            point_value = float(point.detach())
        total.backward()
        torch.nn.utils.clip_grad_norm_(parameters, config.grad_clip)
        optimizer.step()
        if on_step is not None:
            on_step(
                ClickStep(
                    step + 1,
                    config.steps,
                    float(axes.detach()),
                    point_value,
                    time.monotonic() - began,
                )
            )
    if softmax:
        head.loss_options.pop("generator", None)
        head.loss_options["sigma"] = config.sigma[1]
    lm.eval()
    settings = dataclasses.replace(
        loaded.settings,
        name=name,
        version=version,
        tasks=("point", "axes"),
        calibration=None,
        decode_check=None,
        detection=None,
        lesion_view=config.view,
        click_model=None,  # a click model answers clicks itself
        training={
            **dict(provenance or {}),
            "init_from": str(init_from),
            "click_config": config.to_json(),
        },
    )
    return save_checkpoint(out_dir, loaded.model, loaded.head, loaded.tokenizer, settings)
