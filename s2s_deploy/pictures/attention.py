"""Cross-attention maps from an exported decoder, for looking at what a model attends to.

Needs numpy and the runtime only (no PyTorch), so it works from an export folder alone.

Layout convention of the step graph's ``attention`` output, read for every architecture
alike: a leading batch axis, a trailing source axis, and whatever lies between indexes the
maps, layer-major:

* ``(batch, source)``: one map.
* ``(batch, layers, source)``: one map per layer, "layer 1", "layer 2", ...; a single layer is one map.
* ``(batch, layers, heads, source)``: one map per head, "layer 1 head 1", "layer 1 head 2", ...

Each map is a distribution over source positions: it sums to 1 over the real tokens and
padding gets 0. Nothing else is assumed, so a new plugin needs no code here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest
from s2s_deploy.runtime.backend import Backend
from s2s_deploy.runtime.translator import encode_batch

REDUCTIONS = ("none", "mean")
SINGLE_MAP = "attention"


@dataclass(frozen=True, eq=False)
class AttentionMap:
    """Attention of one decoded sentence: ``weights[t, p, s]`` is how much target token ``t``
    looked at source token ``s`` in map (panel) ``p``. ``grid`` is (rows, columns) for plotting."""

    weights: np.ndarray
    panels: tuple[str, ...]
    grid: tuple[int, int]
    source_tokens: tuple[str, ...]
    target_tokens: tuple[str, ...]
    target_ids: tuple[int, ...]
    backend: str

    def reduce(self, how: str) -> AttentionMap:
        """``"mean"`` averages every panel into one map (a summary when there are many heads)."""
        if how not in REDUCTIONS:
            raise S2SError(f"unknown reduction {how!r}; known: {', '.join(REDUCTIONS)}")
        if how == "none" or len(self.panels) == 1:
            return self
        name = f"mean of {len(self.panels)} maps"
        return replace(self, weights=self.weights.mean(axis=1, keepdims=True), panels=(name,), grid=(1, 1))


@dataclass(frozen=True, eq=False)
class AttentionComparison:
    """The same target tokens through two backends; ``max_abs_diff`` is over every panel and step."""

    reference: AttentionMap
    candidate: AttentionMap
    max_abs_diff: float


def panel_layout(shape: Sequence[int]) -> tuple[tuple[str, ...], tuple[int, int]]:
    """Panel names and plotting grid for an ``attention`` output of this shape (batch axis included)."""
    if len(shape) == 2 or (len(shape) == 3 and shape[1] == 1):
        return (SINGLE_MAP,), (1, 1)
    if len(shape) == 3:
        return tuple(f"layer {i + 1}" for i in range(shape[1])), (1, shape[1])
    if len(shape) == 4:
        layers, heads = shape[1], shape[2]
        names = tuple(f"layer {i + 1} head {j + 1}" for i in range(layers) for j in range(heads))
        return names, (layers, heads)
    raise S2SError(
        f"attention output has shape {tuple(shape)}; expected (batch, [layers, [heads,]] source)"
    )


def attention_map(
    backend: Backend, manifest: Manifest, text: str, *, max_len: int = 64, forced: Sequence[int] | None = None,
) -> AttentionMap:
    """Decode ``text`` greedily (or teacher-force ``forced``, EOS included) and keep every step's attention.

    Rows are the tokens produced (the EOS too, when reached), columns the source tokens (its EOS too).
    """
    if not text.strip():
        raise S2SError("no text to decode")
    if (len(forced) if forced is not None else max_len) < 1:
        raise S2SError("an attention map needs at least one target step")
    src, src_len = encode_batch([text], manifest.src_vocab, manifest.max_source_length)
    length = int(src_len[0])
    reorder = np.zeros(1, dtype=np.int64)
    previous = backend.decoder_start_id
    steps = len(forced) if forced is not None else max_len
    ids: list[int] = []
    rows: list[np.ndarray] = []
    shape: tuple[int, ...] = ()
    with backend.start(src, src_len, keep_attention=True) as run:
        for t in range(steps):
            log_probs = run.step(np.array([previous], dtype=np.int64), reorder)
            weights = run.attention()
            if weights is None:
                raise S2SError(f"the {backend.name} backend returned no attention weights")
            shape = weights.shape
            if shape[0] != 1 or shape[-1] != src.shape[1]:
                raise S2SError(f"attention output has shape {shape}; expected (1, ..., {src.shape[1]})")
            rows.append(weights.reshape(-1, shape[-1])[:, :length].astype(np.float64))
            previous = int(forced[t]) if forced is not None else int(log_probs[0].argmax())
            ids.append(previous)
            if forced is None and previous == backend.eos_id:
                break
    panels, grid = panel_layout(shape)
    vocab_src, vocab_tgt = manifest.src_vocab.tokens, manifest.tgt_vocab.tokens
    return AttentionMap(
        weights=np.stack(rows),
        panels=panels,
        grid=grid,
        source_tokens=tuple(vocab_src[int(i)] for i in src[0, :length]),
        target_tokens=tuple(vocab_tgt[i] for i in ids),
        target_ids=tuple(ids),
        backend=backend.name,
    )


def max_abs_diff(a: AttentionMap, b: AttentionMap) -> float:
    """Largest difference between two maps of the same target tokens (one forced through the other's)."""
    if a.target_ids != b.target_ids:
        raise S2SError(f"the {a.backend} and {b.backend} attention maps are for different target tokens")
    if a.weights.shape != b.weights.shape:
        raise S2SError(f"attention maps differ in shape: {a.weights.shape} vs {b.weights.shape}")
    return float(np.max(np.abs(a.weights - b.weights)))


def compare_attention(
    reference: Backend, candidate: Backend, manifest: Manifest, text: str, *, max_len: int = 64,
) -> AttentionComparison:
    """``candidate`` decodes greedily and ``reference`` is forced through the same tokens, so the
    maps line up step for step even where the two would pick different tokens."""
    decoded = attention_map(candidate, manifest, text, max_len=max_len)
    forced = attention_map(reference, manifest, text, forced=decoded.target_ids)
    return AttentionComparison(forced, decoded, max_abs_diff(forced, decoded))
