"""Import image + label map pairs (NIfTI or NRRD images and label maps) as dataset rows.

A label map gives each voxel a label value; a label file says which values are lesions and which
are vessels (:func:`read_label_file`). From them:

- **lesions**: each 3-D connected component (26-connectivity: voxels touching by a face, edge or
  corner are one lesion) of a lesion label is one finding, measured by
  :func:`ingestion.dataset.recist.lesion_axes`. Components are numbered 1, 2, ... in the order of
  their first voxel in (slice, row, column) order;
- **vessels**: per vessel label, its largest 3-D connected component (26-connectivity; smaller
  pieces are left out, with a log line) gives ONE finding: its cross-section of largest diameter
  (:func:`ingestion.dataset.recist.vessel_sections`, sections touching the image's in-plane edge
  left out), with the vessel's whole z extent.

Left out, each with a line in the import report (file, item, reason), while the rest imports: a
lesion touching the image edge (in-plane, or the first or last slice: truncated), a lesion of
fewer than ``MIN_LESION_VOXELS`` voxels, a vessel with no whole section of at least
``MIN_SECTION_AREA_MM2``, a label map on another grid than its image (nothing is resampled).

Inputs (:func:`import_masks`): a label map file with its ``image`` (the input is the pair:
its provenance path reads ``LABELS on IMAGE``, so one label map imported on two images is two
inputs); or a folder of pairs:

- case folders: ``CASE/labels.nii.gz`` (or ``labels.nii`` / ``labels.nrrd`` / ``labels.seg.nrrd``)
  with ``CASE/image.nii.gz`` (or ``image.nii`` / ``image.nrrd``), or a ``CASE/dicom/`` series
  folder; the folder itself may be such a case;
- the Medical Segmentation Decathlon layout: ``imagesTr/`` and ``labelsTr/`` (and
  ``imagesTs/`` + ``labelsTs/`` where present) holding files of the same names; its
  ``dataset.json`` serves as the label file when none is given.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ingestion.dataset._label_grid import GridMismatch, on_image_grid, read_label_map
from ingestion.dataset.format import (
    DatasetFinding,
    DatasetStudy,
    ImageRef,
    ImportProgress,
    ImportResult,
    KindName,
    Label,
    Provenance,
    Skipped,
    SourceType,
    finding_id,
)
from ingestion.dataset.label_file import read_label_file
from ingestion.dataset.recist import VesselSection, lesion_axes, vessel_sections, z_range_lps_mm
from ingestion.errors import ConfigurationError, IngestionError
from ingestion.geometry import Geometry
from ingestion.load import load_path
from ingestion.volume import Modality, SourceFormat, Volume

__all__ = [
    "MIN_LESION_VOXELS",
    "MIN_SECTION_AREA_MM2",
    "finding_mask",
    "findings_from_labels",
    "import_masks",
]

logger = logging.getLogger(__name__)

MIN_LESION_VOXELS = 3
MIN_SECTION_AREA_MM2 = 20.0
TRUNCATED = "touches the image edge: truncated, not measured"

_LABEL_SUFFIXES = (".nii.gz", ".nii", ".seg.nrrd", ".nrrd", ".nhdr")
_IMAGE_FORMAT = {
    SourceFormat.DICOM: "dicom",
    SourceFormat.NIFTI: "nifti",
    SourceFormat.NRRD: "nrrd",
}

Roles = Mapping[int, tuple[str, str]]


# -- from a label array on the image's grid -------------------------------------------------------
def _components(mask: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.int32], int]:
    """26-connected components, numbered by their first voxel in (slice, row, column) order."""
    from scipy import ndimage

    labelled, count = ndimage.label(mask, structure=np.ones((3, 3, 3), dtype=bool))
    return np.asarray(labelled, dtype=np.int32), int(count)


def _touches_edge(box: tuple[slice, ...], shape: tuple[int, ...], *, axes: tuple[int, ...]) -> bool:
    return any(box[a].start == 0 or box[a].stop == shape[a] for a in axes)


@dataclass(frozen=True)
class _Context:
    geometry: Geometry
    study_instance_uid: str
    series_instance_uid: str
    image: ImageRef
    provenance: Provenance
    file: str

    def skipped(self, item: str, reason: str) -> Skipped:
        return Skipped(
            SourceType(self.provenance.source), self.provenance.path, self.file, item, reason
        )

    def finding(
        self, item: str, key: str, kind: KindName, name: str, **values: Any
    ) -> DatasetFinding:
        provenance = Provenance(
            self.provenance.source,
            self.provenance.path,
            item,
            self.provenance.annotator,
            self.provenance.licence,
            self.provenance.annotated_at,
        )
        return DatasetFinding(
            id=finding_id(self.provenance, self.series_instance_uid, key),
            study_instance_uid=self.study_instance_uid,
            series_instance_uid=self.series_instance_uid,
            image=self.image,
            kind=kind,
            label=Label.FINDING,
            name=name,
            provenance=provenance,
            **values,
        )


def _lesions(
    ctx: _Context, labels: npt.NDArray[np.integer[Any]], value: int, name: str
) -> tuple[list[DatasetFinding], list[Skipped]]:
    from scipy import ndimage

    findings: list[DatasetFinding] = []
    skipped: list[Skipped] = []
    components, count = _components(labels == value)
    boxes = ndimage.find_objects(components)
    for k in range(1, count + 1):
        item = f"label {value} ({name}), component {k}"
        box = boxes[k - 1]
        assert box is not None  # every label 1..count has a box
        mask = components[box] == k
        voxels = int(mask.sum())
        if _touches_edge(box, labels.shape, axes=(0, 1, 2)):
            skipped.append(ctx.skipped(item, TRUNCATED))
            continue
        if voxels < MIN_LESION_VOXELS:
            skipped.append(
                ctx.skipped(
                    item,
                    f"lesion of {voxels} voxel{'s' if voxels != 1 else ''} "
                    f"(< {MIN_LESION_VOXELS}): too small to measure",
                )
            )
            continue
        full = np.zeros(labels.shape, dtype=bool)
        full[box] = mask
        axes = lesion_axes(full, ctx.geometry)
        findings.append(
            ctx.finding(
                item,
                f"{ctx.file}: label {value} component {k}",
                "lesion",
                name,
                center_lps_mm=axes.center_lps_mm,
                slice_index=axes.slice_index,
                z_range_lps_mm=axes.z_range_lps_mm,
                long_axis_mm=axes.long_axis_mm,
                short_axis_mm=axes.short_axis_mm,
                long_axis_lps_mm=axes.long_axis_lps_mm,
                short_axis_lps_mm=axes.short_axis_lps_mm,
            )
        )
    return findings, skipped


def _vessel(
    ctx: _Context, labels: npt.NDArray[np.integer[Any]], value: int, name: str
) -> tuple[list[DatasetFinding], list[Skipped]]:
    from scipy import ndimage

    components, count = _components(labels == value)
    if count == 0:
        return [], []
    sizes = np.bincount(components.ravel(), minlength=count + 1)[1:]
    k = int(np.argmax(sizes)) + 1  # the first of equal sizes
    if count > 1:
        logger.info(
            "%s: label %d (%s): the largest of %d components (%d of %d voxels) is the vessel",
            ctx.file,
            value,
            name,
            count,
            int(sizes[k - 1]),
            int(sizes.sum()),
        )
    item = f"label {value} ({name}), component {k}"
    box = ndimage.find_objects(components)[k - 1]
    assert box is not None
    mask = np.zeros(labels.shape, dtype=bool)
    mask[box] = components[box] == k
    sections = [
        s
        for s in vessel_sections(mask, ctx.geometry, min_area_mm2=MIN_SECTION_AREA_MM2)
        if not s.touches_edge
    ]
    if not sections:
        return [], [
            ctx.skipped(
                item,
                f"vessel with no cross-section of at least {MIN_SECTION_AREA_MM2:g} mm^2 "
                "inside the image (sections touching the image edge are cut): not measured",
            )
        ]
    best: VesselSection = max(sections, key=lambda s: s.diameter_mm)  # first of equal ones
    finding = ctx.finding(
        item,
        f"{ctx.file}: label {value} component {k}",
        "vessel",
        name,
        center_lps_mm=best.center_lps_mm,
        slice_index=best.slice_index,
        z_range_lps_mm=z_range_lps_mm(mask, ctx.geometry),
        diameter_mm=best.diameter_mm,
        diameter_lps_mm=best.diameter_lps_mm,
    )
    return [finding], []


def findings_from_labels(
    labels: npt.NDArray[np.integer[Any]],
    geometry: Geometry,
    roles: Roles,
    *,
    study_instance_uid: str,
    series_instance_uid: str,
    image: ImageRef,
    provenance: Provenance,
    file: str,
) -> tuple[list[DatasetFinding], list[Skipped]]:
    """Dataset rows from a label array on an image's grid (module doc for the rules).

    Args:
        labels: integer (slices, rows, columns) array on the image's grid, 0 = background.
        geometry: the image's geometry.
        roles: label value -> (name, "lesion" | "vessel"); other values are ignored.
        study_instance_uid, series_instance_uid, image: the series the labels annotate.
        provenance: the input (its ``item`` is replaced per row); also the ids' input.
        file: the file the labels came from (for the import report).

    Row ids: :func:`~ingestion.dataset.format.finding_id` of ``provenance``, the series and
    ``"{file}: label {value} component {k}"``.

    Returns:
        The findings in label-value order (a lesion label's components in their order, a
        vessel label's one row) and the report lines of what was left out.

    Raises:
        ValueError: ``labels`` is not 3-D, or a role is neither "lesion" nor "vessel".
    """
    labels = np.asarray(labels)
    if labels.ndim != 3:
        raise ValueError(f"labels must be a (slices, rows, columns) array, got {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be an integer array, got {labels.dtype}")
    ctx = _Context(geometry, study_instance_uid, series_instance_uid, image, provenance, file)
    findings: list[DatasetFinding] = []
    skipped: list[Skipped] = []
    present = set(np.unique(labels).tolist())
    for value in sorted(roles):
        name, kind = roles[value]
        if kind not in ("lesion", "vessel"):
            raise ValueError(f"label {value} ({name}): role must be lesion or vessel, got {kind!r}")
        if value not in present:
            logger.info("%s: label %d (%s) is not in the label map", file, value, name)
            continue
        make = _lesions if kind == "lesion" else _vessel
        found, left_out = make(ctx, labels, int(value), name)
        findings.extend(found)
        skipped.extend(left_out)
    return findings, skipped


# -- pairs of label map and image -----------------------------------------------------------------
def _is_label_map(path: Path) -> bool:
    return path.is_file() and not path.name.startswith(".") and path.name.endswith(_LABEL_SUFFIXES)


def _case_pair(folder: Path) -> tuple[Path, Path | None] | None:
    """(labels, image) of a case folder, None when it holds no labels file."""
    labels = next(
        (folder / f"labels{s}" for s in _LABEL_SUFFIXES if (folder / f"labels{s}").is_file()), None
    )
    if labels is None:
        return None
    if (folder / "dicom").is_dir():
        return labels, folder / "dicom"
    image = next(
        (
            folder / f"image{s}"
            for s in (".nii.gz", ".nii", ".nrrd")
            if (folder / f"image{s}").is_file()
        ),
        None,
    )
    return labels, image


def _pairs(source: Path, image: Path | None) -> tuple[list[tuple[Path, Path | None]], Path | None]:
    """The (label map, image) pairs of ``source`` (module doc) and the MSD dataset.json where
    there is one."""
    if source.is_file():
        if image is None:
            raise ConfigurationError(
                f"{source}: give the image this label map annotates (a DICOM series folder, a "
                "NIfTI or an NRRD file)"
            )
        return [(source, image)], None
    if not source.is_dir():
        raise ConfigurationError(f"{source}: no such file or folder")
    if image is not None:
        raise ConfigurationError(
            f"{source} is a folder of pairs: the image of each label map is found beside it; "
            "give --image only with a single label map file"
        )
    pairs: list[tuple[Path, Path | None]] = []
    msd = [(source / f"labels{p}", source / f"images{p}") for p in ("Tr", "Ts")]
    msd = [(lab, img) for lab, img in msd if lab.is_dir() and img.is_dir()]
    if msd:
        for labels_dir, images_dir in msd:
            for labels in sorted(p for p in labels_dir.iterdir() if _is_label_map(p)):
                found = images_dir / labels.name
                pairs.append((labels, found if found.is_file() else None))
        info = source / "dataset.json"
        return pairs, info if info.is_file() else None
    own = _case_pair(source)
    if own is not None:
        return [own], None
    for folder in sorted(p for p in source.iterdir() if p.is_dir()):
        case = _case_pair(folder)
        if case is not None:
            pairs.append(case)
    if not pairs:
        raise ConfigurationError(
            f"{source}: no label maps found: give a label map file with its image, a folder of "
            "case folders each with labels.nii.gz and image.nii.gz (or dicom/), or a Medical "
            "Segmentation Decathlon folder (imagesTr/, labelsTr/)"
        )
    return pairs, None


def _load_image(path: Path, modality: str | None) -> Volume | str:
    """The one series at ``path``, or why not."""
    try:
        loaded = load_path(path, nifti_modality=Modality(modality) if modality else None)
    except IngestionError as error:
        return f"image cannot be loaded: {error}"
    if not loaded.volumes:
        reasons = sorted({r.reason for r in loaded.rejected}) or ["no image found"]
        more = f" (and {len(reasons) - 1} more reasons)" if len(reasons) > 1 else ""
        return f"image cannot be loaded: {reasons[0]}{more}"
    if len(loaded.volumes) > 1:
        uids = ", ".join(v.identifiers.series_instance_uid for v in loaded.volumes)
        return (
            f"image holds {len(loaded.volumes)} series ({uids}); a label map annotates one: give "
            "that series' folder"
        )
    return loaded.volumes[0]


def import_masks(
    source: Path,
    *,
    image: Path | None = None,
    label_file: Path | None = None,
    annotator: str = "unknown",
    licence: str = "unknown",
    modality: str | None = None,
    on_item: ImportProgress | None = None,
) -> ImportResult:
    """Import label maps with their images (module doc).

    Args:
        source: a label map (NIfTI or NRRD) or a folder of pairs (module doc).
        image: the image a single label map annotates: a DICOM series folder, a NIfTI or an
            NRRD file.
        label_file: JSON saying which labels are lesions and vessels (:func:`read_label_file`);
            a Decathlon folder's dataset.json serves when none is given.
        annotator, licence: recorded in every row's provenance.
        modality: "CT" or "MR" for NIfTI and NRRD images (which do not record it).
        on_item: progress, called before each pair.

    Raises:
        ConfigurationError: no label file, an unusable label file, a source with no label map,
            an unknown modality.
    """
    source = Path(source)
    if modality is not None and modality not in {m.value for m in Modality}:
        raise ConfigurationError(f"modality must be CT or MR, got {modality!r}")
    pairs, msd_info = _pairs(source, None if image is None else Path(image))
    if label_file is None and msd_info is None:
        raise ConfigurationError(
            f"{source}: a label file is needed to say which labels are lesions and which are "
            'vessels, e.g. {"1": "lesion", "2": "vessel"} or {"52": "aorta"}'
        )
    roles = read_label_file(Path(label_file) if label_file is not None else msd_info)  # type: ignore[arg-type]
    annotated = tuple(sorted({kind for _, kind in roles.values()}))
    # the input: a folder of pairs, or one label map ON its image (two images may share a label
    # map, e.g. two copies of one series: they are two inputs, neither replaces the other)
    input_path = str(source.resolve())
    if image is not None:
        input_path = f"{input_path} on {Path(image).resolve()}"
    provenance = Provenance(SourceType.MASKS, input_path, "", annotator, licence)
    studies: list[DatasetStudy] = []
    findings: list[DatasetFinding] = []
    skipped: list[Skipped] = []

    def skip(file: Path, reason: str) -> None:
        skipped.append(Skipped(SourceType.MASKS, provenance.path, str(file), "", reason))

    for done, (labels_path, image_path) in enumerate(pairs):
        if on_item is not None:
            on_item(done, len(pairs), str(labels_path))
        if image_path is None:
            skip(
                labels_path,
                "no image beside this label map (image.nii.gz, image.nrrd, dicom/ or imagesTr/)",
            )
            continue
        if labels_path.is_file() and labels_path.stat().st_size == 0:
            skip(labels_path, "the label map is empty (0 bytes)")
            continue
        volume = _load_image(image_path, modality)
        if isinstance(volume, str):
            skip(image_path, volume)
            continue
        try:
            labels, grid = read_label_map(labels_path)
            labels = on_image_grid(labels, grid, volume.shape, volume.geometry)
        except GridMismatch as error:
            skip(
                labels_path,
                f"label map grid differs from the image's: {error}; nothing is resampled",
            )
            continue
        except Exception as error:  # MONAI's readers raise many types for a bad file
            first = next(iter(str(error).strip().splitlines()), "")  # not every reader's traceback
            skip(labels_path, f"label map cannot be read ({type(error).__name__}: {first})")
            continue
        ids = volume.identifiers
        ref = ImageRef(
            path=str(image_path.resolve()),
            format=_IMAGE_FORMAT[volume.source_format],
            modality=volume.modality.value if volume.modality is not None else modality,
        )
        studies.append(
            DatasetStudy(
                ids.study_instance_uid, ids.series_instance_uid, ref, annotated, provenance
            )
        )
        found, left_out = findings_from_labels(
            labels,
            volume.geometry,
            roles,
            study_instance_uid=ids.study_instance_uid,
            series_instance_uid=ids.series_instance_uid,
            image=ref,
            provenance=provenance,
            file=str(labels_path),
        )
        findings.extend(found)
        skipped.extend(left_out)
    return ImportResult(
        SourceType.MASKS, provenance.path, tuple(studies), tuple(findings), tuple(skipped)
    )


def finding_mask(root: Path, finding: DatasetFinding, volume: Volume) -> npt.NDArray[np.bool_]:
    """The voxels of ``finding``'s label map (``finding.mask``) that are the finding, on
    ``volume``'s grid (slice, row, column); nothing is resampled.

    Raises:
        IngestionError: the finding names no mask, or its label map is unreadable, on another
            grid, or holds no voxel of its label; named with the file and what to do.
    """
    if finding.mask is None:
        raise IngestionError(f"finding {finding.id} names no label map (its mask)")
    path = finding.mask.resolve(root)
    try:
        labels, grid = read_label_map(path)
        labels = on_image_grid(labels, grid, volume.shape, volume.geometry)
    except GridMismatch as error:
        raise IngestionError(
            f"{path}: the label map's grid differs from its image's ({error}); nothing is "
            "resampled: import it again with its own image"
        ) from None
    except IngestionError:
        raise
    except Exception as error:  # MONAI's readers raise many types for a bad file
        first = next(iter(str(error).strip().splitlines()), "")
        raise IngestionError(
            f"{path}: the label map cannot be read ({type(error).__name__}: {first})"
        ) from None
    mask: npt.NDArray[np.bool_] = labels == finding.mask.label
    if not mask.any():
        raise IngestionError(f"{path}: no voxel holds the finding's label {finding.mask.label}")
    return mask
