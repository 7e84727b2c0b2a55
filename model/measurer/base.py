"""A real Qwen2.5-VL checkpoint as the measurer's backbone: load locally, add [NUM], LoRA.

``load_base_model(DIR)`` reads a local Qwen2.5-VL directory (``config.json``, safetensors
weights, tokenizer files, ``preprocessor_config.json``; nothing from a hub), converts it to
Circle-RoPE (``CircleRopeQwen2_5_VLForConditionalGeneration.from_pretrained`` renames nothing
and keeps every weight) and adds the ``[NUM]`` token, resizing the embeddings; the new row
starts at the mean of the existing rows. The image processor's settings are checked against
what ``model.measurer.images`` feeds (patch 14, merge 2, temporal patch 2, CLIP mean and std):
radcaliper builds pixel values itself, exactly as that processor would.

LoRA (the paper's defaults: rank 128, alpha 256) is injected in place with ``peft`` on the
decoder's attention and MLP projections (:func:`add_lora`) and merged back into the weights
before a checkpoint is saved (:func:`merge_lora`), so a trained checkpoint loads without peft.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ingestion.errors import ModelError
from model.measurer.images import IMAGE_MEAN, IMAGE_STD, MERGE, PATCH, TEMPORAL_PATCH
from model.measurer.tokenizer import NUM, special_ids

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration

__all__ = ["LORA_TARGETS", "add_lora", "load_base_model", "lora_parameters", "merge_lora"]

logger = logging.getLogger(__name__)

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Decoder projections that get LoRA adapters (the vision tower's are named differently)."""
_LORA_SCOPE = r".*language_model.*\.(" + "|".join(LORA_TARGETS) + r")$"


def _check_directory(path: Path) -> None:
    if not path.is_dir():
        raise ModelError(f"--base-model {path}: not a directory")
    missing = [name for name in ("config.json",) if not (path / name).is_file()]
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors (the weights)")
    if not ((path / "tokenizer.json").is_file() or (path / "vocab.json").is_file()):
        missing.append("tokenizer.json (or vocab.json + merges.txt)")
    if missing:
        raise ModelError(
            f"--base-model {path} is not a complete local Qwen2.5-VL directory: missing "
            + ", ".join(missing)
        )


def _check_processor(path: Path) -> None:
    """The image processor must lay out pixels as ``model.measurer.images`` does."""
    config_file = path / "preprocessor_config.json"
    if not config_file.is_file():
        logger.info("%s has no preprocessor_config.json; Qwen2.5-VL's defaults are used", path)
        return
    config = json.loads(config_file.read_text())
    expected = {
        "patch_size": PATCH,
        "merge_size": MERGE,
        "temporal_patch_size": TEMPORAL_PATCH,
    }
    wrong = {k: config[k] for k, v in expected.items() if k in config and config[k] != v}
    for key, value in (("image_mean", IMAGE_MEAN), ("image_std", IMAGE_STD)):
        if key in config and any(
            abs(float(a) - b) > 1e-6 for a, b in zip(config[key], value, strict=True)
        ):
            wrong[key] = config[key]
    if wrong:
        raise ModelError(
            f"{config_file}: {wrong} differ from what radcaliper feeds Qwen2.5-VL ({expected}, "
            "CLIP mean/std); this checkpoint needs other image inputs"
        )


def load_base_model(
    directory: str | Path,
    *,
    circle_rope_strategy: str = "alternate",
    dtype: torch.dtype | None = None,
) -> tuple[CircleRopeQwen2_5_VLForConditionalGeneration, PreTrainedTokenizerBase]:
    """A local Qwen2.5-VL directory as a Circle-RoPE model with ``[NUM]`` (module doc)."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration

    path = Path(directory)
    _check_directory(path)
    _check_processor(path)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = CircleRopeQwen2_5_VLForConditionalGeneration.from_pretrained(
        path,
        local_files_only=True,
        circle_rope_strategy=circle_rope_strategy,
        dtype=dtype or torch.float32,
    )
    if NUM not in tokenizer.get_vocab():
        tokenizer.add_tokens([AddedToken(NUM, normalized=False, special=False)])
        embeddings = model.get_input_embeddings().weight
        mean = embeddings.detach().mean(dim=0)
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        with torch.no_grad():
            model.get_input_embeddings().weight[-1] = mean
            output = model.get_output_embeddings()
            if output is not None and output.weight is not model.get_input_embeddings().weight:
                output.weight[-1] = output.weight[:-1].mean(dim=0)
    special_ids(tokenizer)  # raises naming any Qwen special token the tokenizer lacks
    return model, tokenizer


def add_lora(model: nn.Module, *, rank: int = 128, alpha: int = 256, dropout: float = 0.0) -> int:
    """Inject LoRA adapters into the decoder's projections in place; returns their parameter
    count. Only the adapters are trainable afterwards (the caller may unfreeze more)."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=_LORA_SCOPE)
    inject_adapter_in_model(config, model)
    return sum(p.numel() for p in lora_parameters(model))


def lora_parameters(model: nn.Module) -> list[torch.nn.Parameter]:
    return [p for name, p in model.named_parameters() if "lora_" in name]


def merge_lora(model: nn.Module) -> int:
    """Fold every LoRA adapter into its base weight and put the plain layer back; returns how
    many layers were merged."""
    from peft.tuners.lora import LoraLayer

    merged = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, LoraLayer):
            continue
        module.merge()
        parent_name, _, child = name.rpartition(".")
        parent: Any = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
        merged += 1
    return merged
