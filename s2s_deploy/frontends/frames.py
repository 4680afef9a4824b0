"""A long input's features made as the decoder reads them, so memory holds a window, not the clip.

The seek loop (runtime/timestamps.py) reads an input window by window, each window starting at or
after the last one's start. ``StreamedFeatures`` answers ``features[..., start:stop]`` from pieces of
frames pulled from the front end as they are needed, and forgets every frame before ``start``: what
it holds is one window and one piece, whatever the input's length. Asking for a frame it has
forgotten starts the pieces again from the input's start (a second decode of the same input).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np


class StreamedFeatures:
    """Features of ``shape`` (frames last, their count known from a first pass) made piece by piece
    by ``pieces()``, each piece ``(*shape[:-1], frames)`` in order; indexed as ``[..., start:stop]``."""

    def __init__(self, pieces: Callable[[], Iterator[np.ndarray]], shape: tuple[int, ...],
                 dtype: np.dtype | type = np.float32) -> None:
        self.pieces, self.shape, self.dtype = pieces, tuple(shape), np.dtype(dtype)
        self._lowest: np.ndarray | None = None
        self._restart()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _restart(self) -> None:
        self._source: Iterator[np.ndarray] = self.pieces()
        self._held = np.zeros((*self.shape[:-1], 0), dtype=self.dtype)
        self._base = 0  # the input's frame at ``_held[..., 0]``

    def min(self) -> np.ndarray:
        """The lowest value, as ``ndarray.min()`` gives it: one pass over the pieces, then kept (a window
        cut at a pause is padded with it, runtime/timestamps.py)."""
        if self._lowest is None:
            self._lowest = min((piece.min() for piece in self.pieces() if piece.size), default=np.float32(0))
            self._lowest = np.asarray(self._lowest, dtype=self.dtype)
        return self._lowest

    def astype(self, dtype: np.dtype | type) -> StreamedFeatures:
        """The same features as ``dtype``, each piece cast as it is made."""
        if np.dtype(dtype) == self.dtype:
            return self
        pieces = self.pieces
        return StreamedFeatures(lambda: (piece.astype(dtype) for piece in pieces()), self.shape, dtype)

    def __getitem__(self, key: tuple[object, slice]) -> np.ndarray:
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] is Ellipsis and isinstance(key[1], slice)
                and key[1].step in (None, 1)):
            raise TypeError("streamed features are read as features[..., start:stop]")
        start, stop, _ = key[1].indices(self.shape[-1])
        if start < self._base:
            self._restart()
        self._forget(start)
        while self._base + self._held.shape[-1] < stop:
            piece = next(self._source, None)
            if piece is None:
                break
            self._held = np.concatenate([self._held, np.asarray(piece, dtype=self.dtype)], axis=-1)
            self._forget(start)  # pieces wholly before ``start`` pass through
        return np.ascontiguousarray(self._held[..., : max(0, stop - start)])

    def _forget(self, start: int) -> None:
        """Drop the held frames before ``start``."""
        drop = min(start - self._base, self._held.shape[-1])
        self._held, self._base = self._held[..., drop:], self._base + drop
