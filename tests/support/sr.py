"""Stored studies for the DICOM SR tests, and checks of a written SR (dciodvfy, the store)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import highdicom as hd
import numpy as np
import pytest
from pydicom import Dataset
from sqlalchemy import select

from app.sr import SOP_CLASSES, tracking_uid
from db.engine import Store
from db.models import ReviewStatus, Run, Series, Study
from ingestion.geometry import Geometry
from ingestion.volume import Volume

from tests.support.db import make_result, store_one

AXES = (((10.0, 12.0), (20.25, 30.5)), ((14.0, 25.0), (18.0, 17.0)))  # (row, column) pairs


def sr_values(volume: Volume) -> tuple[float, float, float]:
    """The stored values: each the length of its axis (a measurement is a caliper), awkward
    floats that the SR must carry exactly, not rounded to 16 DS characters: long axis
    (AXES[0]), short axis (AXES[1]), diameter (AXES[0])."""

    def length(pair: Any) -> float:
        a, b = (volume.geometry.index_to_lps([0, r, c]) for r, c in pair)
        return float(np.linalg.norm(b - a))

    return length(AXES[0]), length(AXES[1]), length(AXES[0])


def dciodvfy(path: Path) -> None:
    """dciodvfy reports no error (warnings are allowed); skipped without it, except in CI."""
    exe = shutil.which("dciodvfy")
    if exe is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("dciodvfy is missing in CI: deploy/ensure_dicom3tools.sh installs it")
        pytest.skip("dciodvfy (Debian package dicom3tools) is not installed")
    done = subprocess.run([exe, str(path)], capture_output=True, text=True, timeout=60)
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("Error")]
    assert not errors, "\n".join(errors)


def store_study(store: Store, volume: Volume, findings: bool = True) -> str:
    result = make_result(volume, values=sr_values(volume))
    on_slice = [  # axes on each finding's slice, from (row, column) index pairs
        dataclasses.replace(
            f,
            axes_lps_mm=tuple(
                tuple(
                    tuple(volume.geometry.index_to_lps([f.slice_index, r, c]).tolist())
                    for r, c in pair
                )
                for pair in AXES[: len(f.measurements)]
            ),
        )
        for f in result.findings
    ]
    result = dataclasses.replace(result, findings=tuple(on_slice) if findings else ())
    store_one(store, result, volume)
    return result.study_instance_uid


def check_against_store(store: Store, path: Path, study_uid: str, axes: Any = AXES) -> Any:
    """Every exported value, unit, range, tracking UID and image reference equals the store's."""
    sr, groups = _read_back(path)
    with store.reader() as session:
        latest = (
            select(Run)
            .join(Run.series)
            .join(Series.study)
            .where(Study.study_instance_uid == study_uid)
            .order_by(Run.id.desc())
        )
        run = session.execute(latest).scalars().first()
        assert run is not None
        study = run.series.study
        assert sr.StudyInstanceUID == study_uid == study.study_instance_uid
        assert sr.PatientID == study.patient_id
        exported = 0
        for finding in run.findings:
            kept = [m for m in finding.measurements if m.status is not ReviewStatus.REJECTED]
            uid = tracking_uid(run, finding)
            if not kept:
                assert uid not in groups
                continue
            exported += 1
            group = groups[uid]
            assert group.tracking_identifier == f"finding {finding.number}"
            assert (
                group.finding_type.value
                == {"lesion": "52988006", "vessel": "59820001"}[finding.kind]
            )
            (image,) = group.source_images
            ref = image.ReferencedSOPSequence[0]
            assert ref.ReferencedSOPInstanceUID == finding.sop_instance_uid
            assert ref.ReferencedSOPClassUID == SOP_CLASSES[("CT", False)]
            algorithm = _items(group[0])
            suffix = " (NOT FOR CLINICAL USE)" if run.not_for_clinical_use else ""
            assert algorithm["Algorithm Name"][0].TextValue == run.model_name + suffix
            assert algorithm["Algorithm Version"][0].TextValue == run.model_version
            by_code = {m.name.value: m for m in group.get_measurements()}
            assert len(by_code) == len(kept)
            for row in kept:
                read = by_code[SCT[row.name]]
                value, unit = _num(read[0])
                corrected = row.status is ReviewStatus.CORRECTED
                if corrected:  # range, algorithm and axes are the model's, the value is not
                    assert not _items(read[0]) and not read.referenced_coordinates
                    assert value == row.reviewed_value_mm and unit == "mm"
                    continue
                assert value == row.value_mm
                assert unit == "mm" == row.unit
                k = [n.name for n in finding.measurements].index(row.name)
                g = Geometry(**{n: tuple(v) for n, v in run.series.geometry.items()})
                index = g.lps_to_index(finding.axes_lps_mm["segments"][k])  # (slice, row, col)
                assert np.all(np.abs(index[:, 0] - finding.slice_index) <= 0.5)
                on_slice = index.copy()
                on_slice[:, 0] = finding.slice_index
                length = float(np.linalg.norm(np.subtract(*g.index_to_lps(on_slice))))
                if abs(value - length) > max(g.row_spacing, g.column_spacing):
                    assert not read.referenced_coordinates  # its caliper would contradict it
                else:
                    (coordinates,) = read.referenced_coordinates
                    assert coordinates.GraphicType == "POLYLINE"
                    on_image = coordinates.ContentSequence[0].ReferencedSOPSequence[0]
                    assert on_image.ReferencedSOPInstanceUID == finding.sop_instance_uid
                    column_row = np.asarray(coordinates.GraphicData, dtype=np.float64)
                    column_row = column_row.reshape(2, 2)
                    if axes is not None:  # the (row, column) pairs the axes were made from
                        expected = np.asarray(axes[k], dtype=np.float64)[:, ::-1] + 0.5
                        np.testing.assert_allclose(column_row, expected, atol=1e-4)
                    np.testing.assert_allclose(column_row, index[:, [2, 1]] + 0.5, atol=1e-3)
                props = _items(read[0])
                low, low_unit = _num(props["-, range of lower measurement uncertainty"][0])
                high, high_unit = _num(props["+, range of upper measurement uncertainty"][0])
                assert low_unit == high_unit == "mm"
                assert value - low == pytest.approx(row.range_low_mm, rel=1e-12)
                assert value + high == pytest.approx(row.range_high_mm, rel=1e-12)
            statuses = {
                q.name.meaning: q.value.meaning for q in group.get_qualitative_evaluations()
            }
            assert statuses == {
                f"Review status of {m.name.replace('_', ' ')}": str(m.status) for m in kept
            }
        assert len(groups) == exported
    return sr


SCT = {"long_axis": "103339001", "short_axis": "103340004", "diameter": "81827009"}


def _items(node: Dataset) -> dict[str, list[Dataset]]:
    """Direct content items of an SR content item by concept name meaning."""
    out: dict[str, list[Dataset]] = {}
    for item in node.get("ContentSequence", []):
        out.setdefault(item.ConceptNameCodeSequence[0].CodeMeaning, []).append(item)
    return out


def _num(item: Dataset) -> tuple[float, str]:
    measured = item.MeasuredValueSequence[0]
    return float(measured.FloatingPointValue), measured.MeasurementUnitsCodeSequence[0].CodeValue


def _read_back(path: Path) -> tuple[Any, dict[str, Any]]:
    sr = hd.sr.srread(path)
    assert isinstance(sr, hd.sr.Comprehensive3DSR)
    groups = {str(g.tracking_uid): g for g in sr.content.get_image_measurement_groups()}
    return sr, groups
