"""Readers' measurements importer (``ingestion.dataset.reads``) and the format's optional keys
(``patient_id``, ``reads``, ``mask``): small synthetic crops written here, a few real LIDC-IDRI
crops copied from the shared data at test time (skipped where the machine has none), and the
hostile inputs."""

from __future__ import annotations

import csv
import shutil
import statistics
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from ingestion.dataset.format import (
    DatasetFinding,
    DatasetStudy,
    ImageRef,
    Label,
    MaskRef,
    Provenance,
    Read,
    SourceType,
    read_dataset,
    write_import,
)
from ingestion.dataset.reads import LIDC_LICENCE, import_reads
from ingestion.errors import ConfigurationError
from ingestion.geometry import Geometry
from ingestion.load import load_path
from ingestion.volume import Modality

from tests.support.reads import (
    COLUMNS,
    SEMI_AXES_PX,
    SPACING_MM,
    row,
    shared_or_none,
    write_crop,
    write_reads_folder,
    write_table,
)

SHARED = shared_or_none()


def _voxel(geometry: Geometry, point: tuple[float, float, float]) -> tuple[int, ...]:
    return tuple(round(float(v)) for v in geometry.lps_to_index(np.asarray(point)))


def test_rows_carry_medians_reads_masks_and_patients(tmp_path: Path) -> None:
    folder = write_reads_folder(tmp_path / "reads")
    progress: list[tuple[int, int, str]] = []
    result = import_reads(folder, on_item=lambda *a: progress.append(a))
    assert result.source is SourceType.READS and result.path == str(folder.resolve())
    assert result.skipped == ()
    assert [p[:2] for p in progress] == [(0, 3), (1, 3), (2, 3)]
    assert [s.patient_id for s in result.studies] == [
        "LIDC-IDRI-0001",
        "LIDC-IDRI-0001",
        "LIDC-IDRI-0002",
    ]
    assert all(s.annotated == ("lesion",) and s.image.modality == "CT" for s in result.studies)
    first, second, _ = result.findings
    assert first.long_axis_mm == pytest.approx(8.35) and first.short_axis_mm == pytest.approx(5.35)
    assert first.reads == (Read(8.1, 5.2), Read(9.0, 6.0), Read(8.6, 5.5), Read(7.9, 5.0))
    assert second.long_axis_mm == pytest.approx(10.5) and len(second.reads) == 3
    assert first.provenance.annotator == "LIDC-IDRI readers (median of 4)"
    assert second.provenance.annotator == "LIDC-IDRI readers (median of 3)"
    assert "CC BY 3.0" in first.provenance.licence and "10.7937/K9/TCIA.2015.LO9QL9SX" in (
        first.provenance.licence
    )
    case = folder / "mask" / "LIDC-IDRI-0001_R_1.nii.gz"
    assert first.mask == MaskRef(str(case.resolve()), 1)
    # the places are the mask's: its largest slice, its centre, its long axis' end points
    volume = load_path(Path(first.image.path), nifti_modality=Modality.CT).volumes[0]
    mask = np.asarray(nib.load(case).dataobj).transpose(2, 1, 0)  # (slice, row, column)
    assert first.slice_index == 2
    assert mask[_voxel(volume.geometry, first.center_lps_mm)] == 1
    assert first.long_axis_lps_mm is not None and first.z_range_lps_mm is not None
    ends = np.asarray(first.long_axis_lps_mm)
    mask_long = 2 * SEMI_AXES_PX[0] * SPACING_MM[0]
    assert np.linalg.norm(ends[1] - ends[0]) == pytest.approx(mask_long, abs=SPACING_MM[0])
    assert first.rotation_deg == pytest.approx(0.0, abs=5.0) or first.rotation_deg == (
        pytest.approx(180.0, abs=5.0)
    )  # along the columns
    low, high = first.z_range_lps_mm
    assert high - low == pytest.approx(3 * SPACING_MM[2])


def test_reimport_is_byte_identical_and_reads_back(tmp_path: Path) -> None:
    folder = write_reads_folder(tmp_path / "reads")
    out = tmp_path / "ds"
    first = import_reads(folder)
    write_import(out, [first])
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    write_import(out, [import_reads(folder)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    dataset = read_dataset(out)

    def kept(f: DatasetFinding) -> tuple[object, ...]:
        return (f.id, f.reads, f.mask, f.long_axis_mm, f.short_axis_mm, f.slice_index)

    assert sorted(map(kept, dataset.findings)) == sorted(map(kept, first.findings))
    assert {s.patient_id for s in dataset.studies} == {"LIDC-IDRI-0001", "LIDC-IDRI-0002"}
    assert len({f.id for f in dataset.findings}) == 3


def _study(**extra: object) -> DatasetStudy:
    image, provenance = ImageRef("/img.nii.gz", "nifti"), Provenance(SourceType.MASKS, "/in")
    return DatasetStudy("1.2", "1.2.3", image, ("lesion",), provenance, **extra)  # type: ignore[arg-type]


def _lesion(**extra: object) -> DatasetFinding:
    return DatasetFinding(
        id="x",
        study_instance_uid="1.2",
        series_instance_uid="1.2.3",
        image=ImageRef("/img.nii.gz", "nifti"),
        kind="lesion",
        label=Label.FINDING,
        name="",
        center_lps_mm=(0.0, 0.0, 0.0),
        slice_index=0,
        provenance=Provenance(SourceType.MASKS, "/in"),
        long_axis_mm=10.0,
        short_axis_mm=6.0,
        **extra,  # type: ignore[arg-type]
    )


def test_rows_without_the_new_keys_are_written_as_before() -> None:
    """A dataset that uses none of patient_id, reads, mask: the lines it always had."""
    assert sorted(_study().to_json()) == [
        "annotated",
        "image",
        "provenance",
        "series_instance_uid",
        "study_instance_uid",
    ]
    assert not {"reads", "mask", "patient_id"} & set(_lesion().to_json())
    assert _study(patient_id="P1").to_json()["patient_id"] == "P1"
    written = _lesion(reads=(Read(10.0, 6.0),), mask=MaskRef("m.nii.gz", 2)).to_json()
    assert written["reads"] == [{"long_axis_mm": 10.0, "short_axis_mm": 6.0}]
    assert written["mask"] == {"label": 2, "path": "m.nii.gz"}
    assert DatasetFinding.from_json(written).mask == MaskRef("m.nii.gz", 2)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Read(-1.0, 0.5), "long_axis_mm must be > 0"),
        (lambda: Read(float("nan"), 1.0), "finite number"),
        (lambda: Read(5.0, 5.02), "exceeds its long axis"),
        (lambda: MaskRef("", 1), "mask path"),
        (lambda: MaskRef("m.nii.gz", 0), "integer >= 1"),
        (lambda: MaskRef("m.nii.gz", True), "integer >= 1"),
        (lambda: _study(patient_id=""), "patient_id"),
        (lambda: _lesion(reads=((10.0, 6.0),)), "Read values"),
        (lambda: _lesion(mask="m.nii.gz"), "MaskRef"),
    ],
)
def test_new_values_are_checked_on_construction(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]
    assert Read(5.0, 5.01).short_axis_mm == 5.01  # within the two-decimal rounding


def test_bad_rows_are_report_lines_and_the_rest_imports(tmp_path: Path) -> None:
    folder = tmp_path / "reads"
    good = row("LIDC-IDRI-0009_R_1", "LIDC-IDRI-0009", [8.0, 9.0, 8.5], [5.0, 6.0, 5.5])
    bad = {
        "A_number": row("A_number", "P", [8.0], [5.0], reads_long_mm="8.0;abc"),
        "B_count": row("B_count", "P", [8.0, 9.0], [5.0, 6.0], n_reads="3"),
        "C_median": row(
            "C_median", "P", [8.0, 9.0, 10.0], [5.0, 5.0, 5.0], median_read_long_mm="8"
        ),
        "D_short": row("D_short", "P", [8.0, 9.0], [8.5, 9.6]),
        "E_empty": row("E_empty", "P", [8.0], [5.0]),
        "F_noimage": row("F_noimage", "P", [8.0], [5.0]),
        "G_nomask": row("G_nomask", "P", [8.0], [5.0]),
        "H_grid": row("H_grid", "P", [8.0], [5.0]),
        "I_labels": row("I_labels", "P", [8.0], [5.0]),
        "J_patient": row("J_patient", " ", [8.0], [5.0]),
        "K_zero": row("K_zero", "P", [8.0], [5.0], n_reads="0"),
    }
    for case in ("LIDC-IDRI-0009_R_1", "A_number", "B_count", "C_median", "D_short", "G_nomask"):
        write_crop(folder, case)
    write_crop(folder, "E_empty", empty=True)
    write_crop(folder, "H_grid")
    write_crop(folder, "I_labels", mask_value=2)
    write_crop(folder, "unlisted")
    write_crop(folder, "F_noimage")
    (folder / "image" / "F_noimage.nii.gz").unlink()
    (folder / "mask" / "G_nomask.nii.gz").unlink()
    shifted = nib.load(folder / "mask" / "H_grid.nii.gz")
    affine = shifted.affine.copy()
    affine[0, 3] += 3.0
    nib.save(
        nib.Nifti1Image(np.asarray(shifted.dataobj), affine), folder / "mask" / "H_grid.nii.gz"
    )
    nameless = row("", "P", [8.0], [5.0])
    write_table(folder, [good, *bad.values(), nameless, good])  # the second good is left out
    result = import_reads(folder)
    assert [f.name for f in result.findings] == ["LIDC-IDRI-0009_R_1"]
    reasons = {s.item.split("(")[-1].rstrip(")"): s for s in result.skipped if s.item}
    expected = {
        "A_number": ("reads.csv", "reads_long_mm 'abc' is not a number"),
        "B_count": ("reads.csv", "n_reads is 3 but reads_long_mm has 2"),
        "C_median": ("reads.csv", "median_read_long_mm 8 is not the median of the reads (9)"),
        "D_short": ("reads.csv", "exceeds its long axis"),
        "E_empty": ("E_empty.nii.gz", "mask is empty"),
        "F_noimage": ("F_noimage.nii.gz", "no image: expected image/F_noimage.nii.gz"),
        "G_nomask": ("G_nomask.nii.gz", "no mask: expected mask/G_nomask.nii.gz"),
        "H_grid": ("H_grid.nii.gz", "mask grid differs from the image's"),
        "I_labels": ("I_labels.nii.gz", "values other than 0 and 1"),
        "no case": ("reads.csv", "must be a file name"),
        "J_patient": ("reads.csv", "patient_id is empty"),
        "K_zero": ("reads.csv", "n_reads '0' must be a whole number >= 1"),
        "LIDC-IDRI-0009_R_1": ("reads.csv", "on an earlier line too"),
    }
    assert sorted(reasons) == sorted(expected)
    for case, (file, reason) in expected.items():
        line = reasons[case]
        assert line.source is SourceType.READS
        assert Path(line.file).name == file and reason in line.reason, line.line()
        assert line.item.startswith("line ")
    unlisted = [s for s in result.skipped if not s.item]
    assert [Path(s.file).name for s in unlisted] == ["unlisted.nii.gz"]
    assert "no row in reads.csv" in unlisted[0].reason
    assert reasons["LIDC-IDRI-0009_R_1"].item == "line 15 (LIDC-IDRI-0009_R_1)"


def test_a_folder_that_is_not_a_reads_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a folder"):
        import_reads(tmp_path / "absent")
    with pytest.raises(ConfigurationError, match=r"reads\.csv: no such file; a reads folder"):
        import_reads(tmp_path)
    columns = [c for c in COLUMNS if c != "median_read_short_mm"]
    write_table(tmp_path, [row("c", "p", [8.0], [5.0])], columns)
    with pytest.raises(ConfigurationError, match="no column median_read_short_mm") as error:
        import_reads(tmp_path)
    assert str(tmp_path / "reads.csv") in str(error.value)
    write_table(tmp_path, [])
    with pytest.raises(ConfigurationError, match="no rows"):
        import_reads(tmp_path)
    (tmp_path / "reads.csv").write_bytes(b"case,patient_id\n\xff\xfe\x00bad\n")
    with pytest.raises(ConfigurationError, match="cannot be read as CSV"):
        import_reads(tmp_path)


@pytest.mark.skipif(
    SHARED is None or not (SHARED / "lidc-nodules" / "reads.csv").is_file(),
    reason="the shared LIDC-IDRI nodules are not on this machine",
)
def test_real_lidc_crops_import_with_their_reads(tmp_path: Path) -> None:
    """Three real crops (two nodules of one patient) copied from the shared data: the rows'
    medians and reads are the csv's, each centre lies in its mask."""
    assert SHARED is not None
    source = SHARED / "lidc-nodules"
    with (source / "reads.csv").open(encoding="utf-8", newline="") as handle:
        table = list(csv.DictReader(handle))
    cases = {"LIDC-IDRI-0001_R_1", "LIDC-IDRI-0012_R_1", "LIDC-IDRI-0012_R_2"}
    rows = [r for r in table if r["case"] in cases]
    folder = tmp_path / "lidc"
    for r in rows:
        for sub in ("image", "mask"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
            shutil.copy(source / sub / f"{r['case']}.nii.gz", folder / sub)
    with (folder / "reads.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(rows)
    result = import_reads(folder)
    assert result.skipped == () and len(result.findings) == 3
    assert result.findings[0].provenance.licence == LIDC_LICENCE
    by_case = {f.name: f for f in result.findings}
    for r in rows:
        found = by_case[r["case"]]
        assert found.long_axis_mm == float(r["median_read_long_mm"])
        assert found.short_axis_mm == float(r["median_read_short_mm"])
        longs = [read.long_axis_mm for read in found.reads]
        assert len(found.reads) == int(r["n_reads"])
        assert statistics.median(longs) == pytest.approx(found.long_axis_mm, abs=0.01)
        assert found.mask is not None
        volume = load_path(Path(found.image.path), nifti_modality=Modality.CT).volumes[0]
        mask = np.asarray(nib.load(found.mask.path).dataobj).transpose(2, 1, 0)
        assert mask[_voxel(volume.geometry, found.center_lps_mm)] == 1
    assert {s.patient_id for s in result.studies} == {"LIDC-IDRI-0001", "LIDC-IDRI-0012"}
