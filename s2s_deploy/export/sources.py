"""Where the weights for an export come from: a given checkpoint, the plugin's bundled one, or
(for a third-party plugin that bundles none) seeded random weights, said out loud."""

from __future__ import annotations

import random
import string
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import sha256_of
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.modeling.checkpoint import build_model, load_checkpoint, save_checkpoint
from s2s_deploy.modeling.contract import ArchitecturePlugin, Seq2SeqModel
from s2s_deploy.modeling.plugin_errors import plugin_errors

RANDOM_SEED = 0
SAMPLE_COUNT = 32


@dataclass(frozen=True)
class ModelSource:
    plugin: ArchitecturePlugin
    config: Any
    model: Seq2SeqModel
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    checkpoint_path: Path
    description: str
    samples: tuple[str, ...]
    trained: bool
    info: dict[str, Any]
    search: dict[str, Any] = field(default_factory=dict)
    alignment_heads: tuple[tuple[int, int], ...] = ()
    """(layer, head) pairs a Hugging Face family names for word timestamps (``hf_alignment_heads``)."""


def bundled_checkpoint(plugin: ArchitecturePlugin) -> Path | None:
    """Built-in plugins ship ``<name>.safetensors`` beside their module; others may too."""
    module = __import__(type(plugin).__module__, fromlist=["__file__"])
    candidate = Path(module.__file__).parent / "checkpoints" / f"{plugin.name}.safetensors"
    return candidate if candidate.is_file() else None


def load_source(plugin: ArchitecturePlugin, checkpoint: str | Path | None, preset: str | None = None,
                workdir: Path | None = None) -> ModelSource:
    if preset is not None and checkpoint is not None:
        raise S2SError("--preset applies only without --checkpoint (a checkpoint carries its config)")
    # A preset asks for seeded random weights of that config, even where a bundled checkpoint exists.
    path = Path(checkpoint) if checkpoint else None if preset is not None else bundled_checkpoint(plugin)
    if path is None:
        return _random_source(plugin, preset, workdir or Path(tempfile.mkdtemp(prefix="s2s-random-")))
    if path.is_dir():
        return _hf_source(plugin, path, workdir or Path(tempfile.mkdtemp(prefix="s2s-hf-")))
    loaded = load_checkpoint(path)
    model = build_model(loaded, plugin)
    info = loaded.info
    kind = "bundled checkpoint" if checkpoint is None else "checkpoint"
    trained = f", trained on {info['task']}" if info.get("task") else ""
    return ModelSource(
        plugin, loaded.config, model, loaded.src_vocab, loaded.tgt_vocab, path,
        f"{kind} {path.name} (sha256 {sha256_of(path)}){trained}",
        tuple(info.get("samples", ())), trained=True, info=info,
    )


def _hf_source(plugin: ArchitecturePlugin, directory: Path, workdir: Path) -> ModelSource:
    """A local Hugging Face folder, converted into an s2s-deploy checkpoint for ``parity``."""
    from s2s_deploy.export.hf import load_hf, save_hf_checkpoint

    hf = load_hf(plugin, directory)
    path = save_hf_checkpoint(hf, plugin, workdir / f"{plugin.name}-hf.safetensors")
    c = hf.checkpoint
    return ModelSource(plugin, c.config, hf.model, c.src_vocab, c.tgt_vocab, path,
                       f"Hugging Face folder {directory} ({c.info['hf_model_type']}"
                       f"{f'; ids only: {hf.ids_only}' if hf.ids_only else ''})", hf.samples, trained=True,
                       info=c.info, search=hf.search, alignment_heads=hf.alignment_heads)


def _random_source(plugin: ArchitecturePlugin, preset: str | None, workdir: Path) -> ModelSource:
    """Seeded random weights over a source and a target vocabulary of different sizes, so that a
    ``build()`` that swaps ``src_vocab_size`` and ``tgt_vocab_size`` fails at export, not in ``train``.
    A family that shares one embedding refuses different sizes (its ``build`` raises): it gets the
    source vocabulary on both sides, and a ``build`` that fails at equal sizes too is reported."""
    config = plugin.preset(preset)
    start = plugin.special_tokens.decoder_start
    src_vocab = Vocabulary.build([string.ascii_letters + string.digits + string.punctuation + " "],
                                 decoder_start=start)
    tgt_vocab = Vocabulary.build([string.ascii_lowercase + string.digits + " "], decoder_start=start)
    torch.manual_seed(RANDOM_SEED)
    with plugin_errors(plugin.name, "build()"):
        try:
            model = plugin.build(config, len(src_vocab), len(tgt_vocab)).eval()
        except Exception:  # retried below at equal sizes, where a real mistake fails again
            tgt_vocab = src_vocab
            torch.manual_seed(RANDOM_SEED)
            model = plugin.build(config, len(src_vocab), len(tgt_vocab)).eval()
    path = save_checkpoint(workdir / f"{plugin.name}-random.safetensors", plugin, config, model, src_vocab, tgt_vocab,
                           {"random_seed": RANDOM_SEED})
    rng = random.Random(RANDOM_SEED)
    samples = tuple(
        "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(rng.randint(3, 20))).strip() or "x"
        for _ in range(8)
    )
    return ModelSource(
        plugin, config, model, src_vocab, tgt_vocab, path,
        f"seeded random weights (seed {RANDOM_SEED}, preset {preset or plugin.default_preset}): "
        + ("--preset asks for them, not the bundled checkpoint" if preset is not None and bundled_checkpoint(plugin)
           else "no checkpoint given and none bundled") + "; this model does not translate",
        samples, trained=False, info={"random_seed": RANDOM_SEED},
    )
