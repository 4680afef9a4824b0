"""A decoder step flushes denormals on every thread that runs it, and on no thread after."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from s2s_deploy.runtime.ort import denormals
from s2s_deploy.runtime.ort.backend import _create

pytestmark = pytest.mark.skipif(not denormals.available(),
                                reason="MXCSR is set only on x86-64 Linux with glibc; elsewhere nothing is flushed")

VOCAB = 50_000


def _log_softmax_model(path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("LogSoftmax", ["x"], ["y"], axis=-1)], "step",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, VOCAB])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_flushing_sets_ftz_and_daz_for_the_run_only() -> None:
    before = denormals.mxcsr()
    seen = denormals.flushing(denormals.mxcsr)()
    assert seen is not None and before is not None
    assert seen & denormals.MXCSR_FLUSH == denormals.MXCSR_FLUSH
    assert denormals.mxcsr() == before


def test_flushing_restores_after_an_exception() -> None:
    before = denormals.mxcsr()

    def fails() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError):
        denormals.flushing(fails)()
    assert denormals.mxcsr() == before


def test_a_step_session_leaves_its_creating_thread_as_it_was(tmp_path: Path) -> None:
    """ONNX Runtime sets the creating thread's flags from a process's first session, for good:
    a fresh process makes the step session its first."""
    model = _log_softmax_model(tmp_path / "step.onnx")
    probe = ("import sys; from s2s_deploy.runtime.ort import denormals; "
             "from s2s_deploy.runtime.ort.backend import _create; "
             "before = denormals.mxcsr(); _create(sys.argv[1], 'cpu', 2, step=True); print(before, denormals.mxcsr())")
    done = subprocess.run([sys.executable, "-c", probe, str(model)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = done.stdout.split()
    assert before == after


@pytest.mark.parametrize("threads", [1, 2])
def test_log_softmax_over_a_wide_spread_gives_the_same_bits_flushed(tmp_path: Path, threads: int) -> None:
    """Logits spread 30 wide: many exponentials are denormal; they change no output bit."""
    model = _log_softmax_model(tmp_path / "step.onnx")
    x = (np.random.default_rng(0).standard_normal((16, VOCAB)) * 30).astype(np.float32)
    flushed, _ = _create(model, "cpu", threads, step=True)
    plain = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    got = denormals.flushing(flushed.run)(None, {"x": x})[0]
    want = plain.run(None, {"x": x})[0]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    wide = (x - x.max(axis=1, keepdims=True)) < -87.0  # where exp() underflows to a denormal or zero
    assert wide.mean() > 0.001
