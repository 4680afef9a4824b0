"""What a decoder step costs besides its matrix products: the step with every weight product
replaced by a copy to the product's width, timed on cold caches, variant against variant.

    python benchmarks/graph_floor.py EXPORT_DIR [VARIANT=DECODER.onnx|EXPORT_DIR ...] [--calls 200]

Each weight product (a ``MatMul`` or ``Gemm`` reading a 2-D initializer) becomes a ``Pad`` (to a
wider output) or a ``Slice`` (to a narrower one): a few microseconds instead of streaming the
weights, with every other node, shape and dependency kept. Before each call, numpy streams as many
bytes as the step's weights, so the nodes find their data evicted as inside a real step. With
``--step``, the whole step and its products alone (``s2s_deploy.bench.roofline``) join the rotation,
which checks that step = products + this part.

The first graph is the export's own decoder; each ``VARIANT`` is another decoder graph (a changed
copy of this one) or another export of the same model. Calls rotate, each rotation starting one
graph later, so every graph sees the same minute and every position; each variant gets the median
of its per-rotation differences from the first.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from cold_nodes import step_feeds
from onnx import helper, numpy_helper

from s2s_deploy.bench import roofline
from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest, load_manifest
from s2s_deploy.runtime.ort.backend import OrtBackend, session_options


def without_products(path: Path) -> tuple[onnx.ModelProto, int]:
    """The graph with each weight product replaced by a Pad or Slice to its output width."""
    model = onnx.load(str(path))
    graph = model.graph
    weights = {i.name: i for i in graph.initializer if len(i.dims) == 2}
    nodes, replaced = [], 0

    def constant(values: list[int]) -> str:
        name = f"graph_floor/{len(graph.initializer)}"
        graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or node.input[1] not in weights:
            nodes.append(node)
            continue
        inner, outer = weights[node.input[1]].dims
        if any(a.name == "transB" and a.i for a in node.attribute):
            inner, outer = outer, inner
        if outer >= inner:
            nodes.append(helper.make_node("Pad", [node.input[0], constant([0, outer - inner]), "", constant([-1])],
                                          list(node.output)))
        else:
            nodes.append(helper.make_node("Slice", [node.input[0], constant([0]), constant([outer]), constant([-1])],
                                          list(node.output)))
        replaced += 1
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model, replaced


def _call(session: ort.InferenceSession, manifest: Manifest, threads: int):
    backend = OrtBackend(manifest, device="cpu", threads=threads)
    feeds, wanted = step_feeds(manifest, backend)
    accepted = {i.name for i in session.get_inputs()}
    produced = {o.name for o in session.get_outputs()}
    feeds = {name: value for name, value in feeds.items() if name in accepted}
    wanted = [name for name in wanted if name in produced]
    return lambda: session.run(wanted, feeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("variants", nargs="*", help="LABEL=PATH: another decoder graph or export folder")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--step", action="store_true", help="also time the whole step and its products alone")
    args = parser.parse_args()
    try:
        manifest = load_manifest(args.export_dir)
    except S2SError as exc:
        raise SystemExit(f"error: {exc}") from None
    options = session_options(args.threads, spin_between_runs=False)
    calls, stripped = {}, {}
    for spec in [f"export={manifest.graph_path(manifest.decoder)}", *args.variants]:
        label, _, path = spec.partition("=")
        own = manifest if path.endswith(".onnx") else load_manifest(path)
        graph, stripped[label] = without_products(Path(path) if path.endswith(".onnx") else own.graph_path(own.decoder))
        session = ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
        calls[label] = _call(session, own, args.threads)
    weights = roofline.step_weights(manifest.graph_path(manifest.decoder))
    if args.step:
        decoder = str(manifest.graph_path(manifest.decoder))
        step = ort.InferenceSession(decoder, options, providers=["CPUExecutionProvider"])
        calls["whole step"] = _call(step, manifest, args.threads)
        products = roofline.ProductsGraph(weights.matrices, args.threads)
        calls["products alone"] = lambda: products.run(1)
    flood = np.ones(weights.bytes // 4, np.float32)
    for call in calls.values():
        for _ in range(10):
            call()
    times: dict[str, list[float]] = {label: [] for label in calls}
    labels = list(calls)
    for rotation in range(args.calls):
        start = rotation % len(labels)
        for label in labels[start:] + labels[:start]:
            flood.sum()
            started = time.perf_counter()
            calls[label]()
            times[label].append(time.perf_counter() - started)
    first = np.array(times["export"])
    for label, values in times.items():
        note = f" ({stripped[label]} products replaced)" if label in stripped else ""
        print(f"{label}{note}: median {1000 * np.median(values):.3f} ms; minus the export's, median of rotations "
              f"{1000 * np.median(np.array(values) - first):+.3f} ms")
    if args.step:
        rest = np.array(times["whole step"]) - np.array(times["products alone"]) - first
        print(f"whole step - products alone - export without products, median of rotations: "
              f"{1000 * np.median(rest):+.3f} ms")


if __name__ == "__main__":
    main()
