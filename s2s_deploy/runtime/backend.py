"""The interface the search code decodes through. Implementations: ONNX Runtime and PyTorch."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np


class DecodeRun(ABC):
    """One batch being decoded: memory tiled per hypothesis, state kept in the backend's own
    tensors between steps, so nothing large crosses into numpy on the per-token path.

    The arrays a step returns may be reused by the next step: copy what must outlive it.
    Used as a context manager, a run gives its buffers back to the backend when it ends, so
    the next batch of the same size starts without allocating or binding them again."""

    def __enter__(self) -> DecodeRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None:
        """End the run: its buffers may serve the next one, so it must not step again."""

    @abstractmethod
    def step(self, tokens: np.ndarray, reorder: np.ndarray) -> np.ndarray:
        """Feed ``tokens`` (rows,) after gathering state rows by ``reorder``; return log-probs (rows, V)."""

    @abstractmethod
    def step_top(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Like ``step``, but return only each row's ``k`` best log-probs and token ids (rows, k),
        best first, ties to the lower id: all a search needs, without the vocabulary-wide copy."""

    def attention(self) -> np.ndarray | None:
        """Cross-attention of the last step, when the backend was asked to keep it."""
        return None

    def steps_top(self, tokens: np.ndarray, rollback: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Feed ``tokens`` (rows, positions) at once, after dropping the last ``rollback``
        positions of the state (drafted tokens a speculative search rejected); return each
        position's ``k`` best log-probs and ids (rows, positions, k). Only on a backend whose
        ``multi_step`` is True, and only in a run that takes no one-position step."""
        raise NotImplementedError(f"{type(self).__name__} has no k-position step")

    def steps_log_probs(self, tokens: np.ndarray, rollback: int) -> np.ndarray:
        """Like ``steps_top``, but return every position's log-probs (rows, positions, V): what
        speculative greedy edits, position by position, where an option edits log-probs."""
        raise NotImplementedError(f"{type(self).__name__} has no k-position step")


class Backend(ABC):
    """``runtime_seconds`` accumulates the time spent inside the runtime's own calls, so a
    benchmark can tell the engine's Python overhead apart from the model's compute. A backend
    that can also tell its decoder steps apart counts them in ``step_seconds`` and ``steps_run``
    (a part of ``runtime_seconds``), which ``bench --roofline`` holds against a step's bound."""

    name: str
    decoder_start_id: int
    eos_id: int
    vocab_size: int
    runtime_seconds: float = 0.0
    step_seconds: float = 0.0
    steps_run: int = 0
    unk_id: int | None = None
    """The target vocabulary's unknown token, for ``disable_unk``."""
    multi_step: bool = False
    """Whether runs take ``steps_top`` (the export holds the k-position decoder step)."""
    multi_step_drift: float | None = None
    """The largest log-prob difference between the k-position step and single steps, as export measured it."""
    source_in_target: np.ndarray | None = None
    """Each source id's target id where both vocabularies hold the same token, else -1: speculative
    greedy drafts from the source through it. None: not known."""
    language_ids: tuple[int, ...] = ()
    """The target vocabulary's ``languages``, ascending: a decoder prompt's open slot picks among them."""

    @abstractmethod
    def start(self, src: np.ndarray, src_len: np.ndarray, expand: int = 1, keep_attention: bool = False) -> DecodeRun:
        """Encode a batch and repeat every sentence ``expand`` times (once per beam).

        The first step may instead be fed one row per sentence (reorder ``arange(batch)``): it
        runs on the untiled memory, and the next step's reorder, ``expand`` rows per sentence,
        gathers from its rows. Beam search starts so, since its K beams would start identical."""

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name}
