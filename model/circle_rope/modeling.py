"""Qwen2.5-VL with Circle-RoPE image positions and alternating geometry (AGE) across layers.

Subclasses of transformers' Qwen2.5-VL classes that override only what changes:

- ``CircleRopeRotaryEmbedding``: the M-RoPE table, always from float32 positions and float32
  ``inv_freq`` with autocast off (Circle positions are fractional: bf16 would corrupt them), even
  after ``model.to(torch.bfloat16)``.
- ``CircleRopeQwen2_5_VLTextModel``: computes an M-RoPE and a Circle-RoPE table and gives each
  decoder layer its own (``circle_layers``); the layers themselves are transformers' own.
- ``CircleRopeQwen2_5_VLModel``: ``get_rope_index`` returns both geometries from one walk
  (``model.circle_rope.positions``) and remembers both ``rope_deltas`` for decoding.
- ``CircleRopeQwen2_5_VLForConditionalGeneration``: ``generate`` prepares both geometries.

Position ids the text model accepts, (rows, B, L):

- 3 rows (t, h, w) or 2-D ids: one geometry for every layer (text only, or strategy "off").
- 4 rows: transformers' packed form, row 0 the plain text position (masks only), rows 1-3 as above.
- 6 rows: M-RoPE (t, h, w) then Circle (t, h, w).
- 7 rows: the text row, then the six above (what ``generate`` passes).

Decoding continues each geometry from its own ``rope_deltas`` (M-RoPE layers with the M-RoPE delta,
Circle layers with the Circle delta), so prefill + incremental decode equals one forward pass over
the whole sequence. The reference implementation uses the Circle delta for every layer while
decoding, which breaks that equality for the M-RoPE layers; radcaliper does not copy it.

With strategy "off" every override defers to transformers: the model is Qwen2.5-VL exactly.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn
from transformers import GenerationMixin, conversion_mapping
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
    Qwen2_5_VisionTransformerPretrainedModel,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLModel,
    Qwen2_5_VLPreTrainedModel,
    Qwen2_5_VLRotaryEmbedding,
    Qwen2_5_VLTextModel,
)

from model._transformers import CACHE
from model.circle_rope.config import CircleRopeQwen2_5_VLConfig
from model.circle_rope.positions import multimodal_position_ids

__all__ = [
    "CircleRopeQwen2_5_VLForConditionalGeneration",
    "CircleRopeQwen2_5_VLModel",
    "CircleRopeQwen2_5_VLTextModel",
    "CircleRopeRotaryEmbedding",
    "register_auto_classes",
    "split_position_ids",
]

Table = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each (B, L, head_dim)


class CircleRopeRotaryEmbedding(Qwen2_5_VLRotaryEmbedding):
    """Qwen2.5-VL's rotary table, computed in float32 whatever the model's dtype or autocast."""

    _FLOAT32_BUFFERS = ("inv_freq", "original_inv_freq")

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> Table:
        """(B, L, D) ``x`` (for device and output dtype), (3, B, L) positions -> (cos, sin)."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            cos, sin = super().forward(x, position_ids.float())
        return cos, sin

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        """Move with the model but keep ``inv_freq`` float32 (``.to(bfloat16)`` would round it)."""
        kept = {name: getattr(self, name) for name in self._FLOAT32_BUFFERS}
        out = super()._apply(fn, recurse)
        for name, before in kept.items():
            after = getattr(self, name)
            if after.dtype != torch.float32:
                setattr(self, name, before.to(device=after.device, dtype=torch.float32))
        return out


def split_position_ids(
    position_ids: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """(rows, B, L) position ids -> (text (B, L) int64 or None, M-RoPE (3, B, L), Circle (3, B, L)
    or None); the layouts are in the module doc. 2-D ids are one geometry on all three rows."""
    if position_ids.dim() == 2:
        return None, position_ids[None].expand(3, -1, -1), None
    rows = position_ids.shape[0] if position_ids.dim() == 3 else 0
    if rows == 3:
        return None, position_ids, None
    if rows == 4:
        return position_ids[0].long(), position_ids[1:], None
    if rows == 6:
        return None, position_ids[:3], position_ids[3:]
    if rows == 7:
        return position_ids[0].long(), position_ids[1:4], position_ids[4:]
    raise ValueError(
        f"position_ids of shape {tuple(position_ids.shape)}: expected (B, L) or (R, B, L) with "
        "R = 3, 4, 6 or 7"
    )


class CircleRopeQwen2_5_VLTextModel(Qwen2_5_VLTextModel):
    """Qwen2.5-VL's decoder with a rotary table per geometry and a geometry per layer."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.rotary_emb = CircleRopeRotaryEmbedding(config=config)
        #: per decoder layer, True where it uses Circle-RoPE (set by CircleRopeQwen2_5_VLModel)
        self.circle_layers: tuple[bool, ...] = (False,) * config.num_hidden_layers

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        cache: Cache | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """The decoder (transformers' own layers, a rotary table per geometry). The key-value
        cache comes as ``past_key_values`` (transformers < 5.24) or ``cache`` (5.24 on).

        ``use_cache`` and ``output_hidden_states`` default to the config's, as in
        transformers; ``hidden_states`` are the embeddings and every layer's output, the last
        one normed. Attention weights are not returned (``ValueError`` when asked for).
        ``return_dict`` is accepted and ignored: the output is always the dataclass.
        """
        config: Any = self.config
        if cache is not None:
            past_key_values = cache
        if use_cache is None:
            use_cache = bool(getattr(config, "use_cache", False))
        if output_attentions is None:
            output_attentions = bool(getattr(config, "output_attentions", False))
        if output_attentions:
            raise ValueError("the Circle-RoPE decoder does not return attention weights")
        if output_hidden_states is None:
            output_hidden_states = bool(getattr(config, "output_hidden_states", False))
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if use_cache and past_key_values is None and not torch.jit.is_tracing():  # type: ignore[attr-defined]
            past_key_values = DynamicCache(config=self.config)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # (B, L, D)
        if position_ids is None:  # text only: one geometry, counting on from the cache
            past = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past
            position_ids = position_ids.view(1, 1, -1).expand(3, inputs_embeds.shape[0], -1)
        text_ids, mrope_ids, circle_ids = split_position_ids(position_ids)

        masks: Any = attention_mask
        if not isinstance(masks, dict):  # ``generate`` may have built them already
            # the cache goes by position: transformers 5.24 renamed it (past_key_values -> cache)
            mask_args = (config, inputs_embeds, attention_mask, past_key_values)
            masks = {"full_attention": create_causal_mask(*mask_args, position_ids=text_ids)}
            if self.has_sliding_layers:
                masks["sliding_attention"] = create_sliding_window_causal_mask(
                    *mask_args, position_ids=text_ids
                )

        hidden = inputs_embeds
        mrope_table = self.rotary_emb(hidden, mrope_ids)
        circle_table = mrope_table
        if circle_ids is not None and any(self.circle_layers):
            circle_table = self.rotary_emb(hidden, circle_ids)
        states: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            if output_hidden_states:
                states.append(hidden)
            hidden = layer(
                hidden,
                attention_mask=masks[config.layer_types[i]],
                position_embeddings=circle_table if self.circle_layers[i] else mrope_table,
                position_ids=text_ids,
                use_cache=use_cache,
                **{CACHE: past_key_values},
                **kwargs,
            )
        hidden = self.norm(hidden)  # (B, L, D)
        cached: dict[str, Any] = {CACHE: past_key_values}
        return BaseModelOutputWithPast(
            last_hidden_state=hidden,
            hidden_states=(*states, hidden) if output_hidden_states else None,
            **cached,
        )


def _continue_positions(text: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """(B, L) text positions, (B, 2) (M-RoPE, Circle) deltas -> (6, B, L) float32 positions."""
    text = text.to(torch.float32)
    deltas = deltas.to(device=text.device, dtype=torch.float32)
    if deltas.shape[0] != text.shape[0]:  # beams / returned sequences expand the batch
        deltas = deltas.repeat_interleave(text.shape[0] // deltas.shape[0], dim=0)
    mrope = (text + deltas[:, :1])[None].expand(3, -1, -1)
    circle = (text + deltas[:, 1:])[None].expand(3, -1, -1)
    return torch.cat((mrope, circle))


class CircleRopeQwen2_5_VLModel(Qwen2_5_VLModel):
    """Qwen2.5-VL (vision tower + decoder) with Circle-RoPE positions for the decoder."""

    config_class = CircleRopeQwen2_5_VLConfig
    config: CircleRopeQwen2_5_VLConfig

    def __init__(self, config: CircleRopeQwen2_5_VLConfig) -> None:
        Qwen2_5_VLPreTrainedModel.__init__(self, config)  # not Qwen2_5_VLModel's: no stock decoder
        self.visual = Qwen2_5_VisionTransformerPretrainedModel._from_config(config.vision_config)
        self.language_model = CircleRopeQwen2_5_VLTextModel._from_config(config.text_config)
        self.language_model.circle_layers = config.circle_layers()
        self.rope_deltas: Any = None  # (B, 2) (M-RoPE, Circle) after a first pass; "off": (B, 1)
        self.post_init()

    @property
    def uses_circle(self) -> bool:
        """False for strategy "off": then every position comes from transformers' own code."""
        return any(self.language_model.circle_layers)

    def token_types(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, L) ids -> transformers' ``mm_token_type_ids``: 0 text, 1 image, 2 video tokens."""
        types = (input_ids == self.config.image_token_id).int()
        return types + 2 * (input_ids == self.config.video_token_id).int()

    def get_rope_index(
        self,
        input_ids: torch.Tensor,
        mm_token_type_ids: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
        video_grid_thw: torch.Tensor | None = None,
        second_per_grid_ts: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (6, B, L) float32 positions (M-RoPE rows, then Circle rows) and (B, 2) deltas.

        With strategy "off": transformers' (3, B, L) ids and (B, 1) deltas, unchanged.
        """
        if video_grid_thw is not None:
            raise ValueError(
                "videos are not supported with Circle-RoPE; give a volume as several images or as "
                "one multi-frame image (image_grid_thw with t > 1)"
            )
        if not self.uses_circle:
            if mm_token_type_ids is None:
                mm_token_type_ids = self.token_types(input_ids)
            parent: Any = super()
            ids, deltas = parent.get_rope_index(
                input_ids,
                mm_token_type_ids,
                image_grid_thw=image_grid_thw,
                second_per_grid_ts=second_per_grid_ts,
                attention_mask=attention_mask,
                **kwargs,
            )
            return ids, deltas
        config: Any = self.config
        p = multimodal_position_ids(
            input_ids,
            image_grid_thw,
            attention_mask,
            spatial_merge_size=config.vision_config.spatial_merge_size,
            image_token_id=config.image_token_id,
            vision_start_token_id=config.vision_start_token_id,
            alpha=config.circle_rope_alpha,
            radius=config.circle_rope_radius,
            frame_stride=config.circle_rope_frame_stride,
        )
        positions = torch.cat((p.mrope.to(torch.float32), p.circle))  # (6, B, L)
        deltas = torch.cat((p.mrope_deltas.to(torch.float32), p.circle_deltas), dim=1)  # (B, 2)
        return positions, deltas

    def compute_3d_position_ids(  # type: ignore[override,unused-ignore]  # override on 5.23 only
        self,
        input_ids: torch.Tensor | None,
        image_grid_thw: torch.Tensor | None,
        video_grid_thw: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        past_key_values: Cache | None = None,
        second_per_grid_ts: torch.Tensor | None = None,
        mm_token_type_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
    ) -> torch.Tensor | None:
        """Positions for ``forward`` calls without ``position_ids``: both geometries from the ids
        on a first pass, else each continued from its own remembered delta. The key-value cache
        comes as ``past_key_values`` (transformers < 5.24) or ``cache`` (5.24 on)."""
        if cache is not None:
            past_key_values = cache
        if not self.uses_circle:
            if mm_token_type_ids is None and input_ids is not None:
                mm_token_type_ids = self.token_types(input_ids)
            parent: Any = super()
            positions: torch.Tensor | None = parent.compute_3d_position_ids(
                input_ids=input_ids,
                image_grid_thw=image_grid_thw,
                video_grid_thw=video_grid_thw,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                second_per_grid_ts=second_per_grid_ts,
                mm_token_type_ids=mm_token_type_ids,
                **{CACHE: past_key_values},
            )
            return positions
        past = 0 if past_key_values is None else past_key_values.get_seq_length()
        if (
            input_ids is not None
            and image_grid_thw is not None
            and (self.rope_deltas is None or past == 0)
        ):
            positions, self.rope_deltas = self.get_rope_index(
                input_ids,
                image_grid_thw=image_grid_thw,
                video_grid_thw=video_grid_thw,
                attention_mask=attention_mask,
            )
            return positions
        if self.rope_deltas is not None and (past > 0 or input_ids is None):
            assert inputs_embeds is not None  # forward always has them here
            batch, length = inputs_embeds.shape[:2]
            if attention_mask is not None:
                text = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
                text = text[:, -length:]
            else:
                text = torch.arange(past, past + length, device=inputs_embeds.device)
                text = text[None].expand(batch, -1)
            return _continue_positions(text, self.rope_deltas)
        return None


class CircleRopeQwen2_5_VLForConditionalGeneration(Qwen2_5_VLForConditionalGeneration):
    """Qwen2.5-VL for generation with Circle-RoPE/AGE; ``save_pretrained`` / ``from_pretrained``
    round trip through a local directory (model type ``circle_rope_qwen2_5_vl``)."""

    config_class = CircleRopeQwen2_5_VLConfig
    config: CircleRopeQwen2_5_VLConfig

    def __init__(self, config: CircleRopeQwen2_5_VLConfig) -> None:
        # the renamings also decide the layout save_pretrained writes: register them before any
        # instance exists, so every save in a process writes the same (Qwen2.5-VL) layout
        _register_weight_names()
        Qwen2_5_VLPreTrainedModel.__init__(self, config)
        self.model = CircleRopeQwen2_5_VLModel(config)
        text: Any = config.text_config
        self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        """transformers' ``from_pretrained`` (local directories: pass ``local_files_only=True``
        to rule out the hub). A plain Qwen2.5-VL directory is converted: its weight names are
        renamed as transformers renames them for Qwen2.5-VL, and ``circle_rope_*`` keyword
        arguments set the Circle-RoPE keys."""
        _register_weight_names()
        return super().from_pretrained(*args, **kwargs)

    @classmethod
    def from_qwen2_5_vl(
        cls, model: Qwen2_5_VLForConditionalGeneration, **circle_rope: Any
    ) -> CircleRopeQwen2_5_VLForConditionalGeneration:
        """The same weights under Circle-RoPE (``circle_rope_strategy="alternate"`` etc.); the
        source model is left unchanged. Parameter names are identical, so nothing is re-initialised
        (a missing or unexpected weight raises)."""
        config = CircleRopeQwen2_5_VLConfig.from_qwen2_5_vl_config(model.config, **circle_rope)
        parameter = next(model.parameters())
        converted = cls(config)
        cast(Any, converted).to(device=parameter.device, dtype=parameter.dtype)
        converted.load_state_dict(model.state_dict(), strict=True)
        converted.generation_config = model.generation_config
        converted.train(model.training)
        return converted

    def _prepare_position_ids_for_generation(
        self, inputs_tensor: torch.Tensor, model_kwargs: dict[str, Any]
    ) -> torch.Tensor:
        """``generate``'s first position ids: (7, B, L) float32 = text row, M-RoPE, Circle."""
        model = cast(CircleRopeQwen2_5_VLModel, self.model)
        if not model.uses_circle:
            ids = model_kwargs.get("input_ids", inputs_tensor)
            if model_kwargs.get("mm_token_type_ids") is None and _is_ids(ids):
                model_kwargs["mm_token_type_ids"] = model.token_types(ids)
            return cast(
                torch.Tensor,
                super()._prepare_position_ids_for_generation(inputs_tensor, model_kwargs),
            )
        text = GenerationMixin._prepare_position_ids_for_generation(
            self, inputs_tensor, model_kwargs
        )
        cache = model_kwargs.get(CACHE)
        past = cache.get_seq_length() if cache is not None else 0
        input_ids = model_kwargs.get("input_ids")
        if input_ids is None or input_ids.shape[1] == 0:
            input_ids = inputs_tensor
        new_images = bool((input_ids[:, past:] == self.config.image_token_id).any())
        if past and model.rope_deltas is not None and not new_images:
            rows = _continue_positions(text, model.rope_deltas)
        elif _is_ids(input_ids) and model_kwargs.get("image_grid_thw") is not None:
            rows, model.rope_deltas = model.get_rope_index(
                input_ids,
                image_grid_thw=model_kwargs["image_grid_thw"],
                video_grid_thw=model_kwargs.get("video_grid_thw"),
                attention_mask=model_kwargs.get("attention_mask"),
            )
        else:  # text only: both geometries are the text positions
            model.rope_deltas = torch.zeros(text.shape[0], 2, device=text.device)
            rows = _continue_positions(text, model.rope_deltas)
        return torch.cat((text.to(torch.float32)[None], rows))  # (7, B, L)


def _register_weight_names() -> None:
    """Give our classes the checkpoint renamings transformers keeps for Qwen2.5-VL's classes
    (looked up by class name), so checkpoints in either weight layout load. Idempotent.

    Uses transformers' registration for custom classes (``conversion_mapping``'s
    ``get_checkpoint_conversion_mapping`` and ``register_checkpoint_conversion_mapping``, the
    functions it documents for code outside the library), nothing of its internals."""
    for ours, theirs in (
        (CircleRopeQwen2_5_VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration),
        (CircleRopeQwen2_5_VLModel, Qwen2_5_VLModel),
    ):
        mapping = conversion_mapping.get_checkpoint_conversion_mapping(theirs.__name__)
        if mapping is not None:
            conversion_mapping.register_checkpoint_conversion_mapping(
                ours.__name__, mapping, overwrite=True
            )


def _is_ids(tensor: torch.Tensor) -> bool:
    return tensor.dim() == 2 and tensor.dtype in (torch.int32, torch.int64)


def register_auto_classes() -> None:
    """Register the Circle-RoPE classes with transformers' Auto classes (idempotent):
    ``AutoConfig`` for the model type ``circle_rope_qwen2_5_vl``, ``AutoModel`` and
    ``AutoModelForImageTextToText``, so that a saved checkpoint loads with them. Importing this
    module calls it."""
    from transformers import AutoConfig, AutoModel, AutoModelForImageTextToText

    config = CircleRopeQwen2_5_VLConfig
    AutoConfig.register(config.model_type, config, exist_ok=True)
    AutoModel.register(config, CircleRopeQwen2_5_VLModel, exist_ok=True)
    AutoModelForImageTextToText.register(
        config, CircleRopeQwen2_5_VLForConditionalGeneration, exist_ok=True
    )


register_auto_classes()  # a dictionary entry per class, as transformers' own models do
