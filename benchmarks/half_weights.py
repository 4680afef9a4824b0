"""Can half-precision weights speed up a batch-1 step on this CPU through ONNX Runtime?

    python benchmarks/half_weights.py [--threads 2] [--rows 1,16] [--k 512] [--n 32000]

A batch-1 fp32 step is bound by streaming its weights, so bf16 or fp16 weights would halve the
bytes, if ONNX Runtime's CPU provider multiplied them without widening to fp32 first. This builds
one ``MatMul`` of (rows x K) by a (K x N) weight in fp32, fp16 and bf16, and prints the median and fastest call
of each and its error against float64, or the provider's refusal. The CPU's flags (``avx512_bf16``,
``amx_bf16``, ``avx512_fp16``) are printed too: the kernels, not the flags, decide.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ml_dtypes  # onnx's own dependency: numpy's bfloat16
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from s2s_deploy.runtime.ort.backend import session_options

TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


NUMPY_TYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def _session(weight: np.ndarray, kind: str, threads: int) -> ort.InferenceSession:
    k, n = weight.shape
    dtype = TYPES[kind]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "product",
        [helper.make_tensor_value_info("x", dtype, ["rows", k])],
        [helper.make_tensor_value_info("y", dtype, ["rows", n])],
        [helper.make_tensor("w", dtype, [k, n], weight.astype(NUMPY_TYPES[kind]).tobytes(), raw=True)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return ort.InferenceSession(model.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])


def _timed(session: ort.InferenceSession, feed: np.ndarray, calls: int = 40) -> tuple[float, float, np.ndarray]:
    """The median and fastest call, in ms, and the output."""
    out = session.run(None, {"x": feed})[0]
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        session.run(None, {"x": feed})
        times.append(time.perf_counter() - started)
    return 1000 * float(np.median(times)), 1000 * min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--n", type=int, default=32000)
    args = parser.parse_args()
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().split()) if cpuinfo.exists() else set()
    print(f"onnxruntime {ort.__version__}; CPU flags: "
          + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ("avx512_bf16", "amx_bf16", "avx512_fp16")))
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((args.k, args.n)) * 0.05).astype(np.float32)
    for rows in (int(r) for r in args.rows.split(",")):
        x = rng.standard_normal((rows, args.k)).astype(np.float32)
        for kind in TYPES:
            exact = x.astype(NUMPY_TYPES[kind])
            try:
                median, fastest, out = _timed(_session(weight, kind, args.threads), exact)
            except Exception as exc:  # the provider's refusal is the finding
                print(f"rows {rows:3d} {kind}: not run: {str(exc).splitlines()[0][:120]}")
                continue
            wide_w = weight.astype(NUMPY_TYPES[kind]).astype(np.float64)
            error = float(np.abs(out.astype(np.float64) - exact.astype(np.float64) @ wide_w).max())
            megabytes = args.k * args.n * np.dtype(NUMPY_TYPES[kind]).itemsize / 1e6
            print(f"rows {rows:3d} {kind}: median {median:.3f} ms (fastest {fastest:.3f}), "
                  f"{megabytes / median:.1f} GB/s of weights, max error {error:.2e}")


if __name__ == "__main__":
    main()
