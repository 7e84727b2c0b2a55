"""Training material (model.measurer.data.pool): sources of studies, the rolling pool, point
examples."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from ingestion.errors import ConfigurationError
from ingestion.phantoms import generate_phantom, study_seed, write_phantoms
from model.measurer.data.pool import StudyPool
from model.measurer.data.sources import FolderSource, PhantomSource, read_truth
from model.measurer.data.study import TrainingStudy
from model.measurer.inputs.data import (
    MeasureInputs,
    background_patches,
    finding_patches,
    phantom_volume,
)
from model.measurer.inputs.find import FindInputs
from model.measurer.results import FindingKind
from model.measurer.tasks.text import parse_find, parse_point

MEASURE = MeasureInputs(pixel_mm=1.5, size=56, window=(40.0, 160.0), jitter_mm=2.0)
FIND = FindInputs(pixel_mm=3.0, size=112)


def _pool(**kwargs: object) -> StudyPool:
    options: dict = {
        "size": 3,
        "initial": 2,
        "studies_per_step": 0.5,
        "planes_per_study": 2,
        "seed": 5,
    }
    options.update(kwargs)
    return StudyPool(PhantomSource(seed=1), MEASURE, FIND, **options)


def test_phantom_source_is_the_phantoms_command_s_seeds() -> None:
    study = PhantomSource(seed=3).study(2)
    phantom = generate_phantom(study_seed(3, 2))
    assert np.array_equal(study.volume.voxels, phantom.hu.astype(np.float32))
    assert study.findings == phantom.findings


def test_folder_source_reads_what_the_phantoms_command_wrote(tmp_path: Path) -> None:
    write_phantoms(tmp_path / "studies", n=2, seed=9)
    source = FolderSource(tmp_path / "studies")
    assert len(source.folders) == 2 and source.describe()["studies"] == 2
    study = source.study(3)  # cyclic: the second study
    phantom = generate_phantom(study_seed(9, 1))
    assert study.findings == phantom.findings
    np.testing.assert_allclose(study.volume.voxels, phantom.hu, atol=0)
    assert study.volume.geometry.spacing == pytest.approx(phantom.geometry.spacing)


def test_folder_source_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"no study with a truth\.json"):
        FolderSource(tmp_path)
    bad = tmp_path / "truth.json"
    bad.write_text(json.dumps({"findings": [{"kind": "tumour"}]}))
    with pytest.raises(ConfigurationError, match=r"truth\.json"):
        read_truth(bad)


def test_the_pool_at_a_step_does_not_depend_on_how_it_got_there() -> None:
    stepwise = _pool()
    for step in range(7):
        stepwise.advance(step)
    direct = _pool()
    direct.advance(6)
    assert stepwise.made_by(6) == direct.made_by(6) == 5
    assert list(stepwise._entries) == list(direct._entries) == [2, 3, 4]  # size 3
    for a, b in zip(stepwise.patches, direct.patches, strict=True):
        assert a.center_lps_mm == b.center_lps_mm and np.array_equal(a.hu, b.hu)
    for a, b in zip(stepwise.planes, direct.planes, strict=True):
        assert a.findings == b.findings
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    first = stepwise.measure_examples(4, rng_a)
    second = direct.measure_examples(4, rng_b)
    assert [e.answer for e in first] == [e.answer for e in second]


def test_pool_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="initial"):
        _pool(initial=5)
    with pytest.raises(ValueError, match="studies_per_step"):
        _pool(studies_per_step=-1.0)


def test_point_examples_name_the_finding_or_none() -> None:
    pool = _pool(background_per_study=3)
    pool.advance(0)
    examples = pool.point_examples(40, np.random.default_rng(0))
    answers = [parse_point(e.answer or "") for e in examples]
    assert all(a.success for a in answers)
    kinds = {a.kind for a in answers}
    assert None in kinds and len(kinds) >= 2  # "none" and at least one kind of finding
    assert all(e.prompt == "measure at the point" for e in examples)


def test_background_patches_keep_away_from_findings() -> None:
    phantom = generate_phantom(11)
    volume = phantom_volume(phantom)
    patches = background_patches(
        volume, phantom.findings, MEASURE, np.random.default_rng(0), count=20
    )
    assert len(patches) == 20
    for patch in patches:
        assert patch.kind is None
        index = volume.geometry.lps_to_index(patch.center_lps_mm)
        hu = volume.voxels[tuple(round(float(i)) for i in index)]
        assert -20.0 <= hu <= 100.0  # soft tissue
        for finding in phantom.findings:
            gap = np.hypot(
                patch.center_lps_mm[0] - finding.center_lps_mm[0],
                patch.center_lps_mm[1] - finding.center_lps_mm[1],
            )
            if finding.kind == "vessel":
                assert finding.diameter_mm is not None
                assert gap > finding.diameter_mm / 2 + 8.0
            else:
                distance = np.linalg.norm(np.subtract(patch.center_lps_mm, finding.center_lps_mm))
                assert finding.long_axis_mm is not None and finding.cc_extent_mm is not None
                assert distance > max(finding.long_axis_mm, finding.cc_extent_mm) / 2 + 8.0


def test_clicks_fall_inside_the_finding() -> None:
    phantom = generate_phantom(11)
    volume = phantom_volume(phantom)
    rng = np.random.default_rng(0)
    near = finding_patches(volume, phantom.findings, MEASURE)
    anywhere = finding_patches(volume, phantom.findings, MEASURE, click_fraction=0.8)
    for tight, loose, finding in zip(near, anywhere, phantom.findings, strict=True):
        center = np.asarray(finding.center_lps_mm)
        tight_r = [np.hypot(*(np.subtract(tight.click(rng), center)[:2])) for _ in range(200)]
        assert max(tight_r) <= tight.inner_radius_mm + 1e-9
        clicks = np.array([np.subtract(loose.click(rng), center) for _ in range(400)])
        assert np.all(clicks[:, 2] == 0.0)
        if finding.kind == "vessel":
            assert finding.diameter_mm is not None
            radius = np.hypot(clicks[:, 0], clicks[:, 1])
            assert radius.max() <= 0.8 * finding.diameter_mm / 2 + 1e-6
            assert radius.max() > 0.6 * finding.diameter_mm / 2  # it uses the whole region
        else:
            assert finding.rotation_deg is not None
            assert finding.long_axis_mm is not None and finding.short_axis_mm is not None
            theta = np.radians(finding.rotation_deg)
            along = clicks[:, 0] * np.cos(theta) + clicks[:, 1] * np.sin(theta)
            across = -clicks[:, 0] * np.sin(theta) + clicks[:, 1] * np.cos(theta)
            inside = (along / (0.8 * finding.long_axis_mm / 2)) ** 2 + (
                across / (0.8 * finding.short_axis_mm / 2)
            ) ** 2
            assert inside.max() <= 1.0 + 1e-6 and inside.max() > 0.5


def test_background_patches_beside_findings_are_near_them_and_still_outside() -> None:
    phantom = generate_phantom(11)
    volume = phantom_volume(phantom)
    rng = np.random.default_rng(0)
    patches = background_patches(
        volume, phantom.findings, MEASURE, rng, count=10, near_fraction=1.0, near_mm=20.0
    )
    assert len(patches) == 10
    for patch in patches:
        x, y, z = patch.center_lps_mm
        beside = False
        for finding in phantom.findings:
            fx, fy, fz = finding.center_lps_mm
            gap = float(np.hypot(x - fx, y - fy))
            if finding.kind == "vessel":
                assert finding.diameter_mm is not None
                reach = finding.diameter_mm / 2 + 8.0
                assert gap > reach
                beside |= gap <= reach + 20.0
            else:
                assert finding.long_axis_mm is not None and finding.cc_extent_mm is not None
                reach = max(finding.long_axis_mm, finding.cc_extent_mm) / 2 + 8.0
                assert float(np.linalg.norm([x - fx, y - fy, z - fz])) > reach
                beside |= gap <= reach + 20.0 and abs(z - fz) <= finding.cc_extent_mm / 2
        assert beside
    with pytest.raises(ValueError, match="near_fraction"):
        background_patches(volume, phantom.findings, MEASURE, rng, count=2, near_fraction=2.0)


def test_find_examples_are_shifted_within_the_limit() -> None:
    pool = _pool(find_shift_px=10)
    pool.advance(0)
    rng = np.random.default_rng(3)
    examples = pool.find_examples(6, rng)
    assert len(examples) == 6
    with pytest.raises(ValueError, match="find_shift_px"):
        _pool(find_shift_px=28)


class _LesionsOnly:
    """Phantoms as a study annotated exhaustively for lesions only (like a real background
    whose vessels nobody labelled)."""

    def __init__(self) -> None:
        self.inner = PhantomSource(seed=1)

    def study(self, index: int) -> TrainingStudy:
        return dataclasses.replace(self.inner.study(index), annotated=("lesion",))

    def describe(self) -> dict[str, object]:
        return self.inner.describe()


def test_a_study_annotated_for_lesions_only_gives_lesion_find_planes_and_no_background() -> None:
    pool = StudyPool(
        _LesionsOnly(), MEASURE, FIND, size=3, initial=2, studies_per_step=0.0,
        planes_per_study=3, background_per_study=3, seed=5,
    )  # fmt: skip
    pool.advance(0)
    assert pool.planes and all(p.kinds == {FindingKind.LESION} for p in pool.planes)
    assert not pool.background  # "nothing here" clicks would deny the unlabelled vessels
    examples = pool.find_examples(8, np.random.default_rng(2))
    assert {e.prompt for e in examples} == {"find lesions in the image"}
    for example in examples:
        parsed = parse_find(example.answer or "", num_images=1)
        assert parsed.success and all(f.kind is FindingKind.LESION for f in parsed.findings)
    with pytest.raises(ValueError, match=r"cannot answer a find prompt for \['vessel'\]"):
        pool.planes[0].example(FIND, kinds=[FindingKind.VESSEL])


def test_scoped_find_prompts_ask_for_one_kind_and_answer_for_it_only() -> None:
    rng = np.random.default_rng(4)
    everything = _pool(planes_per_study=4)
    everything.advance(0)
    assert {e.prompt for e in everything.find_examples(20, rng)} == {
        "find lesions and vessels in the image"
    }
    scoped = _pool(planes_per_study=4, scoped_find_fraction=1.0)
    scoped.advance(0)
    examples = scoped.find_examples(40, rng)
    prompts = {e.prompt for e in examples}
    assert prompts == {"find lesions in the image", "find vessels in the image"}
    for example in examples:
        asked = FindingKind.LESION if "lesions" in example.prompt else FindingKind.VESSEL
        parsed = parse_find(example.answer or "", num_images=1)
        assert parsed.success and all(f.kind is asked for f in parsed.findings)
    vessels = [e for e in examples if "vessels" in e.prompt]
    assert any(parse_find(e.answer or "", num_images=1).findings for e in vessels)
    with pytest.raises(ValueError, match="scoped_find_fraction"):
        _pool(scoped_find_fraction=1.5)
