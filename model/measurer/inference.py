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

from model.measurer.data import MeasureExample, collate, encode_example
from model.measurer.results import MEASUREMENTS_OF, Measurement
from model.measurer.tasks import parse_measure, with_values
from model.measurer.tokenizer import special_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from model.measurer.calibration import Calibration
    from model.numeric.hf import NumericLM

__all__ = ["MeasureOutcome", "measure_findings"]

logger = logging.getLogger(__name__)

MAX_ANSWER_TOKENS = 16  # "32.5 x 18 mm" is 4 tokens with [NUM]s, ~10 as digits


@dataclass(frozen=True)
class MeasureOutcome:
    """One finding's measurements and the raw answer they came from."""

    measurements: tuple[Measurement, ...]
    answer: str  # the generated text with the numbers written out
    parsed: bool  # False: the answer was malformed and every measurement is "not measurable"


def measure_findings(
    lm: NumericLM,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[MeasureExample],
    *,
    calibration: Calibration | None = None,
    batch_size: int = 16,
) -> list[MeasureOutcome]:
    """Measure every example (its ``answer`` is ignored), ``batch_size`` crops per forward."""
    ids = special_ids(tokenizer)
    numeric = lm.numeric_head is not None
    outcomes: list[MeasureOutcome] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        prompts = [
            encode_example(
                MeasureExample(e.kind, e.images, e.prompt, None), tokenizer, numeric=numeric
            )
            for e in chunk
        ]
        batch = collate(prompts, ids["pad"])
        with torch.no_grad():
            generated = lm.generate(
                batch.input_ids,
                batch.attention_mask,
                batch.num_values,
                max_new_tokens=MAX_ANSWER_TOKENS,
                eos_token_id=ids["eos"],
                pad_token_id=ids["pad"],
                pixel_values=batch.pixel_values,
                image_grid_thw=batch.image_grid_thw,
            )
        for row, example in enumerate(chunk):
            tokens = generated.new_tokens[row]
            text = str(tokenizer.decode(tokens.tolist(), skip_special_tokens=True)).strip()
            if numeric:
                text = with_values(text, generated.values[row].tolist())
            outcomes.append(_outcome(example, text, calibration))
    failed = sum(not o.parsed for o in outcomes)
    if failed:
        logger.warning(
            "%d of %d measure answers were malformed (not measurable)", failed, len(outcomes)
        )
    return outcomes


def _outcome(example: MeasureExample, text: str, calibration: Calibration | None) -> MeasureOutcome:
    names = MEASUREMENTS_OF[example.kind]
    parsed = parse_measure(text, example.kind)
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
