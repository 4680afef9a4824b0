"""generate.onnx: the whole search in one portable graph, token-identical to the Python engine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from onnx.reference import ReferenceEvaluator
from test_plugins import ARCH_CASES

from s2s_deploy.cli import main
from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest, load_manifest, sha256_of
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.ort.generate import GraphEngine, generate_feeds, hypotheses
from s2s_deploy.runtime.search import Hypothesis, SearchConfig, search
from s2s_deploy.runtime.translator import encode_batch
from s2s_deploy.transforms.fuse import GENERATE_FILE, add_to_manifest, build_generate, fuse_generate

ARCHS = [pytest.param(arch, max_len, id=arch) for arch, max_len in ARCH_CASES]
SENTENCES = 8  # a mixed-length batch; more only slows the Python reference down


@pytest.fixture(scope="module")
def fused(exports, tmp_path_factory: pytest.TempPathFactory):
    """A copy of each export with generate.onnx (beam or greedy-only) fused into it; the shared
    exports stay untouched for the other test files."""
    root = tmp_path_factory.mktemp("fused")
    done: dict[tuple[str, bool], Manifest] = {}

    def get(arch: str, beam: bool = True) -> Manifest:
        if (arch, beam) not in done:
            _, manifest = exports.get(arch)
            copy = root / f"{arch}-{'beam' if beam else 'greedy'}"
            shutil.copytree(manifest.directory, copy)
            manifest = load_manifest(copy)
            add_to_manifest(manifest, fuse_generate(manifest, copy / GENERATE_FILE, beam=beam), beam=beam)
            done[(arch, beam)] = load_manifest(copy)
        return done[(arch, beam)]

    return get


def assert_same(got: list[list[Hypothesis]], want: list[list[Hypothesis]]) -> None:
    """Tokens and finished flags exactly; log-probs to float32 noise (ONNX Runtime fuses the
    inlined decoder a little differently from the standalone one)."""
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
    assert [[h.finished for h in hyps] for hyps in got] == [[h.finished for h in hyps] for hyps in want]
    for got_hyps, want_hyps in zip(got, want, strict=True):
        for g, w in zip(got_hyps, want_hyps, strict=True):
            np.testing.assert_allclose(g.token_log_probs, w.token_log_probs, atol=1e-5)
            assert g.score == pytest.approx(w.score, abs=1e-5)


def all_nodes(graph: onnx.GraphProto) -> list[ir.Node]:
    return list(ir.traversal.RecursiveGraphIterator(ir.serde.deserialize_graph(graph)))


def loops_in(graph: onnx.GraphProto) -> int:
    return sum(node.op_type == "Loop" for node in all_nodes(graph))


@pytest.mark.parametrize("beam", [True, False], ids=["beam", "greedy"])
def test_graph_is_portable(fused, beam: bool) -> None:
    model = onnx.load(str(fused("gru", beam).directory / GENERATE_FILE))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 13
    assert {o.domain for o in model.opset_import} == {""}
    assert model.opset_import[0].version >= 17
    assert {n.domain for n in all_nodes(model.graph)} == {""}
    # onnx.reference makes zero trips of a Loop without a cond, where the spec reads true
    assert all(n.inputs[1] is not None for n in all_nodes(model.graph) if n.op_type == "Loop")
    decoding = [n for n in model.graph.node if n.op_type == "Loop"]  # top level: weights used directly
    if beam:  # a greedy and a beam Loop, beam_size gives the unused one zero trips
        assert len(decoding) == 2
        (outputs,) = [n for n in model.graph.node if n.op_type == "If"]
        branches = {a.name: a.g for a in outputs.attribute}
        assert loops_in(branches["then_branch"]) == 0 and loops_in(branches["else_branch"]) == 1  # walking back
    else:
        assert len(decoding) == 1 and loops_in(model.graph) == 1
    expected = {"src", "src_len", "max_len", "min_len", "alpha"} | ({"beam_size", "n_best"} if beam else set())
    assert {i.name for i in model.graph.input} == expected
    assert [o.name for o in model.graph.output] == ["tokens", "scores", "lengths", "token_log_probs"]


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_greedy_is_token_identical(exports, fused, arch: str, max_len: int) -> None:
    _, manifest = exports.get(arch)
    engine = GraphEngine(fused(arch, beam=False), device="cpu")
    src, src_len = encode_batch(list(manifest.samples)[:SENTENCES], manifest.src_vocab)
    for config in (SearchConfig(1, 1, max_len), SearchConfig(1, 1, 6, min_len=4)):
        assert_same(engine.search(src, src_len, config), search(OrtBackend(manifest, device="cpu"), src, src_len,
                                                                 config))


@pytest.mark.parametrize(("arch", "max_len"), ARCHS)
def test_beam_is_token_identical(exports, fused, arch: str, max_len: int) -> None:
    _, manifest = exports.get(arch)
    backend = OrtBackend(manifest, device="cpu")
    engine = GraphEngine(fused(arch), device="cpu")
    src, src_len = encode_batch(list(manifest.samples)[:SENTENCES], manifest.src_vocab)
    for config in (SearchConfig(4, 4, max_len), SearchConfig(3, 2, 5, alpha=0.6), SearchConfig(3, 1, 6, min_len=4),
                   SearchConfig(1, 1, max_len)):
        assert_same(engine.search(src, src_len, config), search(backend, src, src_len, config))


def test_reference_evaluator_matches_onnxruntime(fused) -> None:
    """The portability witness: onnx.reference, a pure-numpy runtime, gives the same search."""
    manifest = fused("gru")
    engine = GraphEngine(manifest, device="cpu")
    reference = ReferenceEvaluator(str(manifest.directory / GENERATE_FILE))
    src, src_len = encode_batch([min(manifest.samples, key=len)], manifest.src_vocab)
    for config in (SearchConfig(1, 1, 8), SearchConfig(3, 2, 8)):
        values = reference.run(None, generate_feeds(src, src_len, config, beam=True))
        outputs = dict(zip(reference.output_names, values, strict=True))
        assert_same(hypotheses(outputs, manifest.eos_id, config), engine.search(src, src_len, config))


def test_cli_fuse_writes_graph_and_manifest_entry(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    copy = tmp_path / "gru"
    shutil.copytree(manifest.directory, copy)
    result = CliRunner().invoke(main, ["fuse", str(copy), "--greedy-only"])
    assert result.exit_code == 0, result.output
    entry = json.loads((copy / "manifest.json").read_text())["graphs"]["generate"]
    assert entry["file"] == GENERATE_FILE and entry["sha256"] == sha256_of(copy / GENERATE_FILE)
    assert entry["search"] == "greedy"
    assert {io["name"]: io["role"] for io in entry["outputs"]}["tokens"] == "hypothesis_tokens"
    engine = GraphEngine(load_manifest(copy), device="cpu")
    src, src_len = encode_batch(list(manifest.samples)[:2], manifest.src_vocab)
    with pytest.raises(S2SError, match="greedy-only"):
        engine.search(src, src_len, SearchConfig(2, 1, 10))
    assert not list(copy.glob(".*.tmp"))


def test_engine_without_generate_graph_says_how_to_make_one(exports) -> None:
    _, manifest = exports.get("gru")
    with pytest.raises(S2SError, match="s2s-deploy fuse"):
        GraphEngine(manifest)


def test_no_architecture_names_in_the_fusing_code() -> None:
    source = Path(build_generate.__code__.co_filename).read_text().lower()
    for arch, _ in ARCH_CASES:
        assert arch not in source


def test_translate_engine_graph_matches_loop(exports, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from s2s_deploy.cli import main

    _, original = exports.get("transformer")
    folder = tmp_path / "fused"
    shutil.copytree(original.directory, folder)
    runner = CliRunner()
    missing = runner.invoke(main, ["translate", str(folder), "x", "--engine", "graph"])
    assert missing.exit_code == 1 and "s2s-deploy fuse" in missing.stderr
    assert runner.invoke(main, ["fuse", str(folder)]).exit_code == 0
    texts = list(original.samples[:4])
    outputs = [runner.invoke(main, ["translate", str(folder), *texts, "--beam", "3", "--engine", engine]).stdout
               for engine in ("loop", "graph")]
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 4


@pytest.mark.slow
def test_compiled_search_functions_are_current() -> None:
    """fuse reads the search steps compiled (onnxscript is off the base install): after editing
    export/search_graph.py, rerun `python -m s2s_deploy.export.search_graph`."""
    result = subprocess.run([sys.executable, "-m", "s2s_deploy.export.search_graph", "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_an_export_with_external_weights_fuses_into_one_file(exports, tmp_path) -> None:
    """Weights stored as external data (as the exporter stores those both graphs hold) are read
    in: generate.onnx stands alone."""
    _, manifest = exports.get("gru")
    copy = tmp_path / "gru"
    shutil.copytree(manifest.directory, copy)
    manifest = load_manifest(copy)
    for role, graph in (("encoder", manifest.encoder), ("decoder", manifest.decoder)):
        path = manifest.graph_path(graph)
        onnx.save_model(onnx.load(str(path)), str(path), save_as_external_data=True, location=f"{role}.data",
                        size_threshold=0)
        manifest = manifest.with_graph(role, path, {f"{role}.data": sha256_of(copy / f"{role}.data")})
    manifest.write()
    manifest = load_manifest(copy)
    add_to_manifest(manifest, fuse_generate(manifest, copy / GENERATE_FILE), beam=True)
    fused = onnx.load(str(copy / GENERATE_FILE), load_external_data=False)
    assert not [t.name for t in fused.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    manifest = load_manifest(copy)
    src, src_len = encode_batch(list(manifest.samples[:SENTENCES]), manifest.src_vocab)
    config = SearchConfig(3, 2, 16)
    assert_same(GraphEngine(manifest, device="cpu").search(src, src_len, config),
                search(OrtBackend(manifest, device="cpu"), src, src_len, config))
