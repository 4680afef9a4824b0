"""Export-time checks of what a plugin declares against what its graphs and model do.

- ``forward_step_comparison``: the step-by-step ``decode_step`` must compute what the
  teacher-forced ``forward`` (the function the model was trained with) computes. A cached step
  that forgets a layer (say the final LayerNorm) otherwise exports and passes ONNX parity.
- ``check_batch_axes``: each memory and state tensor's declared ``batch_axis`` must be the axis
  the graphs treat as the batch, and ``reorder`` must gather along it. A wrong axis otherwise
  decodes greedily and crashes at beam search, after deployment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from s2s_deploy.errors import S2SError
from s2s_deploy.format.names import TOP_K, init_name, past_name, present_name
from s2s_deploy.format.source import TOKEN_SOURCE, SourceSpec
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.modeling.contract import ArchitecturePlugin, MemorySpec, Seq2SeqModel, StateSpec
from s2s_deploy.modeling.plugin_errors import PluginError, call_plugin
from s2s_deploy.runtime.backend import Backend
from s2s_deploy.runtime.scoring import forced_tokens, teacher_forced
from s2s_deploy.verify.tolerance import NO_DIFF, StepDiff, StepTolerance

_ORT_ERRORS = (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidArgument,
               ort.capi.onnxruntime_pybind11_state.RuntimeException)
AXIS_BATCH = 5  # rows the axis check runs: odd and prime, unlikely to equal a model dimension
_PERMUTATION = np.array([3, 0, 4, 1, 2])


class ExportAxisError(S2SError):
    pass


class ExportStepError(S2SError):
    pass


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
    worst = NO_DIFF
    for step in teacher_forced([stepper], src, src_len, targets):
        live = step.live
        worst = worst.merge(tolerance.compare(whole[live, step.position], step.log_probs[0][live]))
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
    state: Sequence[StateSpec], src_vocab: int, tgt_vocab: int, source: SourceSpec = TOKEN_SOURCE,
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
                                      strict=True)), memory, state, src_vocab, source)
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
    state: Sequence[StateSpec], src_vocab: int, source: SourceSpec = TOKEN_SOURCE,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every encoder output's declared batch axis has the batch's size and permutes with the
    sentences. Run on the PyTorch encoder before tracing too: a wrong state axis would
    otherwise fail inside the exporter's trace, with a traceback instead of a line."""
    rng = np.random.default_rng(0)
    src_len = np.array([8, 7, 6, 8, 5], dtype=np.int64)
    src = random_source(source, src_vocab, AXIS_BATCH, 8, rng)
    plain, permuted = encode(src, src_len), encode(src[_PERMUTATION], src_len[_PERMUTATION])
    declared = [("memory", m.name, m.name, m.batch_axis) for m in memory]
    declared += [("state", s.name, init_name(s.name), s.batch_axis) for s in state if s.init == "encoder"]
    for kind, name, output, axis in declared:
        _follows(f"{kind} {name!r}", "the encoder's output", plain[output], permuted[output], axis, _PERMUTATION)
    return plain, permuted


@torch.no_grad()
def check_encoder_axes_torch(encoder: torch.nn.Module, names: Sequence[str], memory: Sequence[MemorySpec],
                             state: Sequence[StateSpec], src_vocab: int,
                             source: SourceSpec = TOKEN_SOURCE) -> None:
    def encode(src: np.ndarray, src_len: np.ndarray) -> dict[str, np.ndarray]:
        outputs = encoder(torch.from_numpy(src), torch.from_numpy(src_len))
        return {name: value.numpy() for name, value in zip(names, outputs, strict=True)}

    check_encoder_axes(encode, memory, state, src_vocab, source)


def random_source(source: SourceSpec, src_vocab: int, batch: int, length: int,
                  rng: np.random.Generator) -> np.ndarray:
    """``src`` of ``batch`` rows and ``length`` positions: ids past the specials, or normal features."""
    if source.is_features:
        return rng.standard_normal((batch, *source.item_shape(length))).astype(source.dtype)
    return rng.integers(4, src_vocab, (batch, length)).astype(np.int64)


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
    from s2s_deploy.modeling.torch_backend import TorchBackend
    from s2s_deploy.runtime.decoding import plain
    from s2s_deploy.runtime.ort.backend import create_session
    from s2s_deploy.runtime.search import greedy
    from s2s_deploy.runtime.translator import encode_batch

    memory, state = plugin.memory_specs(config), plugin.state_specs(config)
    source = plugin.source_spec(config)
    check_batch_axes(create_session(graph_paths[0], device="cpu"), create_session(graph_paths[1], device="cpu"),
                     memory, state, len(src_vocab), len(tgt_vocab), source)
    stepper = TorchBackend(plugin, model, config, tgt_vocab)
    limit = plugin.max_source_length(config)
    if source.is_features:
        src = random_source(source, len(src_vocab), 4, min(32, limit or 32), np.random.default_rng(0))
        src_len = (np.ones(4, dtype=np.int64) if source.length_axis is None else
                   np.array([src.shape[source.length_axis] - i for i in range(4)], dtype=np.int64))
    elif samples:
        src, src_len = encode_batch(list(samples[:16]), src_vocab, None)
        if limit is not None and src.shape[1] > limit:
            src, src_len = src[:, :limit], np.minimum(src_len, limit)
    else:
        rng = np.random.default_rng(0)
        src = rng.integers(4, len(src_vocab), (4, min(8, limit or 8))).astype(np.int64)
        src_len = np.full(4, src.shape[1], dtype=np.int64)
    max_len = min(plugin.max_target_length(config) or 64, 64) - 1
    targets = [h.tokens for h in greedy(stepper, src, src_len, plain(1, max_len))]
    return check_forward_step(plugin.name, model, stepper, src, src_len, targets, tolerance)


_SAME = {"rtol": 1e-3, "atol": 1e-4}  # float32 noise between batch shapes, far below any real disagreement


@torch.no_grad()
def check_model_torch(plugin: ArchitecturePlugin, model: Seq2SeqModel, config: Any, src_vocab: Vocabulary,
                      tgt_vocab: Vocabulary) -> None:
    """What the specs promise, held against ``encode`` and ``decode_step`` in PyTorch before any
    export, so a mistake reads as the spec it breaks instead of a failure deep in the exporter or
    ONNX Runtime: dtypes, zeros-state shapes, a state's shape across a step (``grow_axis``), the
    log-probs' width, two identical calls agreeing (dropout left on), no input changed in place,
    and a sentence's memory and first step not depending on the padding a longer batchmate adds."""
    label = f"plugin {plugin.name!r}"
    memory, state = plugin.memory_specs(config), plugin.state_specs(config)
    for spec in (*memory, *state):
        if not isinstance(getattr(torch, spec.dtype, None), torch.dtype):
            raise PluginError(f"{label}: {spec.name!r} declares dtype {spec.dtype!r}, which torch does not know; "
                              "likely fix: a torch dtype name such as 'float32'")
    for s in state:
        if s.init == "zeros" and s.grow_axis is not None and s.shape[s.grow_axis] != 0:
            empty = [i for i, size in enumerate(s.shape) if size == 0]
            fix = f"grow_axis={empty[0]}" if len(empty) == 1 else "the axis the cache grows along, with 0 there"
            raise PluginError(f"{label}: state {s.name!r} declares grow_axis={s.grow_axis}, but its shape "
                              f"{s.shape} holds {s.shape[s.grow_axis]} there, and a cache starts empty (0) on the "
                              f"axis it grows along; likely fix: {fix}")
    device = next(iter(model.parameters()), torch.empty(0)).device
    generator = torch.Generator().manual_seed(0)
    longest = min(9, plugin.max_source_length(config) or 9)
    source = plugin.source_spec(config)
    if source.is_features:
        src = torch.randn((3, *source.item_shape(longest)), generator=generator).to(getattr(torch, source.dtype))
        src = src.to(device)
    else:
        src = torch.randint(4, len(src_vocab), (3, longest), generator=generator).to(device)
    src_len = torch.tensor([longest, longest - 2, longest - 1], device=device)
    encoded = call_plugin(plugin.name, "encode()", model.encode, src, src_len)
    _same_calls(label, "encode()", encoded, call_plugin(plugin.name, "encode()", model.encode, src, src_len))
    for kind, spec in [("memory", m) for m in memory] + [("state", s) for s in state if s.init == "encoder"]:
        _check_dtype(label, f"encode() returns {kind} {spec.name!r}", spec.dtype, encoded[spec.name])
    batch = src.shape[0]
    mem = {m.name: encoded[m.name] for m in memory}
    first = _first_state(state, encoded, batch, device)
    tokens = torch.randint(4, len(tgt_vocab), (batch,), generator=generator).to(device)
    out = _step(plugin.name, model, tokens, 0, mem, first, state)
    _same_calls(label, "decode_step()", out, _step(plugin.name, model, tokens, 0, mem, first, state))
    _check_step(label, state, first, out, batch, len(tgt_vocab))
    _check_step(label, state, out.state, _step(plugin.name, model, tokens, 1, mem, out.state, state), batch,
                len(tgt_vocab))
    if source.length_axis is not None:  # fixed-size items are never padded
        pad = source.pad_value if source.is_features else src_vocab.pad_id
        _check_padding(plugin, model, memory, state, src, pad, tokens, source.length_axis)
    if getattr(model, "memory_per_sentence", False):
        _check_memory_per_sentence(plugin, model, memory, state, mem, out.state, tokens, len(tgt_vocab))


def _check_memory_per_sentence(plugin: ArchitecturePlugin, model: Seq2SeqModel, memory: Sequence[MemorySpec],
                               state: Sequence[StateSpec], mem: dict[str, torch.Tensor],
                               past: dict[str, torch.Tensor], first_tokens: torch.Tensor, vocab: int) -> None:
    """A model claiming ``memory_per_sentence`` must give rows grouped by sentence (3 each here)
    the same step on one memory row per sentence as on that memory repeated per row, within the
    plugin's own ONNX tolerance (the two differ only in the order of float32 sums)."""
    group = 3
    rows = {s.name: past[s.name].repeat_interleave(group, s.batch_axis) for s in state}
    tokens = (first_tokens.repeat_interleave(group) + torch.arange(group * len(first_tokens),
                                                                   device=first_tokens.device)) % vocab
    repeated = {m.name: mem[m.name].repeat_interleave(group, m.batch_axis) for m in memory}
    want = _step(plugin.name, model, tokens, 1, repeated, rows, state)
    label = f"plugin {plugin.name!r}: memory_per_sentence is claimed, but decode_step()"
    fix = ("likely fix: split the rows into (sentences, rows per sentence) against the memory's rows (as "
           "parts.grouped_queries does), or leave memory_per_sentence False")
    try:
        got = model.decode_step(tokens, torch.tensor(1, dtype=torch.int64, device=tokens.device), dict(mem),
                                {name: value.clone() for name, value in rows.items()})
    except Exception as exc:  # a plugin's own code: any failure is the claim failing
        raise PluginError(f"{label} fails on one memory row per {group} rows ({type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); {fix}") from exc
    log_probs = getattr(got, "log_probs", None)  # not a StepOutput here: a mismatch, not an AttributeError
    shape = tuple(getattr(log_probs, "shape", ()))
    diff = (float((log_probs - want.log_probs).abs().max()) if shape == tuple(want.log_probs.shape)
            else float("inf"))
    if not diff <= plugin.parity_atol:
        raise PluginError(f"{label} on one memory row per {group} rows differs from the same memory repeated per "
                          f"row by {diff:.2e} in log-probs (shape {shape}); {fix}")


def _first_state(state: Sequence[StateSpec], encoded: dict[str, torch.Tensor], batch: int,
                 device: torch.device) -> dict[str, torch.Tensor]:
    return {s.name: encoded[s.name] if s.init == "encoder" else
            torch.zeros(s.zeros_shape(batch, 0), dtype=getattr(torch, s.dtype), device=device) for s in state}


def _step(plugin: str, model: Seq2SeqModel, tokens: torch.Tensor, position: int, memory: dict[str, torch.Tensor],
          past: dict[str, torch.Tensor], state: Sequence[StateSpec]) -> Any:
    """One ``decode_step`` on copies, so that a step writing into its inputs is caught rather than
    spoiling the comparison that follows; what it returns must be a StepOutput holding every state."""
    copies = {name: value.clone() for name, value in past.items()}
    step = torch.tensor(position, dtype=torch.int64, device=tokens.device)
    fed = ", ".join(f"{s.name} {'zeros ' if s.init == 'zeros' and position == 0 else ''}"
                    f"{tuple(past[s.name].shape)}" for s in state)
    hint = ("make each zeros state's shape in state_specs the shape decode_step reads, with 0 on its grow_axis"
            if position == 0 and any(s.init == "zeros" for s in state) else None)
    out = call_plugin(plugin, f"decode_step() at step {position} (fed state {fed})", model.decode_step, tokens,
                      step, dict(memory), copies, hint=hint)
    label = f"plugin {plugin!r}"
    for name, value in past.items():
        if not torch.equal(copies[name], value):
            raise PluginError(f"{label}: decode_step() changes its input state {name!r} in place; a beam search "
                              "reuses it for other hypotheses; likely fix: return new tensors (torch.cat, not "
                              "slice assignment)")
    if not hasattr(out, "log_probs") or not isinstance(getattr(out, "state", None), Mapping):
        raise PluginError(f"{label}: decode_step() returned {type(out).__name__}, not a StepOutput(log_probs, "
                          "state); likely fix: return StepOutput(log_probs, {name: next value})")
    missing = [s.name for s in state if s.name not in out.state]
    if missing:
        raise PluginError(f"{label}: decode_step() returned no state {missing[0]!r} (it returned "
                          f"{', '.join(map(repr, out.state)) or 'none'}); likely fix: return every state_specs "
                          "name, each with its next value, in StepOutput.state")
    return out


def _check_step(label: str, state: Sequence[StateSpec], past: dict[str, torch.Tensor], out: Any, batch: int,
                vocab: int) -> None:
    log_probs = out.log_probs
    if not isinstance(log_probs, torch.Tensor) or tuple(log_probs.shape) != (batch, vocab):
        shape = tuple(log_probs.shape) if isinstance(log_probs, torch.Tensor) else type(log_probs).__name__
        fix = ("size the output layer with tgt_vocab_size in build() (are src_vocab_size and tgt_vocab_size "
               "swapped?)" if isinstance(log_probs, torch.Tensor) and log_probs.dim() == 2 and
               log_probs.shape[0] == batch else "return (batch, target vocabulary) log-probs for the one position")
        raise PluginError(f"{label}: decode_step() returns log_probs of shape {shape}, not ({batch}, {vocab}) for "
                          f"{batch} rows and a target vocabulary of {vocab}; likely fix: {fix}")
    _check_dtype(label, "decode_step() returns log_probs", "float32", log_probs)
    for s in state:
        before, after = tuple(past[s.name].shape), tuple(out.state[s.name].shape)
        _check_dtype(label, f"decode_step() returns state {s.name!r}", s.dtype, out.state[s.name])
        changed = (None if len(before) != len(after) else
                   [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b])
        if changed == ([] if s.grow_axis is None else [s.grow_axis]) and (
                s.grow_axis is None or after[s.grow_axis] == before[s.grow_axis] + 1):
            continue
        where = f"{label}: state {s.name!r} enters a step as {before} and decode_step() returns {after}"
        if changed and len(changed) == 1 and after[changed[0]] == before[changed[0]] + 1:
            declared = "no grow_axis" if s.grow_axis is None else f"grow_axis={s.grow_axis}"
            raise PluginError(f"{where}: it grows along axis {changed[0]}, but its spec declares {declared}; "
                              f"likely fix: grow_axis={changed[0]}")
        if s.grow_axis is not None and not changed:
            raise PluginError(f"{where}: it does not grow along its grow_axis {s.grow_axis}; likely fix: "
                              "grow_axis=None, or append the step to the cache")
        fix = (f"shape={_spec_shape(after, s.batch_axis)} in its spec" if s.init == "zeros" and s.grow_axis is None
               else "keep a state's shape across a step, except one more entry along its grow_axis")
        raise PluginError(f"{where}; likely fix: {fix}")


def _spec_shape(shape: tuple[int, ...], batch_axis: int) -> tuple[int | str, ...]:
    return tuple("batch" if i == batch_axis else size for i, size in enumerate(shape))


def _check_dtype(label: str, what: str, declared: str, tensor: Any) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise PluginError(f"{label}: {what} as {type(tensor).__name__}, not a tensor; likely fix: return torch "
                          "tensors")
    if tensor.dtype != getattr(torch, declared):
        fix = ("leave the model in float32 (no .double() or torch.set_default_dtype in build())"
               if tensor.dtype == torch.float64 else f"dtype={str(tensor.dtype).removeprefix('torch.')!r} in its spec"
               if declared != "float32" or "log_probs" not in what else "return float32 log-probs")
        raise PluginError(f"{label}: {what} as {str(tensor.dtype).removeprefix('torch.')}, but {declared} is "
                           f"declared (export runs in it); likely fix: {fix}")


def _same_calls(label: str, what: str, first: Any, second: Any) -> None:
    """Two identical calls must agree: dropout or sampling left on in eval mode makes every
    comparison with ONNX Runtime (and every translation) a coin toss."""
    pairs = (zip(first.values(), second.values(), strict=True) if isinstance(first, Mapping) else
             [(first.log_probs, second.log_probs), *zip(first.state.values(), second.state.values(), strict=True)])
    worst = max((float((a.double() - b.double()).abs().max()) for a, b in pairs if a.numel()), default=0.0)
    if not worst <= 1e-6:
        raise PluginError(f"{label}: two identical {what} calls disagree by {worst:.3g}, though the model is in "
                           "eval mode; likely fix: let dropout and sampling follow self.training (nn.Dropout, or "
                           "F.dropout(x, p, self.training))")


def _check_padding(plugin: ArchitecturePlugin, model: Seq2SeqModel, memory: Sequence[MemorySpec],
                   state: Sequence[StateSpec], src: torch.Tensor, pad: float, tokens: torch.Tensor,
                   axis: int = 1) -> None:
    """A sentence encoded alone and padded beside a longer one must give the same memory on its
    real positions and the same first step: otherwise its translation depends on its batchmates.
    ``axis``: the source's length axis (the frames of features), ``pad`` what fills it."""
    label = f"plugin {plugin.name!r}"
    longest = src.shape[axis]
    short = max(1, longest - 4)
    alone_src = src[:1].narrow(axis, 0, short)
    padded = src[:2].clone()
    padded[0].narrow(axis - 1, short, longest - short).fill_(pad)
    lengths = torch.tensor([short, longest], device=src.device)
    alone = call_plugin(plugin.name, "encode()", model.encode, alone_src, lengths[:1])
    pair = call_plugin(plugin.name, "encode()", model.encode, padded, lengths)
    declared = [("memory", m) for m in memory] + [("state", s) for s in state if s.init == "encoder"]
    for kind, spec in declared:
        worst = _row_difference(alone[spec.name], pair[spec.name], spec.batch_axis)
        if worst is not None and worst > 0:
            raise PluginError(f"{label}: encode() reads padding: {kind} {spec.name!r} of a {short}-token sentence "
                               f"differs by {worst:.3g} on its real positions when a {longest}-token batchmate "
                               "pads it, so a translation would depend on its batchmates; likely fix: mask positions "
                               "at or beyond src_len (attention masks, pooling, packed RNNs)")
    steps = []
    for encoded, rows in ((alone, 1), (pair, 2)):
        mem = {m.name: encoded[m.name] for m in memory}
        past = _first_state(state, encoded, rows, src.device)
        steps.append(call_plugin(plugin.name, "decode_step()", model.decode_step, tokens[:rows],
                                 torch.tensor(0, device=src.device), mem, past))
    outputs = [("log-probs", steps[0].log_probs, steps[1].log_probs, 0)]
    outputs += [(f"state {s.name!r}", steps[0].state[s.name], steps[1].state[s.name], s.batch_axis) for s in state]
    for what, single, batched, axis in outputs:
        worst = _row_difference(single, batched, axis)
        if worst is not None and worst > 0:
            raise PluginError(f"{label}: decode_step() reads source padding: after the first step of a {short}-token "
                              f"sentence, its {what} differ by {worst:.3g} when a {longest}-token batchmate pads "
                              "it; likely fix: mask source positions at or beyond src_len in attention")


def _row_difference(alone: torch.Tensor, pair: torch.Tensor, batch_axis: int) -> float | None:
    """Beyond tolerance, how far row 0 of ``pair`` is from ``alone`` on the positions ``alone``
    has (axes that differ in size are the source's); None when the shapes cannot be aligned, 0 when close."""
    row = pair.narrow(batch_axis, 0, 1)
    if row.dim() != alone.dim() or any(a > b for a, b in zip(alone.shape, row.shape, strict=True)):
        return None
    for axis, size in enumerate(alone.shape):
        row = row.narrow(axis, 0, size)
    a, b = alone.double(), row.double()
    if torch.allclose(a, b, rtol=_SAME["rtol"], atol=_SAME["atol"], equal_nan=True):
        return 0.0
    return float((a - b).abs().nan_to_num(posinf=float("inf")).max())
