"""Inference as named stages: each a small function from one :class:`StudyState` to the next.

``CheckpointMeasurer.measure`` runs a list of :class:`InferenceStage` s
(:func:`default_stages` gives the checkpoint's list) and tells every subscriber
(:class:`TraceEvent`) what each stage left; a stage is left out by leaving it out of the list.
The stages, in their default order:

``find``
    The model's find task on every examined plane (planes at least
    :attr:`InferenceOptions.find_plane_mm` apart) over the whole field of view, in overlapping
    tiles of the trained size (``model.measurer.inputs.tiles``), once per shifted pass of the
    checkpoint's ``find_voting`` (``model.measurer.inputs.voting``); boxes joined into candidates in
    3-D (``model.measurer.infer.grouping``). Each of the checkpoint's find prompts runs (the kinds
    it asks for; only those are kept); a checkpoint with 3-D context sees each plane with the
    examined planes nearest its ``context_mm`` below and above (``model.measurer.inputs.find``). A
    malformed answer leaves its plane unsearched in that pass; it is counted in the warnings.
``verify``
    The point task at each candidate's centre (a crop at the measure scale): ``none`` drops the
    candidate, a kind replaces the find step's, and the candidate keeps its presence (1 - the
    probability the model gave ``none``). A malformed answer is no confirmation: the
    candidate is dropped and counted (never reported on the find step's word alone).
``recentre``
    The axes task at each candidate: its axial centre moves to the middle of the long axis
    (or diameter) the model draws; a malformed answer keeps the centre (counted).
``merge``
    Candidates of one kind split along z by missed planes become one
    (``grouping.merge_duplicates``).
``measure``
    The measure task; a lesion also on :attr:`InferenceOptions.lesion_planes` examined planes to
    either side, keeping the plane where its long axis is longest (RECIST,
    ``model.measurer.infer.planes``). A malformed answer makes its values "not measurable" with the
    reason.
``axes``
    The axes task at the measured centre, drawn for the reviewer (None where malformed).
``dedupe``
    One report per object (``model.measurer.infer.dedupe``): stated on the model's own reports, not
    on HU levels.
``calibrate``
    What ``radcaliper calibrate`` fitted: a finding whose presence (the verify stage's
    probability that something is there) is below the checkpoint's ``DetectionThreshold``
    is not reported (``model.measurer.calibrate.operating``); a value whose weakest number decoded
    below its ``DecodeCheck`` becomes "not measurable" with the reason; the others get the
    checkpoint's calibrated ranges (none, with a warning, for a checkpoint never calibrated).

No stage reads HU thresholds: what a region is, is the model's answer.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from model.measurer.infer.dedupe import one_report_per_object
from model.measurer.infer.grouping import (
    group_detections,
    merge_groups,
    plane_detections,
)
from model.measurer.infer.inference import (
    MAX_ANSWER_TOKENS,
    Answer,
    calibrated,
    outcome_for,
)
from model.measurer.infer.planes import best_plane, search_points
from model.measurer.infer.state import (
    MAX_AXES_TOKENS,
    MAX_FIND_TOKENS,
    MAX_FIND_TOKENS_DIGITS,
    MAX_POINT_TOKENS,
    AnswerForm,
    Candidate,
    InferenceStage,
    StageModel,
    StudyState,
)
from model.measurer.inputs.data import (
    MeasureExample,
    Prompted,
    axes_example,
    measure_example,
    point_example,
)
from model.measurer.inputs.find import (
    FindExample,
    FindInputs,
    find_frames,
    prepare_find_field,
    with_context,
)
from model.measurer.inputs.tiles import merge_tiles, offset_findings, tile_starts
from model.measurer.inputs.voting import shift_planes, unshift_findings, vote_boxes
from model.measurer.results import FindingKind, Segment3
from model.measurer.tasks.axes import Segment, parse_axes
from model.measurer.tasks.text import (
    NONE_WORD,
    FoundFinding,
    find_kinds,
    find_prompt,
    parse_find,
    parse_measure,
    parse_point,
)

if TYPE_CHECKING:
    from ingestion.volume import Volume
    from model.measurer.checkpoint.settings import MeasurerSettings
    from model.measurer.inputs.images import Crop

__all__ = [
    "ALL_STAGES",
    "axes",
    "calibrate",
    "dedupe",
    "default_stages",
    "drawn_segments",
    "find",
    "measure",
    "merge",
    "recentre",
    "segment_to_lps",
    "source_slice",
    "stages_named",
    "verify",
]

logger = logging.getLogger(__name__)


# --- the stages --------------------------------------------------------------------------------


def _batched(
    model: StageModel,
    examples: Sequence[Prompted],
    max_new_tokens: int,
    batch: int,
    opening: str | None = None,
    form: AnswerForm | None = None,
) -> list[Answer]:
    answers: list[Answer] = []
    for start in range(0, len(examples), batch):
        answers += model.generate(examples[start : start + batch], max_new_tokens, opening, form)
    return answers


def _batched_texts(
    model: StageModel,
    examples: Sequence[Prompted],
    max_new_tokens: int,
    batch: int,
    form: AnswerForm | None = None,
) -> list[str]:
    return [a.text for a in _batched(model, examples, max_new_tokens, batch, None, form)]


@dataclass(frozen=True)
class _FindJob:
    """One find prompt over every plane of one tile, in one shifted pass."""

    tile: int
    prompt: int  # index into the kinds of the find prompts
    shift: int  # index into the voting's shifts
    windows: torch.Tensor  # (P, C, H, W) shifted tile planes
    kinds: frozenset[FindingKind]


def _find_answers(
    model: StageModel, jobs: Iterable[_FindJob], inputs: FindInputs
) -> tuple[dict[tuple[int, int, int], list[list[FoundFinding]]], int]:
    """Every job's parsed boxes of its kinds on each plane (none where the answer was malformed;
    a box of a kind not asked for is not the prompt's answer and is dropped), keyed by (tile,
    prompt, shift), and how many answers were malformed.

    The prompts of every job go through the model in batches of ``find_batch``, whichever job
    they come from; jobs are made one at a time, so the images held at once are one batch and
    one job's planes."""
    limit = MAX_FIND_TOKENS if model.numeric_tokens else MAX_FIND_TOKENS_DIGITS
    batch = model.options.find_batch
    answers: dict[tuple[int, int, int], list[list[FoundFinding]]] = {}
    pending: list[tuple[FindExample, list[FoundFinding], frozenset[FindingKind]]] = []
    malformed = 0

    def answer_pending() -> None:
        nonlocal malformed
        examples = [example for example, _, _ in pending]
        texts = _batched_texts(model, examples, limit, batch, "find")
        for (_, found, kinds), text in zip(pending, texts, strict=True):
            parsed = parse_find(text, num_images=1)
            if not parsed.success:
                malformed += 1
                logger.debug("malformed find answer: %s", parsed.reason)
            found.extend(f for f in (parsed.findings if parsed.success else ()) if f.kind in kinds)
        pending.clear()

    for job in jobs:
        prompt = find_prompt(1, job.kinds)
        planes: list[list[FoundFinding]] = []
        answers[job.tile, job.prompt, job.shift] = planes
        for image in find_frames(job.windows, inputs):
            planes.append([])
            pending.append((FindExample(image, prompt, None), planes[-1], job.kinds))
            if len(pending) == batch:
                answer_pending()
    if pending:
        answer_pending()
    return answers, malformed


def find(model: StageModel, state: StudyState) -> StudyState:
    """Candidates from the find task over the whole field (module doc)."""
    volume = state.volume
    inputs = model.settings.find_inputs
    options = model.options
    native = volume.geometry.slice_spacing
    stride = max(1, round(options.find_plane_mm / native))
    prepared = prepare_find_field(volume, inputs, stride=stride, edge_mm=options.find_edge_mm)
    planes = prepared.image.shape[1]
    side_rows, side_columns = (int(n) for n in prepared.image.shape[2:])
    overlap = min(inputs.size - 1, math.ceil(options.find_overlap_mm / inputs.pixel_mm))
    voting = options.find_voting or model.settings.find_voting
    prompts = [find_kinds(k) for k in options.find_prompts or model.settings.find_prompts]
    all_planes = prepared.image.transpose(0, 1)  # (P, 2, H, W)
    context = inputs.context_planes(prepared.geometry.slice_spacing)
    starts = [
        (row, column)
        for row in tile_starts(side_rows, inputs.size, overlap)
        for column in tile_starts(side_columns, inputs.size, overlap)
    ]

    def jobs() -> Iterator[_FindJob]:
        for tile, (row, column) in enumerate(starts):
            tile_planes = all_planes[:, :, row : row + inputs.size, column : column + inputs.size]
            windows = with_context(tile_planes, context)  # (P, 2 or 6, size, size)
            for prompt, kinds in enumerate(prompts):
                for shift, (rows, columns) in enumerate(voting.shifts):
                    shifted = shift_planes(windows, rows, columns)
                    yield _FindJob(tile, prompt, shift, shifted, kinds)

    answers, malformed = _find_answers(model, jobs(), inputs)
    total = planes * len(starts) * len(prompts) * len(voting.shifts)
    per_tile: list[list[list[FoundFinding]]] = []
    for tile, (row, column) in enumerate(starts):
        found_on: list[list[FoundFinding]] = [[] for _ in range(planes)]
        for prompt in range(len(prompts)):
            passes = [
                [unshift_findings(found, rows, columns) for found in answers[tile, prompt, shift]]
                for shift, (rows, columns) in enumerate(voting.shifts)
            ]
            voted = passes[0]
            if not voting.single:
                voted = [
                    vote_boxes(per_plane, voting.votes, keep_unaliased=voting.keep_unaliased)
                    for per_plane in zip(*passes, strict=True)
                ]
            for found, more in zip(found_on, voted, strict=True):
                found.extend(more)
        per_tile.append([offset_findings(found, row, column) for found in found_on])
    merged = [merge_tiles(tiles) for tiles in zip(*per_tile, strict=True)]
    warnings: tuple[str, ...] = ()
    if malformed:
        warnings = (
            f"{malformed} of {total} find answers were malformed; their planes were not "
            "searched in those passes",
        )
        logger.warning("%d of %d find answers were malformed", malformed, total)
    detections = plane_detections(merged, list(range(planes)), prepared.geometry)
    spacing = prepared.geometry.slice_spacing
    grouped = group_detections(detections, spacing, options.grouping)
    return dataclasses.replace(
        state.with_candidates([Candidate(g) for g in grouped], *warnings),
        examined_planes=planes,
        plane_spacing_mm=spacing,
    )


def _point_answers(
    model: StageModel, volume: Volume, candidates: Sequence[Candidate]
) -> list[Answer]:
    inputs = model.settings.measure_inputs
    examples = [point_example(volume, c.found.center_lps_mm, inputs) for c in candidates]
    return _batched(
        model, examples, MAX_POINT_TOKENS, model.options.measure_batch, opening=NONE_WORD
    )


def verify(model: StageModel, state: StudyState) -> StudyState:
    """Keep the candidates the point task names at their centres, with its kind and presence
    (module doc)."""
    if not state.candidates:
        return state
    kept, malformed = [], 0
    for candidate, answer in zip(
        state.candidates, _point_answers(model, state.volume, state.candidates), strict=True
    ):
        parsed = parse_point(answer.text)
        if not parsed.success:
            malformed += 1
        elif parsed.kind is not None:
            presence = None if answer.opening is None else 1.0 - answer.opening
            kept.append(
                dataclasses.replace(
                    candidate,
                    found=dataclasses.replace(candidate.found, kind=parsed.kind),
                    presence=presence,
                )
            )
    warnings: tuple[str, ...] = ()
    if malformed:
        warnings = (
            f"{malformed} of {len(state.candidates)} point answers were malformed; those "
            "candidates were not confirmed and are not reported",
        )
    logger.debug("verification kept %d of %d candidates", len(kept), len(state.candidates))
    return state.with_candidates(kept, *warnings)


def segment_to_lps(crop: object, frame: float, segment: Segment) -> Segment3:
    """Crop pixel edges (row, column) -> LPS mm end points (pixel centres are edges - 0.5)."""
    (r0, c0), (r1, c1) = segment
    a, b = crop.pixel_to_lps(  # type: ignore[attr-defined]
        [(frame, r0 - 0.5, c0 - 0.5), (frame, r1 - 0.5, c1 - 0.5)]
    )
    return (float(a[0]), float(a[1]), float(a[2])), (float(b[0]), float(b[1]), float(b[2]))


def drawn_segments(crop: Crop, text: str, kind: FindingKind | str) -> tuple[Segment3, ...] | None:
    """An axes answer about ``crop`` as LPS segments (its centre frame), None where malformed."""
    parsed = parse_axes(text, kind)
    if not parsed.success:
        return None
    frame = (crop.image.shape[0] - 1) / 2
    return tuple(segment_to_lps(crop, frame, s) for s in parsed.segments)


def source_slice(volume: Volume, center: Sequence[float]) -> int:
    """The source slice nearest to ``center`` (for the SOP instance a finding refers to),
    clamped into the volume."""
    index = volume.geometry.lps_to_index(np.asarray(center, dtype=np.float64))
    return int(min(volume.shape[0] - 1, max(0, round(float(index[0])))))


def _draw_axes(
    model: StageModel, volume: Volume, candidates: Sequence[Candidate]
) -> tuple[list[tuple[Segment3, ...] | None], int]:
    """Each candidate's axes in LPS from the axes task at its centre (None where malformed),
    and how many answers were malformed."""
    inputs = model.settings.measure_inputs
    examples = [
        axes_example(volume, c.found.center_lps_mm, c.found.kind, inputs) for c in candidates
    ]
    present = [e for e in examples if e is not None]
    assert len(present) == len(examples)  # without truth an axes example is always made
    texts = _batched_texts(model, present, MAX_AXES_TOKENS, model.options.measure_batch)
    out: list[tuple[Segment3, ...] | None] = []
    malformed = 0
    for example, text in zip(present, texts, strict=True):
        drawn = drawn_segments(example.crop, text, example.kind)
        malformed += drawn is None
        out.append(drawn)
    return out, malformed


def recentre(model: StageModel, state: StudyState) -> StudyState:
    """Move each candidate's axial centre to the middle of the first segment (long axis or
    diameter) of its axes answer; z stays; a malformed answer keeps the centre."""
    if not state.candidates:
        return state
    drawn, malformed = _draw_axes(model, state.volume, state.candidates)
    out = []
    for candidate, segments in zip(state.candidates, drawn, strict=True):
        if not segments:
            out.append(candidate)
            continue
        a, b = segments[0]
        z = candidate.found.center_lps_mm[2]
        out.append(candidate.moved(((a[0] + b[0]) / 2, (a[1] + b[1]) / 2, z)))
    warnings: tuple[str, ...] = ()
    if malformed:
        warnings = (
            f"{malformed} of {len(drawn)} axes answers were malformed (re-centring; centres kept)",
        )
    return state.with_candidates(out, *warnings)


def merge(model: StageModel, state: StudyState) -> StudyState:
    """Candidates of one kind split along z become one (``grouping.merge_duplicates``), as
    sure as the surest of them. It runs before ``measure``: candidates come out unmeasured."""
    candidates = state.candidates
    merged = merge_groups(
        [c.found for c in candidates], state.plane_spacing_mm or 1.0, model.options.grouping
    )
    return state.with_candidates(
        [Candidate(g, presence=_strongest(candidates[i].presence for i in m)) for g, m in merged]
    )


def _strongest(presences: Iterable[float | None]) -> float | None:
    """The presence of candidates merged into one: the surest of them (None: none verified)."""
    known = [p for p in presences if p is not None]
    return max(known) if known else None


def measure(model: StageModel, state: StudyState) -> StudyState:
    """Measure every candidate, a lesion on its largest plane (module doc); values not yet
    calibrated."""
    if not state.candidates:
        return state
    volume = state.volume
    inputs = model.settings.measure_inputs
    spacing = state.plane_spacing_mm or volume.geometry.slice_spacing
    points = [
        search_points(
            volume, c.found.center_lps_mm, c.found.kind, model.options.lesion_planes, spacing
        )
        for c in state.candidates
    ]
    examples: list[MeasureExample] = [
        measure_example(volume, point, c.found.kind, inputs)
        for c, candidates in zip(state.candidates, points, strict=True)
        for point in candidates
    ]
    generated = _batched(model, examples, MAX_ANSWER_TOKENS, model.options.measure_batch)
    answers = [
        outcome_for(e.kind, a.text, None, parse_measure(a.text, e.kind), a.confidence)
        for e, a in zip(examples, generated, strict=True)
    ]
    failed = sum(not o.parsed for o in answers)
    out, start = [], 0
    for candidate, candidates in zip(state.candidates, points, strict=True):
        chunk = answers[start : start + len(candidates)]
        start += len(candidates)
        centre = candidate.found.center_lps_mm
        best = best_plane(chunk, [c[2] - centre[2] for c in candidates])
        out.append(dataclasses.replace(candidate.moved(candidates[best]), outcome=chunk[best]))
    warnings: tuple[str, ...] = ()
    if failed:
        warnings = (f"{failed} of {len(answers)} measure answers were malformed (not measurable)",)
    return state.with_candidates(out, *warnings)


def axes(model: StageModel, state: StudyState) -> StudyState:
    """The axes the model draws at each measured centre, for the reviewer."""
    if not state.candidates:
        return state
    drawn, malformed = _draw_axes(model, state.volume, state.candidates)
    out = [dataclasses.replace(c, axes=a) for c, a in zip(state.candidates, drawn, strict=True)]
    warnings: tuple[str, ...] = ()
    if malformed:
        warnings = (f"{malformed} of {len(drawn)} axes answers were malformed",)
    return state.with_candidates(out, *warnings)


def dedupe(model: StageModel, state: StudyState) -> StudyState:
    """One report per object (``model.measurer.infer.dedupe``)."""
    keep = one_report_per_object(
        [c.found for c in state.candidates],
        [c.outcome for c in state.candidates],
        [c.axes for c in state.candidates],
    )
    return state.with_candidates([state.candidates[i] for i in keep])


def calibrate(model: StageModel, state: StudyState) -> StudyState:
    """What the checkpoint's calibration knows: a finding below its detection operating point
    (``DetectionThreshold``) is not reported; a value whose decode is weaker than its
    ``DecodeCheck`` becomes "not measurable" with the reason (``inference.calibrated``), the
    rest get calibrated ranges."""
    settings = model.settings
    calibration, check, detection = settings.calibration, settings.decode_check, settings.detection
    if calibration is None and check is None and detection is None:
        return state
    out, weak = [], 0
    for candidate in state.candidates:
        if detection is not None and not detection.accepts(candidate.presence):
            continue
        outcome = candidate.outcome
        if outcome is not None:
            weak += outcome.parsed and check is not None and not check.accepts(outcome.confidence)
            outcome = calibrated(outcome, calibration, check)
        out.append(dataclasses.replace(candidate, outcome=outcome))
    warnings: tuple[str, ...] = ()
    if weak:
        warnings = (
            f"{weak} of {len(out)} findings' numbers decoded with low confidence (not measurable)",
        )
        logger.warning("%s", warnings[0])
    return state.with_candidates(out, *warnings)


FIND = InferenceStage("find", find)
VERIFY = InferenceStage("verify", verify)
RECENTRE = InferenceStage("recentre", recentre)
MERGE = InferenceStage("merge", merge)
MEASURE = InferenceStage("measure", measure)
AXES = InferenceStage("axes", axes)
DEDUPE = InferenceStage("dedupe", dedupe)
CALIBRATE = InferenceStage("calibrate", calibrate)

ALL_STAGES: tuple[InferenceStage, ...] = (
    FIND,
    VERIFY,
    RECENTRE,
    MERGE,
    MEASURE,
    AXES,
    DEDUPE,
    CALIBRATE,
)
"""Every stage, in the order they run."""


def default_stages(settings: MeasurerSettings) -> tuple[InferenceStage, ...]:
    """The stages a checkpoint supports: ``verify`` where it was trained to confirm candidates
    with the point task, ``recentre`` and ``axes`` where it knows the axes task."""
    leave_out = set()
    if not (settings.verify_candidates and "point" in settings.tasks):
        leave_out.add("verify")
    if "axes" not in settings.tasks:
        leave_out |= {"recentre", "axes"}
    return tuple(s for s in ALL_STAGES if s.name not in leave_out)


def stages_named(names: Sequence[str]) -> tuple[InferenceStage, ...]:
    """The stages of ``names``, in the given order (``ValueError`` naming an unknown one)."""
    known = {s.name: s for s in ALL_STAGES}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; known: {', '.join(known)}")
    return tuple(known[n] for n in names)
