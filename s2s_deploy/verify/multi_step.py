"""Export-time checks of the k-position decoder step (``decoder_multi.onnx``) against what it replaces.

Speculative greedy is only worth having if it picks what plain greedy picks, so the k-position
graph is held, in ONNX Runtime, to the one-position graph stepped k times (with a rollback in the
middle, as a rejected draft leaves it), and, in PyTorch, to the teacher-forced ``forward``. The
largest log-prob difference against the single steps is recorded in the manifest
(``validation.multi_step_max_abs_diff``): the search's acceptance margin is read from it
(runtime/speculative.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from s2s_deploy.errors import S2SError
from s2s_deploy.format.names import ROLLBACK, TOP_K
from s2s_deploy.modeling.contract import MemorySpec, Seq2SeqModel, StateSpec
from s2s_deploy.verify.tolerance import NO_DIFF, StepDiff, StepTolerance

POSITIONS = 7
"""Target positions the check feeds: one call of 4, then 2 rolled back and 5 more."""
CHUNKS = ((0, 4, 0), (2, POSITIONS, 2))
"""(first position, end, positions rolled back before it) of each k-position call."""


class ExportMultiStepError(S2SError):
    pass


def check_multi_step(
    label: str, model: Seq2SeqModel, paths: tuple[Path, Path, Path], memory: Sequence[MemorySpec],
    state: Sequence[StateSpec], src: np.ndarray, src_len: np.ndarray, tgt_vocab_size: int,
    tolerance: StepTolerance,
) -> StepDiff:
    """Fatal unless the k-position graph matches k single steps (ONNX Runtime, both graphs) and
    ``forward`` matches the model's ``decode_steps`` (PyTorch). ``paths``: encoder, decoder and
    k-position decoder. Returns the difference against the single steps."""
    from s2s_deploy.runtime.ort.backend import create_session

    encoder, single, multi = (create_session(path, device="cpu") for path in paths)
    names = [o.name for o in encoder.get_outputs()]
    encoded = dict(zip(names, encoder.run(names, {"src": src, "src_len": src_len}), strict=True))
    rows = len(src)
    tokens = np.random.default_rng(1).integers(4, tgt_vocab_size, (rows, POSITIONS)).astype(np.int64)
    mem = {m.name: encoded[m.name] for m in memory}
    first = [encoded[s.encoder_output] if s.encoder_output else np.zeros(s.zeros_shape(rows, 0), dtype=s.dtype)
             for s in state]
    accepted = {i.name for i in single.get_inputs()}
    past, singles = first, []
    for t in range(POSITIONS):
        feeds = {"tokens": tokens[:, t], "step": np.array(t, dtype=np.int64), "reorder": np.arange(rows), **mem,
                 **{s.decoder_input: value for s, value in zip(state, past, strict=True)},
                 TOP_K: np.array([1], dtype=np.int64)}
        out = single.run(["log_probs", *(s.decoder_output for s in state)],
                         {name: value for name, value in feeds.items() if name in accepted})
        singles.append(out[0])
        past = out[1:]
    diff, past = NO_DIFF, first
    for start, end, rollback in CHUNKS:
        feeds = {"tokens": tokens[:, start:end], "step": np.array(start, dtype=np.int64),
                 ROLLBACK: np.array(rollback, dtype=np.int64), **mem,
                 **{s.decoder_input: value for s, value in zip(state, past, strict=True)},
                 TOP_K: np.array([1], dtype=np.int64)}
        out = multi.run(["log_probs", *(s.decoder_output for s in state)], feeds)
        for j in range(end - start):
            diff = diff.merge(tolerance.compare(singles[start + j], out[0][:, j]))
        past = out[1:]
    if diff.worst > 1.0:
        raise ExportMultiStepError(
            f"plugin {label}: the k-position step differs from k single steps by {diff.max_abs_diff:.3g} in log-prob "
            f"(allowed {tolerance.atol:g} + {tolerance.rtol:g}*|log p|): decode_steps does not compute what "
            "decode_step does")
    _check_forward(label, model, memory, state, src, src_len, tokens, tolerance)
    return diff


@torch.no_grad()
def _check_forward(label: str, model: Seq2SeqModel, memory: Sequence[MemorySpec], state: Sequence[StateSpec],
                   src: np.ndarray, src_len: np.ndarray, tokens: np.ndarray, tolerance: StepTolerance) -> None:
    """``decode_steps`` over every position at once against the teacher-forced ``forward``."""
    src_t, len_t, tgt = torch.from_numpy(src), torch.from_numpy(src_len), torch.from_numpy(tokens)
    whole = torch.log_softmax(model(src_t, len_t, tgt).float(), dim=-1).numpy()
    encoded = model.encode(src_t, len_t)
    first = {s.name: encoded[s.name] if s.init == "encoder" else torch.zeros(s.zeros_shape(len(src), 0))
             for s in state}
    out = model.decode_steps(tgt, torch.tensor(0), {m.name: encoded[m.name] for m in memory}, first)
    diff = tolerance.compare(whole.reshape(-1, whole.shape[-1]), out.log_probs.numpy().reshape(-1, whole.shape[-1]))
    if diff.worst > 1.0:
        raise ExportMultiStepError(
            f"plugin {label}: decode_steps differs from the teacher-forced forward by {diff.max_abs_diff:.3g} in "
            "log-prob: the k-position step does not compute what the model was trained with")
