"""Real archives' oddities (issue 21 point 9): every case of ``../shared/data/real-dicom/`` ends as
its ``expect_inspect`` says, with the geometry its ``headers`` give (dimensions, spacing,
directions, origin, and the gantry tilt with the sign of its GantryDetectorTilt tag), and
``radcaliper inspect`` writes nothing to stderr but log lines (no decoder traceback).

The data is read in place (it is not copied into the repository). What each case must end as is
written out below from its ``expect_inspect`` note; the code under test knows no case ids.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.inspection import inspect_path_report

REPOSITORY = Path(__file__).resolve().parents[3]
DATA = REPOSITORY.parent / "shared" / "data" / "real-dicom"


@dataclass(frozen=True)
class Expected:
    """What ``inspect`` must make of a case (from its expect_inspect note)."""

    loads: dict[str, int] = field(default_factory=dict)  # series uid -> stacks it becomes
    refused: tuple[str, ...] = ()  # words of the reason a whole series is refused with
    skipped: dict[str, int] = field(default_factory=dict)  # words of a file's reason -> count

    @property
    def exit_code(self) -> int:
        return 0 if self.loads else 2


EXPECTED = {
    "ct_philips_tilt_study": Expected(
        loads={
            "1.3.46.670589.33.1.7303547162003802183.31761132431540865648": 1,
            "1.3.46.670589.33.1.21460354612772622918.29194547251885003033": 1,
        },
        skipped={"localizer/scout": 1, "secondary capture": 5, "DICOMDIR": 5},
    ),
    "ct_siemens_tilt_no_tag": Expected(
        loads={"1.2.826.0.1.3680043.8.498.172569766509356512040321185": 1}
    ),
    "ct_siemens_bolus_monitoring_same_position": Expected(refused=("duplicated slice position",)),
    "ct_enhanced_nema_perfusion_jpeg_lossy": Expected(
        loads={"1.3.6.1.4.1.5962.1.3.10.3.1166562673.14401": 1}
    ),
    "ct_ge_abdomen_derived": Expected(
        loads={"1.3.6.1.4.1.14519.5.2.1.9203.8273.286130801613533577338339572281": 1}
    ),
    "mr_compressed_j2k": Expected(
        loads={"1.2.826.0.1.3680043.8.498.1725697665093567298244257421": 1}
    ),
    "mr_compressed_jpegls": Expected(
        loads={"1.2.826.0.1.3680043.8.498.1725697665093567298244257421": 1}
    ),
    "mr_enhanced_philips": Expected(
        loads={"1.2.826.0.1.3680043.8.498.172569766509356729824825182": 1}
    ),
    "mr_enhanced_siemens_xa30_t1": Expected(
        loads={"1.3.12.2.1107.5.2.43.67093.2022071112080803357602701.0.0.0": 1}
    ),
    "mr_mosaic_9_transfer_syntaxes": Expected(skipped={"Siemens mosaic": 9}),
    # "refuse cleanly (duplicated positions), or split by image type": split, magnitude and
    # field map each a stack of 32 frames
    "mr_enhanced_philips_fieldmap_2vol": Expected(
        loads={"1.3.46.670589.11.17240.5.0.8932.2018052615250908935": 2}
    ),
}


def _cases() -> list[dict[str, Any]]:
    if not (DATA / "ingestion.json").is_file():
        return []
    cases: list[dict[str, Any]] = json.loads((DATA / "ingestion.json").read_text())["cases"]
    return cases


pytestmark = pytest.mark.skipif(
    not (DATA / "ingestion.json").is_file(),
    reason=f"the real DICOM development set is not at {DATA} (a checkout without ../shared)",
)


def test_every_case_has_an_expectation() -> None:
    assert sorted(c["id"] for c in _cases()) == sorted(EXPECTED)


def _check_geometry(series: dict[str, Any], header: dict[str, Any], parts: int) -> None:
    """``series`` (inspect's) against ``header`` (the case's, for the whole series)."""
    dims = header["dimensions"]
    assert series["dimensions"] == {
        "rows": dims["rows"],
        "columns": dims["columns"],
        "slices": dims["slices"] // parts,
    }
    spacing = series["spacing_mm"]
    assert spacing["row"] == pytest.approx(header["spacing_mm"]["row"], abs=1e-5)
    assert spacing["column"] == pytest.approx(header["spacing_mm"]["column"], abs=1e-5)
    # a split series' own slice spacing is its nonzero gap (the header's spans both stacks)
    slice_mm = max(header["slice_gaps_along_normal_mm"]) if parts > 1 else None
    if slice_mm is None:
        slice_mm = header["spacing_mm"]["slice"]
    tilt = math.radians(header["tilt_degrees_from_positions"])
    if parts > 1:
        slice_mm = slice_mm / math.cos(tilt)
    assert spacing["slice"] == pytest.approx(slice_mm, abs=1e-3)
    orientation = series["orientation"]
    for key in ("row_direction", "column_direction", "slice_direction"):
        assert orientation[key] == pytest.approx(header[key], abs=1e-4), key
    assert series["origin_lps_mm"] == pytest.approx(header["origin_lps_mm"], abs=1e-3)
    tag, size = header["gantry_tilt_tag"], header["tilt_degrees_from_positions"]
    signed = math.copysign(size, tag) if tag else size  # no tag (or 0): no sign is made up
    assert series["tilt_degrees"] == pytest.approx(signed, abs=1e-2)
    if size > 0.01:
        assert any("gantry tilt" in w for w in series["warnings"])


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["id"])
def test_a_real_case_ends_as_expected(case: dict[str, Any]) -> None:
    expected = EXPECTED[case["id"]]
    report = inspect_path_report(DATA / case["input"])
    headers = {h["series_instance_uid"]: h for h in case["headers"]}
    loaded: dict[str, list[dict[str, Any]]] = {}
    for series in report["series"]:
        loaded.setdefault(series["series_instance_uid"], []).append(series)
    assert {uid: len(parts) for uid, parts in loaded.items()} == expected.loads
    for uid, parts in loaded.items():
        for series in parts:
            _check_geometry(series, headers[uid], len(parts))
        if len(parts) > 1:
            assert all(s["warnings"][0].startswith("part ") for s in parts)
    reasons = [r["reason"] for r in report["rejected"]]
    for words in expected.refused:
        assert any(words in r for r in reasons), reasons
    for words, count in expected.skipped.items():
        assert sum(words in r for r in reasons) == count, (words, reasons)
    assert len(reasons) == len(expected.refused) + sum(expected.skipped.values()), reasons


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["id"])
def test_inspect_on_a_real_case_prints_no_traceback(case: dict[str, Any]) -> None:
    """The command itself: its exit status, JSON on stdout, and a quiet stderr (a decoder that
    fails before another one succeeds printed a traceback here)."""
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "inspect", "--json", str(DATA / case["input"])],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == EXPECTED[case["id"]].exit_code, done.stderr
    assert json.loads(done.stdout)["path"] == str(DATA / case["input"])
    assert "Traceback" not in done.stderr and 'File "' not in done.stderr, done.stderr
    assert done.stderr == "", done.stderr  # at the default level nothing is worth a log line
