"""Clicked-caliper examples from real reads (``model.measurer.data.reads``), on small synthetic
reads folders (``tests.support.reads``) imported as the product imports LIDC."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ingestion.dataset.format import Dataset
from model.measurer.data.reads import ReadsClicks, lesion_from_reads
from model.measurer.infer.stages import segment_to_lps
from model.measurer.inputs.view import LesionView
from model.measurer.results import FindingKind
from model.measurer.tasks.axes import parse_axes
from model.measurer.tasks.text import parse_point

from tests.support.reads import reads_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return reads_dataset(tmp_path_factory.mktemp("reads-clicks"))


def test_each_slice_has_a_caliper_scaled_to_the_readers(dataset: Dataset) -> None:
    finding = dataset.findings[0]
    lesion = lesion_from_reads(dataset, finding)
    assert lesion is not None
    # the mask crosses three slices (an ellipse between two discs): a caliper on each
    assert sorted(c.slice_index for c in lesion.calipers) == [1, 2, 3]
    longest = lesion.calipers[0]
    assert longest.slice_index == 2
    assert longest.long_mm == pytest.approx(finding.long_axis_mm, abs=1e-6)
    short = float(np.linalg.norm(longest.short_axis[1] - longest.short_axis[0]))
    assert short == pytest.approx(finding.short_axis_mm, abs=1e-6)
    # the discs' calipers are shorter than the ellipse's, scaled by the same factor
    assert all(c.long_mm < longest.long_mm for c in lesion.calipers[1:])
    # negatives: at least 5 mm (3-D) from every lesion voxel
    geometry = lesion.volume.geometry
    inside = geometry.index_to_lps(np.argwhere(lesion.mask).astype(float))
    outside = geometry.index_to_lps(lesion.negatives.astype(float))
    nearest = np.min(np.linalg.norm(outside[:, None] - inside[None], axis=2), axis=1)
    assert len(outside) > 0 and float(nearest.min()) >= 5.0 - 1e-9


def test_axes_examples_draw_the_true_caliper_in_the_view(dataset: Dataset) -> None:
    view = LesionView(size=56)
    clicks = ReadsClicks.from_dataset(dataset, view)
    assert len(clicks.lesions) == 3
    rng = np.random.default_rng(7)
    examples = clicks.axes_examples(24, rng)
    assert len(examples) == 24
    by_name = {lesion.name: lesion for lesion in clicks.lesions}
    for example in examples:
        assert example.images.shape == (view.frames, 3, 56, 56)
        assert example.answer is not None
        parsed = parse_axes(example.answer, FindingKind.LESION)
        assert parsed.success, parsed.reason
        frame = (example.crop.image.shape[0] - 1) / 2
        long_axis = segment_to_lps(example.crop, frame, parsed.segments[0])
        # the answer, read back through the crop, is one of the lesions' calipers (either end
        # first: the answer writes the end with the smaller column first)
        drawn = np.array(long_axis)
        gap = min(
            min(
                np.linalg.norm(drawn - np.array(c.long_axis), axis=1).max(),
                np.linalg.norm(drawn[::-1] - np.array(c.long_axis), axis=1).max(),
            )
            for lesion in by_name.values()
            for c in lesion.calipers
        )
        pitch = example.crop.pixel_mm
        assert gap <= 0.1 * pitch * 1.5 + 1e-6  # the answer's 0.1 px grid


def test_same_seed_same_examples_and_sizes_balanced(dataset: Dataset) -> None:
    view = LesionView(size=56)
    clicks = ReadsClicks.from_dataset(dataset, view)
    a = clicks.axes_examples(6, np.random.default_rng(1))
    b = clicks.axes_examples(6, np.random.default_rng(1))
    assert [e.answer for e in a] == [e.answer for e in b]
    # one lesion per size bin here (< 6, 6-10, 10-20 mm): equal weights
    assert np.allclose(clicks._weights, 1 / 3)


def test_point_examples_say_lesion_inside_and_none_outside(dataset: Dataset) -> None:
    clicks = ReadsClicks.from_dataset(dataset, LesionView(size=56))
    examples = clicks.point_examples(40, np.random.default_rng(2), negative_fraction=0.5)
    kinds = [parse_point(e.answer or "").kind for e in examples]
    assert all(parse_point(e.answer or "").success for e in examples)
    nones = sum(k is None for k in kinds)
    assert 10 <= nones <= 30
    assert all(k is None or k.value == "lesion" for k in kinds)


def test_no_lesion_to_learn_from_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no read lesion"):
        ReadsClicks([], LesionView())


def test_hybrid_lesions_carry_their_masks_own_calipers() -> None:
    from ingestion.dataset.recist import lesion_axes
    from model.measurer.data.hybrid import HybridSource, choose_backgrounds
    from model.measurer.data.reads import hybrid_lesions

    from tests.support.reads import shared_or_none

    shared = shared_or_none()
    if shared is None:
        pytest.skip("no shared data folder on this machine: no real backgrounds")
    source = HybridSource(choose_backgrounds(shared), 44, lesions_per_study=(2, 2))
    lesions = hybrid_lesions(source, [0])
    assert len(lesions) == 2
    for lesion in lesions:
        axes = lesion_axes(lesion.mask, lesion.volume.geometry)
        # no reader to scale to: the mask's own RECIST axes on its largest section
        assert lesion.long_mm == pytest.approx(max(c.long_mm for c in lesion.calipers))
        assert lesion.long_mm >= axes.long_axis_mm - 1e-6  # the longest slice, not the largest
        assert len(lesion.negatives) == 0  # not every lesion of a hybrid study is annotated
        assert lesion.name.startswith("hybrid 0 ")
