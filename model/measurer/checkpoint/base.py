"""A real Qwen2.5-VL checkpoint as the measurer's backbone: load locally, add [NUM], LoRA.

``load_base_model(DIR)`` reads a local Qwen2.5-VL directory (``config.json``, safetensors
weights, tokenizer files, ``preprocessor_config.json``; nothing from a hub), converts it to
Circle-RoPE (``CircleRopeQwen2_5_VLForConditionalGeneration.from_pretrained`` renames nothing
and keeps every weight) and adds the ``[NUM]`` token, resizing the embeddings; the new row
starts at the mean of the existing rows. The image processor's settings are checked against
what ``model.measurer.inputs.images`` feeds (patch 14, merge 2, temporal patch 2, CLIP mean and
std): radcaliper builds pixel values itself, exactly as that processor would.

LoRA (the paper's defaults: rank 128, alpha 256) is injected in place with ``peft`` on the
decoder's attention and MLP projections (:func:`add_lora`) and merged back into the weights
before a checkpoint is saved (:func:`merge_lora`), so a trained checkpoint loads without peft.

Where no released weights can be had (tests, ``benchmarks/gpu_check.sh`` on a machine with no
network), :func:`write_random_base_model` writes such a directory with random weights: a tiny
one, or a published shape (``model.backbone.QWEN2_5_VL_SHAPES``) with Qwen's special tokens at
their released ids and a word-level stand-in for its tokenizer (:func:`qwen_like_tokenizer`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ingestion.errors import ModelError
from model.measurer.inputs.images import IMAGE_MEAN, IMAGE_STD, MERGE, PATCH, TEMPORAL_PATCH
from model.measurer.tasks.tokenizer import NUM, QWEN_CHAT_TEMPLATE, UNK, VOCAB, special_ids

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration

__all__ = [
    "LORA_TARGETS",
    "NumLogitRow",
    "add_lora",
    "base_weights_dtype",
    "base_weights_hash",
    "fine_tuned",
    "load_base_model",
    "lora_parameters",
    "merge_lora",
    "qwen_like_tokenizer",
    "write_random_base_model",
]

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
    """The image processor must lay out pixels as ``model.measurer.inputs.images`` does."""
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


def fine_tuned(name: str) -> bool:
    """Whether a parameter of a real checkpoint's model (a ``state_dict`` name of the
    Circle-RoPE Qwen2.5-VL, LoRA injected or not) is one fine-tuning trains: the vision merger
    (the projector) and the LoRA adapters. The ``[NUM]`` logit row (:class:`NumLogitRow`) and
    the numeric head are the rest of what a base-model run changes."""
    return ".visual.merger." in name or "lora_" in name


class NumLogitRow(torch.nn.Module):
    """The ``[NUM]`` row of a real checkpoint's output embeddings as its own float32 parameter.

    Fine-tuning trains only this row of the output matrix: it is the logit that makes the
    model write ``[NUM]``. Holding it apart, rather than masking the gradient of the whole
    matrix, keeps the matrix frozen in its own dtype and spares its gradient and AdamW moments
    (151k x 2048 at 3B: 3.4 GiB). While attached, a forward hook on the output embeddings puts
    this row's logit in place of the matrix's; :meth:`write_back` copies it into the matrix
    (shared with the input embeddings when tied; no numeric head reads the ``[NUM]`` input
    row) and detaches the hook.
    """

    def __init__(self, output: nn.Module, num_id: int) -> None:
        super().__init__()
        matrix = output.weight
        if not isinstance(matrix, torch.Tensor) or not 0 <= num_id < matrix.shape[0]:
            raise ValueError(f"[NUM] id {num_id} is not a row of the output embeddings")
        self.num_id = num_id
        self.weight = torch.nn.Parameter(matrix.detach()[num_id].float().clone())
        self._output: nn.Module | None = output
        self._handle = output.register_forward_hook(self._replace)

    def _replace(self, _: nn.Module, args: tuple[Any, ...], logits: torch.Tensor) -> torch.Tensor:
        hidden = args[0]
        row = torch.nn.functional.linear(hidden, self.weight.to(hidden.dtype)[None])
        logits[..., self.num_id] = row[..., 0].to(logits.dtype)
        return logits

    def write_back(self) -> None:
        """Copy the row into the output matrix and remove the hook (idempotent)."""
        if self._output is None:
            return
        matrix = self._output.weight
        assert isinstance(matrix, torch.Tensor)
        with torch.no_grad():
            matrix[self.num_id] = self.weight.detach().to(matrix.dtype)
        self._handle.remove()
        self._output = None


def base_weights_hash(directory: str | Path) -> str:
    """sha256 over a local checkpoint's ``config.json`` and safetensors files (names and
    bytes, sorted): the identity of the base model a fine-tuned checkpoint builds on."""
    from model.measurer.checkpoint.settings import files_sha256

    path = Path(directory)
    return files_sha256([path / "config.json", *path.glob("*.safetensors")])


_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def base_weights_dtype(directory: str | Path) -> torch.dtype:
    """The floating-point dtype a local checkpoint stores most of its weights in (read from
    the safetensors headers, no weights loaded): what a fine-tuned delta of it is stored in."""
    counts: dict[torch.dtype, int] = {}
    for file in Path(directory).glob("*.safetensors"):
        with file.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        for name, entry in header.items():
            dtype = _SAFETENSORS_DTYPES.get(entry.get("dtype")) if name != "__metadata__" else None
            if dtype is not None:
                begin, end = entry["data_offsets"]
                counts[dtype] = counts.get(dtype, 0) + end - begin
    if not counts:
        raise ModelError(f"{directory}: no floating-point weights in its safetensors files")
    return max(counts, key=lambda d: counts[d])


def add_lora(model: nn.Module, *, rank: int = 128, alpha: int = 256, dropout: float = 0.0) -> int:
    """Inject LoRA adapters into the decoder's projections in place; returns their parameter
    count. The adapters are float32 whatever the base weights' dtype (trained in full
    precision). Only the adapters are trainable afterwards (the caller may unfreeze more)."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=_LORA_SCOPE)
    inject_adapter_in_model(config, model)
    adapters = lora_parameters(model)
    for parameter in adapters:
        parameter.data = parameter.data.float()
    return sum(p.numel() for p in adapters)


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


def qwen_like_tokenizer(*, released_ids: bool = True) -> PreTrainedTokenizerFast:
    """A word-level stand-in for Qwen2.5-VL's tokenizer, without ``[NUM]`` (as a real one).

    The measurer's words (``VOCAB`` less ``[NUM]`` and Qwen's special tokens) take ids 0, 1, ...
    Qwen's special tokens (``model.backbone.QWEN_SPECIAL_TOKENS``) follow: ``released_ids`` at
    their released ids, reserved tokens filling the gap (151,657 entries in all), else right
    after the words. It carries Qwen2.5-VL's chat format (``QWEN_CHAT_TEMPLATE``), whose role
    words are among its words.
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from model.backbone import QWEN_SPECIAL_TOKENS

    words = [t for t in VOCAB if t != NUM and t not in QWEN_SPECIAL_TOKENS]
    words += [w for w in _CHAT_WORDS if w not in words]
    specials = dict(QWEN_SPECIAL_TOKENS)  # consecutive ids, in order
    first = min(specials.values()) if released_ids else len(words)
    specials = {t: first + i for i, t in enumerate(specials)}
    vocab = {t: i for i, t in enumerate(words)}
    vocab.update({f"<|reserved_{i}|>": i for i in range(len(words), first)})
    vocab.update(specials)
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Punctuation("isolated"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    backend.add_special_tokens([AddedToken(t, special=True) for t in specials])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=UNK,
    )
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


_CHAT_WORDS = ("system", "user", "assistant", "You", "are", "a", "helpful")
"""The words of Qwen's chat format (roles, default system prompt) for the stand-in."""


def write_random_base_model(
    directory: str | Path,
    shape: str = "tiny",
    *,
    narrow: bool = False,
    tied: bool | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> Path:
    """Write a local Qwen2.5-VL directory with random weights, as ``load_base_model`` reads.

    ``shape``: ``"tiny"`` (``model.backbone.tiny_qwen2_5_vl_kwargs``, float32, Qwen's special
    tokens right after the words), or a published one (``"3b"``, ``"7b"``: the released
    vocabulary, ids and sizes, saved in bfloat16 as released; ``narrow`` keeps all of that but
    the widths and depths). ``tied``: tie the output embeddings to the input ones or not
    (default: as the shape has it; the tiny one is untied, 3B tied, 7B untied). The weights are
    drawn on ``device`` (a GPU draws 3B in seconds). Returns the directory.
    """
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessor,
    )

    from model.backbone import published_qwen2_5_vl_kwargs, tiny_qwen2_5_vl_kwargs

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    dtype = torch.float32
    if shape == "tiny":
        tokenizer = qwen_like_tokenizer(released_ids=False)
        kwargs = tiny_qwen2_5_vl_kwargs(
            vocab_size=len(tokenizer),
            special_ids=special_ids(tokenizer, with_num=False),
            initializer_range=0.02,
        )
    else:
        tokenizer = qwen_like_tokenizer()
        kwargs = published_qwen2_5_vl_kwargs(shape, narrow=narrow)
        if not narrow:
            dtype = torch.bfloat16
    if tied is not None:
        kwargs["tie_word_embeddings"] = tied
        kwargs["text_config"]["tie_word_embeddings"] = tied
    torch.manual_seed(seed)
    with torch.device(device):
        model: Any = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**kwargs))
    model.to(dtype).save_pretrained(path)
    del model
    tokenizer.save_pretrained(path)
    Qwen2VLImageProcessor().save_pretrained(path)
    return path
