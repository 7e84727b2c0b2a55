"""A measurer checkpoint: one local directory with everything inference needs.

Layout::

    DIR/config.json, DIR/model.safetensors      the Circle-RoPE Qwen2.5-VL (save_pretrained)
    DIR/numeric_head.safetensors                the numeric head's state (RNED codec / xVal)
    DIR/tokenizer.json, ...                     the tokenizer (save_pretrained)
    DIR/radcaliper.json                         MeasurerSettings: name, version, numeric mode,
                                                head and input settings, calibration, the
                                                validated domain (``model.measurer.domain``)
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
import enum
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ingestion.errors import ModelError
from model.measurer.calibration import Calibration, DecodeCheck, DetectionThreshold
from model.measurer.domain import Domain
from model.measurer.inputs import FindInputs, FindVoting, MeasureInputs
from model.measurer.results import ModelInfo

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
    from model.numeric.protocol import NumericHead

__all__ = [
    "CARD_NAME",
    "DELTA_NAME",
    "SETTINGS_NAME",
    "BaseReference",
    "LoadedMeasurer",
    "MeasurerSettings",
    "NumericMode",
    "build_head",
    "checkpoint_hash",
    "default_checkpoint",
    "export_checkpoint",
    "files_sha256",
    "load_checkpoint",
    "read_settings",
    "save_checkpoint",
    "save_delta_checkpoint",
    "update_card",
    "write_settings",
]

logger = logging.getLogger(__name__)

SETTINGS_NAME = "radcaliper.json"
CARD_NAME = "README.md"
DEMO_NAME = "radcaliper-demo"
HEAD_NAME = "numeric_head.safetensors"
DELTA_NAME = "delta.safetensors"
_DOMAIN_HEADING = re.compile(r"^## Validated domain[ \t]*$", re.MULTILINE)
FORMAT_VERSION = 1
DELTA_FORMAT_VERSION = 2  # a checkpoint that needs its base model (radcaliper.json "base_model")
# the rows of the [NUM] token in the delta (the rest of its keys are state-dict names)
NUM_INPUT_ROW = "num_rows.input"
NUM_OUTPUT_ROW = "num_rows.output"


@dataclass(frozen=True)
class BaseReference:
    """The base model a fine-tuned checkpoint holds only the changes of."""

    path: str  # the local Qwen2.5-VL directory, absolute
    sha256: str  # model.measurer.base.base_weights_hash of it
    lora_rank: int
    lora_alpha: int
    circle_rope_strategy: str = "alternate"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BaseReference:
        return cls(
            path=str(data["path"]),
            sha256=str(data["sha256"]),
            lora_rank=int(data["lora_rank"]),
            lora_alpha=int(data["lora_alpha"]),
            circle_rope_strategy=str(data.get("circle_rope_strategy", "alternate")),
        )


class NumericMode(enum.StrEnum):
    """How numbers travel through the model (issue 3's heads)."""

    RNED_CORR = "rned_corr"  # RNED, correlation decoder
    RNED_RND = "rned_rnd"  # RNED, the paper's score-matching decoder
    XVAL = "xval"
    STANDARD = "standard_tokens"  # numbers as digits, no head


@dataclass(frozen=True)
class MeasurerSettings:
    """What a checkpoint is and how to feed it (``radcaliper.json``)."""

    name: str
    version: str
    numeric_mode: NumericMode
    measure_inputs: MeasureInputs = field(default_factory=MeasureInputs)
    find_inputs: FindInputs = field(default_factory=FindInputs)
    tasks: tuple[str, ...] = ("find", "measure", "point")  # what the model was trained on
    verify_candidates: bool = False  # confirm each found finding with the point task
    find_voting: FindVoting = field(default_factory=FindVoting)  # shifted find passes (voting)
    # the kinds each find prompt asks for at inference (a model trained on one-kind prompts)
    find_prompts: tuple[tuple[str, ...], ...] = (("lesion", "vessel"),)
    head: Mapping[str, Any] = field(default_factory=dict)  # codec / xVal constructor arguments
    calibration: Calibration | None = None
    decode_check: DecodeCheck | None = None  # the weakest decode reported as a number
    # the least presence a reported finding has (model.measurer.operating); None: every one
    detection: DetectionThreshold | None = None
    not_for_clinical_use: bool = True
    training: Mapping[str, Any] = field(default_factory=dict)  # command, seed, data: provenance
    # what it was trained and validated on; a radcaliper.json without one: Domain.legacy()
    domain: Domain = field(default_factory=Domain.legacy)
    # a checkpoint of what changed from this base model (None: a standalone checkpoint)
    base_model: BaseReference | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "numeric_mode", NumericMode(self.numeric_mode))
        if not self.name or not self.version:
            raise ValueError("a measurer needs a name and a version")

    def model_info(self) -> ModelInfo:
        """The name, version and numeric mode every output of this checkpoint carries."""
        return ModelInfo(
            self.name, self.version, self.numeric_mode.value, self.not_for_clinical_use
        )

    def to_json(self) -> dict[str, Any]:
        extra = {} if self.base_model is None else {"base_model": self.base_model.to_json()}
        return {
            "format_version": FORMAT_VERSION if self.base_model is None else DELTA_FORMAT_VERSION,
            "name": self.name,
            "version": self.version,
            "numeric_mode": self.numeric_mode.value,
            "measure_inputs": dataclasses.asdict(self.measure_inputs),
            "find_inputs": dataclasses.asdict(self.find_inputs),
            "tasks": list(self.tasks),
            "verify_candidates": self.verify_candidates,
            "find_voting": self.find_voting.to_json(),
            "find_prompts": [list(kinds) for kinds in self.find_prompts],
            "head": dict(self.head),
            "calibration": None if self.calibration is None else self.calibration.to_json(),
            "decode_check": None if self.decode_check is None else self.decode_check.to_json(),
            "detection": None if self.detection is None else self.detection.to_json(),
            "not_for_clinical_use": self.not_for_clinical_use,
            "training": dict(self.training),
            "domain": self.domain.to_json(),
            **extra,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MeasurerSettings:
        version = data.get("format_version")
        if version not in (FORMAT_VERSION, DELTA_FORMAT_VERSION):
            raise ValueError(
                f"radcaliper.json format_version {version!r} is not {FORMAT_VERSION} or "
                f"{DELTA_FORMAT_VERSION}; this radcaliper cannot read that checkpoint"
            )
        base = data.get("base_model")
        if (version == DELTA_FORMAT_VERSION) != (base is not None):
            raise ValueError(
                f"format_version {version} goes with "
                + ("a base_model" if version == DELTA_FORMAT_VERSION else "no base_model")
            )
        inputs = dict(data["measure_inputs"])  # JSON lists: the inputs make windows tuples
        find = dict(data.get("find_inputs", {}))
        calibration = data.get("calibration")
        decode_check = data.get("decode_check")
        detection = data.get("detection")
        domain = data.get("domain")
        return cls(
            name=str(data["name"]),
            version=str(data["version"]),
            numeric_mode=NumericMode(data["numeric_mode"]),
            measure_inputs=MeasureInputs(**inputs),
            find_inputs=FindInputs(**find),
            tasks=tuple(data.get("tasks", ("find", "measure", "point"))),
            verify_candidates=bool(data.get("verify_candidates", False)),
            find_voting=FindVoting.from_json(data.get("find_voting", FindVoting().to_json())),
            find_prompts=tuple(
                tuple(str(k) for k in kinds)
                for kinds in data.get("find_prompts", [["lesion", "vessel"]])
            ),
            head=dict(data.get("head", {})),
            calibration=None if calibration is None else Calibration.from_json(calibration),
            decode_check=None if decode_check is None else DecodeCheck.from_json(decode_check),
            detection=None if detection is None else DetectionThreshold.from_json(detection),
            not_for_clinical_use=bool(data.get("not_for_clinical_use", True)),
            training=dict(data.get("training", {})),
            domain=Domain.legacy() if domain is None else Domain.from_json(domain),
            base_model=None if base is None else BaseReference.from_json(base),
        )


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

    from model.measurer.base import fine_tuned

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
    ``out_dir``: the full model with LoRA merged, loadable without its base model. The card
    and settings are kept (less the base reference). ``base_model``: as for
    :func:`load_checkpoint`."""
    source, out = Path(directory), Path(out_dir)
    if out.resolve() == source.resolve():
        raise ModelError(f"export {source}: write the standalone checkpoint to another folder")
    loaded = load_checkpoint(source, base_model=base_model)
    out.mkdir(parents=True, exist_ok=True)
    card = source / CARD_NAME
    if card.is_file():
        (out / CARD_NAME).write_text(card.read_text(encoding="utf-8"), encoding="utf-8")
    settings = dataclasses.replace(loaded.settings, base_model=None)
    return save_checkpoint(out, loaded.model, loaded.head, loaded.tokenizer, settings)


def update_card(directory: str | Path, settings: MeasurerSettings) -> Path:
    """Write ``settings.domain`` into the checkpoint's card (``README.md``): its "Validated
    domain" section (up to the next level-2 heading) is replaced, or appended where there is
    none; a checkpoint without a card gets a short one. Returns the card's path."""
    path = Path(directory) / CARD_NAME
    section = settings.domain.card_markdown()
    if path.is_file():
        text = path.read_text(encoding="utf-8")
    else:
        text = f"# {settings.name} {settings.version}\n\n" + (
            "Not for clinical use.\n" if settings.not_for_clinical_use else ""
        )
    found = _DOMAIN_HEADING.search(text)
    if found is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", found.end())
        rest = "" if end < 0 else "\n" + text[end + 1 :]
        text = text[: found.start()] + section + rest
    partial = path.with_suffix(".md.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)
    return path


def default_checkpoint() -> Path:
    """The demo checkpoint shipped inside the package (not for clinical use)."""
    return Path(__file__).resolve().parent.parent / "weights" / DEMO_NAME


def checkpoint_hash(directory: str | Path) -> str:
    """sha256 over the checkpoint's files (names and bytes, sorted; training state excluded):
    the identity of a model version as the store records it."""
    return files_sha256(p for p in Path(directory).iterdir() if p.is_file())


def files_sha256(paths: Iterable[Path]) -> str:
    """sha256 over files' names and bytes, in name order (checkpoint and base-model
    identities)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def write_settings(directory: str | Path, settings: MeasurerSettings) -> None:
    """Replace a checkpoint's ``radcaliper.json`` (e.g. after calibration)."""
    path = Path(directory) / SETTINGS_NAME
    if not path.is_file():
        raise ModelError(f"{directory} is not a radcaliper measurer checkpoint: no {SETTINGS_NAME}")
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(settings.to_json(), indent=2) + "\n")
    partial.replace(path)
    update_card(directory, settings)


def read_settings(directory: str | Path) -> MeasurerSettings:
    """A checkpoint directory's ``radcaliper.json`` (``ModelError`` when it is missing or not
    valid), without loading any weight: imports neither torch nor transformers."""
    path = Path(directory)
    settings_file = path / SETTINGS_NAME
    if not settings_file.is_file():
        raise ModelError(
            f"{path} is not a radcaliper measurer checkpoint: {SETTINGS_NAME} is missing"
        )
    try:
        return MeasurerSettings.from_json(json.loads(settings_file.read_text()))
    except (ValueError, KeyError, TypeError) as error:
        raise ModelError(f"{settings_file} is not valid: {error}") from error


def load_checkpoint(
    directory: str | Path, *, base_model: str | Path | None = None
) -> LoadedMeasurer:
    """Read a checkpoint directory written by :func:`save_checkpoint` or
    :func:`save_delta_checkpoint` (eval mode, CPU). ``base_model``: where a delta's base model
    is now, in place of the folder it was fine-tuned from (its weights must be the same)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
    from model.measurer.tokenizer import load_tokenizer

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

    from model.measurer.base import (
        add_lora,
        base_weights_hash,
        fine_tuned,
        load_base_model,
        merge_lora,
    )
    from model.measurer.tokenizer import NUM

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
