"""Store a weight that several graphs hold once, as ONNX external data both graphs point into.

A model with a shared vocabulary (Marian, BART, T5) ties one embedding matrix to the
encoder's input, the decoder's input and the output projection. Exported as two graphs, that
matrix is written into each: 65.5 MB twice for a 32k x 512 Marian. Here every large
initializer whose bytes appear more than once moves to one file, ``shared_weights.bin``,
and each copy becomes a reference to its offset there (standard ONNX external data, which every ONNX
Runtime binding reads). The manifest records the file's sha256 beside each graph that uses it.

A graph past protobuf's 2 GB (an NLLB-sized decoder without a tied embedding to move out) cannot be
one file: ``save_graph`` then writes its own weights to ``<graph>.data``, listed and hashed the same
way, and removes the external files the graph read before it was rewritten, so no stale copy stays
in the folder (nor gets appended to: ONNX appends to an existing data file).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import external_data_helper, numpy_helper

from s2s_deploy.format.files import sha256_of

SHARED_FILE = "shared_weights.bin"
MIN_SHARED_BYTES = 1 << 20
"""Below this a copy costs less than an extra file; the bundled models keep self-contained graphs."""
ALIGNMENT = 4096
"""Each tensor starts on a page, so a runtime may map it in place."""
ONE_FILE_LIMIT = (1 << 31) - (1 << 24)
"""The largest graph written as one file: protobuf refuses messages of 2 GiB; 16 MiB to spare."""
OWN_DATA_MIN_BYTES = 1024
"""In ``<graph>.data``, tensors of at least this size; smaller ones stay in the graph."""


def _locations(model: onnx.ModelProto) -> set[str]:
    return {entry.value for tensor in model.graph.initializer if external_data_helper.uses_external_data(tensor)
            for entry in tensor.external_data if entry.key == "location"}


def external_files(path: Path) -> set[str]:
    """The external data files the graph at ``path`` reads, without reading them."""
    return _locations(onnx.load(str(path), load_external_data=False))


def load_graph(path: Path) -> tuple[onnx.ModelProto, set[str]]:
    """The graph with every weight in memory, and the external files it read (which ``save_graph``
    replaces)."""
    model = onnx.load(str(path), load_external_data=False)
    files = _locations(model)
    external_data_helper.load_external_data_for_model(model, str(path.parent))
    return model, files


def save_graph(model: onnx.ModelProto, path: Path, replaced: set[str] = frozenset()) -> dict[str, str]:
    """Write ``model`` to ``path``, in one file when it fits, else with its own weights in
    ``<name>.data``; returns that file and its sha256 (empty: one file). The files in ``replaced``
    (what the graph read before) are removed first, but ``SHARED_FILE``, which the caller writes."""
    for name in replaced - {SHARED_FILE}:
        (path.parent / name).unlink(missing_ok=True)
    if model.ByteSize() <= ONE_FILE_LIMIT:
        onnx.save(model, str(path))
        return {}
    own = f"{path.name}.data"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=own,
              size_threshold=OWN_DATA_MIN_BYTES)
    return {own: sha256_of(path.parent / own)}


def _key(tensor: onnx.TensorProto, min_bytes: int) -> tuple[int, tuple[int, ...], str] | None:
    if external_data_helper.uses_external_data(tensor):
        return None
    data = numpy_helper.to_array(tensor).tobytes()
    if len(data) < min_bytes:
        return None
    return tensor.data_type, tuple(tensor.dims), hashlib.sha256(data).hexdigest()


def share_weights(paths: Sequence[Path], min_bytes: int = MIN_SHARED_BYTES) -> dict[Path, dict[str, str]]:
    """Rewrite ``paths`` (graphs in one folder) so weights held more than once live once in
    ``SHARED_FILE`` beside them. Returns, per graph that reads external data, ``{file: sha256}``
    (``SHARED_FILE`` and, past 2 GB, its own ``<name>.data``); an empty dict when the graphs share
    nothing worth moving and each is one file (then nothing is written)."""
    loaded = {path: load_graph(path) for path in paths}
    models = {path: model for path, (model, _) in loaded.items()}
    copies: dict[tuple, int] = {}
    for model in models.values():
        for tensor in model.graph.initializer:
            key = _key(tensor, min_bytes)
            if key is not None:
                copies[key] = copies.get(key, 0) + 1
    shared = {key for key, count in copies.items() if count > 1}
    if not shared and not any(files for _, files in loaded.values()):
        return {}
    folder = paths[0].parent
    offsets: dict[tuple, tuple[int, int]] = {}
    blob = folder / SHARED_FILE
    if shared:
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
    digest = sha256_of(blob) if shared else ""
    readers = {}
    for path, (model, before) in loaded.items():
        reads_shared = any(entry.key == "location" and entry.value == SHARED_FILE
                           for tensor in model.graph.initializer for entry in tensor.external_data)
        files = save_graph(model, path, before)
        if reads_shared:
            files[SHARED_FILE] = digest
        if files:
            readers[path] = files
    return readers
