"""Issue 41, item 7: a label map that cannot be read is one skipped line with a one-line
reason: MONAI's answer to an empty or damaged file carries every reader's traceback."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from ingestion.dataset.masks import import_masks


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "image.nii.gz"
    nib.save(nib.Nifti1Image(np.full((24, 20, 12), 40, np.int16), np.eye(4)), str(path))
    return path


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "the label map is empty (0 bytes)"),
        (b"\x1f\x8b not a gzip stream at all" * 8, "label map cannot be read"),
    ],
)
def test_an_unreadable_label_map_is_one_line(
    image: Path, tmp_path: Path, content: bytes, reason: str
) -> None:
    labels = tmp_path / "labels.nii.gz"
    labels.write_bytes(content)
    roles = tmp_path / "roles.json"
    roles.write_text(json.dumps({"1": "tumour"}), encoding="utf-8")
    result = import_masks(labels, image=image, label_file=roles, modality="CT")
    (skipped,) = result.skipped
    assert skipped.file == str(labels)
    assert skipped.reason.startswith(reason), skipped.reason
    assert "\n" not in skipped.reason and "Traceback" not in skipped.reason
    assert len(skipped.reason) < 300, skipped.reason
