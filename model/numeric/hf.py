"""[NUM] tokens for any Hugging Face causal LM that accepts ``inputs_embeds``.

``NumericLM`` composes an unmodified transformers model with a ``NumericHead`` (RNED or xVal):

- ``embed_inputs``: the model's own token embeddings, with every [NUM] position replaced by
  ``numeric_head.embed(value)``.
- ``forward``: teacher-forced training pass; cross-entropy over all label positions plus
  ``lambda_`` times the head's loss at positions whose *target* token is [NUM].
- ``generate``: an incremental loop with the KV cache that decodes a value whenever a row emits
  [NUM] and feeds its embedding back (``model.numeric.generation``).

Design decisions:

- Hidden states: a forward pre-hook on ``model.get_output_embeddings()`` captures the lm_head
  *input*, i.e. exactly the final normed hidden state that produced the logits (after any
  ``logits_to_keep`` slicing). ``output_hidden_states`` would also work in transformers 5.23
  (``capture_outputs`` replaces ``hidden_states[-1]`` by the post-norm ``last_hidden_state``,
  checked in the tests), but that tie is a per-model switch of the output-capturing machinery
  (``config.tie_last_hidden_states``), it keeps every layer's states, and a model whose
  ``lm_head`` input is not ``last_hidden_state`` would break it; the hook depends on none of it.
- Positions are always passed explicitly (never left to the model), from the attention mask, so
  left padding is handled and the full forward and the incremental loop agree by construction.
  Qwen2.5-VL gets its 3-D multimodal rope positions from the model's own ``get_rope_index``; text
  tokens after the prompt continue at ``max(previous position) + 1``, which is what its cached
  ``rope_deltas`` implement, without relying on that mutable model attribute.
- Vision: the image features (``model.get_image_features``) are scattered into the input
  embeddings here, at the image placeholder tokens, so every model call is a plain
  ``model(inputs_embeds=..., attention_mask=..., position_ids=...)``.
- ``num_values`` is one flat (N,) tensor: the values of the [NUM] tokens of ``input_ids`` in
  order of appearance, row by row (row-major, as ``input_ids[input_ids == num_token_id]``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from ingestion.errors import ModelError
from model.numeric.generation import (
    LogitsProcessor,
    NumericGeneration,
    TokenAutomaton,
    generate_numeric,
)
from model.numeric.protocol import NumericHead

if TYPE_CHECKING:
    from transformers.cache_utils import Cache

__all__ = ["GenerateCall", "NumericLM", "NumericLMOutput"]

IGNORE_INDEX = -100  # label value that the cross-entropy skips (transformers' convention)


@dataclass
class NumericLMOutput:
    """What ``NumericLM.forward`` returns (B rows, L length, V vocab, D hidden, N [NUM] targets)."""

    loss: torch.Tensor | None  # () ce_loss + lambda_ * numeric_loss; None without labels
    ce_loss: torch.Tensor | None  # () mean next-token cross-entropy over label positions
    numeric_loss: torch.Tensor | None  # () head loss at [NUM] targets; 0 if none; None w/o head
    logits: torch.Tensor  # (B, L, V) next-token logits, model dtype
    num_hidden: torch.Tensor  # (N, D) float32 final normed hidden states whose target is [NUM]
    num_positions: torch.Tensor  # (N, 2) long (row, position) of those hidden states
    num_targets: torch.Tensor | None  # (N,) values targeted there (label values); None w/o head


@dataclass(frozen=True)
class GenerateCall:
    """One :meth:`NumericLM.generate` call as its observers see it."""

    input_ids: torch.Tensor  # (B, P) left-padded prompts
    attention_mask: torch.Tensor  # (B, P)
    image_grid_thw: torch.Tensor | None  # (N, 3) the images' patch grids, in row order
    generation: NumericGeneration


class NumericLM(nn.Module):
    """A transformers causal LM plus a numeric head for single-token numbers.

    ``numeric_head=None`` is the standard-token baseline: numbers stay digits, no [NUM] handling.
    To run the backbone in bf16, cast ``lm.model`` rather than ``lm``: the head keeps float32
    parameters, its embeddings are cast to the embedding dtype and hidden states upcast for it.
    """

    def __init__(
        self,
        model: nn.Module,
        numeric_head: NumericHead | None,
        num_token_id: int | None,
    ) -> None:
        super().__init__()
        if numeric_head is not None and num_token_id is None:
            raise ValueError("num_token_id is required with a numeric_head (the [NUM] token id)")
        self.model = model
        self.numeric_head = numeric_head  # an nn.Module head registers its parameters here
        self.num_token_id = num_token_id
        self.backbone = _backbone_for(model)
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        from model._transformers import CACHE  # the model has imported transformers already

        self._cache_name = CACHE  # the key-value cache's keyword and output field
        self._observers: list[Callable[[GenerateCall], None]] = []

    # --- embeddings ----------------------------------------------------------------------------

    def token_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, L) ids -> (B, L, D) the model's own input embeddings."""
        layer = cast(Callable[[torch.Tensor], torch.Tensor], _get(self.model, "input_embeddings"))
        return layer(input_ids)

    def embed_inputs(
        self, input_ids: torch.Tensor, num_values: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L) ids, (N,) values of their [NUM] tokens in row-major order -> (B, L, D)."""
        embeds = self.token_embeddings(input_ids)  # (B, L, D)
        head, num_id = self.numeric_head, self.num_token_id
        if head is None or num_id is None:
            if num_values is not None and num_values.numel() > 0:
                raise ValueError("num_values given but this NumericLM has no numeric_head")
            return embeds
        is_num = input_ids == num_id  # (B, L)
        n_num = int(is_num.sum())
        n_val = 0 if num_values is None else num_values.numel()
        if n_val != n_num:
            raise ValueError(
                f"input_ids hold {n_num} [NUM] tokens but num_values has {n_val} values; pass "
                "one value per [NUM] token, row-major (input_ids[input_ids == num_token_id])"
            )
        if num_values is None or n_num == 0:
            return embeds
        num_embeds = head.embed(num_values.reshape(-1)).to(embeds.dtype)  # (N, D)
        return embeds.masked_scatter(is_num[..., None], num_embeds)

    def prepare_inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        num_values: torch.Tensor | None,
        pixel_values: torch.Tensor | None,
        image_grid_thw: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (B, L, D) input embeddings with [NUM] values and image features, and positions
        ((B, L), or (3 G, B, L) for multimodal rope with G geometries)."""
        if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and attention_mask must both be (B, L), got "
                f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
            )
        embeds = self.embed_inputs(input_ids, num_values)  # (B, L, D)
        embeds = self.backbone.merge_vision(embeds, input_ids, pixel_values, image_grid_thw)
        positions = self.backbone.positions(input_ids, attention_mask, image_grid_thw)
        return embeds, positions

    # --- one model call ------------------------------------------------------------------------

    def generation_cache(self, capacity: int) -> Cache | None:
        """A key-value cache of ``capacity`` positions allocated once (``kv_cache``), or None
        (the model's own growing cache) where the model has layers other than full attention
        or does not say how many layers it has."""
        config = getattr(self.model, "config", None)
        text = config.get_text_config() if config is not None else None
        layers = getattr(text, "num_hidden_layers", None)
        kinds = getattr(text, "layer_types", None) or ["full_attention"]
        if not isinstance(layers, int) or any(kind != "full_attention" for kind in kinds):
            return None
        from model.numeric.kv_cache import preallocated_cache  # transformers is loaded by now

        return preallocated_cache(layers, capacity)

    def run_model(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *,
        past_key_values: Any = None,
        use_cache: bool = False,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Call the model on embeddings -> (logits (B, L', V), lm_head input (B, L', D), cache).

        ``attention_mask`` covers the cache and the new tokens; ``last_only`` keeps only the last
        position's logits (L' = 1) where the model supports ``logits_to_keep``.
        """
        kwargs: dict[str, Any] = {
            "inputs_embeds": inputs_embeds,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            self._cache_name: past_key_values,
            "use_cache": use_cache,
        }
        if last_only and self._keeps_logits:
            kwargs["logits_to_keep"] = 1
        with _capture_input(cast(nn.Module, _get(self.model, "output_embeddings"))) as captured:
            out = self.model(**kwargs)
        if not captured:
            raise ModelError(
                f"{type(self.model).__name__} did not call its output embeddings (lm_head); "
                "NumericLM needs a causal LM whose logits come from get_output_embeddings()"
            )
        logits = cast(torch.Tensor, out.logits)
        cache = getattr(out, self._cache_name) if use_cache else None
        return logits, captured[0], cache

    # --- training ------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        num_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        label_values: torch.Tensor | None = None,
        lambda_: float = 1.0,
        *,
        pixel_values: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
    ) -> NumericLMOutput:
        """Teacher-forced pass over (B, L) ``input_ids`` (see ``NumericLMOutput``).

        ``labels`` (B, L) follow transformers' convention (aligned with ``input_ids``, shifted
        here, ``-100`` ignored). [NUM] targets are the positions whose next label is [NUM], or
        without labels whose next real input token is [NUM]. ``label_values`` (one per [NUM]
        label, row-major) default to the ``num_values`` of the input [NUM] tokens that the
        labels target (teacher forcing: a [NUM] label sits on a [NUM] input token).
        """
        embeds, positions = self.prepare_inputs(
            input_ids, attention_mask, num_values, pixel_values, image_grid_thw
        )
        logits, hidden, _ = self.run_model(embeds, attention_mask, positions)  # (B, L, V/D)

        num_id = self.num_token_id
        if labels is not None:
            targets = labels
        else:
            targets = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
        is_target = torch.zeros_like(input_ids, dtype=torch.bool)  # (B, L) next token is [NUM]
        if num_id is not None:
            is_target[:, :-1] = targets[:, 1:] == num_id
        num_positions = is_target.nonzero()  # (N, 2)
        num_hidden = hidden[is_target].float()  # (N, D) upcast for the head

        num_targets = None
        if self.numeric_head is not None:
            num_targets = self._target_values(input_ids, num_values, labels, label_values)

        if labels is None:
            return NumericLMOutput(None, None, None, logits, num_hidden, num_positions, num_targets)

        ce_loss = F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(),  # (B*(L-1), V)
            labels[:, 1:].flatten(),  # (B*(L-1),)
            ignore_index=IGNORE_INDEX,
        )
        numeric_loss = None
        loss = ce_loss
        if self.numeric_head is not None and num_targets is not None:
            if num_hidden.shape[0] > 0:
                numeric_loss = self.numeric_head.loss(num_hidden, num_targets)
            else:
                numeric_loss = ce_loss.new_zeros(())
            loss = ce_loss + lambda_ * numeric_loss
        return NumericLMOutput(
            loss, ce_loss, numeric_loss, logits, num_hidden, num_positions, num_targets
        )

    def _target_values(
        self,
        input_ids: torch.Tensor,
        num_values: torch.Tensor | None,
        labels: torch.Tensor | None,
        label_values: torch.Tensor | None,
    ) -> torch.Tensor:
        """(N,) values at the [NUM] targets, in row-major order of the target positions."""
        num_id = self.num_token_id
        if num_id is None:
            raise ValueError("num_token_id is needed to find [NUM] targets")
        is_input_num = input_ids == num_id  # (B, L)
        is_label_num = torch.zeros_like(is_input_num)  # (B, L) [NUM] token that is a target
        if labels is None:
            is_label_num[:, 1:] = is_input_num[:, 1:]
        else:
            is_label_num[:, 1:] = labels[:, 1:] == num_id
        n_targets = int(is_label_num.sum())
        if label_values is not None:
            if label_values.numel() != n_targets:
                raise ValueError(
                    f"labels hold {n_targets} [NUM] targets but label_values has "
                    f"{label_values.numel()} values"
                )
            return label_values.reshape(-1)
        if bool((is_label_num & ~is_input_num).any()):
            raise ValueError(
                "a [NUM] label sits on a non-[NUM] input token; pass label_values explicitly"
            )
        values = num_values if num_values is not None else torch.zeros(0, dtype=torch.float64)
        return values.reshape(-1)[is_label_num[is_input_num]]  # (N,)

    # --- generation ----------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        num_values: torch.Tensor | None = None,
        *,
        max_new_tokens: int,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        logits_processor: LogitsProcessor | None = None,
        output_logits: bool = False,
        pixel_values: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
        automaton: TokenAutomaton | None = None,
    ) -> NumericGeneration:
        """Generate from left-padded (B, P) prompts; see ``model.numeric.generation``.

        ``eos_token_id`` / ``pad_token_id`` default to the model's generation config.
        """
        eos_ids, pad_id = _special_ids(self.model, eos_token_id, pad_token_id)
        embeds, positions = self.prepare_inputs(
            input_ids, attention_mask, num_values, pixel_values, image_grid_thw
        )
        generation = generate_numeric(
            self,
            input_ids,
            attention_mask,
            embeds,
            positions,
            num_values,
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            generator=generator,
            eos_ids=eos_ids,
            pad_id=pad_id,
            logits_processor=logits_processor,
            output_logits=output_logits,
            automaton=automaton,
        )
        for observer in list(self._observers):
            observer(GenerateCall(input_ids, attention_mask, image_grid_thw, generation))
        return generation

    def subscribe(self, observer: Callable[[GenerateCall], None]) -> Callable[[], None]:
        """Call ``observer`` after every :meth:`generate` from now on (benchmarks count what
        was generated); returns the function that unsubscribes it."""
        self._observers.append(observer)

        def unsubscribe() -> None:
            if observer in self._observers:
                self._observers.remove(observer)

        return unsubscribe


# --- backbones: what differs between a text LM and Qwen2.5-VL ----------------------------------


class _TextBackbone:
    """A text-only causal LM: 1-D positions counted over real tokens, no vision inputs."""

    def positions(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        image_grid_thw: torch.Tensor | None,
    ) -> torch.Tensor:
        """-> (B, L) positions: 0, 1, ... over the real tokens (padding gets 0)."""
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)

    def merge_vision(
        self,
        embeds: torch.Tensor,
        input_ids: torch.Tensor,
        pixel_values: torch.Tensor | None,
        image_grid_thw: torch.Tensor | None,
    ) -> torch.Tensor:
        if pixel_values is not None or image_grid_thw is not None:
            raise ValueError("pixel_values / image_grid_thw given to a text-only model")
        return embeds


class _QwenVLBackbone(_TextBackbone):
    """Qwen2.5-VL: image features at the image placeholder tokens, 3-D multimodal rope."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        config = cast(Any, model).config
        self.image_token_id = int(config.image_token_id)
        self.video_token_id = int(config.video_token_id)
        self._get_rope_index = cast(Any, model).base_model.get_rope_index
        parameters = inspect.signature(self._get_rope_index).parameters
        self._takes_token_types = "mm_token_type_ids" in parameters

    def positions(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        image_grid_thw: torch.Tensor | None,
    ) -> torch.Tensor:
        """-> (3 G, B, L) (t, h, w) positions per geometry from the model's ``get_rope_index``."""
        if image_grid_thw is None:
            text = super().positions(input_ids, attention_mask, None)  # (B, L)
            return text[None].expand(3, -1, -1)
        kwargs: dict[str, Any] = {
            "image_grid_thw": image_grid_thw,
            "attention_mask": attention_mask,
        }
        if self._takes_token_types:  # transformers 5.x; 4.x finds image tokens from the ids
            kwargs["mm_token_type_ids"] = (input_ids == self.image_token_id).int()  # 1 image
        position_ids, _ = self._get_rope_index(input_ids, **kwargs)
        return cast(torch.Tensor, position_ids)  # (3 G, B, L)

    def merge_vision(
        self,
        embeds: torch.Tensor,
        input_ids: torch.Tensor,
        pixel_values: torch.Tensor | None,
        image_grid_thw: torch.Tensor | None,
    ) -> torch.Tensor:
        """(B, L, D) -> (B, L, D) with image features at the image tokens, in order."""
        if bool((input_ids == self.video_token_id).any()):
            raise ValueError("input_ids hold video tokens; NumericLM supports images only")
        is_image = input_ids == self.image_token_id  # (B, L)
        if pixel_values is None:
            if bool(is_image.any()):
                raise ValueError("input_ids hold image tokens but pixel_values is None")
            return embeds
        if image_grid_thw is None:
            raise ValueError("pixel_values given without image_grid_thw")
        features = cast(Any, self.model).get_image_features(pixel_values, image_grid_thw)
        per_image = getattr(features, "pooler_output", features)  # 5.x output, 4.x tuple
        if isinstance(per_image, torch.Tensor):
            per_image = [per_image]
        image_embeds = torch.cat(list(per_image), dim=0).to(embeds.dtype)  # (I, D)
        if image_embeds.shape[0] != int(is_image.sum()):
            raise ValueError(
                f"input_ids hold {int(is_image.sum())} image tokens but the images give "
                f"{image_embeds.shape[0]} features; check image_grid_thw and the prompt"
            )
        return embeds.masked_scatter(is_image[..., None], image_embeds)


def _backbone_for(model: nn.Module) -> _TextBackbone:
    base = getattr(model, "base_model", None)
    if hasattr(base, "get_rope_index") and hasattr(model, "get_image_features"):
        return _QwenVLBackbone(model)
    return _TextBackbone()


# --- helpers -----------------------------------------------------------------------------------


def _get(model: nn.Module, what: str) -> object:
    """``model.get_input_embeddings()`` / ``get_output_embeddings()``, or ModelError."""
    getter = getattr(model, f"get_{what}", None)
    module = getter() if callable(getter) else None
    if not isinstance(module, nn.Module):
        raise ModelError(f"{type(model).__name__} has no {what}; NumericLM needs a causal LM")
    return module


@contextlib.contextmanager
def _capture_input(module: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect the first input of ``module`` for the duration of the block."""
    captured: list[torch.Tensor] = []

    def hook(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured.append(args[0] if args else kwargs["input"])

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield captured
    finally:
        handle.remove()


def _special_ids(
    model: nn.Module, eos_token_id: int | Sequence[int] | None, pad_token_id: int | None
) -> tuple[list[int], int]:
    """-> (EOS ids, pad id) from the arguments, else the model's generation config."""
    config = getattr(model, "generation_config", None)
    eos: Any = eos_token_id if eos_token_id is not None else getattr(config, "eos_token_id", None)
    eos_ids = [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]
    pad: Any = pad_token_id if pad_token_id is not None else getattr(config, "pad_token_id", None)
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0
    return eos_ids, int(pad)
