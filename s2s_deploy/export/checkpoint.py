"""Checkpoints are one safetensors file: tensors, plus JSON metadata (architecture, config,
vocabularies). Loading never unpickles anything."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from s2s_deploy.export.contract import ArchitecturePlugin, Seq2SeqModel
from s2s_deploy.export.registry import get_plugin
from s2s_deploy.runtime.errors import CheckpointError, S2SError
from s2s_deploy.runtime.vocab import Vocabulary

FORMAT = "s2s-deploy-checkpoint/1"


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
    metadata = {
        "format": FORMAT,
        "arch": plugin.name,
        "plugin_version": plugin.version,
        "config": json.dumps(dataclasses.asdict(config)),
        "src_vocab": json.dumps(src_vocab.to_dict(), ensure_ascii=False),
        "tgt_vocab": json.dumps(tgt_vocab.to_dict(), ensure_ascii=False),
        "info": json.dumps(info or {}, ensure_ascii=False),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would make a shared checkpoint unreadable
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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


def load_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint: {exc}") from exc
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an s2s-deploy checkpoint (format {metadata.get('format')!r})")
    try:
        plugin = get_plugin(metadata["arch"])
        config = plugin.config_from_dict(json.loads(metadata["config"]))
        src_vocab = Vocabulary.from_dict(json.loads(metadata["src_vocab"]))
        tgt_vocab = _target_vocab(json.loads(metadata["tgt_vocab"]), plugin)
        info = json.loads(metadata.get("info", "{}"))
    except S2SError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path} has corrupt metadata: {exc}") from exc
    return Checkpoint(metadata["arch"], metadata["plugin_version"], config, src_vocab, tgt_vocab, tensors, info)


def _target_vocab(data: dict[str, Any], plugin: ArchitecturePlugin) -> Vocabulary:
    """Older checkpoints record no special ids: the plugin's start token name gives the start id."""
    if "special" in data:
        return Vocabulary.from_dict(data)
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
