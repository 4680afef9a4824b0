"""The exportable graphs, built generically from any plugin's model and specs: the encoder, the
one-position decoder step and, where the model declares ``multi_step``, the k-position step.

The PyTorch backend runs these same modules, so parity compares like with like.
Graph inputs and outputs are bound by name (see ``io_names``), never by position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from s2s_deploy.format.names import ROLLBACK, init_name, past_name, present_name
from s2s_deploy.modeling.contract import MemorySpec, Seq2SeqModel, StateSpec


@dataclass(frozen=True)
class GraphIO:
    encoder_inputs: tuple[str, ...]
    encoder_outputs: tuple[str, ...]
    decoder_inputs: tuple[str, ...]
    decoder_outputs: tuple[str, ...]


def io_names(memory: tuple[MemorySpec, ...], state: tuple[StateSpec, ...], with_attention: bool) -> GraphIO:
    """The one place graph I/O names are made, so export, manifest and backends agree."""
    memory_names = tuple(m.name for m in memory)
    return GraphIO(
        encoder_inputs=("src", "src_len"),
        encoder_outputs=memory_names + tuple(init_name(s.name) for s in state if s.init == "encoder"),
        decoder_inputs=("tokens", "step", "reorder", *memory_names, *(past_name(s.name) for s in state)),
        decoder_outputs=("log_probs", *(present_name(s.name) for s in state))
        + (("attention",) if with_attention else ()),
    )


def multi_io_names(memory: tuple[MemorySpec, ...], state: tuple[StateSpec, ...]) -> tuple[tuple[str, ...],
                                                                                         tuple[str, ...]]:
    """The k-position step's inputs and outputs: the step's, with ``rollback`` for ``reorder``."""
    return (("tokens", "step", ROLLBACK, *(m.name for m in memory), *(past_name(s.name) for s in state)),
            ("log_probs", *(present_name(s.name) for s in state)))


class EncoderGraph(nn.Module):
    def __init__(self, model: Seq2SeqModel, memory: tuple[MemorySpec, ...], state: tuple[StateSpec, ...]) -> None:
        super().__init__()
        self.model = model
        self.memory_names = [m.name for m in memory]
        self.init_names = [s.name for s in state if s.init == "encoder"]

    def forward(self, src: Tensor, src_len: Tensor) -> tuple[Tensor, ...]:
        encoded = self.model.encode(src, src_len)
        return tuple(encoded[name] for name in self.memory_names + self.init_names)


class StepGraph(nn.Module):
    """One decoder step. ``reorder`` gathers the incoming state along its batch axis first, so
    beam search reorders the cache inside the runtime instead of copying it through Python.
    ``alignment_heads``: the ``attention`` output holds only these (layer, head) pairs' weights,
    ``(rows, pairs, source)``, of a model whose attention is ``(rows, layers, heads, source)``
    (word timestamps read them; the other heads never leave the graph)."""

    def __init__(
        self, model: Seq2SeqModel, memory: tuple[MemorySpec, ...], state: tuple[StateSpec, ...],
        with_attention: bool = False, alignment_heads: tuple[tuple[int, int], ...] = (),
    ) -> None:
        super().__init__()
        self.model = model
        self.memory_names = [m.name for m in memory]
        self.state_specs = list(state)
        self.with_attention = with_attention or bool(alignment_heads)
        self.alignment_heads = alignment_heads

    def forward(self, tokens: Tensor, step: Tensor, reorder: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
        n_memory = len(self.memory_names)
        memory = dict(zip(self.memory_names, tensors[:n_memory], strict=True))
        state = {
            spec.name: torch.index_select(past, spec.batch_axis, reorder)
            for spec, past in zip(self.state_specs, tensors[n_memory:], strict=True)
        }
        out = self.model.decode_step(tokens, step, memory, state)
        outputs = (out.log_probs, *(out.state[spec.name] for spec in self.state_specs))
        if self.with_attention:
            if out.attention is None:
                raise ValueError("the model returned no attention weights")
            outputs = (*outputs, self.aligned(out.attention) if self.alignment_heads else out.attention)
        return outputs

    def aligned(self, attention: Tensor) -> Tensor:
        """The alignment heads' weights ``(rows, pairs, source)`` from ``(rows, layers, heads, source)``."""
        if attention.dim() != 4:
            raise ValueError(f"alignment heads need attention of (rows, layers, heads, source), not "
                             f"{tuple(attention.shape)}")
        layers, heads = attention.shape[1], attention.shape[2]
        for layer, head in self.alignment_heads:
            if not (0 <= layer < layers and 0 <= head < heads):
                raise ValueError(f"alignment head ({layer}, {head}) is outside the model's {layers} layers of "
                                 f"{heads} heads")
        return torch.stack([attention[:, layer, head] for layer, head in self.alignment_heads], dim=1)


class MultiStepGraph(nn.Module):
    """k decoder positions at once (``Seq2SeqModel.decode_steps``): ``tokens`` ``(rows, k)`` from
    position ``step``. ``rollback`` (0-d) drops that many positions from the end of every growing
    state first: the positions a verify step fed that the search then rejected. The graph copies
    each cache anyway (the append), so cutting it there costs nothing, and the runtime's buffers
    never move (docs/architecture.md, "Decisions")."""

    def __init__(self, model: Seq2SeqModel, memory: tuple[MemorySpec, ...], state: tuple[StateSpec, ...]) -> None:
        super().__init__()
        self.model = model
        self.memory_names = [m.name for m in memory]
        self.state_specs = list(state)

    def forward(self, tokens: Tensor, step: Tensor, rollback: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
        n_memory = len(self.memory_names)
        memory = dict(zip(self.memory_names, tensors[:n_memory], strict=True))
        drop = rollback.item()
        torch._check(drop >= 0)
        state = {spec.name: kept(past, spec.grow_axis, drop)
                 for spec, past in zip(self.state_specs, tensors[n_memory:], strict=True)}
        out = self.model.decode_steps(tokens, step, memory, state)
        return (out.log_probs, *(out.state[spec.name] for spec in self.state_specs))


def kept(past: Tensor, axis: int | None, drop: Any) -> Tensor:
    """``past`` without its last ``drop`` positions along ``axis`` (a state that does not grow: as it is)."""
    if axis is None:
        return past
    torch._check(drop <= past.shape[axis])
    index = (slice(None),) * axis + (slice(0, past.shape[axis] - drop),)
    return past[index]
