"""The measure step at inference: generation, parsing, calibrated ranges, "not measurable"."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from ingestion.phantoms import generate_phantom
from model.backbone import tiny_qwen2_5_vl_kwargs
from model.circle_rope.config import CircleRopeQwen2_5_VLConfig
from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
from model.measurer.calibrate.calibration import fit_calibration
from model.measurer.checkpoint.settings import NumericMode
from model.measurer.checkpoint.weights import build_head
from model.measurer.infer.inference import measure_findings, outcome_for
from model.measurer.inputs.data import MeasureInputs, phantom_examples
from model.measurer.results import NOT_MEASURABLE, FindingKind, MeasurementName
from model.measurer.tasks.text import parse_measure
from model.measurer.tasks.tokenizer import VOCAB, build_tokenizer, special_ids
from model.numeric.hf import NumericLM

INPUTS = MeasureInputs(pixel_mm=1.5, size=56, window=(40.0, 160.0), jitter_mm=0.0)
CALIBRATION = fit_calibration(
    [
        (name, float(v), float(v) + 1.0)
        for name in ("long_axis", "short_axis", "diameter")
        for v in range(10, 40)
    ]
)


def _outcome(kind: FindingKind, text: str, calibration):  # type: ignore[no-untyped-def]
    return outcome_for(kind, text, calibration, parse_measure(text, kind))


def test_well_formed_answers_become_calibrated_measurements() -> None:
    lesion = _outcome(FindingKind.LESION, "18 x 32.5 mm", CALIBRATION)
    assert lesion.parsed
    long, short = lesion.measurements
    assert (long.name, long.value_mm) == (MeasurementName.LONG_AXIS, 32.5)  # sorted
    assert (short.name, short.value_mm) == (MeasurementName.SHORT_AXIS, 18.0)
    assert long.range_mm is not None and long.range_mm[0] <= 32.5 <= long.range_mm[1]
    assert long.coverage == 0.9
    vessel = _outcome(FindingKind.VESSEL, "31 mm", None)
    assert vessel.measurements[0].value_mm == 31.0 and vessel.measurements[0].range_mm is None


@pytest.mark.parametrize("answer", ["32 mm", "1 x 2 x 3 mm", "none", "", "lesion lesion"])
def test_malformed_answers_are_not_measurable(answer: str) -> None:
    outcome = _outcome(FindingKind.LESION, answer, CALIBRATION)
    assert not outcome.parsed
    assert [m.qualifier for m in outcome.measurements] == [NOT_MEASURABLE] * 2
    assert all(m.value_mm is None and "malformed" in (m.reason or "") for m in outcome.measurements)


@pytest.mark.parametrize("mode", [NumericMode.RNED_CORR, NumericMode.STANDARD])
def test_generation_on_the_tiny_model(mode: NumericMode, caplog: pytest.LogCaptureFixture) -> None:
    """An untrained model answers something; every outcome is either parsed or reported."""
    tokenizer = build_tokenizer()
    ids = special_ids(tokenizer)
    torch.manual_seed(0)
    model = CircleRopeQwen2_5_VLForConditionalGeneration(
        CircleRopeQwen2_5_VLConfig(**tiny_qwen2_5_vl_kwargs(vocab_size=len(VOCAB), special_ids=ids))
    ).eval()
    head = build_head(mode, 64, {"hi": 300.0, "scale": 0.1} if mode != NumericMode.STANDARD else {})
    lm = NumericLM(model, head, ids["num"] if head is not None else None)
    examples = phantom_examples(generate_phantom(5), INPUTS, np.random.default_rng(0))
    with caplog.at_level(logging.WARNING):
        outcomes = measure_findings(lm, tokenizer, examples, calibration=CALIBRATION, batch_size=2)
    assert len(outcomes) == len(examples)
    for outcome, ex in zip(outcomes, examples, strict=True):
        assert len(outcome.measurements) == (2 if ex.kind == FindingKind.LESION else 1)
        if mode == NumericMode.STANDARD:
            assert outcome.confidence is None  # digits: no decode confidence
        elif outcome.parsed:  # [NUM] values: the weakest one's peak correlation
            assert outcome.confidence is not None and -1.0 <= outcome.confidence <= 1.0
        if outcome.parsed:
            assert all(m.value_mm is not None for m in outcome.measurements)
        else:
            assert all(m.qualifier == NOT_MEASURABLE for m in outcome.measurements)
    failed = sum(not o.parsed for o in outcomes)
    assert (f"{failed} of {len(outcomes)}" in caplog.text) == (failed > 0)
