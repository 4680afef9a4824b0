"""Smaller or faster copies of an export: int8 dynamic quantisation (CPU) and fp16 (CUDA).

A quantised model no longer matches PyTorch to 1e-4, so its manifest drops the log-prob
tolerance and states the token agreement it must keep with the fp32 original instead.
"""

from __future__ import annotations

import copy
import logging
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import onnx

from s2s_deploy.runtime.errors import S2SError
from s2s_deploy.runtime.manifest import Manifest, sha256_of, write_manifest
from s2s_deploy.runtime.staging import staged_directory
from s2s_deploy.runtime.subword import write_files

KINDS = ("int8", "fp16")
# Token agreement with the fp32 original that parity requires, per kind: int8 weights move
# log-probs by ~1e-2, enough to flip genuine near-ties, so a few differing sentences are expected.
MIN_TOKEN_AGREEMENT = {"int8": 0.95, "fp16": 0.98}
# Kept in fp32 under fp16: reductions whose range or precision fp16 cannot hold.
FP16_BLOCKED_OPS = ["Softmax", "LogSoftmax", "LayerNormalization", "ReduceMean", "Pow", "Sqrt", "Exp", "Log",
                    "Range", "CumSum", "LSTM", "GRU"]


@dataclass(frozen=True)
class QuantizeReport:
    directory: Path
    kind: str
    bytes_before: dict[str, int]
    bytes_after: dict[str, int]


def quantize_export(manifest: Manifest, kind: str, out_dir: Path, force: bool = False) -> QuantizeReport:
    if kind not in KINDS:
        raise S2SError(f"unknown quantisation {kind!r}; known: {', '.join(KINDS)}")
    if manifest.raw.get("quantization"):
        raise S2SError(f"{manifest.directory} is already quantised ({manifest.raw['quantization']['kind']})")
    raw = copy.deepcopy(manifest.raw)
    before, after = {}, {}
    with staged_directory(out_dir, force) as work:
        for role, graph in (("encoder", manifest.encoder), ("decoder", manifest.decoder)):
            source = manifest.graph_path(graph)
            target = work / graph.file
            (_int8 if kind == "int8" else _fp16)(source, target)
            _restore_outputs(source, target)
            before[graph.file], after[graph.file] = source.stat().st_size, target.stat().st_size
            raw["graphs"][role]["sha256"] = sha256_of(target)
            raw["graphs"][role].pop("ort_file", None)  # .ort copies are of the fp32 graphs
            raw["graphs"][role].pop("ort_sha256", None)
        checkpoint = manifest.directory / raw["checkpoint"]["file"]
        if checkpoint.is_file():
            shutil.copyfile(checkpoint, work / checkpoint.name)
        write_files((manifest.src_vocab.tokenizer, manifest.tgt_vocab.tokenizer), work)
        raw["graphs"].pop("generate", None)  # a fused graph embeds the fp32 decoder: fuse the copy anew
        raw["quantization"] = {"kind": kind, "source": str(manifest.directory)}
        raw["validation"] = {"atol": None, "min_token_agreement": MIN_TOKEN_AGREEMENT[kind],
                             "fp32_max_abs_diff": raw["validation"]["max_abs_diff"]}
        write_manifest(work, raw)
        _smoke_test(work, kind)
    return QuantizeReport(out_dir, kind, before, after)


def _smoke_test(folder: Path, kind: str) -> None:
    """Decode a few steps in a child process: ONNX Runtime can crash outright on a converted graph
    (fp16 recurrent models segfault on CPU here), and that must not take the caller down."""
    code = (
        "import numpy as np\n"
        "from s2s_deploy.runtime.manifest import load_manifest\n"
        "from s2s_deploy.runtime.ort_backend import OrtBackend\n"
        "from s2s_deploy.runtime.search import SearchConfig, search\n"
        "from s2s_deploy.runtime.translator import encode_batch\n"
        f"m = load_manifest({str(folder)!r})\n"
        "search(OrtBackend(m, device='cpu'), *encode_batch([m.samples[0] if m.samples else 'a'], m.src_vocab),"
        " SearchConfig(2, 1, 3))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        reason = f"signal {-result.returncode}" if result.returncode < 0 else result.stderr.strip().splitlines()[-1]
        raise S2SError(f"the {kind} graphs of this model do not run in ONNX Runtime on CPU ({reason}); "
                       "nothing was written")


def _int8(source: Path, target: Path) -> None:
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


def _restore_outputs(source: Path, target: Path) -> None:
    """Both converters' shape inference folds ``top_k``'s default of 1 into the shapes they record
    for the TopK outputs, and ONNX Runtime then refuses a caller's pre-allocated (rows, k) output.
    The declared outputs are the exported interface: put the source's back, and drop the
    recorded intermediate shapes, which a runtime infers again on load."""
    declared = onnx.load(str(source), load_external_data=False).graph.output
    model = onnx.load(str(target))
    del model.graph.output[:]
    model.graph.output.extend(declared)
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


def _fp16(source: Path, target: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True, op_block_list=FP16_BLOCKED_OPS)
    _unique_node_names(model.graph)
    _topological_sort(model.graph)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise S2SError(f"fp16 conversion of {source.name} gave an invalid graph: {str(exc).splitlines()[0]}") from exc
    onnx.save(model, str(target))


def _topological_sort(graph: onnx.GraphProto) -> None:
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


def _unique_node_names(graph: onnx.GraphProto) -> None:
    """The fp16 converter names the casts it inserts after their node, so a node whose output
    feeds two blocked ops yields two casts with one name, which ONNX forbids."""
    seen: dict[str, int] = {}
    for node in graph.node:
        count = seen.get(node.name, 0)
        seen[node.name] = count + 1
        if count:
            node.name = f"{node.name}_{count}"
