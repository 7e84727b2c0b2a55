"""The patient-level split (``ingestion.dataset.split``): every patient of every dataset on one
side, every case with a patient in the file, the file equal to what its rule writes, the
shares near the intended fractions, and the hybrid backgrounds' patients on the train side.

The shared data is read in place (``shared_data_root``); the tests that need it are skipped
where this machine has none.
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from collections import Counter, defaultdict
from importlib import resources
from pathlib import Path

import pydicom
import pytest

from ingestion.dataset.format import Dataset, DatasetStudy, ImageRef, Provenance, SourceType
from ingestion.dataset.split import (
    CASE_PATIENTS,
    DATASETS,
    FRACTIONS,
    PINNED,
    SPLIT_NAME,
    Side,
    hashed_side,
    main,
    patient_of,
    select_side,
    side_of,
    split_json,
)
from ingestion.errors import ConfigurationError

from tests.support.reads import shared_or_none

SHARED = shared_or_none()
needs_shared = pytest.mark.skipif(
    SHARED is None or not (SHARED / "lidc-nodules" / "reads.csv").is_file(),
    reason="the shared data (lidc-nodules, real-ct, real-dicom) is not on this machine",
)
FILE = json.loads(resources.files("ingestion.dataset").joinpath(SPLIT_NAME).read_text("utf-8"))


def _lidc_rows() -> list[dict[str, str]]:
    assert SHARED is not None
    with (SHARED / "lidc-nodules" / "reads.csv").open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _cases(dataset: str) -> list[str]:
    assert SHARED is not None
    name = "cases.json" if dataset == "real-ct" else "ingestion.json"
    data = json.loads((SHARED / dataset / name).read_text(encoding="utf-8"))
    return [str(case["id"]) for case in data["cases"]]


def _every_case() -> list[tuple[str, str, str]]:
    """(dataset, case, patient key) of every case of every dataset: LIDC crops by their
    patient_id column, real-ct and real-dicom cases by the split's table."""
    rows = [("lidc-nodules", r["case"], r["patient_id"]) for r in _lidc_rows()]
    for dataset in ("real-ct", "real-dicom"):
        rows += [(dataset, case, patient_of(dataset, case)) for case in _cases(dataset)]
    return rows


@needs_shared
def test_no_patient_is_on_two_sides_in_any_dataset() -> None:
    sides: dict[str, set[Side]] = defaultdict(set)
    for dataset, case, patient in _every_case():
        sides[patient].add(side_of(patient))
        if dataset == "lidc-nodules":
            assert patient_of(dataset, case) == patient  # the case name's patient is the row's
    assert {p: s for p, s in sides.items() if len(s) > 1} == {}
    # LIDC-IDRI-0314 is a crop patient of lidc-nodules and the real-ct case lidc0314_nodule
    lidc = {r["patient_id"] for r in _lidc_rows()}
    assert patient_of("real-ct", "lidc0314_nodule") == "LIDC-IDRI-0314"
    assert "LIDC-IDRI-0314" in lidc
    assert patient_of("real-ct", "mr_sts_008_sarcoma") == patient_of("real-ct", "sts_008_sarcoma")
    assert patient_of("real-ct", "ts_abdomen_dicom_asis") == patient_of(
        "real-ct", "ts_abdomen_dicom"
    )


@needs_shared
def test_dicom_headers_agree_with_the_patient_keys() -> None:
    """Cases of one DICOM study share a key, and a header's PatientID that is a patient of the
    split (LIDC-IDRI-0314, STS_008, ...) is that case's key: the table is not a guess."""
    assert SHARED is not None
    keys = set(FILE["patients"])
    by_study: dict[str, set[str]] = defaultdict(set)
    checked = 0
    for dataset in ("real-ct", "real-dicom"):
        for case in _cases(dataset):
            files = sorted(p for p in (SHARED / dataset / case).rglob("*") if p.is_file())
            headers = []
            for path in files:
                if path.name.endswith((".json", ".nii.gz", ".nii", ".md")):
                    continue
                try:
                    headers.append(pydicom.dcmread(path, stop_before_pixels=True))
                except pydicom.errors.InvalidDicomError:
                    continue
                if len(headers) == 3:
                    break
            key = patient_of(dataset, case)
            for header in headers:
                study = str(header.get("StudyInstanceUID", "") or "")
                if study:
                    by_study[study].add(key)
                patient = str(header.get("PatientID", "") or "")
                if patient in keys:
                    assert key == patient, (dataset, case, patient)
                    checked += 1
    assert checked >= 4  # LIDC-IDRI-0314, STS_002, STS_008 (CT and MR), CRLM-CT-1006, ...
    assert {s: k for s, k in by_study.items() if len(k) > 1} == {}


@needs_shared
def test_every_case_has_a_patient_in_the_file() -> None:
    listed = FILE["patients"]
    missing = [(d, c, p) for d, c, p in _every_case() if p not in listed]
    assert missing == []
    assert (
        sorted({r["patient_id"] for r in _lidc_rows()})
        == (FILE["datasets"]["lidc-nodules"]["patients"])
    )
    assert len(FILE["datasets"]["lidc-nodules"]["patients"]) == 392
    for dataset in ("real-ct", "real-dicom"):
        assert sorted(FILE["datasets"][dataset]["cases"]) == sorted(_cases(dataset))
    assert set(PINNED) <= set(listed)  # no pin of a patient nobody has


@needs_shared
def test_the_file_is_what_its_rule_writes(capsys: pytest.CaptureFixture[str]) -> None:
    assert SHARED is not None
    text = resources.files("ingestion.dataset").joinpath(SPLIT_NAME).read_text("utf-8")
    assert split_json(SHARED) == text
    assert main(["--check", "--shared", str(SHARED)]) == 0
    assert "as the rule gives" in capsys.readouterr().out
    for key, side in FILE["patients"].items():
        pinned = PINNED.get(key)
        assert Side(side) == (pinned[0] if pinned else hashed_side(key)), key


@needs_shared
def test_lidc_shares_stay_near_the_intended_fractions() -> None:
    """Per side, the share of LIDC patients within three binomial standard deviations of the
    intended fraction (the hash rule is a fair draw; a drift beyond that is a broken rule)."""
    patients = FILE["datasets"]["lidc-nodules"]["patients"]
    counts = Counter(Side(FILE["patients"][p]) for p in patients)
    n = len(patients)
    for side, fraction in FRACTIONS.items():
        spread = 3 * math.sqrt(fraction * (1 - fraction) / n)
        assert abs(counts[side] / n - fraction) <= spread, (side, counts[side], n)
    assert sum(FRACTIONS.values()) == pytest.approx(1.0)


def test_the_hash_rule_splits_any_keys_at_the_fractions() -> None:
    counts = Counter(hashed_side(f"site patient {i}") for i in range(20_000))
    for side, fraction in FRACTIONS.items():
        assert counts[side] / 20_000 == pytest.approx(fraction, abs=0.01)
    assert side_of("site patient 7") is hashed_side("site patient 7")  # not in the file
    assert hashed_side("site patient 7") is hashed_side("site patient 7")


@needs_shared
def test_hybrid_backgrounds_patients_are_never_test_patients() -> None:
    """Every real CT background hybrid training may draw from is pinned: on the train side, or
    on the validation side as the held-out background the hybrid runs validated on."""
    from model.measurer.data.hybrid import survey_backgrounds

    assert SHARED is not None
    usable = [ref.id for ref in survey_backgrounds(SHARED).usable]
    assert usable
    for case in usable:
        dataset = "real-ct" if case in CASE_PATIENTS["real-ct"] else "real-dicom"
        patient = patient_of(dataset, case)
        assert patient in PINNED, case
        side, reason = PINNED[patient]
        assert side is Side.TRAIN or (side is Side.VALIDATION and "held-out" in reason), case
        assert side_of(patient) is side


def test_unknown_datasets_and_cases_are_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match=r"no dataset 'phantoms'.*lidc-nodules"):
        patient_of("phantoms", "study_0001")
    with pytest.raises(ConfigurationError, match="real-ct case 'nope' is not in the patient"):
        patient_of("real-ct", "nope")
    with pytest.raises(ConfigurationError, match="expected LIDC-IDRI-PPPP_R_N"):
        patient_of("lidc-nodules", "LIDC-IDRI-01_R_1")
    assert patient_of("lidc-nodules", "LIDC-IDRI-0012_R_2") == "LIDC-IDRI-0012"
    assert set(DATASETS) == {"lidc-nodules", *CASE_PATIENTS}


def test_main_refuses_a_missing_shared_folder(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--check", "--shared", str(tmp_path / "absent")])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        main(["--check", "--shared", str(tmp_path)])  # no dataset files in it
    assert exit_.value.code == 2


def _dataset(patients: list[str | None]) -> Dataset:
    studies = tuple(
        DatasetStudy(
            f"1.{i}",
            f"1.{i}.1",
            ImageRef(f"/img{i}.nii.gz", "nifti"),
            ("lesion",),
            Provenance(SourceType.READS, "/in"),
            patient_id=patient,
        )
        for i, patient in enumerate(patients)
    )
    return Dataset(Path("/ds"), studies)


def test_select_side_keeps_whole_patients_on_their_side() -> None:
    patients = [f"LIDC-IDRI-{i:04d}" for i in range(1, 41)]
    dataset = _dataset(patients + patients[:5])  # five patients with two series
    parts = {side: select_side(dataset, side) for side in Side}
    assert sum(len(part.series()) for part in parts.values()) == len(dataset.series())
    for side, part in parts.items():
        assert all(side_of(s.patient_id or "") is side for s in part.studies)
    both = select_side(dataset, [Side.VALIDATION, Side.CALIBRATION])
    assert len(both.series()) == len(parts[Side.VALIDATION].series()) + len(
        parts[Side.CALIBRATION].series()
    )
    with pytest.raises(ConfigurationError, match="1 series have no patient id"):
        select_side(_dataset(["P1", None]), Side.TEST)


def test_the_split_file_is_package_data() -> None:
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    assert "dataset/patient_split.json" in data["tool"]["setuptools"]["package-data"]["ingestion"]
