"""A checkpoint's validated domain (issue 23, "Honest refusal"): the domain's JSON, the contrast
state read from DICOM headers, what refuses and what flags a study, the domain a training run
records, and the domain in a checkpoint and its card.

Real data is read in place from ``../shared/data/real-ct/`` and ``real-dicom/`` (skipped when
absent, with the reason)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydicom.dataset import Dataset

from ingestion.contrast import Contrast, contrast_of, contrast_of_dataset
from ingestion.dataset.format import write_import
from ingestion.dataset.masks import import_masks
from ingestion.dicom.header import read_dicom_header
from ingestion.errors import ConfigurationError, ModelError
from ingestion.geometry import Geometry
from ingestion.load import load_path
from ingestion.volume import Modality, Volume
from model.backbone import tiny_qwen2_5_vl_kwargs
from model.circle_rope.config import CircleRopeQwen2_5_VLConfig
from model.circle_rope.modeling import CircleRopeQwen2_5_VLForConditionalGeneration
from model.measurer.checkpoint.domain import DataSource, Domain, DomainContrast, check
from model.measurer.checkpoint.settings import (
    CARD_NAME,
    SETTINGS_NAME,
    MeasurerSettings,
    NumericMode,
    default_checkpoint,
    write_settings,
)
from model.measurer.checkpoint.weights import load_checkpoint, save_checkpoint
from model.measurer.data.sources import DatasetSource, MixedSource, PhantomSource
from model.measurer.tasks.tokenizer import VOCAB, build_tokenizer, special_ids
from model.measurer.train.domain import domain_for_training
from model.measurer.train.loop import train

from tests.support.measurer import TINY
from tests.support.series import SeriesFactory

SHARED = Path(__file__).resolve().parents[4].parent / "shared" / "data"
REAL_CT = SHARED / "real-ct"
REAL_DICOM = SHARED / "real-dicom"
needs_real_ct = pytest.mark.skipif(
    not (REAL_CT / "cases.json").is_file(), reason=f"shared real CT data not found at {REAL_CT}"
)
needs_real_dicom = pytest.mark.skipif(
    not (REAL_DICOM / "ingestion.json").is_file(),
    reason=f"shared real DICOM data not found at {REAL_DICOM}",
)

FULL = Domain(
    modalities=(Modality.CT,),
    pixel_mm=(0.5, 1.2),
    slice_mm=(0.6, 5.0),
    min_slices=5,
    fov_mm=(300.0, 500.0),
    contrast=DomainContrast.CONTRAST,
    anatomy=("chest", "abdomen"),
    sources=(
        DataSource("/data/ts_abdomen", "Apache-2.0", "masks"),
        DataSource("radcaliper phantoms, seed 0", "generated", "phantoms"),
    ),
)


def _ct(
    shape: tuple[int, int, int] = (20, 64, 64),
    spacing: tuple[float, float, float] = (2.0, 0.8, 0.8),
    modality: Modality | None = Modality.CT,
) -> Volume:
    geometry = Geometry((0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), spacing)
    volume = Volume.in_memory(np.zeros(shape, np.float32), geometry)
    return dataclasses.replace(volume, modality=modality)


def _load(path: Path, modality: Modality | None = None) -> Volume:
    result = load_path(path, nifti_modality=modality)
    assert result.volumes, [r.reason for r in result.rejected]
    return result.volumes[0]


# -- the domain's JSON ---------------------------------------------------------------------------
def test_a_domain_round_trips_through_json() -> None:
    text = json.dumps(FULL.to_json())
    assert Domain.from_json(json.loads(text)) == FULL
    legacy = Domain.legacy()
    assert Domain.from_json(json.loads(json.dumps(legacy.to_json()))) == legacy


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pixel_mm": [1.5, 0.4]}, "domain.pixel_mm"),
        ({"slice_mm": "thin"}, "domain.slice_mm"),
        ({"fov_mm": [0, 300]}, "domain.fov_mm"),
        ({"modalities": ["PET"]}, "domain.modalities"),
        ({"modalities": []}, "domain.modalities"),
        ({"modalities": "CT"}, "domain.modalities"),
        ({"min_slices": 0}, "domain.min_slices"),
        ({"contrast": "arterial"}, "domain.contrast"),
        ({"anatomy": [""]}, "domain.anatomy"),
        ({"sources": [{"name": "x", "kind": "masks"}]}, "domain.sources.*'licence'"),
        ({"colour": "red"}, "unknown key 'colour'"),
    ],
)
def test_a_bad_domain_names_the_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Domain.from_json({**FULL.to_json(), **change})


def test_a_missing_range_is_named() -> None:
    data = FULL.to_json()
    del data["slice_mm"]
    with pytest.raises(ValueError, match=r"domain.slice_mm is missing"):
        Domain.from_json(data)


def test_settings_without_a_domain_load_the_legacy_one() -> None:
    settings = MeasurerSettings("m", "1", NumericMode.STANDARD, domain=FULL)
    data = settings.to_json()
    assert MeasurerSettings.from_json(data).domain == FULL
    del data["domain"]
    legacy = MeasurerSettings.from_json(data).domain
    assert legacy == Domain.legacy()
    assert legacy.modalities == (Modality.CT,)
    assert (legacy.pixel_mm, legacy.slice_mm, legacy.min_slices) == ((0.4, 1.5), (0.5, 7.5), 3)
    assert (legacy.fov_mm, legacy.contrast, legacy.anatomy) == (None, DomainContrast.ANY, ())


# -- refusals and flags ----------------------------------------------------------------------------
def test_a_study_inside_the_domain_passes() -> None:
    result = check(Domain.legacy(), _ct(), Contrast.UNKNOWN)
    assert result.refusals == () and result.flags == () and not result.refused
    result.raise_if_refused()  # nothing to raise


@needs_real_ct
def test_real_mr_is_refused() -> None:
    mr = _load(REAL_CT / "mr_sts_008_sarcoma" / "dicom")
    assert mr.modality is Modality.MR
    result = check(Domain.legacy(), mr, contrast_of(mr), model="radcaliper-demo 0.3.4")
    assert any("radcaliper-demo 0.3.4 is trained on CT only" in r for r in result.refusals)
    with pytest.raises(ModelError, match="cannot measure MR studies"):
        result.raise_if_refused()


@needs_real_ct
def test_real_3mm_pixels_are_refused_and_an_unknown_modality_too() -> None:
    path = REAL_CT / "ts_ct_3mm" / "image.nii.gz"
    ct = _load(path, Modality.CT)  # RADCALIPER_NIFTI_MODALITY=CT, as the command line reads it
    assert contrast_of(ct) is Contrast.UNKNOWN  # NIfTI records nothing
    result = check(Domain.legacy(), ct, contrast_of(ct))
    (reason,) = result.refusals
    assert reason.startswith("pixel spacing 3 mm is outside") and "(0.4-1.5 mm)" in reason
    unknown = check(Domain.legacy(), _load(path), Contrast.UNKNOWN)
    assert any("RADCALIPER_NIFTI_MODALITY=CT" in r for r in unknown.refusals)


@needs_real_ct
def test_real_mr_nifti_with_its_modality_set_is_refused() -> None:
    mr = _load(REAL_CT / "mr_brain1" / "image.nii.gz", Modality.MR)
    (reason,) = check(Domain.legacy(), mr, Contrast.UNKNOWN).refusals
    assert "trained on CT only and cannot measure MR studies" in reason


@pytest.mark.parametrize(
    ("volume", "message"),
    [
        (_ct(spacing=(2.0, 0.3, 0.8)), r"pixel spacing 0.3 x 0.8 mm .*\(0.4-1.5 mm\)"),
        (_ct(spacing=(12.0, 0.8, 0.8)), r"slice spacing 12 mm .*\(0.5-7.5 mm\)"),
        (_ct(shape=(2, 64, 64)), "2 slice.* at least 3"),
    ],
)
def test_spacing_and_slices_outside_are_refused(volume: Volume, message: str) -> None:
    (reason,) = check(Domain.legacy(), volume, Contrast.UNKNOWN).refusals
    assert any(char.isdigit() for char in reason)
    with pytest.raises(ModelError, match=message):
        check(Domain.legacy(), volume, Contrast.UNKNOWN).raise_if_refused()


def test_a_recorded_contrast_state_the_model_was_not_validated_on_is_refused() -> None:
    contrast_only = dataclasses.replace(Domain.legacy(), contrast=DomainContrast.CONTRAST)
    (reason,) = check(contrast_only, _ct(), Contrast.NON_CONTRAST, model="m 1").refusals
    assert "records a non-contrast study; m 1 is validated on contrast studies only" in reason
    assert check(contrast_only, _ct(), Contrast.CONTRAST) == check(
        Domain.legacy(), _ct(), Contrast.UNKNOWN
    )
    plain_only = dataclasses.replace(Domain.legacy(), contrast=DomainContrast.NON_CONTRAST)
    assert check(plain_only, _ct(), Contrast.CONTRAST).refused
    assert not check(Domain.legacy(), _ct(), Contrast.NON_CONTRAST).refused  # "any"


def test_a_non_contrast_header_is_refused_by_a_contrast_only_model(
    write_series: SeriesFactory, tmp_path: Path
) -> None:
    def plain(ds: Dataset, index: int) -> None:
        ds.ContrastBolusAgent = "None"

    written = write_series(tmp_path / "plain", n=4, rows=16, cols=16, mutate=plain)
    volume = _load(written.paths[0].parent)
    assert contrast_of(volume) is Contrast.NON_CONTRAST
    contrast_only = dataclasses.replace(Domain.legacy(), contrast=DomainContrast.CONTRAST)
    with pytest.raises(ModelError, match="non-contrast study"):
        check(contrast_only, volume, contrast_of(volume)).raise_if_refused()


def test_unknown_contrast_is_a_flag_not_a_refusal() -> None:
    contrast_only = dataclasses.replace(Domain.legacy(), contrast=DomainContrast.CONTRAST)
    result = check(contrast_only, _ct(), Contrast.UNKNOWN)
    assert result.refusals == ()
    (flag,) = result.flags
    assert flag.startswith("outside the validated domain") and "contrast agent" in flag


@needs_real_ct
def test_a_real_ct_with_no_contrast_tag_is_flagged_for_a_contrast_only_model() -> None:
    ct = _load(REAL_CT / "lung1_001_gtv" / "dicom")  # ProtocolName says CONTRAST; no tag
    assert contrast_of(ct) is Contrast.UNKNOWN
    contrast_only = dataclasses.replace(Domain.legacy(), contrast=DomainContrast.CONTRAST)
    result = check(contrast_only, ct, contrast_of(ct))
    assert result.refusals == () and len(result.flags) == 1


def test_field_of_view_and_anatomy_are_flags() -> None:
    domain = dataclasses.replace(Domain.legacy(), fov_mm=(134.4, 288.0), anatomy=("phantom",))
    wide = _ct(shape=(20, 512, 512), spacing=(2.0, 0.98, 0.98))
    result = check(domain, wide, Contrast.UNKNOWN, anatomy="CHEST", model="m 1")
    assert result.refusals == ()
    assert result.flags == (
        "outside the validated domain: field of view 502 mm, m 1 was validated on 134.4-288 mm",
        "outside the validated domain: anatomy chest, m 1 was validated on phantom",
    )
    narrow = check(domain, _ct(), Contrast.UNKNOWN, anatomy="phantom").flags
    assert narrow == (
        "outside the validated domain: field of view 51 mm, the model was validated on "
        "134.4-288 mm",
    )
    inside = _ct(shape=(20, 256, 256))  # 205 mm
    assert check(domain, inside, Contrast.UNKNOWN, anatomy="phantom").flags == ()
    (anatomy,) = check(domain, inside, Contrast.UNKNOWN).flags
    assert "anatomy is not known" in anatomy


def test_every_reason_is_given_at_once() -> None:
    contrast_only = dataclasses.replace(Domain.legacy(), contrast=DomainContrast.CONTRAST)
    mr = _ct(shape=(2, 16, 16), spacing=(9.0, 3.0, 3.0), modality=Modality.MR)
    result = check(contrast_only, mr, Contrast.NON_CONTRAST)
    assert len(result.refusals) == 5  # modality, pixels, slices, slice count, contrast


# -- contrast from the header ----------------------------------------------------------------------
def _header(**values: Any) -> Dataset:
    ds = Dataset()
    for keyword, value in values.items():
        setattr(ds, keyword, value)
    return ds


def _usage(*administered: str) -> Dataset:
    items = [_header(ContrastBolusAgentAdministered=a) for a in administered]
    return _header(SharedFunctionalGroupsSequence=[_header(ContrastBolusUsageSequence=items)])


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (_header(), Contrast.UNKNOWN),  # no Contrast/Bolus module
        (_header(ContrastBolusAgent=""), Contrast.UNKNOWN),  # type 2, empty: unknown
        (_header(ContrastBolusAgent="APPLIED", ContrastBolusVolume="0"), Contrast.CONTRAST),
        (_header(ContrastBolusVolume="0"), Contrast.UNKNOWN),
        (_header(ContrastBolusVolume="80"), Contrast.CONTRAST),
        (_header(ContrastBolusRoute="IV"), Contrast.CONTRAST),
        (_header(ContrastBolusAgent="NONE"), Contrast.NON_CONTRAST),
        (_header(ContrastBolusAgent=" no  contrast "), Contrast.NON_CONTRAST),
        (_header(ContrastBolusAgent="NONE", ContrastBolusRoute="IV"), Contrast.UNKNOWN),
        (_usage("YES"), Contrast.CONTRAST),
        (_usage("NO"), Contrast.NON_CONTRAST),
        (_usage("NO", "YES"), Contrast.UNKNOWN),
    ],
)
def test_what_a_header_states(header: Dataset, expected: Contrast) -> None:
    assert contrast_of_dataset(header) is expected


REAL_CONTRAST = [
    # TotalSegmentator abdomen (Siemens): agent "APPLIED", volume "0"; its aorta is ~150 HU
    ("real-ct/ts_abdomen_dicom/dicom", Contrast.CONTRAST),
    ("real-dicom/ct_ge_abdomen_derived", Contrast.CONTRAST),  # "GASTRO & OMNI", "Oral & IV"
    ("real-dicom/ct_enhanced_nema_perfusion_jpeg_lossy", Contrast.CONTRAST),  # usage YES
    ("real-ct/lung1_001_gtv/dicom", Contrast.UNKNOWN),  # no tag (ProtocolName says CONTRAST)
    ("real-ct/lidc0314_nodule/dicom", Contrast.UNKNOWN),
    ("real-dicom/ct_philips_tilt_study/S1000", Contrast.UNKNOWN),  # "PLAIN HEAD", no tag
    ("real-dicom/ct_siemens_bolus_monitoring_same_position", Contrast.UNKNOWN),
    ("real-ct/mr_sts_008_sarcoma/dicom", Contrast.UNKNOWN),
]


@needs_real_ct
@needs_real_dicom
@pytest.mark.parametrize(("folder", "expected"), REAL_CONTRAST, ids=[f for f, _ in REAL_CONTRAST])
def test_what_real_headers_state(folder: str, expected: Contrast) -> None:
    files = sorted(p for p in (SHARED / folder).iterdir() if p.is_file() and p.name != "DIRFILE")
    images = [p for p in files if str(read_dicom_header(p).get("Modality")) != "RTSTRUCT"]
    assert images
    assert {contrast_of_dataset(read_dicom_header(p)) for p in images} == {expected}


@needs_real_ct
def test_contrast_of_a_real_volume_and_of_a_lost_file(tmp_path: Path) -> None:
    volume = _load(REAL_CT / "ts_abdomen_dicom" / "dicom")
    assert contrast_of(volume) is Contrast.CONTRAST
    gone = dataclasses.replace(volume, sources=(tmp_path / "moved.dcm",))
    assert contrast_of(gone) is Contrast.UNKNOWN
    assert contrast_of(_ct()) is Contrast.UNKNOWN  # synthetic: no header


# -- the domain a training run records -----------------------------------------------------------
def test_a_phantom_run_records_the_legacy_spacings_and_the_phantoms() -> None:
    domain = domain_for_training(PhantomSource(1))
    assert domain.modalities == (Modality.CT,)
    assert domain.pixel_mm == pytest.approx((0.4, 1.5))
    assert domain.slice_mm == pytest.approx((0.5, 7.5))
    assert domain.min_slices == 3 and domain.fov_mm == pytest.approx((134.4, 288.0))
    assert domain.contrast is DomainContrast.ANY and domain.anatomy == ("phantom",)
    (source,) = domain.sources
    assert source.kind == "phantoms" and "seed 1" in source.name
    assert "generated by radcaliper" in source.licence
    told = domain_for_training(PhantomSource(1), contrast="contrast", anatomy=["Abdomen"])
    assert told.contrast is DomainContrast.CONTRAST and told.anatomy == ("abdomen",)


@needs_real_ct
def test_a_dataset_run_records_its_studies_and_licences(tmp_path: Path) -> None:
    case = REAL_CT / "sts_002_sarcoma"
    cases = json.loads((REAL_CT / "cases.json").read_text(encoding="utf-8"))["cases"]
    (entry,) = [c for c in cases if c["id"] == "sts_002_sarcoma"]
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps(entry["label_map"]), encoding="utf-8")
    imported = import_masks(
        case / "labels.nii.gz",
        image=case / "dicom",
        label_file=labels,
        modality="CT",
        annotator="IBSI",
        licence=entry["source"]["licence"],
    )
    write_import(tmp_path / "ds", [imported])
    dataset = DatasetSource(tmp_path / "ds")
    volume = _load(case / "dicom")
    slice_mm, row_mm, _ = volume.geometry.spacing
    domain = domain_for_training(dataset)
    assert domain.pixel_mm == pytest.approx((row_mm / 1.5, row_mm * 1.5))
    assert domain.slice_mm == pytest.approx((slice_mm / 2, slice_mm * 1.5))
    assert domain.fov_mm == pytest.approx((volume.shape[2] * row_mm,) * 2)
    assert domain.anatomy == ()  # a dataset does not record it
    (source,) = domain.sources
    assert source.licence == entry["source"]["licence"] and source.kind == "masks"
    assert source.name == f"{case / 'labels.nii.gz'} on {case / 'dicom'}"  # the import's input
    # a study at 1 mm slices is outside a model trained only on 3.27 mm ones
    lidc = _load(REAL_CT / "lidc0314_nodule" / "dicom")
    (reason,) = check(domain, lidc, contrast_of(lidc)).refusals
    assert reason.startswith("slice spacing 1 mm is outside")

    mixed = domain_for_training(MixedSource([(dataset, 2.0), (PhantomSource(0), 1.0)], seed=0))
    assert mixed.pixel_mm == pytest.approx((0.4, 1.5))
    assert [s.kind for s in mixed.sources] == ["masks", "phantoms"]
    assert mixed.anatomy == ()  # one part does not say


def test_a_source_of_another_kind_is_refused() -> None:
    class Elsewhere:
        def study(self, index: int) -> Any:
            raise AssertionError("not read")

        def describe(self) -> dict[str, object]:
            return {"source": "elsewhere"}

    with pytest.raises(ConfigurationError, match="Elsewhere training source"):
        domain_for_training(Elsewhere())


# -- the domain in a checkpoint and its card -----------------------------------------------------
def _save(directory: Path, settings: MeasurerSettings) -> None:
    tokenizer = build_tokenizer()
    kwargs = tiny_qwen2_5_vl_kwargs(vocab_size=len(VOCAB), special_ids=special_ids(tokenizer))
    torch.manual_seed(0)
    model = CircleRopeQwen2_5_VLForConditionalGeneration(CircleRopeQwen2_5_VLConfig(**kwargs))
    save_checkpoint(directory, model, None, tokenizer, settings)


def test_a_checkpoint_keeps_its_domain_and_its_card_lists_it(tmp_path: Path) -> None:
    settings = MeasurerSettings("radcaliper-test", "0.0.1", NumericMode.STANDARD, domain=FULL)
    _save(tmp_path, settings)
    assert load_checkpoint(tmp_path).settings.domain == FULL
    card = (tmp_path / CARD_NAME).read_text(encoding="utf-8")
    assert card.startswith("# radcaliper-test 0.0.1")
    section = card[card.index("## Validated domain") :]
    for line in (
        "- Modalities: CT",
        "- Pixel spacing: 0.5-1.2 mm",
        "- Slice spacing: 0.6-5 mm",
        "- Slices: at least 5",
        "- In-plane field of view: 300-500 mm",
        "- Contrast: contrast",
        "- Anatomy: chest, abdomen",
        "| /data/ts_abdomen | masks | Apache-2.0 |",
        "| radcaliper phantoms, seed 0 | phantoms | generated |",
    ):
        assert line in section, line

    # a card written by hand keeps its other sections; the domain section is replaced, once
    (tmp_path / CARD_NAME).write_text(card + "\n## Evaluation\n\nfigures\n", encoding="utf-8")
    write_settings(tmp_path, dataclasses.replace(settings, domain=Domain.legacy()))
    card = (tmp_path / CARD_NAME).read_text(encoding="utf-8")
    assert card.count("## Validated domain") == 1 and card.endswith("## Evaluation\n\nfigures\n")
    assert "- Pixel spacing: 0.4-1.5 mm" in card and "Apache-2.0" not in card
    assert "- Anatomy: not recorded (not checked)" in card
    assert load_checkpoint(tmp_path).settings.domain == Domain.legacy()


def test_the_demo_checkpoint_loads_with_the_legacy_domain() -> None:
    demo = default_checkpoint()
    before = {p.name: p.read_bytes() for p in demo.iterdir() if p.is_file()}
    # the shipped demo predates recorded domains; a retrained demo records its own
    assert "domain" not in json.loads((demo / SETTINGS_NAME).read_text())
    assert load_checkpoint(demo).settings.domain == Domain.legacy()
    assert {p.name: p.read_bytes() for p in demo.iterdir() if p.is_file()} == before


def test_a_trained_checkpoint_records_its_training_domain(tmp_path: Path) -> None:
    out = train(TINY, tmp_path / "run", PhantomSource(1))
    assert load_checkpoint(out).settings.domain == domain_for_training(PhantomSource(1))
    card = (out / CARD_NAME).read_text(encoding="utf-8")
    assert "- Anatomy: phantom" in card and "generated by radcaliper" in card
