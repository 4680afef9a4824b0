"""Memory and state specs: the tensors that pass between an export's two graphs.

One definition for the plugin contract (which re-exports it), the manifest and the runtime,
plus the spec groups that attention decoders compose: a self-attention KV cache that grows by
one position a step, and cross-attention keys and values the encoder computes once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from s2s_deploy.format.names import init_name, past_name, present_name

BATCH = "batch"
DTYPES = ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")
"""The element types a memory or state tensor may have: what numpy makes and ONNX Runtime feeds
without conversion. A manifest naming any other type is refused before a tensor is made."""


@dataclass(frozen=True)
class MemorySpec:
    """A per-sentence tensor the encoder computes once and every decoder step reads unchanged."""

    name: str
    batch_axis: int = 0
    dtype: str = "float32"
    description: str = ""


@dataclass(frozen=True)
class StateSpec:
    """A tensor the decoder step carries: read as ``past_<name>``, returned as ``present_<name>``.

    ``init="encoder"``: the encoder graph outputs the first value as ``init_<name>``.
    ``init="zeros"``: the caller creates zeros of ``shape``, where the string ``"batch"``
    stands for the batch size and a ``grow_axis`` entry of 0 gives an empty cache.
    """

    name: str
    batch_axis: int
    init: Literal["encoder", "zeros"]
    shape: tuple[int | str, ...] = ()
    grow_axis: int | None = None
    dtype: str = "float32"
    description: str = ""

    @property
    def decoder_input(self) -> str:
        return past_name(self.name)

    @property
    def decoder_output(self) -> str:
        return present_name(self.name)

    @property
    def encoder_output(self) -> str | None:
        return init_name(self.name) if self.init == "encoder" else None

    def zeros_shape(self, batch: int, past_len: int | None = None) -> tuple[int, ...]:
        return zeros_shape(self.shape, batch, self.grow_axis, past_len)


def zeros_shape(shape: tuple[int | str, ...], batch: int, grow_axis: int | None = None,
                past_len: int | None = None) -> tuple[int, ...]:
    """Shape of an ``init="zeros"`` state for ``batch`` rows; ``past_len`` sets a growing axis."""
    dims = [batch if d == BATCH else int(d) for d in shape]
    if past_len is not None and grow_axis is not None:
        dims[grow_axis] = past_len
    return tuple(dims)


def layer_name(kind: str, layer: int) -> str:
    """Graph tensor name of one layer's cache or memory: ``self_k0``, ``cross_v1``, ..."""
    return f"{kind}{layer}"


def self_attention_cache(layers: int, heads: int, head_dim: int, dtype: str = "float32") -> tuple[StateSpec, ...]:
    """Each decoder layer's self-attention keys and values ``(B, heads, T, head_dim)``, empty at
    the start and one position longer after each step: ``self_k0, self_v0, self_k1, ...``."""
    return tuple(
        StateSpec(layer_name(kind, i), batch_axis=0, init="zeros", shape=(BATCH, heads, 0, head_dim), grow_axis=2,
                  dtype=dtype, description=f"(B, heads, T, head_dim) layer {i} self-attention {what}")
        for i in range(layers)
        for kind, what in (("self_k", "keys"), ("self_v", "values"))
    )


def cross_attention_memory(layers: int, dtype: str = "float32") -> tuple[MemorySpec, ...]:
    """Each decoder layer's cross-attention keys, transposed ``(B, heads, head_dim, S)``, and values
    ``(B, heads, S, head_dim)``, projected once from the encoder output: ``cross_k0, cross_v0, ...``."""
    return tuple(
        spec
        for i in range(layers)
        for spec in (
            MemorySpec(layer_name("cross_k", i), 0, dtype,
                       description=f"(B, heads, head_dim, S) layer {i} cross-attention keys, transposed"),
            MemorySpec(layer_name("cross_v", i), 0, dtype,
                       description=f"(B, heads, S, head_dim) layer {i} cross-attention values"),
        )
    )


def cross_memory_specs(layers: int) -> tuple[MemorySpec, ...]:
    """``src_bias`` and every decoder layer's cross-attention K/V (``cross_attention_memory``), as
    the encoder outputs them."""
    return (MemorySpec("src_bias", 0, description="(B, 1, 1, S) additive source padding mask"),
            *cross_attention_memory(layers))
