"""Compressed transfer syntaxes decode to the same HU (lossless) or close to it (lossy).

The compressed files are made by transcoding real uncompressed series with GDCM.
"""

from __future__ import annotations

from pathlib import Path

import gdcm
import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset

from ingestion import load_path

from tests.support.series import SeriesFactory

TS = gdcm.TransferSyntax


def transcode(src: Path, dst: Path, syntax: int) -> None:
    reader = gdcm.ImageReader()
    reader.SetFileName(str(src))
    assert reader.Read(), f"GDCM cannot read {src}"
    change = gdcm.ImageChangeTransferSyntax()
    change.SetTransferSyntax(TS(syntax))
    change.SetInput(reader.GetImage())
    assert change.Change(), f"GDCM cannot transcode {src} to {TS(syntax)}"
    writer = gdcm.ImageWriter()
    writer.SetFileName(str(dst))
    writer.SetFile(reader.GetFile())
    writer.SetImage(change.GetOutput())
    assert writer.Write()


def twelve_bit(ds: Dataset, i: int) -> None:
    ds.BitsStored = 12
    ds.HighBit = 11


LOSSLESS = [
    ("1.2.840.10008.1.2.4.70", TS.JPEGLosslessProcess14_1),
    ("1.2.840.10008.1.2.4.57", TS.JPEGLosslessProcess14),
    ("1.2.840.10008.1.2.4.80", TS.JPEGLSLossless),
    ("1.2.840.10008.1.2.4.90", TS.JPEG2000Lossless),
    ("1.2.840.10008.1.2.5", TS.RLELossless),
]


@pytest.mark.parametrize(("uid", "syntax"), LOSSLESS, ids=[u for u, _ in LOSSLESS])
def test_lossless_syntaxes_decode_exactly(
    tmp_path: Path, write_series: SeriesFactory, uid: str, syntax: int
) -> None:
    written = write_series(tmp_path / "raw", n=3, rows=16, cols=16, mutate=twelve_bit)
    out = tmp_path / "compressed"
    out.mkdir()
    for i, path in enumerate(written.paths):
        transcode(path, out / f"c{i}.dcm", syntax)
    assert str(pydicom.dcmread(out / "c0.dcm").file_meta.TransferSyntaxUID) == uid
    result = load_path(out)
    assert len(result.volumes) == 1, [r.reason for r in result.rejected]
    np.testing.assert_array_equal(result.volumes[0].voxels, written.hu)


def test_jpeg_baseline_8_bit(tmp_path: Path, write_series: SeriesFactory) -> None:
    def eight_bit(ds: Dataset, i: int) -> None:
        arr = np.frombuffer(ds.PixelData, dtype="<u2").reshape(ds.Rows, ds.Columns)
        smooth = np.full(arr.shape, 100 + 20 * i, dtype=np.uint8)
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 7
        ds.PixelData = smooth.tobytes()
        ds.RescaleIntercept = "0"

    written = write_series(tmp_path / "raw", n=2, rows=16, cols=16, modality="MR", mutate=eight_bit)
    out = tmp_path / "compressed"
    out.mkdir()
    for i, path in enumerate(written.paths):
        transcode(path, out / f"c{i}.dcm", TS.JPEGBaselineProcess1)
    assert str(pydicom.dcmread(out / "c0.dcm").file_meta.TransferSyntaxUID).endswith(".4.50")
    vol = load_path(out).volumes[0]
    expected = np.broadcast_to(np.array([100.0, 120.0])[:, None, None], (2, 8, 8))
    np.testing.assert_allclose(vol.voxels[:, 4:12, 4:12], expected, atol=2)


def test_corrupt_compressed_data_is_a_pixel_error_naming_the_file(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    written = write_series(tmp_path / "raw", n=2, rows=16, cols=16, mutate=twelve_bit)
    out = tmp_path / "compressed"
    out.mkdir()
    for i, path in enumerate(written.paths):
        transcode(path, out / f"c{i}.dcm", TS.JPEG2000Lossless)
    ds = pydicom.dcmread(out / "c1.dcm")
    raw = bytearray(ds.PixelData)
    raw[40:-40] = bytes(len(raw) - 80)  # wipe the codestream body, keep the framing
    ds.PixelData = bytes(raw)
    ds.save_as(out / "c1.dcm")
    result = load_path(out)
    assert result.volumes == []
    (rejected,) = result.rejected
    assert "c1.dcm" in rejected.reason and "cannot decode pixel data" in rejected.reason
