"""int8 integer products are exact on every x86-64 CPU (docs/parity.md, "int8 on CPUs without VNNI").

Without VNNI, ONNX Runtime's uint8 x int8 kernels add pairs of products in 16 bits and saturate;
the runtime's sessions then ask for its uint8 x uint8 kernels, which do not. The product test
runs on whatever CPU runs the suite: on a VNNI machine it passes either way, on an AVX2-only one
it fails without the session option (``benchmarks/int8_precision.py products`` under
``qemu-x86_64 -cpu Haswell``: 4,095 of 4,096 sums wrong, by up to 8.2e6).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from s2s_deploy.runtime.ort.backend import (
    PRECISE_INT8_KEY,
    int8_products_saturate,
    saturating_cpu,
    session_options,
)

HASWELL = "processor\t: 0\nflags\t\t: fpu sse4_1 sse4_2 avx avx2 fma bmi2\n"
ICE_LAKE = "processor\t: 0\nflags\t\t: fpu sse4_1 avx avx2 avx512f avx512bw avx512_vnni\n"
ALDER_LAKE = "processor\t: 0\nflags\t\t: fpu sse4_1 avx avx2 avx_vnni\n"


def test_which_cpus_saturate() -> None:
    assert saturating_cpu("x86_64", HASWELL)
    assert not saturating_cpu("x86_64", ICE_LAKE) and not saturating_cpu("x86_64", ALDER_LAKE)
    assert saturating_cpu("AMD64", None)  # flags unknown: exact rather than fast
    assert not saturating_cpu("aarch64", None) and not saturating_cpu("arm64", HASWELL)


def test_session_option_follows_the_cpu() -> None:
    """Set where the products saturate; left out elsewhere, where it only costs (+20% CPU time
    for int8 on this AVX-512 VNNI machine, the same bits)."""
    try:
        asked = session_options(1).get_session_config_entry(PRECISE_INT8_KEY)
    except RuntimeError:  # ONNX Runtime's answer for a key never set
        asked = None
    assert (asked == "1") == int8_products_saturate()


def test_int8_products_are_the_exact_integer_sums() -> None:
    """The export's product (uint8 activations around 128, int8 weights) at its worst: every pair
    of products near the int16 limit."""
    rng = np.random.default_rng(0)
    m, k, n = 16, 256, 64
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a[:4], w[:, :8] = 255, 127
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "zero"], ["y"])], "products",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [m, n])],
        [helper.make_tensor("w", TensorProto.INT8, [k, n], w.tobytes(), raw=True),
         helper.make_tensor("zero", TensorProto.UINT8, [], [128])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = ort.InferenceSession(model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"a": a})
    np.testing.assert_array_equal(got, (a.astype(np.int64) - 128) @ w.astype(np.int64))
