"""The manifest: everything a program needs to run an export, in any language.

Documented in docs/manifest.md. This module needs only the standard library, so the
torch-free runtime and other tools can read it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from s2s_deploy.errors import ManifestError, S2SError
from s2s_deploy.format.names import init_name, past_name, present_name
from s2s_deploy.format.schema import (
    all_files,
    check_graph,
    check_ids,
    check_specs,
    check_vocab_sizes,
    contained,
    read_manifest_json,
    validate_manifest,
)
from s2s_deploy.format.subword import inside
from s2s_deploy.format.vocab import FileReader, Vocabulary

FORMAT = "s2s-deploy-manifest/3"
READABLE_FORMATS = ("s2s-deploy-manifest/2", FORMAT)
"""Format 2 differs only in where special ids live (docs/manifest.md, Compatibility)."""
MANIFEST_NAME = "manifest.json"
BATCH = "batch"


@dataclass(frozen=True)
class MemoryEntry:
    name: str
    batch_axis: int
    dtype: str


@dataclass(frozen=True)
class StateEntry:
    name: str
    batch_axis: int
    init: str
    shape: tuple[int | str, ...]
    grow_axis: int | None
    dtype: str

    @property
    def decoder_input(self) -> str:
        return past_name(self.name)

    @property
    def decoder_output(self) -> str:
        return present_name(self.name)

    @property
    def encoder_output(self) -> str | None:
        return init_name(self.name) if self.init == "encoder" else None

    def zeros_shape(self, batch: int) -> tuple[int, ...]:
        return zeros_shape(self.shape, batch)


def zeros_shape(shape: tuple[int | str, ...], batch: int, grow_axis: int | None = None,
                past_len: int | None = None) -> tuple[int, ...]:
    """Shape of an ``init="zeros"`` state for ``batch`` rows; ``past_len`` sets a growing axis.
    Shared by the plugin contract and the torch-free manifest reader."""
    dims = [batch if d == BATCH else int(d) for d in shape]
    if past_len is not None and grow_axis is not None:
        dims[grow_axis] = past_len
    return tuple(dims)


@dataclass(frozen=True)
class GraphEntry:
    file: str
    sha256: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ort_file: str | None = None
    ort_sha256: str | None = None
    external_data: tuple[tuple[str, str], ...] = ()
    """(file, sha256) of each ONNX external-data file the graph reads, e.g. weights stored once for both graphs."""


@dataclass(frozen=True)
class Manifest:
    directory: Path
    raw: dict[str, Any]
    plugin: str
    plugin_version: str
    encoder: GraphEntry
    decoder: GraphEntry
    memory: tuple[MemoryEntry, ...]
    state: tuple[StateEntry, ...]
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    decoder_start_id: int
    eos_id: int
    max_source_length: int | None
    max_target_length: int | None
    has_attention_output: bool
    samples: tuple[str, ...]
    plugin_origin: str | None = None
    """``file NAME.py`` or ``distribution NAME``: what to pass or install to load ``plugin`` again."""

    def graph_path(self, graph: GraphEntry, graph_format: str = "onnx") -> Path:
        if graph_format == "ort":
            if graph.ort_file is None:
                raise ManifestError(f"{self.directory} has no .ort graphs; export with --ort-format")
            return self.directory / graph.ort_file
        return self.directory / graph.file


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def not_an_export(path: Path) -> str:
    """Why ``path`` is no export folder, and what to run instead: users pass checkpoints and graphs."""
    if not path.exists():
        return f"export folder not found: {path} (make one with `s2s-deploy export --arch NAME --out {path}`)"
    if path.suffix == ".safetensors":
        return (f"{path} is a checkpoint, not an export folder: run `s2s-deploy export --arch NAME --checkpoint "
                f"{path}` and pass the folder it writes")
    if path.suffix in (".onnx", ".ort") or path.name == MANIFEST_NAME:
        return f"{path} is one file of an export: pass its folder, {path.parent}"
    return f"{path} is a file, not an export folder (one holding {MANIFEST_NAME})"


def load_manifest(directory: str | Path, verify_hashes: bool = True) -> Manifest:
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not directory.is_dir():
        raise ManifestError(not_an_export(directory))
    if not path.is_file():
        raise ManifestError(f"no {MANIFEST_NAME} in {directory}: is it an s2s-deploy export?")
    raw = read_manifest_json(path)
    if not isinstance(raw, dict):
        raise ManifestError(f"{path} has format {type(raw).__name__!r}; expected {FORMAT!r}")
    validate_manifest(raw, path)
    for name in all_files(raw):
        contained(directory, name)
    check_ids(raw, path)
    try:
        manifest = _parse(directory, raw)
    except ManifestError:
        raise
    except S2SError as exc:
        raise ManifestError(f"{path}: {exc}") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{path} is incomplete or corrupt: {exc!r}") from exc
    graphs = []
    for graph in (manifest.encoder, manifest.decoder):
        graph_path = manifest.graph_path(graph)
        if not graph_path.is_file():
            raise ManifestError(f"{graph_path} is missing")
        if verify_hashes and sha256_of(graph_path) != graph.sha256:
            raise ManifestError(f"{graph_path} does not match the sha256 in the manifest (modified or corrupt)")
        for name, digest in graph.external_data:
            data_path = directory / name
            if Path(name).name != name or not data_path.is_file():
                raise ManifestError(f"{graph.file} reads external data {name!r}, which is not a file in {directory}")
            if verify_hashes and sha256_of(data_path) != digest:
                raise ManifestError(f"{data_path} does not match the sha256 in the manifest (modified or corrupt)")
        if graph.ort_file and verify_hashes:
            ort_path = directory / graph.ort_file
            if not ort_path.is_file() or sha256_of(ort_path) != graph.ort_sha256:
                raise ManifestError(f"{ort_path} is missing or does not match the sha256 in the manifest")
        graphs.append(check_graph(graph_path, directory, graph.inputs, graph.outputs))
    check_specs(path, raw, manifest.memory, manifest.state, manifest.encoder, manifest.decoder)
    check_vocab_sizes(raw, path, *graphs)
    return manifest


def _parse(directory: Path, raw: dict[str, Any]) -> Manifest:
    graphs = raw["graphs"]
    limits = raw.get("limits", {})
    read = _folder_reader(directory)
    src_vocab = Vocabulary.from_dict(raw["vocab"]["source"], read_file=read)
    # format 2 kept the decoder start apart from the vocabulary, whose specials sat at 0..3
    tgt_vocab = Vocabulary.from_dict(raw["vocab"]["target"], int(raw["special_tokens"]["decoder_start"]), read)
    if raw["special_tokens"] != tgt_vocab.special_ids():
        raise ValueError(f"special_tokens {raw['special_tokens']} disagree with the target vocabulary's")
    return Manifest(
        directory=directory,
        raw=raw,
        plugin=raw["plugin"]["name"],
        plugin_version=raw["plugin"]["version"],
        plugin_origin=raw["plugin"].get("origin"),
        encoder=_graph(graphs["encoder"]),
        decoder=_graph(graphs["decoder"]),
        memory=tuple(MemoryEntry(m["name"], int(m["batch_axis"]), m["dtype"]) for m in raw["memory"]),
        state=tuple(
            StateEntry(s["name"], int(s["batch_axis"]), s["init"], tuple(s["shape"]), s["grow_axis"], s["dtype"])
            for s in raw["state"]
        ),
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        decoder_start_id=tgt_vocab.decoder_start_id,
        eos_id=tgt_vocab.eos_id,
        max_source_length=limits.get("max_source_length"),
        max_target_length=limits.get("max_target_length"),
        has_attention_output=any(io["name"] == "attention" for io in graphs["decoder"]["outputs"]),
        samples=tuple(raw.get("samples", ())),
    )


def _folder_reader(directory: Path) -> FileReader:
    """Tokenizer files are read from inside the export folder only."""
    def read(name: str, sha256: str) -> bytes:
        path = inside(directory, name)
        if not path.is_file():
            raise ManifestError(f"{path} is missing")
        return path.read_bytes()

    return read


def _graph(entry: dict[str, Any]) -> GraphEntry:
    names = (tuple(io["name"] for io in entry[key]) for key in ("inputs", "outputs"))
    external = tuple((str(name), str(digest)) for name, digest in entry.get("external_data", {}).items())
    return GraphEntry(entry["file"], entry["sha256"], *names, entry.get("ort_file"), entry.get("ort_sha256"), external)


def manifest_text(raw: dict[str, Any]) -> str:
    """Indented for reading, except each vocabulary's token list, kept on one line: one token a
    line would make a 32k-token manifest twice its size."""
    vocab = raw.get("vocab", {})
    marks = {side: f"\0tokens of {side}\0" for side in vocab if isinstance(vocab[side].get("tokens"), list)}
    folded = {**raw, "vocab": {side: {**entry, "tokens": marks[side]} if side in marks else entry
                               for side, entry in vocab.items()}} if marks else raw
    text = json.dumps(folded, indent=2, ensure_ascii=False)
    for side, mark in marks.items():
        text = text.replace(json.dumps(mark), json.dumps(vocab[side]["tokens"], ensure_ascii=False), 1)
    return text + "\n"


def write_manifest(directory: Path, raw: dict[str, Any]) -> Path:
    path = directory / MANIFEST_NAME
    path.write_text(manifest_text(raw), encoding="utf-8")
    return path
