"""A checkpoint's settings and identity, without loading any weight: ``radcaliper.json``
(:class:`MeasurerSettings`: numeric mode, inputs, calibration, validated domain, the base model a
delta needs), its file names, the model card's domain section, and the sha256 that names a
model version (:func:`checkpoint_hash`). Imports neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingestion.errors import ModelError
from model.measurer.calibrate.calibration import Calibration, DecodeCheck, DetectionThreshold
from model.measurer.checkpoint.domain import Domain
from model.measurer.inputs.settings import FindInputs, FindVoting, MeasureInputs
from model.measurer.inputs.view import LesionView
from model.measurer.results import ModelInfo

if TYPE_CHECKING:
    pass

__all__ = [
    "CARD_NAME",
    "DELTA_FORMAT_VERSION",
    "DELTA_NAME",
    "DEMO_NAME",
    "FORMAT_VERSION",
    "HEAD_NAME",
    "NUM_INPUT_ROW",
    "NUM_OUTPUT_ROW",
    "SETTINGS_NAME",
    "BaseReference",
    "MeasurerSettings",
    "NumericMode",
    "checkpoint_hash",
    "click_model_folder",
    "default_checkpoint",
    "files_sha256",
    "read_settings",
    "update_card",
    "write_settings",
]


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
    sha256: str  # model.measurer.checkpoint.base.base_weights_hash of it
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
    # the least presence a reported finding has (model.measurer.calibrate.operating); None: every
    # one
    detection: DetectionThreshold | None = None
    not_for_clinical_use: bool = True
    training: Mapping[str, Any] = field(default_factory=dict)  # command, seed, data: provenance
    # what it was trained and validated on; a radcaliper.json without one: Domain.legacy()
    domain: Domain = field(default_factory=Domain.legacy)
    # a checkpoint of what changed from this base model (None: a standalone checkpoint)
    base_model: BaseReference | None = None
    # a click model's view that fits the lesion (model.measurer.inputs.view); None: not one
    lesion_view: LesionView | None = None
    # the click model this checkpoint answers clicks with: a folder of the checkpoint
    click_model: str | None = None

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
        extra: dict[str, Any] = (
            {} if self.base_model is None else {"base_model": self.base_model.to_json()}
        )
        if self.lesion_view is not None:  # written only when set: older files stay the same
            extra["lesion_view"] = self.lesion_view.to_json()
        if self.click_model is not None:
            extra["click_model"] = self.click_model
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
        view = data.get("lesion_view")
        click = data.get("click_model")
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
            lesion_view=None if view is None else LesionView.from_json(view),
            click_model=None if click is None else str(click),
        )


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
    return Path(__file__).resolve().parents[2] / "weights" / DEMO_NAME


def checkpoint_hash(directory: str | Path) -> str:
    """sha256 over the checkpoint's files (names and bytes, sorted; training state excluded)
    and, where it names a click model, that folder's files too: the identity of a model
    version as the store records it."""
    root = Path(directory)
    digest = files_sha256(p for p in root.iterdir() if p.is_file())
    try:
        folder = json.loads((root / SETTINGS_NAME).read_text()).get("click_model")
    except (OSError, ValueError, AttributeError):
        folder = None  # not a checkpoint's settings: its files are its identity
    if not isinstance(folder, str):
        return digest
    click = click_model_folder(root, folder)
    inner = files_sha256(p for p in click.iterdir() if p.is_file())
    import hashlib

    return hashlib.sha256(f"{digest}\0{click.name}\0{inner}".encode()).hexdigest()


def click_model_folder(directory: str | Path, folder: str) -> Path:
    """The click model's folder a checkpoint names (``settings.click_model``), which must be a
    folder inside it (``ModelError`` naming the checkpoint otherwise)."""
    root = Path(directory).resolve()
    path = (root / folder).resolve()
    if not path.is_relative_to(root) or path == root or not path.is_dir():
        raise ModelError(
            f"{directory}: its click model {folder!r} is not a folder of the checkpoint; copy "
            "the checkpoint again, whole"
        )
    return path


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
