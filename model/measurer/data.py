"""Model inputs for the measure task: crops, prompt and answer tokens, batches.

One example is one finding: an axial crop (``MeasureInputs``) centred on it, the prompt
"measure the lesion|vessel" and the answer "32.5 x 18 mm" / "31 mm" (``model.measurer.tasks``).
The same code builds training examples from phantoms (the crop centre jittered, since at
inference the centre comes from the find step) and inference inputs from any volume.

Sequence layout (one row, before left padding)::

    <|im_start|> <|vision_start|> <|image_pad|> x n <|vision_end|> prompt words  answer  <|im_end|>
    '----------------------------- prompt: no labels ---------------------'  '- labels -'

In RNED / xVal mode every number of the answer is one ``[NUM]`` token whose value travels in
``num_values`` (row-major); in standard-token mode numbers stay digits (``numeric=False``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ingestion.geometry import Geometry
from ingestion.volume import Identifiers, Volume
from model.measurer.images import (
    contrast_channels,
    crop_around,
    image_token_count,
    patchify_frames,
)
from model.measurer.results import FindingKind
from model.measurer.tasks import measure_answer, measure_prompt
from model.measurer.tokenizer import special_ids
from model.numeric.text import to_num_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ingestion.phantoms import Phantom, TruthFinding

__all__ = [
    "Batch",
    "EncodedExample",
    "FindingPatch",
    "MeasureExample",
    "MeasureInputs",
    "collate",
    "encode_example",
    "finding_patches",
    "measure_example",
    "phantom_examples",
    "phantom_volume",
]

IGNORE = -100  # label of positions without a loss


@dataclass(frozen=True)
class MeasureInputs:
    """How a measure crop is made (stored with a checkpoint: inference must match training).

    Args:
        pixel_mm: mm per crop pixel, so that the numbers the model says are mm.
        size: crop side in pixels (multiple of 28); ``size * pixel_mm`` must hold the largest
            finding (60 mm lesions, 45 mm vessels in the phantom spec).
        window: (level, width) HU window of the crop's one intensity channel.
        frames: axial planes in the crop (1: the finding's slice only), ``slice_mm`` apart.
        slice_mm: distance between frames; None: the volume's own slice spacing.
        contrast: encode the window as ``(w, 1 - w, 0.5)`` (``images.contrast_channels``; for a
            vision tower trained from scratch) instead of grey.
        jitter_mm: training only: standard deviation of the random shift of the crop centre in
            each axial direction (the find step's centres are not exact).
    """

    pixel_mm: float = 0.75
    size: int = 112
    window: tuple[float, float] = (40.0, 400.0)
    frames: int = 1
    slice_mm: float | None = None
    contrast: bool = True
    jitter_mm: float = 4.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.pixel_mm) and self.pixel_mm > 0):
            raise ValueError(f"pixel_mm must be > 0, got {self.pixel_mm}")
        if self.size % 28 or self.size < 28:
            raise ValueError(f"size must be a positive multiple of 28, got {self.size}")
        if self.frames < 1:
            raise ValueError(f"frames must be >= 1, got {self.frames}")
        if not (math.isfinite(self.jitter_mm) and self.jitter_mm >= 0):
            raise ValueError(f"jitter_mm must be >= 0, got {self.jitter_mm}")


@dataclass(frozen=True)
class MeasureExample:
    """One finding's crop and texts; ``answer`` is None at inference."""

    kind: FindingKind
    images: torch.Tensor  # (F, 3, H, W) float32 in [0, 1]: one (multi-frame) image
    prompt: str
    answer: str | None


def phantom_volume(phantom: Phantom) -> Volume:
    """A phantom as the ``Volume`` that loading its DICOM series would give (in memory)."""
    n = phantom.hu.shape[0]
    identifiers = Identifiers(
        study_instance_uid=phantom.study_instance_uid,
        series_instance_uid=phantom.series_instance_uid,
        sop_instance_uids=tuple(phantom.sop_instance_uids),
        frame_numbers=(None,) * n,
        patient_id=phantom.patient_id,
    )
    return Volume.in_memory(
        phantom.hu, phantom.geometry, identifiers, name=f"phantom-{phantom.seed}"
    )


def _jittered(
    center_lps_mm: Sequence[float], inputs: MeasureInputs, rng: np.random.Generator
) -> tuple[float, float, float]:
    """The centre shifted in the axial plane by N(0, ``inputs.jitter_mm``) per direction."""
    x, y, z = (float(c) for c in center_lps_mm)
    if not inputs.jitter_mm:
        return (x, y, z)
    dx, dy = rng.normal(0.0, inputs.jitter_mm, 2)
    return (x + float(dx), y + float(dy), z)


def measure_example(
    volume: Volume,
    center_lps_mm: Sequence[float],
    kind: FindingKind | str,
    inputs: MeasureInputs,
    values: Sequence[float] | None = None,
) -> MeasureExample:
    """The crop at ``center_lps_mm`` with the measure prompt; with ``values`` (lesion: long,
    short; vessel: diameter) also the answer."""
    crop = crop_around(
        volume,
        center_lps_mm,
        pixel_mm=inputs.pixel_mm,
        size=inputs.size,
        window=inputs.window,
        slices=inputs.frames,
        slice_mm=inputs.slice_mm,
    )
    image = crop.image  # (F, 1, H, W)
    images = contrast_channels(image) if inputs.contrast else image.expand(-1, 3, -1, -1)
    answer = None if values is None else measure_answer(kind, values)
    return MeasureExample(FindingKind(kind), images.contiguous(), measure_prompt(kind), answer)


def _truth_values(finding: TruthFinding) -> tuple[float, ...]:
    if finding.kind == "lesion":
        assert finding.long_axis_mm is not None and finding.short_axis_mm is not None
        return (round(finding.long_axis_mm, 1), round(finding.short_axis_mm, 1))
    assert finding.diameter_mm is not None
    return (round(finding.diameter_mm, 1),)


def phantom_examples(
    phantom: Phantom, inputs: MeasureInputs, rng: np.random.Generator
) -> list[MeasureExample]:
    """One training example per finding of ``phantom``, the crop centre shifted in the axial
    plane by N(0, ``jitter_mm``) per direction."""
    volume = phantom_volume(phantom)
    out = []
    for finding in phantom.findings:
        center = _jittered(finding.center_lps_mm, inputs, rng)
        out.append(measure_example(volume, center, finding.kind, inputs, _truth_values(finding)))
    return out


@dataclass(frozen=True, eq=False)
class FindingPatch:
    """A small float16 HU sub-volume around one finding, with its truth: a training cache entry.

    Cutting crops from patches instead of whole phantoms makes fresh jittered crops every epoch
    cheap (a phantom takes ~0.15 s to render; a crop from a patch ~1.5 ms), and a patch is ~0.2 MB
    instead of a phantom's ~10 MB.
    """

    hu: np.ndarray  # (S, R, C) float16
    geometry: Geometry
    center_lps_mm: tuple[float, float, float]
    kind: FindingKind
    values: tuple[float, ...]  # truth: lesion (long, short), vessel (diameter,), 0.1 mm grid

    def volume(self) -> Volume:
        """The patch as a ``Volume`` (float32), for ``crop_around``."""
        return Volume.in_memory(self.hu, self.geometry, name="patch")

    def example(self, inputs: MeasureInputs, rng: np.random.Generator) -> MeasureExample:
        """A fresh training example: the crop centre jittered as in :func:`phantom_examples`."""
        center = _jittered(self.center_lps_mm, inputs, rng)
        return measure_example(self.volume(), center, self.kind, inputs, self.values)


def finding_patches(phantom: Phantom, inputs: MeasureInputs) -> list[FindingPatch]:
    """One patch per finding, large enough for every crop ``inputs`` can cut around it: the crop
    half-width plus 4 jitter standard deviations plus one voxel in-plane, and the crop's frames
    plus one slice each way along z (so trilinear interpolation sees the same voxels)."""
    geometry = phantom.geometry
    half_mm = inputs.size * inputs.pixel_mm / 2 + 4 * inputs.jitter_mm
    frames_mm = (inputs.frames - 1) / 2 * (inputs.slice_mm or geometry.spacing[0])
    out = []
    for finding in phantom.findings:
        center = np.asarray(finding.center_lps_mm, dtype=np.float64)
        corners = np.array(
            [
                center + np.array([dx, dy, dz])
                for dx in (-half_mm, half_mm)
                for dy in (-half_mm, half_mm)
                for dz in (-frames_mm, frames_mm)
            ]
        )
        index = geometry.lps_to_index(corners)  # (8, 3)
        low = np.maximum(np.floor(index.min(axis=0)).astype(int) - 1, 0)
        high = np.minimum(np.ceil(index.max(axis=0)).astype(int) + 2, phantom.hu.shape)
        (s0, r0, c0), (s1, r1, c1) = low, high
        origin = geometry.index_to_lps(np.array([s0, r0, c0], dtype=np.float64))
        sub = dataclasses.replace(
            geometry, origin=(float(origin[0]), float(origin[1]), float(origin[2]))
        )
        out.append(
            FindingPatch(
                hu=phantom.hu[s0:s1, r0:r1, c0:c1].astype(np.float16),
                geometry=sub,
                center_lps_mm=tuple(float(v) for v in center),  # type: ignore[arg-type]
                kind=FindingKind(finding.kind),
                values=_truth_values(finding),
            )
        )
    return out


@dataclass(frozen=True)
class EncodedExample:
    """Token ids, labels and numbers of one example, and its image patches."""

    input_ids: list[int]
    labels: list[int]  # IGNORE on the prompt
    num_values: tuple[float, ...]  # one per [NUM] token of input_ids
    pixel_values: torch.Tensor  # (patches, 1176)
    image_grid_thw: torch.Tensor  # (1, 3)


def encode_example(
    example: MeasureExample, tokenizer: PreTrainedTokenizerBase, *, numeric: bool = True
) -> EncodedExample:
    """Tokens of one example (layout in the module doc). ``numeric``: numbers of the answer as
    [NUM] tokens plus values (RNED, xVal), else as digits (standard tokens)."""
    pixel_values, grid = patchify_frames(example.images)
    ids = special_ids(tokenizer)
    head = [ids["bos"], ids["vision_start"]]
    head += [ids["image"]] * image_token_count(grid) + [ids["vision_end"]]
    prompt = head + tokenizer.encode(" " + example.prompt, add_special_tokens=False)
    values: tuple[float, ...] = ()
    answer: list[int] = []
    if example.answer is not None:
        text = example.answer
        if numeric:
            converted = to_num_text(text)
            text, values = converted.text, converted.values
        answer = [*tokenizer.encode(" " + text, add_special_tokens=False), ids["eos"]]
    return EncodedExample(
        input_ids=prompt + answer,
        labels=[IGNORE] * len(prompt) + answer,
        num_values=values,
        pixel_values=pixel_values,
        image_grid_thw=grid,
    )


@dataclass(frozen=True)
class Batch:
    """Left-padded rows for ``NumericLM`` (forward and generate)."""

    input_ids: torch.Tensor  # (B, L) int64
    attention_mask: torch.Tensor  # (B, L) int64
    labels: torch.Tensor  # (B, L) int64, IGNORE on prompts and padding
    num_values: torch.Tensor  # (N,) float64, the [NUM] values of all rows, row-major
    pixel_values: torch.Tensor  # (patches, 1176)
    image_grid_thw: torch.Tensor  # (B, 3)


def collate(examples: Sequence[EncodedExample], pad_id: int) -> Batch:
    """Left-pad encoded examples into one batch (left padding: generation appends on the
    right)."""
    if not examples:
        raise ValueError("collate needs at least one example")
    length = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, IGNORE)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        ids[row, length - n :] = torch.tensor(e.input_ids)
        mask[row, length - n :] = 1
        labels[row, length - n :] = torch.tensor(e.labels)
    values = [v for e in examples for v in e.num_values]
    return Batch(
        input_ids=ids,
        attention_mask=mask,
        labels=labels,
        num_values=torch.tensor(values, dtype=torch.float64),
        pixel_values=torch.cat([e.pixel_values for e in examples]),
        image_grid_thw=torch.cat([e.image_grid_thw for e in examples]),
    )
