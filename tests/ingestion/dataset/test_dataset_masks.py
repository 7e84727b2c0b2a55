"""Label map importer (``ingestion.dataset.masks``): the shared real CT cases against their
truth.json, and small synthetic NIfTI / NRRD pairs for the layouts and the bad input.

Real data is read in place from ``../shared/data/real-ct/`` (skipped when absent).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import nibabel as nib
import nrrd
import numpy as np
import numpy.typing as npt
import pytest

from ingestion.dataset.format import SourceType, write_import
from ingestion.dataset.label_file import kind_of_name, read_label_file
from ingestion.dataset.masks import TRUNCATED, import_masks
from ingestion.errors import ConfigurationError
from ingestion.geometry import Geometry
from ingestion.nifti import RAS_TO_LPS, volume_to_nifti_affine

REPOSITORY = Path(__file__).resolve().parents[3]
REAL = REPOSITORY.parent / "shared" / "data" / "real-ct"


# -- the shared real CT cases ---------------------------------------------------------------------
def _ct_cases() -> list[dict[str, Any]]:
    if not (REAL / "cases.json").is_file():
        return []
    cases = json.loads((REAL / "cases.json").read_text(encoding="utf-8"))["cases"]
    return [c for c in cases if c["modality"] == "CT"]


@pytest.mark.skipif(not _ct_cases(), reason=f"shared real CT data not found at {REAL}")
@pytest.mark.parametrize("case", _ct_cases(), ids=lambda c: str(c["id"]))
def test_real_ct_case_matches_its_truth(case: dict[str, Any], tmp_path: Path) -> None:
    """Each CT case's label map, imported with its image and label_map, gives its truth.json:
    lesion long/short axes and vessel maximum diameters within one pixel, centres within two;
    a case whose image cannot load is one report line naming the image."""
    folder = REAL / case["input"].split("/")[0]
    label_file = tmp_path / "labels.json"
    label_file.write_text(json.dumps(case["label_map"]), encoding="utf-8")
    result = import_masks(
        folder / case["labels"],
        image=REAL / case["input"],
        label_file=label_file,
        modality=case["modality"],
        annotator="shared real-ct",
        licence=case["source"]["licence"],
    )
    assert result.source is SourceType.MASKS
    if case["id"] == "ts_abdomen_dicom_asis":  # the DICOM files as published: blank UIDs
        assert not result.studies and not result.findings
        (line,) = result.skipped
        assert line.file == str(REAL / case["input"])
        assert "image cannot be loaded" in line.reason and "StudyInstanceUID" in line.reason
        return
    truth = json.loads((folder / "truth.json").read_text(encoding="utf-8"))
    pixel = min(truth["grid"]["spacing_mm"][:2])
    assert result.skipped == ()
    (study,) = result.studies
    assert study.annotated == tuple(
        k for k in ("lesion", "vessel") if truth[f"{k}s_annotated"] or truth[f"{k}s"]
    )
    lesions = [f for f in result.findings if f.kind == "lesion"]
    vessels = {f.name: f for f in result.findings if f.kind == "vessel"}
    assert len(lesions) == len(truth["lesions"])
    for found, true in zip(lesions, truth["lesions"], strict=True):
        assert found.long_axis_mm == pytest.approx(true["long_axis_mm"], abs=pixel)
        assert found.short_axis_mm == pytest.approx(true["short_axis_mm"], abs=pixel)
        assert np.linalg.norm(np.subtract(found.center_lps_mm, true["center_lps_mm"])) <= 2 * pixel
        low, high = found.z_range_lps_mm  # type: ignore[misc]
        assert low <= true["z_range_lps_mm"][0] and true["z_range_lps_mm"][1] <= high
    assert sorted(vessels) == sorted(v["name"] for v in truth["vessels"])
    for true in truth["vessels"]:
        found = vessels[true["name"]]
        assert found.diameter_mm == pytest.approx(true["diameter_mm"], abs=pixel)
        assert np.linalg.norm(np.subtract(found.center_lps_mm, true["center_lps_mm"])) <= 2 * pixel
    for finding in result.findings:
        assert finding.provenance.licence == case["source"]["licence"]
        assert finding.image.path == str((REAL / case["input"]).resolve())


# -- synthetic pairs ------------------------------------------------------------------------------
GEOMETRY = Geometry(
    origin=(-30.0, -40.0, 100.0),
    row_direction=(1.0, 0.0, 0.0),
    column_direction=(0.0, 1.0, 0.0),
    slice_direction=(0.0, 0.0, 1.0),
    spacing=(2.0, 0.8, 0.7),
)
SHAPE = (14, 48, 50)  # (slices, rows, columns)


def _write_nifti(
    path: Path, array: npt.NDArray[Any], geometry: Geometry = GEOMETRY, dtype: Any = np.int16
) -> Path:
    affine = volume_to_nifti_affine(geometry)
    nib.save(nib.Nifti1Image(np.asarray(array, dtype=dtype).transpose(2, 1, 0), affine), str(path))
    return path


def _labels() -> npt.NDArray[np.int16]:
    """Label 1 (lesion): a measurable ellipsoid, a blob on the column-0 edge, a 2-voxel speck;
    label 2 (vessel): a tube through every slice."""
    s, r, c = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1], 0 : SHAPE[2]]
    labels = np.zeros(SHAPE, dtype=np.int16)
    labels[((s - 6) / 3.5) ** 2 + ((r - 20) / 9.0) ** 2 + ((c - 16) / 6.0) ** 2 <= 1] = 1
    labels[5:8, 38:42, 0:3] = 1  # touches the image edge
    labels[10, 40, 30:32] = 1  # two voxels
    labels[((r - 12) ** 2 + (c - 38) ** 2) <= 25] = 2
    return labels


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    image = _write_nifti(tmp_path / "image.nii.gz", np.zeros(SHAPE) + 40.0)
    labels = _write_nifti(tmp_path / "labels.nii.gz", _labels())
    label_file = tmp_path / "roles.json"
    label_file.write_text(json.dumps({"1": "tumour", "2": "aorta"}), encoding="utf-8")
    return image, labels, label_file


def test_synthetic_pair_imports_lesion_vessel_and_reports_the_rest(
    pair: tuple[Path, Path, Path],
) -> None:
    image, labels, label_file = pair
    result = import_masks(labels, image=image, label_file=label_file, modality="CT")
    (study,) = result.studies
    assert study.annotated == ("lesion", "vessel")
    assert study.image.format == "nifti" and study.image.modality == "CT"
    lesion, vessel = result.findings
    assert (lesion.kind, lesion.name, vessel.kind, vessel.name) == (
        "lesion",
        "tumour",
        "vessel",
        "aorta",
    )
    assert lesion.slice_index == 6
    assert lesion.long_axis_mm == pytest.approx(2 * 9.0 * 0.8, abs=0.8)
    assert lesion.short_axis_mm == pytest.approx(2 * 6.0 * 0.7, abs=0.7)
    assert lesion.provenance.item == "label 1 (tumour), component 1"
    assert vessel.diameter_mm == pytest.approx(2 * 5.0 * 0.75, abs=0.8)
    z0, z1 = GEOMETRY.origin[2], GEOMETRY.origin[2] + 2.0 * (SHAPE[0] - 1)
    assert vessel.z_range_lps_mm == pytest.approx((z0 - 1.0, z1 + 1.0))
    reasons = {s.item: s.reason for s in result.skipped}
    assert reasons == {
        "label 1 (tumour), component 2": TRUNCATED,
        "label 1 (tumour), component 3": "lesion of 2 voxels (< 3): too small to measure",
    }
    assert {s.file for s in result.skipped} == {str(labels)}


def test_import_twice_gives_identical_files(pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    image, labels, label_file = pair
    contents = []
    for name in ("one", "two"):
        result = import_masks(labels, image=image, label_file=label_file, modality="CT")
        write_import(tmp_path / name, [result])
        write_import(tmp_path / name, [result])  # again into the same folder: replaced
        contents.append({p.name: p.read_bytes() for p in sorted((tmp_path / name).iterdir())})
    assert contents[0] == contents[1]
    assert contents[0]["findings.jsonl"].count(b"\n") == 2


def test_one_label_map_on_two_images_is_two_inputs(
    pair: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Two images may share a label map (two copies of a series): importing it on the second
    image adds that image's rows and keeps the first's (bench_real found the second replacing
    the first when the input was the label map alone)."""
    image, labels, label_file = pair
    copy = _write_nifti(tmp_path / "copy.nii.gz", np.zeros(SHAPE) + 41.0)  # another file: UIDs
    first = import_masks(labels, image=image, label_file=label_file, modality="CT")
    second = import_masks(labels, image=copy, label_file=label_file, modality="CT")
    assert first.path == f"{labels.resolve()} on {image.resolve()}" != second.path
    dataset = write_import(tmp_path / "ds", [first])
    dataset = write_import(tmp_path / "ds", [second])
    assert len(dataset.series()) == 2 and len(dataset.findings) == 4
    again = write_import(tmp_path / "ds", [second])  # the same pair again: replaced, not added
    assert len(again.findings) == 4


def test_flipped_and_permuted_label_map_is_the_same_grid(
    pair: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Stored with its axes in another order and flipped: mapped back, nothing resampled."""
    image, labels, label_file = pair
    direct = import_masks(labels, image=image, label_file=label_file, modality="CT")
    data = _labels().transpose(2, 1, 0)  # (i, j, k) as NIfTI stores it
    affine = volume_to_nifti_affine(GEOMETRY)
    flipped = data[::-1, :, ::-1].transpose(1, 0, 2)  # flip i and k, then swap i and j
    n_i, n_k = data.shape[0], data.shape[2]
    moved = affine.copy()
    moved[:3, 3] = affine[:3, :3] @ [n_i - 1, 0, n_k - 1] + affine[:3, 3]
    moved[:3, 0], moved[:3, 2] = -affine[:3, 0], -affine[:3, 2]
    moved = moved[:, [1, 0, 2, 3]]
    other = tmp_path / "other.nii.gz"
    nib.save(nib.Nifti1Image(flipped.astype(np.int16), moved), str(other))
    result = import_masks(other, image=image, label_file=label_file, modality="CT")
    assert [f.to_json()["long_axis_mm"] for f in result.findings] == [
        f.to_json()["long_axis_mm"] for f in direct.findings
    ]
    assert [f.center_lps_mm for f in result.findings] == [f.center_lps_mm for f in direct.findings]


def test_label_map_on_another_grid_is_skipped(
    pair: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    image, _, label_file = pair
    shifted = Geometry(
        origin=(-30.0, -40.0, 101.0),  # half a slice off
        row_direction=GEOMETRY.row_direction,
        column_direction=GEOMETRY.column_direction,
        slice_direction=GEOMETRY.slice_direction,
        spacing=GEOMETRY.spacing,
    )
    labels = _write_nifti(tmp_path / "shifted.nii.gz", _labels(), shifted)
    coarse = _write_nifti(tmp_path / "coarse.nii.gz", _labels()[:, ::2, ::2])
    for path, words in ((labels, "1.000 mm from the image's"), (coarse, "voxels along")):
        result = import_masks(path, image=image, label_file=label_file, modality="CT")
        assert not result.studies and not result.findings
        (line,) = result.skipped
        assert line.file == str(path)
        assert line.reason.startswith("label map grid differs from the image's: ")
        assert words in line.reason and line.reason.endswith("nothing is resampled")


def test_nrrd_label_map_on_a_nifti_image(pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """An NRRD label map (LPS, as 3D Slicer writes them), read with MONAI's NrrdReader."""
    image, labels, label_file = pair
    lps = RAS_TO_LPS @ volume_to_nifti_affine(GEOMETRY)  # LPS over (i, j, k)
    path = tmp_path / "labels.seg.nrrd"
    header = {
        "space": "left-posterior-superior",
        "space directions": lps[:3, :3].T,
        "space origin": lps[:3, 3],
    }
    nrrd.write(str(path), _labels().transpose(2, 1, 0).astype(np.uint8), header)
    from_nrrd = import_masks(path, image=image, label_file=label_file, modality="CT")
    from_nifti = import_masks(labels, image=image, label_file=label_file, modality="CT")
    assert [f.long_axis_mm for f in from_nrrd.findings] == [
        f.long_axis_mm for f in from_nifti.findings
    ]
    assert [f.diameter_mm for f in from_nrrd.findings] == [
        f.diameter_mm for f in from_nifti.findings
    ]
    assert len(from_nrrd.skipped) == 2


def test_folders_of_cases_and_the_decathlon_layout(tmp_path: Path) -> None:
    cases = tmp_path / "cases"
    for value, name in enumerate(("b", "a")):
        (cases / name).mkdir(parents=True)
        _write_nifti(cases / name / "image.nii.gz", np.zeros(SHAPE) + value)
        _write_nifti(cases / name / "labels.nii.gz", _labels())
    (cases / "c").mkdir()  # an image without labels: not a case
    _write_nifti(cases / "c" / "image.nii.gz", np.zeros(SHAPE))
    (cases / "d").mkdir()  # labels without an image: reported
    _write_nifti(cases / "d" / "labels.nii.gz", _labels())
    roles = tmp_path / "roles.json"
    roles.write_text(json.dumps({"1": "lesion"}), encoding="utf-8")
    result = import_masks(cases, label_file=roles, modality="CT")
    assert len(result.studies) == 2
    assert [f.kind for f in result.findings] == ["lesion", "lesion"]
    assert [s.file for s in result.skipped if s.item == ""] == [str(cases / "d" / "labels.nii.gz")]

    msd = tmp_path / "Task03_Liver"
    (msd / "imagesTr").mkdir(parents=True)
    (msd / "labelsTr").mkdir()
    _write_nifti(msd / "imagesTr" / "liver_1.nii.gz", np.zeros(SHAPE), dtype=np.float32)
    _write_nifti(msd / "labelsTr" / "liver_1.nii.gz", np.where(_labels() == 1, 2, 0))
    info = {"labels": {"0": "background", "1": "liver", "2": "cancer"}}
    (msd / "dataset.json").write_text(json.dumps(info), encoding="utf-8")
    result = import_masks(msd, modality="CT")  # dataset.json is the label file
    (study,) = result.studies
    assert study.annotated == ("lesion",)
    assert [(f.name, f.provenance.item) for f in result.findings] == [
        ("cancer", "label 2 (cancer), component 1")
    ]


def test_label_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def read(data: object) -> dict[int, tuple[str, str]]:
        path = tmp_path / "labels.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        return dict(read_label_file(path))

    assert read({"1": "lesion", "2": "vessel"}) == {
        1: ("lesion", "lesion"),
        2: ("vessel", "vessel"),
    }
    assert read(
        {
            "5": {"name": "liver", "role": "organ"},
            "52": {"name": "aorta", "role": "target_vessel"},
            "63": {"name": "inferior_vena_cava", "role": "other_vessel"},
            "1": {"name": "GTV-1", "role": "lesion"},
        }
    ) == {52: ("aorta", "vessel"), 63: ("inferior_vena_cava", "vessel"), 1: ("GTV-1", "lesion")}
    with caplog.at_level(logging.INFO, logger="ingestion.dataset.label_file"):
        roles = read({"52": "aorta", "64": "portal_vein_and_splenic_vein", "3": "kidney_left"})
    assert roles == {52: ("aorta", "vessel"), 64: ("portal_vein_and_splenic_vein", "vessel")}
    assert "label 3 (kidney_left): neither a lesion nor a vessel: ignored" in caplog.text
    assert read({"labels": {"0": "background", "1": "liver", "2": "cancer"}}) == {
        2: ("cancer", "lesion")
    }
    assert read({"labels": {"background": 0, "pancreas": 1, "tumour": 2}}) == {
        2: ("tumour", "lesion")
    }
    assert [
        kind_of_name(n) for n in ("lung nodule", "liver_tumor", "hepatic_vessel", "spleen")
    ] == [
        "lesion",
        "lesion",
        "vessel",
        None,
    ]
    with pytest.raises(ConfigurationError, match="names no lesion and no vessel"):
        read({"1": "kidney_left", "2": {"name": "liver", "role": "organ"}})
    with pytest.raises(ConfigurationError, match="unknown role"):
        read({"1": {"name": "x", "role": "lesoin"}})
    with pytest.raises(ConfigurationError, match="not a label value"):
        read({"one": "lesion"})


def test_without_a_label_file_or_an_image(pair: tuple[Path, Path, Path]) -> None:
    image, labels, _ = pair
    with pytest.raises(ConfigurationError, match="a label file is needed"):
        import_masks(labels, image=image, modality="CT")
    with pytest.raises(ConfigurationError, match="give the image"):
        import_masks(labels, label_file=labels.parent / "roles.json")


def test_nrrd_image_with_seg_nrrd_labels_imports_as_its_nifti_pair(
    pair: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A 3D Slicer case folder (image.nrrd + labels.seg.nrrd, LPS) gives the NIfTI pair's rows,
    and training's loader reads its image back."""
    from ingestion.dataset.format import read_dataset
    from model.measurer.data.sources import load_dataset_volume

    image, labels, label_file = pair
    lps = RAS_TO_LPS @ volume_to_nifti_affine(GEOMETRY)  # LPS over (i, j, k)
    header = {
        "space": "left-posterior-superior",
        "space directions": lps[:3, :3].T,
        "space origin": lps[:3, 3],
    }
    case = tmp_path / "slicer" / "case_1"
    case.mkdir(parents=True)
    image_values = (np.zeros(SHAPE) + 40.0).transpose(2, 1, 0).astype(np.int16)
    nrrd.write(str(case / "image.nrrd"), image_values, header)
    nrrd.write(str(case / "labels.seg.nrrd"), _labels().transpose(2, 1, 0).astype(np.uint8), header)
    from_nrrd = import_masks(case.parent, label_file=label_file, modality="CT")
    from_nifti = import_masks(labels, image=image, label_file=label_file, modality="CT")
    (study,) = from_nrrd.studies
    assert study.image.format == "nrrd" and study.image.modality == "CT"
    assert study.image.path == str((case / "image.nrrd").resolve())
    assert study.annotated == from_nifti.studies[0].annotated

    # the same rows but for what names the input (ids, image, UIDs derived from the file), and
    # numbers within 1e-5 mm (the NIfTI affine is float32, NRRD's float64)
    left_out = {"id", "image", "provenance", "study_instance_uid", "series_instance_uid"}
    assert len(from_nrrd.findings) == len(from_nifti.findings) == 2
    for got, want in zip(from_nrrd.findings, from_nifti.findings, strict=True):
        assert got.provenance.item == want.provenance.item
        got_row, want_row = got.to_json(), want.to_json()
        assert got_row.keys() == want_row.keys()
        for key in got_row.keys() - left_out:
            if isinstance(want_row[key], float | list):
                np.testing.assert_allclose(got_row[key], want_row[key], atol=1e-5, err_msg=key)
            else:
                assert got_row[key] == want_row[key], key
    assert [(s.item, s.reason) for s in from_nrrd.skipped] == [
        (s.item, s.reason) for s in from_nifti.skipped
    ]
    write_import(tmp_path / "dataset", [from_nrrd])
    dataset = read_dataset(tmp_path / "dataset")
    volume = load_dataset_volume(dataset, study.series_instance_uid)
    np.testing.assert_array_equal(volume.voxels, np.full(SHAPE, 40.0, dtype=np.float32))
    np.testing.assert_allclose(volume.affine, GEOMETRY.affine, atol=1e-9)
