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

Nothing is downloaded: loading reads only ``DIR`` (``local_files_only``). A directory that is not
a measurer checkpoint raises ``ModelError`` naming the missing file.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingestion.errors import ModelError
from model.measurer.calibration import Calibration, DecodeCheck, DetectionThreshold
from model.measurer.data import MeasureInputs
from model.measurer.domain import Domain
from model.measurer.find import FindInputs
from model.measurer.voting import FindVoting

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
    from model.numeric.protocol import NumericHead

__all__ = [
    "CARD_NAME",
    "SETTINGS_NAME",
    "LoadedMeasurer",
    "MeasurerSettings",
    "NumericMode",
    "build_head",
    "checkpoint_hash",
    "default_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
    "update_card",
    "write_settings",
]

SETTINGS_NAME = "radcaliper.json"
CARD_NAME = "README.md"
DEMO_NAME = "radcaliper-demo"
HEAD_NAME = "numeric_head.safetensors"
_DOMAIN_HEADING = re.compile(r"^## Validated domain[ \t]*$", re.MULTILINE)
FORMAT_VERSION = 1


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "numeric_mode", NumericMode(self.numeric_mode))
        if not self.name or not self.version:
            raise ValueError("a measurer needs a name and a version")

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
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
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MeasurerSettings:
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"radcaliper.json format_version {version!r} is not {FORMAT_VERSION}; "
                "this radcaliper cannot read that checkpoint"
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
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if head is not None:
        module: nn.Module = head  # type: ignore[assignment]
        state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
        save_file(state, str(out / HEAD_NAME))
    (out / SETTINGS_NAME).write_text(json.dumps(settings.to_json(), indent=2) + "\n")
    update_card(out, settings)
    return out


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
    import hashlib

    root = Path(directory)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
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


def load_checkpoint(directory: str | Path) -> LoadedMeasurer:
    """Read a checkpoint directory written by :func:`save_checkpoint` (eval mode, CPU)."""
    from safetensors.torch import load_file

    from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
    from model.measurer.tokenizer import load_tokenizer

    path = Path(directory)
    settings_file = path / SETTINGS_NAME
    if not settings_file.is_file():
        raise ModelError(
            f"{path} is not a radcaliper measurer checkpoint: {SETTINGS_NAME} is missing"
        )
    try:
        settings = MeasurerSettings.from_json(json.loads(settings_file.read_text()))
    except (ValueError, KeyError, TypeError) as error:
        raise ModelError(f"{settings_file} is not valid: {error}") from error
    model, info = CircleRopeQwen2_5_VLForConditionalGeneration.from_pretrained(
        path, local_files_only=True, output_loading_info=True
    )
    model.eval()
    missing, unexpected = list(info["missing_keys"]), list(info["unexpected_keys"])
    if missing or unexpected:  # never run a model with freshly initialised weights
        raise ModelError(
            f"{path}: the weights do not match the model ({len(missing)} missing, e.g. "
            f"{missing[:3]}; {len(unexpected)} unexpected, e.g. {unexpected[:3]}); was it "
            "written by another transformers version's layout? Re-save it with radcaliper"
        )
    tokenizer = load_tokenizer(path)
    dim = int(model.config.text_config.hidden_size)
    head = build_head(settings.numeric_mode, dim, settings.head)
    if head is not None:
        head_file = path / HEAD_NAME
        if not head_file.is_file():
            raise ModelError(f"{path}: {HEAD_NAME} is missing for mode {settings.numeric_mode}")
        module: nn.Module = head  # type: ignore[assignment]
        module.load_state_dict(load_file(str(head_file)))
        module.eval()
    return LoadedMeasurer(model, head, tokenizer, settings)
