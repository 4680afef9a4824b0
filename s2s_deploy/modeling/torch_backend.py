"""PyTorch backend: runs the very modules that were exported (graphs.EncoderGraph/StepGraph)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from s2s_deploy.architecture.registry import exported_plugin
from s2s_deploy.errors import CheckpointError
from s2s_deploy.format.manifest import Manifest, sha256_of
from s2s_deploy.format.names import init_name
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.modeling.checkpoint import build_model, load_checkpoint
from s2s_deploy.modeling.contract import ArchitecturePlugin, Seq2SeqModel
from s2s_deploy.modeling.graphs import EncoderGraph, MultiStepGraph, StepGraph, io_names
from s2s_deploy.runtime.backend import Backend, DecodeRun
from s2s_deploy.runtime.speculative import source_in_target

_RunInputs = tuple[list[torch.Tensor], list[torch.Tensor]]  # memory, then the first state


class TorchBackend(Backend):
    name = "pytorch"

    def __init__(
        self, plugin: ArchitecturePlugin, model: Seq2SeqModel, config: Any, tgt_vocab: Vocabulary,
        device: str = "cpu", src_vocab: Vocabulary | None = None,
    ) -> None:
        """``src_vocab``: where given, speculative greedy drafts from the source too."""
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.memory_specs = plugin.memory_specs(config)
        self.state_specs = plugin.state_specs(config)
        self.encoder = EncoderGraph(self.model, self.memory_specs, self.state_specs).eval()
        self.with_attention = plugin.has_attention
        self.encoder_outputs = io_names(self.memory_specs, self.state_specs, False).encoder_outputs
        self.step_graph = StepGraph(self.model, self.memory_specs, self.state_specs, self.with_attention).eval()
        self.multi_graph = (MultiStepGraph(self.model, self.memory_specs, self.state_specs).eval()
                            if self.model.multi_step else None)
        self.multi_step = self.multi_graph is not None
        if self.multi_step and src_vocab is not None and not plugin.source_spec(config).is_features:
            self.source_in_target = source_in_target(src_vocab, tgt_vocab)
        self.decoder_start_id = tgt_vocab.decoder_start_id
        self.eos_id = tgt_vocab.eos_id
        self.vocab_size = len(tgt_vocab)
        self.unk_id = tgt_vocab.unk_id
        self.language_ids = tuple(sorted(tgt_vocab.languages))

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "device": str(self.device), "torch": torch.__version__}

    @torch.no_grad()
    def start(self, src: np.ndarray, src_len: np.ndarray, expand: int = 1, keep_attention: bool = False) -> DecodeRun:
        started = time.perf_counter()
        outputs = self.encoder(torch.from_numpy(src).to(self.device), torch.from_numpy(src_len).to(self.device))
        self.runtime_seconds += time.perf_counter() - started
        encoded = dict(zip(self.encoder_outputs, outputs, strict=True))
        sentences = src.shape[0]

        def tiled(value: torch.Tensor, times: int, dim: int) -> torch.Tensor:
            return value if times == 1 else value.repeat_interleave(times, dim=dim)

        def inputs(times: int) -> _RunInputs:
            memory = [tiled(encoded[m.name], times, m.batch_axis) for m in self.memory_specs]
            state = [tiled(encoded[init_name(s.name)], times, s.batch_axis) if s.init == "encoder"
                     else torch.zeros(s.zeros_shape(sentences * times), dtype=getattr(torch, s.dtype),
                                      device=self.device)
                     for s in self.state_specs]
            return memory, state

        return _TorchRun(self, sentences * expand, *inputs(expand),
                         functools.partial(inputs, 1) if expand > 1 else None, keep_attention)


class _TorchRun(DecodeRun):
    """``narrow`` makes the untiled memory and state, for a first step fed one row per sentence."""

    def __init__(self, backend: TorchBackend, rows: int, memory: list[torch.Tensor], state: list[torch.Tensor],
                 narrow: Callable[[], _RunInputs] | None, keep_attention: bool) -> None:
        self.backend = backend
        self.rows = rows
        self.memory = memory
        self.state = state
        self.narrow = narrow
        self.keep_attention = keep_attention
        self.position = 0
        self._attention: np.ndarray | None = None

    def step(self, tokens: np.ndarray, reorder: np.ndarray) -> np.ndarray:
        return self._run(tokens, reorder)[0].cpu().numpy()

    def step_top(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        values, ids = self._run(tokens, reorder, k)
        return values.cpu().numpy(), ids.cpu().numpy()

    @torch.no_grad()
    def _run(self, tokens: np.ndarray, reorder: np.ndarray, top_k: int | None = None) -> tuple[torch.Tensor, ...]:
        """Log-probs, or with ``top_k`` the top values and ids; the top-k is timed as runtime,
        as it is inside the ONNX graph."""
        device = self.backend.device
        memory, state = self.memory, self.state
        if self.narrow is not None and len(tokens) != self.rows:
            memory, state = self.narrow()
        self.narrow = None  # only a first step may be narrow
        started = time.perf_counter()
        outputs = self.backend.step_graph(
            torch.from_numpy(tokens.astype(np.int64, copy=False)).to(device),
            torch.tensor(self.position, dtype=torch.int64, device=device),
            torch.from_numpy(reorder.astype(np.int64, copy=False)).to(device),
            *memory, *state,
        )
        head = (outputs[0],) if top_k is None else tuple(torch.topk(outputs[0], top_k, dim=-1))
        self.backend.runtime_seconds += time.perf_counter() - started
        n_state = len(self.state)
        self.state = list(outputs[1 : 1 + n_state])
        if self.keep_attention and len(outputs) > 1 + n_state:
            self._attention = outputs[-1].cpu().numpy()
        self.position += 1
        return head

    def attention(self) -> np.ndarray | None:
        return self._attention

    def steps_top(self, tokens: np.ndarray, rollback: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        values, ids = self._multi(tokens, rollback, k)
        return values.cpu().numpy(), ids.cpu().numpy()

    def steps_log_probs(self, tokens: np.ndarray, rollback: int) -> np.ndarray:
        return self._multi(tokens, rollback)[0].cpu().numpy()

    @torch.no_grad()
    def _multi(self, tokens: np.ndarray, rollback: int, top_k: int | None = None) -> tuple[torch.Tensor, ...]:
        """One k-position step: the log-probs, or with ``top_k`` the top values and ids (timed as
        runtime, as in the ONNX graph)."""
        graph, device = self.backend.multi_graph, self.backend.device
        if graph is None:
            raise NotImplementedError("this model has no k-position step (multi_step)")
        started = time.perf_counter()
        outputs = graph(torch.from_numpy(tokens.astype(np.int64, copy=False)).to(device),
                        torch.tensor(self.position - rollback, dtype=torch.int64, device=device),
                        torch.tensor(rollback, dtype=torch.int64, device=device), *self.memory, *self.state)
        head = (outputs[0],) if top_k is None else tuple(torch.topk(outputs[0], top_k, dim=-1))
        self.backend.runtime_seconds += time.perf_counter() - started
        self.state = list(outputs[1:])
        self.position += tokens.shape[1] - rollback
        return head

    def close(self) -> None:
        """Nothing is pooled: PyTorch's caching allocator already reuses the tensors' memory."""


def torch_backend_for(
    manifest: Manifest, checkpoint: str | Path | None = None, device: str = "cpu"
) -> TorchBackend:
    """Rebuild the PyTorch original of an export from the checkpoint it was exported from."""
    plugin = exported_plugin(manifest.plugin, manifest.plugin_origin)
    recorded = manifest.checkpoint
    if checkpoint is None and recorded is None:
        raise CheckpointError(f"{manifest.directory} records no checkpoint: pass --checkpoint FILE")
    path = Path(checkpoint) if checkpoint else manifest.directory / recorded.file
    if checkpoint is None and not recorded.included:
        raise CheckpointError(f"{manifest.directory} was exported without its checkpoint: pass --checkpoint FILE "
                              f"(the one with sha256 {recorded.sha256[:16]}...)")
    if checkpoint is None and not path.is_file():
        raise CheckpointError(f"{path} is missing: restore it, or pass --checkpoint FILE")
    if checkpoint is None and sha256_of(path) != recorded.sha256:
        raise CheckpointError(f"{path} is not the checkpoint this folder was exported from (sha256 differs)")
    loaded = load_checkpoint(path)
    model = build_model(loaded, plugin)
    if loaded.tgt_vocab != manifest.tgt_vocab or loaded.src_vocab != manifest.src_vocab:
        raise CheckpointError(f"{path} has different vocabularies from the export in {manifest.directory}")
    return TorchBackend(plugin, model, loaded.config, loaded.tgt_vocab, device=device, src_vocab=loaded.src_vocab)
