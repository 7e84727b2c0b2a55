"""Synthetic CT phantoms that follow shared/design/phantom-spec.md, with their ground truth.

A phantom is an axial CT series: air around an elliptic body with a fat rim around soft tissue,
one to three ellipsoidal lesions and, in about 70 % of studies, a contrast-filled vessel along z.
Every edge has partial volume (a voxel holds the volume-weighted mix of what its box covers) and
the body has Gaussian noise. The demo model trains on these; ``radcaliper phantoms`` writes them.

- :func:`generate_phantom` builds one study in memory, deterministically from a seed.
- :func:`write_dicom` / :func:`write_nifti` write it as a DICOM series or a NIfTI file.
- :func:`write_phantoms` writes ``n`` studies with their ``truth.json`` under one folder.

Example::

    phantom = generate_phantom(7)
    lesion = phantom.findings[0]
    index = phantom.geometry.lps_to_index(lesion.center_lps_mm)  # (slice, row, column)

Its parts (private: import from :mod:`ingestion.phantoms`; they may change without notice):
:mod:`~ingestion.phantoms.spec`, :mod:`~ingestion.phantoms.truth` (the records),
:mod:`~ingestion.phantoms.layout`, :mod:`~ingestion.phantoms.shapes`,
:mod:`~ingestion.phantoms.render` and :mod:`~ingestion.phantoms.writers`.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from ingestion.errors import ConfigurationError
from ingestion.geometry import Geometry
from ingestion.phantoms.layout import Layout, sample_layout
from ingestion.phantoms.render import render
from ingestion.phantoms.spec import PhantomSpec
from ingestion.phantoms.truth import BodyTruth, Phantom, TruthFinding, derived_uid
from ingestion.phantoms.writers import write_dicom, write_nifti

__all__ = [
    "BodyTruth",
    "Phantom",
    "PhantomSpec",
    "TruthFinding",
    "generate_phantom",
    "study_seed",
    "write_dicom",
    "write_nifti",
    "write_phantoms",
]

logger = logging.getLogger(__name__)

DICOM_FOLDER = "dicom"
NIFTI_NAME = "image.nii.gz"
TRUTH_NAME = "truth.json"


def _check_seed(name: str, seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {seed!r}")
    return int(seed)


def _findings(layout: Layout, geometry: Geometry) -> tuple[TruthFinding, ...]:
    slices = layout.grid.slices
    soft = layout.body.soft_tissue_hu
    out: list[TruthFinding] = []
    for lesion in layout.lesions:
        index = geometry.lps_to_index(lesion.center)
        out.append(
            TruthFinding(
                kind="lesion",
                center_lps_mm=lesion.center,
                slice_index=min(slices - 1, max(0, round(float(index[0])))),
                long_axis_mm=lesion.long_axis_mm,
                short_axis_mm=lesion.short_axis_mm,
                cc_extent_mm=lesion.cc_extent_mm,
                rotation_deg=lesion.rotation_deg,
                contrast_hu=lesion.contrast_hu,
                hu=soft + lesion.contrast_hu,
            )
        )
    vessel = layout.vessel
    if vessel is not None:
        middle = (slices - 1) // 2
        z = float(geometry.index_to_lps((middle, 0, 0))[2])
        out.append(
            TruthFinding(
                kind="vessel",
                center_lps_mm=(vessel.center_xy[0], vessel.center_xy[1], z),
                slice_index=middle,
                diameter_mm=vessel.diameter_mm,
                hu=vessel.hu,
            )
        )
    return tuple(out)


def generate_phantom(seed: int, spec: PhantomSpec | None = None) -> Phantom:
    """Build one phantom in memory (no disk I/O); the same seed gives the same phantom.

    Args:
        seed: integer >= 0; seeds the numpy Generator that draws every quantity and the noise,
            and derives the UIDs.
        spec: the ranges to sample from; the spec's defaults when None.

    Raises:
        ValueError: a negative or non-integer seed, or a spec that leaves no room for the content.
    """
    seed = _check_seed("seed", seed)
    spec = PhantomSpec() if spec is None else spec
    rng = np.random.default_rng(seed)
    layout = sample_layout(rng, spec)
    hu = render(layout, rng)
    grid = layout.grid
    geometry = Geometry(
        origin=grid.origin,
        row_direction=(1.0, 0.0, 0.0),
        column_direction=(0.0, 1.0, 0.0),
        slice_direction=(0.0, 0.0, 1.0),
        spacing=(grid.slice_spacing_mm, grid.pixel_mm, grid.pixel_mm),
    )
    return Phantom(
        hu=hu,
        geometry=geometry,
        findings=_findings(layout, geometry),
        body=layout.body,
        study_instance_uid=derived_uid(seed, "study"),
        series_instance_uid=derived_uid(seed, "series"),
        sop_instance_uids=tuple(derived_uid(seed, "image", k) for k in range(grid.slices)),
        patient_id=f"PHANTOM-{seed}",
        seed=seed,
    )


def study_seed(seed: int, index: int) -> int:
    """The seed of study ``index`` of a :func:`write_phantoms` run with ``seed``.

    A 64-bit value from numpy's SeedSequence spawning: study ``index`` does not depend on how many
    studies are written.
    """
    sequence = np.random.SeedSequence(_check_seed("seed", seed), spawn_key=(index,))
    return int(sequence.generate_state(1, dtype=np.uint64)[0])


def _study_name(index: int, n: int) -> str:
    return f"phantom_{index:0{max(4, len(str(n - 1)))}d}"


def write_phantoms(
    out_dir: Path,
    *,
    n: int,
    seed: int,
    nifti: bool = False,
    on_study: Callable[[Path], None] | None = None,
    spec: PhantomSpec | None = None,
) -> list[Path]:
    """Write ``n`` phantom studies under ``out_dir``, each with its ground truth.

    Layout, for study ``i`` (``phantom_0000``, ``phantom_0001``, ...)::

        out_dir/phantom_0000/dicom/<16 hex>.dcm   one file per slice, names carry no order
        out_dir/phantom_0000/image.nii.gz         with nifti=True
        out_dir/phantom_0000/truth.json           Phantom.truth_json() + run seed, files, spec

    Study ``i`` is generated from :func:`study_seed` ``(seed, i)``; its PatientID is
    ``PHANTOM-<seed>-<i>``. The same arguments write the same files.

    ``out_dir`` must not exist or be an empty folder: this function never writes into or over a
    folder that holds anything, so that it cannot mix its studies with other files or replace
    earlier ones. If writing fails half-way, the study being written is removed.

    Args:
        out_dir: folder to create (parents too).
        n: number of studies, >= 1.
        seed: run seed, >= 0.
        nifti: also write each study as NIfTI.
        on_study: called with each study folder once it is complete (e.g. to advance a
            progress bar).
        spec: the ranges to sample from; the spec's defaults when None.

    Returns:
        The study folders, in order.

    Raises:
        ConfigurationError: ``out_dir`` is a file or a non-empty folder, ``n`` < 1 or a bad seed.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigurationError(f"number of studies must be an integer >= 1, got {n!r}")
    try:
        seed = _check_seed("seed", seed)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ConfigurationError(f"{out_dir} is a file; give a folder to write phantoms into")
        if any(out_dir.iterdir()):
            raise ConfigurationError(
                f"{out_dir} is not empty; phantoms are only written into a new or empty folder "
                "(choose another folder or remove its contents)"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    folders: list[Path] = []
    for index in range(n):
        folder = out_dir / _study_name(index, n)
        try:
            _write_study(folder, seed, index, nifti=nifti, spec=spec)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        folders.append(folder)
        if on_study is not None:
            on_study(folder)
    logger.info("wrote %d phantom studies to %s", n, out_dir)
    return folders


def _write_study(
    folder: Path, seed: int, index: int, *, nifti: bool, spec: PhantomSpec | None
) -> None:
    phantom = generate_phantom(study_seed(seed, index), spec)
    phantom = replace(phantom, patient_id=f"PHANTOM-{seed}-{index}")
    write_dicom(phantom, folder / DICOM_FOLDER)
    if nifti:
        write_nifti(phantom, folder / NIFTI_NAME)
    truth = phantom.truth_json()
    truth["run"] = {"seed": seed, "index": index}
    truth["files"] = {"dicom": DICOM_FOLDER, "nifti": NIFTI_NAME if nifti else None}
    truth["spec"] = (PhantomSpec() if spec is None else spec).to_json()
    (folder / TRUTH_NAME).write_text(json.dumps(truth, indent=2) + "\n", encoding="utf-8")
    logger.debug("phantom %d: %d finding(s) in %s", index, len(phantom.findings), folder)
