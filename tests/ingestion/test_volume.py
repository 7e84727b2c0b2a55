"""``Volume.in_memory``: the one way to build a volume that no file was read for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ingestion.geometry import Geometry
from ingestion.volume import Identifiers, Modality, SourceFormat, Volume

GEOMETRY = Geometry(
    origin=(0.0, 0.0, 0.0),
    row_direction=(1.0, 0.0, 0.0),
    column_direction=(0.0, 1.0, 0.0),
    slice_direction=(0.0, 0.0, 1.0),
    spacing=(2.0, 1.0, 1.0),
)


def test_in_memory_copies_to_float32_with_placeholder_identifiers() -> None:
    hu = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    volume = Volume.in_memory(hu, GEOMETRY, name="phantom-7")
    assert volume.voxels.dtype == np.float32 and np.array_equal(volume.voxels, hu)
    hu[0, 0, 0] = 99
    assert volume.voxels[0, 0, 0] == 0  # a copy
    assert volume.identifiers.sop_instance_uids == ("1.2.3.4.0", "1.2.3.4.1")
    assert volume.source_format == SourceFormat.SYNTHETIC and volume.modality == Modality.CT
    assert volume.sources == (Path("phantom-7"),)


def test_in_memory_keeps_given_identifiers_and_checks_them() -> None:
    ids = Identifiers("9.8", "9.8.7", ("a", "b"), (None, None), patient_id="P1")
    assert Volume.in_memory(np.zeros((2, 2, 2)), GEOMETRY, ids).identifiers.patient_id == "P1"
    with pytest.raises(ValueError, match="name 2 slices"):
        Volume.in_memory(np.zeros((3, 2, 2)), GEOMETRY, ids)
