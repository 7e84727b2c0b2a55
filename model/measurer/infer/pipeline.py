"""The measurer a checkpoint makes (``Measurer`` protocol): named stages over a study.

``CheckpointMeasurer.measure(volume)`` first checks the volume against the checkpoint's
validated domain (``model.measurer.checkpoint.domain``: a study outside it is refused with a
``ModelError`` naming the reasons, or measured with every reason in the result's warnings),
then runs its stages (``model.measurer.infer.stages``: find, verify, recentre, merge, measure, axes,
dedupe, calibrate, as the checkpoint supports them) and reports what the last one left.
Subscribers (:meth:`CheckpointMeasurer.subscribe`) see every stage's state: experiments, the
UI's progress, benchmarks. A stage is left out by leaving it out of ``stages``.

``measure_at`` answers a click: with the checkpoint's click model where it names one (a lesion's
caliper drawn in a view that fits the lesion, ``model.measurer.infer.click``), else with the point
task on a crop centred at the clicked point and the axes task there for its caliper.

A value is the distance between its end points (``model.measurer.infer.caliper``): the values
are the measure (point) task's, their end points placed on the axes task's drawing; a checkpoint
without the axes task gives values without end points, with a warning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ingestion.contrast import contrast_of
from ingestion.errors import ModelError
from ingestion.volume import Volume
from model.measurer.checkpoint.domain import check as check_domain
from model.measurer.checkpoint.settings import (
    MeasurerSettings,
    checkpoint_hash,
    click_model_folder,
)
from model.measurer.checkpoint.weights import LoadedMeasurer, load_checkpoint
from model.measurer.infer.caliper import caliper
from model.measurer.infer.click import ClickCaliper
from model.measurer.infer.inference import Answer, generate_answers, outcome_for
from model.measurer.infer.stages import default_stages, drawn_segments, source_slice
from model.measurer.infer.state import (
    MAX_AXES_TOKENS,
    MAX_POINT_TOKENS,
    AnswerForm,
    InferenceOptions,
    InferenceStage,
    StudyState,
    Trace,
    run_stages,
)
from model.measurer.inputs.data import AxesExample, Prompted, axes_example, point_example
from model.measurer.results import (
    MEASUREMENTS_OF,
    FindingKind,
    Measurement,
    ModelInfo,
    StudyFinding,
    StudyResult,
    renumber,
)
from model.measurer.tasks.grammar import find_answer_automaton
from model.measurer.tasks.text import ParsedMeasure, parse_point
from model.measurer.tasks.tokenizer import special_ids
from model.numeric.generation import TokenAutomaton
from model.numeric.hf import NumericLM
from model.numeric.patch_embed import linear_patch_projections

__all__ = ["CheckpointMeasurer", "InferenceOptions"]

logger = logging.getLogger(__name__)


class CheckpointMeasurer:
    """A measurer checkpoint ready for inference (implements ``model.measurer.Measurer``)."""

    def __init__(
        self,
        loaded: LoadedMeasurer,
        *,
        device: str | torch.device | None = None,
        options: InferenceOptions | None = None,
        directory: str | Path | None = None,
        stages: Sequence[InferenceStage] | None = None,
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
        linear_patch_projections(model)  # the same weights, 2-3 x faster on a CPU
        self.lm = NumericLM(model, loaded.head, ids["num"] if head is not None else None).eval()
        self.stages: tuple[InferenceStage, ...] = (
            default_stages(loaded.settings) if stages is None else tuple(stages)
        )
        self._traces: list[Trace] = []
        self._answered = 0
        self._automaton: TokenAutomaton | None = None
        self._automaton_made = False
        self._click_path: Path | None = None
        self._click: ClickCaliper | None = None
        if loaded.settings.click_model is not None:
            self._click_path = self._click_folder(loaded.settings.click_model)

    @property
    def click(self) -> ClickCaliper | None:
        """The click model the checkpoint names, loaded at the first click (a whole-study
        measurement never pays for it); None where it names none."""
        if self._click is None and self._click_path is not None:
            self._click = self._click_caliper(self._click_path)
        return self._click

    def _click_folder(self, folder: str) -> Path:
        """The click model's folder, checked to lie inside the checkpoint (``ModelError``)."""
        if self.directory is None:
            raise ModelError(
                f"this measurer names a click model ({folder!r}) but was not loaded from a "
                "directory to find it in"
            )
        return click_model_folder(self.directory, folder)

    def _click_caliper(self, path: Path) -> ClickCaliper:
        """The click model at ``path``, ready to answer clicks (``ModelError`` if it is not
        one)."""
        model = CheckpointMeasurer.load(path, device=self.device, options=self.options)
        view = model.settings.lesion_view
        if view is None or not {"point", "axes"} <= set(model.settings.tasks):
            raise ModelError(
                f"{path}: not a click model (it needs a lesion view and the point and axes "
                "tasks); train one with 'radcaliper train-click'"
            )
        return ClickCaliper(model, view, model.settings.calibration)

    @classmethod
    def load(
        cls,
        directory: str | Path,
        *,
        device: str | torch.device | None = None,
        options: InferenceOptions | None = None,
        stages: Sequence[InferenceStage] | None = None,
    ) -> CheckpointMeasurer:
        """Load a checkpoint directory (``ModelError`` if it is not one)."""
        return cls(
            load_checkpoint(directory),
            device=device,
            options=options,
            directory=directory,
            stages=stages,
        )

    @property
    def settings(self) -> MeasurerSettings:
        """The checkpoint's ``radcaliper.json``."""
        return self.loaded.settings

    @property
    def numeric_tokens(self) -> bool:
        """Whether the model writes numbers as [NUM] tokens (it has a numeric head)."""
        return self.lm.numeric_head is not None

    def subscribe(self, trace: Trace) -> Callable[[], None]:
        """Call ``trace`` after every stage of every study measured from now on; returns the
        function that unsubscribes it."""
        self._traces.append(trace)

        def unsubscribe() -> None:
            if trace in self._traces:
                self._traces.remove(trace)

        return unsubscribe

    @property
    def prompts_answered(self) -> int:
        """Prompts :meth:`generate` has answered since the measurer was made."""
        return self._answered

    def generate(
        self,
        examples: Sequence[Prompted],
        max_new_tokens: int,
        opening: str | None = None,
        form: AnswerForm | None = None,
    ) -> list[Answer]:
        """Greedy answers of one batch of examples, numbers written out, with their weakest
        decode confidence and the probability of the ``opening`` token; a ``"find"`` answer
        that can no longer parse stops there (``StageModel``)."""
        self._answered += len(examples)
        return generate_answers(
            self.lm,
            self.loaded.tokenizer,
            examples,
            max_new_tokens=max_new_tokens,
            device=self.device,
            opening=opening,
            automaton=self._find_automaton() if form == "find" else None,
        )

    def _find_automaton(self) -> TokenAutomaton | None:
        """The find answer's automaton (``model.measurer.tasks.grammar``), made once; None in
        standard-token mode or for a tokenizer that splits the task's words."""
        if not self._automaton_made:
            self._automaton_made = True
            if self.numeric_tokens:
                model: Any = self.loaded.model
                vocab = int(model.config.get_text_config().vocab_size)
                end_ids = [self.ids["eos"]]
                self._automaton = find_answer_automaton(self.loaded.tokenizer, vocab, end_ids)
        return self._automaton

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
        return self.loaded.settings.model_info()

    # --- the protocol --------------------------------------------------------------------------

    def measure(self, volume: Volume, *, source: str, trace: Trace | None = None) -> StudyResult:
        """All findings of ``volume``: the stages' result (module doc); ``trace`` also sees
        every stage of this study."""
        warnings = self.check(volume)
        if self.loaded.settings.calibration is None:
            warnings += (
                f"{self.info.name} {self.info.version} is not calibrated: its values have no "
                "ranges; run 'radcaliper calibrate' on the checkpoint before using them",
            )
        traces = self._traces + ([] if trace is None else [trace])
        state = run_stages(self, StudyState(volume, warnings=warnings), self.stages, traces)
        findings = []
        draws = self.draws_calipers and any(s.name == "axes" for s in self.stages)
        for candidate in state.candidates:
            found = candidate.found
            if candidate.outcome is None:
                reason = "the measure stage was left out of this measurer's stages"
                measurements = tuple(
                    Measurement.not_measurable(name, reason) for name in MEASUREMENTS_OF[found.kind]
                )
            else:
                measurements = candidate.outcome.measurements
            axes = None
            if draws:  # the values are the measure task's, their end points placed on the drawing
                measurements, axes = caliper(
                    found.kind, measurements, candidate.axes, volume.geometry.normal
                )
            findings.append(
                StudyFinding(
                    0,
                    found.kind,
                    found.center_lps_mm,
                    source_slice(volume, found.center_lps_mm),
                    measurements,
                    axes,
                )
            )
        if findings and not draws:
            state = state.with_candidates(
                state.candidates,
                f"{self.info.name} {self.info.version} draws no calipers (no axes task in its "
                "stages): its values have no end points to check them by",
            )
        identifiers = volume.identifiers
        return StudyResult(
            study_instance_uid=identifiers.study_instance_uid,
            series_instance_uid=identifiers.series_instance_uid,
            patient_id=identifiers.patient_id or "",
            source=source,
            model=self.info,
            findings=renumber(findings),
            warnings=state.warnings,
        )

    def measure_at(
        self, volume: Volume, point_lps_mm: tuple[float, float, float]
    ) -> StudyFinding | None:
        """The finding under a clicked point, or None when the model sees none there.

        A checkpoint with a click model (``settings.click_model``) answers a lesion with its
        caliper (``model.measurer.infer.click``) and a vessel with its own point task; one
        without answers both with its own point and axes tasks.

        Raises ``ModelError`` when the answer is malformed before it names a kind.
        """
        self.check(volume)
        point = tuple(float(v) for v in point_lps_mm)
        if len(point) != 3 or not all(math.isfinite(v) for v in point):
            raise ValueError(f"point_lps_mm must be three finite numbers, got {point_lps_mm!r}")
        if self.click is not None:  # lesions: the click model's caliper in a view that fits
            found = self.click.measure_at(volume, (point[0], point[1], point[2]))
            if found is not None:
                return found
            vessel = self._measure_at(volume, point)  # vessels: this model's own answer
            return vessel if vessel is not None and vessel.kind == FindingKind.VESSEL else None
        return self._measure_at(volume, point)

    def _measure_at(self, volume: Volume, point: tuple[float, ...]) -> StudyFinding | None:
        """This model's point task at the click, its axes task for the caliper."""
        inputs = self.loaded.settings.measure_inputs
        drawings: list[AxesExample] = []
        if self.draws_calipers:  # both kinds' axes in the same batch: one pass, not two
            made = [axes_example(volume, point, kind, inputs) for kind in FindingKind]
            drawings = [e for e in made if e is not None]
            assert len(drawings) == len(FindingKind)  # without truth one is always made
        examples: list[Prompted] = [point_example(volume, point, inputs), *drawings]
        answers = self.generate(examples, max(MAX_POINT_TOKENS, MAX_AXES_TOKENS))
        answer = answers[0]
        text = answer.text
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
            settings = self.loaded.settings
            as_measure = ParsedMeasure(parsed.values, True)
            measurements = outcome_for(
                kind,
                text,
                settings.calibration,
                as_measure,
                answer.confidence,
                settings.decode_check,
            ).measurements
        center = (point[0], point[1], point[2])
        axes = None
        if self.draws_calipers:
            which = list(FindingKind).index(kind)
            drawn = drawn_segments(drawings[which].crop, answers[1 + which].text, kind)
            if drawn is None:
                logger.info("the axes answer at the point was malformed (not measurable)")
            measurements, axes = caliper(kind, measurements, drawn, volume.geometry.normal)
        return StudyFinding(1, kind, center, source_slice(volume, center), measurements, axes)

    @property
    def draws_calipers(self) -> bool:
        """Whether the checkpoint knows the axes task, which places each value's end points
        (``model.measurer.infer.caliper``); one that does not gives values without them."""
        return "axes" in self.loaded.settings.tasks

    # --- steps ---------------------------------------------------------------------------------

    def check(self, volume: Volume) -> tuple[str, ...]:
        """Refuse a study outside the checkpoint's validated domain (``ModelError`` naming the
        reasons: modality, spacing, slices, a contrast state it excludes); returns what flags it
        (``model.measurer.checkpoint.domain``: "outside the validated domain: ...")."""
        result = check_domain(
            self.loaded.settings.domain,
            volume,
            contrast_of(volume),
            model=f"{self.info.name} {self.info.version}",
        )
        result.raise_if_refused()
        for flag in result.flags:
            logger.warning("%s", flag)
        return result.flags
