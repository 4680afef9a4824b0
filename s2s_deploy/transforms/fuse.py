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
from s2s_deploy.format.manifest import MANIFEST_NAME, Manifest, manifest_text, sha256_of

GENERATE_FILE = "generate.onnx"
IR_VERSION = 10  # ONNX Runtime 1.31 reads at most 13; onnx.helper would stamp 14
MIN_OPSET = 17
_DEFAULT_DOMAINS = ("", "ai.onnx")
FUSED_OPTIONS = ("min_len", "max_len", "suppress_tokens", "disable_unk", "bad_words_ids (single tokens)",
                 "prefix (one for every sentence)", "forced_eos", "forced_bos")
"""What ``fuse --options`` carries; the step loop runs every other option (docs/generate.md)."""


@dataclass(frozen=True)
class GenerateIO:
    """One input or output of generate.onnx as the manifest lists it."""

    name: str
    role: str
    dtype: str
    shape: tuple[int | str, ...]

    def entry(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "dtype": self.dtype, "shape": list(self.shape)}


def generate_io(beam: bool, options: bool = False) -> tuple[tuple[GenerateIO, ...], tuple[GenerateIO, ...]]:
    """Inputs and outputs of generate.onnx, all inputs required (see docs/generate.md); ``options``
    adds the decoding options a Loop carries: suppressed tokens, a shared prefix, forced EOS and
    BOS (``forced_bos`` -1: none)."""
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
    if options:
        inputs.append(GenerateIO("suppress_tokens", "suppress_tokens", "int64", ("suppressed",)))
        inputs.append(GenerateIO("prefix", "target_prefix", "int64", ("prefix_len",)))
        inputs.append(GenerateIO("forced_eos", "forced_eos", "bool", ()))
        inputs.append(GenerateIO("forced_bos", "forced_bos", "int64", ()))
    outputs = (
        GenerateIO("tokens", "hypothesis_tokens", "int64", ("batch", n, "out_len")),
        GenerateIO("scores", "hypothesis_scores", "float32", ("batch", n)),
        GenerateIO("lengths", "hypothesis_lengths", "int64", ("batch", n)),
        GenerateIO("token_log_probs", "token_log_probs", "float32", ("batch", n, "out_len")),
    )
    return tuple(inputs), outputs


def fuse_generate(manifest: Manifest, out_path: str | Path, beam: bool = True, options: bool = False) -> Path:
    """Build and check generate.onnx for an export, and write it to ``out_path``."""
    model = build_generate(manifest, beam, options)
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise S2SError(f"the fused graph fails the ONNX checker: {str(exc).splitlines()[0]}") from exc
    out_path = Path(out_path)
    _atomic_write(out_path, model.SerializeToString())
    return out_path


def add_to_manifest(manifest: Manifest, path: Path, beam: bool, options: bool = False) -> Path:
    """Record ``graphs.generate`` in manifest.json, replacing the file atomically."""
    if path.resolve().parent != manifest.directory.resolve():
        raise S2SError(f"{path} is not in the export folder {manifest.directory}")
    raw = json.loads((manifest.directory / MANIFEST_NAME).read_text(encoding="utf-8"))
    inputs, outputs = generate_io(beam, options)
    raw["graphs"]["generate"] = {
        "file": path.name,
        "sha256": sha256_of(path),
        "search": "beam" if beam else "greedy",
        **({"options": list(FUSED_OPTIONS)} if options else {}),
        "inputs": [io.entry() for io in inputs],
        "outputs": [io.entry() for io in outputs],
    }
    target = manifest.directory / MANIFEST_NAME
    _atomic_write(target, manifest_text(raw).encode("utf-8"))
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


def build_generate(manifest: Manifest, beam: bool = True, options: bool = False) -> onnx.ModelProto:
    """The fused model, unchecked: the encoder inlined once, the decoder inside a Loop."""
    encoder = _load_plain(manifest.graph_path(manifest.encoder))
    decoder = _load_plain(manifest.graph_path(manifest.decoder))
    opset = _opset(encoder)
    if _opset(decoder) != opset:
        raise S2SError(f"encoder and decoder use different opsets ({opset} vs {_opset(decoder)})")
    if opset < MIN_OPSET:
        raise S2SError(f"generate.onnx needs opset {MIN_OPSET} or later; this export has {opset}")
    fuser = _Fuser(manifest, decoder, options)
    outputs = fuser.build(encoder, beam)
    inputs, output_io = generate_io(beam, options)
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


@dataclass(frozen=True)
class _BeamShapes:
    """Step-invariant shape tensors of a beam search, made once in the outer graph: the Loop
    body and the post-processing read them from there."""

    k: str  # (1,) K
    rows: str  # (1,) B*K
    by_row: str  # (2,) [-1, B*K]
    batch_k: str  # (2,) [B, K]
    per_sentence: str  # (2,) [B, -1]
    base: str  # (B, 1) first row of each sentence


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
    def __init__(self, manifest: Manifest, decoder: onnx.ModelProto, options: bool = False) -> None:
        self.m = manifest
        self.options = options
        self._suppressed: str | None = None
        self.decoder = decoder
        self.counter = [0]
        self.outer = _Scope(self.counter)
        self.initializers: list[onnx.TensorProto] = []
        self._consts: dict[tuple[str, bytes, tuple[int, ...]], str] = {}
        self.vocab = len(manifest.tgt_vocab)
        self.eos = manifest.eos_id
        self.pad = manifest.tgt_vocab.pad_id

    # constants, hoisted to the outer graph where the Loop body sees them too
    def const(self, value: Any, dtype: str = "int64") -> str:
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.tobytes(), array.shape)
        if key not in self._consts:
            name = self.outer.fresh("const")
            self.initializers.append(numpy_helper.from_array(array, name))
            self._consts[key] = name
        return self._consts[key]

    def arange(self, g: _Scope, count: str) -> str:
        """``0 .. count-1`` for a ``(1,)`` count, as the shapes here are kept."""
        return g("Range", self.const(0), g("Squeeze", count, self.const([0])), self.const(1))

    def build(self, encoder: onnx.ModelProto, beam: bool) -> list[str]:
        """With ``beam``, a greedy and a beam Loop both sit in the top-level graph, and
        ``beam_size`` gives the unused one zero trips: the greedy body carries a fraction of
        the beam bookkeeping, and ONNX Runtime prepacks the weights only for a Loop body that
        uses them directly (inside an ``If``, base decoded 30% slower). Only the cheap
        post-processing sits in an ``If``."""
        g, c = self.outer, self.const
        wanted = [m.name for m in self.m.memory] + [s.encoder_output for s in self.m.state if s.encoder_output]
        encoded = self.inline(encoder, "enc/", {"src": "src", "src_len": "src_len"}, wanted, g)
        batch = g("Shape", "src", end=1)  # (1,)
        if not beam:
            return self.greedy(g, batch, "max_len", *self.start_values(g, encoded, batch, None))
        is_greedy = g("Equal", "beam_size", c(1))
        no_trips = c(0)
        greedy_scope, beam_scope = _Scope(self.counter), _Scope(self.counter)
        greedy_out = self.greedy(g, batch, g("Where", is_greedy, "max_len", no_trips),
                                 *self.start_values(g, encoded, batch, None), post=greedy_scope)
        k = g("Reshape", "beam_size", c([1]))
        beam_out = self.beam(g, batch, k, g("Where", is_greedy, no_trips, "max_len"),
                             *self.start_values(g, encoded, batch, k), post=beam_scope)
        _, output_io = generate_io(beam)
        return _branch_if(g, is_greedy, [(io.name, io.dtype, len(io.shape)) for io in output_io],
                          greedy_scope, greedy_out, beam_scope, beam_out)

    def start_values(self, g: _Scope, encoded: dict[str, str], batch: str,
                     k: str | None) -> tuple[dict[str, str], list[str]]:
        """Decoder memory and initial state, each repeated ``k`` times per sentence for beam search."""
        rows = batch if k is None else g("Mul", batch, k)
        memory = {}
        accepted = {i.name for i in self.decoder.graph.input}
        for m in (m for m in self.m.memory if m.name in accepted):
            memory[m.name] = encoded[m.name] if k is None else self.repeat(g, encoded[m.name], m.batch_axis, k)
        state = []
        for s in self.m.state:
            if s.encoder_output:
                value = encoded[s.encoder_output]
                state.append(value if k is None else self.repeat(g, value, s.batch_axis, k))
            else:
                dims = [rows if d == "batch" else self.const([int(d)]) for d in s.shape]
                shape = g("Concat", *dims, axis=0) if dims else self.const(np.zeros(0, np.int64))
                zero = numpy_helper.from_array(np.zeros(1, dtype=s.dtype))
                state.append(g("ConstantOfShape", shape, value=zero))
        return memory, state

    def inline(self, model: onnx.ModelProto, prefix: str, bound: dict[str, str], wanted: Sequence[str],
               scope: _Scope) -> dict[str, str]:
        """Copy the nodes ``wanted`` needs into ``scope``, every name prefixed except the bound
        inputs; initializers go to the outer graph. Returns wanted name -> new name."""
        graph = model.graph
        inits = {i.name for i in graph.initializer}

        def rename(name: str) -> str:
            return bound.get(name, prefix + name) if name else name

        nodes = _needed(graph.node, set(wanted))
        used = {n for node in nodes for n in _consumed(node)}
        free = [i.name for i in graph.input if i.name in used and i.name not in inits and i.name not in bound]
        if free:  # an input only unused outputs read (the decoder's top_k) needs no value
            raise S2SError(f"graph {graph.name!r} input(s) {', '.join(free)} have no value in generate.onnx")
        hoisted = {i.name for i in self.initializers}  # a graph inlined twice shares its weights
        for init in graph.initializer:
            if init.name in used and init.name not in bound and rename(init.name) not in hoisted:
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

    def constrain(self, body: _Scope, iteration: str, log_probs: str) -> str:
        """min_len, then (fused with options) the suppressed tokens, and a forced token at a
        prefix step, at the first step with ``forced_bos`` and no prefix, or with ``forced_eos``
        at the last step: as runtime/options.py does, every other token becomes impossible, a
        prefix token keeps the model's log-prob and a forced BOS or EOS scores 0."""
        masked = self.no_early_eos(body, iteration, log_probs)
        if not self.options:
            return masked
        c, inf = self.const, self.const(-np.inf, "float32")
        if self._suppressed is None:  # (V,) bool, made once in the outer graph
            g = self.outer
            hits = g("Equal", g("Unsqueeze", "suppress_tokens", c([1])), c(np.arange(self.vocab)[None, :]))
            self._suppressed = g("Greater", g("ReduceSum", g("Cast", hits, to=TensorProto.INT64), c([0]),
                                              keepdims=0), c(0))
        masked = body("Where", self._suppressed, inf, masked)
        prefix_len = body("Squeeze", body("Shape", "prefix"), c([0]))
        padded = body("Concat", "prefix", c([self.eos]), axis=0)  # never empty; index p is EOS
        in_prefix = body("Less", iteration, prefix_len)
        at_end = body("And", "forced_eos", body("Equal", iteration, body("Sub", "max_len", c(1))))
        at_bos = body("And", body("And", body("Equal", iteration, c(0)), body("Equal", prefix_len, c(0))),
                      body("GreaterOrEqual", "forced_bos", c(0)))
        token = body("Where", at_bos, "forced_bos", body("Gather", padded, body("Min", iteration, prefix_len)))
        forced_step = body("Or", body("Or", in_prefix, at_end), at_bos)
        onehot = body("Equal", c(np.arange(self.vocab)), token)
        forced = body("Where", onehot, body("Where", in_prefix, log_probs, c(0.0, "float32")), inf)
        return body("Where", forced_step, forced, masked)

    def loop(self, g: _Scope, body: _Scope, carried: Sequence[_Carried], inputs: dict[str, str],
             outputs: Sequence[str], iteration: str, cond_in: str, cond_out: str, trips: str) -> list[str]:
        """A Loop over ``body`` in scope ``g``: ``inputs`` and ``outputs`` name each carried value
        inside the body. Returns the final values. Records grow as carried flat tensors, not scan
        outputs: onnx.reference cannot stack the scans of a Loop that makes zero trips."""
        graph = helper.make_graph(
            body.nodes, "loop_body",
            [_value_info(iteration, "int64", ()), _value_info(cond_in, "bool", ()),
             *(_value_info(inputs[v.key], v.dtype, _dims(inputs[v.key], v.rank)) for v in carried)],
            [_value_info(cond_out, "bool", ()),
             *(_value_info(name, v.dtype, _dims(name, v.rank)) for name, v in zip(outputs, carried, strict=True))],
        )
        results = [g.fresh("final") for _ in outputs]
        g.nodes.append(helper.make_node(
            "Loop", [trips, self.const(True, "bool"), *(v.initial for v in carried)], results,
            name=g.fresh("Loop"), body=graph))
        return results

    def record(self, g: _Scope, dtype: str) -> _Carried:
        """An empty flat record that grows by one row of values per step."""
        return _Carried(g.fresh("record"), dtype, 1, self.const(np.zeros(0, dtype), dtype))

    def state_carried(self, state: Sequence[str]) -> list[_Carried]:
        ranks = {i.name: len(i.type.tensor_type.shape.dim) for i in self.decoder.graph.input}
        return [_Carried(f"state{i}", s.dtype, ranks[s.decoder_input], value)
                for i, (s, value) in enumerate(zip(self.m.state, state, strict=True))]

    def greedy(self, g: _Scope, batch: str, trips: str, memory: dict[str, str], state: list[str],
               post: _Scope | None = None) -> list[str]:
        """Per iteration only what stopping needs (the pick, done flags); lengths and the
        float64 score sums come from the recorded picks afterwards, in ``post`` (default ``g``)."""
        c = self.const
        reorder = self.arange(g, batch)
        picks, pick_lps = self.record(g, "int64"), self.record(g, "float32")
        carried = [
            _Carried("tokens", "int64", 1, g("Expand", c(self.m.decoder_start_id), batch)),
            _Carried("done", "bool", 1, g("Expand", c(False, "bool"), batch)),
            picks, pick_lps,
            *self.state_carried(state),
        ]
        body = _Scope(self.counter)
        names = {v.key: body.fresh(f"in_{v.key}") for v in carried}
        iteration, cond_in = body.fresh("iter"), body.fresh("cond")
        log_probs, next_state = self.step(body, names["tokens"], iteration, reorder, memory,
                                          [names[f"state{i}"] for i in range(len(state))])
        log_probs = self.constrain(body, iteration, log_probs)
        best, best_id = body("TopK", log_probs, c([1]), axis=1, outs=2)  # ties to the lower id, like argmax
        flat = c([-1])
        tokens = body("Reshape", best_id, flat)
        done = body("Or", names["done"], body("Equal", tokens, c(self.eos)))
        all_done = body("ReduceMin", body("Cast", done, to=TensorProto.INT32), keepdims=0)
        cond = body("Equal", all_done, c(0, "int32"))
        grown = [body("Concat", names[picks.key], tokens, axis=0),
                 body("Concat", names[pick_lps.key], body("Reshape", best, flat), axis=0)]
        final = self.loop(g, body, carried, names, [tokens, done, *grown, *next_state], iteration, cond_in, cond,
                          trips)
        post = post or g
        per_step = post("Concat", c([-1]), batch, axis=0)
        return self.greedy_outputs(post, batch, final[1], *(post("Reshape", value, per_step) for value in final[2:4]))

    def greedy_outputs(self, g: _Scope, batch: str, done: str, picked: str, picked_lps: str) -> list[str]:
        """The outputs from the per-step picks ``(T, B)``: lengths end at the first EOS, and the
        float64 score sums are taken once here, not carried through the Loop."""
        c = self.const
        history, history_lp = g("Transpose", picked, perm=[1, 0]), g("Transpose", picked_lps, perm=[1, 0])
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
        inside = g("Less", self.arange(g, steps), g("Unsqueeze", length, self.const([-1])))
        return (g("Where", inside, tokens, self.const(self.pad)),
                g("Where", inside, lps, self.const(0.0, "float32")))

    def beam(self, g: _Scope, batch: str, k: str, trips: str, memory: dict[str, str], state: list[str],
             post: _Scope) -> list[str]:
        """Like ``search._Trail``, the Loop only records each step (parents, tokens, EOS
        finishes); the n-best are chosen and spelled out once, in ``post``, after it."""
        c = self.const
        double = _elem("float64")
        minus_inf = c(-np.inf, "float64")
        flat = c([-1])
        rows = g("Mul", batch, k)
        k2 = g("Mul", k, c([2]))
        width = g("Min", k2, c([self.vocab]))  # each row's candidates
        shapes = _BeamShapes(
            k=k, rows=rows, by_row=g("Concat", flat, rows, axis=0), batch_k=g("Concat", batch, k, axis=0),
            per_sentence=g("Concat", batch, flat, axis=0),
            base=g("Mul", g("Unsqueeze", self.arange(g, batch), c([1])), k))
        batch_k, per_sentence, base = shapes.batch_k, shapes.per_sentence, shapes.base
        grid_shape = g("Concat", batch_k, width, axis=0)
        rank = self.arange(g, k2)
        first = g("Equal", self.arange(g, k), c(0))
        records = {name: self.record(g, dtype) for name, dtype in (
            ("parents", "int64"), ("tokens", "int64"), ("lps", "float32"),
            ("eos_scores", "float64"), ("eos_rows", "int64"), ("eos_lps", "float32"))}
        carried = [
            _Carried("tokens", "int64", 1, g("Expand", c(self.m.decoder_start_id), rows)),
            _Carried("reorder", "int64", 1, self.arange(g, rows)),
            _Carried("scores", "float64", 2, g("Expand", g("Where", first, c(0.0, "float64"), minus_inf), batch_k)),
            _Carried("fin_count", "int64", 1, g("Expand", c(0), batch)),
            _Carried("kept", "float64", 2, g("Expand", minus_inf, batch_k)),  # best K finished scores
            _Carried("active", "bool", 1, g("Expand", c(True, "bool"), batch)),
            *records.values(),
            *self.state_carried(state),
        ]
        b = _Scope(self.counter)
        n = {v.key: b.fresh(f"in_{v.key}") for v in carried}
        iteration, cond_in = b.fresh("iter"), b.fresh("cond")
        log_probs, next_state = self.step(b, n["tokens"], iteration, n["reorder"], memory,
                                          [n[f"state{i}"] for i in range(len(state))])
        log_probs = self.constrain(b, iteration, log_probs)
        # The best 2K of K*V candidates lie among each row's own best 2K: rank those only,
        # beam-major then by rank, so TopK's lower-index ties go to the lower beam, then id.
        row_lp, row_ids = b("TopK", log_probs, width, axis=1, outs=2)
        grid = b("Reshape", b("Cast", row_lp, to=double), grid_shape)
        candidates = b("Reshape", b("Add", b("Unsqueeze", n["scores"], c([2])), grid), per_sentence)
        top_scores, top = b("TopK", candidates, k2, axis=1, outs=2)
        origin = b("Div", top, width)
        token = b("GatherElements", b("Reshape", row_ids, per_sentence), top, axis=1)
        token_lp = b("GatherElements", b("Reshape", row_lp, per_sentence), top, axis=1)
        is_eos = b("And", b("Equal", token, c(self.eos)), b("Greater", top_scores, minus_inf))

        def head(value: str) -> str:
            return b("Slice", value, c([0]), k, c([1]))

        # EOS candidates ranked within the top K finish (for sentences still searching)
        finishing = b("And", head(is_eos), b("Unsqueeze", n["active"], c([1])))
        count = b("Add", n["fin_count"], b("ReduceSum", b("Cast", finishing, to=TensorProto.INT64), c([1]),
                                           keepdims=0))
        # the first K non-EOS candidates, in rank order, live on
        keep = b("TopK", b("Add", b("Mul", b("Cast", is_eos, to=TensorProto.INT64), k2), rank), k, axis=1,
                 largest=0, outs=2)[1]
        scores = b("GatherElements", top_scores, keep, axis=1)
        reorder = b("Reshape", b("Add", base, b("GatherElements", origin, keep, axis=1)), flat)
        tokens = b("Reshape", b("GatherElements", token, keep, axis=1), flat)
        # done once K have finished and the K-th best scores at least the best live beam at its
        # length (Hugging Face's early_stopping=False, as search.py)
        penalty = self.length_penalty(b, b("Add", iteration, c(1)))
        finish = b("Where", finishing, b("Div", head(top_scores), penalty), minus_inf)
        kept = b("TopK", b("Concat", n["kept"], finish, axis=1), k, axis=1, outs=2)[0]
        kth = b("Squeeze", b("Slice", kept, b("Sub", k, c([1])), k, c([1])), c([1]))
        best_live = b("Div", b("ReduceMax", scores, c([1]), keepdims=0), penalty)
        stop = b("And", b("GreaterOrEqual", count, b("Squeeze", k, c([0]))), b("GreaterOrEqual", kth, best_live))
        active = b("And", n["active"], b("Not", stop))
        cond = b("Greater", b("ReduceSum", b("Cast", active, to=TensorProto.INT64), keepdims=0), c(0))
        step_records = {
            "parents": reorder, "tokens": tokens,
            "lps": b("Reshape", b("GatherElements", token_lp, keep, axis=1), flat),
            "eos_scores": b("Reshape", b("Where", finishing, head(top_scores), minus_inf), flat),  # unnormalised
            "eos_rows": b("Reshape", b("Add", base, head(origin)), flat),
            "eos_lps": b("Reshape", head(token_lp), flat),
        }
        grown = [b("Concat", n[records[name].key], value, axis=0) for name, value in step_records.items()]
        final = self.loop(g, b, carried, n, [tokens, reorder, scores, count, kept, active, *grown, *next_state],
                          iteration, cond_in, cond, trips)
        by_beam = post("Concat", flat, batch_k, axis=0)
        parents, kept_tokens, kept_lps = (post("Reshape", value, shapes.by_row) for value in final[6:9])
        eos_scores, eos_rows, eos_lps = (post("Reshape", value, by_beam) for value in final[9:12])
        return self.n_best(post, shapes, final[2], final[5], parents, kept_tokens, kept_lps, eos_scores,
                           eos_rows, eos_lps)

    def n_best(self, g: _Scope, shapes: _BeamShapes, scores: str, active: str, parents: str, kept_tokens: str,
               kept_lps: str, eos_scores: str, eos_rows: str, eos_lps: str) -> list[str]:
        """The K best hypotheses per sentence from the recorded steps, spelled out by walking
        the parents back. Candidates are the EOS finishes of every step, in step and rank order,
        then the live beams of sentences still searching at ``max_len``: TopK's lower-index ties
        keep the order ``search.py``'s stable sort leaves them in."""
        c = self.const
        minus_inf = c(-np.inf, "float64")
        k, batch_k = shapes.k, shapes.batch_k
        steps = g("Shape", parents, end=1)  # (1,)
        step_range = self.arange(g, steps)

        def by_sentence(value: str) -> str:
            """(T, B, K) per step -> (B, T*K), step-major."""
            return g("Reshape", g("Transpose", value, perm=[1, 0, 2]), shapes.per_sentence)

        finish_len = g("Expand", g("Unsqueeze", g("Add", step_range, c(1)), c([1, 2])), g("Shape", eos_scores))
        finish_scores = g("Div", eos_scores, self.length_penalty(g, finish_len))
        live = g("And", g("Unsqueeze", active, c([1])), g("Greater", scores, minus_inf))
        live_scores = g("Where", live, g("Div", scores, self.length_penalty(g, steps)), minus_inf)
        live_rows = g("Add", shapes.base, self.arange(g, k))

        def candidates(finishes: str, lives: str) -> str:
            return g("Concat", by_sentence(finishes), lives, axis=1)

        best, chosen = g("TopK", candidates(finish_scores, live_scores), k, axis=1, outs=2)
        picked = {name: g("GatherElements", candidates(*pair), chosen, axis=1) for name, pair in {
            "row": (eos_rows, live_rows),
            "length": (finish_len, g("Expand", steps, batch_k)),
            "eos_lp": (eos_lps, g("Expand", c(0.0, "float32"), batch_k)),
        }.items()}
        finished = g("Less", chosen, g("Mul", steps, k))
        length = g("Where", g("Greater", best, minus_inf), picked["length"], c(0))
        # the step each hypothesis was last extended at: before its EOS, or the last one
        last = g("Reshape", g("Sub", g("Sub", picked["length"], c(1)), g("Cast", finished, to=TensorProto.INT64)),
                 c([-1]))
        start = g("Reshape", picked["row"], c([-1]))
        walk = _Scope(self.counter)
        walked_tokens, walked_lps = self.record(g, "int64"), self.record(g, "float32")
        carried = [_Carried("cursor", "int64", 1, g("Expand", c(0), shapes.rows)), walked_tokens, walked_lps]
        names = {v.key: walk.fresh(v.key) for v in carried}
        i, cond = walk.fresh("iter"), walk.fresh("cond")
        at = walk("Sub", g("Sub", g("Squeeze", steps, c([0])), c(1)), i)
        cursor = walk("Where", walk("Equal", last, at), start, names["cursor"])
        grown = [walk("Concat", names[record.key], walk("Gather", walk("Gather", source, at), cursor), axis=0)
                 for record, source in ((walked_tokens, kept_tokens), (walked_lps, kept_lps))]
        walked = self.loop(g, walk, carried, names, [walk("Gather", walk("Gather", parents, at), cursor), *grown],
                           i, cond, walk("Identity", cond), trips=g("Squeeze", steps, c([0])))
        out_shape = g("Concat", batch_k, steps, axis=0)

        def forwards(value: str) -> str:
            """Recorded from the last step back, flat -> (B, K, T) in step order."""
            by_step = g("Reshape", value, shapes.by_row)
            reversed_steps = g("Slice", by_step, c([-1]), c([np.iinfo(np.int64).min]), c([0]), c([-1]))
            return g("Reshape", g("Transpose", reversed_steps, perm=[1, 0]), out_shape)

        tokens, lps = forwards(walked[1]), forwards(walked[2])
        eos_at = g("And", g("Equal", step_range, g("Unsqueeze", g("Sub", picked["length"], c(1)), c([-1]))),
                   g("Unsqueeze", finished, c([-1])))
        tokens = g("Where", eos_at, c(self.eos), tokens)
        lps = g("Where", eos_at, g("Unsqueeze", picked["eos_lp"], c([-1])), lps)
        tokens, lps = self.mask_after(g, tokens, lps, length, steps)
        return [tokens, g("Cast", best, to=TensorProto.FLOAT), length, lps]


def _branch_if(g: _Scope, condition: str, declared: Sequence[tuple[str, str, int]], then_scope: _Scope,
               then_outputs: Sequence[str], else_scope: _Scope, else_outputs: Sequence[str]) -> list[str]:
    """An ``If`` in ``g`` whose branches return ``then_outputs`` / ``else_outputs``, declared
    by (hint, dtype, rank) with every dim symbolic."""

    def branch(scope: _Scope, outputs: Sequence[str], name: str) -> onnx.GraphProto:
        values = [_value_info(out, dtype, _dims(out, rank))
                  for out, (_, dtype, rank) in zip(outputs, declared, strict=True)]
        return helper.make_graph(scope.nodes, name, [], values)

    return g("If", condition, outs=len(declared), then_branch=branch(then_scope, then_outputs, "then"),
             else_branch=branch(else_scope, else_outputs, "else"))


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
