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

from s2s_deploy.runtime.errors import ManifestError
from s2s_deploy.runtime.names import init_name, past_name, present_name
from s2s_deploy.runtime.vocab import Vocabulary

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


def load_manifest(directory: str | Path, verify_hashes: bool = True) -> Manifest:
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not directory.is_dir():
        raise ManifestError(f"export folder not found: {directory}")
    if not path.is_file():
        raise ManifestError(f"no {MANIFEST_NAME} in {directory}: is it an s2s-deploy export?")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") not in READABLE_FORMATS:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ManifestError(f"{path} has format {found!r}; expected {' or '.join(map(repr, READABLE_FORMATS))}")
    try:
        manifest = _parse(directory, raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{path} is incomplete or corrupt: {exc!r}") from exc
    for graph in (manifest.encoder, manifest.decoder):
        graph_path = manifest.graph_path(graph)
        if not graph_path.is_file():
            raise ManifestError(f"{graph_path} is missing")
        if verify_hashes and sha256_of(graph_path) != graph.sha256:
            raise ManifestError(f"{graph_path} does not match the sha256 in the manifest (modified or corrupt)")
        if graph.ort_file and verify_hashes:
            ort_path = directory / graph.ort_file
            if not ort_path.is_file() or sha256_of(ort_path) != graph.ort_sha256:
                raise ManifestError(f"{ort_path} is missing or does not match the sha256 in the manifest")
    return manifest


def _parse(directory: Path, raw: dict[str, Any]) -> Manifest:
    graphs = raw["graphs"]
    limits = raw.get("limits", {})
    src_vocab = Vocabulary.from_dict(raw["vocab"]["source"])
    # format 2 kept the decoder start apart from the vocabulary, whose specials sat at 0..3
    tgt_vocab = Vocabulary.from_dict(raw["vocab"]["target"], int(raw["special_tokens"]["decoder_start"]))
    if raw["special_tokens"] != tgt_vocab.special_ids():
        raise ValueError(f"special_tokens {raw['special_tokens']} disagree with the target vocabulary's")
    return Manifest(
        directory=directory,
        raw=raw,
        plugin=raw["plugin"]["name"],
        plugin_version=raw["plugin"]["version"],
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


def _graph(entry: dict[str, Any]) -> GraphEntry:
    names = (tuple(io["name"] for io in entry[key]) for key in ("inputs", "outputs"))
    return GraphEntry(entry["file"], entry["sha256"], *names, entry.get("ort_file"), entry.get("ort_sha256"))


def write_manifest(directory: Path, raw: dict[str, Any]) -> Path:
    path = directory / MANIFEST_NAME
    path.write_text(json.dumps(raw, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
