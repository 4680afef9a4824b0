"""The search of generate.onnx as ONNX functions, written with onnxscript.

Why functions: each is one step of ``runtime/search.py`` as ops, small enough to read against
it; ``transforms/fuse.py`` calls them from the graph it assembles and inlines them, so the saved
graph has default-domain ops only. onnxscript stays off the base install, so ``fuse`` reads them
compiled, from ``transforms/search_graph.onnx``: ``python -m s2s_deploy.export.search_graph``
rewrites that file, and ``tests/test_fuse.py`` checks that it is current.

Special ids, the vocabulary's id row and step-invariant shapes arrive as inputs (made once in
the outer graph) rather than attributes, so nothing in a Loop body casts a constant per step.
Scores are summed in float64; ``TopK`` breaks ties toward the lower index, as the engine's
stable sorts do.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, numpy_helper
from onnxscript import BOOL, DOUBLE, FLOAT, INT64, script
from onnxscript import opset18 as op

DOMAIN = "s2s_deploy.search"
_F64, _F32, _I64, _I32 = TensorProto.DOUBLE, TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
_NO_INT64 = numpy_helper.from_array(np.zeros(0, np.int64))
_NO_FLOAT = numpy_helper.from_array(np.zeros(0, np.float32))
_MINUS_INF32 = numpy_helper.from_array(np.array(-np.inf, np.float32))
_MINUS_INF64 = numpy_helper.from_array(np.array(-np.inf, np.float64))
_FIRST = -(2**63)


@script(default_opset=op)
def length_penalty(length: INT64, alpha: FLOAT) -> DOUBLE:
    """``L ** alpha`` in float64, as ``search.normalised`` computes it."""
    return op.Pow(op.Cast(length, to=_F64), op.Cast(alpha, to=_F64))


@script(default_opset=op)
def forbid_early_eos(log_probs: FLOAT, step: INT64, min_len: INT64, eos_onehot: BOOL) -> FLOAT:
    """EOS is impossible before ``min_len`` tokens."""
    return op.Where(op.And(eos_onehot, op.Less(step, min_len)), op.Constant(value=_MINUS_INF32), log_probs)


@script(default_opset=op)
def suppressed_ids(suppress_tokens: INT64, vocab_ids: INT64) -> BOOL:
    """A ``(V,)`` mask of the ids never produced."""
    hits = op.Equal(op.Unsqueeze(suppress_tokens, op.Constant(value_ints=[1])), op.Unsqueeze(vocab_ids, [0]))
    return op.Greater(op.ReduceSum(op.Cast(hits, to=_I64), op.Constant(value_ints=[0]), keepdims=0),
                      op.Constant(value_int=0))


@script(default_opset=op)
def apply_options(log_probs: FLOAT, masked: FLOAT, step: INT64, max_len: INT64, suppressed: BOOL, prefix: INT64,
                  forced_eos: BOOL, forced_bos: INT64, vocab_ids: INT64, eos: INT64) -> FLOAT:
    """Suppressed ids, then a forced token at a prefix step, at step 0 with ``forced_bos`` (>= 0)
    and no prefix, or with ``forced_eos`` at the last step: as runtime/options.py does, every
    other token becomes impossible, a prefix token keeps the model's log-prob, and a forced BOS
    or EOS scores 0 (as Hugging Face's generate)."""
    minus_inf = op.Constant(value=_MINUS_INF32)
    masked = op.Where(suppressed, minus_inf, masked)
    zero = op.Constant(value_int=0)
    prefix_len = op.Squeeze(op.Shape(prefix), op.Constant(value_ints=[0]))
    padded = op.Concat(prefix, op.Unsqueeze(eos, op.Constant(value_ints=[0])), axis=0)  # index p is EOS
    in_prefix = op.Less(step, prefix_len)
    at_end = op.And(forced_eos, op.Equal(step, op.Sub(max_len, op.Constant(value_int=1))))
    at_bos = op.And(op.And(op.Equal(step, zero), op.Equal(prefix_len, zero)), op.GreaterOrEqual(forced_bos, zero))
    token = op.Where(at_bos, forced_bos, op.Gather(padded, op.Min(step, prefix_len)))
    scored = op.Where(in_prefix, log_probs, op.Constant(value_float=0.0))
    forced = op.Where(op.Equal(vocab_ids, token), scored, minus_inf)
    return op.Where(op.Or(op.Or(in_prefix, at_end), at_bos), forced, masked)


@script(default_opset=op)
def greedy_step(log_probs: FLOAT, done: BOOL, picks: INT64, pick_lps: FLOAT, eos: INT64):
    """Arg-max (ties to the lower id) and the done flags; the picks are recorded, and lengths and
    scores come from them after the Loop. Returns the Loop condition first."""
    best, best_id = op.TopK(log_probs, op.Constant(value_ints=[1]), axis=1)
    flat = op.Constant(value_ints=[-1])
    tokens = op.Reshape(best_id, flat)
    done = op.Or(done, op.Equal(tokens, eos))
    searching = op.Equal(op.ReduceMin(op.Cast(done, to=_I32), keepdims=0), op.Constant(value=numpy_helper.from_array(
        np.array(0, np.int32))))
    return (searching, tokens, done, op.Concat(picks, tokens, axis=0),
            op.Concat(pick_lps, op.Reshape(best, flat), axis=0))


@script(default_opset=op)
def mask_after(tokens: INT64, lps: FLOAT, length: INT64, pad: INT64):
    """Pad ids and zero log-probs past each hypothesis' length (last axis)."""
    steps = op.Squeeze(op.Shape(tokens, start=-1), op.Constant(value_ints=[0]))
    position = op.Range(op.Constant(value_int=0), steps, op.Constant(value_int=1))
    inside = op.Less(position, op.Unsqueeze(length, op.Constant(value_ints=[-1])))
    return op.Where(inside, tokens, pad), op.Where(inside, lps, op.Constant(value_float=0.0))


@script(default_opset=op)
def greedy_outputs(picks: INT64, pick_lps: FLOAT, done: BOOL, batch: INT64, alpha: FLOAT, eos: INT64, pad: INT64):
    """The outputs from the per-step picks: lengths end at the first EOS, and the float64 score
    sums are taken once here, not carried through the Loop."""
    per_step = op.Concat(op.Constant(value_ints=[-1]), batch, axis=0)
    history = op.Transpose(op.Reshape(picks, per_step), perm=[1, 0])
    history_lp = op.Transpose(op.Reshape(pick_lps, per_step), perm=[1, 0])
    steps = op.Shape(history, start=1)
    first_eos = op.ArgMax(op.Cast(op.Equal(history, eos), to=_I32), axis=1, keepdims=0)
    length = op.Where(done, op.Add(first_eos, op.Constant(value_int=1)), op.Expand(steps, batch))
    tokens, lps = mask_after(history, history_lp, length, pad)
    score = op.Div(op.ReduceSum(op.Cast(lps, to=_F64), op.Constant(value_ints=[1]), keepdims=0),
                   length_penalty(length, alpha))
    one = op.Constant(value_ints=[1])
    return (op.Unsqueeze(tokens, one), op.Unsqueeze(op.Cast(score, to=_F32), one), op.Unsqueeze(length, one),
            op.Unsqueeze(lps, one))


@script(default_opset=op)
def first_k(value, k: INT64):
    """The first ``k`` columns: the top-K of the 2K ranked candidates."""
    return op.Slice(value, op.Constant(value_ints=[0]), k, op.Constant(value_ints=[1]))


@script(default_opset=op)
def beam_step(log_probs: FLOAT, step: INT64, scores: DOUBLE, fin_count: INT64, kept: DOUBLE, active: BOOL,
              parents: INT64, tokens_rec: INT64, lps_rec: FLOAT, eos_scores: DOUBLE, eos_rows: INT64,
              eos_lps: FLOAT, k: INT64, k2: INT64, width: INT64, rank: INT64, base: INT64, grid_shape: INT64,
              per_sentence: INT64, alpha: FLOAT, eos: INT64):
    """One beam step, recorded as ``search._Trail`` does: the parent row and token of each live
    beam and the EOS candidates that finished; nothing is copied or merged per step. Returns the
    Loop condition, then the carried values in ``_BEAM_CARRIED`` order."""
    flat = op.Constant(value_ints=[-1])
    minus_inf = op.Constant(value=_MINUS_INF64)
    # The best 2K of K*V candidates lie among each row's own best 2K: rank those only,
    # beam-major then by rank, so TopK's lower-index ties go to the lower beam, then id.
    row_lp, row_ids = op.TopK(log_probs, width, axis=1)
    grid = op.Reshape(op.Cast(row_lp, to=_F64), grid_shape)
    candidates = op.Reshape(op.Add(op.Unsqueeze(scores, op.Constant(value_ints=[2])), grid), per_sentence)
    top_scores, top = op.TopK(candidates, k2, axis=1)
    origin = op.Div(top, width)
    token = op.GatherElements(op.Reshape(row_ids, per_sentence), top, axis=1)
    token_lp = op.GatherElements(op.Reshape(row_lp, per_sentence), top, axis=1)
    is_eos = op.And(op.Equal(token, eos), op.Greater(top_scores, minus_inf))
    # EOS candidates ranked within the top K finish (for sentences still searching)
    finishing = op.And(first_k(is_eos, k), op.Unsqueeze(active, op.Constant(value_ints=[1])))
    count = op.Add(fin_count, op.ReduceSum(op.Cast(finishing, to=_I64), op.Constant(value_ints=[1]), keepdims=0))
    # the first K non-EOS candidates, in rank order, live on
    _ranks, keep = op.TopK(op.Add(op.Mul(op.Cast(is_eos, to=_I64), k2), rank), k, axis=1, largest=0)
    new_scores = op.GatherElements(top_scores, keep, axis=1)
    reorder = op.Reshape(op.Add(base, op.GatherElements(origin, keep, axis=1)), flat)
    tokens = op.Reshape(op.GatherElements(token, keep, axis=1), flat)
    # done once K have finished and the K-th best scores at least the best live beam at its
    # length (Hugging Face's early_stopping=False, as search.py)
    penalty = length_penalty(op.Add(step, op.Constant(value_int=1)), alpha)
    finish = op.Where(finishing, op.Div(first_k(top_scores, k), penalty), minus_inf)
    new_kept, _ids = op.TopK(op.Concat(kept, finish, axis=1), k, axis=1)
    kth = op.Squeeze(op.Slice(new_kept, op.Sub(k, op.Constant(value_ints=[1])), k, op.Constant(value_ints=[1])),
                     op.Constant(value_ints=[1]))
    best_live = op.Div(op.ReduceMax(new_scores, op.Constant(value_ints=[1]), keepdims=0), penalty)
    stop = op.And(op.GreaterOrEqual(count, op.Squeeze(k, op.Constant(value_ints=[0]))),
                  op.GreaterOrEqual(kth, best_live))
    still = op.And(active, op.Not(stop))
    searching = op.Greater(op.ReduceSum(op.Cast(still, to=_I64), keepdims=0), op.Constant(value_int=0))
    eos_now = op.Reshape(op.Where(finishing, first_k(top_scores, k), minus_inf), flat)  # unnormalised
    return (searching, tokens, reorder, new_scores, count, new_kept, still,
            op.Concat(parents, reorder, axis=0), op.Concat(tokens_rec, tokens, axis=0),
            op.Concat(lps_rec, op.Reshape(op.GatherElements(token_lp, keep, axis=1), flat), axis=0),
            op.Concat(eos_scores, eos_now, axis=0),
            op.Concat(eos_rows, op.Reshape(op.Add(base, first_k(origin, k)), flat), axis=0),
            op.Concat(eos_lps, op.Reshape(first_k(token_lp, k), flat), axis=0))


@script(default_opset=op)
def step_major(value, per_sentence: INT64):
    """``(T, B, K)`` per step -> ``(B, T*K)``, step-major."""
    return op.Reshape(op.Transpose(value, perm=[1, 0, 2]), per_sentence)


@script(default_opset=op)
def in_step_order(walked, by_row: INT64, out_shape: INT64):
    """Recorded from the last step back, flat -> ``(B, K, T)`` in step order."""
    by_step = op.Reshape(walked, by_row)
    reversed_steps = op.Slice(by_step, op.Constant(value_ints=[-1]), op.Constant(value_ints=[_FIRST]),
                              op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]))
    return op.Reshape(op.Transpose(reversed_steps, perm=[1, 0]), out_shape)


@script(default_opset=op)
def n_best(scores: DOUBLE, active: BOOL, parents: INT64, kept_tokens: INT64, kept_lps: FLOAT, eos_scores: DOUBLE,
           eos_rows: INT64, eos_lps: FLOAT, k: INT64, batch: INT64, alpha: FLOAT, eos: INT64, pad: INT64):
    """The K best hypotheses per sentence from the recorded steps, spelled out by walking the
    parents back. Candidates are the EOS finishes of every step, in step and rank order, then
    the live beams of sentences still searching at ``max_len``: TopK's lower-index ties keep the
    order ``search.py``'s stable sort leaves them in."""
    flat = op.Constant(value_ints=[-1])
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    minus_inf = op.Constant(value=_MINUS_INF64)
    rows = op.Mul(batch, k)
    batch_k = op.Concat(batch, k, axis=0)
    by_row = op.Concat(flat, rows, axis=0)
    per_sentence = op.Concat(batch, flat, axis=0)
    by_beam = op.Concat(flat, batch_k, axis=0)
    base = op.Mul(op.Unsqueeze(op.Range(zero, op.Squeeze(batch), one), op.Constant(value_ints=[1])), k)
    parents = op.Reshape(parents, by_row)  # (T, B*K)
    kept_tokens = op.Reshape(kept_tokens, by_row)
    kept_lps = op.Reshape(kept_lps, by_row)
    eos_scores = op.Reshape(eos_scores, by_beam)  # (T, B, K)
    eos_rows = op.Reshape(eos_rows, by_beam)
    eos_lps = op.Reshape(eos_lps, by_beam)
    steps = op.Shape(parents, end=1)
    last_step = op.Squeeze(steps)
    step_range = op.Range(zero, last_step, one)
    finish_len = op.Expand(op.Unsqueeze(op.Add(step_range, one), op.Constant(value_ints=[1, 2])),
                           op.Shape(eos_scores))
    finish_scores = op.Div(eos_scores, length_penalty(finish_len, alpha))
    live = op.And(op.Unsqueeze(active, op.Constant(value_ints=[1])), op.Greater(scores, minus_inf))
    live_scores = op.Where(live, op.Div(scores, length_penalty(steps, alpha)), minus_inf)
    live_rows = op.Add(base, op.Range(zero, op.Squeeze(k), one))
    best, chosen = op.TopK(op.Concat(step_major(finish_scores, per_sentence), live_scores, axis=1), k, axis=1)
    row = op.GatherElements(op.Concat(step_major(eos_rows, per_sentence), live_rows, axis=1), chosen, axis=1)
    length_if_kept = op.GatherElements(
        op.Concat(step_major(finish_len, per_sentence), op.Expand(steps, batch_k), axis=1), chosen, axis=1)
    eos_lp = op.GatherElements(op.Concat(step_major(eos_lps, per_sentence),
                                         op.Expand(op.Constant(value_float=0.0), batch_k), axis=1), chosen, axis=1)
    finished = op.Less(chosen, op.Mul(steps, k))
    length = op.Where(op.Greater(best, minus_inf), length_if_kept, zero)
    # the step each hypothesis was last extended at: before its EOS, or the last one
    last = op.Reshape(op.Sub(op.Sub(length_if_kept, one), op.Cast(finished, to=_I64)), flat)
    start = op.Reshape(row, flat)
    cursor = op.Expand(zero, rows)
    walked_tokens = op.Constant(value=_NO_INT64)
    walked_lps = op.Constant(value=_NO_FLOAT)
    for i in range(last_step):
        at = op.Sub(op.Sub(last_step, one), i)
        cursor = op.Where(op.Equal(last, at), start, cursor)
        walked_tokens = op.Concat(walked_tokens, op.Gather(op.Gather(kept_tokens, at), cursor), axis=0)
        walked_lps = op.Concat(walked_lps, op.Gather(op.Gather(kept_lps, at), cursor), axis=0)
        cursor = op.Gather(op.Gather(parents, at), cursor)
    out_shape = op.Concat(batch_k, steps, axis=0)
    tokens = in_step_order(walked_tokens, by_row, out_shape)
    lps = in_step_order(walked_lps, by_row, out_shape)
    eos_at = op.And(op.Equal(step_range, op.Unsqueeze(op.Sub(length_if_kept, one), flat)),
                    op.Unsqueeze(finished, flat))
    tokens = op.Where(eos_at, eos, tokens)
    lps = op.Where(eos_at, op.Unsqueeze(eos_lp, flat), lps)
    tokens, lps = mask_after(tokens, lps, length, pad)
    return tokens, op.Cast(best, to=_F32), length, lps


@script(default_opset=op)
def beam_outputs(use_greedy: BOOL, picks: INT64, pick_lps: FLOAT, done: BOOL, scores: DOUBLE, active: BOOL,
                 parents: INT64, kept_tokens: INT64, kept_lps: FLOAT, eos_scores: DOUBLE, eos_rows: INT64,
                 eos_lps: FLOAT, k: INT64, batch: INT64, alpha: FLOAT, eos: INT64, pad: INT64):
    """The outputs of whichever Loop ran: only this cheap post-processing sits in an ``If``."""
    if use_greedy:
        tokens, out_scores, lengths, lps = greedy_outputs(picks, pick_lps, done, batch, alpha, eos, pad)
    else:
        tokens, out_scores, lengths, lps = n_best(scores, active, parents, kept_tokens, kept_lps, eos_scores,
                                                  eos_rows, eos_lps, k, batch, alpha, eos, pad)
    return tokens, out_scores, lengths, lps


FUNCTIONS = (length_penalty, forbid_early_eos, suppressed_ids, apply_options, greedy_step, mask_after,
             greedy_outputs, first_k, beam_step, step_major, in_step_order, n_best, beam_outputs)

COMPILED = Path(__file__).parents[1] / "transforms" / "search_graph.onnx"


def library() -> onnx.ModelProto:
    """``FUNCTIONS`` in one model with an empty graph, in the domain ``DOMAIN``: as fuse loads them."""
    functions = []
    for script_function in FUNCTIONS:
        function = ir.serde.deserialize_function(script_function.to_function_proto())
        function.domain = DOMAIN
        function.opset_imports.pop("this", None)
        function.opset_imports[DOMAIN] = 1
        for value in (*function.inputs, *function.outputs):
            value.shape = None  # onnxscript writes a bare ``FLOAT`` as rank 0
        for node in ir.traversal.RecursiveGraphIterator(function):
            if node.domain == "this":
                node.domain = DOMAIN
        functions.append(function)
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 18, DOMAIN: 1}, name="search_graph")
    return ir.to_proto(ir.Model(graph, ir_version=10, producer_name="s2s-deploy", functions=functions))


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":  # onnxscript orders a Loop's carried values as a set does
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name, *sys.argv[1:]],
                  {**os.environ, "PYTHONHASHSEED": "0"})
    compiled = library().SerializeToString(deterministic=True)
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if COMPILED.read_bytes() == compiled else f"{COMPILED.name} is stale: run python -m {__spec__.name}")
    COMPILED.write_bytes(compiled)
    sys.stdout.write(f"wrote {COMPILED}\n")
