"""Bad or unsupported inputs are skipped with a reason that names the file; nothing raises."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from pydicom.dataset import Dataset

from ingestion import load_path, scan_path

from tests.support.series import SeriesFactory


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


def test_a_damaged_copy_of_an_intact_image_does_not_reject_its_series(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    """A PACS export with a second, damaged copy of two images in another folder (same
    SOPInstanceUID): one cut in its pixel data, one cut in its header before its series UID
    (its SOPInstanceUID is still in the file meta group). The intact copies are used."""
    written = write_series(tmp_path / "tree" / "a", n=5, rows=64, cols=64)
    (tmp_path / "tree" / "copy").mkdir()
    pixels_cut = tmp_path / "tree" / "copy" / "0001.dcm"
    header_cut = tmp_path / "tree" / "copy" / "0002.dcm"
    pixels_cut.write_bytes(written.paths[1].read_bytes()[:-500])
    data = written.paths[3].read_bytes()
    header_cut.write_bytes(data[: data.index(b"DICM") + 300])  # the dataset's first elements
    result = load_path(tmp_path / "tree")
    (volume,) = result.volumes
    assert volume.shape[0] == 5 and volume.identifiers.series_instance_uid == written.series_uid
    assert np.array_equal(volume.voxels, written.hu)
    reasons = {r.path: r.reason for r in result.rejected}
    assert set(reasons) == {pixels_cut, header_cut}
    assert "truncated pixel data" in reasons[pixels_cut]
    assert f"a damaged copy: the readable copy {written.paths[1]}" in reasons[pixels_cut]
    assert f"a damaged copy: the readable copy {written.paths[3]}" in reasons[header_cut]
    assert not any("incomplete" in r for r in reasons.values())


def test_a_damaged_image_without_an_intact_copy_still_rejects_its_series(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    written = write_series(tmp_path / "tree" / "a", n=5, rows=64, cols=64)
    (tmp_path / "tree" / "copy").mkdir()
    shutil.copy(written.paths[1], tmp_path / "tree" / "copy" / "0001.dcm")
    written.paths[1].write_bytes(written.paths[1].read_bytes()[:-500])  # the original, cut
    written.paths[2].write_bytes(written.paths[2].read_bytes()[:-500])  # no other copy
    result = load_path(tmp_path / "tree")
    assert result.volumes == []
    reasons = [r.reason for r in result.rejected]
    assert any(f"incomplete, because {written.paths[2]} is damaged" in r for r in reasons)
    assert any("a damaged copy" in r and str(written.paths[1]) in r for r in reasons)


_AS_READER = """
import json, sys
from pathlib import Path
from ingestion.catalog import catalog_file
from ingestion.scan import scan_path
from ingestion.selection import SelectionRules, plan_study
from ingestion.work_index import WorkIndex

tree, denied, work = (Path(a) for a in sys.argv[1:4])
try:
    denied.open("rb").close()
    sys.exit(3)  # readable after all: the test would prove nothing
except PermissionError:
    pass
record = catalog_file(denied)
scanned = scan_path(tree)
with WorkIndex(work / "index.sqlite3") as index:
    index.scan(tree)
    (study,) = index.studies()
    images = index.study_images(study)
    plan = plan_study(study, images, index.problems_of(images), SelectionRules(min_slices=3))
print(json.dumps({
    "catalog": [str(record.status), record.error, record.reason],
    "scan_rejected": {str(r.path): r.reason for r in scanned.rejected},
    "scan_series": [s.info.series_instance_uid for s in scanned.series],
    "candidates": [c.series_instance_uid for c in plan.candidates],
    "notes": {n.series_instance_uid: n.reason for n in plan.notes},
}))
"""


def _without_root_file_access() -> None:  # pragma: no cover - runs in the child process
    """Drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set before exec: the
    child (still root) then obeys file modes, so that mode 000 means unreadable."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop, cap_dac_override, cap_dac_read_search = 24, 1, 2
    for cap in (cap_dac_override, cap_dac_read_search):
        if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def test_a_file_that_cannot_be_read_is_reported_as_permission_denied(
    tmp_path: Path, write_series: SeriesFactory
) -> None:
    """One slice of a series is not readable (mode 000). Root reads any file, so when the tests
    run as root the reading runs in a child process without root's file access capabilities.
    The file is reported as "permission denied" with what to do (not as a truncated header),
    and its series as incomplete because of it (not as a missing slice); the study's other
    series is used."""
    import json
    import subprocess
    import sys

    study = "1.2.826.0.1.3680043.10.4"
    tree, work = tmp_path / "tree", tmp_path / "work"
    a = write_series(tree / "a", n=5, study_uid=study)
    b = write_series(tree / "b", n=4, study_uid=study, seed=1)
    work.mkdir()
    denied = a.paths[2]
    denied.chmod(0o000)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _AS_READER, str(tree), str(denied), str(work)],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=_without_root_file_access if os.geteuid() == 0 else None,
            check=False,
        )
    except subprocess.SubprocessError as exc:  # the capabilities could not be dropped
        pytest.skip(f"cannot make a file unreadable for root here: {exc}")
    finally:
        denied.chmod(0o644)
    if done.returncode == 3:
        pytest.skip("cannot make a file unreadable here (the reader could still read it)")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    status, error, reason = out["catalog"]
    assert (status, error) == ("rejected", "UnreadableFileError")
    assert f"{denied}: permission denied" in reason and "chmod" in reason
    assert out["scan_rejected"][str(denied)] == reason
    assert out["scan_series"] == [b.series_uid]
    incomplete = f"series {a.series_uid}: incomplete, because {denied} cannot be read"
    assert any(r.startswith(incomplete) for r in out["scan_rejected"].values())
    assert out["candidates"] == [b.series_uid]
    assert out["notes"][a.series_uid].startswith(incomplete)
    everything = json.dumps(out)
    assert "truncated" not in everything and "missing slice" not in everything
