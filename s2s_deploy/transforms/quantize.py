"""Smaller or faster copies of an export: int8 dynamic quantisation (CPU), 4-bit weight-only
``MatMulNBits`` (CPU, opt-in: never exact) and fp16 (CUDA).

A quantised model no longer matches PyTorch to 1e-4, so its manifest drops the log-prob
tolerance and states the token agreement it must keep with the fp32 original instead.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization.quant_utils import quantize_data

from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import staged_directory
from s2s_deploy.format.manifest import Manifest, load_manifest
from s2s_deploy.format.subword import write_files
from s2s_deploy.transforms.fp16 import cache_interface, convert, interface_dtypes
from s2s_deploy.transforms.inspect import deployable_files
from s2s_deploy.transforms.share import share_weights

KINDS = ("int8", "fp16", "int4")
MULTI_STEP_DROPPED = ("speculative greedy stays fp32: quantised, a last-bit difference between a k-position pass and "
                      "single steps now and then moves an activation across a rounding step, and a pass's log-probs "
                      "by up to 0.04, which no measured bound holds (docs/decoding.md)")
"""Why a quantised copy has no k-position step: measured on the bundled speech model's int8 copy
(2 of 8 random sources moved 0.035 and 0.04, the others about 2e-6)."""
MIN_EMBEDDING = 1 << 16
"""Elements from which an int8 export stores a Gather table in int8 too (a 128-row table is not worth it)."""
# Token agreement with the fp32 original that parity requires, per kind: int8 weights move
# log-probs by ~1e-2, enough to flip genuine near-ties, so a few differing sentences are expected.
MIN_TOKEN_AGREEMENT = {"int8": 0.95, "fp16": 0.98, "int4": 0.90}
# int4 (docs/parity.md, "int4"): on the bundled Transformer 4-bit weights moved 1 of 300 test
# sentences' tokens and sentence scores by up to 7.7e-3, twice int8's; 0.90 allows twice int8's
# share of flipped near-ties, and a broken copy, which agrees on next to nothing, still fails.
INT4_BLOCK_SIZES = (16, 32, 64, 128)
INT4_BLOCK_SIZE = 32
"""Weights per 4-bit block (one fp32 scale each), chosen by measurement (docs/performance.md, int4)."""
INT4_ACCURACY_LEVELS = (0, 1, 2, 3, 4)
INT4_ACCURACY_LEVEL = 4
"""``MatMulNBits``' ``accuracy_level``: the activations' type inside the product (0 unset, 1 fp32,
2 fp16, 3 bf16, 4 int8 per block of a row); chosen by measurement (docs/performance.md, int4)."""


@dataclass(frozen=True)
class Int4Config:
    """How ``--int4`` packs weights: ``block_size`` weights share a scale; ``accuracy_level`` as
    ``MatMulNBits``. Symmetric blocks (no zero points)."""

    block_size: int = INT4_BLOCK_SIZE
    accuracy_level: int = INT4_ACCURACY_LEVEL


@dataclass(frozen=True)
class QuantizeReport:
    directory: Path
    kind: str
    bytes_before: dict[str, int]
    bytes_after: dict[str, int]
    generate: str | None = None  # what became of the source's generate.onnx, when it had one
    multi_step: str | None = None  # why the source's decoder_multi.onnx is not carried over, when it had one


def quantize_export(manifest: Manifest, kind: str, out_dir: Path, force: bool = False,
                    activations: str = "per-row", int4: Int4Config | None = None) -> QuantizeReport:
    """``activations`` (int8 only): ``per-row`` scales make a sentence's output independent of
    its batchmates; ``per-tensor`` is ONNX Runtime's default dynamic quantisation, faster where
    it fuses, but batch-dependent (docs/performance.md has the cost). ``int4`` (int4 only): the
    block size and accuracy level."""
    if kind not in KINDS:
        raise S2SError(f"unknown quantisation {kind!r}; known: {', '.join(KINDS)}")
    if activations not in ACTIVATION_MODES:
        raise S2SError(f"unknown int8 activation mode {activations!r}; known: {', '.join(ACTIVATION_MODES)}")
    int4 = int4 or Int4Config()
    if int4.block_size not in INT4_BLOCK_SIZES:
        raise S2SError(f"int4 block size {int4.block_size} is not one of {', '.join(map(str, INT4_BLOCK_SIZES))}")
    if int4.accuracy_level not in INT4_ACCURACY_LEVELS:
        raise S2SError(f"int4 accuracy level {int4.accuracy_level} is not one of 0-4")
    if manifest.quantization is not None:
        raise S2SError(f"{manifest.directory} is already quantised ({manifest.quantization.kind}): "
                       f"quantise the fp32 export instead")
    with staged_directory(out_dir, force) as work:
        copied = manifest.moved_to(work)
        targets = {}
        for role, graph in (("encoder", manifest.encoder), ("decoder", manifest.decoder)):
            source = manifest.graph_path(graph)
            targets[role] = target = work / graph.file
            if kind == "int8":
                _int8(source, target, activations)
            elif kind == "int4":
                _int4(source, target, int4)
            else:
                _fp16(source, target, cache_interface(manifest))
            _restore_outputs(source, target)
        shared = share_weights(list(targets.values()))
        for role, target in targets.items():
            copied = copied.with_graph(role, target, shared.get(target))
        if manifest.checkpoint is not None and (manifest.directory / manifest.checkpoint.file).is_file():
            shutil.copyfile(manifest.directory / manifest.checkpoint.file, work / manifest.checkpoint.file)
        write_files((manifest.src_vocab.tokenizer, manifest.tgt_vocab.tokenizer), work)
        if kind == "fp16":
            copied = copied.with_dtypes(interface_dtypes(targets["encoder"], targets["decoder"]))
        opset = max(_default_opset(onnx.load(str(path), load_external_data=False)).version
                    for path in targets.values())
        copied.with_quantization(kind, activations if kind == "int8" else None, MIN_TOKEN_AGREEMENT[kind],
                                 opset, *((int4.block_size, int4.accuracy_level) if kind == "int4" else (None, None)),
                                 source=manifest.directory.resolve().name).write()
        _smoke_test(work, kind)
        generate = _fuse_again(manifest, work)
        after = deployable_files(load_manifest(work))
    multi = manifest.decoder_multi
    dropped = None if multi is None else f"{multi.file} not carried over: {MULTI_STEP_DROPPED}"
    return QuantizeReport(out_dir, kind, deployable_files(manifest), after, generate, dropped)


def _fuse_again(manifest: Manifest, work: Path) -> str | None:
    """A fused graph embeds the fp32 decoder, so the copy gets its own, fused from the quantised graphs."""
    from s2s_deploy.transforms.fuse import add_to_manifest, fuse_generate

    entry = manifest.generate
    if entry is None:
        return None
    copy_manifest = load_manifest(work)
    try:
        path = fuse_generate(copy_manifest, work / entry.file, beam=entry.beam)
    except S2SError as exc:
        (work / entry.file).unlink(missing_ok=True)
        return f"{entry.file} not carried over: fusing the quantised graphs failed ({exc}); nothing fused here"
    add_to_manifest(copy_manifest, path, beam=entry.beam)
    return f"{entry.file} re-fused from the quantised graphs ({'beam' if entry.beam else 'greedy'} search)"


def _smoke_test(folder: Path, kind: str) -> None:
    """Decode a few steps in a child process: ONNX Runtime can crash outright on a converted graph
    (fp16 recurrent models segfault on CPU here), and that must not take the caller down."""
    code = (
        "import numpy as np\n"
        "from s2s_deploy.format.manifest import load_manifest\n"
        "from s2s_deploy.runtime.ort.backend import OrtBackend\n"
        "from s2s_deploy.runtime.decoding import plain\n"
        "from s2s_deploy.runtime.search import search\n"
        "from s2s_deploy.runtime.translator import encode_batch\n"
        f"m = load_manifest({str(folder)!r})\n"
        "spec = m.encoder_input\n"  # an encoder of features is fed 100 frames of its pad value
        "src = (np.full((1, *spec.item_shape(100)), spec.pad_value, spec.dtype), np.array([100])) "
        "if spec.is_features else encode_batch([m.samples[0] if m.samples else 'a'], m.src_vocab)\n"
        "search(OrtBackend(m, device='cpu'), *src, plain(2, 3))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        reason = f"signal {-result.returncode}" if result.returncode < 0 else result.stderr.strip().splitlines()[-1]
        raise S2SError(f"the {kind} graphs of this model do not run in ONNX Runtime on CPU ({reason}); "
                       "nothing was written")


ACTIVATION_MODES = ("per-row", "per-tensor")


BLOCKED_QUANTIZE_OPSET = 21
"""The first opset whose ``QuantizeLinear`` takes a scale per block of an axis (here: per row)."""


def _per_row_activations(model: onnx.ModelProto) -> None:
    """Make dynamic int8 batch-invariant: ``DynamicQuantizeLinear`` takes one scale for a whole
    activation tensor, so a sentence's int8 output changed with its batchmates. Each becomes a
    quantisation with one scale per row (the last axis reduced), in standard ops: symmetric,
    stored as uint8 around a fixed zero point of 128, so ``MatMulInteger`` keeps ONNX Runtime's
    fast uint8 x int8 kernels, and the quantiser's ``scale_x * scale_w`` products broadcast the
    ``(..., 1)`` scales over the output columns. One ``QuantizeLinear`` whose block is a whole row
    does the dividing, rounding and shifting: five elementwise nodes per activation cost beam 4 x
    16 on Marian-base a tenth of its step. That needs opset 21; the ops these graphs use mean
    the same from 18 to 21 (the checker re-validates the result)."""
    default = _default_opset(model)
    default.version = max(default.version, BLOCKED_QUANTIZE_OPSET)
    graph, nodes = model.graph, []
    c = {name: f"s2s_int8/{name}" for name in ("last_axis", "levels", "tiny", "zero")}
    graph.initializer.extend([
        onnx.numpy_helper.from_array(np.array([-1], dtype=np.int64), c["last_axis"]),
        onnx.numpy_helper.from_array(np.array(127.0, dtype=np.float32), c["levels"]),
        onnx.numpy_helper.from_array(np.array(np.finfo(np.float32).tiny, dtype=np.float32), c["tiny"]),
        onnx.numpy_helper.from_array(np.array(128, dtype=np.uint8), c["zero"]),
    ])
    row_lengths = _row_lengths(graph)
    leading = _leading_dims(model)
    zero_points = set()
    shared_zero_points: dict[tuple, str] = {}  # one per shape of the scales, made where first needed
    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            nodes.append(node)
            continue
        x, (quantised, scale, zero_point) = node.input[0], node.output
        if quantised not in row_lengths:
            raise S2SError(f"int8 per-row: cannot tell the row length of {x!r} (its MatMul weight is not stored)")
        zero_points.add(zero_point)
        p = f"{quantised}/row"
        nodes += [
            onnx.helper.make_node("Abs", [x], [f"{p}/abs"]),
            onnx.helper.make_node("ReduceMax", [f"{p}/abs", c["last_axis"]], [f"{p}/max"], keepdims=1),
            onnx.helper.make_node("Max", [f"{p}/max", c["tiny"]], [f"{p}/nonzero"]),
            onnx.helper.make_node("Div", [f"{p}/nonzero", c["levels"]], [scale]),
        ]
        key = leading.get(x)
        row_zero = shared_zero_points.get(key) if key is not None else None
        if row_zero is None:
            row_zero = f"{p}/zero_point"
            nodes += [onnx.helper.make_node("Shape", [scale], [f"{p}/scale_shape"]),
                      onnx.helper.make_node("Expand", [c["zero"], f"{p}/scale_shape"], [row_zero])]
            if key is not None:
                shared_zero_points[key] = row_zero
        nodes.append(onnx.helper.make_node("QuantizeLinear", [x, scale, row_zero], [quantised], axis=-1,
                                           block_size=row_lengths[quantised]))
    for node in nodes:
        if node.op_type == "MatMulInteger" and len(node.input) > 2 and node.input[2] in zero_points:
            node.input[2] = c["zero"]
    del graph.node[:]
    graph.node.extend(nodes)


def _default_opset(model: onnx.ModelProto) -> onnx.OperatorSetIdProto:
    return next(o for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _leading_dims(model: onnx.ModelProto) -> dict[str, tuple]:
    """Every dimension but the last of each value whose shape inference names them all. Two
    activations with the same leading dimensions have scales of one shape and share one
    zero-point tensor: a decoder step's activations are nearly all ``(batch, 1, ·)``, and the
    Shape and Expand nodes shared that way were 3.5% of a Marian-base int8 step at batch 1. Where
    inference fails, each activation keeps its own."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except (onnx.shape_inference.InferenceError, ValueError):
        return {}
    dims = {}
    for value in (*inferred.input, *inferred.value_info):
        shape = value.type.tensor_type.shape.dim
        key = tuple(d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else None
                    for d in shape[:-1])
        if shape and None not in key:
            dims[value.name] = key
    return dims


def _row_lengths(graph: onnx.GraphProto) -> dict[str, int]:
    """The row length of each activation ``MatMulInteger`` reads: its weight's first dimension,
    read through the ``Transpose`` a tied embedding's projection goes through."""
    shapes = {init.name: list(init.dims) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Transpose" and node.input[0] in shapes:
            dims = shapes[node.input[0]]
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), list(range(len(dims)))[::-1])
            shapes[node.output[0]] = [dims[i] for i in perm]
    return {node.input[0]: shapes[node.input[1]][0] for node in graph.node
            if node.op_type == "MatMulInteger" and len(shapes.get(node.input[1], ())) == 2}


def _int8(source: Path, target: Path, activations: str = "per-row") -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(source))
    _drop_initializer_value_info(model)
    _untie_gemm_weights(model)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantiser's advice to pre-process goes through the root logger
    try:
        quantize_dynamic(model, str(target), op_types_to_quantize=["MatMul", "Gemm"],
                         weight_type=QuantType.QInt8, per_channel=False)
    finally:
        root.setLevel(level)
    quantised = onnx.load(str(target))
    _quantize_embeddings(quantised.graph)
    if activations == "per-row":
        _per_row_activations(quantised)
    _unique_node_names(quantised.graph)
    onnx.save(quantised, str(target))


def _int4(source: Path, target: Path, config: Int4Config) -> None:
    """ONNX Runtime's own 4-bit weight-only quantiser: every MatMul whose weight is stored, and
    whose row length a block divides, becomes ``MatMulNBits`` (the quantiser skips the others,
    which stay fp32), the output projection's ``Gemm`` included (``_gemm_as_matmul``). Embedding
    tables stay fp32: ``GatherBlockQuantized`` dequantises a whole table to gather from it."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(source))
    _drop_initializer_value_info(model)
    _gemm_as_matmul(model)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantiser logs every node it skips
    try:
        quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=config.block_size, is_symmetric=True,
                                         accuracy_level=config.accuracy_level, op_types_to_quantize=("MatMul",))
        quantizer.process()
    finally:
        root.setLevel(level)
    quantised = quantizer.model.model
    if not any(node.op_type == "MatMulNBits" for node in quantised.graph.node):
        raise S2SError(f"int4: {source.name} has no MatMul with a stored weight of at least "
                       f"{config.block_size} rows; nothing to quantise")
    _unique_node_names(quantised.graph)
    onnx.save(quantised, str(target))


def _gemm_as_matmul(model: onnx.ModelProto) -> None:
    """The quantiser takes ``MatMul`` only, and the exported output projection, the largest read of
    a big-vocabulary step, is a ``Gemm`` (``x @ W.T + b``). Each plain ``Gemm`` (alpha and beta 1, A
    not transposed) with a stored 2-D weight becomes a ``MatMul`` with its own stored ``(K, N)``
    weight, then an ``Add`` of its bias: a weight a ``Gather`` shares (a tied embedding) keeps its
    table, and the projection gets the copy."""
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = weights.get(node.input[1]) if node.op_type == "Gemm" and len(node.input) > 1 else None
        if (weight is None or len(weight.dims) != 2 or attrs.get("alpha", 1.0) != 1.0
                or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0)):
            nodes.append(node)
            continue
        array = numpy_helper.to_array(weight)
        stored = f"{node.input[1]}.matmul"
        graph.initializer.append(numpy_helper.from_array(
            np.ascontiguousarray(array.T if attrs.get("transB", 0) else array), stored))
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        product = f"{node.output[0]}/matmul" if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], stored], [product], name=f"{node.name}_matmul"))
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}_bias"))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _quantize_embeddings(graph: onnx.GraphProto) -> None:
    """Dynamic quantisation leaves a Gather's table in fp32: an embedding is then the largest
    tensor of an int8 export. Store it as int8 with one scale (symmetric, as the quantiser does for
    weights) and dequantise only the gathered rows, with standard ops. When the table is tied to
    the output projection, that projection's int8 weight is its transpose: keep one of the two, the
    table, and let ONNX Runtime fold the transpose when it loads the graph."""
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)
    initializers = {init.name: init for init in graph.initializer}
    for name, init in list(initializers.items()):
        gathers = users.get(name, [])
        if (init.data_type != onnx.TensorProto.FLOAT or len(init.dims) != 2 or int(np.prod(init.dims)) < MIN_EMBEDDING
                or not gathers or any(n.op_type != "Gather" or n.input[0] != name or _axis(n) != 0 for n in gathers)):
            continue
        _, scale, table_q = quantize_data(numpy_helper.to_array(init), onnx.TensorProto.INT8, symmetric=True)
        weight = _tied_projection(initializers, users, table_q, scale)
        if weight is not None:
            transpose = helper.make_node("Transpose", [f"{name}_int8"], [f"{name}_int8_t"], name=f"{name}_int8_t")
            graph.node.insert(0, transpose)
            for node in users[weight]:
                node.input[:] = [f"{name}_int8_t" if i == weight else i for i in node.input]
            graph.initializer.remove(initializers.pop(weight))
        graph.initializer.remove(init)
        graph.initializer.extend([numpy_helper.from_array(table_q, f"{name}_int8"),
                                  numpy_helper.from_array(np.asarray(scale, np.float32), f"{name}_int8_scale")])
        for index, node in enumerate(gathers):
            gathered = f"{node.output[0]}_int8"
            node.input[0] = f"{name}_int8"
            dequantize = helper.make_node("DequantizeLinear", [gathered, f"{name}_int8_scale"], [node.output[0]],
                                          name=f"{node.name or name}_dequantize_{index}")
            node.output[0] = gathered
            graph.node.insert(list(graph.node).index(node) + 1, dequantize)


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def _tied_projection(initializers: dict[str, onnx.TensorProto], users: dict[str, list[onnx.NodeProto]],
                     table_q: np.ndarray, scale: np.ndarray) -> str | None:
    """The int8 MatMulInteger weight that is this table's transpose, quantised alike (the same
    ``quantize_data`` the quantiser used, so a tied weight matches bit for bit, scale included)."""
    rows, width = table_q.shape
    for name, init in initializers.items():
        scale_init = initializers.get(name.removesuffix("_quantized") + "_scale")
        if (init.data_type != onnx.TensorProto.INT8 or tuple(init.dims) != (width, rows) or scale_init is None
                or not all(n.op_type == "MatMulInteger" and n.input[1] == name for n in users.get(name, [None]))):
            continue
        if (np.array_equal(numpy_helper.to_array(scale_init), scale)
                and np.array_equal(numpy_helper.to_array(init).T, table_q)):
            return name
    return None


def _restore_outputs(source: Path, target: Path) -> None:
    """Both converters' shape inference folds ``top_k``'s default of 1 into the shapes they record
    for the TopK outputs, and ONNX Runtime then refuses a caller's pre-allocated (rows, k) output.
    The declared outputs are the exported interface: put the source's shapes back (with the
    converted element types), and drop the recorded intermediate shapes, which a runtime infers
    again on load."""
    declared = onnx.load(str(source), load_external_data=False).graph.output
    model = onnx.load(str(target))
    converted = {value.name: value.type.tensor_type.elem_type for value in model.graph.output}
    del model.graph.output[:]
    model.graph.output.extend(declared)
    for value in model.graph.output:
        value.type.tensor_type.elem_type = converted[value.name]
    del model.graph.value_info[:]
    onnx.save(model, str(target))


def _untie_gemm_weights(model: onnx.ModelProto) -> None:
    """A tied embedding feeds a Gather and a Gemm; the quantiser rewrites the Gemm's weight in
    place, which would corrupt the Gather. Give such a Gemm its own copy (quantised to int8)."""
    users: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    weights = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gemm" and len(node.input) > 1 and node.input[1] in weights and users[node.input[1]] > 1:
            copy_ = onnx.TensorProto()
            copy_.CopyFrom(weights[node.input[1]])
            copy_.name = f"{node.input[1]}.gemm"
            model.graph.initializer.append(copy_)
            node.input[1] = copy_.name


def _drop_initializer_value_info(model: onnx.ModelProto) -> None:
    """Shapes recorded for weights go stale when the quantiser transposes a Gemm weight in place."""
    weights = {init.name for init in model.graph.initializer}
    kept = [v for v in model.graph.value_info if v.name not in weights]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def _fp16(source: Path, target: Path, interface: frozenset[str]) -> None:
    model = convert(onnx.load(str(source)), interface)
    _unique_node_names(model.graph)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise S2SError(f"fp16 conversion of {source.name} gave an invalid graph: {str(exc).splitlines()[0]}") from exc
    onnx.save(model, str(target))


def _unique_node_names(graph: onnx.GraphProto) -> None:
    """The fp16 converter names the casts it inserts after their node, and the int8 rewrites add
    unnamed nodes: two nodes of one name are invalid ONNX once fuse prefixes them."""
    seen: dict[str, int] = {}
    for node in graph.node:
        name = node.name or node.op_type
        count = seen.get(name, 0)
        seen[name] = count + 1
        node.name = f"{name}_{count}" if count else name
