"""The measure step at inference: crops in, measurements (or "not measurable") out.

For each finding the model generates its answer (greedy, KV cache, [NUM] values fed back by
``NumericLM``); the answer is parsed with the task language's strict parser. A well-formed
answer becomes ``Measurement`` objects with the calibrated ranges of the checkpoint; a malformed
one (wrong count of numbers, unknown words, values out of range) becomes "not measurable" with
the parser's reason and is counted, never patched.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from model.measurer.data import MeasureExample, Prompted, collate, encode_example
from model.measurer.results import MEASUREMENTS_OF, FindingKind, Measurement
from model.measurer.tasks import ParsedMeasure, parse_measure, with_values
from model.measurer.tokenizer import special_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from model.measurer.calibration import Calibration
    from model.numeric.hf import NumericLM

__all__ = ["MeasureOutcome", "generate_texts", "measure_findings", "outcome_for"]

logger = logging.getLogger(__name__)

MAX_ANSWER_TOKENS = 16  # "32.5 x 18 mm" is 4 tokens with [NUM]s, ~10 as digits


@dataclass(frozen=True)
class MeasureOutcome:
    """One finding's measurements and the raw answer they came from."""

    measurements: tuple[Measurement, ...]
    answer: str  # the generated text with the numbers written out
    parsed: bool  # False: the answer was malformed and every measurement is "not measurable"


def generate_texts(
    lm: NumericLM,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Prompted],
    *,
    max_new_tokens: int,
    device: torch.device | str = "cpu",
) -> list[str]:
    """Greedy answers of ``examples`` (one batch, their ``answer`` ignored) as plain text with
    the decoded numbers written out."""
    ids = special_ids(tokenizer)
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
        )
    texts = []
    for row in range(len(examples)):
        tokens = generated.new_tokens[row].tolist()
        text = str(tokenizer.decode(tokens, skip_special_tokens=True)).strip()
        texts.append(with_values(text, generated.values[row].tolist()) if numeric else text)
    return texts


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
    batch_size: int = 16,
    device: torch.device | str = "cpu",
) -> list[MeasureOutcome]:
    """Measure every example (its ``answer`` is ignored), ``batch_size`` crops per forward."""
    outcomes: list[MeasureOutcome] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        texts = generate_texts(
            lm, tokenizer, chunk, max_new_tokens=MAX_ANSWER_TOKENS, device=device
        )
        for example, text in zip(chunk, texts, strict=True):
            parsed = parse_measure(text, example.kind)
            outcomes.append(outcome_for(example.kind, text, calibration, parsed))
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
) -> MeasureOutcome:
    """Measurements of a parsed answer for a finding of ``kind``: the values with their
    calibrated ranges, or all "not measurable" with the parser's reason."""
    names = MEASUREMENTS_OF[kind]
    if not parsed.success:
        reason = f"malformed model answer {text!r}: {parsed.reason}"
        return MeasureOutcome(
            tuple(Measurement.not_measurable(n, reason) for n in names), text, False
        )
    values = sorted(parsed.values, reverse=True)  # lesion: (long, short); vessel: (diameter,)
    out = []
    for name, value in zip(names, values, strict=True):
        interval = None if calibration is None else calibration.interval(name, value)
        coverage = None if calibration is None or interval is None else calibration.coverage(name)
        out.append(Measurement(name, value, interval, coverage))
    return MeasureOutcome(tuple(out), text, True)
