"""A key-value cache allocated once per generate call (transformers' ``Cache`` API).

transformers' ``DynamicCache`` grows each layer's keys and values with ``torch.cat`` at every
step, which copies the whole cache: a generate call of ``T`` steps copies it ``T`` times. Its
``StaticCache`` writes in place but hands attention the whole preallocated length, masked, which
changes the attention's shapes (and so its floating-point sums) against a growing cache.

:class:`PreallocatedLayer` does both halves right for generation: one buffer per layer of
``capacity`` positions (prompt plus the most new tokens), each step writes its keys and values
in place, and attention gets a view of the positions written so far: the same shapes and values
as ``DynamicCache`` hands it, without the copies. Rows can leave the batch
(``batch_select_indices``, rows that finished). Past ``capacity`` it grows like a dynamic layer
(never wrong, only slower).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

__all__ = ["PreallocatedLayer", "preallocated_cache"]


class PreallocatedLayer(DynamicLayer):
    """One decoder layer's keys and values, ``(B, H, capacity, d)`` allocated at the first
    update; ``keys`` / ``values`` are views of the positions written so far."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 position, got {capacity}")
        self.capacity = capacity
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        batch, heads, _, key_dim = key_states.shape
        self._key_buffer = key_states.new_empty((batch, heads, self.capacity, key_dim))
        self._value_buffer = value_states.new_empty(
            (batch, heads, self.capacity, value_states.shape[-1])
        )
        self._length = 0
        self.keys = self._key_buffer[:, :, :0]
        self.values = self._value_buffer[:, :, :0]
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, H, n, d) new keys and values after the cached ones -> every cached one."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self._key_buffer, self._value_buffer
        assert keys is not None and values is not None  # allocated above
        end = self._length + key_states.shape[-2]
        if end > keys.shape[-2]:  # past capacity: grow (one copy), then go on in place
            more = max(end, 2 * keys.shape[-2]) - keys.shape[-2]
            keys = torch.cat([keys, keys.new_empty((*keys.shape[:2], more, keys.shape[-1]))], 2)
            values = torch.cat(
                [values, values.new_empty((*values.shape[:2], more, values.shape[-1]))], 2
            )
            self._key_buffer, self._value_buffer = keys, values
        keys[:, :, self._length : end] = key_states
        values[:, :, self._length : end] = value_states
        self._length = end
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows ``indices`` (e.g. the rows still generating)."""
        if self._key_buffer is None or self._value_buffer is None:
            return
        self._key_buffer = self._key_buffer[indices]
        self._value_buffer = self._value_buffer[indices]
        self.keys = self._key_buffer[:, :, : self._length]
        self.values = self._value_buffer[:, :, : self._length]

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        self._length = 0
        super().reset()


def preallocated_cache(layers: int, capacity: int) -> Cache:
    """A cache of ``layers`` :class:`PreallocatedLayer` of ``capacity`` positions each."""
    return Cache(layers=[PreallocatedLayer(capacity) for _ in range(layers)])
