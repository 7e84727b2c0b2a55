"""Model inputs for the measure task: crops, prompt and answer tokens, batches.

One example is one finding: an axial crop (``MeasureInputs``) centred on it, the prompt
"measure the lesion|vessel" and the answer "32.5 x 18 mm" / "31 mm" (``model.measurer.tasks.text``).
The same code builds training examples from phantoms (the crop centre jittered, since at
inference the centre comes from the find step) and inference inputs from any volume.

Sequence layout (one row, before left padding)::

    <|im_start|> <|vision_start|> <|image_pad|> x n <|vision_end|> prompt words  answer  <|im_end|>
    '----------------------------- prompt: no labels ---------------------'  '- labels -'

A tokenizer with a chat template (a released Qwen2.5-VL's, or ``QWEN_CHAT_TEMPLATE`` on the
stand-in) gets its model's own format instead: the system turn, a user turn holding the image
and the prompt, and the assistant turn whose content and closing ``<|im_end|>`` are the
labels (``model.measurer.tasks.tokenizer.chat_prompt``)::

    <|im_start|>system ... <|im_end|> <|im_start|>user <|vision_start|> <|image_pad|> x n
    <|vision_end|> prompt words <|im_end|> <|im_start|>assistant  answer  <|im_end|>

In RNED / xVal mode every number of the answer is one ``[NUM]`` token whose value travels in
``num_values`` (row-major); in standard-token mode numbers stay digits (``numeric=False``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt
import torch

from ingestion.geometry import Geometry
from ingestion.volume import Identifiers, Volume
from model.measurer.inputs.images import (
    Crop,
    contrast_channels,
    crop_around,
    image_token_count,
    patchify_frames,
    two_window_channels,
)
from model.measurer.inputs.settings import MeasureInputs
from model.measurer.results import FindingKind
from model.measurer.tasks.axes import axes_answer, axes_prompt, finding_axes, segments_to_pixels
from model.measurer.tasks.text import measure_answer, measure_prompt, point_answer, point_prompt
from model.measurer.tasks.tokenizer import chat_prompt, special_ids
from model.numeric.text import to_num_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ingestion.dataset.format import TrueFinding
    from ingestion.phantoms import Phantom

__all__ = [
    "AxesExample",
    "Batch",
    "EncodedExample",
    "FindingPatch",
    "MeasureExample",
    "MeasureInputs",
    "PointExample",
    "Prompted",
    "axes_example",
    "background_patches",
    "collate",
    "encode_example",
    "finding_patches",
    "measure_example",
    "negative_patches",
    "phantom_examples",
    "phantom_volume",
    "point_example",
]

IGNORE = -100  # label of positions without a loss
Vector = tuple[float, float, float]


@dataclass(frozen=True)
class MeasureExample:
    """One finding's crop and texts; ``answer`` is None at inference."""

    kind: FindingKind
    images: torch.Tensor  # (F, 3, H, W) float32 in [0, 1]: one (multi-frame) image
    prompt: str
    answer: str | None


@dataclass(frozen=True)
class PointExample:
    """A crop centred on a point (the UI's click) and texts; ``answer`` is None at inference."""

    images: torch.Tensor  # (F, 3, H, W) float32 in [0, 1]
    prompt: str
    answer: str | None


class Prompted(Protocol):
    """What :func:`encode_example` needs of an example (measure, point and find examples)."""

    @property
    def images(self) -> torch.Tensor: ...  # (F, 3, H, W): one (multi-frame) image

    @property
    def prompt(self) -> str: ...

    @property
    def answer(self) -> str | None: ...


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
    """The centre shifted by N(0, ``jitter_mm``) in each axial direction and N(0,
    ``jitter_z_mm``) along z (no draw for a zero jitter, so that old streams stay the same)."""
    x, y, z = (float(c) for c in center_lps_mm)
    if inputs.jitter_mm:
        dx, dy = rng.normal(0.0, inputs.jitter_mm, 2)
        x, y = x + float(dx), y + float(dy)
    if inputs.jitter_z_mm:
        z += float(rng.normal(0.0, inputs.jitter_z_mm))
    return (x, y, z)


def _crop(volume: Volume, center_lps_mm: Sequence[float], inputs: MeasureInputs) -> Crop:
    window = (
        inputs.window if inputs.second_window is None else (inputs.window, inputs.second_window)
    )
    return crop_around(
        volume,
        center_lps_mm,
        pixel_mm=inputs.pixel_mm,
        size=inputs.size,
        window=window,
        slices=inputs.frames,
        slice_mm=inputs.slice_mm,
    )


def _model_channels(crop: Crop, inputs: MeasureInputs) -> torch.Tensor:
    """(F, 3, H, W) the crop in the model's channels."""
    image = crop.image  # (F, 1 or 2, H, W)
    if inputs.second_window is not None:
        images = two_window_channels(image)
    elif inputs.contrast:
        images = contrast_channels(image)
    else:
        images = image.expand(-1, 3, -1, -1)
    return images.contiguous()


def _crop_images(
    volume: Volume, center_lps_mm: Sequence[float], inputs: MeasureInputs
) -> torch.Tensor:
    """(F, 3, H, W) the crop of ``inputs`` at ``center_lps_mm`` in the model's channels."""
    return _model_channels(_crop(volume, center_lps_mm, inputs), inputs)


def measure_example(
    volume: Volume,
    center_lps_mm: Sequence[float],
    kind: FindingKind | str,
    inputs: MeasureInputs,
    values: Sequence[float] | None = None,
) -> MeasureExample:
    """The crop at ``center_lps_mm`` with the measure prompt; with ``values`` (lesion: long,
    short; vessel: diameter) also the answer."""
    images = _crop_images(volume, center_lps_mm, inputs)
    answer = None if values is None else measure_answer(kind, values)
    return MeasureExample(FindingKind(kind), images, measure_prompt(kind), answer)


def point_example(
    volume: Volume,
    point_lps_mm: Sequence[float],
    inputs: MeasureInputs,
    kind: FindingKind | str | None = None,
    values: Sequence[float] = (),
    *,
    answer: bool = False,
) -> PointExample:
    """The crop centred on a clicked point with the point prompt; with ``answer`` also the answer
    (``kind`` None: nothing measurable there)."""
    images = _crop_images(volume, point_lps_mm, inputs)
    text = point_answer(kind, values) if answer else None
    return PointExample(images, point_prompt(), text)


@dataclass(frozen=True)
class AxesExample:
    """A finding's crop with the axes prompt; ``segments`` (crop pixels) and the answer in
    training, None at inference; ``crop`` maps the answer's pixels back to LPS."""

    kind: FindingKind
    images: torch.Tensor  # (F, 3, H, W)
    prompt: str
    answer: str | None
    crop: Crop


def axes_example(
    volume: Volume,
    center_lps_mm: Sequence[float],
    kind: FindingKind | str,
    inputs: MeasureInputs,
    segments_lps: Sequence[tuple[Sequence[float], Sequence[float]]] | None = None,
) -> AxesExample | None:
    """The crop at ``center_lps_mm`` with the axes prompt; with ``segments_lps`` also the answer
    (None when an end point falls outside the crop: no honest answer to train on)."""
    crop = _crop(volume, center_lps_mm, inputs)
    kind = FindingKind(kind)
    answer = None
    if segments_lps is not None:
        pixels = segments_to_pixels(segments_lps, crop.lps_to_pixel)
        limit = float(inputs.size)
        if any(not (0 <= v <= limit) for segment in pixels for point in segment for v in point):
            return None
        answer = axes_answer(kind, pixels)
    return AxesExample(kind, _model_channels(crop, inputs), axes_prompt(kind), answer, crop)


def _truth_values(finding: TrueFinding) -> tuple[float, ...]:
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
    instead of a phantom's ~10 MB. ``kind`` None: a background patch (no finding at its centre;
    point examples answer "none" there).
    """

    hu: np.ndarray  # (S, R, C) float16
    geometry: Geometry
    center_lps_mm: tuple[float, float, float]
    kind: FindingKind | None
    values: tuple[float, ...]  # truth: lesion (long, short), vessel (diameter,), 0.1 mm grid
    inner_radius_mm: float = 0.0  # a click this far from the centre still lands on the finding
    segments_lps: tuple[
        tuple[Vector, Vector], ...
    ] = ()  # the true axes (model.measurer.tasks.axes)
    click_fraction: float = 0.0  # > 0: clicks anywhere within this fraction of the outline

    def volume(self) -> Volume:
        """The patch as a ``Volume`` (float32), for ``crop_around``."""
        return Volume.in_memory(self.hu, self.geometry, name="patch")

    def example(self, inputs: MeasureInputs, rng: np.random.Generator) -> MeasureExample:
        """A fresh measure example: the crop centre jittered as in :func:`phantom_examples`."""
        if self.kind is None:
            raise ValueError("a background patch has no finding to measure")
        center = _jittered(self.center_lps_mm, inputs, rng)
        return measure_example(self.volume(), center, self.kind, inputs, self.values)

    def axes_example(self, inputs: MeasureInputs, rng: np.random.Generator) -> AxesExample | None:
        """A fresh axes example, the crop centre jittered as for measure examples (None when
        an end point falls outside that crop)."""
        if self.kind is None:
            raise ValueError("a background patch has no axes")
        center = _jittered(self.center_lps_mm, inputs, rng)
        return axes_example(self.volume(), center, self.kind, inputs, self.segments_lps)

    def click(self, rng: np.random.Generator) -> Vector:
        """A random click on the finding: uniform in a disk of ``inner_radius_mm`` around the
        centre or, with ``click_fraction``, in the finding's own cross-section shrunk by that
        fraction (the ellipse of its axes; a vessel's circle): anywhere a user may click."""
        x, y, z = self.center_lps_mm
        radius = math.sqrt(float(rng.uniform()))
        angle = float(rng.uniform(0.0, 2.0 * math.pi))
        u, v = radius * math.cos(angle), radius * math.sin(angle)
        if self.click_fraction and self.segments_lps:
            first = np.subtract(self.segments_lps[0][1], self.segments_lps[0][0]) / 2
            second = (
                np.subtract(self.segments_lps[1][1], self.segments_lps[1][0]) / 2
                if len(self.segments_lps) > 1
                else np.array([-first[1], first[0], 0.0])  # a circle: the perpendicular radius
            )
            offset = self.click_fraction * (u * first + v * second)
            return (x + float(offset[0]), y + float(offset[1]), z)
        return (x + self.inner_radius_mm * u, y + self.inner_radius_mm * v, z)

    def point_example(self, inputs: MeasureInputs, rng: np.random.Generator) -> PointExample:
        """A fresh point example: a :meth:`click` with the finding's kind and values, or the
        centre of a background patch with "none"."""
        point = self.click(rng)
        return point_example(self.volume(), point, inputs, self.kind, self.values, answer=True)


def _patch_around(
    volume: Volume,
    center: npt.NDArray[np.float64],
    inputs: MeasureInputs,
    reach_mm: float,
) -> tuple[np.ndarray, Geometry]:
    """The float16 voxels and geometry of the block that every crop of ``inputs`` centred within
    ``reach_mm`` in-plane (and 4 z-jitter deviations along z) of ``center`` samples from."""
    geometry = volume.geometry
    half_mm = inputs.size * inputs.pixel_mm / 2 + reach_mm
    frames_mm = (inputs.frames - 1) / 2 * (inputs.slice_mm or geometry.spacing[0])
    frames_mm += 4 * inputs.jitter_z_mm
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
    high = np.minimum(np.ceil(index.max(axis=0)).astype(int) + 2, volume.shape)
    (s0, r0, c0), (s1, r1, c1) = low, high
    origin = geometry.index_to_lps(np.array([s0, r0, c0], dtype=np.float64))
    sub = dataclasses.replace(
        geometry, origin=(float(origin[0]), float(origin[1]), float(origin[2]))
    )
    return volume.voxels[s0:s1, r0:r1, c0:c1].astype(np.float16), sub


def _outer_radius(finding: TrueFinding) -> float:
    size = finding.long_axis_mm if finding.kind == "lesion" else finding.diameter_mm
    assert size is not None
    return size / 2


def _inner_radius(finding: TrueFinding) -> float:
    """Clicks within 40 % of the smallest half-axis land on the finding."""
    if finding.kind == "lesion":
        assert finding.short_axis_mm is not None
        return 0.4 * finding.short_axis_mm / 2
    assert finding.diameter_mm is not None
    return 0.4 * finding.diameter_mm / 2


def finding_patches(
    volume: Volume,
    findings: Sequence[TrueFinding],
    inputs: MeasureInputs,
    *,
    click_fraction: float = 0.0,
) -> list[FindingPatch]:
    """One patch per finding of ``volume``, large enough for every crop ``inputs`` can cut
    around it: the crop half-width plus 4 jitter standard deviations (or the click radius) plus
    one voxel in-plane, and the crop's frames plus 4 z-jitter deviations plus one slice each
    way along z (so trilinear interpolation sees the same voxels)."""
    out = []
    for finding in findings:
        center = np.asarray(finding.center_lps_mm, dtype=np.float64)
        inner = _inner_radius(finding)
        reach = max(inner, click_fraction * _outer_radius(finding))
        hu, geometry = _patch_around(volume, center, inputs, max(4 * inputs.jitter_mm, reach))
        out.append(
            FindingPatch(
                hu=hu,
                geometry=geometry,
                center_lps_mm=tuple(float(v) for v in center),  # type: ignore[arg-type]
                kind=FindingKind(finding.kind),
                values=_truth_values(finding),
                inner_radius_mm=inner,
                segments_lps=finding_axes(finding),
                click_fraction=click_fraction,
            )
        )
    return out


def background_patches(
    volume: Volume,
    findings: Sequence[TrueFinding],
    inputs: MeasureInputs,
    rng: np.random.Generator,
    *,
    count: int,
    soft_hu: tuple[float, float] = (-20.0, 100.0),
    margin_mm: float = 8.0,
    near_fraction: float = 0.0,
    near_mm: float = 30.0,
) -> list[FindingPatch]:
    """Up to ``count`` patches centred on soft-tissue voxels (HU in ``soft_hu``) that lie more
    than ``margin_mm`` outside every finding (a lesion's bounding sphere, a vessel's cylinder),
    for point examples whose answer is "none".

    ``near_fraction`` of them (rounded) are drawn among those points that lie within
    ``near_mm`` of that margin of some finding in the axial plane: clicks beside a finding,
    whose crop shows it off-centre, where the answer is still "none". Where too few such
    points exist, the rest come from anywhere.
    """
    if not 0.0 <= near_fraction <= 1.0:
        raise ValueError(f"near_fraction must be in [0, 1], got {near_fraction!r}")
    candidates = np.argwhere(
        (volume.voxels >= soft_hu[0]) & (volume.voxels <= soft_hu[1])
    )  # (N, 3) indices
    if len(candidates) == 0 or count <= 0:
        return []
    picks = candidates[rng.choice(len(candidates), min(len(candidates), 50 * count), replace=False)]
    points = volume.geometry.index_to_lps(picks.astype(np.float64))  # (M, 3)
    keep = np.ones(len(points), dtype=bool)
    near = np.zeros(len(points), dtype=bool)
    for finding in findings:
        center = np.asarray(finding.center_lps_mm, dtype=np.float64)
        in_plane = np.hypot(points[:, 0] - center[0], points[:, 1] - center[1])
        if finding.kind == "vessel":
            assert finding.diameter_mm is not None
            reach = finding.diameter_mm / 2 + margin_mm
            keep &= in_plane > reach
        else:
            assert finding.long_axis_mm is not None and finding.cc_extent_mm is not None
            reach = max(finding.long_axis_mm, finding.cc_extent_mm) / 2 + margin_mm
            keep &= np.linalg.norm(points - center, axis=1) > reach
        near |= (in_plane <= reach + near_mm) & (
            np.abs(points[:, 2] - center[2]) <= _half_extent_z(finding)
        )
    n_near = round(near_fraction * count)
    chosen = list(points[keep & near][:n_near])
    chosen += list(points[keep & ~near][: count - len(chosen)])
    if len(chosen) < count:  # too few far points: take more near ones
        chosen += list(points[keep & near][n_near : n_near + count - len(chosen)])
    out = []
    for point in chosen:
        hu, geometry = _patch_around(volume, point, inputs, 0.0)
        out.append(
            FindingPatch(
                hu, geometry, (float(point[0]), float(point[1]), float(point[2])), None, ()
            )
        )
    return out


def negative_patches(
    volume: Volume, negatives: Sequence[TrueFinding], inputs: MeasureInputs
) -> list[FindingPatch]:
    """A background patch (point examples answer "none") centred on each place a reviewer
    said holds no finding (a rejected finding: ``ingestion.dataset.Label.NEGATIVE``)."""
    out = []
    for negative in negatives:
        point = np.asarray(negative.center_lps_mm, dtype=np.float64)
        hu, geometry = _patch_around(volume, point, inputs, 0.0)
        out.append(FindingPatch(hu, geometry, negative.center_lps_mm, None, ()))
    return out


def _half_extent_z(finding: TrueFinding) -> float:
    """How far along z from its centre a finding shows (mm): a vessel everywhere."""
    if finding.kind == "vessel" or finding.cc_extent_mm is None:
        return math.inf
    return finding.cc_extent_mm / 2


@dataclass(frozen=True)
class EncodedExample:
    """Token ids, labels and numbers of one example, and its image patches."""

    input_ids: list[int]
    labels: list[int]  # IGNORE on the prompt
    num_values: tuple[float, ...]  # one per [NUM] token of input_ids
    pixel_values: torch.Tensor  # (patches, 1176)
    image_grid_thw: torch.Tensor  # (1, 3)


def encode_example(
    example: Prompted, tokenizer: PreTrainedTokenizerBase, *, numeric: bool = True
) -> EncodedExample:
    """Tokens of one example (layout in the module doc). ``numeric``: numbers of the answer as
    [NUM] tokens plus values (RNED, xVal), else as digits (standard tokens)."""
    pixel_values, grid = patchify_frames(example.images)
    ids = special_ids(tokenizer)
    images = [ids["image"]] * image_token_count(grid)
    chat = chat_prompt(tokenizer, example.prompt)
    if chat is None:
        head = [ids["bos"], ids["vision_start"], *images, ids["vision_end"]]
        prompt = head + tokenizer.encode(" " + example.prompt, add_special_tokens=False)
    else:  # the one image pad of the template stands for the image's tokens
        rendered = tokenizer.encode(chat, add_special_tokens=False)
        at = rendered.index(ids["image"])
        prompt = rendered[:at] + images + rendered[at + 1 :]
    values: tuple[float, ...] = ()
    answer: list[int] = []
    if example.answer is not None:
        text = example.answer
        if numeric:
            converted = to_num_text(text)
            text, values = converted.text, converted.values
        text = text if chat is not None else " " + text  # after "assistant\n": no space
        answer = [*tokenizer.encode(text, add_special_tokens=False), ids["eos"]]
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
