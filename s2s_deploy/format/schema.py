"""The shape a manifest may have, checked before anything reads it: an export folder is untrusted input.

One JSON Schema (``SCHEMA``) validated with ``jsonschema``: types, bounds and required keys, and a
bounded read. Nothing here reads a key: the typed manifest (``format/manifest.py``) parses the
document, and the checks a schema cannot say (paths inside the folder, special ids, roles and
vocabularies against the graphs) run on its typed fields; ``check_graph`` reads a graph for them.
``tests/test_manifest.py`` holds the schema to what the manifest writes. Known keys are strict;
unknown keys are allowed at the top level and in ``search`` so that newer writers stay readable.
To add a key, add it to ``PROPERTIES`` (a decoding default: a row of format/decoding.py) and to
the manifest's parsing; a new format version goes in ``FORMATS`` (the format id is defined here only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from s2s_deploy.errors import ManifestError
from s2s_deploy.format.decoding import search_schema
from s2s_deploy.format.files import inside
from s2s_deploy.format.specs import DTYPES

FORMAT = "s2s-deploy-manifest/8"
FORMATS = ("s2s-deploy-manifest/2", "s2s-deploy-manifest/3", "s2s-deploy-manifest/4", "s2s-deploy-manifest/5",
           "s2s-deploy-manifest/6", "s2s-deploy-manifest/7", FORMAT)
"""Formats this code reads, the one it writes last (docs/manifest.md, Compatibility)."""
ALPHA_KEY_FORMATS = FORMATS[:5]
"""Formats 2 to 6 require the length penalty as ``search.length_penalty_alpha``, which format 7 names
``alpha``, as the option table does; the older key is still read as ``alpha``'s alias."""
PRE_MOSES_FORMATS = FORMATS[:6]
"""Formats 2 to 7 know neither the ``moses`` vocabulary level nor a vocabulary's ``upper_case``, which
format 8 added: a reader of those would misread such a vocabulary, so an older format may not hold them."""
MAX_MANIFEST_BYTES = 64 << 20  # a vocabulary of a million tokens fits; a crafted 1 GB file does not
MAX_DEPTH = 32
MAX_VOCAB = 10_000_000
ROLES = ("source_tokens", "source_features", "source_lengths", "memory", "state_init", "previous_tokens",
         "step_index", "beam_reorder", "state_in", "state_out", "log_probs", "cross_attention", "top_k",
         "top_log_probs", "top_ids", "cache_rollback")

_NAME = {"type": "string", "minLength": 1, "maxLength": 256}
_ID = {"type": "integer", "minimum": 0, "maximum": MAX_VOCAB}
_AXIS = {"type": "integer", "minimum": 0, "maximum": 16}
_DIM = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "minLength": 1, "maxLength": 64}]}
_FILE = {"type": "string", "minLength": 1, "maxLength": 4096}
_SHA = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_IO = {
    "type": "object", "required": ["name", "role"],
    "properties": {"name": _NAME, "role": {"enum": list(ROLES)}, "dtype": {"type": "string"},
                   "shape": {"type": "array", "maxItems": 16, "items": _DIM}},
}
_GRAPH = {
    "type": "object", "required": ["file", "sha256", "inputs", "outputs"],
    "properties": {"file": _FILE, "sha256": _SHA, "ort_file": _FILE, "ort_sha256": _SHA,
                   "external_data": {"type": "object", "maxProperties": 4096, "additionalProperties": _SHA},
                   "inputs": {"type": "array", "minItems": 1, "maxItems": 4096, "items": _IO},
                   "outputs": {"type": "array", "minItems": 1, "maxItems": 4096, "items": _IO}},
}
_GENERATE_IO = {"type": "object", "required": ["name", "role"], "properties": {**_IO["properties"], "role": _NAME}}
_ID_OR_NULL = {"anyOf": [_ID, {"type": "null"}]}
_IDS = {"type": "array", "maxItems": 4096, "items": _ID}
_VOCAB = {
    "type": "object", "required": ["tokens"],
    "properties": {"level": {"enum": ["char", "word", "sentencepiece", "hf", "moses"]},
                   "tokens": {"type": "array", "minItems": 5, "maxItems": MAX_VOCAB, "items": {"type": "string"}},
                   "special": {"type": "object", "required": ["pad", "eos"],
                               "properties": {"pad": _ID, "bos": _ID_OR_NULL, "eos": _ID, "unk": _ID_OR_NULL,
                                              "decoder_start": _ID_OR_NULL}},
                   "prefix": _IDS, "suffix": _IDS, "hidden": _IDS, "languages": _IDS, "tasks": _IDS,
                   "upper_case": {"type": "boolean"},
                   "tokenizer": {"type": "object", "required": ["file", "sha256"],
                                 "properties": {"file": _FILE, "sha256": _SHA}}},
}
_PRE_MOSES_VOCAB = {"properties": {"level": {"not": {"const": "moses"}}, "upper_case": False}}
_LIMIT = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 1 << 20}, {"type": "null"}]}
_DTYPE = {"enum": list(DTYPES)}
_NUMBER_OR_NULL = {"anyOf": [{"type": "number"}, {"type": "null"}]}
PROPERTIES: dict[str, Any] = {
    "format": {"enum": list(FORMATS)},
    "plugin": {"type": "object", "required": ["name", "version"],
               "properties": {"name": _NAME, "version": {"type": "string", "maxLength": 64},
                              "description": {"type": "string"},
                              "origin": {"type": ["string", "null"], "maxLength": 300}}},
    "exporter": {"type": "string"},
    "opset": {"type": "integer", "minimum": 1, "maximum": 1000},
    "graphs": {"type": "object", "required": ["encoder", "decoder"],
               "properties": {"encoder": _GRAPH, "decoder": _GRAPH, "decoder_multi": _GRAPH},
               "additionalProperties": {"type": "object", "required": ["file", "sha256"], "properties": {
                   "file": _FILE, "sha256": _SHA, "search": {"enum": ["beam", "greedy"]},
                   "options": {"type": "array", "items": {"type": "string"}},
                   "inputs": {"type": "array", "maxItems": 64, "items": _GENERATE_IO},
                   "outputs": {"type": "array", "maxItems": 64, "items": _GENERATE_IO}}}},
    "memory": {"type": "array", "maxItems": 4096, "items": {
        "type": "object", "required": ["name", "batch_axis", "dtype"],
        "properties": {"name": _NAME, "batch_axis": _AXIS, "dtype": _DTYPE, "description": {"type": "string"}}}},
    "state": {"type": "array", "maxItems": 4096, "items": {
        "type": "object", "required": ["name", "batch_axis", "init", "shape", "grow_axis", "dtype"],
        "properties": {"name": _NAME, "batch_axis": _AXIS, "init": {"enum": ["encoder", "zeros"]},
                       "shape": {"type": "array", "maxItems": 16, "items": _DIM},
                       "grow_axis": {"anyOf": [_AXIS, {"type": "null"}]}, "dtype": _DTYPE,
                       "description": {"type": "string"}}}},
    "special_tokens": {"type": "object", "required": ["eos", "decoder_start"],
                       "additionalProperties": {"anyOf": [_ID, {"type": "null"}]}},  # bos and unk may be absent
    "vocab": {"type": "object", "required": ["source", "target"],
              "properties": {"source": _VOCAB, "target": _VOCAB}},
    "limits": {"type": "object", "properties": {"max_source_length": _LIMIT, "max_target_length": _LIMIT}},
    "search": {"type": "object", "properties": search_schema()},
    "checkpoint": {"type": "object", "required": ["file", "sha256"],
                   "properties": {"file": _FILE, "sha256": _SHA, "included": {"type": "boolean"}}},
    "quantization": {"type": "object", "required": ["kind"],
                     "properties": {"kind": {"enum": ["int8", "fp16", "int4"]}, "source": {"type": "string"},
                                    "activations": {"enum": ["per-row", "per-tensor"]},
                                    "block_size": {"enum": [16, 32, 64, 128]},
                                    "accuracy_level": {"enum": [0, 1, 2, 3, 4]}}},
    "validation": {"type": "object", "properties": {
        "atol": _NUMBER_OR_NULL, "rtol": _NUMBER_OR_NULL, "min_token_agreement": _NUMBER_OR_NULL,
        "forward_step_max_abs_diff": _NUMBER_OR_NULL, "multi_step_max_abs_diff": _NUMBER_OR_NULL,
        "max_abs_diff": {"type": "object", "additionalProperties": {"type": "number"}},
        "fp32_max_abs_diff": {"type": "object", "additionalProperties": {"type": "number"}}}},
    "training": {"type": "object"},
    "config": {"type": "object"},
    "source": {"type": "string"},
    "ort_optimized": {"type": "boolean"},
    "memory_per_sentence": {"type": "boolean"},
    "alignment_heads": {"type": "array", "maxItems": 4096,
                        "items": {"type": "array", "minItems": 2, "maxItems": 2,
                                  "items": {"type": "integer", "minimum": 0, "maximum": 65535}}},
    "encoder_input": {"type": "object", "required": ["kind"],
                      "properties": {"kind": {"enum": ["tokens", "features"]}, "dtype": _DTYPE,
                                     "shape": {"type": "array", "maxItems": 16, "items": _DIM},
                                     "pad_value": {"type": "number"}, "frontend": {"type": "object"}}},
    "samples": {"type": "array", "maxItems": 100_000, "items": {"type": "string", "maxLength": 100_000}},
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["format", "plugin", "graphs", "memory", "state", "special_tokens", "vocab", "search"],
    "properties": PROPERTIES,
    "allOf": [
        {"if": {"properties": {"format": {"enum": list(ALPHA_KEY_FORMATS)}}},
         "then": {"properties": {"search": {"required": ["length_penalty_alpha"]}}},
         "else": {"properties": {"search": {"required": ["alpha"]}}}},
        {"if": {"properties": {"format": {"enum": list(PRE_MOSES_FORMATS)}}},
         "then": {"properties": {"vocab": {"properties": {"source": _PRE_MOSES_VOCAB,
                                                          "target": _PRE_MOSES_VOCAB}}}}},
    ],
}


def read_manifest_json(path: Path) -> dict[str, Any]:
    """Bounded read and parse: size first, then nesting, so a crafted file costs neither memory nor a RecursionError."""
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{path} is {size:,} bytes, over the {MAX_MANIFEST_BYTES:,} a manifest may have")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path} is not valid UTF-8 (byte {exc.start})") from exc
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        raw = json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise ManifestError(f"{path} is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ManifestError(f"{path} nests too deep for a manifest (over {MAX_DEPTH} levels)") from exc
    deepest = _depth(raw)
    if deepest > MAX_DEPTH:
        raise ManifestError(f"{path} nests {deepest} levels deep, over the {MAX_DEPTH} a manifest may have")
    return raw


def _depth(root: Any) -> int:
    """Nesting depth, without recursion."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def validate_manifest(raw: Any, path: Path) -> None:
    """Schema check; the message names the first offending key as a dotted path."""
    import jsonschema

    if isinstance(raw, dict) and raw.get("format") not in FORMATS:
        found = raw.get("format")
        raise ManifestError(f"{path} has format {found!r}; expected {FORMATS[0]!r}")
    validator = jsonschema.Draft202012Validator(SCHEMA)
    error = jsonschema.exceptions.best_match(validator.iter_errors(raw))
    if error is not None:
        where = ".".join(str(part) for part in error.absolute_path) or "(top level)"
        message = error.message if len(error.message) < 200 else error.message[:200] + "..."
        raise ManifestError(f"{path} is incomplete or corrupt: key {where}: {message}")


def check_graph(path: Path, directory: Path, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> Any:
    """Parse a graph without its external data; every external-data location must stay in the folder,
    and the manifest's input/output names must be the graph's. Returns the ModelProto."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises its own DecodeError, and onnx wraps others
        raise ManifestError(f"{path} is not a readable ONNX graph: {str(exc).splitlines()[0] if str(exc) else exc}") \
            from exc
    graph = model.graph
    for tensor in [*graph.initializer, *(a.t for n in graph.node for a in n.attribute if a.HasField("t"))]:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            if not location or os.path.isabs(location):
                raise ManifestError(f"{path}: tensor {tensor.name!r} names external data {location!r} outside "
                                    "the export folder; refused")
            inside(path.parent, location, ManifestError, "external data")
    names_in = {i.name for i in graph.input}
    names_out = {o.name for o in graph.output}
    missing = [n for n in inputs if n not in names_in] + [n for n in outputs if n not in names_out]
    if missing:
        raise ManifestError(f"{path} has no input/output {missing[0]!r} that the manifest lists for it "
                            f"(graph swapped or manifest edited?)")
    defaults = {t.name for t in graph.initializer}
    unlisted = sorted(names_in - set(inputs) - defaults)
    if unlisted:
        raise ManifestError(f"{path} needs input {unlisted[0]!r}, which the manifest does not list")
    return model


def graph_dim(graph: Any, name: str, axis: int, kind: str = "output") -> int | None:
    """A static dimension of a named graph input or output, or None when it is symbolic or absent."""
    for value in getattr(graph, kind):
        if value.name == name:
            dims = value.type.tensor_type.shape.dim
            if axis < len(dims) and dims[axis].HasField("dim_value"):
                return dims[axis].dim_value
    return None
