"""Checkpoints are one safetensors file: tensors, plus JSON metadata (architecture, config,
vocabularies). A subword vocabulary's tokenizer file rides along as a uint8 tensor named by its
sha256 (no size limit, unlike the metadata header). Loading never unpickles anything."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from s2s_deploy.architecture.registry import get_plugin
from s2s_deploy.errors import CheckpointError, S2SError
from s2s_deploy.format.files import atomic_path
from s2s_deploy.format.vocab import FileReader, Vocabulary
from s2s_deploy.modeling.contract import ArchitecturePlugin, Seq2SeqModel

FORMAT = "s2s-deploy-checkpoint/2"
READABLE_FORMATS = ("s2s-deploy-checkpoint/1", FORMAT)  # 1: no special ids, no tokenizer files
FILE_TENSOR = "s2s_deploy.tokenizer_file."
MAX_HEADER_BYTES = 100 << 20  # tensor index and metadata (vocabularies); a crafted header may not cost more


@dataclass(frozen=True)
class Checkpoint:
    arch: str
    plugin_version: str
    config: Any
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    tensors: dict[str, torch.Tensor]
    info: dict[str, Any]


def save_checkpoint(
    path: str | Path,
    plugin: ArchitecturePlugin,
    config: Any,
    model: Seq2SeqModel,
    src_vocab: Vocabulary,
    tgt_vocab: Vocabulary,
    info: dict[str, Any] | None = None,
) -> Path:
    """Atomic: a crash mid-write never leaves a truncated checkpoint behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous().cpu() for name, t in _unique_tensors(model).items()}
    for file in (src_vocab.tokenizer, tgt_vocab.tokenizer):
        if file is not None:
            tensors[FILE_TENSOR + file.sha256] = torch.frombuffer(bytearray(file.data), dtype=torch.uint8)
    metadata = {
        "format": FORMAT,
        "arch": plugin.name,
        "plugin_version": plugin.version,
        "config": json.dumps(dataclasses.asdict(config)),
        "src_vocab": json.dumps(src_vocab.to_dict(), ensure_ascii=False),
        "tgt_vocab": json.dumps(tgt_vocab.to_dict(), ensure_ascii=False),
        "info": json.dumps(info or {}, ensure_ascii=False),
    }
    with atomic_path(path) as temporary:
        save_file(tensors, str(temporary), metadata=metadata)
    return path


def _unique_tensors(model: Seq2SeqModel) -> dict[str, torch.Tensor]:
    """State dict without the second name of tied weights (safetensors refuses shared storage)."""
    seen: set[int] = set()
    unique = {}
    for name, tensor in model.state_dict(keep_vars=False).items():
        key = tensor.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        unique[name] = tensor
    return unique


def _header_size(path: Path) -> int:
    """The safetensors header length, bounded before anything parses it."""
    with open(path, "rb") as handle:
        head = handle.read(8)
    size = int.from_bytes(head, "little") if len(head) == 8 else -1
    if not 0 < size <= MAX_HEADER_BYTES or size + 8 > path.stat().st_size:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint: its header ({size:,} bytes) is over "
                              f"the {MAX_HEADER_BYTES:,} allowed or past the end of the file")
    return size


_CHUNK = 1 << 20


def content_digest(path: str | Path) -> str:
    """sha256 of what a checkpoint holds (metadata, tensor names, dtypes, shapes and bytes), not of
    its layout: safetensors writes the metadata in hash-map order, so two saves of the same weights
    differ in bytes. The up-to-date check compares this; the manifest keeps the file's own sha256."""
    path = Path(path)
    size = _header_size(path)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        handle.seek(8)
        try:
            header = json.loads(handle.read(size))
            tensors = {name: (entry["dtype"], entry["shape"], entry["data_offsets"])
                       for name, entry in header.items() if name != "__metadata__"}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CheckpointError(f"{path} is not a readable safetensors checkpoint: {exc}") from exc
        described = {name: (dtype, shape) for name, (dtype, shape, _) in tensors.items()}
        digest.update(json.dumps([header.get("__metadata__"), described], sort_keys=True).encode())
        for name in sorted(tensors):
            start, end = tensors[name][2]
            handle.seek(8 + size + start)
            remaining = end - start
            while remaining > 0:
                chunk = handle.read(min(_CHUNK, remaining))
                if not chunk:
                    raise CheckpointError(f"{path} is not a readable safetensors checkpoint: {name!r} runs past "
                                          "the end of the file")
                digest.update(chunk)
                remaining -= len(chunk)
    return digest.hexdigest()


def load_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        from safetensors import safe_open

        _header_size(path)
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint: {exc}") from exc
    if metadata.get("format") not in READABLE_FORMATS:
        raise CheckpointError(f"{path} is not an s2s-deploy checkpoint (format {metadata.get('format')!r})")
    missing = [key for key in ("arch", "plugin_version", "config", "src_vocab", "tgt_vocab") if key not in metadata]
    if missing:
        raise CheckpointError(f"{path} has no {missing[0]!r} in its metadata (not written by s2s-deploy, or damaged)")

    def read_file(name: str, sha256: str) -> bytes:
        """A tokenizer file embedded as a uint8 tensor, read alone (the weights load after the shape check)."""
        if f"{FILE_TENSOR}{sha256}" not in shapes:
            raise CheckpointError(f"no tokenizer file {name!r} (sha256 {sha256[:12]}...) in the checkpoint")
        with safe_open(str(path), framework="pt") as handle:
            return handle.get_tensor(f"{FILE_TENSOR}{sha256}").numpy().tobytes()

    try:
        plugin = get_plugin(metadata["arch"])
        config = plugin.config_from_dict(json.loads(metadata["config"]))
        src_vocab = Vocabulary.from_dict(json.loads(metadata["src_vocab"]), read_file=read_file)
        tgt_vocab = _target_vocab(json.loads(metadata["tgt_vocab"]), plugin, read_file)
        info = json.loads(metadata.get("info", "{}"))
    except S2SError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    except (KeyError, ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise CheckpointError(f"{path} has corrupt metadata: {exc}") from exc
    if not isinstance(info, dict):
        raise CheckpointError(f"{path} has corrupt metadata: info is not an object")
    shapes = {name: shape for name, shape in shapes.items() if not name.startswith(FILE_TENSOR)}
    _check_shapes(path, plugin, config, len(src_vocab), len(tgt_vocab), shapes)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint: {exc}") from exc
    tensors = {name: tensor for name, tensor in tensors.items() if not name.startswith(FILE_TENSOR)}
    return Checkpoint(metadata["arch"], metadata["plugin_version"], config, src_vocab, tgt_vocab, tensors, info)


def _check_shapes(path: Path, plugin: ArchitecturePlugin, config: Any, src_size: int, tgt_size: int,
                  shapes: dict[str, tuple[int, ...]]) -> None:
    """Build the model on the meta device (no memory) and compare its tensors with the file's,
    so an enormous or inconsistent config is refused before anything is allocated."""
    try:
        with torch.device("meta"):
            model = plugin.build(config, src_size, tgt_size)
    except Exception as exc:  # a config the plugin's modules reject: zero heads, d_model not divisible...
        raise CheckpointError(f"{path}: the {plugin.name} config cannot build a model: "
                              f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}") from exc
    state = model.state_dict()
    needed = sum(t.numel() * t.element_size() for t in state.values())
    held = path.stat().st_size
    if needed > 3 * held + (1 << 20):  # tied weights appear twice in a state dict: 3x leaves room for them
        raise CheckpointError(f"{path}: its {plugin.name} config describes {needed / 1e6:,.0f} MB of weights, but the "
                              f"file holds {held / 1e6:,.1f} MB; refusing to allocate it")
    for name, tensor in state.items():
        if name in shapes and shapes[name] != tuple(tensor.shape):
            raise CheckpointError(f"checkpoint tensor {name} has shape {shapes[name]}, "
                                  f"the {plugin.name} config expects {tuple(tensor.shape)}")
def _target_vocab(data: dict[str, Any], plugin: ArchitecturePlugin, read_file: FileReader) -> Vocabulary:
    """Older checkpoints record no special ids: the plugin's start token name gives the start id."""
    if "special" in data:
        return Vocabulary.from_dict(data, read_file=read_file)
    start = plugin.special_tokens.decoder_start
    if start not in data["tokens"]:
        raise CheckpointError(f"the decoder start token {start!r} of {plugin.name} is not in the target vocabulary")
    return Vocabulary.from_dict(data, data["tokens"].index(start))


def build_model(checkpoint: Checkpoint, plugin: ArchitecturePlugin) -> Seq2SeqModel:
    """Build the plugin's model and load the weights, refusing any mismatch by name."""
    if checkpoint.arch != plugin.name:
        raise CheckpointError(
            f"checkpoint is for architecture {checkpoint.arch!r}, not {plugin.name!r}"
        )
    model = plugin.build(checkpoint.config, len(checkpoint.src_vocab), len(checkpoint.tgt_vocab))
    expected = model.state_dict()
    tied_aliases = set(expected) - set(_unique_tensors(model))
    missing = sorted(set(expected) - set(checkpoint.tensors) - tied_aliases)
    unexpected = sorted(set(checkpoint.tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint does not match {plugin.name}: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    for name, tensor in checkpoint.tensors.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, "
                f"the {plugin.name} config expects {tuple(expected[name].shape)}"
            )
    model.load_state_dict(checkpoint.tensors, strict=False)
    return model.eval()
