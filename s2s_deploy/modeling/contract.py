"""The torch half of the plugin contract: the model a plugin builds and what one decoder step returns.

The declarative half (``ArchitecturePlugin``, ``validate_plugin``, the specs) is torch-free, in
``s2s_deploy/architecture/declaration.py``, and re-exported here, so a one-file plugin imports the
whole contract from this module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, NamedTuple

from torch import Tensor, nn

from s2s_deploy.architecture.declaration import (  # noqa: F401  re-exported: the whole contract in one import
    BATCH,
    ArchitecturePlugin,
    HFWeights,
    MemorySpec,
    SourceSpec,
    SpecialTokens,
    StateSpec,
    cross_attention_memory,
    cross_memory_specs,
    layer_name,
    self_attention_cache,
    validate_plugin,
)


class StepOutput(NamedTuple):
    log_probs: Tensor
    state: dict[str, Tensor]
    attention: Tensor | None = None


class Seq2SeqModel(nn.Module, ABC):
    """The trainable module a plugin builds, with the two halves that are exported."""

    memory_per_sentence: ClassVar[bool] = False
    """Whether ``decode_step`` also takes each memory tensor with one row per sentence while its
    tokens and state have several rows per sentence, grouped sentence-major (a sentence's beams or
    samples side by side), so beam search never copies the encoder's memory K times nor reads it
    K times a step. Checked at export against the same step on repeated memory; the manifest's
    ``memory_per_sentence`` then tells runtimes that they may skip the repeat."""

    multi_step: ClassVar[bool] = False
    """Whether ``decode_steps`` is implemented: the export then adds a second decoder graph that
    feeds k target positions at once (exact speculative greedy verifies k drafted tokens in one
    pass). A model that declines (a recurrent step, a convolution over its own window) leaves it
    False and keeps the one-position graph only."""

    @abstractmethod
    def forward(self, src: Tensor, src_len: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits ``(batch, tgt_len, vocab)`` for training and step checks."""

    @abstractmethod
    def encode(self, src: Tensor, src_len: Tensor) -> dict[str, Tensor]:
        """Every memory tensor, and the first value of each ``init="encoder"`` state, by name."""

    @abstractmethod
    def decode_step(
        self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor], state: dict[str, Tensor]
    ) -> StepOutput:
        """One target position: ``tokens`` is ``(batch,)``, ``step`` a 0-d int64 position."""

    def decode_steps(
        self, tokens: Tensor, step: Tensor, memory: dict[str, Tensor], state: dict[str, Tensor]
    ) -> StepOutput:
        """``tokens`` ``(rows, k)`` at positions ``step .. step + k - 1`` (``step`` 0-d): what k
        calls of ``decode_step`` return, at once. ``log_probs`` is ``(rows, k, vocab)``; each
        growing state grows by k along its ``grow_axis``; the memory has one row per token row.
        Only where ``multi_step`` is True; no attention output."""
        raise NotImplementedError(f"{type(self).__name__} does not decode several positions at once")
