"""fp16 copies of the graphs, for CUDA: weights and compute in fp16, the cache between the
graphs in fp16, the scores the search reads in fp32. ``transforms/quantize.py`` writes the folder."""

from __future__ import annotations

from pathlib import Path

import onnx

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest

# Kept in fp32: ops whose range or precision fp16 cannot hold. LayerNormalization (its stash_type
# keeps the statistics fp32) and Softmax (ONNX Runtime's CUDA kernel accumulates in fp32) run in
# fp16: blocked, each cost a pair of Casts, 101 Casts in a Transformer-base step.
FP16_BLOCKED_OPS = ["LogSoftmax", "ReduceMean", "Pow", "Sqrt", "Exp", "Log",
                    "Range", "CumSum", "LSTM", "GRU"]


def cache_interface(manifest: Manifest) -> frozenset[str]:
    """The graph inputs and outputs that carry memory and state between the two graphs."""
    names = {m.name for m in manifest.memory}
    for spec in manifest.state:
        names.update((spec.decoder_input, spec.decoder_output))
        if spec.init == "encoder":
            names.add(spec.encoder_output)
    return frozenset(names)


def interface_dtypes(encoder: Path, decoder: Path) -> dict[str, str]:
    """Every graph input's and output's dtype, by name, read from the converted graphs (for
    ``Manifest.with_dtypes``: graph inputs and outputs, memory and state follow them)."""
    types = {}
    for path in (encoder, decoder):
        graph = onnx.load(str(path), load_external_data=False).graph
        for value in (*graph.input, *graph.output):
            types[value.name] = str(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
    return types


def convert(model: onnx.ModelProto, interface: frozenset[str]) -> onnx.ModelProto:
    """``interface`` names the float inputs and outputs that pass between the graphs (memory and
    state): they become fp16 too, so a step casts nothing in or out (with them kept fp32, the
    Casts were ~70 of a Transformer-base step's 255 CUDA nodes). Every other float input or
    output, the scores the search reads, stays fp32."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    floats = [value.name for value in (*model.graph.input, *model.graph.output)
              if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
    model = convert_float_to_float16(model, keep_io_types=[name for name in floats if name not in interface],
                                     op_block_list=FP16_BLOCKED_OPS)
    drop_repeated_producers(model.graph)
    topological_sort(model.graph)
    return model


def drop_repeated_producers(graph: onnx.GraphProto) -> None:
    """onnxruntime <= 1.31's fp16 converter inserts one Cast back to fp32 per blocked consumer
    of a weight, all writing the same output name (invalid ONNX; 1.32 shares one). Identical
    producers of one name compute the same value, so the first is kept; a name written by
    two different nodes is left for the checker to refuse."""
    kept: dict[str, onnx.NodeProto] = {}
    nodes = []
    for node in graph.node:
        first = next((kept[name] for name in node.output if name in kept), None)
        if first is not None and _same_computation(first, node):
            continue
        kept.update((name, node) for name in node.output)
        nodes.append(node)
    if len(nodes) != len(graph.node):
        del graph.node[:]
        graph.node.extend(nodes)
        infos = {info.name: info for info in reversed(graph.value_info)}  # the first of each name
        del graph.value_info[:]
        graph.value_info.extend(reversed(infos.values()))


def _same_computation(a: onnx.NodeProto, b: onnx.NodeProto) -> bool:
    return (a.op_type, a.domain, list(a.input), list(a.output), list(a.attribute)) == (
        b.op_type, b.domain, list(b.input), list(b.output), list(b.attribute))


def topological_sort(graph: onnx.GraphProto) -> None:
    """The fp16 converter appends the casts it inserts at the end of the graph; ONNX wants every
    node after the producers of its inputs."""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(name in available for name in n.input)]
        if not ready:
            raise S2SError("fp16 conversion left a node whose input nothing produces")
        for node in ready:
            available.update(node.output)
        ordered.extend(ready)
        taken = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in taken]
    del graph.node[:]
    graph.node.extend(ordered)
