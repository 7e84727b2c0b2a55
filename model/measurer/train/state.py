"""A training run's resumable state: what the loop works on, which parameters a real checkpoint's
run saves (:func:`_tuned`), and ``OUT/train_state`` (model, AdamW moments, ``state.json``),
written atomically and read back on resume.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ingestion.errors import ConfigurationError
from model.measurer.data.pool import (
    StudyPool,
)
from model.measurer.train.config import (
    TrainConfig,
)
from model.numeric.hf import NumericLM

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


NUM_ROW = "num_row"  # the NumericLM submodule holding a real checkpoint's [NUM] logit row
STATE_DIR = "train_state"
STATE_NAME = "state.json"
LM_NAME = "lm.safetensors"
OPTIMIZER_NAME = "optimizer.safetensors"


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


def _tuned(name: str) -> bool:
    """Whether a ``NumericLM`` state entry is one a real checkpoint's stages train (and so
    what its ``train_state`` holds): the head, the ``[NUM]`` row, the merger, the adapters."""
    from model.measurer.checkpoint.base import fine_tuned

    return name.startswith(("numeric_head.", NUM_ROW + ".")) or fine_tuned(name)


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


__all__ = [
    "LM_NAME",
    "NUM_ROW",
    "OPTIMIZER_NAME",
    "STATE_DIR",
    "STATE_NAME",
]
