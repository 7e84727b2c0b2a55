"""Bad or unsupported inputs are skipped with a reason that names the file; nothing raises."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset

from ingestion import load_path, scan_path

from conftest import SeriesFactory


def only_reason(path: Path) -> str:
    result = load_path(path)
    assert result.volumes == []
    (rejected,) = result.rejected
    assert str(path) in rejected.reason
    return rejected.reason


def test_zero_byte_file(tmp_path: Path) -> None:
    (tmp_path / "empty.dcm").write_bytes(b"")
    assert "empty file (0 bytes)" in only_reason(tmp_path / "empty.dcm")


def test_text_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not an image\n" * 50)
    assert "not a DICOM file" in only_reason(tmp_path / "notes.txt")


def test_gzipped_dicom_gets_a_hint(tmp_path: Path, write_series: SeriesFactory) -> None:
    written = write_series(tmp_path / "s", n=1)
    (tmp_path / "x.dcm.gz").write_bytes(gzip.compress(written.paths[0].read_bytes()))
    assert "gzip-compressed" in only_reason(tmp_path / "x.dcm.gz")


def test_file_cut_in_the_header(tmp_path: Path, write_series: SeriesFactory) -> None:
    written = write_series(tmp_path / "s", n=1)
    (tmp_path / "cut.dcm").write_bytes(written.paths[0].read_bytes()[:300])
    reason = only_reason(tmp_path / "cut.dcm")
    assert "truncated" in reason or "corrupt" in reason or "no image" in reason


def test_file_cut_in_the_pixel_data(tmp_path: Path, write_series: SeriesFactory) -> None:
    written = write_series(tmp_path / "s", n=1, rows=64, cols=64)
    data = written.paths[0].read_bytes()
    (tmp_path / "cut.dcm").write_bytes(data[: len(data) - 1000])
    assert "truncated pixel data" in only_reason(tmp_path / "cut.dcm")


def test_truncated_file_inside_a_series_does_not_stop_the_others(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    good = write_series(tmp_path / "tree" / "good", n=4, rows=64, cols=64)
    bad = write_series(tmp_path / "tree" / "bad", n=3, rows=64, cols=64, seed=5)
    data = bad.paths[1].read_bytes()
    bad.paths[1].write_bytes(data[:-500])
    result = load_path(tmp_path / "tree")
    assert [v.identifiers.series_instance_uid for v in result.volumes] == [good.series_uid]
    reasons = [r.reason for r in result.rejected]
    assert any("truncated pixel data" in r and str(bad.paths[1]) in r for r in reasons)
    assert any(f"series {bad.series_uid}: incomplete" in r for r in reasons)


def test_presentation_state_is_not_an_image(tmp_path: Path, write_series: SeriesFactory) -> None:
    def gsps(ds: Dataset, i: int) -> None:
        ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.11.1"
        ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
        ds.Modality = "PR"

    write_series(tmp_path / "s", n=1, mutate=gsps)
    assert "presentation state" in only_reason(next((tmp_path / "s").iterdir()))


def test_colour_ct_is_refused(tmp_path: Path, write_series: SeriesFactory) -> None:
    def rgb(ds: Dataset, i: int) -> None:
        ds.SamplesPerPixel = 3
        ds.PhotometricInterpretation = "RGB"
        ds.PlanarConfiguration = 0
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 7
        ds.PixelData = np.zeros((ds.Rows, ds.Columns, 3), np.uint8).tobytes()

    write_series(tmp_path / "s", n=1, mutate=rgb)
    assert "colour image" in only_reason(next((tmp_path / "s").iterdir()))


def test_missing_series_uid(tmp_path: Path, write_series: SeriesFactory) -> None:
    def strip(ds: Dataset, i: int) -> None:
        del ds.SeriesInstanceUID

    write_series(tmp_path / "s", n=1, mutate=strip)
    assert "missing SeriesInstanceUID" in only_reason(next((tmp_path / "s").iterdir()))


def test_missing_path_is_reported_not_raised(tmp_path: Path) -> None:
    (rejected,) = scan_path(tmp_path / "nope").rejected
    assert "no such file or folder" in rejected.reason


def test_hidden_files_are_ignored(tmp_path: Path, write_series: SeriesFactory) -> None:
    write_series(tmp_path / "s", n=2)
    (tmp_path / "s" / ".DS_Store").write_bytes(b"\0" * 20)
    result = load_path(tmp_path / "s")
    assert len(result.volumes) == 1 and result.rejected == []
