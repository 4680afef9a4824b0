"""Footprint: weights stored once across graphs, int8 embeddings, exports without the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import s2s_deploy_plugins
from s2s_deploy.cli import main
from s2s_deploy.errors import ManifestError
from s2s_deploy.format.manifest import load_manifest, sha256_of
from s2s_deploy.transforms.quantize import _quantize_embeddings
from s2s_deploy.transforms.share import SHARED_FILE, share_weights


def graph_with(path, weight: np.ndarray, name: str = "w") -> None:
    inits = [numpy_helper.from_array(weight, name)]
    nodes = [helper.make_node("MatMul", ["x", name], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, weight.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, weight.shape[1]])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def run(path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_a_weight_in_two_graphs_is_stored_once(tmp_path) -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((512, 600)).astype(np.float32)  # 1.2 MB
    paths = [tmp_path / "encoder.onnx", tmp_path / "decoder.onnx"]
    graph_with(paths[0], weight, "enc.w")
    graph_with(paths[1], weight, "dec.w")
    x = rng.standard_normal((1, 512)).astype(np.float32)
    before = run(paths[1], x)
    readers = share_weights(paths)
    blob = tmp_path / SHARED_FILE
    assert set(readers) == set(paths) and readers[paths[0]] == {SHARED_FILE: sha256_of(blob)}
    assert weight.nbytes <= blob.stat().st_size < weight.nbytes + 4096
    assert all(p.stat().st_size < 10_000 for p in paths)
    np.testing.assert_array_equal(run(paths[0], x), before)
    np.testing.assert_array_equal(run(paths[1], x), before)


def test_graphs_with_nothing_in_common_are_left_alone(tmp_path) -> None:
    rng = np.random.default_rng(1)
    paths = [tmp_path / "a.onnx", tmp_path / "b.onnx"]
    for path in paths:
        graph_with(path, rng.standard_normal((512, 600)).astype(np.float32))
    sizes = [p.stat().st_size for p in paths]
    assert share_weights(paths) == {}
    assert not (tmp_path / SHARED_FILE).exists() and [p.stat().st_size for p in paths] == sizes


def test_int8_embedding_tied_to_the_projection_is_stored_once() -> None:
    from onnxruntime.quantization.quant_utils import quantize_data

    rng = np.random.default_rng(2)
    vocab, width = 1200, 64
    table = (rng.standard_normal((vocab, width)) * 0.05).astype(np.float32)
    _, scale, quantized = quantize_data(table.T.copy(), TensorProto.INT8, symmetric=True)
    inits = [numpy_helper.from_array(table, "emb"), numpy_helper.from_array(quantized, "proj_quantized"),
             numpy_helper.from_array(np.asarray(scale, np.float32), "proj_scale")]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["x"]),
             helper.make_node("MatMulInteger", ["xq", "proj_quantized"], ["logits"])]
    graph = helper.make_graph(nodes, "g", [], [], inits)
    _quantize_embeddings(graph)
    big = [i for i in graph.initializer if np.prod(i.dims) >= vocab * width]
    assert [(i.name, i.data_type) for i in big] == [("emb_int8", TensorProto.INT8)]
    stored_scale = numpy_helper.to_array(next(i for i in graph.initializer if i.name == "emb_int8_scale"))
    dequantized = numpy_helper.to_array(big[0]).astype(np.float32) * stored_scale
    assert np.abs(dequantized - table).max() <= stored_scale / 2 + 1e-7
    ops = [n.op_type for n in graph.node]
    assert ops.count("Transpose") == 1 and "DequantizeLinear" in ops
    matmul = next(n for n in graph.node if n.op_type == "MatMulInteger")
    assert matmul.input[1] == "emb_int8_t"


@pytest.fixture(scope="module")
def lean_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("lean") / "gru"
    result = CliRunner().invoke(main, ["export", "--arch", "gru", "--out", str(out), "--no-checkpoint"])
    assert result.exit_code == 0, result.output
    return out


def test_an_export_can_leave_the_checkpoint_out(lean_export) -> None:
    assert not (lean_export / "checkpoint.safetensors").exists()
    recorded = json.loads((lean_export / "manifest.json").read_text())["checkpoint"]
    assert recorded["included"] is False and len(recorded["sha256"]) == 64
    result = CliRunner().invoke(main, ["parity", str(lean_export)])
    assert result.exit_code == 1 and "exported without its checkpoint: pass --checkpoint" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    bundled = str(Path(s2s_deploy_plugins.__file__).parent / "checkpoints" / "gru.safetensors")
    result = CliRunner().invoke(main, ["parity", str(lean_export), "--checkpoint", bundled, "--beam", "2"])
    assert result.exit_code == 0 and result.stdout.strip().endswith("parity: PASS")


def test_a_lean_export_is_recognised_when_exported_again(lean_export) -> None:
    """Without its checkpoint the folder is still the same export; asking for the checkpoint is a difference."""
    same = CliRunner().invoke(main, ["export", "--arch", "gru", "--out", str(lean_export), "--no-checkpoint"])
    assert same.exit_code == 0 and "is up to date" in same.stdout
    fuller = CliRunner().invoke(main, ["export", "--arch", "gru", "--out", str(lean_export)])
    assert fuller.exit_code == 1
    assert "holds another export (checkpoint included False, not True); pass --force" in fuller.stderr


def test_inspect_reports_what_a_deployment_loads(lean_export) -> None:
    result = CliRunner().invoke(main, ["inspect", str(lean_export)])
    assert result.exit_code == 0
    line = next(x for x in result.stdout.splitlines() if x.startswith("deployable:"))
    total = sum((lean_export / n).stat().st_size for n in ("encoder.onnx", "decoder.onnx", "manifest.json"))
    assert f"{total / 1e6:.2f} MB in 3 files" in line and "checkpoint" not in line


def test_external_data_is_hashed_and_contained(tmp_path, lean_export) -> None:
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(lean_export, folder)
    (folder / SHARED_FILE).write_bytes(b"\0" * 16)
    raw = json.loads((folder / "manifest.json").read_text())
    raw["graphs"]["decoder"]["external_data"] = {SHARED_FILE: "0" * 64}
    (folder / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ManifestError, match="does not match the sha256"):
        load_manifest(folder)
    raw["graphs"]["decoder"]["external_data"] = {"../outside.bin": "0" * 64}
    (folder / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ManifestError, match="outside the export folder"):
        load_manifest(folder)


def test_a_graph_past_the_one_file_limit_keeps_its_weights_beside_it(tmp_path, monkeypatch) -> None:
    """Past protobuf's 2 GB (here a limit of 100 kB) a graph writes its own ``<name>.data``; a rewrite
    replaces the file it read, never appends to it, and a graph back under the limit removes it."""
    from s2s_deploy.transforms import share

    rng = np.random.default_rng(3)
    path = tmp_path / "decoder.onnx"
    graph_with(path, rng.standard_normal((512, 600)).astype(np.float32))  # 1.2 MB
    x = rng.standard_normal((1, 512)).astype(np.float32)
    before = run(path, x)
    monkeypatch.setattr(share, "ONE_FILE_LIMIT", 100_000)
    for _ in range(2):  # the second rewrite reads the first one's data file
        model, read = share.load_graph(path)
        written = share.save_graph(model, path, read)
        data = tmp_path / "decoder.onnx.data"
        assert written == {"decoder.onnx.data": sha256_of(data)} and path.stat().st_size < 10_000
        assert 512 * 600 * 4 <= data.stat().st_size < 512 * 600 * 4 + 4096
        np.testing.assert_array_equal(run(path, x), before)
    monkeypatch.setattr(share, "ONE_FILE_LIMIT", 1 << 30)
    model, read = share.load_graph(path)
    assert read == {"decoder.onnx.data"} and share.save_graph(model, path, read) == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decoder.onnx"]
    np.testing.assert_array_equal(run(path, x), before)


def test_an_export_past_the_one_file_limit_lists_every_file_it_writes(tmp_path, monkeypatch, lean_export) -> None:
    """An NLLB-sized export once left 3.5 GB of unlisted ``.data`` files from the exporter beside the
    graphs it rewrote: every file in the folder must be one the manifest lists, and decode the same."""
    from s2s_deploy.runtime.translator import Translator
    from s2s_deploy.transforms import share

    monkeypatch.setattr(share, "ONE_FILE_LIMIT", 20_000)
    out = tmp_path / "gru"
    result = CliRunner().invoke(main, ["export", "--arch", "gru", "--out", str(out), "--no-checkpoint"])
    assert result.exit_code == 0, result.output
    manifest = load_manifest(out)
    listed = {"manifest.json", manifest.encoder.file, manifest.decoder.file,
              *dict(manifest.encoder.external_data), *dict(manifest.decoder.external_data)}
    assert {"encoder.onnx.data", "decoder.onnx.data"} <= listed
    assert {p.name for p in out.iterdir()} == listed
    verify = CliRunner().invoke(main, ["inspect", str(out), "--verify"])
    assert verify.exit_code == 0, verify.output
    texts = ["the cat sat", "a dog ran home"]
    assert [h.text for h in Translator(out, device="cpu")(texts, beam=2)] == [
        h.text for h in Translator(lean_export, device="cpu")(texts, beam=2)]
