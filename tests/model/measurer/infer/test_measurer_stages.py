"""Inference as named stages (model.measurer.infer.stages): the list, the trace hook, what each
stage does with the model's answers, and that no image rule adds or changes a finding.

The model's answers are fixed here (:class:`FixedAnswers`): these tests are about the logic
around them, not about a model; the real checkpoints run in test_measurer_pipeline.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from ingestion.geometry import Geometry
from ingestion.volume import Volume
from model.measurer.calibrate.calibration import DecodeCheck, DetectionThreshold, fit_calibration
from model.measurer.checkpoint.settings import MeasurerSettings, NumericMode
from model.measurer.infer.dedupe import one_report_per_object
from model.measurer.infer.grouping import GroupedFinding
from model.measurer.infer.inference import Answer, MeasureOutcome
from model.measurer.infer.stages import (
    ALL_STAGES,
    calibrate,
    default_stages,
    find,
    measure,
    merge,
    recentre,
    stages_named,
    verify,
)
from model.measurer.infer.state import (
    Candidate,
    InferenceOptions,
    StudyState,
    TraceEvent,
    run_stages,
)
from model.measurer.inputs.find import FindInputs
from model.measurer.inputs.tiles import merge_tiles, tile_starts
from model.measurer.inputs.voting import FindVoting
from model.measurer.results import FindingKind, Measurement, MeasurementName
from model.measurer.tasks.text import FoundFinding

LESION, VESSEL = FindingKind.LESION, FindingKind.VESSEL
FIND_INPUTS = FindInputs(pixel_mm=1.0, size=56)


@dataclass
class FixedAnswers:
    """A ``StageModel`` whose answers come from ``answer(prompt, index)``; records prompts."""

    answer: Callable[[str, int], str | Answer]
    settings: MeasurerSettings = field(
        default_factory=lambda: MeasurerSettings(
            "fixed",
            "0",
            NumericMode.STANDARD,
            find_inputs=FIND_INPUTS,
            tasks=("find", "measure", "point", "axes"),
            verify_candidates=True,
        )
    )
    options: InferenceOptions = field(default_factory=InferenceOptions)
    numeric_tokens: bool = False
    prompts: list[str] = field(default_factory=list)
    images: list[torch.Tensor] = field(default_factory=list)  # find images, in prompt order
    openings: list[str | None] = field(default_factory=list)  # the opening asked, per batch
    batches: list[tuple[int, str | None]] = field(default_factory=list)  # (size, form) per batch

    @property
    def prompts_answered(self) -> int:
        return len(self.prompts)

    def generate(
        self,
        examples: Sequence[object],
        max_new_tokens: int,
        opening: str | None = None,
        form: str | None = None,
    ) -> list[Answer]:
        self.openings.append(opening)
        self.batches.append((len(examples), form))
        out = []
        for example in examples:
            prompt = str(example.prompt)  # type: ignore[attr-defined]
            if prompt.startswith("find "):
                self.images.append(example.images)  # type: ignore[attr-defined]
            answer = self.answer(prompt, len(self.prompts))
            out.append(answer if isinstance(answer, Answer) else Answer(answer))
            self.prompts.append(prompt)
        return out


def _volume(side: int = 64, pixel: float = 1.0, slices: int = 8, value: float = 40.0) -> Volume:
    geometry = Geometry(
        (0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (2.0, pixel, pixel)
    )
    return Volume.in_memory(np.full((slices, side, side), value, np.float32), geometry)


def _outcome(*values: float) -> MeasureOutcome:
    names = (
        (MeasurementName.LONG_AXIS, MeasurementName.SHORT_AXIS)
        if len(values) == 2
        else (MeasurementName.DIAMETER,)
    )
    return MeasureOutcome(
        tuple(Measurement(n, v) for n, v in zip(names, values, strict=True)), "", True
    )


def test_the_stage_list_is_the_checkpoint_s_and_stages_are_left_out_by_leaving_them_out() -> None:
    model = FixedAnswers(lambda prompt, i: "none")
    assert [s.name for s in default_stages(model.settings)] == [s.name for s in ALL_STAGES]
    no_axes = dataclasses.replace(model.settings, tasks=("find", "measure", "point"))
    assert "recentre" not in [s.name for s in default_stages(no_axes)]
    assert "axes" not in [s.name for s in default_stages(no_axes)]
    unverified = dataclasses.replace(model.settings, verify_candidates=False)
    assert "verify" not in [s.name for s in default_stages(unverified)]
    assert [s.name for s in stages_named(["find", "measure"])] == ["find", "measure"]
    with pytest.raises(ValueError, match=r"unknown stage.*'proposals'"):
        stages_named(["find", "proposals"])


def test_the_trace_hook_sees_every_stage_in_order_with_its_state() -> None:
    answers = {
        "find": "lesion box [20, 20, 30, 30] ; end",
        "point": "lesion 10 x 8 mm",
    }

    def answer(prompt: str, index: int) -> str:
        if prompt.startswith("find lesions"):
            return answers["find"]
        if prompt.startswith("find the axis"):
            return "bad"
        return answers["point"]

    model = FixedAnswers(answer)
    events: list[TraceEvent] = []
    stages = stages_named(["find", "verify", "measure", "calibrate"])
    state = run_stages(model, StudyState(_volume()), stages, [events.append])
    assert [e.stage for e in events] == ["find", "verify", "measure", "calibrate"]
    assert all(e.seconds >= 0 for e in events)
    assert sum(e.prompts for e in events) == len(model.prompts) > 0
    assert events[-1].prompts == 0  # calibrate asks the model nothing
    assert events[-1].state is state
    found = events[0].state.candidates
    assert len(found) == 1 and found[0].found.kind is LESION and found[0].outcome is None
    assert state.candidates[0].outcome is not None


def test_find_searches_the_whole_field_in_overlapping_tiles() -> None:
    """A 200 mm field and 56 mm tiles: every plane is asked once per tile, and a box in the
    last tile lands at that tile's place in patient space, not at the middle."""
    volume = _volume(side=200, slices=4)
    options = InferenceOptions(
        find_voting=FindVoting(((0, 0),), votes=1), find_edge_mm=0.0, find_overlap_mm=20.0
    )
    calls: list[int] = []

    def answer(prompt: str, index: int) -> str:
        calls.append(index)
        return "lesion box [40, 40, 50, 50] ; end"

    model = FixedAnswers(answer, options=options)
    state = find(model, StudyState(volume))
    starts = tile_starts(200, 56, 20)  # the field is 200 pixels of 1 mm
    assert len(starts) > 1 and starts[0] == 0 and starts[-1] == 200 - 56
    assert len(calls) == state.examined_planes * len(starts) ** 2
    centres = sorted(
        (round(c.found.center_lps_mm[0]), round(c.found.center_lps_mm[1])) for c in state.candidates
    )
    assert len(centres) == len(starts) ** 2  # one candidate per tile: 25 places over the field
    xs = sorted({x for x, _ in centres})
    assert xs[-1] - xs[0] >= 2 * 56  # spread over the field, not one 56 mm crop


def test_find_prompts_of_every_tile_and_pass_share_full_batches() -> None:
    """25 tiles x 2 passes x 4 planes = 200 find prompts go in batches of ``find_batch``,
    whichever tile and pass they come from, each asked in the find answer's form; the answers
    still reach their own tile and pass (one box per tile and pass, none voted away)."""
    volume = _volume(side=200, slices=4)
    options = InferenceOptions(
        find_voting=FindVoting(((0, 0), (14, 0)), votes=1),
        find_edge_mm=0.0,
        find_overlap_mm=20.0,
        find_batch=64,
    )
    model = FixedAnswers(lambda p, i: "lesion box [40, 40, 50, 50] ; end", options=options)
    state = find(model, StudyState(volume))
    tiles = len(tile_starts(200, 56, 20)) ** 2
    total = state.examined_planes * tiles * 2
    assert model.batches == [(64, "find")] * (total // 64) + [(total % 64, "find")]
    assert len(state.candidates) == 2 * tiles  # the second pass's box shifted back 14 px


def test_one_kind_find_prompts_keep_only_the_kind_they_ask_for() -> None:
    """With the checkpoint's find prompts (lesions) and (vessels), each plane is asked twice;
    a box of the other kind in an answer is not that prompt's answer and is dropped."""
    volume = _volume(side=56)

    def answer(prompt: str, index: int) -> str:
        lesion, vessel = "lesion box [10, 10, 20, 20]", "vessel box [36, 36, 44, 44]"
        if prompt == "find lesions in the image":
            return f"{lesion} ; {vessel} ; end"  # the vessel box is not kept
        assert prompt == "find vessels in the image", prompt
        return "vessel box [36, 36, 44, 44] ; lesion box [40, 10, 50, 20] ; end"

    model = FixedAnswers(answer, options=InferenceOptions(find_voting=FindVoting(((0, 0),), 1)))
    model.settings = dataclasses.replace(model.settings, find_prompts=(("lesion",), ("vessel",)))
    state = find(model, StudyState(volume))
    assert len(model.prompts) == 2 * state.examined_planes
    found = sorted((c.found.kind.value, c.found.center_lps_mm[1]) for c in state.candidates)
    assert [kind for kind, _ in found] == ["lesion", "vessel"]
    assert [y for _, y in found] == pytest.approx([14.5, 39.5], abs=1.0)  # box centres
    both = FixedAnswers(
        answer,
        options=InferenceOptions(find_voting=FindVoting(((0, 0),), 1), find_prompts=(("lesion",),)),
    )
    only_lesions = find(both, StudyState(volume))
    assert {c.found.kind for c in only_lesions.candidates} == {LESION}
    assert len(both.prompts) == only_lesions.examined_planes
    with pytest.raises(ValueError, match="unknown finding kind 'tumour'"):
        InferenceOptions(find_prompts=(("tumour",),))


def test_a_checkpoint_with_3d_context_sees_each_plane_with_its_neighbours() -> None:
    """context_mm 4 on planes examined 2 mm apart: frames 2 and 3 of each find image are the
    planes two below and two above (clamped at the ends)."""
    voxels = np.stack([np.full((56, 56), -30.0 + 20.0 * k, np.float32) for k in range(8)])
    geometry = Geometry(
        (0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (2.0, 1.0, 1.0)
    )
    model = FixedAnswers(lambda p, i: "none", options=InferenceOptions(find_voting=FindVoting()))
    inputs = dataclasses.replace(FIND_INPUTS, context_mm=4.0)
    model.settings = dataclasses.replace(model.settings, find_inputs=inputs)
    state = find(model, StudyState(Volume.in_memory(voxels, geometry)))
    assert state.examined_planes == 8 and len(model.images) == 8
    assert all(image.shape == (4, 3, 56, 56) for image in model.images)
    soft = [float(image[0, 0, 28, 28]) for image in model.images]  # frame 0: the plane
    assert soft == sorted(soft) and len(set(soft)) == 8  # one HU level per plane
    below = [float(image[2, 0, 28, 28]) for image in model.images]
    above = [float(image[3, 0, 28, 28]) for image in model.images]
    assert below == [soft[max(0, k - 2)] for k in range(8)]
    assert above == [soft[min(7, k + 2)] for k in range(8)]


def test_shifted_find_passes_are_shifted_back_and_voted() -> None:
    """Two passes, the second with the content 14 pixels down, both must agree: a model that
    follows the content gives one lesion on every plane; boxes at the same pixels in both
    passes disagree once shifted back: no candidate."""
    n_planes = 8  # 8 slices 2 mm apart: every one is examined
    for follows, expected in ((True, 1), (False, 0)):
        volume = _volume(side=56)

        def answer(prompt: str, index: int, follows: bool = follows) -> str:
            down = 14 if follows and index >= n_planes else 0
            return f"lesion box [{20 + down}, 20, {30 + down}, 30] ; end"

        options = InferenceOptions(find_voting=FindVoting(((0, 0), (14, 0)), votes=2))
        state = find(FixedAnswers(answer, options=options), StudyState(volume))
        assert state.examined_planes == n_planes
        assert len(state.candidates) == expected


def test_tiles_cover_the_field_and_a_finding_cut_by_a_tile_edge_is_reported_once() -> None:
    for side, tile, overlap in ((56, 56, 10), (300, 56, 20), (504, 280, 64)):
        starts = tile_starts(side, tile, overlap)
        assert starts[0] == 0 and starts[-1] + tile == side
        assert all(b - a <= tile - overlap for a, b in itertools.pairwise(starts))
    whole = FoundFinding(LESION, 0, (10.0, 50.0, 30.0, 80.0))
    cut = FoundFinding(LESION, 0, (10.0, 50.0, 30.0, 56.0))  # the same lesion, cut by tile 0
    other = FoundFinding(LESION, 0, (100.0, 100.0, 110.0, 110.0))
    assert merge_tiles([[cut, other], [whole]]) == [whole, other]
    vessel = FoundFinding(VESSEL, 0, (10.0, 50.0, 30.0, 56.0))  # another kind: kept
    assert len(merge_tiles([[vessel], [whole]])) == 2


def test_verification_keeps_only_what_the_point_task_names() -> None:
    """'none' drops a candidate, a kind replaces the find step's, a malformed answer is no
    confirmation: dropped and counted."""
    candidates = tuple(
        Candidate(GroupedFinding(kind, (x, 0.0, 4.0), (0, 1), 20.0))
        for kind, x in ((LESION, 10.0), (LESION, 20.0), (VESSEL, 30.0))
    )
    replies = iter(["none", "vessel 21 mm", "lesion 3 x"])
    model = FixedAnswers(lambda prompt, i: next(replies))
    state = verify(model, StudyState(_volume(), candidates))
    assert [(c.found.kind, c.found.center_lps_mm[0]) for c in state.candidates] == [(VESSEL, 20.0)]
    assert state.warnings == (
        "1 of 3 point answers were malformed; those candidates were not confirmed and are not "
        "reported",
    )


def test_verification_keeps_the_model_s_presence_of_each_confirmed_candidate() -> None:
    """The verify stage asks how probable "none" is; a confirmed candidate keeps 1 - that."""
    candidates = tuple(
        Candidate(GroupedFinding(LESION, (x, 0.0, 4.0), (0, 1), 20.0)) for x in (10.0, 20.0, 30.0)
    )
    replies = iter(
        [
            Answer("lesion 12 x 8 mm", opening=0.25),
            Answer("none", opening=0.75),
            Answer("vessel 9 mm"),
        ]
    )
    model = FixedAnswers(lambda prompt, i: next(replies))
    state = verify(model, StudyState(_volume(), candidates))
    assert set(model.openings) == {"none"}
    assert [(c.found.kind, c.presence) for c in state.candidates] == [
        (LESION, 0.75),
        (VESSEL, None),  # no probability given: no presence
    ]
    assert all(c.presence is None for c in candidates)  # before verify


def test_the_calibrate_stage_leaves_out_findings_below_the_detection_operating_point() -> None:
    threshold = DetectionThreshold(0.6, 1.0, 0.9, 0.5, 20)
    found = GroupedFinding(LESION, (0.0, 0.0, 0.0), (0,), 20.0)
    candidates = tuple(
        Candidate(found, _outcome(20.0, 10.0), presence=p) for p in (0.95, 0.59, 0.6, None)
    )
    model = FixedAnswers(lambda p, i: "none")
    state = StudyState(_volume(), candidates)
    assert calibrate(model, state).candidates == candidates  # no operating point: all reported
    model.settings = dataclasses.replace(model.settings, detection=threshold)
    kept = calibrate(model, state).candidates
    assert [c.presence for c in kept] == [0.95, 0.6, None]  # not verified: not judged
    assert threshold.accepts(0.6) and not threshold.accepts(0.5999) and threshold.accepts(None)


def test_candidates_merged_into_one_are_as_sure_as_the_surest() -> None:
    big = GroupedFinding(LESION, (0.0, 0.0, 0.0), (3, 4, 5), 40.0)
    split = GroupedFinding(LESION, (2.0, 1.0, 12.0), (9, 10), 30.0)  # the same lesion
    apart = GroupedFinding(LESION, (60.0, 0.0, 0.0), (4,), 20.0)
    state = StudyState(
        _volume(),
        (Candidate(big, presence=0.6), Candidate(split, presence=0.9), Candidate(apart)),
        8,
        2.0,
    )
    merged = merge(FixedAnswers(lambda p, i: "none"), state).candidates
    assert [(c.found.center_lps_mm, c.presence) for c in merged] == [
        ((0.0, 0.0, 0.0), 0.9),
        ((60.0, 0.0, 0.0), None),
    ]


def test_recentring_moves_a_candidate_to_the_middle_of_its_long_axis() -> None:
    """The axes answer in crop pixels (the crop is centred on the candidate): the middle of
    the long axis becomes the axial centre, z stays; a malformed answer keeps the centre."""
    candidates = (
        Candidate(GroupedFinding(LESION, (30.0, 30.0, 4.0), (0, 1), 20.0)),
        Candidate(GroupedFinding(LESION, (10.0, 10.0, 4.0), (0, 1), 20.0)),
    )
    model = FixedAnswers(lambda p, i: "bad")
    size = model.settings.measure_inputs.size
    pixel = model.settings.measure_inputs.pixel_mm
    middle = size / 2  # pixel edges: the crop's centre
    shift = 4.0 / pixel  # 4 mm to +x (columns)
    text = (
        f"long axis [{middle}, {middle + shift - 5}, {middle}, {middle + shift + 5}] ; "
        f"short axis [{middle - 3}, {middle + shift}, {middle + 3}, {middle + shift}] ; end"
    )
    replies = iter([text, "malformed"])
    model = FixedAnswers(lambda p, i: next(replies))
    state = recentre(model, StudyState(_volume(), candidates))
    (x0, y0, z0), (x1, y1, z1) = (c.found.center_lps_mm for c in state.candidates)
    assert (x0, y0, z0) == pytest.approx((34.0, 30.0, 4.0), abs=0.6)
    assert (x1, y1, z1) == (10.0, 10.0, 4.0)
    assert state.warnings == ("1 of 2 axes answers were malformed (re-centring; centres kept)",)


def test_a_malformed_measure_answer_is_not_measurable_never_a_number() -> None:
    """A lesion needs two numbers: one is malformed, on every plane searched."""
    candidates = (Candidate(GroupedFinding(LESION, (30.0, 30.0, 4.0), (0, 1), 20.0)),)
    model = FixedAnswers(lambda p, i: "12 x mm")
    state = measure(model, StudyState(_volume(), candidates, 8, 2.0))
    (measured,) = state.candidates
    assert measured.outcome is not None and not measured.outcome.parsed
    for value in measured.outcome.measurements:
        assert value.value_mm is None and value.reason and "malformed" in value.reason
    n = len(model.prompts)
    assert n > 1 and state.warnings == (
        f"{n} of {n} measure answers were malformed (not measurable)",
    )


def test_the_calibrate_stage_puts_ranges_around_values() -> None:
    rng = np.random.default_rng(7)
    pairs = [
        (str(name), float(v), float(v + e))
        for name in MeasurementName
        for v, e in zip(rng.uniform(5, 50, 30), rng.normal(0, 1, 30), strict=True)
    ]
    calibration = fit_calibration(pairs, 0.9)
    model = FixedAnswers(lambda p, i: "none")
    model.settings = dataclasses.replace(model.settings, calibration=calibration)
    found = GroupedFinding(LESION, (0.0, 0.0, 0.0), (0,), 20.0)
    state = StudyState(_volume(), (Candidate(found, _outcome(20.0, 10.0)),))
    (before,) = state.candidates
    assert before.outcome is not None and before.outcome.measurements[0].range_mm is None
    (after,) = calibrate(model, state).candidates
    assert after.outcome is not None
    for m in after.outcome.measurements:
        assert m.value_mm is not None and m.range_mm == calibration.interval(m.name, m.value_mm)
        assert m.range_mm is not None
        assert m.range_mm[0] < m.value_mm < m.range_mm[1] and m.coverage == pytest.approx(0.9)


def test_a_low_confidence_decode_is_not_measurable_with_the_reason_never_a_number() -> None:
    """The measure stage keeps each answer's weakest decode confidence; the calibrate stage
    refuses the values of an answer below the checkpoint's DecodeCheck and ranges the rest."""
    candidates = (
        Candidate(GroupedFinding(LESION, (20.0, 20.0, 4.0), (0, 1), 20.0)),
        Candidate(GroupedFinding(LESION, (44.0, 44.0, 4.0), (0, 1), 20.0)),
    )
    model = FixedAnswers(lambda p, i: Answer("20 x 10 mm", 0.9 if i == 0 else 0.2))
    model.options = dataclasses.replace(model.options, lesion_planes=0)
    measured = measure(model, StudyState(_volume(), candidates, 8, 2.0))
    assert len(model.prompts) == 2
    assert [c.outcome.confidence for c in measured.candidates if c.outcome] == [0.9, 0.2]
    rng = np.random.default_rng(3)
    pairs = [
        (str(name), float(v), float(v + e))
        for name in MeasurementName
        for v, e in zip(rng.uniform(5, 50, 30), rng.normal(0, 1, 30), strict=True)
    ]
    model.settings = dataclasses.replace(
        model.settings,
        calibration=fit_calibration(pairs, 0.9),
        decode_check=DecodeCheck(min_confidence=0.5, quantile=0.01, n=400),
    )
    checked = calibrate(model, measured)
    sure, weak = (c.outcome for c in checked.candidates)
    assert sure is not None and weak is not None
    assert [m.value_mm for m in sure.measurements] == [20.0, 10.0]
    assert all(m.range_mm is not None for m in sure.measurements)
    for m in weak.measurements:
        assert m.value_mm is None and m.range_mm is None
        assert m.reason is not None and "low-confidence numeric decode" in m.reason
        assert "0.200 is below 0.500" in m.reason
    assert checked.warnings[-1] == (
        "1 of 2 findings' numbers decoded with low confidence (not measurable)"
    )
    # an answer whose head has no confidence measure (None) is not judged
    unknown = [
        dataclasses.replace(c, outcome=dataclasses.replace(c.outcome, confidence=None))
        for c in measured.candidates
        if c.outcome is not None
    ]
    for candidate in calibrate(model, StudyState(_volume(), tuple(unknown))).candidates:
        assert candidate.outcome is not None
        assert [m.value_mm for m in candidate.outcome.measurements] == [20.0, 10.0]


def test_no_image_rule_adds_or_changes_a_finding() -> None:
    """Image facts the phantom rules used (a contrast-filled tube through every slice, a bright
    blob, a centre in air) make no finding and change no kind: only the model's answers do."""
    voxels = np.full((8, 56, 56), 40.0, np.float32)
    voxels[:, 10:18, 10:18] = 250.0  # a "contrast-filled tube" through the study
    voxels[3:5, 35:45, 35:45] = 120.0  # a bright blob
    voxels[:, :, 50:] = -1000.0  # air
    volume = dataclasses.replace(_volume(side=56), voxels=voxels)
    model = FixedAnswers(lambda p, i: "none")
    state = run_stages(model, StudyState(volume), default_stages(model.settings))
    assert state.candidates == () and state.warnings == ()

    def answer(prompt: str, index: int) -> str:
        if prompt.startswith("find lesions"):
            return "lesion box [10, 50, 20, 56] ; end"  # centred in air
        if prompt.startswith("find the axis"):
            return "bad"
        return "lesion 8 x 6 mm"

    state = run_stages(
        FixedAnswers(answer), StudyState(volume), stages_named(["find", "verify", "measure"])
    )
    assert [c.found.kind for c in state.candidates] == [LESION]  # kept: the model said so


def test_one_report_per_object() -> None:
    vessel = GroupedFinding(VESSEL, (0.0, 0.0, 0.0), tuple(range(10)), 25.0)
    piece = GroupedFinding(VESSEL, (5.0, 0.0, 40.0), (12, 13), 25.0)  # within the radius
    apart = GroupedFinding(VESSEL, (40.0, 0.0, 0.0), tuple(range(10)), 25.0)
    big = GroupedFinding(LESION, (100.0, 0.0, 0.0), (1, 2, 3), 30.0)
    inside = GroupedFinding(LESION, (108.0, 0.0, 2.0), (2,), 10.0)
    far_in_z = GroupedFinding(LESION, (108.0, 0.0, 20.0), (9,), 10.0)
    in_vessel = GroupedFinding(LESION, (2.0, 0.0, 0.0), (3,), 10.0)
    findings = [vessel, piece, apart, big, inside, far_in_z, in_vessel]
    outcomes = [
        _outcome(25.0),
        _outcome(24.0),
        _outcome(25.0),
        _outcome(30.0, 20.0),
        _outcome(10.0, 8.0),
        _outcome(10.0, 8.0),
        _outcome(10.0, 8.0),
    ]
    kept = one_report_per_object(findings, outcomes, [None] * len(findings))
    # the piece goes; the lesion inside the vessel stays (no HU says which is right)
    assert kept == [0, 2, 3, 5, 6]
    with pytest.raises(ValueError, match="must align"):
        one_report_per_object(findings, outcomes[:2], [None] * len(findings))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("find_plane_mm", 0.0),
        ("find_overlap_mm", float("nan")),
        ("find_edge_mm", -1.0),
        ("find_batch", 0),
        ("lesion_planes", -1),
    ],
)
def test_inference_options_refuse_unusable_values(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        InferenceOptions(**{field: value})  # type: ignore[arg-type]
