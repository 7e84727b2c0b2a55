"""Shared fixtures: a writer of small, real DICOM series with chosen geometry."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from pydicom.dataset import Dataset

from tests.support.series import (
    SeriesFactory,
    WrittenSeries,
    fixed_uid,
    make_dataset,
)

pytest_plugins = ("tests.support.db_fixtures",)  # the store's databases

# Property tests draw the same examples on every run (a failure is reproduced by running again).
settings.register_profile("deterministic", derandomize=True, database=None)
settings.load_profile("deterministic")


@pytest.fixture
def write_series() -> SeriesFactory:
    """Return ``write(folder, **options) -> WrittenSeries`` writing one DICOM series.

    Options: n, rows, cols, pixel_spacing, gap (mm between slices along ``step`` or the normal),
    row_direction, column_direction, step (slice step vector; default normal * gap), origin,
    order ("shuffled" | "ascending" | "descending" file numbering), drop (slice indices to omit),
    slope, intercept, modality, seed, study_uid, series_uid, mutate (callable(ds, index)).
    UIDs are derived from ``seed`` and the call's number within the test: the same bytes on
    every run, and distinct series for each call.
    """
    calls = 0

    def write(
        folder: Path,
        *,
        n: int = 6,
        rows: int = 8,
        cols: int = 10,
        pixel_spacing: tuple[float, float] = (0.7, 0.8),
        gap: float = 2.5,
        row_direction: Sequence[float] = (1.0, 0.0, 0.0),
        column_direction: Sequence[float] = (0.0, 1.0, 0.0),
        step: Sequence[float] | None = None,
        origin: Sequence[float] = (-10.0, -20.0, 30.0),
        order: str = "shuffled",
        drop: Sequence[int] = (),
        slope: float = 1.0,
        intercept: float = -1024.0,
        modality: str = "CT",
        seed: int = 0,
        study_uid: str | None = None,
        series_uid: str | None = None,
        mutate: Callable[[Dataset, int], Any] | None = None,
    ) -> WrittenSeries:
        nonlocal calls
        calls += 1
        rng = np.random.default_rng(seed)
        folder.mkdir(parents=True, exist_ok=True)
        row = np.asarray(row_direction, dtype=float)
        col = np.asarray(column_direction, dtype=float)
        normal = np.cross(row, col)
        step_vec = normal * gap if step is None else np.asarray(step, dtype=float)
        study_uid = study_uid or fixed_uid("study", seed, calls)
        series_uid = series_uid or fixed_uid("series", seed, calls)
        stored = rng.integers(0, 3000, size=(n, rows, cols), dtype=np.uint16)
        keep = [i for i in range(n) if i not in set(drop)]
        names = {
            "ascending": [f"IM{i:04d}.dcm" for i in range(len(keep))],
            "descending": [f"IM{len(keep) - i:04d}.dcm" for i in range(len(keep))],
            "shuffled": [f"{uuid.UUID(int=int(rng.integers(1 << 62))).hex}.dcm" for _ in keep],
        }[order]
        paths, positions = [], []
        for name, i in zip(names, keep, strict=True):
            pos = np.asarray(origin, dtype=float) + i * step_vec
            ds = make_dataset(
                position=pos,
                row_direction=row,
                column_direction=col,
                pixel_spacing=pixel_spacing,
                stored=stored[i],
                study_uid=study_uid,
                series_uid=series_uid,
                instance=i + 1 if order != "descending" else n - i,
                slope=slope,
                intercept=intercept,
                modality=modality,
                thickness=gap,
                sop_instance_uid=fixed_uid("image", seed, calls, i),
            )
            if mutate is not None:
                mutate(ds, i)
            path = folder / name
            ds.save_as(path, enforce_file_format=True)
            paths.append(path)
            positions.append(pos)
        hu = (stored[keep].astype(np.float64) * slope + intercept).astype(np.float32)
        pos_arr = np.array(positions)
        depth = pos_arr @ (normal / np.linalg.norm(normal))
        idx = np.argsort(depth)
        return WrittenSeries(
            paths=[paths[i] for i in idx],
            hu=hu[idx],
            positions=pos_arr[idx],
            row_direction=row,
            column_direction=col,
            pixel_spacing=pixel_spacing,
            study_uid=study_uid,
            series_uid=series_uid,
        )

    return write


@pytest.fixture
def pydicom_test_dir() -> Path:
    import pydicom.data

    return Path(pydicom.data.get_testdata_file("CT_small.dcm")).parent  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _private_data_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test touches the user's data dir: the default database lives in a temporary one."""
    monkeypatch.setenv("RADCALIPER_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    monkeypatch.delenv("RADCALIPER_DATABASE_URL", raising=False)
    monkeypatch.delenv("RADCALIPER_PSEUDONYM_KEY", raising=False)
