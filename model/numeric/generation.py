"""Incremental generation with [NUM] feedback (our own loop, not ``GenerationMixin.generate``).

Prefill runs the whole left-padded prompt once (``inputs_embeds``: text, [NUM] values and image
features) and keeps the KV cache; then each step feeds one embedding per row:

- a row whose chosen token is [NUM] has its value decoded from the hidden state that produced
  those logits (the lm_head input of the previous step) and feeds ``numeric_head.embed(value)``;
  the value is kept with its decode confidence (``NumericHead.confidence``; NaN where the
  head has none);
- other rows feed their token's embedding; rows that already emitted EOS feed ``pad_id`` with
  attention mask 0, so they no longer influence anything and their later tokens are padding.

Greedy generation without recorded logits or a logits processor drops the rows that finished
from the model's batch (their key-value rows too): the rest of a call costs what its unfinished
rows cost. The key-value cache is allocated once per call (``model.numeric.kv_cache``): each
step writes its keys and values in place instead of copying the cache.

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

__all__ = [
    "LogitsProcessor",
    "NumericGeneration",
    "TokenAutomaton",
    "generate_numeric",
    "select_next_token",
]

logger = logging.getLogger(__name__)

# (sequences so far (B, T), scores (B, V)) -> scores (B, V); transformers' LogitsProcessor fits.
LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TokenAutomaton:
    """Which answers can still parse, token by token: a row whose next token has no transition
    (``table`` -1), or that cannot reach an end within the tokens it has left, is finished
    there (its answer so far is malformed whatever would follow; a parser says so).

    ``table`` (S, V) long: the state after each token from each state, -1 for none;
    ``to_end`` (S,) long: the fewest tokens from each state to a finished answer (its end
    token included; 0 once finished, where every token, padding included, stays).
    """

    table: torch.Tensor
    to_end: torch.Tensor
    start: int = 0

    def __post_init__(self) -> None:
        states = self.table.shape[0]
        if self.table.ndim != 2 or self.to_end.shape != (states,):
            raise ValueError(
                f"table must be (S, V) and to_end (S,), got {tuple(self.table.shape)} and "
                f"{tuple(self.to_end.shape)}"
            )
        if not 0 <= self.start < states:
            raise ValueError(f"start state {self.start} is not among the {states} states")


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
    automaton: TokenAutomaton | None = None,
) -> NumericGeneration:
    """The loop behind ``NumericLM.generate``; inputs come from ``NumericLM.prepare_inputs``.

    ``input_ids`` / ``attention_mask`` (B, P) must be left-padded; ``inputs_embeds`` (B, P, D);
    ``position_ids`` (B, P), or (3 G, B, P): G geometries of multimodal rope (t, h, w) rows, e.g.
    Qwen2.5-VL's M-RoPE (G = 1) or M-RoPE and Circle-RoPE (G = 2, ``model.circle_rope``).
    ``automaton``: rows whose answer can no longer parse finish early (:class:`TokenAutomaton`).
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
    # greedy rows that finished leave the batch; every row stays when sampling (the generator's
    # stream stays as it was), when logits are recorded (one per row and step) and for a logits
    # processor (it sees the whole batch, row by row, as transformers' do)
    compact = not do_sample and not output_logits and logits_processor is None

    # prefill: the whole prompt, only the last position's logits are needed
    logits, hidden, cache = lm.run_model(
        inputs_embeds,
        attention_mask,
        position_ids,
        past_key_values=lm.generation_cache(prompt_length + max_new_tokens),
        use_cache=True,
        last_only=True,
    )
    step_logits = logits[:, -1].float()  # (n, V) of the n rows in the model
    step_hidden = hidden[:, -1]  # (n, D) lm_head input that produced step_logits
    first_logits = step_logits

    sequences, mask = input_ids, attention_mask.long()
    finished = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
    rows_in = torch.arange(batch, device=device)  # (n,) the rows in the model, in its order
    if automaton is not None:
        table, to_end = automaton.table.to(device), automaton.to_end.to(device)
        states = torch.full((batch,), automaton.start, dtype=torch.long, device=device)
    num_rows: list[list[int]] = []  # per [NUM] step: the rows (of B) that emitted [NUM]
    num_decoded: list[torch.Tensor] = []  # per [NUM] step: (n,) float64 their values
    num_confidence: list[torch.Tensor] = []  # per [NUM] step: (n,) float64 (NaN: no measure)
    embed_dtype = lm.token_embeddings(input_ids[:1, -1:]).dtype  # what the next step feeds
    all_logits: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        every_row = rows_in.shape[0] == batch
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
        )  # (n,)
        done_in = finished if every_row else finished[rows_in]  # (n,)
        next_ids = next_ids.masked_fill(done_in, pad_id)
        rows = [] if head is None else _num_rows(next_ids, done_in, num_id, pad_id)
        if head is None or not rows:
            next_embeds = lm.token_embeddings(next_ids[:, None])  # (n, 1, D)
        else:  # decode the rows that emitted [NUM] only, feed their values' embeddings
            every = len(rows) == next_ids.shape[0]
            index = None if every else torch.tensor(rows, device=device)  # (k,)
            num_hidden = step_hidden if index is None else step_hidden[index]  # (k, D)
            if num_hidden.dtype != torch.float32:
                num_hidden = num_hidden.float()
            decoded = head.decode(num_hidden)  # (k,) float64
            confidence = head.confidence(num_hidden, decoded)  # (k,) or None
            if confidence is None:
                confidence = torch.full_like(decoded, float("nan"))
            value_embeds = head.embed(decoded)  # (k, D)
            if value_embeds.dtype != embed_dtype:
                value_embeds = value_embeds.to(embed_dtype)
            if index is None:  # every row feeds a value: no token embeddings to look up
                next_embeds = value_embeds[:, None]  # (n, 1, D)
            else:
                next_embeds = lm.token_embeddings(next_ids[:, None])  # (n, 1, D)
                next_embeds[index, 0] = value_embeds
            num_rows.append(rows if every_row else rows_in[rows].tolist())
            num_decoded.append(decoded)
            num_confidence.append(confidence.double())

        if not every_row:  # back to (B,): the rows out of the model are finished, pad
            next_ids = torch.full_like(finished, pad_id, dtype=torch.long).index_copy(
                0, rows_in, next_ids
            )
        sequences = torch.cat([sequences, next_ids[:, None]], dim=1)  # (B, P + step + 1)
        mask = torch.cat([mask, (~finished).long()[:, None]], dim=1)
        finished = finished | torch.isin(next_ids, eos)
        if automaton is not None:  # answers that can no longer parse end here
            states = table[states, next_ids]  # (B,) -1: no transition
            left = max_new_tokens - step - 1
            finished = finished | (states < 0) | (to_end[states.clamp(min=0)] > left)
            states = states.clamp(min=0)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break

        position_ids = _next_positions(position_ids)  # (..., n, 1)
        if compact and bool(finished[rows_in].any()):  # finished rows leave the batch
            keep = (~finished[rows_in]).nonzero().squeeze(1)  # (n',)
            rows_in = rows_in[keep]
            next_embeds = next_embeds[keep]
            position_ids = position_ids.index_select(-2, keep)
            cache.batch_select_indices(keep)
        step_mask = mask if rows_in.shape[0] == batch else mask[rows_in]
        logits, hidden, cache = lm.run_model(
            next_embeds, step_mask, position_ids, past_key_values=cache, use_cache=True
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
