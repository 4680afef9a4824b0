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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes import common as passes

from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import write_atomically
from s2s_deploy.format.manifest import IOEntry as GenerateIO
from s2s_deploy.format.manifest import Manifest

GENERATE_FILE = "generate.onnx"
SEARCH_FUNCTIONS = Path(__file__).with_name("search_graph.onnx")
"""The search steps, compiled from ``export/search_graph.py`` (onnxscript is not a base dependency)."""
IR_VERSION = 10  # ONNX Runtime 1.31 reads at most 13; onnx.helper would stamp 14
MIN_OPSET = 17
_DEFAULT_DOMAINS = ("", "ai.onnx")
_SEARCH_DOMAIN = "s2s_deploy.search"
FUSED_OPTIONS = ("min_len", "max_len", "suppress_tokens", "disable_unk", "bad_words_ids (single tokens)",
                 "prefix (one for every sentence)", "forced_eos", "forced_bos")
"""What ``fuse --options`` carries; the step loop runs every other option (docs/generate.md)."""


def generate_io(beam: bool, options: bool = False) -> tuple[tuple[GenerateIO, ...], tuple[GenerateIO, ...]]:
    """Inputs and outputs of generate.onnx, all inputs required (see docs/generate.md); ``options``
    adds the decoding options a Loop carries: suppressed tokens, a shared prefix, forced EOS."""
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
    write_atomically(out_path, model.SerializeToString())
    return out_path


def add_to_manifest(manifest: Manifest, path: Path, beam: bool, options: bool = False) -> Path:
    """Record ``graphs.generate`` in manifest.json, replacing the file atomically."""
    return manifest.with_generate(path, beam, FUSED_OPTIONS if options else (), *generate_io(beam, options)).write()


def build_generate(manifest: Manifest, beam: bool = True, options: bool = False) -> onnx.ModelProto:
    """The fused model, unchecked: the encoder inlined once, the decoder inside a Loop."""
    state_outputs = [s.decoder_output for s in manifest.state]
    encoder = _load_pruned(manifest.graph_path(manifest.encoder), [m.name for m in manifest.memory] +
                           [s.encoder_output for s in manifest.state if s.encoder_output])
    decoder = _load_pruned(manifest.graph_path(manifest.decoder), ["log_probs", *state_outputs]).graph
    opset = _opset(encoder)
    if _opset(decoder) != opset:
        raise S2SError(f"encoder and decoder use different opsets ({opset} vs {_opset(decoder)})")
    if opset < MIN_OPSET:
        raise S2SError(f"generate.onnx needs opset {MIN_OPSET} or later; this export has {opset}")
    inputs, outputs = generate_io(beam, options)
    graph = ir.Graph([_value(io.name, io.dtype, io.shape) for io in inputs], [], nodes=[], opset_imports={"": opset},
                     name=f"{manifest.plugin}_generate_{'beam' if beam else 'greedy'}")
    fuser = _Fuser(manifest, graph, encoder.graph, decoder, options)
    results = fuser.build(beam)
    for io, value in zip(outputs, results, strict=True):
        value.name, value.type, value.shape = io.name, _type(io.dtype), ir.Shape(io.shape)
        graph.outputs.append(value)
    functions = list(ir.load(SEARCH_FUNCTIONS).functions.values())
    for function in functions:  # the ops they use mean the same from opset 18 on
        function.opset_imports[""] = opset
    model = ir.Model(graph, ir_version=IR_VERSION, producer_name="s2s-deploy", functions=functions)
    for pass_ in (passes.InlinePass(), passes.RemoveUnusedFunctionsPass(), passes.RemoveUnusedNodesPass(),
                  passes.NameFixPass()):
        pass_(model)
    model.opset_imports.pop(_SEARCH_DOMAIN)  # every call is inlined
    _explicit_loop_conditions(graph, fuser.const(True, "bool"))
    _unique_names(graph)
    proto = ir.to_proto(model)
    for key, value in encoder.metadata_props.items():
        proto.metadata_props.add(key=key, value="generate" if key == "s2s_deploy.role" else value)
    proto.metadata_props.add(key="s2s_deploy.search", value="beam" if beam else "greedy")
    return proto


def _explicit_loop_conditions(graph: ir.Graph, true: ir.Value) -> None:
    """Give every ``Loop`` without a ``cond`` input (onnxscript's ``for i in range(n)``, perhaps
    an exported graph's) the constant ``true``. The spec reads an omitted ``cond`` as true, and
    ONNX Runtime does, but ``onnx.reference`` makes zero trips: it would skip ``n_best``'s walk
    back through the parents."""
    for node in ir.traversal.RecursiveGraphIterator(graph):
        if node.op_type == "Loop" and node.domain in _DEFAULT_DOMAINS:
            if len(node.inputs) < 2:
                node.resize_inputs(2)
            if node.inputs[1] is None:
                node.replace_input_with(1, true)


def _unique_names(graph: ir.Graph) -> None:
    """Each value name once in the whole model, as ONNX Runtime checks: ``NameFixPass`` only
    compares a subgraph with its enclosing scopes, not with values the parent defines later."""
    fixed = {*graph.inputs, *graph.outputs, *graph.initializers.values()}
    seen = {value.name for value in fixed}

    def claim(value: ir.Value) -> None:
        if value in fixed:
            return
        base, count = value.name or "v", 0
        while value.name in seen or not value.name:
            count += 1
            value.name = f"{base}_{count}"
        seen.add(value.name)

    for node in ir.traversal.RecursiveGraphIterator(graph, enter_graph=lambda body: [claim(v) for v in body.inputs]):
        for value in node.outputs:
            claim(value)


def _load_pruned(path: Path, outputs: Sequence[str]) -> ir.Model:
    """The graph computing ``outputs`` only (an unused attention output costs nothing), with
    model-local functions inlined and only default-domain nodes. Weights stored as external data
    (``shared_weights.bin``) are read in: generate.onnx is one self-contained file."""
    model = ir.external_data.load_to_model(ir.load(path))
    passes.InlinePass()(model)
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.domain not in _DEFAULT_DOMAINS:
            raise S2SError(f"{path.name} uses {node.domain}::{node.op_type}; generate.onnx takes default-domain "
                           "ops only")
    by_name = {value.name: value for value in model.graph.outputs}
    model.graph.outputs[:] = [by_name[name] for name in outputs]
    passes.RemoveUnusedNodesPass()(model)
    return model


def _opset(model: ir.Model) -> int:
    return next(version for domain, version in model.opset_imports.items() if domain in _DEFAULT_DOMAINS)


def _type(dtype: str) -> ir.TensorType:
    return ir.TensorType(ir.DataType.from_numpy(np.dtype(dtype)))


def _value(name: str, dtype: str, shape: Sequence[int | str | None]) -> ir.Value:
    return ir.Value(name=name, type=_type(dtype), shape=ir.Shape(shape))


class _Ops(ir.tape.Tape):
    """``ops.Add(a, b)`` records an ``Add`` node on the tape's graph; ``_domain`` and
    ``_outputs`` (a count) are the only keywords that are not attributes."""

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        def record(*inputs: ir.Value, _domain: str = "", _outputs: int = 1, **attributes: Any) -> Any:
            if _outputs == 1:
                return self.op(op_type, inputs, attributes, domain=_domain)
            return self.op_multi_out(op_type, inputs, attributes, domain=_domain, num_outputs=_outputs)

        return record


@dataclass(frozen=True)
class _Carried:
    """A Loop-carried value: its dtype, rank and initial value in the outer graph. Its shape
    changes between iterations, so every dim is left unknown."""

    dtype: str
    rank: int
    initial: ir.Value


class _Fuser:
    """Assembles generate.onnx around the search functions of ``export/search_graph.py``.

    The Loops and the inlined encoder and decoder are built here with ``onnx_ir`` rather than
    with onnxscript's ``@script``: a script function is compiled from a fixed Python signature
    and holds no initialisers, while the decoder step is a graph known only at fuse time, with
    the export's own memory, state and weights. The weights stay initialisers of the top-level
    graph that both Loop bodies read, so they are stored once and ONNX Runtime prepacks them.
    """

    def __init__(self, manifest: Manifest, graph: ir.Graph, encoder: ir.Graph, decoder: ir.Graph,
                 options: bool) -> None:
        self.m, self.encoder, self.decoder, self.options = manifest, encoder, decoder, options
        self.op = _Ops(graph)
        self.inputs = {value.name: value for value in graph.inputs}
        self._consts: dict[tuple[str, bytes, tuple[int, ...]], ir.Value] = {}
        self._weights: dict[str, ir.Value] = {}
        vocab = np.arange(len(manifest.tgt_vocab))
        self.vocab_ids = self.const(vocab)
        self.eos, self.pad = self.const(manifest.eos_id), self.const(manifest.tgt_vocab.pad_id)
        self.eos_onehot = self.const(vocab == manifest.eos_id, "bool")
        self.suppressed = (self.call(self.op, "suppressed_ids", self.inputs["suppress_tokens"], self.vocab_ids)
                           if options else None)

    def const(self, value: Any, dtype: str = "int64") -> ir.Value:
        """A constant of the top-level graph, made once; the Loop bodies see it too."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.tobytes(), array.shape)
        if key not in self._consts:
            self._consts[key] = self.op.initializer(ir.tensor(array), name=f"gen/const_{len(self._consts)}")
        return self._consts[key]

    @staticmethod
    def call(op: _Ops, name: str, *inputs: ir.Value, outs: int = 1) -> Any:
        """A call of a ``search_graph`` function, inlined before the model is saved."""
        return getattr(op, name)(*inputs, _domain=_SEARCH_DOMAIN, _outputs=outs)

    def arange(self, op: _Ops, count: ir.Value) -> ir.Value:
        """``0 .. count-1`` for a ``(1,)`` count, as the shapes here are kept."""
        return op.Range(self.const(0), op.Squeeze(count, self.const([0])), self.const(1))

    def build(self, beam: bool) -> list[ir.Value]:
        """With ``beam``, a greedy and a beam Loop both sit in the top-level graph, and
        ``beam_size`` gives the unused one zero trips: the greedy body carries a fraction of
        the beam bookkeeping, and ONNX Runtime prepacks the weights only for a Loop body that
        uses them directly (inside an ``If``, base decoded 30% slower). Only the cheap
        post-processing sits in an ``If`` (``export/search_graph.py``'s ``beam_outputs``)."""
        op, c = self.op, self.const
        encoded = self.inline(self.encoder, "enc/", {name: self.inputs[name] for name in ("src", "src_len")}, op)
        batch = op.Shape(self.inputs["src"], end=1)  # (1,)
        max_len, alpha = self.inputs["max_len"], self.inputs["alpha"]
        if not beam:
            picks, pick_lps, done = self.greedy(batch, max_len, *self.start_values(encoded, batch, None))
            return self.call(op, "greedy_outputs", picks, pick_lps, done, batch, alpha, self.eos, self.pad, outs=4)
        is_greedy = op.Equal(self.inputs["beam_size"], c(1))
        greedy = self.greedy(batch, op.Where(is_greedy, max_len, c(0)), *self.start_values(encoded, batch, None))
        k = op.Reshape(self.inputs["beam_size"], c([1]))
        beam_records = self.beam(batch, k, op.Where(is_greedy, c(0), max_len), *self.start_values(encoded, batch, k))
        return self.call(op, "beam_outputs", is_greedy, *greedy, *beam_records, k, batch, alpha, self.eos, self.pad,
                         outs=4)

    def inline(self, graph: ir.Graph, prefix: str, bound: Mapping[str, ir.Value],
               op: _Ops) -> dict[str, ir.Value]:
        """A copy of ``graph``'s nodes appended to ``op``'s graph, its inputs replaced by ``bound``
        and its initialisers by top-level ones named ``prefix + name`` (a graph inlined twice
        shares its weights). Returns its outputs by name."""
        copy = graph.clone()
        replaced: dict[ir.Value, ir.Value] = {}
        for value in copy.inputs:
            if value.name in bound:
                replaced[value] = bound[value.name]
            elif value.uses():  # an input only unused outputs read (the decoder's top_k) needs no value
                raise S2SError(f"graph {graph.name!r} input {value.name} has no value in generate.onnx")
        for name, value in copy.initializers.items():
            if prefix + name not in self._weights:
                self._weights[prefix + name] = self.op.initializer(value.const_value, name=prefix + name)
            replaced[value] = self._weights[prefix + name]
        for old, new in replaced.items():
            ir.convenience.replace_all_uses_with(old, new)
        nodes = list(copy)
        copy.remove(nodes)
        for node in nodes:  # the step's shapes vary between iterations: let the runtime infer them
            for value in node.outputs:
                value.type, value.shape = None, None
        op.graph_like.extend(nodes)
        outputs = {value.name: replaced.get(value, value) for value in copy.outputs}
        copy.outputs.clear()
        return outputs

    def start_values(self, encoded: dict[str, ir.Value], batch: ir.Value,
                     k: ir.Value | None) -> tuple[dict[str, ir.Value], list[ir.Value]]:
        """Decoder memory and initial state, each repeated ``k`` times per sentence for beam search
        (the memory not where the decoder takes it once per sentence)."""
        op = self.op
        rows = batch if k is None else op.Mul(batch, k)
        accepted = {value.name for value in self.decoder.inputs}
        shared = k is None or self.m.memory_per_sentence
        memory = {m.name: encoded[m.name] if shared else self.repeat(encoded[m.name], m.batch_axis, k)
                  for m in self.m.memory if m.name in accepted}
        state = []
        for s in self.m.state:
            if s.encoder_output:
                value = encoded[s.encoder_output]
                state.append(value if k is None else self.repeat(value, s.batch_axis, k))
            else:
                dims = [rows if d == "batch" else self.const([int(d)]) for d in s.shape]
                shape = op.Concat(*dims, axis=0) if dims else self.const(np.zeros(0, np.int64))
                state.append(op.ConstantOfShape(shape, value=ir.tensor(np.zeros(1, dtype=s.dtype))))
        return memory, state

    def repeat(self, value: ir.Value, axis: int, k: ir.Value) -> ir.Value:
        """``numpy.repeat(value, k, axis)``: rows i*k .. i*k+k-1 are copies of row i."""
        op = self.op
        before, dim = op.Shape(value, end=axis), op.Shape(value, start=axis, end=axis + 1)
        after = op.Shape(value, start=axis + 1)
        expanded = op.Expand(op.Unsqueeze(value, self.const([axis + 1])), op.Concat(before, dim, k, after, axis=0))
        return op.Reshape(expanded, op.Concat(before, op.Mul(dim, k), after, axis=0), allowzero=1)

    def loop(self, trips: ir.Value, carried: Mapping[str, _Carried],
             body: Callable[[_Ops, ir.Value, dict[str, ir.Value]], tuple[ir.Value, list[ir.Value]]],
             ) -> list[ir.Value]:
        """A top-level Loop: ``body(op, step, values)`` gets the carried values by key and returns
        the condition and their next values, in order. Records grow as carried flat tensors,
        not scan outputs: onnx.reference cannot stack the scans of a Loop that makes zero trips."""
        inputs = {key: _value(key, v.dtype, [None] * v.rank) for key, v in carried.items()}
        graph = ir.Graph([_value("step", "int64", []), _value("cond", "bool", []), *inputs.values()], [], nodes=[],
                         name="loop_body")
        cond, outputs = body(_Ops(graph), graph.inputs[0], inputs)
        cond.type, cond.shape = _type("bool"), ir.Shape([])
        for value, v in zip(outputs, carried.values(), strict=True):
            value.type, value.shape = _type(v.dtype), ir.Shape([None] * v.rank)
        graph.outputs.extend([cond, *outputs])
        return self.op.Loop(trips, self.const(True, "bool"), *(v.initial for v in carried.values()), body=graph,
                            _outputs=len(carried))

    def record(self, dtype: str) -> _Carried:
        """An empty flat record that grows by one row of values per step."""
        return _Carried(dtype, 1, self.const(np.zeros(0, dtype), dtype))

    def state_carried(self, state: Sequence[ir.Value]) -> dict[str, _Carried]:
        ranks = {value.name: len(value.shape or ()) for value in self.decoder.inputs}
        return {f"state{i}": _Carried(s.dtype, ranks[s.decoder_input], value)
                for i, (s, value) in enumerate(zip(self.m.state, state, strict=True))}

    def step(self, op: _Ops, tokens: ir.Value, step: ir.Value, reorder: ir.Value,
             memory: Mapping[str, ir.Value], values: Mapping[str, ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
        """Inline one decoder step and constrain its log-probs; returns them and the next state."""
        bound = {"tokens": tokens, "step": step, "reorder": reorder, **memory}
        bound.update({s.decoder_input: values[f"state{i}"] for i, s in enumerate(self.m.state)})
        out = self.inline(self.decoder, "dec/", bound, op)
        raw = out["log_probs"]
        log_probs = self.call(op, "forbid_early_eos", raw, step, self.inputs["min_len"], self.eos_onehot)
        if self.options:
            log_probs = self.call(op, "apply_options", raw, log_probs, step, self.inputs["max_len"], self.suppressed,
                                  self.inputs["prefix"], self.inputs["forced_eos"], self.inputs["forced_bos"],
                                  self.vocab_ids, self.eos)
        return log_probs, [out[s.decoder_output] for s in self.m.state]

    def greedy(self, batch: ir.Value, trips: ir.Value, memory: dict[str, ir.Value],
               state: list[ir.Value]) -> list[ir.Value]:
        """Per iteration only what stopping needs (the pick, done flags); returns the records
        ``export/search_graph.py``'s ``greedy_outputs`` reads: picks, their log-probs, done flags."""
        op, c = self.op, self.const
        reorder = self.arange(op, batch)
        carried = {"tokens": _Carried("int64", 1, op.Expand(c(self.m.decoder_start_id), batch)),
                   "done": _Carried("bool", 1, op.Expand(c(False, "bool"), batch)),
                   "picks": self.record("int64"), "pick_lps": self.record("float32"), **self.state_carried(state)}

        def body(b: _Ops, step: ir.Value, n: dict[str, ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
            log_probs, next_state = self.step(b, n["tokens"], step, reorder, memory, n)
            searching, *picked = self.call(b, "greedy_step", log_probs, n["done"], n["picks"], n["pick_lps"],
                                           self.eos, outs=5)
            return searching, [*picked, *next_state]

        final = self.loop(trips, carried, body)
        return [final[2], final[3], final[1]]

    def beam(self, batch: ir.Value, k: ir.Value, trips: ir.Value, memory: dict[str, ir.Value],
             state: list[ir.Value]) -> list[ir.Value]:
        """The Loop only records each step (``export/search_graph.py``'s ``beam_step``); returns what
        ``export/search_graph.py``'s ``n_best`` spells the K best out of after it."""
        op, c = self.op, self.const
        minus_inf = c(-np.inf, "float64")
        rows, k2 = op.Mul(batch, k), op.Mul(k, c([2]))
        width = op.Min(k2, c([len(self.m.tgt_vocab)]))  # each row's candidates
        batch_k = op.Concat(batch, k, axis=0)
        first = op.Equal(self.arange(op, k), c(0))
        shapes = [k, k2, width, self.arange(op, k2), op.Mul(op.Unsqueeze(self.arange(op, batch), c([1])), k),
                  op.Concat(batch_k, width, axis=0), op.Concat(batch, c([-1]), axis=0)]
        carried = {
            "tokens": _Carried("int64", 1, op.Expand(c(self.m.decoder_start_id), rows)),
            "reorder": _Carried("int64", 1, self.arange(op, rows)),
            "scores": _Carried("float64", 2, op.Expand(op.Where(first, c(0.0, "float64"), minus_inf), batch_k)),
            "fin_count": _Carried("int64", 1, op.Expand(c(0), batch)),
            "kept": _Carried("float64", 2, op.Expand(minus_inf, batch_k)),  # best K finished scores
            "active": _Carried("bool", 1, op.Expand(c(True, "bool"), batch)),
            **{name: self.record(dtype) for name, dtype in (
                ("parents", "int64"), ("kept_tokens", "int64"), ("kept_lps", "float32"),
                ("eos_scores", "float64"), ("eos_rows", "int64"), ("eos_lps", "float32"))},
            **self.state_carried(state),
        }

        def body(b: _Ops, step: ir.Value, n: dict[str, ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
            log_probs, next_state = self.step(b, n["tokens"], step, n["reorder"], memory, n)
            searching, *recorded = self.call(b, "beam_step", log_probs, step, *(n[key] for key in list(n)[2:12]),
                                             *shapes, self.inputs["alpha"], self.eos, outs=13)
            return searching, [*recorded, *next_state]

        final = self.loop(trips, carried, body)
        return [final[2], final[5], *final[6:12]]
