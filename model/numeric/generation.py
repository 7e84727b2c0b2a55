"""Incremental generation with [NUM] feedback (our own loop, not ``GenerationMixin.generate``).

Prefill runs the whole left-padded prompt once (``inputs_embeds``: text, [NUM] values and image
features) and keeps the KV cache; then each step feeds one embedding per row:

- a row whose chosen token is [NUM] has its value decoded from the hidden state that produced
  those logits (the lm_head input of the previous step) and feeds ``numeric_head.embed(value)``;
  the value is kept with its decode confidence (``NumericHead.confidence``; NaN where the
  head has none);
- other rows feed their token's embedding; rows that already emitted EOS feed ``pad_id`` with
  attention mask 0, so they no longer influence anything and their later tokens are padding.

Only the rows that chose [NUM] are decoded. Positions continue at ``max(last position) + 1`` per
row (1-D, or all three components of Qwen2.5-VL's multimodal rope), which reproduces the
positions that a full forward pass over the final sequence computes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from model.numeric.hf import NumericLM

__all__ = ["LogitsProcessor", "NumericGeneration", "generate_numeric", "select_next_token"]

logger = logging.getLogger(__name__)

# (sequences so far (B, T), scores (B, V)) -> scores (B, V); transformers' LogitsProcessor fits.
LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class NumericGeneration:
    """What ``NumericLM.generate`` returns (B rows, P prompt length, T generated steps)."""

    sequences: torch.Tensor  # (B, P + T) prompt then generated ids; pad after a row's EOS
    attention_mask: torch.Tensor  # (B, P + T) 1 on real tokens (the EOS included), else 0
    values: list[torch.Tensor]  # B x (K_b,) float64 values of the row's generated [NUM]s
    confidences: list[torch.Tensor]  # B x (K_b,) float64 their decode confidence; NaN: none
    num_values: torch.Tensor  # (N,) float64 every [NUM] value of `sequences`, row-major
    logits: torch.Tensor | None  # (B, T, V) float32 raw model logits per step, if asked
    prompt_length: int  # P
    # (B, V) float32 raw logits of the first generated token (the prefill's last position):
    # how sure the model is of how its answer opens, e.g. "none" against a finding's kind
    first_logits: torch.Tensor | None = None

    @property
    def new_tokens(self) -> torch.Tensor:
        """(B, T) generated ids."""
        return self.sequences[:, self.prompt_length :]


def select_next_token(
    scores: torch.Tensor,
    *,
    do_sample: bool,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(B, V) scores -> (B,) ids: argmax, or a sample after temperature, top-k and top-p."""
    if not do_sample:
        return scores.argmax(dim=-1)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    scores = scores.float() / temperature  # (B, V)
    if top_k is not None and top_k > 0:
        kth = scores.topk(min(top_k, scores.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)  # (B, V)
        probs = sorted_scores.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs > top_p  # mass before this token already > top_p
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = scores.softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def generate_numeric(
    lm: NumericLM,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    inputs_embeds: torch.Tensor,
    position_ids: torch.Tensor,
    num_values: torch.Tensor | None,
    *,
    max_new_tokens: int,
    do_sample: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
    eos_ids: list[int],
    pad_id: int,
    logits_processor: LogitsProcessor | None,
    output_logits: bool,
) -> NumericGeneration:
    """The loop behind ``NumericLM.generate``; inputs come from ``NumericLM.prepare_inputs``.

    ``input_ids`` / ``attention_mask`` (B, P) must be left-padded; ``inputs_embeds`` (B, P, D);
    ``position_ids`` (B, P), or (3 G, B, P): G geometries of multimodal rope (t, h, w) rows, e.g.
    Qwen2.5-VL's M-RoPE (G = 1) or M-RoPE and Circle-RoPE (G = 2, ``model.circle_rope``).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not bool(attention_mask[:, -1].all()):
        raise ValueError("generate needs left-padded prompts: attention_mask[:, -1] must be all 1")
    if lm.model.training:
        logger.warning("generating with the model in training mode (dropout active)")
    head, num_id = lm.numeric_head, lm.num_token_id
    batch, prompt_length = input_ids.shape
    device = input_ids.device
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)  # (E,)

    # prefill: the whole prompt, only the last position's logits are needed
    logits, hidden, cache = lm.run_model(
        inputs_embeds, attention_mask, position_ids, use_cache=True, last_only=True
    )
    step_logits = logits[:, -1].float()  # (B, V)
    step_hidden = hidden[:, -1]  # (B, D) lm_head input that produced step_logits
    first_logits = step_logits

    sequences, mask = input_ids, attention_mask.long()
    finished = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
    num_rows: list[list[int]] = []  # per [NUM] step: the n rows that emitted [NUM]
    num_decoded: list[torch.Tensor] = []  # per [NUM] step: (n,) float64 their values
    num_confidence: list[torch.Tensor] = []  # per [NUM] step: (n,) float64 (NaN: no measure)
    embed_dtype = lm.token_embeddings(input_ids[:1, -1:]).dtype  # what the next step feeds
    all_logits: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        if output_logits:
            all_logits.append(step_logits)
        scores = step_logits
        if logits_processor is not None:  # on a copy: the recorded logits stay raw
            scores = logits_processor(sequences, step_logits.clone())
        next_ids = select_next_token(
            scores,
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            generator=generator,
        )  # (B,)
        next_ids = next_ids.masked_fill(finished, pad_id)
        rows = [] if head is None else _num_rows(next_ids, finished, num_id, pad_id)
        if head is None or not rows:
            next_embeds = lm.token_embeddings(next_ids[:, None])  # (B, 1, D)
        else:  # decode the rows that emitted [NUM] only, feed their values' embeddings
            every = len(rows) == batch
            index = None if every else torch.tensor(rows, device=device)  # (n,)
            num_hidden = step_hidden if index is None else step_hidden[index]  # (n, D)
            if num_hidden.dtype != torch.float32:
                num_hidden = num_hidden.float()
            decoded = head.decode(num_hidden)  # (n,) float64
            confidence = head.confidence(num_hidden, decoded)  # (n,) or None
            if confidence is None:
                confidence = torch.full_like(decoded, float("nan"))
            value_embeds = head.embed(decoded)  # (n, D)
            if value_embeds.dtype != embed_dtype:
                value_embeds = value_embeds.to(embed_dtype)
            if index is None:  # every row feeds a value: no token embeddings to look up
                next_embeds = value_embeds[:, None]  # (B, 1, D)
            else:
                next_embeds = lm.token_embeddings(next_ids[:, None])  # (B, 1, D)
                next_embeds[index, 0] = value_embeds
            num_rows.append(rows)
            num_decoded.append(decoded)
            num_confidence.append(confidence.double())

        sequences = torch.cat([sequences, next_ids[:, None]], dim=1)  # (B, P + step + 1)
        mask = torch.cat([mask, (~finished).long()[:, None]], dim=1)
        finished = finished | torch.isin(next_ids, eos)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break

        position_ids = _next_positions(position_ids)
        logits, hidden, cache = lm.run_model(
            next_embeds, mask, position_ids, past_key_values=cache, use_cache=True
        )
        step_logits = logits[:, -1].float()
        step_hidden = hidden[:, -1]

    row_values = _group_by_row(num_rows, num_decoded, batch, device)
    row_confidences = _group_by_row(num_rows, num_confidence, batch, device)
    prompt_values = _split_rows(input_ids, num_id, num_values)
    flat = [torch.cat([p, g]) for p, g in zip(prompt_values, row_values, strict=True)]
    return NumericGeneration(
        sequences=sequences,
        attention_mask=mask,
        values=row_values,
        confidences=row_confidences,
        num_values=torch.cat(flat),
        logits=torch.stack(all_logits, dim=1) if output_logits else None,
        prompt_length=prompt_length,
        first_logits=first_logits,
    )


def _num_rows(
    next_ids: torch.Tensor, finished: torch.Tensor, num_id: int | None, pad_id: int
) -> list[int]:
    """The rows whose next token is [NUM], as a list (one transfer, no tensor ops): a finished
    row feeds ``pad_id``, so it is never one unless ``pad_id == num_id``, then checked."""
    if num_id is None:
        return []
    rows = [i for i, token in enumerate(next_ids.tolist()) if token == num_id]
    if rows and pad_id == num_id:
        done = finished.tolist()
        rows = [i for i in rows if not done[i]]
    return rows


def _group_by_row(
    rows: list[list[int]], decoded: list[torch.Tensor], batch: int, device: torch.device
) -> list[torch.Tensor]:
    """Per-step (rows, values) -> one (K_b,) float64 tensor per row, in step order."""
    if not rows:
        return [torch.zeros(0, dtype=torch.float64, device=device) for _ in range(batch)]
    row = torch.tensor([r for step in rows for r in step], device=device)  # (K,) step-major
    value = torch.cat(decoded).double()  # (K,)
    order = torch.sort(row, stable=True).indices  # row-major, steps kept in order
    counts = torch.bincount(row, minlength=batch).tolist()
    return list(value[order].split(counts))


def _split_rows(
    input_ids: torch.Tensor, num_id: int | None, num_values: torch.Tensor | None
) -> list[torch.Tensor]:
    """Flat row-major prompt values -> one (K_b,) float64 tensor per row."""
    device = input_ids.device
    if num_id is None or num_values is None or num_values.numel() == 0:
        return [torch.zeros(0, dtype=torch.float64, device=device) for _ in input_ids]
    counts = (input_ids == num_id).sum(dim=1).tolist()
    flat = num_values.reshape(-1).double().to(device)
    return list(flat.split(counts))


def _next_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """The next token's positions: ``last + 1`` for 1-D positions; for (3 G, B, P) multimodal
    positions, each geometry's text continues after the largest of its own (t, h, w)."""
    last = position_ids[..., -1:]  # (B, 1) or (3 G, B, 1)
    if last.ndim == 3:
        rows, batch = last.shape[:2]
        if rows % 3:
            raise ValueError(f"multimodal position ids need 3 rows per geometry, got {rows}")
        per_geometry = last.reshape(rows // 3, 3, batch, 1).amax(dim=1, keepdim=True)
        last = per_geometry.expand(-1, 3, -1, -1).reshape(rows, batch, 1)
    return last + 1
