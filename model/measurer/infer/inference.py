"""The measure step at inference: crops in, measurements (or "not measurable") out.

For each finding the model generates its answer (greedy, KV cache, [NUM] values fed back by
``NumericLM``); the answer is parsed with the task language's strict parser. A well-formed
answer becomes ``Measurement`` objects with the calibrated ranges of the checkpoint; a malformed
one (wrong count of numbers, unknown words, values out of range) becomes "not measurable" with
the parser's reason and is counted, never patched. Every answer keeps the decode confidence of
its weakest number; the checkpoint's ``DecodeCheck`` (``model.measurer.calibrate.calibration``)
turns a weak one into "not measurable" in the ``calibrate`` stage.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from model.measurer.inputs.data import MeasureExample, Prompted, collate, encode_example
from model.measurer.results import MEASUREMENTS_OF, FindingKind, Measurement
from model.measurer.tasks.text import ParsedMeasure, parse_measure, with_values
from model.measurer.tasks.tokenizer import special_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from model.measurer.calibrate.calibration import Calibration, DecodeCheck
    from model.numeric.generation import TokenAutomaton
    from model.numeric.hf import NumericLM

__all__ = [
    "Answer",
    "MeasureOutcome",
    "calibrated",
    "generate_answers",
    "measure_findings",
    "outcome_for",
]

logger = logging.getLogger(__name__)

MAX_ANSWER_TOKENS = 16  # "32.5 x 18 mm" is 4 tokens with [NUM]s, ~10 as digits


@dataclass(frozen=True)
class MeasureOutcome:
    """One finding's measurements and the raw answer they came from."""

    measurements: tuple[Measurement, ...]
    answer: str  # the generated text with the numbers written out
    parsed: bool  # False: the answer was malformed and every measurement is "not measurable"
    confidence: float | None = None  # weakest number's decode confidence; None: not known


@dataclass(frozen=True)
class Answer:
    """One generated answer: its text with the decoded numbers written out, the decode
    confidence of its weakest number (None: no numbers, or a head without such a measure) and,
    where asked for, the probability the model gave the asked opening token (e.g. ``none``) as
    the first token of its answer."""

    text: str
    confidence: float | None = None
    opening: float | None = None


def _weakest(confidences: list[float]) -> float | None:
    known = [c for c in confidences if not math.isnan(c)]
    return min(known) if known else None


def generate_answers(
    lm: NumericLM,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Prompted],
    *,
    max_new_tokens: int,
    device: torch.device | str = "cpu",
    opening: str | None = None,
    automaton: TokenAutomaton | None = None,
) -> list[Answer]:
    """Greedy answers of ``examples`` (one batch, their ``answer`` ignored); with ``opening``
    (a word that is one token, e.g. ``"none"``), each answer's ``opening`` is the probability
    the model gave that token as its first (``ValueError`` for a word of several tokens); with
    ``automaton`` an answer that can no longer parse stops there."""
    ids = special_ids(tokenizer)
    opening_id = None if opening is None else _one_token(tokenizer, opening)
    numeric = lm.numeric_head is not None
    prompts = [encode_example(_without_answer(e), tokenizer, numeric=numeric) for e in examples]
    batch = collate(prompts, ids["pad"])
    dtype = next(lm.model.parameters()).dtype
    with torch.no_grad():
        generated = lm.generate(
            batch.input_ids.to(device),
            batch.attention_mask.to(device),
            batch.num_values.to(device) if numeric else None,
            max_new_tokens=max_new_tokens,
            eos_token_id=ids["eos"],
            pad_token_id=ids["pad"],
            pixel_values=batch.pixel_values.to(device, dtype),
            image_grid_thw=batch.image_grid_thw.to(device),
            automaton=automaton,
        )
    openings: list[float | None] = [None] * len(examples)
    if opening_id is not None and generated.first_logits is not None:
        # float64: a sure answer puts "none" far below float32's resolution of 1 - p
        probabilities = generated.first_logits.double().softmax(dim=-1)[:, opening_id]  # (B,)
        openings = [float(p) for p in probabilities.tolist()]
    answers = []
    for row in range(len(examples)):
        tokens = generated.new_tokens[row].tolist()
        text = str(tokenizer.decode(tokens, skip_special_tokens=True)).strip()
        if not numeric:
            answers.append(Answer(text, opening=openings[row]))
            continue
        text = with_values(text, generated.values[row].tolist())
        confidence = _weakest(generated.confidences[row].tolist())
        answers.append(Answer(text, confidence, openings[row]))
    return answers


def _one_token(tokenizer: PreTrainedTokenizerBase, word: str) -> int:
    ids = tokenizer.encode(word, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"{word!r} is {len(ids)} tokens for this tokenizer, not one")
    return int(ids[0])


@dataclass(frozen=True)
class _Unanswered:
    images: torch.Tensor
    prompt: str
    answer: str | None = None


def _without_answer(example: Prompted) -> Prompted:
    return example if example.answer is None else _Unanswered(example.images, example.prompt)


def measure_findings(
    lm: NumericLM,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[MeasureExample],
    *,
    calibration: Calibration | None = None,
    check: DecodeCheck | None = None,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
) -> list[MeasureOutcome]:
    """Measure every example (its ``answer`` is ignored), ``batch_size`` crops per forward,
    with the checkpoint's ``calibration`` and decode ``check`` applied."""
    outcomes: list[MeasureOutcome] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        answers = generate_answers(
            lm, tokenizer, chunk, max_new_tokens=MAX_ANSWER_TOKENS, device=device
        )
        for example, answer in zip(chunk, answers, strict=True):
            parsed = parse_measure(answer.text, example.kind)
            outcomes.append(
                outcome_for(
                    example.kind, answer.text, calibration, parsed, answer.confidence, check
                )
            )
    failed = sum(not o.parsed for o in outcomes)
    if failed:
        logger.warning(
            "%d of %d measure answers were malformed (not measurable)", failed, len(outcomes)
        )
    return outcomes


def outcome_for(
    kind: FindingKind,
    text: str,
    calibration: Calibration | None,
    parsed: ParsedMeasure,
    confidence: float | None = None,
    check: DecodeCheck | None = None,
) -> MeasureOutcome:
    """Measurements of a parsed answer for a finding of ``kind``: the values with the
    checkpoint's calibration applied (:func:`calibrated`: ranges, or "not measurable" below
    ``check``), or all "not measurable" with the parser's reason; ``confidence`` (the answer's
    weakest decode) is kept on the outcome."""
    names = MEASUREMENTS_OF[kind]
    if not parsed.success:
        reason = f"malformed model answer {text!r}: {parsed.reason}"
        return MeasureOutcome(
            tuple(Measurement.not_measurable(n, reason) for n in names), text, False, confidence
        )
    values = sorted(parsed.values, reverse=True)  # lesion: (long, short); vessel: (diameter,)
    raw = tuple(Measurement(n, v) for n, v in zip(names, values, strict=True))
    return calibrated(MeasureOutcome(raw, text, True, confidence), calibration, check)


def calibrated(
    outcome: MeasureOutcome, calibration: Calibration | None, check: DecodeCheck | None
) -> MeasureOutcome:
    """A checkpoint's calibration applied to ``outcome``: where its weakest number decoded
    below ``check`` every value becomes "not measurable" with the check's reason; the other
    values get their calibrated ranges (none without a calibration)."""
    if outcome.parsed and check is not None and not check.accepts(outcome.confidence):
        assert outcome.confidence is not None  # accepts() passes None
        reason = check.reason(outcome.confidence)
        refused = tuple(Measurement.not_measurable(m.name, reason) for m in outcome.measurements)
        return dataclasses.replace(outcome, measurements=refused)
    if calibration is None:
        return outcome
    out = []
    for m in outcome.measurements:
        if m.value_mm is None:
            out.append(m)
            continue
        interval = calibration.interval(m.name, m.value_mm)
        coverage = None if interval is None else calibration.coverage(m.name)
        out.append(Measurement(m.name, m.value_mm, interval, coverage))
    return dataclasses.replace(outcome, measurements=tuple(out))
