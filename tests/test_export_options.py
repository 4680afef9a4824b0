"""Optimised and .ort exports are validated and parity-checked like any export."""

from __future__ import annotations

from pathlib import Path

import onnx

from s2s_deploy.architecture.registry import get_plugin
from s2s_deploy.export.exporter import export_model
from s2s_deploy.export.sources import load_source
from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.modeling.torch_backend import torch_backend_for
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.verify.parity import check_parity


def test_optimized_and_ort_format_export(tmp_path: Path) -> None:
    plugin = get_plugin("bahdanau")
    source = load_source(plugin, None, workdir=tmp_path)
    out = tmp_path / "optimized"
    export_model(plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, out,
                 checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples,
                 optimize=True, ort_format=True)
    manifest = load_manifest(out)
    assert manifest.to_dict()["ort_optimized"] is True
    assert manifest.decoder.ort_file == "decoder.ort" and (out / "decoder.ort").is_file()
    assert onnx.load(str(out / "decoder.onnx")).metadata_props  # facts survive the optimiser
    reference = torch_backend_for(manifest)
    for graph_format in ("onnx", "ort"):
        candidate = OrtBackend(manifest, device="cpu", graph_format=graph_format)
        report = check_parity(manifest, reference, candidate, list(manifest.samples), beam_size=3, max_len=30)
        assert report.passed, (graph_format, report)
