"""int8 exports: smaller, loadable, judged on token agreement rather than a log-prob tolerance."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from s2s_deploy.export.parity import check_parity, torch_backend_for
from s2s_deploy.runtime.errors import S2SError
from s2s_deploy.runtime.manifest import Manifest, load_manifest
from s2s_deploy.runtime.ort_backend import OrtBackend
from s2s_deploy.tools.quantize import MIN_TOKEN_AGREEMENT, quantize_export


def declared_outputs(manifest: Manifest) -> list[onnx.ValueInfoProto]:
    """The decoder's outputs as declared: shapes included, since a caller pre-allocates by them."""
    return list(onnx.load(str(manifest.graph_path(manifest.decoder)), load_external_data=False).graph.output)


# Shrink expected from int8 MatMul/Gemm weights: most of the Transformer, little of a GRU,
# whose weights live in the GRU op that dynamic quantisation leaves in fp32.
@pytest.mark.parametrize(("arch", "max_ratio"), [("transformer", 0.6), ("bahdanau", 0.97)])
def test_int8_export_is_smaller_and_agrees(exports, tmp_path: Path, arch: str, max_ratio: float) -> None:
    _, manifest = exports.get(arch)
    report = quantize_export(manifest, "int8", tmp_path / f"{arch}-int8")
    quantised = load_manifest(report.directory)
    assert quantised.raw["quantization"]["kind"] == "int8"
    assert quantised.raw["validation"]["atol"] is None
    total_before, total_after = sum(report.bytes_before.values()), sum(report.bytes_after.values())
    assert total_after < max_ratio * total_before
    assert declared_outputs(quantised) == declared_outputs(manifest)
    parity = check_parity(quantised, torch_backend_for(quantised), OrtBackend(quantised, device="cpu"),
                          list(quantised.samples)[:8], beam_size=2, max_len=30)
    assert parity.min_token_agreement == MIN_TOKEN_AGREEMENT["int8"]
    assert parity.step_max_abs_diff > 0  # int8 really changed the numbers
    assert parity.passed == all(s.agreement >= parity.min_token_agreement for s in parity.searches)


def test_quantising_twice_is_refused(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    report = quantize_export(manifest, "int8", tmp_path / "once")
    with pytest.raises(S2SError, match="already quantised"):
        quantize_export(load_manifest(report.directory), "int8", tmp_path / "twice")
    with pytest.raises(S2SError, match="already exists"):
        quantize_export(manifest, "int8", tmp_path / "once")


def test_fp16_transformer_runs_and_agrees(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("transformer")
    report = quantize_export(manifest, "fp16", tmp_path / "fp16")
    assert sum(report.bytes_after.values()) < 0.6 * sum(report.bytes_before.values())
    quantised = load_manifest(report.directory)
    assert declared_outputs(quantised) == declared_outputs(manifest)
    parity = check_parity(quantised, torch_backend_for(quantised), OrtBackend(quantised, device="cpu"),
                          list(quantised.samples)[:8], beam_size=2, max_len=30)
    assert parity.min_token_agreement == MIN_TOKEN_AGREEMENT["fp16"]
    assert 0 < parity.step_max_abs_diff < 0.5


def test_fp16_that_crashes_onnxruntime_is_refused_cleanly(exports, tmp_path: Path) -> None:
    """ONNX Runtime segfaults on CPU for fp16 recurrent graphs; the check runs in a child process."""
    _, manifest = exports.get("gru")
    with pytest.raises(S2SError, match="do not run in ONNX Runtime on CPU"):
        quantize_export(manifest, "fp16", tmp_path / "gru-fp16")
    assert not (tmp_path / "gru-fp16").exists()
