"""The batch's ingestion side: one file's catalog entry (image / skipped / rejected), the work
index on disk (streaming scan, unchanged files not read again, generations) and the series
selection rules."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydicom.dataset import Dataset

from ingestion.catalog import FileRecord, FileStatus, catalog_file
from ingestion.scan import scan_files
from ingestion.selection import NoteKind, SelectionRules, StudyPlan, plan_study
from ingestion.work_index import WorkIndex

from tests.support.series import SeriesFactory


def test_an_image_is_cataloged_with_what_selection_needs(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    written = write_series(tmp_path / "s", n=3, gap=2.5, pixel_spacing=(0.7, 0.8))
    record = catalog_file(written.paths[1])
    assert record.status is FileStatus.IMAGE and record.reason == ""
    image = record.image
    assert image is not None
    assert (image.study_instance_uid, image.series_instance_uid) == (
        written.study_uid,
        written.series_uid,
    )
    assert image.modality == "CT" and image.image_type == "ORIGINAL\\PRIMARY\\AXIAL"
    assert image.axial and not image.derived and image.planes == 1
    assert image.depth_min_mm == image.depth_max_mm == pytest.approx(30.0 + 2.5)
    assert image.pixel_spacing_mm == pytest.approx(0.8)
    assert image.nominal_thickness_mm == pytest.approx(2.5)
    assert record.size == written.paths[1].stat().st_size


@pytest.mark.parametrize(
    ("name", "content", "status", "words"),
    [
        ("notes.txt", b"a note", FileStatus.SKIPPED, "not DICOM (a .txt file)"),
        ("index.HTML", b"<html>", FileStatus.SKIPPED, "not DICOM (a .HTML file)"),
        ("image.nii.gz", b"\x1f\x8b", FileStatus.SKIPPED, "NIfTI file"),
        ("IM0001", b"", FileStatus.REJECTED, "empty file (0 bytes)"),
        ("IM0002.dcm", b"x" * 500, FileStatus.REJECTED, "not a DICOM file"),
        ("IM0003.dcm", b"\0" * 128 + b"DICM" + b"\xff" * 300, FileStatus.REJECTED, "corrupt"),
    ],
)
def test_non_images_are_skipped_and_broken_files_rejected(
    tmp_path: Path, name: str, content: bytes, status: FileStatus, words: str
) -> None:
    (tmp_path / name).write_bytes(content)
    record = catalog_file(tmp_path / name)
    assert record.status is status and words in record.reason, record.reason
    assert str(tmp_path / name) in record.reason and record.error


def test_a_cut_image_marks_its_series(tmp_path: Path, write_series: SeriesFactory) -> None:
    written = write_series(tmp_path / "s", n=1, rows=64, cols=64)
    data = written.paths[0].read_bytes()
    (tmp_path / "cut.dcm").write_bytes(data[:-1000])
    # inside the dataset's SOPClassUID, which then reads "1.2.840.10008." (an invalid UID)
    sop_class = data.index(b"1.2.840.10008.5.1.4.1.1.2\0", data.index(b"DICM") + 200)
    (tmp_path / "head.dcm").write_bytes(data[: sop_class + len("1.2.840.10008.")])
    cut, head = catalog_file(tmp_path / "cut.dcm"), catalog_file(tmp_path / "head.dcm")
    assert cut.status is head.status is FileStatus.REJECTED
    assert "truncated pixel data" in cut.reason and cut.error == "PixelDataError"
    assert "truncated DICOM header: the file ends inside SOPClassUID" in head.reason
    assert head.error == "NotDicomError"
    assert cut.series_instance_uid == written.series_uid  # the series is incomplete
    assert head.series_instance_uid is None  # cut before its SeriesInstanceUID


def test_a_header_cut_anywhere_is_rejected_as_truncated(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    """Every cut of an image before its pixel data ends the same way, wherever it lands: inside
    a UID (which then reads as an invalid one, e.g. '1.2.840.10008.'), a tag or a length. Such a
    cut used to escape as a pydicom warning ("unreadable DICOM header") when the value was read."""
    written = write_series(tmp_path / "s", n=1, rows=4, cols=4)
    data = written.paths[0].read_bytes()
    pixels = data.rfind(b"\xe0\x7f\x10\x00")  # the PixelData tag
    assert pixels > 0
    outcomes = set()
    for cut in range(1, pixels + 12):
        path = tmp_path / f"cut_{cut}.dcm"
        path.write_bytes(data[:cut])
        record = catalog_file(path)
        assert record.status is FileStatus.REJECTED, (cut, record)
        assert record.error in {"NotDicomError", "PixelDataError"}, (cut, record.reason)
        assert any(w in record.reason for w in ("truncated", "not a DICOM file")), (cut, record)
        (rejected,) = scan_files([path]).rejected
        assert rejected.reason == record.reason, cut
        outcomes.add(record.reason.removeprefix(f"{path}: ").split(" (")[0].split(":")[0])
        path.unlink()
    assert len(outcomes) >= 3  # preamble, header and pixel data cuts are told apart


def test_secondary_captures_localizers_and_structured_reports_are_skipped(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    def capture(ds: Dataset, i: int) -> None:
        ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.7"

    def scout(ds: Dataset, i: int) -> None:
        ds.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]

    def report(ds: Dataset, i: int) -> None:
        ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.88.33"
        ds.Modality = "SR"
        del ds.PixelData

    for name, mutate, words in (
        ("sc", capture, "secondary capture"),
        ("scout", scout, "localizer/scout"),
        ("sr", report, "structured report"),
    ):
        (path,) = write_series(tmp_path / name, n=1, mutate=mutate).paths
        record = catalog_file(path)
        assert record.status is FileStatus.SKIPPED and words in record.reason, record.reason


def test_a_record_is_valid_from_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="image attributes"):
        FileRecord(tmp_path, 0, 0, FileStatus.IMAGE)
    with pytest.raises(ValueError, match="needs a reason"):
        FileRecord(tmp_path, 0, 0, FileStatus.REJECTED)


def test_the_index_reads_each_header_once_and_forgets_removed_files(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    one = write_series(tmp_path / "tree" / "a", n=4)
    two = write_series(tmp_path / "tree" / "b", n=3, seed=1)
    (tmp_path / "tree" / "b" / "broken.dcm").write_bytes(b"")
    with WorkIndex(tmp_path / "work" / "index.sqlite3") as index:
        first = index.scan(tmp_path / "tree")
        assert (first.files, first.read, first.images, first.rejected) == (8, 8, 7, 1)
        assert sorted(index.studies()) == sorted([one.study_uid, two.study_uid])
        assert index.study_count() == 2
        assert [r.path for r in index.study_images(one.study_uid)] == sorted(one.paths)
        (broken,) = index.files(FileStatus.REJECTED)
        assert broken.path.name == "broken.dcm" and "empty file" in broken.reason
        again = index.scan(tmp_path / "tree")
        assert (again.files, again.read, again.reused) == (8, 0, 8)
        for path in two.paths:
            path.unlink()
        os.utime(one.paths[0], ns=(0, 0))  # changed: read again
        third = index.scan(tmp_path / "tree")
        assert (third.files, third.read, third.images) == (5, 1, 4)
        assert list(index.studies()) == [one.study_uid]
        assert index.study_images(two.study_uid) == []
    with WorkIndex(tmp_path / "work" / "index.sqlite3") as reopened:  # kept on disk
        assert reopened.generation == 3 and list(reopened.studies()) == [one.study_uid]


def test_an_unlistable_folder_is_rejected_not_ignored(
    tmp_path: Path, write_series: SeriesFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_series(tmp_path / "tree" / "locked", n=2)
    write_series(tmp_path / "tree" / "open", n=2)
    scandir = os.scandir

    def refuse(path: Any) -> Any:
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refuse)  # as root, chmod 0 would not stop a listing
    with WorkIndex(tmp_path / "index.sqlite3") as index:
        counts = index.scan(tmp_path / "tree")
        (record,) = index.files(FileStatus.REJECTED)
    assert (counts.images, counts.rejected) == (2, 1)
    assert record.path == tmp_path / "tree" / "locked"
    assert "cannot list folder (Permission denied)" in record.reason


def _plan(folder: Path, rules: SelectionRules | None = None) -> StudyPlan:
    with WorkIndex(folder.parent / f"{folder.name}.sqlite3") as index:
        index.scan(folder)
        (study,) = index.studies()
        images = index.study_images(study)
        damaged = index.problems_of(images)
    return plan_study(study, images, damaged, rules or SelectionRules(min_slices=3))


def test_selection_prefers_axial_then_thin_then_more_slices(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    study = "1.2.826.0.1.3680043.10.1"
    tree = tmp_path / "study"
    thick = write_series(tree / "thick", n=5, gap=5.0, study_uid=study)
    thin = write_series(tree / "thin", n=12, gap=1.25, study_uid=study, seed=1)
    short = write_series(tree / "short", n=4, gap=1.25, study_uid=study, seed=2)
    coronal = write_series(
        tree / "coronal", n=20, gap=0.5, column_direction=(0, 0, -1), study_uid=study, seed=3
    )
    plan = _plan(tree)
    assert [c.series_instance_uid for c in plan.candidates] == [
        thin.series_uid,
        short.series_uid,
        thick.series_uid,
        coronal.series_uid,
    ]
    best = plan.candidates[0]
    assert best.axial and best.planes == 12 and best.spacing_mm == pytest.approx(1.25)
    assert best.paths == tuple(sorted(thin.paths))
    strict = _plan(tree, SelectionRules(min_slices=6))
    assert [c.series_instance_uid for c in strict.candidates] == [
        thin.series_uid,
        coronal.series_uid,
    ]
    reasons = {n.series_instance_uid: n.reason for n in strict.notes}
    assert "fewer than --min-slices 6" in reasons[thick.series_uid]
    assert "4 slice(s)" in reasons[short.series_uid]


def test_selection_leaves_out_other_modalities_derived_and_incomplete_series(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    study = "1.2.826.0.1.3680043.10.2"
    tree = tmp_path / "study"

    def derived(ds: Dataset, i: int) -> None:
        ds.ImageType = ["DERIVED", "SECONDARY", "MPR"]

    good = write_series(tree / "good", n=4, gap=3.0, study_uid=study)
    mr = write_series(tree / "mr", n=4, study_uid=study, modality="MR", seed=1)
    mpr = write_series(tree / "mpr", n=4, gap=1.0, study_uid=study, mutate=derived, seed=2)
    cut = write_series(tree / "cut", n=4, gap=1.0, rows=64, cols=64, study_uid=study, seed=3)
    cut.paths[2].write_bytes(cut.paths[2].read_bytes()[:-100])
    plan = _plan(tree)
    assert [c.series_instance_uid for c in plan.candidates] == [good.series_uid]
    reasons = {n.series_instance_uid: n.reason for n in plan.notes}
    assert "modality MR" in reasons[mr.series_uid]
    assert "derived images (ImageType DERIVED\\SECONDARY\\MPR)" in reasons[mpr.series_uid]
    assert f"incomplete, because {cut.paths[2]} is damaged" in reasons[cut.series_uid]
    both = _plan(tree, SelectionRules(modalities=("CT", "MR"), include_derived=True, min_slices=3))
    assert {c.series_instance_uid for c in both.candidates} == {
        good.series_uid,
        mr.series_uid,
        mpr.series_uid,
    }


def test_a_damaged_copy_does_not_make_its_series_incomplete(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    """Same tree as the scan's test: a cut copy (pixel data) and a header cut before the series
    UID, of two images that are intact elsewhere; and a third, cut with no other copy."""
    study = "1.2.826.0.1.3680043.10.3"
    tree = tmp_path / "study"
    good = write_series(tree / "a", n=5, gap=2.0, rows=64, cols=64, study_uid=study)
    other = write_series(tree / "b", n=4, gap=1.0, rows=64, cols=64, study_uid=study, seed=1)
    (tree / "copy").mkdir()
    (tree / "copy" / "1.dcm").write_bytes(good.paths[1].read_bytes()[:-500])
    data = good.paths[3].read_bytes()
    (tree / "copy" / "3.dcm").write_bytes(data[: data.index(b"DICM") + 300])
    other.paths[2].write_bytes(other.paths[2].read_bytes()[:-500])
    plan = _plan(tree)
    assert [c.series_instance_uid for c in plan.candidates] == [good.series_uid]
    assert plan.candidates[0].paths == tuple(sorted(good.paths))
    reasons = {n.series_instance_uid: n.reason for n in plan.notes}
    assert f"incomplete, because {other.paths[2]} is damaged" in reasons[other.series_uid]
    with WorkIndex(tmp_path / "study.sqlite3") as index:  # the report's rejected files
        rejected = {r.path: r for r in index.files(FileStatus.REJECTED)}
    assert rejected[tree / "copy" / "1.dcm"].intact_copy == good.paths[1]
    assert rejected[tree / "copy" / "3.dcm"].intact_copy == good.paths[3]
    assert "a damaged copy: the readable copy" in rejected[tree / "copy" / "1.dcm"].reason
    assert rejected[other.paths[2]].intact_copy is None
    assert "damaged copy" not in rejected[other.paths[2]].reason


def test_copies_of_an_image_are_used_once(tmp_path: Path, write_series: SeriesFactory) -> None:
    written = write_series(tmp_path / "study" / "a", n=4)
    (tmp_path / "study" / "copy").mkdir()
    for path in written.paths:
        (tmp_path / "study" / "copy" / path.name).write_bytes(path.read_bytes())
    plan = _plan(tmp_path / "study")
    (candidate,) = plan.candidates
    assert candidate.paths == tuple(sorted(written.paths)) and candidate.planes == 4
    duplicates = [n for n in plan.notes if n.kind is NoteKind.SKIPPED]
    assert len(duplicates) == 4
    assert all("duplicate of" in n.reason and "copy" in n.path.parts for n in duplicates)


def test_rules_are_checked_on_construction() -> None:
    with pytest.raises(ValueError, match="CT and/or MR"):
        SelectionRules(modalities=("US",))
    with pytest.raises(ValueError, match="min_slices"):
        SelectionRules(min_slices=0)


def test_an_index_of_another_schema_is_rebuilt(tmp_path: Path, write_series: SeriesFactory) -> None:
    import sqlite3

    write_series(tmp_path / "tree" / "a", n=2)
    with WorkIndex(tmp_path / "index.sqlite3") as index:
        index.scan(tmp_path / "tree")
    db = sqlite3.connect(tmp_path / "index.sqlite3")
    with db:
        db.execute("UPDATE meta SET value = 'old' WHERE key = 'schema'")
    db.close()
    with WorkIndex(tmp_path / "index.sqlite3") as rebuilt:
        assert rebuilt.generation == 0 and list(rebuilt.studies()) == []
        assert rebuilt.scan(tmp_path / "tree").read == 2  # every header read again
