"""Store a weight that several graphs hold once, as ONNX external data both graphs point into.

A model with a shared vocabulary (Marian, BART, T5) ties one embedding matrix to the
encoder's input, the decoder's input and the output projection. Exported as two graphs, that
matrix is written into each: 65.5 MB twice for a 32k x 512 Marian. Here every large
initializer whose bytes appear more than once moves to one file, ``shared_weights.bin``,
and each copy becomes a reference to its offset there (standard ONNX external data, which every ONNX
Runtime binding reads). The manifest records the file's sha256 beside each graph that uses it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import external_data_helper, numpy_helper

SHARED_FILE = "shared_weights.bin"
MIN_SHARED_BYTES = 1 << 20
"""Below this a copy costs less than an extra file; the bundled models keep self-contained graphs."""
ALIGNMENT = 4096
"""Each tensor starts on a page, so a runtime may map it in place."""


def _key(tensor: onnx.TensorProto, min_bytes: int) -> tuple[int, tuple[int, ...], str] | None:
    if external_data_helper.uses_external_data(tensor):
        return None
    data = numpy_helper.to_array(tensor).tobytes()
    if len(data) < min_bytes:
        return None
    return tensor.data_type, tuple(tensor.dims), hashlib.sha256(data).hexdigest()


def share_weights(paths: Sequence[Path], min_bytes: int = MIN_SHARED_BYTES) -> dict[Path, dict[str, str]]:
    """Rewrite ``paths`` (graphs in one folder) so weights held more than once live once in
    ``SHARED_FILE`` beside them. Returns, per graph that now reads it, ``{SHARED_FILE: sha256}``;
    an empty dict when the graphs share nothing worth moving (then nothing is written)."""
    models = {path: onnx.load(str(path)) for path in paths}
    copies: dict[tuple, int] = {}
    for model in models.values():
        for tensor in model.graph.initializer:
            key = _key(tensor, min_bytes)
            if key is not None:
                copies[key] = copies.get(key, 0) + 1
    shared = {key for key, count in copies.items() if count > 1}
    if not shared:
        return {}
    folder = paths[0].parent
    offsets: dict[tuple, tuple[int, int]] = {}
    blob = folder / SHARED_FILE
    with open(blob, "wb") as out:
        for model in models.values():
            for tensor in model.graph.initializer:
                key = _key(tensor, min_bytes)
                if key not in shared:
                    continue
                data = numpy_helper.to_array(tensor).tobytes()
                if key not in offsets:
                    start = out.tell() + (-out.tell() % ALIGNMENT)
                    out.seek(start)
                    out.write(data)
                    offsets[key] = (start, len(data))
                start, length = offsets[key]
                for field in ("float_data", "int32_data", "int64_data", "double_data"):
                    tensor.ClearField(field)
                tensor.raw_data = data
                external_data_helper.set_external_data(tensor, SHARED_FILE, offset=start, length=length)
                tensor.ClearField("raw_data")
    digest = hashlib.sha256(blob.read_bytes()).hexdigest()
    readers = {}
    for path, model in models.items():
        if any(external_data_helper.uses_external_data(t) for t in model.graph.initializer):
            onnx.save(model, str(path))
            readers[path] = {SHARED_FILE: digest}
    return readers
