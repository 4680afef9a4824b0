"""What an export holds, read from the graphs themselves (torch-free)."""

from __future__ import annotations

import collections
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from s2s_deploy.format.manifest import MANIFEST_NAME, Manifest


@dataclass(frozen=True)
class GraphSummary:
    role: str
    file: str
    opset: int
    nodes: int
    parameters: int
    parameter_bytes: int
    file_bytes: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    top_ops: tuple[tuple[str, int], ...]

    @property
    def size_ratio(self) -> float:
        return self.file_bytes / self.parameter_bytes if self.parameter_bytes else float("inf")


def summarise(manifest: Manifest) -> list[GraphSummary]:
    """The encoder and decoder, and generate.onnx when ``s2s-deploy fuse`` added it."""
    graphs = [_summary(role, manifest.graph_path(graph)) for role, graph in
              (("encoder", manifest.encoder), ("decoder", manifest.decoder))]
    generate = manifest.generate
    if generate and (manifest.directory / generate.file).is_file():
        graphs.append(_summary("generate", manifest.directory / generate.file))
    return graphs


def startable_providers(manifest: Manifest) -> tuple[list[str], list[str]]:
    """(providers that start a session on the encoder here, providers installed but failing to).

    onnxruntime-gpu lists CUDA and TensorRT wherever it is installed; only a session tells
    whether their libraries and a GPU are there. Probed quietly: ORT's C++ log goes to /dev/null."""
    import onnxruntime as ort

    from s2s_deploy.runtime.ort.backend import CPU, quiet_native_output, session_options

    works, fails = [], []
    for provider in ort.get_available_providers():
        if provider == CPU:
            works.append(provider)
            continue
        try:
            with quiet_native_output(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                session = ort.InferenceSession(str(manifest.graph_path(manifest.encoder)), session_options(1),
                                               providers=[provider, CPU])
            started = session.get_providers()[0] == provider
        except Exception:  # any failure to start means "not usable here"
            started = False
        (works if started else fails).append(provider)
    return works, fails


def deployable_files(manifest: Manifest) -> dict[str, int]:
    """Bytes of each file a deployment loads: the graphs, the external data they read, the
    manifest, and the tokenizer files a text model reads. The checkpoint (parity only) and
    generate.onnx (``--engine graph`` only) are not among them."""
    names = [MANIFEST_NAME]
    for graph in (manifest.encoder, manifest.decoder):
        names += [graph.file, *(name for name, _ in graph.external_data)]
    names += [vocab.tokenizer.name for vocab in (manifest.src_vocab, manifest.tgt_vocab) if vocab.tokenizer]
    return {name: (manifest.directory / name).stat().st_size for name in dict.fromkeys(names)}


def shared_parameter_bytes(manifest: Manifest) -> int:
    """Bytes of initializers both graphs use (same shape and content), however they are stored."""
    digests = []
    for graph in (manifest.encoder, manifest.decoder):
        model = onnx.load(str(manifest.graph_path(graph)))
        digests.append({(init.dims.__repr__(), onnx.numpy_helper.to_array(init).tobytes()): _nbytes(init)
                        for init in model.graph.initializer if _nbytes(init) >= 1024})
    return sum(size for key, size in digests[0].items() if key in digests[1])


def _nbytes(init: onnx.TensorProto) -> int:
    dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
    return int(np.prod(init.dims, dtype=np.int64)) * np.dtype(dtype).itemsize


def _summary(role: str, path: Path) -> GraphSummary:
    model = onnx.load(str(path))
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    ops = collections.Counter(node.op_type for node in graph.node)
    return GraphSummary(
        role=role, file=path.name, opset=opset, nodes=len(graph.node),
        parameters=sum(int(np.prod(i.dims, dtype=np.int64)) for i in graph.initializer),
        parameter_bytes=sum(_nbytes(i) for i in graph.initializer), file_bytes=path.stat().st_size,
        inputs=tuple(f"{v.name}{_shape(v)}" for v in graph.input),
        outputs=tuple(f"{v.name}{_shape(v)}" for v in graph.output),
        top_ops=tuple(ops.most_common(6)),
    )


def _shape(value: onnx.ValueInfoProto) -> str:
    dims = [d.dim_param or str(d.dim_value) for d in value.type.tensor_type.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name
    return f" {dtype}[{', '.join(dims)}]"
