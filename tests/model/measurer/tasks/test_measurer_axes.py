"""The axes task (model.measurer.tasks.axes): texts round trip, labels land on the true end points,
training and inference carry it."""

from __future__ import annotations

import numpy as np
import pytest

from ingestion.phantoms import generate_phantom
from model.measurer.inputs.data import MeasureInputs, axes_example, finding_patches, phantom_volume
from model.measurer.results import FindingKind
from model.measurer.tasks.axes import (
    ParsedAxes,
    axes_answer,
    axes_prompt,
    canonical_segment,
    finding_axes,
    parse_axes,
    truth_segments,
)
from model.measurer.tasks.tokenizer import build_tokenizer

INPUTS = MeasureInputs(pixel_mm=0.75, size=112, window=(40.0, 160.0), jitter_mm=0.0)
LESION, VESSEL = FindingKind.LESION, FindingKind.VESSEL


def test_texts_round_trip_in_canonical_order() -> None:
    segments = (((40.0, 80.5), (60.0, 20.0)), ((30.0, 50.0), (70.0, 50.0)))
    text = axes_answer(LESION, segments)
    assert text == "long axis [60, 20, 40, 80.5] ; short axis [30, 50, 70, 50] ; end"
    parsed = parse_axes(text, LESION)
    assert parsed == ParsedAxes(tuple(canonical_segment(s) for s in segments), True)
    vessel = axes_answer(VESSEL, [((56.0, 30.0), (56.0, 82.0))])
    assert vessel == "diameter [56, 30, 56, 82] ; end"
    assert parse_axes(vessel, "vessel").success
    assert axes_prompt(LESION) == "find the axis of the lesion"
    tokenizer = build_tokenizer()
    assert "[UNK]" not in tokenizer.tokenize(text + " " + vessel + " " + axes_prompt(VESSEL))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("long axis [1, 2, 3, 4] ; end", "found 1 axes, expected 2"),
        ("short axis [1, 2, 3, 4] ; long axis [1, 2, 3, 4] ; end", "expected 'long axis'"),
        ("long axis [1, 2, 3] ; short axis [1, 2, 3, 4] ; end", "long axis:"),
        ("long axis [1, 2, 3, 4] ; short axis [1, 2, 3, 4]", "no 'end'"),
    ],
)
def test_malformed_answers_are_reported(text: str, reason: str) -> None:
    parsed = parse_axes(text, LESION)
    assert not parsed.success and reason in (parsed.reason or "")


def test_writers_refuse_what_cannot_be_written() -> None:
    with pytest.raises(ValueError, match="has 1 axes"):
        axes_answer(VESSEL, [((1.0, 2.0), (3.0, 4.0))] * 2)
    with pytest.raises(ValueError, match="finite pixels"):
        axes_answer(VESSEL, [((-1.0, 2.0), (3.0, 4.0))])


def test_truth_segments_are_the_ellipse_axes() -> None:
    (long_axis, short_axis) = truth_segments(
        "lesion", (10.0, 20.0, 5.0), long_axis_mm=30.0, short_axis_mm=10.0, rotation_deg=90.0
    )
    np.testing.assert_allclose(long_axis[0], (10.0, 5.0, 5.0), atol=1e-9)
    np.testing.assert_allclose(long_axis[1], (10.0, 35.0, 5.0), atol=1e-9)
    np.testing.assert_allclose(short_axis[0], (15.0, 20.0, 5.0), atol=1e-9)
    with pytest.raises(ValueError, match="rotation_deg"):
        truth_segments("lesion", (0.0, 0.0, 0.0), long_axis_mm=3.0, short_axis_mm=2.0)


def test_labels_map_back_to_the_true_end_points() -> None:
    phantom = generate_phantom(11)
    volume = phantom_volume(phantom)
    for finding in phantom.findings:
        true = finding_axes(finding)
        example = axes_example(volume, finding.center_lps_mm, finding.kind, INPUTS, true)
        assert example is not None and example.answer is not None
        parsed = parse_axes(example.answer, finding.kind)
        assert parsed.success
        for (a, b), segment in zip(true, parsed.segments, strict=True):
            back = [
                example.crop.pixel_to_lps((0.0, row - 0.5, column - 0.5)) for row, column in segment
            ]
            got = sorted(tuple(np.round(p, 1)) for p in back)
            want = sorted(tuple(np.round(p, 1)) for p in (a, b))
            np.testing.assert_allclose(got, want, atol=0.1)  # the 0.1 px grid: <= 0.075 mm
    patches = finding_patches(volume, phantom.findings, INPUTS)
    drawn = patches[0].axes_example(INPUTS, np.random.default_rng(0))
    assert drawn is not None and drawn.prompt == axes_prompt(patches[0].kind or LESION)


def test_an_axis_leaving_the_crop_gives_no_example() -> None:
    phantom = generate_phantom(11)
    finding = phantom.findings[0]
    far = (finding.center_lps_mm[0] + 200.0, finding.center_lps_mm[1], finding.center_lps_mm[2])
    true = finding_axes(finding)
    assert axes_example(phantom_volume(phantom), far, finding.kind, INPUTS, true) is None


def test_the_pipeline_maps_answered_segments_back_to_patient_space() -> None:
    from model.measurer.infer.stages import segment_to_lps

    phantom = generate_phantom(11)
    volume = phantom_volume(phantom)
    finding = phantom.findings[0]
    true = finding_axes(finding)
    example = axes_example(volume, finding.center_lps_mm, finding.kind, INPUTS, true)
    assert example is not None and example.answer is not None
    parsed = parse_axes(example.answer, finding.kind)
    for (a, b), segment in zip(true, parsed.segments, strict=True):
        got = sorted(segment_to_lps(example.crop, 0.0, segment))
        want = sorted((tuple(a), tuple(b)))
        np.testing.assert_allclose(got, want, atol=0.08)
