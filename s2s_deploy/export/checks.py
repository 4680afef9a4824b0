"""Export-time checks of what a plugin declares against what its graphs and model do.

- ``forward_step_comparison``: the step-by-step ``decode_step`` must compute what the
  teacher-forced ``forward`` (the function the model was trained with) computes. A cached step
  that forgets a layer (say the final LayerNorm) otherwise exports and passes ONNX parity.
- ``check_batch_axes``: each memory and state tensor's declared ``batch_axis`` must be the axis
  the graphs treat as the batch, and ``reorder`` must gather along it. A wrong axis otherwise
  decodes greedily and crashes at beam search, after deployment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from s2s_deploy.errors import S2SError
from s2s_deploy.export.contract import ArchitecturePlugin, MemorySpec, Seq2SeqModel, StateSpec
from s2s_deploy.export.tolerance import NO_DIFF, StepDiff, StepTolerance
from s2s_deploy.format.names import TOP_K, init_name, past_name, present_name
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.runtime.backend import Backend

_ORT_ERRORS = (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidArgument,
               ort.capi.onnxruntime_pybind11_state.RuntimeException)
AXIS_BATCH = 5  # rows the axis check runs: odd and prime, unlikely to equal a model dimension
_PERMUTATION = np.array([3, 0, 4, 1, 2])


class ExportAxisError(S2SError):
    pass


class ExportStepError(S2SError):
    pass


def forced_tokens(start: int, eos: int, targets: Sequence[Sequence[int]]) -> np.ndarray:
    """``(batch, steps)``: the start token, each target, then EOS (and EOS padding)."""
    steps = max(len(t) for t in targets) + 1
    forced = np.full((len(targets), steps), eos, dtype=np.int64)
    forced[:, 0] = start
    for row, tokens in enumerate(targets):
        forced[row, 1 : 1 + len(tokens)] = tokens
    return forced


@torch.no_grad()
def forward_step_comparison(
    model: Seq2SeqModel, stepper: Backend, src: np.ndarray, src_len: np.ndarray,
    targets: Sequence[Sequence[int]], tolerance: StepTolerance,
) -> StepDiff:
    """Teacher-forced ``forward`` against ``stepper`` (the same model's ``decode_step``, one
    position at a time) on the same tokens, each row up to and including its EOS."""
    forced = forced_tokens(stepper.decoder_start_id, stepper.eos_id, targets)
    device = next(model.parameters()).device
    logits = model(torch.from_numpy(src).to(device), torch.from_numpy(src_len).to(device),
                   torch.from_numpy(forced).to(device))
    whole = torch.log_softmax(logits.float(), dim=-1).cpu().numpy()
    reorder = np.arange(len(targets), dtype=np.int64)
    worst = NO_DIFF
    with stepper.start(src, src_len) as run:
        for t in range(forced.shape[1]):
            stepped = run.step(forced[:, t], reorder)
            rows = [i for i, tokens in enumerate(targets) if t <= len(tokens)]
            worst = worst.merge(tolerance.compare(whole[rows, t], stepped[rows]))
    return worst


def check_forward_step(
    label: str, model: Seq2SeqModel, stepper: Backend, src: np.ndarray, src_len: np.ndarray,
    targets: Sequence[Sequence[int]], tolerance: StepTolerance,
) -> StepDiff:
    diff = forward_step_comparison(model, stepper, src, src_len, targets, tolerance)
    if diff.worst > 1.0:
        raise ExportStepError(
            f"plugin {label}: decode_step differs from the teacher-forced forward by {diff.max_abs_diff:.3g} in "
            f"log-prob (allowed {tolerance.atol:g} + {tolerance.rtol:g}*|log p|): the cached step does not compute "
            "what the model was trained with")
    return diff


def check_batch_axes(
    encoder: ort.InferenceSession, decoder: ort.InferenceSession, memory: Sequence[MemorySpec],
    state: Sequence[StateSpec], src_vocab: int, tgt_vocab: int,
) -> None:
    """Run the ONNX graphs on ``AXIS_BATCH`` distinct sentences, then on the same sentences
    permuted: every declared batch axis must have the batch's size and permute with it, and a
    step fed ``reorder = p`` must equal a step fed its state already permuted along the
    declared axes. ``encoder`` and ``decoder`` are ONNX Runtime sessions."""
    rng = np.random.default_rng(0)
    batch, perm = AXIS_BATCH, _PERMUTATION
    enc_names = [o.name for o in encoder.get_outputs()]
    plain, permuted = check_encoder_axes(
        lambda src, src_len: dict(zip(enc_names, encoder.run(enc_names, {"src": src, "src_len": src_len}),
                                      strict=True)), memory, state, src_vocab)
    accepted = {i.name for i in decoder.get_inputs()}
    dec_names = ["log_probs", *(present_name(s.name) for s in state)]

    def step(rows: np.ndarray, past: dict[str, np.ndarray], reorder: np.ndarray, encoded: dict[str, np.ndarray],
             position: int) -> dict[str, np.ndarray]:
        feeds = {"tokens": tokens[position][rows], "step": np.array(position, dtype=np.int64), "reorder": reorder,
                 TOP_K: np.ones(1, dtype=np.int64), **{m.name: encoded[m.name] for m in memory},
                 **{past_name(s.name): past[s.name] for s in state}}
        try:
            values = decoder.run(dec_names, {k: v for k, v in feeds.items() if k in accepted})
        except _ORT_ERRORS as exc:
            raise ExportAxisError(f"decoder step fails on {batch} rows with the declared batch axes "
                                  f"({_axes(memory, state)}): {str(exc).splitlines()[0]}") from exc
        return dict(zip(dec_names, values, strict=True))

    tokens = rng.integers(4, tgt_vocab, (2, batch)).astype(np.int64)
    identity = np.arange(batch, dtype=np.int64)
    first = {s.name: plain[init_name(s.name)] if s.init == "encoder" else
             np.zeros(s.zeros_shape(batch, 0), dtype=s.dtype) for s in state}
    after = step(identity, first, identity, plain, 0)  # one step in, so the state differs per row
    past = {s.name: after[present_name(s.name)] for s in state}
    base = step(identity, past, identity, plain, 1)
    moved = step(perm, {s.name: np.take(past[s.name], perm, axis=s.batch_axis) for s in state}, identity,
                 permuted, 1)
    _follows("log_probs", "the decoder's output", base["log_probs"], moved["log_probs"], 0, perm,
             cause=f"permuting every memory and state tensor along its declared batch axis ({_axes(memory, state)})")
    for s in state:
        _follows(f"state {s.name!r}", "present_" + s.name, base[present_name(s.name)],
                 moved[present_name(s.name)], s.batch_axis, perm)
    gathered = step(perm, past, perm.astype(np.int64), permuted, 1)  # the graph's reorder does the permuting
    for name in dec_names:
        if not np.allclose(gathered[name], moved[name], rtol=1e-3, atol=1e-4):
            raise ExportAxisError(f"{name}: a step fed reorder=p differs from one fed its state permuted by p along "
                                  "the declared batch axes: reorder does not gather along them")


def check_encoder_axes(
    encode: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]], memory: Sequence[MemorySpec],
    state: Sequence[StateSpec], src_vocab: int,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every encoder output's declared batch axis has the batch's size and permutes with the
    sentences. Run on the PyTorch encoder before tracing too: a wrong state axis would
    otherwise fail inside the exporter's trace, with a traceback instead of a line."""
    rng = np.random.default_rng(0)
    src = rng.integers(4, src_vocab, (AXIS_BATCH, 8)).astype(np.int64)
    src_len = np.array([8, 7, 6, 8, 5], dtype=np.int64)
    plain, permuted = encode(src, src_len), encode(src[_PERMUTATION], src_len[_PERMUTATION])
    declared = [("memory", m.name, m.name, m.batch_axis) for m in memory]
    declared += [("state", s.name, init_name(s.name), s.batch_axis) for s in state if s.init == "encoder"]
    for kind, name, output, axis in declared:
        _follows(f"{kind} {name!r}", "the encoder's output", plain[output], permuted[output], axis, _PERMUTATION)
    return plain, permuted


@torch.no_grad()
def check_encoder_axes_torch(encoder: torch.nn.Module, names: Sequence[str], memory: Sequence[MemorySpec],
                             state: Sequence[StateSpec], src_vocab: int) -> None:
    def encode(src: np.ndarray, src_len: np.ndarray) -> dict[str, np.ndarray]:
        outputs = encoder(torch.from_numpy(src), torch.from_numpy(src_len))
        return {name: value.numpy() for name, value in zip(names, outputs, strict=True)}

    check_encoder_axes(encode, memory, state, src_vocab)


def _axes(memory: Sequence[MemorySpec], state: Sequence[StateSpec]) -> str:
    return ", ".join(f"{spec.name}: {spec.batch_axis}" for spec in (*memory, *state))


def _follows(label: str, what: str, plain: np.ndarray, permuted: np.ndarray, axis: int, perm: np.ndarray,
             cause: str = "permuting the sentences") -> None:
    batch = len(perm)
    if axis >= plain.ndim or plain.shape[axis] != batch:
        raise ExportAxisError(f"{label}: declared batch_axis {axis}, but {what} has shape {tuple(plain.shape)} "
                              f"for a batch of {batch}")
    if not np.allclose(np.take(plain, perm, axis=axis), permuted, rtol=1e-3, atol=1e-4):
        raise ExportAxisError(f"{label}: declared batch_axis {axis}, but {cause} does not permute {what} "
                              "along it")


def run_export_checks(
    plugin: ArchitecturePlugin, model: Seq2SeqModel, config: Any, src_vocab: Vocabulary, tgt_vocab: Vocabulary,
    graph_paths: tuple[Path, Path], samples: Sequence[str], tolerance: StepTolerance,
) -> StepDiff:
    """Both checks on a fresh export; fatal on failure. The forward/step check decodes the
    samples greedily in PyTorch (random sources when there are none) and teacher-forces the result."""
    from s2s_deploy.export.torch_backend import TorchBackend
    from s2s_deploy.runtime.decoding import SearchConfig
    from s2s_deploy.runtime.ort.backend import create_session
    from s2s_deploy.runtime.search import greedy
    from s2s_deploy.runtime.translator import encode_batch

    memory, state = plugin.memory_specs(config), plugin.state_specs(config)
    check_batch_axes(create_session(graph_paths[0], device="cpu"), create_session(graph_paths[1], device="cpu"),
                     memory, state, len(src_vocab), len(tgt_vocab))
    stepper = TorchBackend(plugin, model, config, tgt_vocab)
    limit = plugin.max_source_length(config)
    if samples:
        src, src_len = encode_batch(list(samples[:16]), src_vocab, None)
        if limit is not None and src.shape[1] > limit:
            src, src_len = src[:, :limit], np.minimum(src_len, limit)
    else:
        rng = np.random.default_rng(0)
        src = rng.integers(4, len(src_vocab), (4, min(8, limit or 8))).astype(np.int64)
        src_len = np.full(4, src.shape[1], dtype=np.int64)
    max_len = min(plugin.max_target_length(config) or 64, 64) - 1
    targets = [h.tokens for h in greedy(stepper, src, src_len, SearchConfig(1, 1, max_len))]
    return check_forward_step(plugin.name, model, stepper, src, src_len, targets, tolerance)
