"""Hybrid training data (model.measurer.data.hybrid): real CT backgrounds from the shared data
(``../shared/data``, read in place), synthetic lesions inserted, truth measured from the label
map. Backgrounds are cropped to small parts to keep the tests fast."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from typer.testing import CliRunner

from app.cli import app
from ingestion.dataset.format import (
    DatasetFinding,
    ImageRef,
    Provenance,
    SourceType,
    read_dataset,
)
from ingestion.dataset.masks import findings_from_labels
from ingestion.errors import ConfigurationError
from ingestion.geometry import Geometry
from model.measurer.data._augment import (
    Augmentation,
    draw_augmentation,
    resample_in_plane,
    thicken_slices,
)
from model.measurer.data._insert import (
    GAP_MM,
    MIN_CNR,
    LesionShape,
    TissueMaps,
    insert_lesions,
    occupancy,
    tissue_maps,
)
from model.measurer.data.hybrid import (
    Background,
    HybridSource,
    choose_backgrounds,
    licence_allows_training,
    survey_backgrounds,
    write_hybrid_dataset,
)
from model.measurer.data.sources import MixedSource, PhantomSource, parse_sources

SHARED = Path(__file__).resolve().parents[4].parent / "shared" / "data"
NON_COMMERCIAL = {"lung1_001_gtv", "ibsi_ct_lung_gtv"}

pytestmark = pytest.mark.skipif(
    not (SHARED / "real-ct" / "cases.json").is_file(),
    reason=f"the shared real CT data (backgrounds) is not at {SHARED}",
)


def _load(case: str) -> Background:
    (ref,) = choose_backgrounds(SHARED, [case])
    return ref.load()


@pytest.fixture(scope="module")
def abdomen() -> Background:
    """Liver, spleen, aorta, IVC and portal vein of the abdominal CT, 20 x 250 x 250."""
    return _load("ts_abdomen_dicom").crop(slice(None), slice(150, 400), slice(80, 330))


@pytest.fixture(scope="module")
def chest() -> Background:
    """The right lung with its LIDC nodule and the chest wall, 30 x 200 x 200."""
    return _load("lidc0314_nodule").crop(slice(10, 40), slice(150, 350), slice(40, 240))


@pytest.fixture(scope="module")
def limb() -> Background:
    """The soft-tissue sarcoma case, whole (48 x 143 x 161)."""
    return _load("sts_002_sarcoma")


def _rows(
    labels: np.ndarray, geometry: Geometry, roles: dict[int, tuple[str, str]]
) -> list[DatasetFinding]:
    rows, _ = findings_from_labels(
        labels,
        geometry,
        roles,
        study_instance_uid="1.2",
        series_instance_uid="1.2.3",
        image=ImageRef("x.nii.gz", "nifti", "CT"),
        provenance=Provenance(SourceType.MASKS, "test"),
        file="test",
    )
    return rows


# -- which backgrounds ----------------------------------------------------------------------------
def test_licence_filter_keeps_only_what_a_shipped_model_may_train_on(tmp_path: Path) -> None:
    assert licence_allows_training("Apache-2.0 (repository LICENSE)")
    assert licence_allows_training("LIDC-IDRI (TCIA): CC BY 3.0; mirp repository: EUPL-1.2")
    assert not licence_allows_training("NSCLC-Radiomics (TCIA): CC BY-NC 3.0")
    assert not licence_allows_training("CC BY-NC-SA 4.0")
    assert not licence_allows_training("unknown")
    survey = survey_backgrounds(SHARED)
    usable = {ref.id for ref in survey.usable}
    excluded = dict(survey.excluded)
    assert set(excluded) >= NON_COMMERCIAL and not NON_COMMERCIAL & usable
    for case in NON_COMMERCIAL:
        assert "licence" in excluded[case] and "NC" in excluded[case]
    assert {"ts_abdomen_dicom", "lidc0314_nodule", "sts_002_sarcoma"} <= usable
    assert all(licence_allows_training(ref.licence) for ref in survey.usable)
    assert "ts_ct_3mm" in excluded and "mr_brain1" in excluded  # refused; MR
    with pytest.raises(ConfigurationError, match="NC"):
        choose_backgrounds(SHARED, ["lung1_001_gtv"])
    # a cases.json of our own: only the permissively licensed CT case with 0.4-1.5 mm pixels
    root = tmp_path / "shared"
    cases = []
    for case, licence, modality, pixel, expect in [
        ("ok", "MIT", "CT", 0.8, "measure"),
        ("nc", "CC BY-NC 4.0", "CT", 0.8, "measure"),
        ("mr", "MIT", "MR", 0.8, "refuse"),
        ("coarse", "MIT", "CT", 3.0, "measure"),
        ("refused", "MIT", "CT", 0.8, "refuse"),
    ]:
        folder = root / "real-ct" / case
        folder.mkdir(parents=True)
        nib.save(
            nib.Nifti1Image(np.zeros((4, 4, 3), np.int16), np.diag([pixel, pixel, 2.0, 1.0])),
            str(folder / "image.nii.gz"),
        )
        cases.append(
            {"id": case, "modality": modality, "input": f"{case}/image.nii.gz", "expect": expect,
             "labels": "labels.nii.gz", "label_map": {}, "source": {"licence": licence}}
        )  # fmt: skip
    (root / "real-ct" / "cases.json").write_text(json.dumps({"cases": cases}), encoding="utf-8")
    own = survey_backgrounds(root)
    assert [ref.id for ref in own.usable] == ["ok"]
    assert {case for case, _ in own.excluded} == {"nc", "mr", "coarse", "refused"}
    with pytest.raises(ConfigurationError, match="no real-ct"):
        survey_backgrounds(tmp_path / "nothing")


# -- insertion ------------------------------------------------------------------------------------
@pytest.mark.parametrize("angle", [0.0, 30.0, 77.0])
def test_an_inserted_ellipsoid_has_its_analytic_axes(angle: float) -> None:
    """Rasterised with partial volume, the truth (occupancy >= 0.5) measures the ellipsoid's
    axial axes within one pixel."""
    geometry = Geometry((-40.0, -40.0, 0.0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (2.0, 0.7, 0.7))
    shape_zyx = (24, 120, 120)
    a, b, c = 12.0, 7.0, 9.0
    t = math.radians(angle)
    rotation = np.array([[math.cos(t), -math.sin(t), 0], [math.sin(t), math.cos(t), 0], [0, 0, 1]])
    matrix = rotation @ np.diag([a, b, c])
    shape = LesionShape.from_matrix(matrix)
    centre = np.array([11.0, 59.3, 60.6])
    box, occ = occupancy(shape, centre, geometry, shape_zyx)
    labels = np.zeros(shape_zyx, dtype=np.int16)
    labels[box][occ >= 0.5] = 1
    assert occ.min() > 0 or occ.min() == 0.0
    assert ((occ > 0) & (occ < 1)).any()  # partial volume at the edge
    volume = float(occ.sum()) * 2.0 * 0.7 * 0.7
    assert volume == pytest.approx(4 / 3 * math.pi * a * b * c, rel=0.02)
    (row,) = _rows(labels, geometry, {1: ("lesion", "lesion")})
    assert row.long_axis_mm == pytest.approx(2 * a, abs=0.7)
    assert row.short_axis_mm == pytest.approx(2 * b, abs=0.7)
    expected = geometry.index_to_lps(centre)
    assert np.allclose(row.center_lps_mm, expected, atol=0.7)
    assert row.rotation_deg is not None
    assert abs((row.rotation_deg - angle + 90) % 180 - 90) < 3.0


def _tissue_of(maps: TissueMaps, name: str) -> np.ndarray:
    if name == "lung":
        return maps.lung
    if name == "soft tissue":
        return maps.soft
    return maps.organs[name][0]


def test_lesions_lie_in_their_tissue_with_its_contrast(abdomen: Background) -> None:
    volume = abdomen.volume
    g = volume.geometry
    maps = tissue_maps(volume.voxels, abdomen.labels, g, abdomen.names)
    assert {"liver", "spleen"} <= set(maps.organs)
    image, labels, lesions = insert_lesions(
        volume.voxels, abdomen.labels, g, maps, 4, np.random.default_rng(11), 1000
    )
    assert len(lesions) == 4
    assert np.array_equal(labels[labels < 1000], abdomen.labels[labels < 1000])
    from scipy import ndimage

    near_known = ndimage.distance_transform_edt(~maps.blocked, sampling=g.spacing) < GAP_MM
    changed = image != volume.voxels
    reach = np.zeros(image.shape, dtype=bool)
    for lesion in lesions:
        truth = labels == lesion.value
        assert truth.any()
        assert _tissue_of(maps, lesion.tissue)[truth].all(), lesion
        assert not (truth & near_known).any(), lesion
        others = (labels >= 1000) & ~truth
        if others.any():
            gap = ndimage.distance_transform_edt(~others, sampling=g.spacing)[truth].min()
            assert gap >= GAP_MM
        assert lesion.noise_hu is not None and lesion.noise_hu > 0
        assert abs(lesion.contrast_hu) >= MIN_CNR * lesion.noise_hu - 1e-9  # visible
        core = ndimage.binary_erosion(truth, iterations=2)
        if core.sum() > 30:
            mean = float(image[core].mean())
            assert mean == pytest.approx(lesion.local_median_hu + lesion.contrast_hu, abs=15)
        reach |= ndimage.distance_transform_edt(~truth, sampling=g.spacing) < 6.0
    assert not (changed & ~reach).any()  # nothing changed away from the lesions
    rows = _rows(labels, g, {lesion.value: ("lesion", "lesion") for lesion in lesions})
    assert len(rows) == 4 and all(5.0 <= float(r.long_axis_mm or 0) <= 60.0 for r in rows)


def test_lesions_are_at_least_min_cnr_noise_deviations_from_their_tissue() -> None:
    """In a noisy tissue (SD 20 HU) the soft-tissue rule's contrasts (+-15..60 HU) are raised to
    at least ``MIN_CNR`` measured noise deviations, their sign kept: no lesion a reader could
    not see."""
    g = Geometry((0.0, 0.0, 0.0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (2.5, 0.8, 0.8))
    rng = np.random.default_rng(4)
    image = (40.0 + 20.0 * rng.standard_normal((24, 160, 160))).astype(np.float32)
    body = np.ones(image.shape, dtype=bool)
    nothing = np.zeros(image.shape, dtype=bool)
    maps = TissueMaps(body=body, lung=nothing, soft=body, organs={}, blocked=nothing)
    labels = np.zeros(image.shape, dtype=np.int16)
    _, _, lesions = insert_lesions(image, labels, g, maps, 6, np.random.default_rng(9), 1000)
    assert len(lesions) >= 4
    for lesion in lesions:
        assert lesion.tissue == "soft tissue"
        assert lesion.noise_hu == pytest.approx(20.0, rel=0.2)
        assert abs(lesion.contrast_hu) >= MIN_CNR * lesion.noise_hu - 1e-9
    assert {lesion.contrast_hu > 0 for lesion in lesions} == {True, False}  # signs kept


def test_lung_lesions_are_solid_nodules_in_aerated_lung(chest: Background) -> None:
    volume = chest.volume
    g = volume.geometry
    maps = tissue_maps(volume.voxels, chest.labels, g, chest.names)
    assert maps.lung.sum() > 10_000  # found from the image
    assert np.median(volume.voxels[maps.lung]) < -700
    only_lung = dataclasses.replace(maps, soft=np.zeros_like(maps.soft), organs={})
    image, labels, lesions = insert_lesions(
        volume.voxels, chest.labels, g, only_lung, 2, np.random.default_rng(5), 1000
    )
    assert lesions and all(lesion.tissue == "lung" for lesion in lesions)
    for lesion in lesions:
        truth = labels == lesion.value
        assert maps.lung[truth].all()
        assert not (truth & (chest.labels == 1)).any()  # apart from the known nodule
        assert -250 < float(np.median(image[truth])) < 150  # solid


# -- augmentation ---------------------------------------------------------------------------------
def _phantom_with_findings() -> tuple[np.ndarray, np.ndarray, Geometry]:
    """A body of 40 HU with an elliptic lesion (label 1) and a round vessel (label 2)."""
    g = Geometry((-60.0, -50.0, 10.0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (2.0, 0.8, 0.8))
    z, r, c = np.mgrid[0:16, 0:140, 0:150].astype(np.float64)
    lps = g.index_to_lps(np.stack([z, r, c], -1))
    x, y, zz = lps[..., 0], lps[..., 1], lps[..., 2]
    image = np.where(((x / 50) ** 2 + (y / 45) ** 2) < 1, 40.0, -1000.0).astype(np.float32)
    labels = np.zeros(image.shape, dtype=np.int16)
    u, v = x - 12.0, y - 6.0
    ct, st = math.cos(math.radians(25)), math.sin(math.radians(25))
    inside = ((u * ct + v * st) / 9.0) ** 2 + ((-u * st + v * ct) / 5.0) ** 2 + (
        (zz - 21.0) / 7.0
    ) ** 2 < 1
    labels[inside] = 1
    labels[((x + 20) ** 2 + (y - 10) ** 2) < 8.0**2] = 2
    image[labels == 1] = 0.0
    image[labels == 2] = 200.0
    return image, labels, g


ROLES = {1: ("lesion", "lesion"), 2: ("aorta", "vessel")}


def test_flips_and_rotations_move_the_truth_with_the_anatomy() -> None:
    image, labels, g = _phantom_with_findings()
    lesion, vessel = _rows(labels, g, ROLES)
    centre = g.index_to_lps([0.0, (image.shape[1] - 1) / 2, (image.shape[2] - 1) / 2])
    for augmentation in [
        Augmentation(flip_lr=True),
        Augmentation(flip_ap=True),
        Augmentation(rotation_deg=90.0),
        Augmentation(rotation_deg=30.0),
        Augmentation(flip_lr=True, rotation_deg=-17.0),
    ]:
        new_image, new_labels, new_g = resample_in_plane(image, labels, g, augmentation, {1, 2})
        assert new_g == g or np.allclose(new_g.affine, g.affine)  # the same grid
        moved, moved_vessel = _rows(new_labels, new_g, ROLES)
        # the expected centres: the anatomy mirrored and rotated about the field's centre
        p = np.array(lesion.center_lps_mm[:2]) - centre[:2]
        q = np.array(vessel.center_lps_mm[:2]) - centre[:2]
        if augmentation.flip_lr:
            p[0], q[0] = -p[0], -q[0]
        if augmentation.flip_ap:
            p[1], q[1] = -p[1], -q[1]
        t = math.radians(augmentation.rotation_deg)
        turn = np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])
        p, q = turn @ p + centre[:2], turn @ q + centre[:2]
        pixel = 0.8
        assert np.allclose(moved.center_lps_mm[:2], p, atol=pixel), augmentation
        assert np.allclose(moved_vessel.center_lps_mm[:2], q, atol=pixel), augmentation
        assert moved.long_axis_mm == pytest.approx(lesion.long_axis_mm, abs=pixel)
        assert moved.short_axis_mm == pytest.approx(lesion.short_axis_mm, abs=pixel)
        assert moved_vessel.diameter_mm == pytest.approx(vessel.diameter_mm, abs=pixel)
        assert new_image[new_labels == 2].mean() == pytest.approx(200.0, abs=25)
        if augmentation == Augmentation(flip_lr=True):  # whole pixels: the mirror image
            assert np.array_equal(new_labels, labels[:, :, ::-1])
            assert np.array_equal(new_image, image[:, :, ::-1])


def test_resolution_field_and_thickness_keep_the_geometry_exact() -> None:
    image, labels, g = _phantom_with_findings()
    lesion, vessel = _rows(labels, g, ROLES)
    augmentation = Augmentation(pixel_mm=0.55, fov_mm=90.0, center_shift=(0.3, -0.6))
    new_image, new_labels, new_g = resample_in_plane(
        image, labels, g, augmentation, {1, 2}, keep_inside=labels > 0
    )
    assert new_g.row_spacing == new_g.column_spacing == 0.55
    assert max(new_image.shape[1:]) * 0.55 == pytest.approx(90.0, abs=0.6)
    moved, moved_vessel = _rows(new_labels, new_g, ROLES)
    assert np.allclose(moved.center_lps_mm, lesion.center_lps_mm, atol=0.8)  # same place
    assert np.allclose(moved_vessel.center_lps_mm[:2], vessel.center_lps_mm[:2], atol=0.8)
    assert moved.long_axis_mm == pytest.approx(lesion.long_axis_mm, abs=0.8)
    # thick slabs: 2 mm -> 5 mm by averaging
    thick_image, thick_labels, thick_g = thicken_slices(image, labels, g, 5.0, {1, 2})
    assert thick_g.slice_spacing == 5.0 and thick_image.shape[0] == 6  # 32 mm / 5 mm
    assert thick_g.origin[2] == pytest.approx(g.origin[2] - 1.0 + 2.5)  # first slab's centre
    inside_body = image[:, 70, 75]  # a uniform column: its mean is kept
    assert thick_image[:, 70, 75] == pytest.approx(np.full(6, inside_body[0]))
    thick_lesion, _ = _rows(thick_labels, thick_g, ROLES)
    assert thick_lesion.z_range_lps_mm is not None and lesion.z_range_lps_mm is not None
    assert abs(np.mean(thick_lesion.z_range_lps_mm) - np.mean(lesion.z_range_lps_mm)) < 2.5
    with pytest.raises(ValueError, match="thinner"):
        thicken_slices(image, labels, g, 1.0, {1, 2})
    drawn = draw_augmentation(np.random.default_rng(3), g, (16, 140, 150))
    assert drawn.slice_mm in (None, 2.5, 3.0) or drawn.slice_mm is None


# -- the source -----------------------------------------------------------------------------------
def test_studies_are_deterministic_and_truth_matches_the_labels(
    abdomen: Background, limb: Background
) -> None:
    first = HybridSource([abdomen, limb], seed=7)
    again = HybridSource([abdomen, limb], seed=7)
    for index in range(3):
        a, b = first.make(index), again.make(index)
        assert a.volume.voxels.tobytes() == b.volume.voxels.tobytes()
        assert a.labels.tobytes() == b.labels.tobytes()
        rows_a, _, kinds = a.findings()
        rows_b, _, _ = b.findings()
        assert [r.to_json() for r in rows_a] == [r.to_json() for r in rows_b]
        assert np.array_equal(a.volume.voxels, np.rint(a.volume.voxels))  # whole HU
        study = first.study(index)
        assert study.annotated == kinds
        assert kinds == (("lesion", "vessel") if a.background.id == "ts_abdomen_dicom" else
                         ("lesion",))  # fmt: skip
        inserted = [r for r in rows_a if "synthetic lesion" in r.name]
        assert len(inserted) == len(a.lesions) >= 1
        for row, lesion in zip(inserted, a.lesions, strict=True):
            (own,) = _rows((a.labels == lesion.value).astype(np.int16), a.volume.geometry,
                           {1: ("x", "lesion")})  # fmt: skip
            assert row.long_axis_mm == pytest.approx(own.long_axis_mm)
            assert "background" in row.provenance.annotator
        names = {r.name for r in rows_a}
        if a.background.id == "ts_abdomen_dicom":
            assert {"aorta", "inferior_vena_cava"} <= names
        else:
            assert any("sarcoma" in n for n in names)
    other = HybridSource([abdomen, limb], seed=8).make(0)
    assert other.volume.voxels.tobytes() != first.make(0).volume.voxels.tobytes()


def test_held_out_backgrounds_are_never_used(abdomen: Background, limb: Background) -> None:
    source = HybridSource([abdomen, limb], seed=3, held_out=["sts_002_sarcoma"], augment=False,
                          lesions_per_study=(0, 0))  # fmt: skip
    assert {source.make(i).background.id for i in range(12)} == {"ts_abdomen_dicom"}
    validation = source.validation()
    assert {validation.make(i).background.id for i in range(4)} == {"sts_002_sarcoma"}
    described = source.describe()
    assert described["held_out"] == ["sts_002_sarcoma"]
    assert [b["id"] for b in described["backgrounds"]] == ["ts_abdomen_dicom"]  # type: ignore[attr-defined]
    assert described["licences"] == ["Apache-2.0 (repository LICENSE)"]
    with pytest.raises(ConfigurationError, match="not among"):
        HybridSource([abdomen], seed=1, held_out=["nope"])
    with pytest.raises(ConfigurationError, match="none is left"):
        HybridSource([abdomen], seed=1, held_out=["ts_abdomen_dicom"])
    with pytest.raises(ConfigurationError, match="held out"):
        HybridSource([abdomen], seed=1).validation()


def test_written_dataset_reads_back(limb: Background, tmp_path: Path) -> None:
    from model.measurer.data.sources import DatasetSource

    source = HybridSource([limb], seed=2, lesions_per_study=(1, 2))
    progress: list[int] = []
    dataset, report = write_hybrid_dataset(
        tmp_path / "ds", source, 2, on_item=lambda done, total, item: progress.append(done)
    )
    assert progress == [0, 1, 2] and not report
    again = read_dataset(tmp_path / "ds")
    assert len(again.series()) == 2 and len(again.findings) == len(dataset.findings)
    reader = DatasetSource(tmp_path / "ds")
    for index in range(2):
        made = source.make(index)
        uid = next(
            s.series_instance_uid
            for s in again.studies
            if s.image.path.endswith(f"_{index:05d}.nii.gz")
        )
        study = reader.study(reader.series.index(uid))
        assert np.array_equal(study.volume.voxels, made.volume.voxels)
        assert np.allclose(study.volume.geometry.affine, made.volume.geometry.affine, atol=1e-3)
        rows, _, kinds = made.findings()
        assert study.annotated == kinds
        assert sorted(float(r.long_axis_mm or 0) for r in study.findings) == pytest.approx(
            sorted(float(r.long_axis_mm or 0) for r in rows), abs=1e-3
        )
        entry = again.study(uid)
        assert entry.provenance.licence == limb.licence
        assert "sts_002_sarcoma" in entry.provenance.annotator
        assert "synthetic lesion" in entry.provenance.annotator
    before = {p.name: p.read_bytes() for p in (tmp_path / "ds").iterdir() if p.is_file()}
    write_hybrid_dataset(tmp_path / "ds", HybridSource([limb], 2, lesions_per_study=(1, 2)), 1)
    after = {p.name: p.read_bytes() for p in (tmp_path / "ds").iterdir() if p.is_file()}
    assert after == before  # study 0 again: its rows replaced by the same rows


def test_parse_sources_mixes_hybrid_with_phantoms(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RADCALIPER_SHARED_DATA", str(SHARED))
    source = parse_sources("hybrid:1,phantoms:1", 4)
    assert isinstance(source, MixedSource)
    hybrid, phantoms = source.parts
    assert isinstance(hybrid, HybridSource) and isinstance(phantoms, PhantomSource)
    assert list(source.weights) == [0.5, 0.5]
    assert not NON_COMMERCIAL & {r.id for r in hybrid.training}
    assert not any("NC" in licence for licence in hybrid.licences)
    monkeypatch.setenv("RADCALIPER_SHARED_DATA", str(tmp_path / "absent"))
    with pytest.raises(ConfigurationError, match="RADCALIPER_SHARED_DATA"):
        parse_sources("hybrid", 4)


def test_cli_writes_a_hybrid_dataset(tmp_path: Path) -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["dataset", "hybrid", "--help"])
    assert shown.exit_code == 0 and "--hold-out" in shown.output
    out = tmp_path / "cli"
    args = ["dataset", "hybrid", str(out), "--n", "1", "--seed", "5", "--shared", str(SHARED)]
    done = runner.invoke(app, [*args, "--backgrounds", "sts_008_sarcoma"])
    assert done.exit_code == 0, done.output
    assert "Wrote 1 of 1 hybrid studies" in done.output
    assert len(read_dataset(out).series()) == 1
    refused = runner.invoke(app, [*args, "--backgrounds", "lung1_001_gtv"])
    assert refused.exit_code == 2 and "licence" in refused.output
    held = runner.invoke(app, [*args, "--backgrounds", "sts_008_sarcoma", "--hold-out",
                               "sts_008_sarcoma"])  # fmt: skip
    assert held.exit_code == 2 and "held out" in held.output
