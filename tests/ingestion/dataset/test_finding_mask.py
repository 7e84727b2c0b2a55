"""``ingestion.dataset.masks.finding_mask``: a dataset finding's own voxels on its image's grid,
from the label map it names, or a clear error naming the file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from ingestion.dataset.format import MaskRef, read_dataset, write_import
from ingestion.dataset.masks import finding_mask
from ingestion.dataset.reads import import_reads
from ingestion.errors import IngestionError
from model.measurer.data.sources import load_dataset_volume

from tests.support.reads import write_reads_folder


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reads")
    write_reads_folder(root / "source")
    write_import(root / "dataset", [import_reads(root / "source")])
    return root


def test_the_mask_is_the_label_map_on_the_image_grid(imported: Path) -> None:
    dataset = read_dataset(imported / "dataset")
    uid = dataset.series()[0]
    volume = load_dataset_volume(dataset, uid)
    (finding,) = dataset.findings_of(uid)
    mask = finding_mask(dataset.root, finding, volume)
    assert mask.shape == volume.shape and mask.dtype == bool
    assert mask[finding.slice_index].sum() == mask.sum(axis=(1, 2)).max()  # the largest slice
    centre = volume.geometry.lps_to_index(np.asarray(finding.center_lps_mm))
    assert mask[tuple(round(float(v)) for v in centre)]  # the lesion's centre is inside it


def test_what_cannot_be_the_mask_is_refused_by_name(imported: Path, tmp_path: Path) -> None:
    dataset = read_dataset(imported / "dataset")
    uid = dataset.series()[0]
    volume = load_dataset_volume(dataset, uid)
    (finding,) = dataset.findings_of(uid)
    assert finding.mask is not None
    with pytest.raises(IngestionError, match="names no label map"):
        finding_mask(dataset.root, dataclasses.replace(finding, mask=None), volume)
    other_label = dataclasses.replace(finding, mask=MaskRef(finding.mask.path, 7))
    with pytest.raises(IngestionError, match="no voxel holds the finding's label 7"):
        finding_mask(dataset.root, other_label, volume)
    missing = dataclasses.replace(finding, mask=MaskRef(str(tmp_path / "gone.nii.gz"), 1))
    with pytest.raises(IngestionError, match=r"gone\.nii\.gz"):
        finding_mask(dataset.root, missing, volume)
    small = tmp_path / "small.nii.gz"
    nib.save(nib.Nifti1Image(np.ones((4, 4, 2), np.uint8), np.eye(4)), small)
    with pytest.raises(IngestionError, match=r"small\.nii\.gz: the label map's grid differs"):
        finding_mask(
            dataset.root, dataclasses.replace(finding, mask=MaskRef(str(small), 1)), volume
        )
