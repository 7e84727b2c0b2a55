"""A measurer checkpoint: one local directory with everything inference needs.

Layout::

    DIR/config.json, DIR/model.safetensors      the Circle-RoPE Qwen2.5-VL (save_pretrained)
    DIR/numeric_head.safetensors                the numeric head's state (RNED codec / xVal)
    DIR/tokenizer.json, ...                     the tokenizer (save_pretrained)
    DIR/radcaliper.json                         MeasurerSettings: name, version, numeric mode,
                                                head and input settings, calibration, the
                                                validated domain
                                                (``model.measurer.checkpoint.domain``)
    DIR/README.md                               the model card; its "Validated domain" section
                                                is kept in step with radcaliper.json

A model fine-tuned from a local Qwen2.5-VL (``radcaliper train --base-model``) is saved as what
changed instead of ``config.json`` + ``model.safetensors``::

    DIR/delta.safetensors                       the LoRA adapters (not merged), the vision
                                                merger and the [NUM] rows of the embeddings
    DIR/radcaliper.json "base_model"            the base directory, the sha256 of its weights,
                                                LoRA rank and alpha (:class:`BaseReference`)

Loading rebuilds the model from the base directory (which must hold the same weights: its
hash is checked), applies the delta and merges the adapters. ``export_checkpoint`` writes a
standalone checkpoint with everything merged (``radcaliper export-model``).

Nothing is downloaded: loading reads only ``DIR`` (and a delta's base directory;
``local_files_only``). A directory that is not a measurer checkpoint raises ``ModelError``
naming the missing file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ingestion.errors import ModelError
from model.measurer.checkpoint.settings import (
    CARD_NAME,
    DELTA_NAME,
    HEAD_NAME,
    NUM_INPUT_ROW,
    NUM_OUTPUT_ROW,
    SETTINGS_NAME,
    BaseReference,
    MeasurerSettings,
    NumericMode,
    click_model_folder,
    read_settings,
    update_card,
)

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
    from model.numeric.protocol import NumericHead

__all__ = [
    "LoadedMeasurer",
    "build_head",
    "export_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
    "save_delta_checkpoint",
]

logger = logging.getLogger(__name__)


def build_head(mode: NumericMode | str, dim: int, options: Mapping[str, Any]) -> NumericHead | None:
    """A fresh head of ``mode`` for hidden size ``dim`` (None for standard tokens).

    ``options``: RNED: ``RotaryNumberCodec`` keywords (``hi``, ``base``, ``scale``, ...) plus
    ``loss`` / ``loss_options`` for ``RnedHead``; xVal: ``XValHead`` keywords.
    """
    mode = NumericMode(mode)
    if mode == NumericMode.STANDARD:
        return None
    if mode == NumericMode.XVAL:
        from model.numeric.xval import XValHead

        return XValHead(dim, **options)
    from model.numeric.codec import RotaryNumberCodec
    from model.numeric.rned_head import RnedHead

    codec_options = {k: v for k, v in options.items() if k not in ("loss", "loss_options")}
    return RnedHead(
        RotaryNumberCodec(dim, **codec_options),
        method="corr" if mode == NumericMode.RNED_CORR else "rnd",
        loss=options.get("loss"),
        loss_options=options.get("loss_options"),
    )


@dataclass(frozen=True)
class LoadedMeasurer:
    """A checkpoint in memory."""

    model: CircleRopeQwen2_5_VLForConditionalGeneration
    head: NumericHead | None
    tokenizer: PreTrainedTokenizerBase
    settings: MeasurerSettings


def save_checkpoint(
    directory: str | Path,
    model: CircleRopeQwen2_5_VLForConditionalGeneration,
    head: NumericHead | None,
    tokenizer: PreTrainedTokenizerBase,
    settings: MeasurerSettings,
) -> Path:
    """Write the checkpoint directory (created if needed; files are replaced)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _save_head(out, head)
    (out / SETTINGS_NAME).write_text(json.dumps(settings.to_json(), indent=2) + "\n")
    update_card(out, settings)
    return out


_FULL_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json")


def save_delta_checkpoint(
    directory: str | Path,
    model: CircleRopeQwen2_5_VLForConditionalGeneration,
    head: NumericHead | None,
    tokenizer: PreTrainedTokenizerBase,
    settings: MeasurerSettings,
    num_id: int | None,
    *,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a checkpoint of what fine-tuning changed in ``settings.base_model`` (module doc).

    ``dtype``: store the delta's floating-point tensors in this dtype (the base model's own,
    so that the delta is as precise as the weights it changes; default: as trained).

    ``model``: the fine-tuned model with its LoRA adapters not merged and the ``[NUM]`` logit
    row written back into the output embeddings; ``num_id``: the ``[NUM]`` token (None without
    a numeric head). A full model left in the directory by an earlier run is removed, so that
    the directory is one checkpoint.
    """
    from safetensors.torch import save_file

    from model.measurer.checkpoint.base import fine_tuned

    if settings.base_model is None:
        raise ValueError("a delta checkpoint needs settings.base_model")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    delta = {name: t for name, t in model.state_dict().items() if fine_tuned(name)}
    if num_id is not None:
        delta[NUM_INPUT_ROW] = _matrix(model.get_input_embeddings())[num_id]
        output = model.get_output_embeddings()
        if output is not None:
            delta[NUM_OUTPUT_ROW] = _matrix(output)[num_id]
    for name, tensor in delta.items():
        stored = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        delta[name] = tensor.detach().to(stored).contiguous().clone()
    for stale in [*out.glob("model*.safetensors"), *(out / n for n in _FULL_MODEL_FILES)]:
        if stale.is_file():
            logger.info("removing %s: %s is a delta checkpoint", stale.name, out)
            stale.unlink()
    save_file(delta, str(out / DELTA_NAME))
    tokenizer.save_pretrained(out)
    _save_head(out, head)
    (out / SETTINGS_NAME).write_text(json.dumps(settings.to_json(), indent=2) + "\n")
    update_card(out, settings)
    return out


def _matrix(embeddings: nn.Module) -> torch.Tensor:
    """The weight matrix of an embedding or output layer."""
    import torch

    weight = embeddings.weight
    assert isinstance(weight, torch.Tensor)
    return weight


def _save_head(out: Path, head: NumericHead | None) -> None:
    from safetensors.torch import save_file

    if head is not None:
        module: nn.Module = head  # type: ignore[assignment]
        state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
        save_file(state, str(out / HEAD_NAME))


def export_checkpoint(
    directory: str | Path, out_dir: str | Path, *, base_model: str | Path | None = None
) -> Path:
    """Write ``directory`` (a delta or a standalone checkpoint) as a standalone one in
    ``out_dir``: the full model with LoRA merged, loadable without its base model. The card,
    the settings (less the base reference) and the click model it names are kept.
    ``base_model``: as for :func:`load_checkpoint`."""
    source, out = Path(directory), Path(out_dir)
    if out.resolve() == source.resolve():
        raise ModelError(f"export {source}: write the standalone checkpoint to another folder")
    loaded = load_checkpoint(source, base_model=base_model)
    out.mkdir(parents=True, exist_ok=True)
    card = source / CARD_NAME
    if card.is_file():
        (out / CARD_NAME).write_text(card.read_text(encoding="utf-8"), encoding="utf-8")
    settings = dataclasses.replace(loaded.settings, base_model=None)
    if settings.click_model is not None:  # the click model it names travels with it
        import shutil

        click = out / settings.click_model
        shutil.rmtree(click, ignore_errors=True)
        shutil.copytree(
            click_model_folder(source, settings.click_model),
            click,
            ignore=shutil.ignore_patterns("train_state"),
        )
    return save_checkpoint(out, loaded.model, loaded.head, loaded.tokenizer, settings)


def load_checkpoint(
    directory: str | Path, *, base_model: str | Path | None = None
) -> LoadedMeasurer:
    """Read a checkpoint directory written by :func:`save_checkpoint` or
    :func:`save_delta_checkpoint` (eval mode, CPU). ``base_model``: where a delta's base model
    is now, in place of the folder it was fine-tuned from (its weights must be the same)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
    from model.measurer.tasks.tokenizer import load_tokenizer

    path = Path(directory)
    settings = read_settings(path)
    if settings.base_model is not None:
        model = _apply_delta(path, settings.base_model, base_model)
    else:
        try:
            model, info = CircleRopeQwen2_5_VLForConditionalGeneration.from_pretrained(
                path, local_files_only=True, output_loading_info=True
            )
        except (OSError, SafetensorError) as error:  # weights missing, unreadable or cut short
            raise ModelError(
                f"{path}: the model's weights cannot be read ({error}); copy the checkpoint "
                "again, or point --model at a complete one"
            ) from error
        missing, unexpected = list(info["missing_keys"]), list(info["unexpected_keys"])
        if missing or unexpected:  # never run a model with freshly initialised weights
            raise ModelError(
                f"{path}: the weights do not match the model ({len(missing)} missing, e.g. "
                f"{missing[:3]}; {len(unexpected)} unexpected, e.g. {unexpected[:3]}); was it "
                "written by another transformers version's layout? Re-save it with radcaliper"
            )
    model.eval()
    tokenizer = load_tokenizer(path)
    dim = int(cast(Any, model.config).text_config.hidden_size)
    head = build_head(settings.numeric_mode, dim, settings.head)
    if head is not None:
        head_file = path / HEAD_NAME
        if not head_file.is_file():
            raise ModelError(f"{path}: {HEAD_NAME} is missing for mode {settings.numeric_mode}")
        module: nn.Module = head  # type: ignore[assignment]
        try:
            state = load_file(str(head_file))
        except (OSError, SafetensorError) as error:
            raise ModelError(
                f"{head_file} cannot be read ({error}); copy the checkpoint again"
            ) from error
        module.load_state_dict(state)
        module.eval()
    return LoadedMeasurer(model, head, tokenizer, settings)


def _apply_delta(
    path: Path, reference: BaseReference, moved: str | Path | None
) -> CircleRopeQwen2_5_VLForConditionalGeneration:
    """The base model of a delta checkpoint with the delta applied and LoRA merged."""
    import torch
    from safetensors.torch import load_file

    from model.measurer.checkpoint.base import (
        add_lora,
        base_weights_hash,
        fine_tuned,
        load_base_model,
        merge_lora,
    )
    from model.measurer.tasks.tokenizer import NUM

    base = Path(moved) if moved is not None else Path(reference.path)
    if not base.is_dir():
        raise ModelError(
            f"{path} holds only what was fine-tuned from the base model {base}, which is not "
            "there: put that Qwen2.5-VL directory back, pass its new folder (base_model=), or "
            "load a standalone export ('radcaliper export-model')"
        )
    delta_file = path / DELTA_NAME
    if not delta_file.is_file():
        raise ModelError(f"{path}: {DELTA_NAME} is missing (a delta checkpoint needs it)")
    digest = base_weights_hash(base)
    if digest != reference.sha256:
        raise ModelError(
            f"{path} was fine-tuned from other weights than those in {base} (sha256 "
            f"{digest[:12]}..., expected {reference.sha256[:12]}...): use the base model it "
            "was trained from"
        )
    model, tokenizer = load_base_model(base, circle_rope_strategy=reference.circle_rope_strategy)
    add_lora(model, rank=reference.lora_rank, alpha=reference.lora_alpha)
    delta = load_file(str(delta_file))
    rows = {NUM_INPUT_ROW, NUM_OUTPUT_ROW} & delta.keys()
    expected = {name for name in model.state_dict() if fine_tuned(name)}
    missing, unexpected = expected - delta.keys(), delta.keys() - expected - rows
    if missing or unexpected:
        raise ModelError(
            f"{delta_file} does not fit {base} with LoRA rank {reference.lora_rank} "
            f"({len(missing)} missing, e.g. {sorted(missing)[:3]}; {len(unexpected)} "
            f"unexpected, e.g. {sorted(unexpected)[:3]})"
        )
    model.load_state_dict({k: v for k, v in delta.items() if k in expected}, strict=False)
    num = tokenizer.convert_tokens_to_ids(NUM)
    with torch.no_grad():
        if NUM_INPUT_ROW in delta:
            _matrix(model.get_input_embeddings())[num] = delta[NUM_INPUT_ROW]
        output = model.get_output_embeddings()
        if NUM_OUTPUT_ROW in delta and output is not None:
            _matrix(output)[num] = delta[NUM_OUTPUT_ROW]
    merge_lora(model)
    return model
