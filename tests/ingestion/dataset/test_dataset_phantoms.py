"""Phantom folders as a dataset: rows equal to the generator's truth, end points that give the
rotation back, idempotent imports, and bad study folders as lines of the import report."""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ingestion.dataset.format import (
    DatasetFinding,
    Label,
    SourceType,
    read_dataset,
    write_import,
)
from ingestion.dataset.phantoms import DEFAULT_LICENCE, import_phantoms
from ingestion.errors import ConfigurationError
from ingestion.phantoms import (
    PhantomSpec,
    TruthFinding,
    generate_phantom,
    study_seed,
    write_phantoms,
)

SEED = 11
N = 4
#: small and quick: 48 x 48 pixels, 8-10 slices (a study is written in a few ms)
SPEC = PhantomSpec(
    matrix_size=(48, 48),
    pixel_spacing_mm=(1.5, 1.5),
    slice_count=(8, 10),
    slice_spacings_mm=(2.0, 2.5),
    lesion_long_axis_mm=(6.0, 14.0),
    vessel_diameter_mm=(5.0, 9.0),
    fat_thickness_mm=(2.0, 4.0),
)


@pytest.fixture
def phantom_dir(tmp_path: Path) -> Path:
    out = tmp_path / "phantoms"
    write_phantoms(out, n=N, seed=SEED, spec=SPEC)
    return out


def _length(segment: tuple[tuple[float, ...], tuple[float, ...]]) -> float:
    return math.dist(segment[0], segment[1])


def _midpoint(segment: tuple[tuple[float, ...], tuple[float, ...]]) -> tuple[float, ...]:
    return tuple((a + b) / 2 for a, b in zip(*segment, strict=True))


def _direction(segment: tuple[tuple[float, ...], tuple[float, ...]]) -> tuple[float, ...]:
    return tuple((b - a) / _length(segment) for a, b in zip(*segment, strict=True))


def _angle_gap(a: float, b: float) -> float:
    """Difference of two axis angles (modulo 180 degrees)."""
    gap = abs(a - b) % 180.0
    return min(gap, 180.0 - gap)


def _assert_row_is_truth(row: DatasetFinding, truth: TruthFinding) -> None:
    assert row.kind == truth.kind and row.label is Label.FINDING
    assert row.center_lps_mm == truth.center_lps_mm
    assert row.slice_index == truth.slice_index
    assert row.z_range_lps_mm == truth.z_range_lps_mm
    if truth.kind == "lesion":
        assert (row.long_axis_mm, row.short_axis_mm) == (truth.long_axis_mm, truth.short_axis_mm)
        assert row.diameter_mm is None and row.diameter_lps_mm is None
        assert row.long_axis_lps_mm is not None and row.short_axis_lps_mm is not None
        assert truth.rotation_deg is not None and row.rotation_deg is not None
        assert _angle_gap(row.rotation_deg, truth.rotation_deg) < 1e-9
        assert row.cc_extent_mm == pytest.approx(truth.cc_extent_mm, abs=1e-9)
        for segment, length in (
            (row.long_axis_lps_mm, truth.long_axis_mm),
            (row.short_axis_lps_mm, truth.short_axis_mm),
        ):
            assert _length(segment) == pytest.approx(length, abs=1e-9)
            assert _midpoint(segment) == pytest.approx(truth.center_lps_mm, abs=1e-9)
            assert segment[0][2] == segment[1][2] == truth.center_lps_mm[2]  # axial
        long_dir, short_dir = _direction(row.long_axis_lps_mm), _direction(row.short_axis_lps_mm)
        assert sum(a * b for a, b in zip(long_dir, short_dir, strict=True)) == pytest.approx(
            0.0, abs=1e-12
        )
    else:
        assert row.diameter_mm == truth.diameter_mm
        assert row.long_axis_mm is None and row.short_axis_mm is None
        assert row.rotation_deg is None and row.z_range_lps_mm is None
        assert row.diameter_lps_mm is not None
        assert _length(row.diameter_lps_mm) == pytest.approx(truth.diameter_mm, abs=1e-9)
        assert _midpoint(row.diameter_lps_mm) == pytest.approx(truth.center_lps_mm, abs=1e-9)
        assert _direction(row.diameter_lps_mm) == pytest.approx((1.0, 0.0, 0.0), abs=1e-12)


def test_rows_are_the_generators_truth(phantom_dir: Path) -> None:
    result = import_phantoms(phantom_dir)
    root = str(phantom_dir.resolve())
    assert (result.source, result.path, result.skipped) == (SourceType.PHANTOMS, root, ())
    assert len(result.studies) == N
    kinds: set[str] = set()
    for index, study in enumerate(result.studies):
        phantom = generate_phantom(study_seed(SEED, index), SPEC)
        folder = phantom_dir.resolve() / f"phantom_{index:04d}"
        assert (study.study_instance_uid, study.series_instance_uid) == (
            phantom.study_instance_uid,
            phantom.series_instance_uid,
        )
        assert (study.image.path, study.image.format, study.image.modality) == (
            str(folder / "dicom"),
            "dicom",
            "CT",
        )
        assert study.annotated == ("lesion", "vessel")
        rows = [f for f in result.findings if f.series_instance_uid == study.series_instance_uid]
        assert len(rows) == len(phantom.findings) >= 1
        for number, (row, truth) in enumerate(zip(rows, phantom.findings, strict=True), 1):
            _assert_row_is_truth(row, truth)
            kinds.add(row.kind)
            assert row.image == study.image
            assert row.study_instance_uid == phantom.study_instance_uid
            assert row.name == f"{truth.kind} {number}"
            provenance = row.provenance
            assert (provenance.source, provenance.path, provenance.item) == (
                SourceType.PHANTOMS,
                root,
                f"phantom_{index:04d} finding {number}",
            )
            assert provenance.annotator.startswith("phantom generator (radcaliper ")
            assert provenance.licence == DEFAULT_LICENCE
    assert kinds == {"lesion", "vessel"}  # both kinds are exercised


@pytest.mark.parametrize("rotation", [0.0, 1e-7, 45.0, 90.0, 135.5, 179.999])
def test_the_end_points_give_the_rotation_back(phantom_dir: Path, rotation: float) -> None:
    truth_path = phantom_dir / "phantom_0000" / "truth.json"
    data = json.loads(truth_path.read_text())
    lesion = data["findings"][0]  # lesions come first
    assert lesion["kind"] == "lesion"
    lesion["rotation_deg"] = rotation
    truth_path.write_text(json.dumps(data))
    row = import_phantoms(phantom_dir).findings[0]
    assert row.rotation_deg is not None
    assert _angle_gap(row.rotation_deg, rotation) < 1e-9
    _assert_row_is_truth(row, TruthFinding(**lesion))


def test_importing_twice_gives_the_same_rows_and_files(phantom_dir: Path, tmp_path: Path) -> None:
    first, again = import_phantoms(phantom_dir), import_phantoms(phantom_dir)
    assert first == again
    assert len({f.id for f in first.findings}) == len(first.findings)
    one, two = tmp_path / "one", tmp_path / "two"
    write_import(one, [first])
    write_import(two, [again])
    write_import(two, [import_phantoms(phantom_dir)])  # replaces its own rows
    for name in ("dataset.json", "studies.jsonl", "findings.jsonl", "import_report.jsonl"):
        assert (one / name).read_bytes() == (two / name).read_bytes()
    dataset = read_dataset(one)  # centres are written rounded to 0.1 um: compare the JSON
    written = {f.id: f.to_json() for f in dataset.findings}
    assert written == {f.id: f.to_json() for f in first.findings}


def test_no_image_is_read(phantom_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pydicom

    import ingestion.load

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the phantom import read an image")

    monkeypatch.setattr(ingestion.load, "load_path", refuse)
    monkeypatch.setattr(pydicom, "dcmread", refuse)
    assert len(import_phantoms(phantom_dir).studies) == N


def _not_json(folder: Path) -> None:
    (folder / "truth.json").write_text("{ not json")


def _finding_without_axis(folder: Path) -> None:
    data = json.loads((folder / "truth.json").read_text())
    data["findings"][0].pop("long_axis_mm" if data["findings"][0]["kind"] == "lesion" else "hu")
    (folder / "truth.json").write_text(json.dumps(data))


def _other_format_version(folder: Path) -> None:
    data = json.loads((folder / "truth.json").read_text())
    data["format_version"] = 99
    (folder / "truth.json").write_text(json.dumps(data))


def _slice_outside(folder: Path) -> None:
    data = json.loads((folder / "truth.json").read_text())
    data["findings"][0]["slice_index"] = len(data["sop_instance_uids"])
    (folder / "truth.json").write_text(json.dumps(data))


def _no_image(folder: Path) -> None:
    shutil.rmtree(folder / "dicom")


def _missing_slice(folder: Path) -> None:
    next(iter(sorted((folder / "dicom").iterdir()))).unlink()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_not_json, "not a readable phantom truth.json"),
        (_finding_without_axis, "finding 1 of truth.json"),
        (_other_format_version, "format version 99"),
        (_slice_outside, r"slice (\d+) of a series of \1 slices"),
        (_no_image, "no image"),
        (_missing_slice, "holds .* files but truth.json lists"),
    ],
)
def test_a_bad_study_is_a_report_line_and_the_rest_imports(
    phantom_dir: Path, damage: Callable[[Path], None], reason: str
) -> None:
    bad = phantom_dir / "phantom_0001"
    damage(bad)
    result = import_phantoms(phantom_dir)
    (line,) = result.skipped
    assert (line.source, line.file, line.item) == (
        SourceType.PHANTOMS,
        str(bad.resolve() / "truth.json"),
        "",
    )
    assert re.search(reason, line.reason), line.reason
    assert line.line() == f"{bad.resolve() / 'truth.json'}: {line.reason}"
    assert len(result.studies) == N - 1
    bad_uid = generate_phantom(study_seed(SEED, 1), SPEC).series_instance_uid
    assert bad_uid not in {s.series_instance_uid for s in result.studies}
    assert bad_uid not in {f.series_instance_uid for f in result.findings}


def test_a_nifti_only_study_refers_to_its_nifti(tmp_path: Path) -> None:
    out = tmp_path / "phantoms"
    write_phantoms(out, n=2, seed=SEED, spec=SPEC, nifti=True)
    shutil.rmtree(out / "phantom_0001" / "dicom")
    studies = import_phantoms(out).studies
    assert [(s.image.format, Path(s.image.path).name) for s in studies] == [
        ("dicom", "dicom"),  # DICOM first where both are there: its UIDs are truth.json's
        ("nifti", "image.nii.gz"),
    ]


def test_a_copied_study_is_imported_once(phantom_dir: Path) -> None:
    shutil.copytree(phantom_dir / "phantom_0002", phantom_dir / "zz_copy" / "phantom_0002")
    result = import_phantoms(phantom_dir)
    assert len(result.studies) == N
    (line,) = result.skipped
    assert "was already imported from" in line.reason
    assert line.file.endswith("zz_copy/phantom_0002/truth.json")


def test_one_study_folder_imports_alone(phantom_dir: Path) -> None:
    result = import_phantoms(phantom_dir / "phantom_0003")
    assert len(result.studies) == 1
    assert result.findings[0].provenance.item == "finding 1"


def test_a_folder_without_phantoms_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"holds no study with a truth\.json"):
        import_phantoms(tmp_path)
    with pytest.raises(ConfigurationError, match="is not a folder of phantoms"):
        import_phantoms(tmp_path / "absent")


def test_the_licence_is_given_or_the_default(phantom_dir: Path) -> None:
    result = import_phantoms(phantom_dir, licence="CC0 1.0")
    assert {f.provenance.licence for f in result.findings} == {"CC0 1.0"}
    assert {s.provenance.licence for s in result.studies} == {"CC0 1.0"}
    with pytest.raises(ConfigurationError, match="licence must not be empty"):
        import_phantoms(phantom_dir, licence=" ")
