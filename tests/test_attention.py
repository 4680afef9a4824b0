"""Attention maps from the exported graphs: real distributions, PyTorch parity, figures, CLI errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from click.testing import CliRunner

from s2s_deploy.architecture.registry import REGISTRY, get_plugin
from s2s_deploy.cli import main
from s2s_deploy.errors import S2SError
from s2s_deploy.export.exporter import export_model
from s2s_deploy.modeling.torch_backend import torch_backend_for
from s2s_deploy.pictures.attention import attention_map, compare_attention, panel_layout
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.translator import encode_batch

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ATTENTION_ARCHS = sorted(entry.plugin.name for entry in REGISTRY.entries() if entry.plugin.has_attention)
TEXTS = ["a much longer source sentence", "short", "middling one"]


def assert_png(path) -> None:
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_MAGIC
    assert imread(path).ndim == 3


@pytest.mark.parametrize("arch", ATTENTION_ARCHS)
def test_onnx_attention_is_a_distribution_over_real_source_tokens(exports, arch: str) -> None:
    _, manifest = exports.get(arch)
    backend = OrtBackend(manifest, device="cpu")
    src, src_len = encode_batch(TEXTS, manifest.src_vocab)
    run = backend.start(src, src_len, keep_attention=True)
    reorder = np.arange(len(TEXTS), dtype=np.int64)
    tokens = np.full(len(TEXTS), backend.decoder_start_id, dtype=np.int64)
    for _ in range(3):
        tokens = run.step(tokens, reorder).argmax(axis=1)
        weights = run.attention()
        assert weights is not None and 2 <= weights.ndim <= 4
        assert weights.shape[0] == len(TEXTS) and weights.shape[-1] == src.shape[1]
        for row, length in enumerate(src_len):
            np.testing.assert_allclose(weights[row, ..., :length].sum(axis=-1), 1.0, atol=1e-5)
            assert np.all(weights[row, ..., length:] < 1e-6)


@pytest.mark.parametrize("arch", ATTENTION_ARCHS)
def test_pytorch_and_onnx_maps_agree(exports, arch: str) -> None:
    _, manifest = exports.get(arch)
    comparison = compare_attention(torch_backend_for(manifest), OrtBackend(manifest, device="cpu"), manifest,
                                   "hello world", max_len=6)
    assert comparison.reference.target_ids == comparison.candidate.target_ids
    assert comparison.max_abs_diff < manifest.to_dict()["validation"]["atol"]


def test_attention_map_rows_labels_and_mean(exports) -> None:
    _, manifest = exports.get("transformer")
    amap = attention_map(OrtBackend(manifest, device="cpu"), manifest, "hi there", max_len=5)
    steps, panels, source = amap.weights.shape
    assert source == len(amap.source_tokens) == len("hi there") + 1
    assert amap.source_tokens[:2] == ("h", "i") and amap.source_tokens[-1] == manifest.src_vocab.tokens[2]
    assert steps == len(amap.target_tokens) <= 5 and panels == len(amap.panels) == np.prod(amap.grid)
    np.testing.assert_allclose(amap.weights.sum(axis=-1), 1.0, atol=1e-5)
    mean = amap.reduce("mean")
    assert mean.weights.shape == (steps, 1, source) and mean.grid == (1, 1)
    np.testing.assert_allclose(mean.weights[:, 0], amap.weights.mean(axis=1))


def test_panel_layout_follows_the_rank() -> None:
    assert panel_layout((2, 7)) == (("attention",), (1, 1))
    assert panel_layout((2, 1, 7)) == (("attention",), (1, 1))
    assert panel_layout((2, 3, 7)) == (("layer 1", "layer 2", "layer 3"), (1, 3))
    names, grid = panel_layout((2, 2, 4, 7))
    assert grid == (2, 4) and names[6] == "layer 2 head 3"
    with pytest.raises(S2SError, match="expected"):
        panel_layout((2, 1, 1, 1, 7))


def test_cli_writes_a_png(exports, tmp_path) -> None:
    _, manifest = exports.get("bahdanau")
    out = tmp_path / "attention.png"
    result = CliRunner().invoke(main, ["attention", str(manifest.directory), "hello", "--out", str(out),
                                       "--max-len", "6", "--device", "cpu", "--compare"])
    assert result.exit_code == 0, result.output
    assert "max |diff| attention" in result.stdout
    assert_png(out)


def test_plot_benchmark_writes_a_png(tmp_path) -> None:
    from s2s_deploy.pictures.plot import plot_benchmark

    rows = [{"system": s, "setting": f"beam {k}", "tokens_per_s": 100.0 * k} for s in ("a", "b") for k in (1, 4)]
    assert_png(plot_benchmark(rows, tmp_path / "bench.png"))


def test_missing_matplotlib_says_how_to_install(monkeypatch) -> None:
    from s2s_deploy.pictures import plot

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(S2SError, match=r"pip install 's2s-deploy\[plot\]'"):
        plot.require_matplotlib()


def one_line_error(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_cli_architecture_without_attention(exports, tmp_path) -> None:
    _, manifest = exports.get("gru")
    line = one_line_error(["attention", str(manifest.directory), "hello", "--out", str(tmp_path / "x.png")])
    assert line == "error: the gru architecture has no attention"
    assert not (tmp_path / "x.png").exists()


def test_cli_export_without_attention_output(exports, tmp_path) -> None:
    source, _ = exports.get("rnnsearch")
    out = tmp_path / "plain"
    export_model(get_plugin("rnnsearch"), source.model, source.config, source.src_vocab, source.tgt_vocab, out,
                 checkpoint_path=source.checkpoint_path, source=source.description)
    line = one_line_error(["attention", str(out), "hello", "--out", str(tmp_path / "x.png")])
    assert f"s2s-deploy export --arch rnnsearch --with-attention --force --out {out}" in line
