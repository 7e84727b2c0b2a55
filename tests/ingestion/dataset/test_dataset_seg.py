"""DICOM SEG import (``ingestion.dataset.seg``): segmentations built with highdicom from the shared
real CT cases' masks (``../shared/data/real-ct/``: labels.nii.gz on the DICOM series' grid) as
BINARY, FRACTIONAL and LABELMAP objects; the imported lesions and vessels agree with each case's
truth.json, segments that are neither are ignored, and a SEG whose series is missing or whose
frames are off the series' grid is a Skipped line while the rest imports.

The data is read in place (never copied into the repository); the image folders the importer
scans are links to the cases' files.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import highdicom as hd
import numpy as np
import pytest
from pydicom import Dataset, dcmread
from pydicom.sr.codedict import codes

from ingestion.dataset.format import SourceType
from ingestion.dataset.seg import import_seg
from ingestion.nifti import load_nifti
from ingestion.scan import scan_path

from tests.support.series import fixed_uid

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "real-ct"
pytestmark = pytest.mark.skipif(
    not (DATA / "cases.json").is_file(), reason=f"the shared real CT cases are not at {DATA}"
)
LESION = codes.SCT.MorphologicallyAbnormalStructure
ANATOMY = codes.SCT.AnatomicalStructure


@dataclass(frozen=True)
class Segment:
    value: int  # the label value in the case's labels.nii.gz
    label: str
    category: Any
    type: Any


# case -> (segmentation type, segments)
SEGS: dict[str, tuple[str, tuple[Segment, ...]]] = {
    "lidc0314_nodule": ("FRACTIONAL", (Segment(1, "nodule", LESION, codes.SCT.Nodule),)),
    "lung1_001_gtv": (
        "LABELMAP",
        (
            Segment(1, "GTV-1", LESION, codes.SCT.Neoplasm),
            Segment(2, "Lung-Left", ANATOMY, codes.SCT.Lung),
            Segment(3, "Lung-Right", ANATOMY, codes.SCT.Lung),
            Segment(4, "Spinal-Cord", ANATOMY, codes.SCT.SpinalCord),
        ),
    ),
    "ts_abdomen_dicom": (
        "BINARY",
        (
            Segment(5, "liver", ANATOMY, codes.SCT.Liver),
            Segment(52, "aorta", ANATOMY, codes.SCT.Aorta),
            Segment(63, "inferior_vena_cava", ANATOMY, codes.SCT.InferiorVenaCava),
        ),
    ),
}


def _headers(case: str) -> list[Dataset]:
    (series,) = scan_path(DATA / case / "dicom").series
    return [dcmread(s.path, stop_before_pixels=True) for s in series.slices]


def _write_seg(case: str, path: Path) -> Path:
    """The case's mask as a DICOM SEG of its series (segment i+1 = SEGS[case][1][i])."""
    kind, segments = SEGS[case]
    headers = _headers(case)
    labels = np.rint(load_nifti(DATA / case / "labels.nii.gz").voxels).astype(np.int32)
    masks = np.stack([labels == s.value for s in segments], axis=-1)  # (S, R, C, segments)
    if kind == "LABELMAP":
        pixels: np.ndarray = np.zeros(labels.shape, dtype=np.uint8)
        for i in range(len(segments)):
            pixels[masks[..., i]] = i + 1
    elif kind == "FRACTIONAL":
        pixels = masks.astype(np.float32)
    else:
        pixels = masks.astype(np.uint8)
    descriptions = [
        hd.seg.SegmentDescription(
            segment_number=i + 1,
            segment_label=s.label,
            segmented_property_category=s.category,
            segmented_property_type=s.type,
            algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL,
        )
        for i, s in enumerate(segments)
    ]
    with warnings.catch_warnings():  # the real cases' patient names ("LUNG1-001") are as found
        warnings.filterwarnings("ignore", "The string .* unlikely to represent", UserWarning)
        seg = hd.seg.Segmentation(
            source_images=headers,
            pixel_array=pixels,
            segmentation_type=kind,
            segment_descriptions=descriptions,
            series_instance_uid=fixed_uid("seg series", case),
            series_number=300,
            sop_instance_uid=fixed_uid("seg", case),
            instance_number=1,
            manufacturer="test",
            manufacturer_model_name="seg writer",
            software_versions="1",
            device_serial_number="1",
            content_creator_name="Doe^Jane",
        )
    seg.ContentDate, seg.ContentTime = "20240305", "141516"
    path.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(path, enforce_file_format=True)
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of links to the cases' image files."""
    root = tmp_path_factory.mktemp("images")
    for case in SEGS:
        (root / case).mkdir()
        for f in sorted((DATA / case / "dicom").iterdir()):
            (root / case / f.name).symlink_to(f)
    return root


@pytest.fixture(scope="module")
def segs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("segs")
    for case in SEGS:
        _write_seg(case, root / case / "seg.dcm")
    (root / "notes.txt").write_text("not DICOM", encoding="utf-8")
    return root


def _truth(case: str) -> dict[str, Any]:
    return json.loads((DATA / case / "truth.json").read_text(encoding="utf-8"))


def _pixel(case: str) -> float:
    return float(_truth(case)["grid"]["spacing_mm"][0])


# -- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["lidc0314_nodule", "lung1_001_gtv"])
def test_a_lesion_segment_agrees_with_the_truth(case: str, segs: Path, images: Path) -> None:
    done = import_seg(segs / case / "seg.dcm", images=images / case, licence="CC BY")
    assert done.source is SourceType.SEG and not done.skipped
    (truth,) = _truth(case)["lesions"]
    (lesion,) = done.findings  # the organs' segments are ignored
    pixel = _pixel(case)
    assert lesion.kind == "lesion"
    assert lesion.long_axis_mm == pytest.approx(truth["long_axis_mm"], abs=pixel)
    assert lesion.short_axis_mm == pytest.approx(truth["short_axis_mm"], abs=pixel)
    assert lesion.slice_index == truth["slice_index"]
    np.testing.assert_allclose(lesion.center_lps_mm, truth["center_lps_mm"], atol=1.5 * pixel)
    half_slice = _truth(case)["grid"]["spacing_mm"][2] / 2  # slice centres or slice edges
    assert lesion.z_range_lps_mm == pytest.approx(truth["z_range_lps_mm"], abs=half_slice + 0.01)
    assert lesion.provenance.annotator == "Jane Doe" and lesion.provenance.licence == "CC BY"
    assert lesion.provenance.annotated_at == "2024-03-05T14:15:16"
    (study,) = done.studies
    assert study.annotated == ("lesion",)
    assert study.series_instance_uid == lesion.series_instance_uid
    assert study.image.path == str((images / case).resolve())


def test_vessel_segments_agree_with_the_truth(segs: Path, images: Path) -> None:
    case = "ts_abdomen_dicom"
    done = import_seg(segs / case / "seg.dcm", images=images / case)
    assert not done.skipped
    truth = {v["name"]: v for v in _truth(case)["vessels"]}
    found = {f.name: f for f in done.findings}
    assert set(found) == {"aorta", "inferior_vena_cava"}  # not the liver
    for name, vessel in found.items():
        assert vessel.kind == "vessel"
        assert vessel.diameter_mm == pytest.approx(truth[name]["diameter_mm"], abs=_pixel(case))
        np.testing.assert_allclose(
            vessel.center_lps_mm, truth[name]["center_lps_mm"], atol=_pixel(case)
        )
    (study,) = done.studies
    assert study.annotated == ("vessel",)


def test_a_seg_whose_series_is_missing_is_reported_and_the_rest_imports(
    segs: Path, images: Path
) -> None:
    done = import_seg(segs, images=images / "ts_abdomen_dicom")
    assert {f.name for f in done.findings} == {"aorta", "inferior_vena_cava"}
    assert all(f.provenance.item.startswith("ts_abdomen_dicom/seg.dcm, ") for f in done.findings)
    lines = {Path(s.file).parent.name: s.reason for s in done.skipped}
    under = (images / "ts_abdomen_dicom").resolve()
    for case in ("lidc0314_nodule", "lung1_001_gtv"):
        uid = _headers(case)[0].SeriesInstanceUID
        assert lines[case] == f"referenced series {uid} not found under {under}"
    assert len(done.skipped) == 2


def _edited(source: Path, target: Path, edit: Any) -> Path:
    seg = dcmread(source)
    for i, frame in enumerate(seg.PerFrameFunctionalGroupsSequence):
        edit(i, frame)
    target.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(target, enforce_file_format=True)
    return target


def test_frames_are_placed_by_position_and_refused_off_the_grid(
    segs: Path, images: Path, tmp_path: Path
) -> None:
    case = "lidc0314_nodule"
    source = segs / case / "seg.dcm"
    expected = import_seg(source, images=images / case).findings[0]

    def no_source(_: int, frame: Dataset) -> None:
        del frame.DerivationImageSequence

    by_position = _edited(source, tmp_path / "by_position.dcm", no_source)
    (found,) = import_seg(by_position, images=images / case).findings
    assert found.to_json() | {"id": "", "provenance": {}} == expected.to_json() | {
        "id": "",
        "provenance": {},
    }

    def shifted(i: int, frame: Dataset) -> None:
        if i == 3:
            position = frame.PlanePositionSequence[0].ImagePositionPatient
            frame.PlanePositionSequence[0].ImagePositionPatient = [
                float(position[0]) + 0.5,
                *position[1:],
            ]

    off_grid = _edited(source, tmp_path / "off_grid.dcm", shifted)
    done = import_seg(off_grid, images=images / case)
    assert not done.findings and not done.studies
    (line,) = done.skipped
    assert line.item == "" and "frame 4: plane position" in line.reason
    assert "0.500 mm from slice" in line.reason and "never resampled" in line.reason


def test_importing_twice_gives_identical_rows(segs: Path, images: Path) -> None:
    first, second = (import_seg(segs, images=images) for _ in range(2))
    assert not first.skipped
    assert [f.to_json() for f in first.findings] == [f.to_json() for f in second.findings]
    assert [s.to_json() for s in first.studies] == [s.to_json() for s in second.studies]
    assert len({f.id for f in first.findings}) == len(first.findings) == 4


def test_a_label_file_decides_the_roles(segs: Path, images: Path, tmp_path: Path) -> None:
    """By segment label (TotalSegmentator's label value 63 is not a segment number here) or by
    segment number; segments the file does not name are ignored."""
    case = "ts_abdomen_dicom"
    both = tmp_path / "both.json"
    both.write_text(
        json.dumps({"63": "inferior_vena_cava", "2": {"name": "main vessel", "role": "vessel"}}),
        encoding="utf-8",
    )
    done = import_seg(segs / case / "seg.dcm", images=images / case, label_file=both)
    assert {f.name for f in done.findings} == {"aorta", "inferior_vena_cava"}
    only = tmp_path / "only.json"
    only.write_text(json.dumps({"63": "inferior_vena_cava"}), encoding="utf-8")
    done = import_seg(segs / case / "seg.dcm", images=images / case, label_file=only)
    assert [f.name for f in done.findings] == ["inferior_vena_cava"]
    assert done.studies[0].annotated == ("vessel",)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"9": "lesion"}), encoding="utf-8")
    done = import_seg(segs / case / "seg.dcm", images=images / case, label_file=elsewhere)
    assert not done.findings and not done.studies
    (line,) = done.skipped
    assert line.reason.startswith("no segment is a lesion or a vessel (1 Liver, 2 Aorta, 3 ")
