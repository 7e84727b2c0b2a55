"""The checkpoint measurer (model.measurer.infer.pipeline): what it refuses, what every result
carries, and, with the shipped demo model, that it finds and measures phantom findings."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ingestion.errors import ModelError
from ingestion.phantoms import generate_phantom, study_seed
from ingestion.volume import Modality, Volume
from model.measurer.checkpoint.settings import default_checkpoint
from model.measurer.data.sources import PhantomSource
from model.measurer.evaluate.scoring import match_findings
from model.measurer.infer.pipeline import CheckpointMeasurer
from model.measurer.inputs.data import collate, encode_example, phantom_volume, point_example
from model.measurer.protocol import Measurer
from model.measurer.results import NOT_MEASURABLE
from model.measurer.tasks.text import NONE_WORD
from model.measurer.tasks.tokenizer import special_ids
from model.measurer.train.config import Stage
from model.measurer.train.loop import train

from tests.support.measurer import tiny_config

TINY = tiny_config(stages=(Stage("a", 2, 1e-3, warmup_steps=1),))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> CheckpointMeasurer:
    """An (untrained) tiny checkpoint: its answers are mostly malformed."""
    directory = train(TINY, tmp_path_factory.mktemp("tiny"), PhantomSource(1))
    return CheckpointMeasurer.load(directory)


@pytest.fixture(scope="module")
def volume() -> Volume:
    return phantom_volume(generate_phantom(study_seed(77, 0)))


def test_it_is_a_measurer_that_names_its_model(tiny: CheckpointMeasurer, volume: Volume) -> None:
    assert isinstance(tiny, Measurer)
    result = tiny.measure(volume, source="phantom.dcm")
    assert result.model == tiny.info and result.model.not_for_clinical_use
    assert result.study_instance_uid == volume.identifiers.study_instance_uid
    assert result.source == "phantom.dcm"
    assert [f.id for f in result.findings] == list(range(1, len(result.findings) + 1))
    # trained on phantoms only: every study is flagged as outside what it was validated on
    domain = [w for w in result.warnings if w.startswith("outside the validated domain")]
    assert domain and "phantom" in domain[0]
    # the tiny checkpoint was never calibrated: said, as its values have no ranges
    assert tiny.loaded.settings.calibration is None
    rest = [w for w in result.warnings if w not in domain]
    assert "is not calibrated" in rest[0] and "radcaliper calibrate" in rest[0]
    for warning in rest[1:]:  # an untrained model's malformed answers are counted
        assert "malformed" in warning and " of " in warning
    for finding in result.findings:
        for m in finding.measurements:
            assert m.value_mm is not None or m.qualifier == NOT_MEASURABLE
        if finding.axes_lps_mm is None:
            assert any("axes answers were malformed" in w for w in result.warnings)


def _with(volume: Volume, **changes: object) -> Volume:
    return dataclasses.replace(volume, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"modality": Modality.MR}, "trained on CT only"),
        ({"modality": None}, "RADCALIPER_NIFTI_MODALITY=CT"),
    ],
)
def test_volumes_it_cannot_handle_are_refused(
    tiny: CheckpointMeasurer, volume: Volume, change: dict, message: str
) -> None:
    with pytest.raises(ModelError, match=message):
        tiny.measure(_with(volume, **change), source="x")


@pytest.mark.parametrize(
    ("spacing", "message"),
    [((1.0, 3.0, 3.0), "pixel spacing 3 mm"), ((12.0, 0.8, 0.8), "slice spacing 12 mm")],
)
def test_spacing_far_from_training_is_refused(
    tiny: CheckpointMeasurer, volume: Volume, spacing: tuple[float, float, float], message: str
) -> None:
    geometry = dataclasses.replace(volume.geometry, spacing=spacing)
    with pytest.raises(ModelError, match=message):
        tiny.measure(_with(volume, geometry=geometry), source="x")
    few = Volume.in_memory(np.zeros((2, 32, 32), np.float32), volume.geometry)
    with pytest.raises(ModelError, match="at least 3"):
        tiny.measure(few, source="x")


def test_a_click_gives_a_finding_none_or_a_clear_error(
    tiny: CheckpointMeasurer, volume: Volume
) -> None:
    with pytest.raises(ValueError, match="three finite numbers"):
        tiny.measure_at(volume, (0.0, float("nan"), 0.0))
    try:
        found = tiny.measure_at(volume, (0.0, 0.0, float(volume.geometry.origin[2])))
    except ModelError as error:
        assert "malformed" in str(error)
    else:
        assert found is None or found.id == 1


def test_the_opening_probability_is_the_model_s_own_first_token_probability(
    tiny: CheckpointMeasurer, volume: Volume
) -> None:
    """generate(..., opening="none") gives each answer the softmax probability of "none" at
    its first step: the same as a full forward of the prompt."""
    inputs = tiny.loaded.settings.measure_inputs
    center = (0.0, 0.0, float(volume.geometry.origin[2]))
    examples = [
        point_example(volume, center, inputs),
        point_example(volume, (20.0, 0.0, center[2]), inputs),
    ]
    answers = tiny.generate(examples, 4, opening=NONE_WORD)
    plain = tiny.generate(examples, 4)
    assert [a.text for a in answers] == [a.text for a in plain]
    assert all(a.opening is None for a in plain)
    tokenizer = tiny.loaded.tokenizer
    (none_id,) = tokenizer.encode(NONE_WORD, add_special_tokens=False)
    for example, answer in zip(examples, answers, strict=True):
        batch = collate(
            [encode_example(example, tokenizer, numeric=True)], special_ids(tokenizer)["pad"]
        )
        with torch.no_grad():
            logits = tiny.lm(
                batch.input_ids,
                batch.attention_mask,
                batch.num_values,
                pixel_values=batch.pixel_values,
                image_grid_thw=batch.image_grid_thw,
            ).logits
        expected = float(logits[0, -1].float().softmax(-1)[none_id])
        assert answer.opening == pytest.approx(expected, rel=1e-4, abs=1e-6)
    with pytest.raises(ValueError, match="not one"):
        tiny.generate(examples[:1], 2, opening="lesion none")


DEMO = default_checkpoint()


def test_the_demo_model_finds_and_measures_held_out_phantoms() -> None:
    """Eight held-out studies (a run seed never used in training or calibration).

    A regression guard for the shipped demo model run through the default stages, which hold no
    phantom-spec rule (issue 23): most vessels and at least 80 % of the lesions >= 10 mm are
    found, at most one false finding in four studies, and what is found is measured near the
    truth with 90 % ranges (0.3.4 through the stages: 13/15 lesions, 5/5 vessels; with the
    phantom rules it had 15/15: the contrast proposals found what its find step missed)."""
    measurer = CheckpointMeasurer.load(DEMO)
    assert measurer.info.name == "radcaliper-demo" and measurer.info.not_for_clinical_use
    assert measurer.loaded.settings.calibration is not None  # shipped calibrated
    source = PhantomSource(4242)
    found = {"lesion": 0, "vessel": 0}
    total = {"lesion": 0, "vessel": 0}
    false = 0
    errors: dict[str, list[float]] = {"lesion": [], "vessel": []}
    for i in range(8):
        study = source.study(i)
        result = measurer.measure(study.volume, source=study.name)
        pairs = match_findings(study.findings, result.findings)
        false += len(result.findings) - len(pairs)
        matched = dict(pairs)
        for t, truth in enumerate(study.findings):
            if truth.kind == "lesion" and (truth.long_axis_mm or 0.0) < 10.0:
                continue
            total[truth.kind] += 1
            if t not in matched:
                continue
            found[truth.kind] += 1
            value = result.findings[matched[t]].measurements[0]
            assert value.range_mm is not None and value.coverage == pytest.approx(0.9)
            assert value.range_mm[0] <= value.value_mm <= value.range_mm[1]  # type: ignore[operator]
            expected = truth.long_axis_mm if truth.kind == "lesion" else truth.diameter_mm
            assert value.value_mm is not None and expected is not None
            errors[truth.kind].append(abs(value.value_mm - expected))
    assert found["vessel"] >= 0.8 * total["vessel"], (found, total)
    assert found["lesion"] >= 0.8 * total["lesion"], (found, total)
    assert false <= 2, false
    assert float(np.median(errors["lesion"])) < 1.5, errors
    assert float(np.median(errors["vessel"])) < 0.5, errors


def test_the_demo_checkpoint_ships_with_its_card() -> None:
    card = DEMO / "README.md"
    assert card.is_file(), f"{card} is missing"
    text = card.read_text()
    assert "not for clinical use" in text.lower() and "radcaliper train" in text
    size = sum(p.stat().st_size for p in DEMO.rglob("*") if p.is_file())
    assert size <= 30 * 2**20
