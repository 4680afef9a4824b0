"""What the encoder reads: token ids (text models) or float features from a front end (speech, images).

One definition for the plugin contract, the manifest's ``encoder_input`` block and the runtime.
The graph input is always ``src`` with ``src_len``; this spec says what ``src`` holds:

- ``tokens``: ``src`` is int64 ``(batch, S)`` source ids, right-padded with the source vocabulary's
  pad id; ``src_len`` counts each row's ids.
- ``features``: ``src`` is ``(batch, *shape)`` of ``dtype``, where ``shape`` holds at most one
  ``"frames"`` axis (the time axis, right-padded with ``pad_value``) and the fixed sizes; ``src_len``
  counts each row's frames. A shape without ``"frames"`` (an image resized to the model's size) is
  one fixed-size item per row, never padded, and ``src_len`` is 1 for every row. ``frontend`` is
  the JSON of the front end (``s2s_deploy.frontends``) that turns audio or an image into one item;
  a runtime in any language recomputes it from docs/manifest.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from s2s_deploy.errors import S2SError

TOKENS = "tokens"
FEATURES = "features"
FRAMES = "frames"
FEATURE_DTYPES = ("float32", "float16")
MAX_FEATURE_RANK = 4


@dataclass(frozen=True)
class SourceSpec:
    """The encoder's ``src``; the default is token ids, so a plugin that declares nothing is a text model."""

    kind: Literal["tokens", "features"] = TOKENS
    shape: tuple[int | str, ...] = ()
    """Features only: one item's shape without the batch axis, e.g. ``(80, "frames")``."""
    dtype: str = "int64"
    pad_value: float = 0.0
    """Features only: what fills a row's frames past its length when a batch is padded."""
    frontend: Mapping[str, Any] | None = field(default=None, hash=False)
    """Features only: the front end's JSON (``kind`` and its parameters)."""

    @property
    def is_features(self) -> bool:
        return self.kind == FEATURES

    @property
    def length_axis(self) -> int | None:
        """The frames axis of ``src`` counted with the batch axis first; None for fixed-size items."""
        if not self.is_features:
            return 1
        return 1 + self.shape.index(FRAMES) if FRAMES in self.shape else None

    def check(self) -> None:
        """One-line S2SError for a spec no runtime could feed."""
        if self.kind == TOKENS:
            if self.shape or self.dtype != "int64" or self.frontend is not None:
                raise S2SError("a tokens source has no shape or front end, and dtype int64")
            return
        if self.kind != FEATURES:
            raise S2SError(f"source kind {self.kind!r} is not one of {TOKENS}, {FEATURES}")
        if self.dtype not in FEATURE_DTYPES:
            raise S2SError(f"features dtype {self.dtype!r} is not one of {', '.join(FEATURE_DTYPES)}")
        if not 1 <= len(self.shape) <= MAX_FEATURE_RANK or list(self.shape).count(FRAMES) > 1:
            raise S2SError(f"features shape {list(self.shape)} needs at most one {FRAMES!r} axis and 1 to "
                           f"{MAX_FEATURE_RANK} axes")
        sizes = [d for d in self.shape if d != FRAMES]
        if not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= 1 << 16 for d in sizes):
            raise S2SError(f"features shape {list(self.shape)}: every axis but {FRAMES!r} is a size in 1..65536")
        if isinstance(self.pad_value, bool) or not isinstance(self.pad_value, int | float) or \
                self.pad_value != self.pad_value or abs(self.pad_value) == float("inf"):
            raise S2SError(f"features pad_value {self.pad_value!r} must be a finite number")
        if not isinstance(self.frontend, Mapping) or not isinstance(self.frontend.get("kind"), str):
            raise S2SError("a features source needs its front end: a JSON object with a 'kind'")

    def to_json(self) -> dict[str, Any]:
        if self.kind == TOKENS:
            return {"kind": TOKENS, "dtype": "int64"}
        return {"kind": FEATURES, "dtype": self.dtype, "shape": list(self.shape), "pad_value": self.pad_value,
                "frontend": json.loads(json.dumps(self.frontend))}

    @classmethod
    def from_json(cls, data: Any) -> SourceSpec:
        """The spec a manifest's ``encoder_input`` holds; anything malformed is one S2SError line."""
        if not isinstance(data, Mapping):
            raise S2SError(f"encoder_input must be an object, not {type(data).__name__}")
        known = {"kind", "dtype", "shape", "pad_value", "frontend"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise S2SError(f"encoder_input: unknown key {unknown[0]!r}")
        shape = data.get("shape", [])
        if not isinstance(shape, list):
            raise S2SError("encoder_input.shape must be a list")
        kind = data.get("kind", TOKENS)
        spec = cls(kind=kind, shape=tuple(shape), dtype=data.get("dtype", "int64" if kind == TOKENS else "float32"),
                   pad_value=data.get("pad_value", 0.0), frontend=data.get("frontend"))
        spec.check()
        return spec

    def item_shape(self, frames: int) -> tuple[int, ...]:
        """One item's shape for ``frames`` frames (a fixed-size item's shape whatever ``frames``)."""
        return tuple(frames if d == FRAMES else int(d) for d in self.shape)


TOKEN_SOURCE = SourceSpec()
