"""What inference stages share: the options, the state one stage hands the next, the model a stage
asks, the named stage and the trace of a run (:func:`run_stages`); the stages themselves are in
``model.measurer.infer.stages``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

from model.measurer.infer.grouping import (
    GroupedFinding,
    GroupingRule,
)
from model.measurer.infer.inference import (
    Answer,
    MeasureOutcome,
)
from model.measurer.inputs.data import (
    Prompted,
)
from model.measurer.inputs.tiles import FIELD_EDGE_MM
from model.measurer.inputs.voting import FindVoting
from model.measurer.results import Segment3
from model.measurer.tasks.text import (
    find_kinds,
)

if TYPE_CHECKING:
    from ingestion.volume import Volume
    from model.measurer.checkpoint.settings import MeasurerSettings

__all__ = [
    "MAX_AXES_TOKENS",
    "MAX_FIND_TOKENS",
    "MAX_FIND_TOKENS_DIGITS",
    "MAX_POINT_TOKENS",
    "AnswerForm",
    "Candidate",
    "InferenceOptions",
    "InferenceStage",
    "StageModel",
    "StudyState",
    "Trace",
    "TraceEvent",
    "run_stages",
]

logger = logging.getLogger(__name__)

AnswerForm = Literal["find"]
"""Forms of answer a stage can ask :meth:`StageModel.generate` to keep to."""

MAX_FIND_TOKENS = 80  # six findings of 12 tokens, "end" and the end token
MAX_FIND_TOKENS_DIGITS = 200  # the same with numbers as digits (standard tokens: up to 5 each)
MAX_AXES_TOKENS = 64  # two segments of 4 numbers; digits fit too
MAX_POINT_TOKENS = 16


@dataclass(frozen=True)
class InferenceOptions:
    """How inference runs (not part of the checkpoint).

    Args:
        find_plane_mm: least distance between examined planes.
        find_batch: find prompts per forward pass.
        measure_batch: point, measure and axes prompts per forward pass.
        find_voting: shifted find passes and how many must agree; None: as the checkpoint says.
        find_overlap_mm: least overlap of neighbouring find tiles, so that a finding up to this
            size lies wholly inside one tile (the largest lesion the product measures is 60 mm).
        find_edge_mm: the outermost margin of the reconstructed field left out of the find
            step's field (air or table, never a finding; keeps a field just over one tile to
            one tile).
        lesion_planes: examined planes on either side where a lesion is also measured.
        grouping: how boxes are joined into candidates.
        find_prompts: the kinds each find prompt asks for (each prompt runs over every tile
            and pass, and only its kinds are kept); None: as the checkpoint says.
    """

    find_plane_mm: float = 2.0
    find_batch: int = 64
    measure_batch: int = 16
    find_voting: FindVoting | None = None
    find_overlap_mm: float = 64.0
    find_edge_mm: float = FIELD_EDGE_MM
    lesion_planes: int = 6
    grouping: GroupingRule = field(default_factory=GroupingRule)
    find_prompts: tuple[tuple[str, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.find_prompts is not None:
            if not self.find_prompts:
                raise ValueError("find_prompts needs at least one prompt (or None)")
            for kinds in self.find_prompts:
                find_kinds(kinds)  # ValueError naming an unknown kind
        for name in ("find_plane_mm", "find_overlap_mm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of mm > 0, got {value!r}")
        if not (math.isfinite(self.find_edge_mm) and self.find_edge_mm >= 0):
            raise ValueError(f"find_edge_mm must be finite mm >= 0, got {self.find_edge_mm!r}")
        for name in ("find_batch", "measure_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.lesion_planes < 0:
            raise ValueError(f"lesion_planes must be >= 0, got {self.lesion_planes!r}")


@dataclass(frozen=True)
class Candidate:
    """One finding as the stages see it: where and what it is, and, once measured, its answer
    and axes."""

    found: GroupedFinding
    outcome: MeasureOutcome | None = None
    axes: tuple[Segment3, ...] | None = None
    # the point task's probability that something is there (1 - P("none") at the verify
    # stage's click); None before verify or without it
    presence: float | None = None

    def moved(self, center_lps_mm: tuple[float, float, float]) -> Candidate:
        return dataclasses.replace(
            self, found=dataclasses.replace(self.found, center_lps_mm=center_lps_mm)
        )


@dataclass(frozen=True)
class StudyState:
    """What inference knows about one study after a stage.

    Args:
        volume: the study.
        candidates: the findings so far, in order.
        examined_planes: how many planes the find step examined (0 before it).
        plane_spacing_mm: distance between examined planes (the measure step's plane search).
        warnings: what a reader should know (malformed answers counted per stage).
    """

    volume: Volume
    candidates: tuple[Candidate, ...] = ()
    examined_planes: int = 0
    plane_spacing_mm: float = 0.0
    warnings: tuple[str, ...] = ()

    def with_candidates(self, candidates: Sequence[Candidate], *warnings: str) -> StudyState:
        return dataclasses.replace(
            self, candidates=tuple(candidates), warnings=self.warnings + warnings
        )


class StageModel(Protocol):
    """What the stages ask of a loaded checkpoint (``pipeline.CheckpointMeasurer``)."""

    @property
    def settings(self) -> MeasurerSettings: ...

    @property
    def options(self) -> InferenceOptions: ...

    @property
    def numeric_tokens(self) -> bool:
        """Whether numbers are [NUM] tokens (a numeric head) rather than digits."""
        ...

    @property
    def prompts_answered(self) -> int:
        """How many prompts :meth:`generate` has answered so far (for the trace)."""
        ...

    def generate(
        self,
        examples: Sequence[Prompted],
        max_new_tokens: int,
        opening: str | None = None,
        form: AnswerForm | None = None,
    ) -> list[Answer]:
        """Greedy answers of one batch of examples, numbers written out, each with the decode
        confidence of its weakest number and, with ``opening`` (one token), the probability
        the model gave it as the answer's first token. With ``form`` the answers are of that
        form (``"find"``: one-image find answers), and an answer that can no longer be one may
        stop early (it is malformed either way)."""
        ...


class InferenceStage(NamedTuple):
    """A named step of inference."""

    name: str
    run: Callable[[StageModel, StudyState], StudyState]


@dataclass(frozen=True)
class TraceEvent:
    """What a stage left: its name, the state after it, the seconds it took and the prompts
    the model answered in it."""

    stage: str
    state: StudyState
    seconds: float
    prompts: int = 0


Trace = Callable[[TraceEvent], None]


def run_stages(
    model: StageModel,
    state: StudyState,
    stages: Sequence[InferenceStage],
    traces: Sequence[Trace] = (),
) -> StudyState:
    """Run ``stages`` in order from ``state``, telling each of ``traces`` after every stage."""
    for stage in stages:
        start, asked = time.perf_counter(), model.prompts_answered
        state = stage.run(model, state)
        event = TraceEvent(
            stage.name, state, time.perf_counter() - start, model.prompts_answered - asked
        )
        logger.debug(
            "stage %s: %d candidates, %.2fs", stage.name, len(state.candidates), event.seconds
        )
        for trace in traces:
            trace(event)
    return state
