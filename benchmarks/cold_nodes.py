"""Why a batch-1 step costs ~1 ms more than its matrix products: its small nodes run on cold caches.

    python benchmarks/cold_nodes.py EXPORT_DIR [--threads 2] [--calls 200]

Two measurements, both without ONNX Runtime's profiler (whose own cost per node is of the same
order as the effect):

1. Chains of 50 small nodes as a decoder step has them (``SkipLayerNormalization`` on 512
   values, a bias ``Add``), each with its own parameters, timed warm and right after streaming a
   step's weight bytes through the caches, as every step's matrix products do.
2. The export's decoder step at a fixed position (batch 1, a 16-token cache) and its matrix
   products alone (``s2s_deploy.bench.roofline``), call by call in alternation, so both see the
   same machine; the median of the per-pair differences is what the graph around the products costs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from s2s_deploy.bench import roofline
from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.format.names import TOP_OUTPUTS
from s2s_deploy.runtime.ort.backend import OrtBackend, session_options
from s2s_deploy.runtime.translator import encode_batch

NODES = 50
CACHED = 16


def node_chain(op: str, threads: int) -> ort.InferenceSession:
    rng = np.random.default_rng(0)
    nodes, weights, previous = [], [], "x"
    for i in range(NODES):
        if op == "SkipLayerNormalization":
            weights += [numpy_helper.from_array(rng.standard_normal((1, 1, 512)).astype(np.float32), f"s{i}"),
                        numpy_helper.from_array(np.ones(512, np.float32), f"g{i}"),
                        numpy_helper.from_array(np.zeros(512, np.float32), f"b{i}")]
            nodes.append(helper.make_node(op, [previous, f"s{i}", f"g{i}", f"b{i}"], [f"y{i}"], domain="com.microsoft"))
        else:
            weights.append(numpy_helper.from_array(rng.standard_normal(512).astype(np.float32), f"b{i}"))
            nodes.append(helper.make_node(op, [previous, f"b{i}"], [f"y{i}"]))
        previous = f"y{i}"
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", 512])],
                              [helper.make_tensor_value_info(previous, TensorProto.FLOAT, None)], weights)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    return ort.InferenceSession(model.SerializeToString(), session_options(threads, spin_between_runs=False),
                                providers=["CPUExecutionProvider"])


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def step_feeds(manifest, backend: OrtBackend) -> tuple[dict[str, np.ndarray], list[str]]:
    """A batch-1 step's inputs at position ``CACHED``, the cache filled with random values."""
    src, src_len = encode_batch(list(manifest.samples)[:1], manifest.src_vocab)
    outputs = list(manifest.encoder.outputs)
    encoded = dict(zip(outputs, backend.encoder.run(outputs, {"src": src, "src_len": src_len}), strict=True))
    accepted = {i.name for i in backend.decoder.get_inputs()}
    feeds = {m.name: encoded[m.name] for m in manifest.memory if m.name in accepted}
    rng = np.random.default_rng(0)
    for state in manifest.state:
        shape = [CACHED if axis == state.grow_axis else size for axis, size in enumerate(state.zeros_shape(1))]
        feeds[state.decoder_input] = rng.standard_normal(shape).astype(np.float32) * 0.1
    small = {"tokens": np.full(1, 5, np.int64), "reorder": np.zeros(1, np.int64),
             "step": np.array(CACHED, np.int64), "top_k": np.array([1], np.int64)}
    feeds.update({name: value for name, value in small.items() if name in accepted})
    produced = {o.name for o in backend.decoder.get_outputs()}
    wanted = [n for n in (*TOP_OUTPUTS, *(s.decoder_output for s in manifest.state)) if n in produced]
    return feeds, wanted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    manifest = load_manifest(args.export_dir)
    weights = roofline.step_weights(manifest.graph_path(manifest.decoder))
    flood = np.ones(weights.bytes // 4, np.float32)
    x = np.random.default_rng(1).standard_normal((1, 1, 512)).astype(np.float32)
    for op in ("SkipLayerNormalization", "Add"):
        session = node_chain(op, args.threads)
        warm, cold = [], []
        for _ in range(20):
            session.run(None, {"x": x})
        for _ in range(40):
            warm.append(timed(lambda s=session: s.run(None, {"x": x})))
            flood.sum()
            cold.append(timed(lambda s=session: s.run(None, {"x": x})))
        print(f"{op}: {1e6 * np.median(warm) / NODES:.2f} us per node warm, {1e6 * np.median(cold) / NODES:.2f} "
              f"after streaming {weights.bytes / 1e6:.0f} MB")
    backend = OrtBackend(manifest, device="cpu", threads=args.threads)
    feeds, wanted = step_feeds(manifest, backend)
    products = roofline.ProductsGraph(weights.matrices, args.threads)
    step_s, products_s = [], []
    for call in range(args.calls + 5):
        one_step = timed(lambda: backend.decoder.run(wanted, feeds))
        alone = timed(lambda: products.run(1))
        if call >= 5:
            step_s.append(one_step)
            products_s.append(alone)
    step_ms, products_ms = 1000 * np.array(step_s), 1000 * np.array(products_s)
    print(f"decoder step (batch 1, {CACHED} cached): median {np.median(step_ms):.2f} ms; its matrix products alone "
          f"{np.median(products_ms):.2f} ms; step - products, median of {args.calls} pairs: "
          f"{np.median(step_ms - products_ms):.2f} ms")


if __name__ == "__main__":
    main()
