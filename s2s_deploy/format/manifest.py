"""The manifest: everything a program needs to run an export, in any language.

One typed document, and the only code that knows the JSON's keys: built from plain facts at
export, validated (``format/schema.py``), read, evolved by the transforms (``with_graph``,
``with_quantization``, ``with_dtypes``, ``with_generate``...) and written atomically. Loading
re-hashes every file the manifest lists and holds its numbers (dtypes, shapes, batch and growing
axes, position limits) against the graphs' own declarations before any session is made, so a
tampered folder is one line naming the key. Documented in docs/manifest.md. Needs no torch:
the standard library, jsonschema and onnx (graphs read without their weights).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from s2s_deploy.errors import ManifestError, S2SError
from s2s_deploy.format.decoding import BY_NAME
from s2s_deploy.format.files import MANIFEST_NAME, inside, sha256_of, write_atomically
from s2s_deploy.format.schema import FORMAT, FORMATS, check_graph, graph_dim, read_manifest_json, validate_manifest
from s2s_deploy.format.source import TOKEN_SOURCE, SourceSpec
from s2s_deploy.format.specs import BATCH, DTYPES, MemorySpec, StateSpec, zeros_shape
from s2s_deploy.format.vocab import FileReader, Vocabulary

READABLE_FORMATS = FORMATS
"""Format 2 differs only in where special ids live (docs/manifest.md, Compatibility)."""
LIMITS_FACT = "s2s_deploy.limits"
"""Graph metadata key: the position limits a graph was exported with (the size of its position tables)."""
LIMIT_KEYS = ("max_source_length", "max_target_length")

__all__ = ["BATCH", "FORMAT", "MANIFEST_NAME", "READABLE_FORMATS", "sha256_of", "zeros_shape"]


@dataclass(frozen=True)
class IOEntry:
    """One input or output of a graph as the manifest lists it; ``shape`` holds ints and axis names."""

    name: str
    role: str
    dtype: str | None = None
    shape: tuple[int | str, ...] | None = None

    def entry(self) -> dict[str, Any]:
        found: dict[str, Any] = {"name": self.name, "role": self.role}
        if self.dtype is not None:
            found["dtype"] = self.dtype
        if self.shape is not None:
            found["shape"] = list(self.shape)
        return found


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
    input_io: tuple[IOEntry, ...] = field(default=(), repr=False)
    output_io: tuple[IOEntry, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class GenerateEntry:
    """``generate.onnx``, written by ``s2s-deploy fuse``: beam or greedy search, and the options it carries."""

    file: str
    sha256: str
    beam: bool
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckpointEntry:
    """The PyTorch checkpoint an export was made from; ``included``: copied into the folder."""

    file: str
    sha256: str
    included: bool = True


@dataclass(frozen=True)
class Quantization:
    kind: str
    source: str | None = None
    activations: str | None = None
    block_size: int | None = None  # int4: weights per block, each with its own scale
    accuracy_level: int | None = None  # int4: MatMulNBits' accuracy_level

    @property
    def per_tensor(self) -> bool:
        """Activation scales shared by the whole batch: output may depend on batchmates (by choice)."""
        return self.activations == "per-tensor"


@dataclass(frozen=True)
class Validation:
    """What the export measured: informative only (parity takes its tolerance from the plugin)."""

    atol: float | None = None
    rtol: float | None = None
    min_token_agreement: float | None = None
    max_abs_diff: Mapping[str, float] = field(default_factory=dict)


class SearchDefaults(Mapping[str, Any]):
    """The export's own decoding defaults (the ``search`` block): read-only, typed by the schema
    from format/decoding.py's table (runtime/decoding.py resolves them); unknown names a newer writer
    added are kept."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = MappingProxyType(copy.deepcopy(dict(values)))

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"SearchDefaults({dict(self._values)!r})"


@dataclass(frozen=True)
class Manifest:
    """A read export folder: typed fields for every reader; ``with_*`` return evolved copies."""

    directory: Path
    plugin: str
    plugin_version: str
    encoder: GraphEntry
    decoder: GraphEntry
    memory: tuple[MemorySpec, ...]
    state: tuple[StateSpec, ...]
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    decoder_start_id: int
    eos_id: int
    max_source_length: int | None
    max_target_length: int | None
    has_attention_output: bool
    samples: tuple[str, ...]
    search: SearchDefaults
    plugin_description: str = ""
    plugin_origin: str | None = None
    """``file NAME.py`` or ``distribution NAME``: what to pass or install to load ``plugin`` again."""
    format: str = FORMAT
    generate: GenerateEntry | None = None
    checkpoint: CheckpointEntry | None = None
    quantization: Quantization | None = None
    validation: Validation = Validation()
    training: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    exporter: str = ""
    opset: int | None = None
    ort_optimized: bool = False
    memory_per_sentence: bool = False
    """Whether the decoder also takes the memory with one row per sentence while its rows are
    several per sentence (beams, samples), grouped sentence-major: a runtime need not repeat it."""
    encoder_input: SourceSpec = TOKEN_SOURCE
    """What ``src`` holds: token ids, or features from the front end it names (format 4)."""
    decoder_multi: GraphEntry | None = None
    """The k-position decoder step (``decoder_multi.onnx``, optional): the decoder's inputs with
    ``tokens`` ``(rows, positions)`` and a ``rollback`` for ``reorder``, the log-probs and top-k of
    every position; memory one row per token row. Speculative greedy needs it; readers that do not
    know it read the folder as before."""
    multi_step_max_abs_diff: float | None = None
    """The largest log-prob difference export measured between ``decoder_multi`` and k single steps."""
    alignment_heads: tuple[tuple[int, int], ...] = ()
    """The (decoder layer, head) pairs whose cross-attention the decoder's ``attention`` output holds,
    ``(rows, pairs, source)``: word timestamps read them. Empty: ``attention``, if any, is the model's own."""
    _document: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # --- building ---------------------------------------------------------------------------

    @classmethod
    def build(
        cls, directory: Path, *, plugin: tuple[str, str, str, str | None], config: Mapping[str, Any], source: str,
        exporter: str, opset: int, graphs: Mapping[str, tuple[str, Sequence[IOEntry], Sequence[IOEntry]]],
        memory: Sequence[MemorySpec], state: Sequence[StateSpec], src_vocab: Vocabulary, tgt_vocab: Vocabulary,
        limits: tuple[int | None, int | None], search: Mapping[str, Any], validation: Mapping[str, Any],
        samples: Sequence[str], training: Mapping[str, Any], checkpoint: CheckpointEntry, ort_optimized: bool,
        encoder_input: SourceSpec = TOKEN_SOURCE, memory_per_sentence: bool = False,
        alignment_heads: Sequence[tuple[int, int]] = (),
    ) -> Manifest:
        """A new export's manifest from what the exporter knows; ``plugin`` is (name, version,
        description, origin); ``graphs`` maps a role to (file, inputs, outputs), hashed later by
        ``with_graph`` once the files are final."""
        name, version, description, origin = plugin
        document = {
            "format": FORMAT,
            "plugin": {"name": name, "version": version, "description": description, "origin": origin},
            "config": dict(config),
            "source": source,
            "exporter": exporter,
            "opset": opset,
            "graphs": {role: {"file": file, "sha256": "", "inputs": [io.entry() for io in inputs],
                              "outputs": [io.entry() for io in outputs]}
                       for role, (file, inputs, outputs) in graphs.items()},
            "memory": [{"name": m.name, "batch_axis": m.batch_axis, "dtype": m.dtype, "description": m.description}
                       for m in memory],
            "state": [{"name": s.name, "batch_axis": s.batch_axis, "init": s.init, "shape": list(s.shape),
                       "grow_axis": s.grow_axis, "dtype": s.dtype, "description": s.description} for s in state],
            "special_tokens": tgt_vocab.special_ids(),
            "vocab": {"source": src_vocab.to_dict(), "target": tgt_vocab.to_dict()},
            "limits": dict(zip(LIMIT_KEYS, limits, strict=True)),
            "search": {"alpha": BY_NAME["alpha"].default, **search},
            "validation": dict(validation),
            "samples": list(samples),
            "checkpoint": {"file": checkpoint.file, "sha256": checkpoint.sha256, "included": checkpoint.included},
            "training": dict(training),
            "ort_optimized": ort_optimized,
            "memory_per_sentence": memory_per_sentence,
            "encoder_input": encoder_input.to_json(),
            "alignment_heads": [[int(layer), int(head)] for layer, head in alignment_heads],
        }
        return _typed(Path(directory), document, (src_vocab, tgt_vocab))

    # --- reading ----------------------------------------------------------------------------

    def graph_path(self, graph: GraphEntry, graph_format: str = "onnx") -> Path:
        if graph_format == "ort":
            if graph.ort_file is None:
                raise ManifestError(f"{self.directory} has no .ort graphs; export with --ort-format")
            return self.directory / graph.ort_file
        return self.directory / graph.file

    def listed_files(self) -> dict[str, str | None]:
        """Every file the manifest names, with the sha256 it must have: graphs, their .ort copies
        and external data, generate.onnx, tokenizer files, and the checkpoint (None: not included,
        so its absence is expected)."""
        files: dict[str, str | None] = {}
        for graph in (self.encoder, self.decoder, *((self.decoder_multi,) if self.decoder_multi else ())):
            files[graph.file] = graph.sha256
            if graph.ort_file is not None:
                files[graph.ort_file] = graph.ort_sha256
            files.update(graph.external_data)
        if self.generate is not None:
            files[self.generate.file] = self.generate.sha256
        for vocab in (self.src_vocab, self.tgt_vocab):
            if vocab.tokenizer is not None:
                files[vocab.tokenizer.name] = vocab.tokenizer.sha256
        if self.checkpoint is not None:
            files[self.checkpoint.file] = self.checkpoint.sha256 if self.checkpoint.included else None
        return files

    def verify(self) -> dict[str, str]:
        """Re-hash every listed file: ``{file: "ok" | "missing" | "modified" | "not included"}``."""
        found = {}
        for name, digest in self.listed_files().items():
            path = self.directory / name
            if not path.is_file():
                found[name] = "not included" if digest is None else "missing"
            elif digest is not None and sha256_of(path) != digest:
                found[name] = "modified"
            else:
                found[name] = "ok"
        return found

    def graph_facts(self, role: str) -> dict[str, str]:
        """Key facts stored inside each graph too, so a lone .onnx file still says what it is and
        what its position tables hold (``LIMITS_FACT``, checked against the manifest on load)."""
        doc = self._document
        return {
            "s2s_deploy.format": self.format,
            "s2s_deploy.role": role,
            "s2s_deploy.plugin": self.plugin,
            "s2s_deploy.plugin_version": self.plugin_version,
            "s2s_deploy.config": json.dumps(doc.get("config", {})),
            "s2s_deploy.special_tokens": json.dumps(doc["special_tokens"]),
            "s2s_deploy.memory": json.dumps(doc["memory"]),
            "s2s_deploy.state": json.dumps(doc["state"]),
            LIMITS_FACT: json.dumps({"max_source_length": self.max_source_length,
                                     "max_target_length": self.max_target_length}),
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON document, a copy (for tools that rewrite a folder by hand, such as tests)."""
        return copy.deepcopy(dict(self._document))

    def text(self) -> str:
        return manifest_text(self._document)

    # --- evolving ---------------------------------------------------------------------------

    def _evolved(self, edit: Any) -> Manifest:
        document = self.to_dict()
        edit(document)
        return _typed(self.directory, document, (self.src_vocab, self.tgt_vocab))

    def moved_to(self, directory: Path) -> Manifest:
        """The same document for a copy of the folder (a transform's staging folder)."""
        return replace(self, directory=Path(directory))

    def with_graph(self, role: str, path: Path, external_data: Mapping[str, str] | None = None) -> Manifest:
        """``role``'s graph rewritten in place (same name): its hash, the external data it now
        reads; .ort copies, made from the graph before, are dropped."""
        def edit(doc: dict[str, Any]) -> None:
            entry = doc["graphs"][role]
            entry["sha256"] = sha256_of(path)
            for key in ("ort_file", "ort_sha256", "external_data"):
                entry.pop(key, None)
            if external_data:
                entry["external_data"] = dict(external_data)
        return self._evolved(edit)

    def with_ort_graph(self, role: str, path: Path) -> Manifest:
        """An ONNX Runtime format copy of ``role``'s graph, beside it."""
        def edit(doc: dict[str, Any]) -> None:
            doc["graphs"][role].update(ort_file=path.name, ort_sha256=sha256_of(path))
        return self._evolved(edit)

    def with_validation(self, **measured: Any) -> Manifest:
        return self._evolved(lambda doc: doc.setdefault("validation", {}).update(measured))

    def with_dtypes(self, dtypes: Mapping[str, str]) -> Manifest:
        """Graph inputs and outputs, memory and state retyped after a conversion (fp16), by tensor name."""
        def edit(doc: dict[str, Any]) -> None:
            for role in ("encoder", "decoder"):
                for kind in ("inputs", "outputs"):
                    for entry in doc["graphs"][role][kind]:
                        entry["dtype"] = dtypes.get(entry["name"], entry.get("dtype"))
            for entry in doc["memory"]:
                entry["dtype"] = dtypes.get(entry["name"], entry["dtype"])
            for spec, entry in zip(self.state, doc["state"], strict=True):
                entry["dtype"] = dtypes.get(spec.decoder_input, entry["dtype"])
        return self._evolved(edit)

    def with_quantization(self, kind: str, activations: str | None, min_token_agreement: float,
                          opset: int, block_size: int | None = None,
                          accuracy_level: int | None = None, source: str | None = None) -> Manifest:
        """A quantised copy: its kind, the token agreement parity holds it to instead of a
        log-prob tolerance, and no generate.onnx (a fused graph embeds the fp32 decoder).
        ``source``: the original folder's name (default: this manifest's folder)."""
        def edit(doc: dict[str, Any]) -> None:
            doc["opset"] = opset
            doc["graphs"].pop("generate", None)
            doc["graphs"].pop("decoder_multi", None)  # not quantised: speculative greedy stays fp32-only
            doc["quantization"] = {"kind": kind, "source": source or self.directory.name}  # no build-machine paths
            if activations is not None:
                doc["quantization"]["activations"] = activations
            if block_size is not None:  # int4
                doc["quantization"]["block_size"] = block_size
                doc["quantization"]["accuracy_level"] = accuracy_level
            doc["validation"] = {"atol": None, "min_token_agreement": min_token_agreement,
                                 "fp32_max_abs_diff": dict(self.validation.max_abs_diff)}
        return self._evolved(edit)

    def with_generate(self, path: Path, beam: bool, options: Sequence[str], inputs: Sequence[IOEntry],
                      outputs: Sequence[IOEntry]) -> Manifest:
        """``generate.onnx`` in the folder: its hash, its search and options, its inputs and outputs."""
        if path.resolve().parent != self.directory.resolve():
            raise S2SError(f"{path} is not in the export folder {self.directory}")

        def edit(doc: dict[str, Any]) -> None:
            doc["graphs"]["generate"] = {
                "file": path.name, "sha256": sha256_of(path), "search": "beam" if beam else "greedy",
                **({"options": list(options)} if options else {}),
                "inputs": [io.entry() for io in inputs], "outputs": [io.entry() for io in outputs],
            }
        return self._evolved(edit)

    def write(self) -> Path:
        """Validate, then replace ``manifest.json`` in the folder atomically."""
        path = self.directory / MANIFEST_NAME
        validate_manifest(self._document, path)
        _check_paths(path, self)
        return write_atomically(path, manifest_text(self._document).encode("utf-8"))


def _typed(directory: Path, doc: dict[str, Any], vocabs: tuple[Vocabulary, Vocabulary] | None = None) -> Manifest:
    graphs = doc["graphs"]
    limits = doc.get("limits", {})
    if vocabs is None:
        read = _folder_reader(directory)
        special = _special_ids(doc)
        src_vocab = Vocabulary.from_dict(doc["vocab"]["source"], read_file=read)
        # format 2 kept the decoder start apart from the vocabulary, whose specials sat at 0..3
        tgt_vocab = Vocabulary.from_dict(doc["vocab"]["target"], int(special["decoder_start"]), read)
        differing = sorted(key for key, value in tgt_vocab.special_ids().items() if special.get(key) != value)
        if differing:
            key = differing[0]
            raise S2SError(f"key special_tokens.{key}: id {special.get(key)} disagrees with the target "
                           f"vocabulary's {tgt_vocab.special_ids()[key]}")
    else:
        src_vocab, tgt_vocab = vocabs
    encoder, decoder = _graph(graphs["encoder"]), _graph(graphs["decoder"])
    plugin = doc["plugin"]
    generate = graphs.get("generate")
    checkpoint = doc.get("checkpoint")
    quantization = doc.get("quantization")
    validation = doc.get("validation") or {}
    return Manifest(
        directory=directory,
        plugin=plugin["name"],
        plugin_version=plugin["version"],
        plugin_description=plugin.get("description", ""),
        plugin_origin=plugin.get("origin"),
        format=doc["format"],
        encoder=encoder,
        decoder=decoder,
        generate=None if generate is None else GenerateEntry(
            generate["file"], generate["sha256"], generate.get("search", "beam") == "beam",
            tuple(generate.get("options", ()))),
        memory=tuple(MemorySpec(m["name"], int(m["batch_axis"]), m["dtype"], m.get("description", ""))
                     for m in doc["memory"]),
        state=tuple(StateSpec(s["name"], int(s["batch_axis"]), s["init"], tuple(s["shape"]), s["grow_axis"],
                              s["dtype"], s.get("description", "")) for s in doc["state"]),
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        decoder_start_id=tgt_vocab.decoder_start_id,
        eos_id=tgt_vocab.eos_id,
        max_source_length=limits.get("max_source_length"),
        max_target_length=limits.get("max_target_length"),
        has_attention_output="attention" in decoder.outputs,
        samples=tuple(doc.get("samples", ())),
        search=SearchDefaults(doc["search"]),
        checkpoint=None if checkpoint is None else CheckpointEntry(
            checkpoint["file"], checkpoint["sha256"], bool(checkpoint.get("included", True))),
        quantization=None if not quantization else Quantization(
            quantization["kind"], quantization.get("source"), quantization.get("activations"),
            quantization.get("block_size"), quantization.get("accuracy_level")),
        validation=Validation(validation.get("atol"), validation.get("rtol"), validation.get("min_token_agreement"),
                              MappingProxyType(dict(validation.get("max_abs_diff") or {}))),
        training=MappingProxyType(copy.deepcopy(doc.get("training") or {})),
        config=MappingProxyType(copy.deepcopy(doc.get("config") or {})),
        source=doc.get("source", ""),
        exporter=doc.get("exporter", ""),
        opset=doc.get("opset"),
        ort_optimized=bool(doc.get("ort_optimized", False)),
        memory_per_sentence=bool(doc.get("memory_per_sentence", False)),
        encoder_input=_encoder_input(doc, encoder),
        alignment_heads=_alignment_heads(doc, decoder),
        decoder_multi=_graph(graphs["decoder_multi"]) if "decoder_multi" in graphs else None,
        multi_step_max_abs_diff=validation.get("multi_step_max_abs_diff"),
        _document=doc,
    )


def _alignment_heads(doc: dict[str, Any], decoder: GraphEntry) -> tuple[tuple[int, int], ...]:
    """``alignment_heads``, which describe the decoder's ``attention`` output, so it must have one."""
    heads = tuple((int(layer), int(head)) for layer, head in doc.get("alignment_heads", ()))
    if heads and "attention" not in decoder.outputs:
        raise ManifestError("alignment_heads describe the decoder's attention output, which it does not have")
    return heads


def _special_ids(doc: dict[str, Any]) -> dict[str, int | None]:
    """``special_tokens``, each id inside the target vocabulary (before the vocabulary is read)."""
    special, size = doc["special_tokens"], len(doc["vocab"]["target"]["tokens"])
    for key, value in special.items():
        if isinstance(value, int) and value >= size:
            raise S2SError(f"key special_tokens.{key}: id {value} is outside the target vocabulary of {size} tokens")
    return special


def _encoder_input(doc: dict[str, Any], encoder: GraphEntry) -> SourceSpec:
    """The manifest's ``encoder_input`` (token ids when absent, as formats 2 and 3 are), held
    against the encoder's listed ``src``: its dtype and its rank."""
    spec = SourceSpec.from_json(doc["encoder_input"]) if "encoder_input" in doc else TOKEN_SOURCE
    src = next((io for io in encoder.input_io if io.name == "src"), None)
    if src is None:
        raise S2SError("graphs.encoder lists no input 'src'")
    if src.dtype is not None and src.dtype != spec.dtype:
        raise S2SError(f"encoder_input is {spec.kind} of {spec.dtype}, but the encoder's src is {src.dtype}")
    rank = 1 + (len(spec.shape) if spec.is_features else 1)
    if src.shape is not None and len(src.shape) != rank:
        raise S2SError(f"encoder_input declares {rank} axes for src, but the encoder's src has {len(src.shape)}")
    return spec


def _graph(entry: dict[str, Any]) -> GraphEntry:
    ios = {kind: tuple(IOEntry(io["name"], io["role"], io.get("dtype"),
                               None if io.get("shape") is None else tuple(io["shape"])) for io in entry[kind])
           for kind in ("inputs", "outputs")}
    external = tuple((str(name), str(digest)) for name, digest in entry.get("external_data", {}).items())
    return GraphEntry(entry["file"], entry["sha256"], tuple(io.name for io in ios["inputs"]),
                      tuple(io.name for io in ios["outputs"]), entry.get("ort_file"), entry.get("ort_sha256"),
                      external, ios["inputs"], ios["outputs"])


def _folder_reader(directory: Path) -> FileReader:
    """Tokenizer files are read from inside the export folder only."""
    def read(name: str, sha256: str) -> bytes:
        path = inside(directory, name, ManifestError, "tokenizer file")
        if not path.is_file():
            raise ManifestError(f"{path} is missing")
        return path.read_bytes()

    return read


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
    """Read and check an export folder: schema, containment, every listed file's hash (unless
    ``verify_hashes`` is off), and the manifest's numbers against the graphs. Any fault is one
    ``ManifestError`` line, raised before a runtime session could see the folder."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not directory.is_dir():
        raise ManifestError(not_an_export(directory))
    if not path.is_file():
        raise ManifestError(f"no {MANIFEST_NAME} in {directory}: is it an s2s-deploy export?")
    raw = read_manifest_json(path)
    validate_manifest(raw, path)
    try:
        manifest = _typed(directory, raw)
    except ManifestError:
        raise
    except S2SError as exc:
        raise ManifestError(f"{path}: {exc}") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{path} is incomplete or corrupt: {exc!r}") from exc
    _check_paths(path, manifest)
    for graph in (manifest.encoder, manifest.decoder):
        if not manifest.graph_path(graph).is_file():
            raise ManifestError(f"{manifest.graph_path(graph)} is missing")
        for name, _ in graph.external_data:
            if Path(name).name != name or not (directory / name).is_file():
                raise ManifestError(f"{graph.file} reads external data {name!r}, which is not a file in {directory}")
    if verify_hashes:
        for name, status in manifest.verify().items():
            needed = manifest.checkpoint is None or name != manifest.checkpoint.file  # a deployment may drop it
            if status == "modified" or (status == "missing" and needed):
                raise ManifestError(f"{directory / name} is {status}: it does not match the sha256 in the manifest "
                                    "(run `s2s-deploy inspect --verify` for every file)")
    models = []
    for graph in (manifest.encoder, manifest.decoder):
        model = check_graph(manifest.graph_path(graph), directory, graph.inputs, graph.outputs)
        _check_external_data_listed(path, graph, model.graph)
        models.append(model)
    _check_roles(path, manifest)
    _check_vocab_sizes(path, manifest, *(model.graph for model in models))
    _check_against_graphs(path, manifest, *models)
    return manifest


def _check_paths(path: Path, manifest: Manifest) -> None:
    """Every file the manifest names is a relative path that resolves inside the folder."""
    for name in manifest.listed_files():
        if not name or name.startswith("/") or "\\" in name or "\x00" in name:
            raise ManifestError(f"{path}: file {name!r} must be a relative path inside the export folder")
        inside(manifest.directory, name, ManifestError)


def _check_roles(path: Path, manifest: Manifest) -> None:
    """Each memory and state entry must be wired through the graphs as its role says, and each
    graph input or output with a memory or state role must belong to an entry."""
    memory, state, encoder, decoder = manifest.memory, manifest.state, manifest.encoder, manifest.decoder
    owners = {"memory": {m.name for m in memory}, "state_in": {s.decoder_input for s in state},
              "state_out": {s.decoder_output for s in state},
              "state_init": {s.encoder_output for s in state if s.encoder_output}}
    for role_graph, graph in (("encoder", encoder), ("decoder", decoder)):
        for kind, ios in (("inputs", graph.input_io), ("outputs", graph.output_io)):
            for io in ios:
                if io.role in owners and io.name not in owners[io.role]:
                    raise ManifestError(f"{path}: key graphs.{role_graph}.{kind}: {io.name!r} has role "
                                        f"{io.role!r} but no memory/state entry owns it")
    wanted = [(m.name, encoder.outputs, "encoder output") for m in memory]
    wanted += [(m.name, decoder.inputs, "decoder input") for m in memory]
    for s in state:
        wanted += [(s.decoder_input, decoder.inputs, "decoder input"),
                   (s.decoder_output, decoder.outputs, "decoder output")]
        if s.encoder_output is not None:
            wanted.append((s.encoder_output, encoder.outputs, "encoder output"))
        if s.grow_axis is not None and not 0 <= s.grow_axis < len(s.shape):
            raise ManifestError(f"{path}: key state: {s.name!r} grows along axis {s.grow_axis} of a "
                                f"{len(s.shape)}-axis shape")
    for name, names, what in wanted:
        if name not in names:
            raise ManifestError(f"{path}: key graphs: the {what} {name!r} is not listed (memory/state and graphs "
                                "disagree)")


def _check_vocab_sizes(path: Path, manifest: Manifest, encoder: Any, decoder: Any) -> None:
    """The target vocabulary must match the decoder's log-prob width, and the source vocabulary an
    embedding table read straight from ``src`` (when the graph has one as a plain initializer)."""
    target = len(manifest.tgt_vocab)
    width = graph_dim(decoder, "log_probs", 1)
    if width is not None and width != target:
        raise ManifestError(f"{path}: key vocab.target: {target} tokens, but the decoder scores {width}")
    source = len(manifest.src_vocab)
    tables = {t.name: tuple(t.dims) for t in encoder.initializer}
    for node in encoder.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == "src" and node.input[0] in tables:
            rows = tables[node.input[0]][0]
            if rows != source:
                raise ManifestError(f"{path}: key vocab.source: {source} tokens, but the encoder embeds {rows}")


def _check_external_data_listed(path: Path, graph: GraphEntry, proto: Any) -> None:
    """Every external-data file a graph reads must be hashed in the manifest."""
    listed = {name for name, _ in graph.external_data}
    for tensor in proto.initializer:
        location = next((e.value for e in tensor.external_data if e.key == "location"), None)
        if location is not None and location not in listed:
            raise ManifestError(f"{path}: key graphs: {graph.file} reads external data {location!r}, which the "
                                "manifest does not hash")


# --- numbers against graphs -----------------------------------------------------------------

def _values(graph: Any, kind: str) -> dict[str, tuple[str, tuple[int | str, ...]]]:
    """name -> (dtype, dims) of a graph's inputs or outputs; a dim is an int, an axis name, or "?"."""
    import onnx

    found = {}
    for value in getattr(graph, kind):
        tensor = value.type.tensor_type
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        except (KeyError, TypeError, ValueError):
            dtype = f"onnx type {tensor.elem_type}"
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
        found[value.name] = (dtype, dims)
    return found


def _check_against_graphs(path: Path, manifest: Manifest, encoder: Any, decoder: Any) -> None:
    """The manifest's dtypes, shapes, batch and growing axes and position limits, held against
    what the graphs (ModelProtos) declare, so a wrong number is refused here and not met as a
    numpy or ONNX Runtime error halfway through a search."""
    declared = {role: (_values(model.graph, "input"), _values(model.graph, "output"))
                for role, model in (("encoder", encoder), ("decoder", decoder))}
    for role, graph in (("encoder", manifest.encoder), ("decoder", manifest.decoder)):
        for kind, ios, values in (("inputs", graph.input_io, declared[role][0]),
                                  ("outputs", graph.output_io, declared[role][1])):
            for index, io in enumerate(ios):
                if io.name not in values:
                    continue  # an input the graph dropped; check_graph refuses a missing required one
                dtype, dims = values[io.name]
                where = f"{path}: key graphs.{role}.{kind}.{index}"
                if io.dtype is not None and io.dtype != dtype:
                    raise ManifestError(f"{where}.dtype: {io.dtype!r}, but the graph's {io.name!r} is {dtype}")
                if io.shape is not None and not _same_dims(io.shape, dims):
                    raise ManifestError(f"{where}.shape: {list(io.shape)}, but the graph's {io.name!r} is "
                                        f"{list(dims)}")
    batch = _batch_name(declared["encoder"][0].get("src"))
    for index, m in enumerate(manifest.memory):
        where = f"{path}: key memory.{index}"
        dtype, dims = declared["encoder"][1][m.name]
        _check_dtype(where, m.dtype, dtype, m.name)
        _check_batch_axis(where, m.batch_axis, dims, batch, m.name)
    batch = _batch_name(declared["decoder"][0].get("tokens")) or batch
    for index, s in enumerate(manifest.state):
        where = f"{path}: key state.{index}"
        dtype, dims = declared["decoder"][0][s.decoder_input]
        _, out_dims = declared["decoder"][1][s.decoder_output]
        _check_dtype(where, s.dtype, dtype, s.decoder_input)
        # the past's rows have a name of their own (a beam's first wide step reads one per sentence)
        _check_batch_axis(where, s.batch_axis, dims, None, s.decoder_input)
        _check_batch_axis(where, s.batch_axis, out_dims, batch, s.decoder_output)
        growing = [axis for axis, (a, b) in enumerate(zip(dims, out_dims, strict=False))
                   if a != b and axis != s.batch_axis]
        if s.grow_axis not in (growing or [None]):
            raise ManifestError(f"{where}.grow_axis: {s.grow_axis}, but {s.decoder_input} grows along "
                                f"{growing[0] if growing else 'no axis'} in the graph")
        if s.init == "zeros":
            _check_zeros_shape(where, s, dims)
    _check_limits(path, manifest, encoder, decoder)


def _same_dims(listed: tuple[int | str, ...], declared: tuple[int | str, ...]) -> bool:
    if len(listed) != len(declared):
        return False
    return all(a == b for a, b in zip(listed, declared, strict=True) if isinstance(b, int))


def _batch_name(value: tuple[str, tuple[int | str, ...]] | None) -> str | None:
    """The graph's own name for the batch axis: axis 0 of ``src`` (encoder) or ``tokens`` (decoder)."""
    if value is None or not value[1] or not isinstance(value[1][0], str) or value[1][0] == "?":
        return None
    return value[1][0]


def _check_dtype(where: str, listed: str, declared: str, name: str) -> None:
    if listed not in DTYPES:
        raise ManifestError(f"{where}.dtype: {listed!r:.40} is not one of {', '.join(DTYPES)}")
    if listed != declared:
        raise ManifestError(f"{where}.dtype: {listed}, but the graph's {name!r} is {declared}")


def _check_batch_axis(where: str, axis: int, dims: tuple[int | str, ...], batch: str | None, name: str) -> None:
    if axis >= len(dims):
        raise ManifestError(f"{where}.batch_axis: {axis}, but the graph's {name!r} has {len(dims)} axes")
    if isinstance(dims[axis], int) or (batch is not None and dims[axis] != batch):
        raise ManifestError(f"{where}.batch_axis: {axis}, but axis {axis} of the graph's {name!r} is "
                            f"{dims[axis]!r}, not the batch")


def _check_zeros_shape(where: str, s: StateSpec, dims: tuple[int | str, ...]) -> None:
    shape = s.shape
    if len(shape) != len(dims):
        raise ManifestError(f"{where}.shape: {len(shape)} axes, but the graph's {s.decoder_input!r} has {len(dims)}")
    for axis, (size, declared) in enumerate(zip(shape, dims, strict=True)):
        if axis == s.batch_axis:
            if size != BATCH:
                raise ManifestError(f"{where}.shape: axis {axis} is the batch axis and must be {BATCH!r}")
        elif isinstance(size, bool) or not isinstance(size, int):
            raise ManifestError(f"{where}.shape: axis {axis} is {size!r:.40}, not a whole number")
        elif axis == s.grow_axis and size != 0:
            raise ManifestError(f"{where}.shape: axis {axis} grows, so it starts empty (0), not {size}")
        elif isinstance(declared, int) and size != declared:
            raise ManifestError(f"{where}.shape: axis {axis} is {size}, but the graph's {s.decoder_input!r} "
                                f"has {declared}")


def _check_limits(path: Path, manifest: Manifest, encoder: Any, decoder: Any) -> None:
    """A position limit may not exceed the one the graph records for its own position tables
    (graphs exported before the record existed are not held to it), and the manifest's default
    target length may not exceed its limit."""
    for graph in (encoder, decoder):
        recorded = _graph_limits(graph)
        for key in LIMIT_KEYS:
            table = recorded.get(key)
            value = getattr(manifest, key)
            if isinstance(table, int) and (value is None or value > table):
                raise ManifestError(f"{path}: key limits.{key}: {value}, but the graphs were exported with "
                                    f"position tables for {table}")
    limit = manifest.max_target_length
    for key in ("max_len", "min_len"):
        value = manifest.search.get(key)
        if limit is not None and isinstance(value, int) and value > limit:
            raise ManifestError(f"{path}: key search.{key}: {value}, over limits.max_target_length {limit}")


def _graph_limits(model: Any) -> dict[str, Any]:
    text = next((prop.value for prop in model.metadata_props if prop.key == LIMITS_FACT), None)
    try:
        found = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return found if isinstance(found, dict) else {}


def manifest_text(raw: Mapping[str, Any]) -> str:
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
