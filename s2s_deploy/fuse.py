"""The whole generation as one portable ONNX graph: ``generate.onnx``.

Why: a runtime with no Python (or no search code of its own) can then translate with a
single call, and the per-token round trip between Python and the runtime disappears. The
encoder graph is inlined once; a standard ``Loop`` inlines the decoder step and carries
state, tokens, scores and finished flags. Only default-domain ops are used, so any
conforming runtime (ONNX Runtime, ``onnx.reference``) runs it.

Everything comes from the manifest (memory and state specs, special tokens, vocabulary
size): no architecture is named here. The search reproduces ``runtime/search.py``: scores
are summed in float64, each row's best 2K are ranked beam-major, and ``TopK`` breaks ties
toward the lower index as the engine's stable sorts do, so the tokens are identical (scores
agree to float64 rounding). Documented in docs/generate.md.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from s2s_deploy.errors import S2SError
from s2s_deploy.runtime.manifest import MANIFEST_NAME, Manifest, sha256_of

GENERATE_FILE = "generate.onnx"
IR_VERSION = 10  # ONNX Runtime 1.31 reads at most 13; onnx.helper would stamp 14
MIN_OPSET = 17
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class GenerateIO:
    """One input or output of generate.onnx as the manifest lists it."""

    name: str
    role: str
    dtype: str
    shape: tuple[int | str, ...]

    def entry(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "dtype": self.dtype, "shape": list(self.shape)}


def generate_io(beam: bool) -> tuple[tuple[GenerateIO, ...], tuple[GenerateIO, ...]]:
    """Inputs and outputs of generate.onnx, all inputs required (see docs/generate.md)."""
    n: int | str = "beam_size" if beam else 1
    inputs = [
        GenerateIO("src", "source_tokens", "int64", ("batch", "src_len")),
        GenerateIO("src_len", "source_lengths", "int64", ("batch",)),
        GenerateIO("max_len", "max_length", "int64", ()),
        GenerateIO("min_len", "min_length", "int64", ()),
        GenerateIO("alpha", "length_penalty_alpha", "float32", ()),
    ]
    if beam:
        inputs.append(GenerateIO("beam_size", "beam_size", "int64", ()))
        inputs.append(GenerateIO("n_best", "n_best", "int64", ()))
    outputs = (
        GenerateIO("tokens", "hypothesis_tokens", "int64", ("batch", n, "out_len")),
        GenerateIO("scores", "hypothesis_scores", "float32", ("batch", n)),
        GenerateIO("lengths", "hypothesis_lengths", "int64", ("batch", n)),
        GenerateIO("token_log_probs", "token_log_probs", "float32", ("batch", n, "out_len")),
    )
    return tuple(inputs), outputs


def fuse_generate(manifest: Manifest, out_path: str | Path, beam: bool = True) -> Path:
    """Build and check generate.onnx for an export, and write it to ``out_path``."""
    model = build_generate(manifest, beam)
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise S2SError(f"the fused graph fails the ONNX checker: {str(exc).splitlines()[0]}") from exc
    out_path = Path(out_path)
    _atomic_write(out_path, model.SerializeToString())
    return out_path


def add_to_manifest(manifest: Manifest, path: Path, beam: bool) -> Path:
    """Record ``graphs.generate`` in manifest.json, replacing the file atomically."""
    if path.resolve().parent != manifest.directory.resolve():
        raise S2SError(f"{path} is not in the export folder {manifest.directory}")
    raw = json.loads((manifest.directory / MANIFEST_NAME).read_text(encoding="utf-8"))
    inputs, outputs = generate_io(beam)
    raw["graphs"]["generate"] = {
        "file": path.name,
        "sha256": sha256_of(path),
        "search": "beam" if beam else "greedy",
        "inputs": [io.entry() for io in inputs],
        "outputs": [io.entry() for io in outputs],
    }
    target = manifest.directory / MANIFEST_NAME
    _atomic_write(target, (json.dumps(raw, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    return target


def _atomic_write(path: Path, data: bytes) -> None:
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def build_generate(manifest: Manifest, beam: bool = True) -> onnx.ModelProto:
    """The fused model, unchecked: the encoder inlined once, the decoder inside a Loop."""
    encoder = _load_plain(manifest.graph_path(manifest.encoder))
    decoder = _load_plain(manifest.graph_path(manifest.decoder))
    opset = _opset(encoder)
    if _opset(decoder) != opset:
        raise S2SError(f"encoder and decoder use different opsets ({opset} vs {_opset(decoder)})")
    if opset < MIN_OPSET:
        raise S2SError(f"generate.onnx needs opset {MIN_OPSET} or later; this export has {opset}")
    fuser = _Fuser(manifest, decoder)
    outputs = fuser.build(encoder, beam)
    inputs, output_io = generate_io(beam)
    graph = helper.make_graph(
        fuser.outer.nodes,
        f"{manifest.plugin}_generate_{'beam' if beam else 'greedy'}",
        [_value_info(io.name, io.dtype, io.shape) for io in inputs],
        [_value_info(io.name, io.dtype, io.shape) for io in output_io],
        initializer=fuser.initializers,
    )
    for io, name in zip(output_io, outputs, strict=True):
        graph.node.append(helper.make_node("Identity", [name], [io.name], name=f"out/{io.name}"))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION,
                              producer_name="s2s-deploy")
    for prop in encoder.metadata_props:
        model.metadata_props.add(key=prop.key, value="generate" if prop.key == "s2s_deploy.role" else prop.value)
    model.metadata_props.add(key="s2s_deploy.search", value="beam" if beam else "greedy")
    return model


def _load_plain(path: Path) -> onnx.ModelProto:
    """A graph with model-local functions inlined and only default-domain nodes."""
    model = onnx.load(str(path))
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    for node in _all_nodes(model.graph):
        if node.domain not in _DEFAULT_DOMAINS:
            raise S2SError(f"{path.name} uses {node.domain}::{node.op_type}; generate.onnx takes default-domain "
                           "ops only")
    return model


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS)


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for sub in _subgraphs(node):
            yield from _all_nodes(sub)


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    found = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            found.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            found.extend(attr.graphs)
    return found


@dataclass(frozen=True)
class _Carried:
    """A Loop-carried value: its key, dtype, rank and initial value in the outer graph."""

    key: str
    dtype: str
    rank: int
    initial: str


def _dims(name: str, rank: int) -> list[str]:
    """Loop-carried values change shape between iterations: symbolic dims, never shared."""
    return [f"{name}_d{axis}" for axis in range(rank)]


def _value_info(name: str, dtype: str, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _elem(dtype), list(shape))


def _elem(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class _Scope:
    """Nodes of one graph (outer or Loop body). Fresh names come from a counter shared by
    all scopes, so nothing collides once the body nests inside the outer graph."""

    def __init__(self, counter: list[int]) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.counter = counter

    def fresh(self, hint: str) -> str:
        self.counter[0] += 1
        return f"gen/{hint}_{self.counter[0]}"

    def __call__(self, op_type: str, *inputs: str, outs: int = 1, **attrs: Any) -> Any:
        if op_type == "Reshape":
            attrs.setdefault("allowzero", 1)  # a 0 in a computed shape is an empty axis, never "copy"
        names = [self.fresh(op_type.lower()) for _ in range(outs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self.fresh(op_type), **attrs))
        return names[0] if outs == 1 else names


class _Fuser:
    def __init__(self, manifest: Manifest, decoder: onnx.ModelProto) -> None:
        self.m = manifest
        self.decoder = decoder
        self.counter = [0]
        self.outer = _Scope(self.counter)
        self.initializers: list[onnx.TensorProto] = []
        self._consts: dict[tuple[str, bytes, tuple[int, ...]], str] = {}
        self.vocab = len(manifest.tgt_vocab)
        self.eos = manifest.eos_id
        self.pad = int(manifest.raw["special_tokens"]["pad"])

    # constants, hoisted to the outer graph where the Loop body sees them too
    def const(self, value: Any, dtype: str = "int64") -> str:
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.tobytes(), array.shape)
        if key not in self._consts:
            name = self.outer.fresh("const")
            self.initializers.append(numpy_helper.from_array(array, name))
            self._consts[key] = name
        return self._consts[key]

    def build(self, encoder: onnx.ModelProto, beam: bool) -> list[str]:
        g = self.outer
        wanted = [m.name for m in self.m.memory] + [s.encoder_output for s in self.m.state if s.encoder_output]
        encoded = self.inline(encoder, "enc/", {"src": "src", "src_len": "src_len"}, wanted, g)
        batch = g("Shape", "src", end=1)  # (1,)
        if beam:
            k = g("Reshape", "beam_size", self.const([1]))
            rows = g("Mul", batch, k)
        else:
            k, rows = None, batch
        memory = {}
        accepted = {i.name for i in self.decoder.graph.input}
        for m in (m for m in self.m.memory if m.name in accepted):
            memory[m.name] = self.repeat(g, encoded[m.name], m.batch_axis, k) if beam else encoded[m.name]
        state = []
        for s in self.m.state:
            if s.encoder_output:
                value = encoded[s.encoder_output]
                state.append(self.repeat(g, value, s.batch_axis, k) if beam else value)
            else:
                dims = [rows if d == "batch" else self.const([int(d)]) for d in s.shape]
                shape = g("Concat", *dims, axis=0) if dims else self.const(np.zeros(0, np.int64))
                zero = numpy_helper.from_array(np.zeros(1, dtype=s.dtype))
                state.append(g("ConstantOfShape", shape, value=zero))
        if beam:
            return self.beam(batch, k, rows, memory, state)
        return self.greedy(batch, memory, state)

    def inline(self, model: onnx.ModelProto, prefix: str, bound: dict[str, str], wanted: Sequence[str],
               scope: _Scope) -> dict[str, str]:
        """Copy the nodes ``wanted`` needs into ``scope``, every name prefixed except the bound
        inputs; initializers go to the outer graph. Returns wanted name -> new name."""
        graph = model.graph
        inits = {i.name for i in graph.initializer}
        free = [i.name for i in graph.input if i.name not in inits and i.name not in bound]
        if free:
            raise S2SError(f"graph {graph.name!r} input(s) {', '.join(free)} have no value in generate.onnx")

        def rename(name: str) -> str:
            return bound.get(name, prefix + name) if name else name

        nodes = _needed(graph.node, set(wanted))
        used = {n for node in nodes for n in _consumed(node)}
        for init in graph.initializer:
            if init.name in used and init.name not in bound:
                copy = onnx.TensorProto()
                copy.CopyFrom(init)
                copy.name = rename(init.name)
                self.initializers.append(copy)
        scope.nodes.extend(_renamed(node, rename, prefix) for node in nodes)
        return {name: rename(name) for name in wanted}

    def repeat(self, g: _Scope, value: str, axis: int, k: str) -> str:
        """``numpy.repeat(value, k, axis)``: rows i*k .. i*k+k-1 are copies of row i."""
        before = g("Shape", value, end=axis)
        dim = g("Shape", value, start=axis, end=axis + 1)
        after = g("Shape", value, start=axis + 1)
        expanded = g("Expand", g("Unsqueeze", value, self.const([axis + 1])),
                     g("Concat", before, dim, k, after, axis=0))
        return g("Reshape", expanded, g("Concat", before, g("Mul", dim, k), after, axis=0))

    def step(self, body: _Scope, tokens: str, step: str, reorder: str, memory: dict[str, str],
             state: Sequence[str]) -> tuple[str, list[str]]:
        """Inline one decoder step; returns log-probs and the next state."""
        bound = {"tokens": tokens, "step": step, "reorder": reorder, **memory}
        bound.update({s.decoder_input: name for s, name in zip(self.m.state, state, strict=True)})
        wanted = ["log_probs", *(s.decoder_output for s in self.m.state)]
        inputs = {i.name for i in self.decoder.graph.input}
        out = self.inline(self.decoder, "dec/", {k: v for k, v in bound.items() if k in inputs}, wanted, body)
        return out["log_probs"], [out[name] for name in wanted[1:]]

    def no_early_eos(self, body: _Scope, iteration: str, log_probs: str) -> str:
        """EOS is impossible before ``min_len`` tokens, as in search.py."""
        onehot = self.const(np.arange(self.vocab) == self.eos, "bool")
        block = body("And", onehot, body("Less", iteration, "min_len"))
        return body("Where", block, self.const(-np.inf, "float32"), log_probs)

    def loop(self, body: _Scope, carried: Sequence[_Carried], inputs: dict[str, str], outputs: Sequence[str],
             scans: Sequence[tuple[str, str]], iteration: str, cond_in: str, cond_out: str) -> list[str]:
        """A Loop over ``body``: ``inputs`` and ``outputs`` name each carried value inside the
        body, then come the scan outputs (name, dtype). Returns the final values."""
        graph = helper.make_graph(
            body.nodes, "decode_step",
            [_value_info(iteration, "int64", ()), _value_info(cond_in, "bool", ()),
             *(_value_info(inputs[v.key], v.dtype, _dims(inputs[v.key], v.rank)) for v in carried)],
            [_value_info(cond_out, "bool", ()),
             *(_value_info(name, v.dtype, _dims(name, v.rank)) for name, v in zip(outputs, carried, strict=True)),
             *(_value_info(name, dtype, _dims(name, 1)) for name, dtype in scans)],
        )
        results = [self.outer.fresh("final") for _ in range(len(outputs) + len(scans))]
        self.outer.nodes.append(helper.make_node(
            "Loop", ["max_len", self.const(True, "bool"), *(v.initial for v in carried)], results,
            name=self.outer.fresh("Loop"), body=graph))
        return results

    def state_carried(self, state: Sequence[str]) -> list[_Carried]:
        ranks = {i.name: len(i.type.tensor_type.shape.dim) for i in self.decoder.graph.input}
        return [_Carried(f"state{i}", s.dtype, ranks[s.decoder_input], value)
                for i, (s, value) in enumerate(zip(self.m.state, state, strict=True))]

    def greedy(self, batch: str, memory: dict[str, str], state: list[str]) -> list[str]:
        """Per iteration only what stopping needs (the pick, done flags); lengths and the
        float64 score sums come from the scanned tokens after the Loop."""
        g, c = self.outer, self.const
        rows = g("Squeeze", batch, c([0]))
        reorder = g("Range", c(0), rows, c(1))
        carried = [
            _Carried("tokens", "int64", 1, g("Expand", c(self.m.decoder_start_id), batch)),
            _Carried("done", "bool", 1, g("Expand", c(False, "bool"), batch)),
            *self.state_carried(state),
        ]
        body = _Scope(self.counter)
        names = {v.key: body.fresh(f"in_{v.key}") for v in carried}
        iteration, cond_in = body.fresh("iter"), body.fresh("cond")
        log_probs, next_state = self.step(body, names["tokens"], iteration, reorder, memory,
                                          [names[f"state{i}"] for i in range(len(state))])
        log_probs = self.no_early_eos(body, iteration, log_probs)
        best, best_id = body("TopK", log_probs, c([1]), axis=1, outs=2)  # ties to the lower id, like argmax
        flat = c([-1])
        tokens = body("Reshape", best_id, flat)
        done = body("Or", names["done"], body("Equal", tokens, c(self.eos)))
        all_done = body("ReduceMin", body("Cast", done, to=TensorProto.INT32), keepdims=0)
        cond = body("Equal", all_done, c(0, "int32"))
        step_tokens, step_lp = body("Identity", tokens), body("Reshape", best, flat)
        final = self.loop(body, carried, names, [tokens, done, *next_state],
                          [(step_tokens, "int64"), (step_lp, "float32")], iteration, cond_in, cond)
        done = final[1]
        history, history_lp = g("Transpose", final[-2], perm=[1, 0]), g("Transpose", final[-1], perm=[1, 0])
        steps = g("Shape", history, start=1)
        is_eos = g("Cast", g("Equal", history, c(self.eos)), to=TensorProto.INT32)
        first_eos = g("ArgMax", is_eos, axis=1, keepdims=0)
        length = g("Where", done, g("Add", first_eos, c(1)), g("Expand", steps, batch))
        tokens, lps = self.mask_after(g, history, history_lp, length, steps)
        total = g("ReduceSum", g("Cast", lps, to=_elem("float64")), c([1]), keepdims=0)
        score = g("Div", total, self.length_penalty(g, length))
        one = c([1])
        return [g("Unsqueeze", tokens, one), g("Unsqueeze", g("Cast", score, to=TensorProto.FLOAT), one),
                g("Unsqueeze", length, one), g("Unsqueeze", lps, one)]

    def length_penalty(self, g: _Scope, length: str) -> str:
        """``L ** alpha`` in float64, as ``search.normalised`` computes it."""
        double = _elem("float64")
        return g("Pow", g("Cast", length, to=double), g("Cast", "alpha", to=double))

    def mask_after(self, g: _Scope, tokens: str, lps: str, length: str, steps: str) -> tuple[str, str]:
        """Pad ids and zero log-probs past each hypothesis' length (last axis)."""
        positions = g("Range", self.const(0), g("Squeeze", steps, self.const([0])), self.const(1))
        inside = g("Less", positions, g("Unsqueeze", length, self.const([-1])))
        return (g("Where", inside, tokens, self.const(self.pad)),
                g("Where", inside, lps, self.const(0.0, "float32")))

    def beam(self, batch: str, k: str, rows: str, memory: dict[str, str], state: list[str]) -> list[str]:
        g, c = self.outer, self.const
        double = _elem("float64")
        k2 = g("Mul", k, c([2]))
        batch_k = g("Concat", batch, k, axis=0)
        batch_k1 = g("Concat", batch, k, c([1]), axis=0)
        base = g("Mul", g("Unsqueeze", g("Range", c(0), g("Squeeze", batch, c([0])), c(1)), c([1])), k)  # (B, 1)
        first = g("Equal", g("Range", c(0), g("Squeeze", k, c([0])), c(1)), c(0))
        scores = g("Where", first, c(0.0, "float64"), c(-np.inf, "float64"))
        empty_history = g("Concat", rows, c([0]), axis=0)
        empty_finished = g("Concat", batch_k, c([0]), axis=0)
        carried = [
            _Carried("tokens", "int64", 1, g("Expand", c(self.m.decoder_start_id), rows)),
            _Carried("reorder", "int64", 1, g("Range", c(0), g("Squeeze", rows, c([0])), c(1))),
            _Carried("scores", "float64", 2, g("Expand", scores, batch_k)),
            _Carried("history", "int64", 2, g("Expand", c(0), empty_history)),
            _Carried("history_lp", "float32", 2, g("Expand", c(0.0, "float32"), empty_history)),
            _Carried("fin_tokens", "int64", 3, g("Expand", c(0), empty_finished)),
            _Carried("fin_lp", "float32", 3, g("Expand", c(0.0, "float32"), empty_finished)),
            _Carried("fin_scores", "float64", 2, g("Expand", c(-np.inf, "float64"), batch_k)),
            _Carried("fin_len", "int64", 2, g("Expand", c(0), batch_k)),
            _Carried("fin_count", "int64", 1, g("Expand", c(0), batch)),
            _Carried("active", "bool", 1, g("Expand", c(True, "bool"), batch)),
            *self.state_carried(state),
        ]
        b = _Scope(self.counter)
        n = {v.key: b.fresh(f"in_{v.key}") for v in carried}
        iteration, cond_in = b.fresh("iter"), b.fresh("cond")
        log_probs, next_state = self.step(b, n["tokens"], iteration, n["reorder"], memory,
                                          [n[f"state{i}"] for i in range(len(state))])
        log_probs = self.no_early_eos(b, iteration, log_probs)
        # The best 2K of K*V candidates lie among each row's own best 2K: rank those only,
        # beam-major then by rank, so TopK's lower-index ties go to the lower beam, then id.
        width = b("Min", k2, c([self.vocab]))
        row_lp, row_ids = b("TopK", log_probs, width, axis=1, outs=2)
        per_sentence = b("Concat", batch, c([-1]), axis=0)
        grid = b("Reshape", b("Cast", row_lp, to=double), b("Concat", batch_k, width, axis=0))
        candidates = b("Reshape", b("Add", b("Unsqueeze", n["scores"], c([2])), grid), per_sentence)
        top_scores, top = b("TopK", candidates, k2, axis=1, outs=2)
        origin = b("Div", top, width)
        token = b("GatherElements", b("Reshape", row_ids, per_sentence), top, axis=1)
        token_lp = b("GatherElements", b("Reshape", row_lp, per_sentence), top, axis=1)
        is_eos = b("And", b("Equal", token, c(self.eos)), _finite(b, top_scores))

        def head(value: str) -> str:
            return b("Slice", value, c([0]), k, c([1]))

        # EOS candidates ranked within the top K finish (for sentences still searching)
        finishing = b("And", head(is_eos), b("Unsqueeze", n["active"], c([1])))
        source_rows = b("Reshape", b("Add", base, head(origin)), c([-1]))
        length = b("Add", iteration, c(1))
        t_shape = b("Shape", n["history"], start=1)
        per_beam = b("Concat", batch_k, t_shape, axis=0)
        new_tokens = b("Concat", b("Reshape", b("Gather", n["history"], source_rows), per_beam),
                       b("Expand", c(self.eos), batch_k1), axis=2)
        new_lp = b("Concat", b("Reshape", b("Gather", n["history_lp"], source_rows), per_beam),
                   b("Unsqueeze", head(token_lp), c([2])), axis=2)
        new_scores = b("Where", finishing, b("Div", head(top_scores), self.length_penalty(b, length)),
                       c(-np.inf, "float64"))
        new_len = b("Where", finishing, length, c(0))
        fin = self.merge(
            b, batch, k,
            (b("Concat", n["fin_tokens"], b("Expand", c(self.pad), batch_k1), axis=2), new_tokens),
            (b("Concat", n["fin_lp"], b("Expand", c(0.0, "float32"), batch_k1), axis=2), new_lp),
            (n["fin_scores"], new_scores), (n["fin_len"], new_len))
        count = b("Add", n["fin_count"], b("ReduceSum", b("Cast", finishing, to=TensorProto.INT64), c([1]),
                                           keepdims=0))
        # the first K non-EOS candidates, in rank order, live on
        rank = b("Range", c(0), b("Squeeze", k2, c([0])), c(1))
        key = b("Add", b("Mul", b("Cast", is_eos, to=TensorProto.INT64), k2), rank)
        keep = b("TopK", key, k, axis=1, largest=0, outs=2)[1]
        scores = b("GatherElements", top_scores, keep, axis=1)
        reorder = b("Reshape", b("Add", base, b("GatherElements", origin, keep, axis=1)), c([-1]))
        column = b("Unsqueeze", b("Reshape", b("GatherElements", token, keep, axis=1), c([-1])), c([1]))
        tokens = b("Reshape", column, c([-1]))
        history = b("Concat", b("Gather", n["history"], reorder), column, axis=1)
        kept_lp = b("Reshape", b("GatherElements", token_lp, keep, axis=1), c([-1, 1]))
        history_lp = b("Concat", b("Gather", n["history_lp"], reorder), kept_lp, axis=1)
        # done once the best candidate is EOS and n-best hypotheses have finished (as search.py)
        top_is_eos = b("Squeeze", b("Slice", is_eos, c([0]), c([1]), c([1])), c([1]))
        done = b("And", top_is_eos, b("GreaterOrEqual", count, "n_best"))
        active = b("And", n["active"], b("Not", done))
        cond = b("Greater", b("ReduceSum", b("Cast", active, to=TensorProto.INT64), keepdims=0), c(0))
        outs = [tokens, reorder, scores, history, history_lp, *fin, count, active, *next_state]
        final = self.loop(b, carried, n, outs, [], iteration, cond_in, cond)
        (_, _, scores, history, history_lp, fin_tokens, fin_lp, fin_scores, fin_len, _, active) = final[:11]
        # sentences still searching at max_len: their live beams finish as they stand
        steps = g("Shape", history, start=1)
        live = g("And", g("Unsqueeze", active, c([1])), _finite(g, scores))
        live_scores = g("Where", live, g("Div", scores, self.length_penalty(g, steps)), c(-np.inf, "float64"))
        per_beam = g("Concat", batch_k, steps, axis=0)
        tokens, lps, scores, length = self.merge(
            g, batch, k, (fin_tokens, g("Reshape", history, per_beam)), (fin_lp, g("Reshape", history_lp, per_beam)),
            (fin_scores, live_scores), (fin_len, g("Expand", steps, batch_k)))
        valid = _finite(g, scores)
        length = g("Where", valid, length, c(0))
        tokens, lps = self.mask_after(g, tokens, lps, length, steps)
        return [tokens, g("Cast", scores, to=TensorProto.FLOAT), length, lps]

    def merge(self, g: _Scope, batch: str, k: str, tokens: tuple[str, str], lps: tuple[str, str],
              scores: tuple[str, str], lengths: tuple[str, str]) -> list[str]:
        """The K best of kept + new finished hypotheses per sentence. Kept ones come first and
        TopK prefers the lower index, so equal scores stay in the order they finished, as the
        stable sort in search.py leaves them."""
        c = self.const
        every = g("Concat", *scores, axis=1)  # (B, 2K)
        best, chosen = g("TopK", every, k, axis=1, outs=2)
        width = g("Mul", k, c([2]))
        offset = g("Mul", g("Unsqueeze", g("Range", c(0), g("Squeeze", batch, c([0])), c(1)), c([1])), width)
        flat = g("Reshape", g("Add", chosen, offset), c([-1]))
        out_shape = g("Concat", batch, k, g("Shape", tokens[0], start=2), axis=0)

        every_row = g("Mul", batch, width)

        def pick(pair: tuple[str, str]) -> str:
            joined = g("Concat", *pair, axis=1)
            rows = g("Reshape", joined, g("Concat", every_row, g("Shape", joined, start=2), axis=0))
            return g("Reshape", g("Gather", rows, flat), out_shape)

        return [pick(tokens), pick(lps), best, g("GatherElements", g("Concat", *lengths, axis=1), chosen, axis=1)]


def _finite(g: _Scope, value: str) -> str:
    return g("Not", g("Or", g("IsInf", value), g("IsNaN", value)))


def _needed(nodes: Sequence[onnx.NodeProto], wanted: set[str]) -> list[onnx.NodeProto]:
    """The nodes the wanted outputs depend on (an unused attention output costs nothing)."""
    needed, kept = set(wanted), []
    for node in reversed(nodes):
        if any(out in needed for out in node.output):
            kept.append(node)
            needed.update(_consumed(node))
    return kept[::-1]


def _consumed(node: onnx.NodeProto) -> set[str]:
    """Inputs of a node, including names its subgraphs read from the enclosing scope."""
    names = {name for name in node.input if name}
    for sub in _subgraphs(node):
        for inner in sub.node:
            names |= _consumed(inner)
    return names


def _renamed(node: onnx.NodeProto, rename: Callable[[str], str], prefix: str) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = prefix + node.name
    copy.input[:] = [rename(name) for name in node.input]
    copy.output[:] = [rename(name) for name in node.output]
    for attr in copy.attribute:
        for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else
                    attr.graphs if attr.type == onnx.AttributeProto.GRAPHS else []):
            _rename_graph(sub, rename, prefix)
    return copy


def _rename_graph(graph: onnx.GraphProto, rename: Callable[[str], str], prefix: str) -> None:
    """Names are unique across scopes in ONNX, so one mapping serves every nesting level."""
    for value in (*graph.input, *graph.output, *graph.value_info):
        value.name = rename(value.name)
    for init in graph.initializer:
        init.name = rename(init.name)
    renamed = [_renamed(node, rename, prefix) for node in graph.node]
    del graph.node[:]
    graph.node.extend(renamed)
