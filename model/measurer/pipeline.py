"""The measurer a checkpoint makes: find, group, measure, calibrate (``Measurer`` protocol).

``CheckpointMeasurer.measure(volume)``:

1. checks that the model can handle the volume (CT, spacing near the training range, enough
   slices); otherwise ``ModelError`` with the reason and what to do;
2. prepares it for the find task (``ingestion.prepare``, MONAI) and asks one find prompt per
   examined plane (planes at least :attr:`InferenceOptions.find_plane_mm` apart), batched,
   once per shifted pass of the checkpoint's ``find_voting`` (``model.measurer.voting``:
   boxes shifted back and voted per plane); a malformed answer drops that plane's boxes in
   that pass and is counted in the result's warnings;
3. joins the boxes into findings (``model.measurer.grouping``);
4. confirms the candidates with the point task where the checkpoint asks for it; with
   :attr:`InferenceOptions.verify_neighbours` (off by default), a candidate the point task sees
   nothing at is asked again one find token away (8 places) and moves to the first place where
   the point task sees its kind (a find step trained at a new scale put some boxes exactly
   one merged token off); then, with :attr:`InferenceOptions.contrast_proposals` (on by
   default), asks the point task at each region of the examined planes that differs from the
   tissue around it and that no candidate covers (``model.measurer.proposals``), and adds a
   finding of the kind it names there: the small find step misses some lesions, or boxes them
   one token off on every plane, while the point task, on a finer crop, tells them;
5. re-centres each finding in the axial plane on the middle of its long axis (or diameter), as
   the axes task draws it on a crop at the grouped centre (the find step's boxes are coarse:
   1.75 mm pixels, centres several mm off), for checkpoints trained on the axes task; then
   merges candidates split along z (``grouping.merge_duplicates``); a "vessel" whose centre is
   not contrast-filled through the study (no tube: :attr:`InferenceOptions.contrast_tubes`;
   without it, seen on fewer than half of the examined planes and not contrast-filled)
   becomes a lesion (``consolidate.short_vessels_as_lesions``), and a contrast-filled
   "lesion" that runs through the study as a tube becomes a vessel
   (``consolidate.long_lesions_as_vessels``);
6. measures each finding on a crop at its centre (``model.measurer.inference``) and attaches the
   checkpoint's calibrated ranges; a lesion also on :attr:`InferenceOptions.lesion_planes`
   examined planes to either side, keeping the plane where its long axis is longest (RECIST;
   ``model.measurer.planes``), which becomes its centre's z; a malformed answer makes its
   measurements "not measurable";
7. drops findings centred in air (``consolidate.centred_in_air``), draws the axes on the
   measured crop and reports each vessel and each lesion once (``model.measurer.consolidate``:
   vessel pieces split along z, a lesion inside a larger one's measured ellipse, or inside a
   vessel where either centre is a contrast-filled tube through the study; without tubes,
   where the vessel runs through the study or the lesion's centre is contrast-filled).

Both HU rules read "contrast-filled" as a centre median of at least
:attr:`InferenceOptions.vessel_min_hu` (the phantom spec's 150 HU: contrast CT), a tube as a
centre whose median is at least :attr:`InferenceOptions.tube_min_hu` (120 HU) on at least 80 %
of the slices; for studies without contrast, switch them off (``short_vessels_as_lesions``,
``contrast_filled_lesions_in_vessels`` and ``contrast_tubes``) or set the thresholds.

``measure_at`` answers the point task on a crop centred at the clicked point.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ingestion.errors import ModelError
from ingestion.volume import Modality, Volume
from model.measurer.axes import Segment, parse_axes
from model.measurer.checkpoint import LoadedMeasurer, checkpoint_hash, load_checkpoint
from model.measurer.consolidate import (
    TUBE_MIN_HU,
    VESSEL_MIN_HU,
    centred_in_air,
    consolidate,
    is_tube,
    long_lesions_as_vessels,
    short_vessels_as_lesions,
)
from model.measurer.data import axes_example, measure_example, point_example
from model.measurer.find import FindExample, FindInputs, find_frames, prepare_for_find
from model.measurer.grouping import (
    GroupedFinding,
    GroupingRule,
    group_detections,
    merge_duplicates,
    plane_detections,
)
from model.measurer.images import SIDE_MULTIPLE
from model.measurer.inference import (
    MeasureOutcome,
    generate_texts,
    measure_findings,
    outcome_for,
)
from model.measurer.planes import best_plane, search_points
from model.measurer.proposals import (
    BODY_MIN_HU,
    ProposalRule,
    contrast_proposals,
    uncovered,
    window_to_hu,
)
from model.measurer.results import (
    MEASUREMENTS_OF,
    FindingKind,
    Measurement,
    ModelInfo,
    Segment3,
    StudyFinding,
    StudyResult,
    renumber,
)
from model.measurer.tasks import (
    FoundFinding,
    ParsedMeasure,
    find_prompt,
    parse_find,
    parse_point,
)
from model.measurer.tokenizer import special_ids
from model.measurer.voting import FindVoting, shift_planes, unshift_findings, vote_boxes
from model.numeric.hf import NumericLM

__all__ = ["CheckpointMeasurer", "InferenceOptions", "SupportedRange"]

logger = logging.getLogger(__name__)

MAX_FIND_TOKENS = 80  # six findings of 12 tokens, "end" and the end token
MAX_FIND_TOKENS_DIGITS = 200  # the same with numbers as digits (standard tokens: up to 5 each)
MAX_AXES_TOKENS = 64  # two segments of 4 numbers; digits fit too


@dataclass(frozen=True)
class SupportedRange:
    """Volumes the model is allowed to measure (the phantom spec's ranges with a margin)."""

    pixel_mm: tuple[float, float] = (0.4, 1.5)
    slice_mm: tuple[float, float] = (0.5, 7.5)
    min_slices: int = 3


@dataclass(frozen=True)
class InferenceOptions:
    """How inference runs (not part of the checkpoint)."""

    find_plane_mm: float = 2.0
    find_batch: int = 64
    measure_batch: int = 16
    verify: bool | None = None  # confirm candidates with the point task; None: as the checkpoint
    # where the point task sees nothing at a candidate, also ask one find token away (8 places)
    verify_neighbours: bool = False
    # shifted find passes and how many must agree on a box; None: as the checkpoint says
    find_voting: FindVoting | None = None
    recentre: bool = True  # move centres to the middle of the axes (checkpoints with the axes task)
    lesion_planes: int = 6  # examined planes on either side where a lesion is also measured
    consolidate: bool = True  # one report per vessel and per lesion (model.measurer.consolidate)
    # a "vessel" seen on < half the planes, not contrast-filled, is a lesion (consolidate module)
    short_vessels_as_lesions: bool = True
    # a contrast-filled "lesion" inside a vessel is a piece of it (consolidate module)
    contrast_filled_lesions_in_vessels: bool = True
    # a contrast-filled "lesion" that runs through the study as a tube is a vessel (consolidate)
    long_lesions_as_vessels: bool = True
    # a finding's centre contrast-filled through the study (a tube) decides lesion or vessel
    # where the two meet: the consolidate module's "tubes"; threshold ``tube_min_hu``
    contrast_tubes: bool = True
    tube_min_hu: float = TUBE_MIN_HU
    drop_air_centred: bool = True  # a finding whose centre is air (< -500 HU) is dropped
    # regions of the find planes that differ from the tissue, where no find candidate is, are
    # asked to the point task, which decides whether and what a finding is there
    contrast_proposals: bool = True
    proposals: ProposalRule = field(default_factory=ProposalRule)
    vessel_min_hu: float = VESSEL_MIN_HU  # "contrast-filled" for both rules above
    grouping: GroupingRule = field(default_factory=GroupingRule)
    supported: SupportedRange = field(default_factory=SupportedRange)

    def __post_init__(self) -> None:
        for name in ("vessel_min_hu", "tube_min_hu"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > -1000.0):
                raise ValueError(
                    f"{name} must be a finite HU value above air (-1000), got {value!r}"
                )


class CheckpointMeasurer:
    """A measurer checkpoint ready for inference (implements ``model.measurer.Measurer``)."""

    def __init__(
        self,
        loaded: LoadedMeasurer,
        *,
        device: str | torch.device | None = None,
        options: InferenceOptions | None = None,
        directory: str | Path | None = None,
    ) -> None:
        self.loaded = loaded
        self.directory = None if directory is None else Path(directory)
        self._hash: str | None = None
        self.options = options or InferenceOptions()
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        model: Any = loaded.model
        if self.device.type == "cuda":
            model.to(self.device, dtype=torch.bfloat16)
        else:
            model.to(self.device)
        head: Any = loaded.head
        if head is not None:
            head.to(self.device)
        ids = special_ids(loaded.tokenizer)
        self.ids = ids
        self.lm = NumericLM(model, loaded.head, ids["num"] if head is not None else None).eval()

    @classmethod
    def load(
        cls,
        directory: str | Path,
        *,
        device: str | torch.device | None = None,
        options: InferenceOptions | None = None,
    ) -> CheckpointMeasurer:
        """Load a checkpoint directory (``ModelError`` if it is not one)."""
        return cls(load_checkpoint(directory), device=device, options=options, directory=directory)

    @property
    def checkpoint_hash(self) -> str:
        """sha256 of the checkpoint directory's files (``checkpoint.checkpoint_hash``)."""
        if self._hash is None:
            if self.directory is None:
                raise ModelError(
                    "this measurer was not loaded from a directory: no checkpoint hash"
                )
            self._hash = checkpoint_hash(self.directory)
        return self._hash

    @property
    def info(self) -> ModelInfo:
        settings = self.loaded.settings
        return ModelInfo(
            settings.name,
            settings.version,
            settings.numeric_mode.value,
            settings.not_for_clinical_use,
        )

    # --- the protocol --------------------------------------------------------------------------

    def measure(self, volume: Volume, *, source: str) -> StudyResult:
        """All findings of ``volume`` (module doc)."""
        self._check(volume)
        warnings: list[str] = []
        if self.loaded.settings.calibration is None:
            warnings.append(
                f"{self.info.name} {self.info.version} is not calibrated: its values have no "
                "ranges; run 'radcaliper calibrate' on the checkpoint before using them"
            )
        grouped, plane_spacing, examined, proposals = self._find(volume, warnings)
        options = self.options
        verify = options.verify
        if verify is None:
            verify = self.loaded.settings.verify_candidates
        if verify:
            grouped = self._verify(volume, grouped, warnings)
        if proposals:
            grouped = grouped + self._decide_proposals(
                volume, uncovered(proposals, grouped, plane_spacing), warnings
            )
        if options.recentre:
            grouped = self._recentre(volume, grouped, warnings)
            grouped = merge_duplicates(grouped, plane_spacing, options.grouping)
        if options.short_vessels_as_lesions or options.long_lesions_as_vessels:
            hu = [_centre_hu(volume, g.center_lps_mm) for g in grouped]
            if options.short_vessels_as_lesions:
                grouped = short_vessels_as_lesions(
                    grouped, examined, hu, options.vessel_min_hu, self._tubes(volume, grouped)
                )
            if options.long_lesions_as_vessels:
                grouped = long_lesions_as_vessels(
                    grouped, examined, plane_spacing, hu, options.vessel_min_hu
                )
        grouped, outcomes = self._measure(volume, grouped, plane_spacing, warnings)
        hu = [_centre_hu(volume, g.center_lps_mm) for g in grouped]  # centres moved
        if options.drop_air_centred:
            keep = [i for i, air in enumerate(centred_in_air(hu)) if not air]
            grouped = [grouped[i] for i in keep]
            outcomes, hu = [outcomes[i] for i in keep], [hu[i] for i in keep]
        axes = self._axes(volume, grouped, warnings)
        if options.consolidate:
            filled = hu if options.contrast_filled_lesions_in_vessels else None
            tubes = self._tubes(volume, grouped)
            keep = consolidate(
                grouped, outcomes, examined, filled, options.vessel_min_hu, axes, tubes
            )
            grouped = [grouped[i] for i in keep]
            outcomes, axes = [outcomes[i] for i in keep], [axes[i] for i in keep]
        findings = [
            StudyFinding(
                0,
                g.kind,
                g.center_lps_mm,
                _source_slice(volume, g.center_lps_mm),
                o.measurements,
                a,
            )
            for g, o, a in zip(grouped, outcomes, axes, strict=True)
        ]
        identifiers = volume.identifiers
        return StudyResult(
            study_instance_uid=identifiers.study_instance_uid,
            series_instance_uid=identifiers.series_instance_uid,
            patient_id=identifiers.patient_id or "",
            source=source,
            model=self.info,
            findings=renumber(findings),
            warnings=tuple(warnings),
        )

    def measure_at(
        self, volume: Volume, point_lps_mm: tuple[float, float, float]
    ) -> StudyFinding | None:
        """The finding under a clicked point, or None when the model sees none there.

        Raises ``ModelError`` when the answer is malformed before it names a kind.
        """
        self._check(volume)
        point = tuple(float(v) for v in point_lps_mm)
        if len(point) != 3 or not all(math.isfinite(v) for v in point):
            raise ValueError(f"point_lps_mm must be three finite numbers, got {point_lps_mm!r}")
        inputs = self.loaded.settings.measure_inputs
        example = point_example(volume, point, inputs)
        text = self._generate([example], max_new_tokens=16)[0]
        parsed = parse_point(text)
        if parsed.success and parsed.kind is None:
            return None
        if not parsed.success:
            if parsed.kind is None:
                raise ModelError(
                    f"the model's answer at this point was malformed ({parsed.reason}); "
                    "nothing was measured there"
                )
            reason = f"malformed model answer {text!r}: {parsed.reason}"
            kind = parsed.kind
            measurements = tuple(
                Measurement.not_measurable(name, reason) for name in MEASUREMENTS_OF[kind]
            )
            logger.warning("the point answer was malformed (not measurable)")
        else:
            assert parsed.kind is not None
            kind = parsed.kind
            calibration = self.loaded.settings.calibration
            as_measure = ParsedMeasure(parsed.values, True)
            measurements = outcome_for(kind, text, calibration, as_measure).measurements
        center = (point[0], point[1], point[2])
        return StudyFinding(1, kind, center, _source_slice(volume, center), measurements)

    # --- steps ---------------------------------------------------------------------------------

    def _check(self, volume: Volume) -> None:
        if volume.modality is Modality.MR:
            raise ModelError(
                f"{self.info.name} {self.info.version} is trained on CT only and cannot measure "
                "MR studies"
            )
        if volume.modality is None:
            raise ModelError(
                "the volume's modality is unknown (NIfTI records none); set "
                "RADCALIPER_NIFTI_MODALITY=CT if it is a CT in Hounsfield units"
            )
        supported = self.options.supported
        spacing = volume.geometry.spacing  # (slice, row, column)
        pixel = max(spacing[1], spacing[2])
        if not supported.pixel_mm[0] <= pixel <= supported.pixel_mm[1]:
            raise ModelError(
                f"pixel spacing {pixel:g} mm is outside what {self.info.name} was trained for "
                f"({supported.pixel_mm[0]:g}-{supported.pixel_mm[1]:g} mm); not measured"
            )
        if not supported.slice_mm[0] <= spacing[0] <= supported.slice_mm[1]:
            raise ModelError(
                f"slice spacing {spacing[0]:g} mm is outside what {self.info.name} was trained "
                f"for ({supported.slice_mm[0]:g}-{supported.slice_mm[1]:g} mm); not measured"
            )
        if volume.shape[0] < supported.min_slices:
            raise ModelError(
                f"{volume.shape[0]} slice(s): the model needs at least {supported.min_slices} "
                "axial slices to find lesions"
            )

    def _find(
        self, volume: Volume, warnings: list[str]
    ) -> tuple[list[Any], float, int, list[GroupedFinding]]:
        """Candidates from the find answers, the distance between examined planes (mm), how
        many planes were examined, and the contrast proposals of those planes (kind: lesion,
        until the point task names it; none where the option is off)."""
        inputs = self.loaded.settings.find_inputs
        prepared = prepare_for_find(volume, inputs)
        native = prepared.geometry.slice_spacing
        stride = max(1, round(self.options.find_plane_mm / native))
        planes = list(range(0, prepared.shape[0], stride))
        voting = self.options.find_voting or self.loaded.settings.find_voting
        windows = prepared.image[:, planes].transpose(0, 1)  # (P, 2, H, W)
        passes: list[list[list[FoundFinding]]] = []
        malformed = 0
        for rows, columns in voting.shifts:
            answers, bad = self._find_pass(shift_planes(windows, rows, columns), inputs)
            passes.append([unshift_findings(found, rows, columns) for found in answers])
            malformed += bad
        total = len(planes) * len(voting.shifts)
        if malformed:
            warnings.append(
                f"{malformed} of {total} find answers were malformed; their planes were "
                "not searched" + (" in those passes" if len(voting.shifts) > 1 else "")
            )
            logger.warning("%d of %d find answers were malformed", malformed, total)
        voted = passes[0]
        if not voting.single:
            voted = [
                vote_boxes(per_plane, voting.votes, keep_unaliased=voting.keep_unaliased)
                for per_plane in zip(*passes, strict=True)
            ]
        detections = plane_detections(voted, planes, prepared.geometry)
        spacing = native * stride
        grouped = group_detections(detections, spacing, self.options.grouping)
        proposals: list[GroupedFinding] = []
        if self.options.contrast_proposals and self._proposals_apply(warnings):
            hu = window_to_hu(prepared.image[1, planes].numpy(), inputs.wide_window)
            for p in contrast_proposals(hu, inputs.pixel_mm, self.options.proposals):
                x, y, z = prepared.index_to_lps([planes[p.plane], p.row, p.column])
                centre = (float(x), float(y), float(z))
                proposals.append(GroupedFinding(FindingKind.LESION, centre, p.planes, p.size_mm))
        return grouped, spacing, len(planes), proposals

    def _find_pass(self, windows: torch.Tensor, inputs: FindInputs) -> tuple[list[Any], int]:
        """One find prompt per (P, 2, H, W) plane: the parsed boxes of each (none where the
        answer was malformed) and how many answers were malformed."""
        prompt = find_prompt(1)
        limit = MAX_FIND_TOKENS if self.lm.numeric_head is not None else MAX_FIND_TOKENS_DIGITS
        examples = [FindExample(image, prompt, None) for image in find_frames(windows, inputs)]
        answers: list[Sequence[FoundFinding]] = []
        malformed = 0
        batch = self.options.find_batch
        for start in range(0, len(examples), batch):
            for text in self._generate(examples[start : start + batch], limit):
                parsed = parse_find(text, num_images=1)
                if not parsed.success:
                    malformed += 1
                    logger.debug("malformed find answer: %s", parsed.reason)
                answers.append(parsed.findings if parsed.success else ())
        return answers, malformed

    def _proposals_apply(self, warnings: list[str]) -> bool:
        """Whether this checkpoint can use contrast proposals: the point task decides on them,
        and the find step's wide window must tell air from fat (reach ``BODY_MIN_HU``)."""
        settings = self.loaded.settings
        if "point" not in settings.tasks:
            return False
        level, width = settings.find_inputs.wide_window
        if level - width / 2 > BODY_MIN_HU:
            warnings.append(
                f"contrast proposals were not used: the find step's wide window starts at "
                f"{level - width / 2:g} HU and cannot tell the body from air (needs "
                f"<= {BODY_MIN_HU:g} HU); set InferenceOptions.contrast_proposals=False"
            )
            return False
        return True

    def _decide_proposals(
        self, volume: Volume, proposals: Sequence[GroupedFinding], warnings: list[str]
    ) -> list[GroupedFinding]:
        """The proposals where the point task, asked at their centres, names a finding, with
        its kind; a malformed answer keeps nothing (no evidence for a finding)."""
        if not proposals:
            return []
        kept, malformed = [], 0
        texts = self._point_texts(volume, [p.center_lps_mm for p in proposals])
        for proposal, text in zip(proposals, texts, strict=True):
            parsed = parse_point(text)
            if not parsed.success:
                malformed += 1
            elif parsed.kind is not None:
                kept.append(dataclasses.replace(proposal, kind=parsed.kind))
        if malformed:
            warnings.append(
                f"{malformed} of {len(proposals)} point answers at contrast proposals were "
                "malformed; nothing was added there"
            )
        logger.debug("the point task took %d of %d contrast proposals", len(kept), len(proposals))
        return kept

    def _recentre(self, volume: Volume, grouped: Sequence[Any], warnings: list[str]) -> list[Any]:
        """Move each candidate's axial-plane centre to the middle of the first segment (long
        axis or diameter) of its axes answer; z stays. Unchanged where the checkpoint has no
        axes task or the answer was malformed (counted in the warnings)."""
        if "axes" not in self.loaded.settings.tasks or not grouped:
            return list(grouped)
        scratch: list[str] = []
        axes = self._axes(volume, grouped, scratch)
        warnings.extend(f"{w} (re-centring; centres kept)" for w in scratch)
        out = []
        for candidate, segments in zip(grouped, axes, strict=True):
            if not segments:
                out.append(candidate)
                continue
            a, b = segments[0]
            x, y = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
            out.append(
                dataclasses.replace(candidate, center_lps_mm=(x, y, candidate.center_lps_mm[2]))
            )
        return out

    def _measure(
        self, volume: Volume, grouped: Sequence[Any], plane_spacing: float, warnings: list[str]
    ) -> tuple[list[Any], list[MeasureOutcome]]:
        """Measure every finding; a lesion on the plane where it is largest among its centre's
        and ``lesion_planes`` planes to either side (``model.measurer.planes``), its centre moved
        to that plane. Returns the findings and their outcomes."""
        inputs = self.loaded.settings.measure_inputs
        points = [
            search_points(
                volume, g.center_lps_mm, g.kind, self.options.lesion_planes, plane_spacing
            )
            for g in grouped
        ]
        examples = [
            measure_example(volume, point, g.kind, inputs)
            for g, candidates in zip(grouped, points, strict=True)
            for point in candidates
        ]
        answers = measure_findings(
            self.lm,
            self.loaded.tokenizer,
            examples,
            calibration=self.loaded.settings.calibration,
            batch_size=self.options.measure_batch,
            device=self.device,
        )
        failed = sum(not o.parsed for o in answers)
        if failed:
            warnings.append(f"{failed} of {len(answers)} measure answers were malformed")
        kept, outcomes, start = [], [], 0
        for g, candidates in zip(grouped, points, strict=True):
            chunk = answers[start : start + len(candidates)]
            start += len(candidates)
            best = best_plane(chunk, [c[2] - g.center_lps_mm[2] for c in candidates])
            kept.append(dataclasses.replace(g, center_lps_mm=candidates[best]))
            outcomes.append(chunk[best])
        return kept, outcomes

    def _verify(self, volume: Volume, grouped: Sequence[Any], warnings: list[str]) -> list[Any]:
        """Keep the candidates that the point task, asked at their centres, calls a finding;
        its kind wins over the find step's (it sees the finding at a higher resolution)."""
        if not grouped:
            return []
        kept = []
        unseen = []
        malformed = 0
        texts = self._point_texts(volume, [g.center_lps_mm for g in grouped])
        for candidate, text in zip(grouped, texts, strict=True):
            parsed = parse_point(text)
            if not parsed.success:
                malformed += 1
                kept.append(candidate)  # no answer is no evidence against it
            elif parsed.kind is None:
                unseen.append(candidate)
            else:
                kept.append(dataclasses.replace(candidate, kind=parsed.kind))
        dropped = len(unseen)
        if self.options.verify_neighbours and unseen:
            moved = self._verify_neighbours(volume, unseen)
            kept.extend(moved)
            dropped -= len(moved)
        if malformed:
            warnings.append(f"{malformed} of {len(grouped)} point answers were malformed")
        logger.debug("verification dropped %d of %d candidates", dropped, len(grouped))
        return kept

    def _verify_neighbours(self, volume: Volume, unseen: Sequence[Any]) -> list[Any]:
        """Candidates the point task saw nothing at, moved to the first of the 8 places one find
        token away (``SIDE_MULTIPLE`` find pixels: the find step's boxes are sometimes off by
        exactly one merged token), side neighbours first, where it sees the candidate's kind;
        those seen nowhere are left out. Order is not kept."""
        step = SIDE_MULTIPLE * self.loaded.settings.find_inputs.pixel_mm
        offsets = sorted(
            ((dx, dy) for dx in (-step, 0.0, step) for dy in (-step, 0.0, step) if dx or dy),
            key=lambda o: abs(o[0]) + abs(o[1]),
        )
        centres = [
            (x + dx, y + dy, z)
            for x, y, z in (c.center_lps_mm for c in unseen)
            for dx, dy in offsets
        ]
        texts = self._point_texts(volume, centres)
        n = len(offsets)
        moved = []
        for k, candidate in enumerate(unseen):
            for centre, text in zip(
                centres[n * k : n * (k + 1)], texts[n * k : n * (k + 1)], strict=True
            ):
                parsed = parse_point(text)
                if parsed.success and parsed.kind is candidate.kind:
                    moved.append(dataclasses.replace(candidate, center_lps_mm=centre))
                    break
        return moved

    def _axes(
        self, volume: Volume, grouped: Sequence[Any], warnings: list[str]
    ) -> list[tuple[Segment3, ...] | None]:
        """Each finding's axes in LPS (model.measurer.axes), or None: the model was not trained
        on the axes task, or its answer was malformed (counted in the warnings)."""
        if "axes" not in self.loaded.settings.tasks or not grouped:
            return [None] * len(grouped)
        inputs = self.loaded.settings.measure_inputs
        out: list[tuple[Segment3, ...] | None] = []
        malformed = 0
        batch = self.options.measure_batch
        for start in range(0, len(grouped), batch):
            chunk = grouped[start : start + batch]
            examples = [axes_example(volume, g.center_lps_mm, g.kind, inputs) for g in chunk]
            texts = self._generate([e for e in examples if e is not None], MAX_AXES_TOKENS)
            for example, text in zip(examples, texts, strict=True):
                assert example is not None  # without truth an axes example is always made
                parsed = parse_axes(text, example.kind)
                if not parsed.success:
                    malformed += 1
                    out.append(None)
                    continue
                frame = (example.crop.image.shape[0] - 1) / 2
                out.append(tuple(_segment_lps(example.crop, frame, s) for s in parsed.segments))
        if malformed:
            warnings.append(f"{malformed} of {len(grouped)} axes answers were malformed")
        return out

    def _tubes(self, volume: Volume, grouped: Sequence[Any]) -> list[bool] | None:
        """Whether each finding's axial centre is contrast-filled through the study
        (``consolidate.is_tube``); None where :attr:`InferenceOptions.contrast_tubes` is off."""
        if not self.options.contrast_tubes:
            return None
        return [
            is_tube(_centre_profile(volume, g.center_lps_mm), self.options.tube_min_hu)
            for g in grouped
        ]

    def _point_texts(
        self, volume: Volume, centres: Sequence[tuple[float, float, float]]
    ) -> list[str]:
        """The point task's answers at ``centres`` (LPS mm), in batches of ``measure_batch``."""
        inputs = self.loaded.settings.measure_inputs
        texts: list[str] = []
        batch = self.options.measure_batch
        for start in range(0, len(centres), batch):
            chunk = centres[start : start + batch]
            texts += self._generate([point_example(volume, c, inputs) for c in chunk], 16)
        return texts

    def _generate(self, examples: Sequence[Any], max_new_tokens: int) -> list[str]:
        return generate_texts(
            self.lm,
            self.loaded.tokenizer,
            examples,
            max_new_tokens=max_new_tokens,
            device=self.device,
        )


def _segment_lps(crop: Any, frame: float, segment: Segment) -> Segment3:
    """Crop pixel edges (row, column) -> LPS mm end points (pixel centres are edges - 0.5)."""
    (r0, c0), (r1, c1) = segment
    a, b = crop.pixel_to_lps([(frame, r0 - 0.5, c0 - 0.5), (frame, r1 - 0.5, c1 - 0.5)])
    return (float(a[0]), float(a[1]), float(a[2])), (float(b[0]), float(b[1]), float(b[2]))


def _nearest_voxel(volume: Volume, center: Sequence[float]) -> tuple[int, int, int]:
    """(slice, row, column) of the voxel nearest to ``center``, clamped into the volume."""
    index = volume.geometry.lps_to_index(np.asarray(center, dtype=np.float64))
    k, r, c = (
        int(min(n - 1, max(0, round(float(i))))) for i, n in zip(index, volume.shape, strict=True)
    )
    return k, r, c


def _source_slice(volume: Volume, center: Sequence[float]) -> int:
    """The source slice nearest to ``center`` (for the SOP instance the finding refers to)."""
    return _nearest_voxel(volume, center)[0]


def _centre_patches(volume: Volume, center: Sequence[float], radius_mm: float) -> Any:
    """(slices, rows, columns) voxels of the square of half-side ``radius_mm`` around
    ``center``'s axial position on every source slice, and ``center``'s nearest slice."""
    k, r, c = _nearest_voxel(volume, center)
    rows = round(radius_mm / volume.geometry.row_spacing)
    columns = round(radius_mm / volume.geometry.column_spacing)
    patch = volume.voxels[:, max(0, r - rows) : r + rows + 1, max(0, c - columns) : c + columns + 1]
    return patch, k


def _centre_profile(volume: Volume, center: Sequence[float], radius_mm: float = 3.0) -> list[float]:
    """:func:`_centre_hu` on every source slice at ``center``'s axial position: one median per
    slice, in slice order."""
    patches, _ = _centre_patches(volume, center, radius_mm)
    return [float(v) for v in np.median(patches.reshape(patches.shape[0], -1), axis=1)]


def _centre_hu(volume: Volume, center: Sequence[float], radius_mm: float = 3.0) -> float:
    """Median voxel value (HU for CT) in the square of half-side ``radius_mm`` around
    ``center`` on its nearest source slice (the centre voxel alone when the pixels are larger
    than that); a centre outside the slice takes the nearest edge voxels."""
    patches, k = _centre_patches(volume, center, radius_mm)
    return float(np.median(patches[k]))
