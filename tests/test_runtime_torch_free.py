"""The runtime and the examples need no PyTorch: they run with torch made unimportable."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from s2s_deploy.runtime.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
BLOCK_TORCH = "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + code], capture_output=True, text=True, timeout=120)


def expected(manifest, texts: list[str], beam: int = 1) -> list[str]:
    return [t.text for t in Translator(manifest.directory, device="cpu")(texts, beam=beam)]


def test_runtime_translates_without_torch(exports) -> None:
    _, manifest = exports.get("transformer")
    texts = list(manifest.samples[:3])
    code = (
        "from s2s_deploy.runtime import Translator\n"
        f"for t in Translator({str(manifest.directory)!r}, device='cpu')({texts!r}, beam=2):\n"
        "    print(repr(t.text))\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    beam2 = [t.text for t in Translator(manifest.directory, device="cpu")(texts, beam=2)]
    assert result.stdout.splitlines() == [repr(t) for t in beam2]


def test_translate_command_runs_without_torch(exports) -> None:
    _, manifest = exports.get("gru")
    code = (
        "from s2s_deploy.cli import main\n"
        f"main(['translate', {str(manifest.directory)!r}, {manifest.samples[0]!r}, '--device', 'cpu'])\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected(manifest, [manifest.samples[0]])


@pytest.mark.parametrize("arch", ["transformer", "gru", "lstm", "convs2s"])
def test_python_example_matches_translate(exports, arch: str) -> None:
    _, manifest = exports.get(arch)
    texts = list(manifest.samples[:4])
    script = ROOT / "examples" / "python_runtime" / "translate.py"
    result = run_python(f"import runpy; sys.argv = {[str(script), str(manifest.directory), *texts]!r}; "
                        f"runpy.run_path({str(script)!r}, run_name='__main__')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected(manifest, texts)


NODE_DIR = ROOT / "examples" / "node"


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.skipif(not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir(),
                    reason="run `npm install --ignore-scripts` in examples/node first (.ci/run does)")
@pytest.mark.parametrize(("arch", "beam"), [("transformer", 1), ("gru", 4), ("rnnsearch", 1), ("convs2s", 4)])
def test_node_example_matches_translate(exports, arch: str, beam: int) -> None:
    """translate.js runs the browser page's search module (s2s_deploy/web/search.js) under Node."""
    _, manifest = exports.get(arch)
    texts = list(manifest.samples[:4])
    result = subprocess.run(["node", "translate.js", str(manifest.directory), "--beam", str(beam), *texts],
                            cwd=NODE_DIR, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected(manifest, texts, beam)


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.skipif(not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir(),
                    reason="run `npm install --ignore-scripts` in examples/node first (.ci/run does)")
def test_node_example_runs_an_int4_copy(exports, tmp_path: Path) -> None:
    """onnxruntime-node runs MatMulNBits (a com.microsoft op): the int4 copy translates as in Python."""
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.transforms.quantize import quantize_export

    _, original = exports.get("transformer")
    manifest = load_manifest(quantize_export(original, "int4", tmp_path / "int4").directory)
    texts = list(manifest.samples[:4])
    result = subprocess.run(["node", "translate.js", str(manifest.directory), "--beam", "2", *texts],
                            cwd=NODE_DIR, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected(manifest, texts, 2)


WEB_ORT = ROOT / "examples" / "web" / "node_modules" / "onnxruntime-web"
WASM_SEARCH = """
const fs = require('fs'); const path = require('path');
const ort = require(process.argv[1]);
const { Translator } = require(process.argv[2]);
(async () => {
  const folder = process.argv[3];
  const manifest = JSON.parse(fs.readFileSync(path.join(folder, 'manifest.json'), 'utf8'));
  ort.env.wasm.numThreads = 1;
  const load = (f) => ort.InferenceSession.create(new Uint8Array(fs.readFileSync(path.join(folder, f))),
                                                  { executionProviders: ['wasm'] });
  const { encoder, decoder } = manifest.graphs;
  const t = new Translator(ort, manifest, await load(encoder.file), await load(decoder.file));
  for (const text of process.argv.slice(4)) console.log((await t.translate(text, { beam: 1 })).text);
})().catch((e) => { console.error('error: ' + e.message); process.exit(1); });
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.skipif(not WEB_ORT.is_dir(), reason="run `npm install --ignore-scripts` in examples/web first")
def test_onnxruntime_web_wasm_runs_an_int4_copy(exports, tmp_path: Path) -> None:
    """The browser page's runtime, onnxruntime-web's WebAssembly backend (here under Node, the same
    wasm the page loads), has the MatMulNBits kernel: the int4 copy translates as in Python."""
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.transforms.quantize import quantize_export

    _, original = exports.get("transformer")
    manifest = load_manifest(quantize_export(original, "int4", tmp_path / "int4").directory)
    texts = list(manifest.samples[:4])
    result = subprocess.run(["node", "-e", WASM_SEARCH, str(WEB_ORT), str(ROOT / "s2s_deploy" / "web" / "search.js"),
                             str(manifest.directory), *texts], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected(manifest, texts)


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.skipif(not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir(),
                    reason="run `npm install --ignore-scripts` in examples/node first (.ci/run does)")
@pytest.mark.parametrize("beam", [1, 3])
def test_node_generate_example_matches_translate(exports, tmp_path: Path, beam: int) -> None:
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.transforms.fuse import add_to_manifest, fuse_generate

    _, original = exports.get("transformer")
    folder = tmp_path / "fused"
    shutil.copytree(original.directory, folder)
    add_to_manifest(load_manifest(folder), fuse_generate(load_manifest(folder), folder / "generate.onnx"), beam=True)
    texts = list(original.samples[:3])
    result = subprocess.run(["node", "generate.js", str(folder), str(beam), *texts], cwd=NODE_DIR,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [t.text for t in Translator(folder, device="cpu")(texts, beam=beam)]


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.skipif(not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir(),
                    reason="run `npm install --ignore-scripts` in examples/node first (.ci/run does)")
@pytest.mark.parametrize("arch", ["transformer", "gru", "lstm", "bahdanau", "rnnsearch", "convs2s"])
def test_node_beam_written_from_the_doc_matches_translate(exports, arch: str) -> None:
    """beam.js follows docs/manifest.md's pseudo-code alone; its n-best lists and scores must be
    what the engine prints, for every n-best (the 1-best never depends on it), and with a
    length penalty and max_len that make the stopping rule matter."""
    _, manifest = exports.get(arch)
    texts = [*manifest.samples[:6], "twenty-three thousand four hundred and five", "2064"]
    translator = Translator(manifest.directory, device="cpu")
    runs = [(n, []) for n in (1, 2, 3, 4)] + [(4, ["--alpha", "1", "--max-len", "12"])]
    for n_best, options in runs:
        alpha = float(options[1]) if options else None
        max_len = int(options[3]) if options else None
        want = [(score, text) for result in translator(texts, beam=4, n_best=n_best, alpha=alpha, max_len=max_len)
                for text, score in result.hypotheses]
        result = subprocess.run(["node", "beam.js", str(manifest.directory), "4", str(n_best), "--scores", *options,
                                 *texts], cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        got = [(float(score), text) for score, text in (line.split("\t", 1) for line in result.stdout.splitlines())]
        assert [text for _, text in got] == [text for _, text in want], (n_best, options)
        # printed to 4 decimals, so 1e-4 apart at a rounding edge (and -0.0000 against 0.0000): the
        # engine's first beam step runs one row per sentence, beam.js K rows, which moves log-probs by ulps
        assert max(abs(a - b) for (a, _), (b, _) in zip(got, want, strict=True)) <= 1.5e-4, (n_best, options)


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.skipif(not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir(),
                    reason="run `npm install --ignore-scripts` in examples/node first (.ci/run does)")
def test_node_clients_translate_an_fp16_copy_like_translate(exports, tmp_path: Path) -> None:
    """An fp16 copy's cache is float16 (its manifest says so): both Node clients make its zero state."""
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.transforms.quantize import quantize_export

    _, manifest = exports.get("transformer")
    folder = quantize_export(manifest, "fp16", tmp_path / "fp16").directory
    assert {s.dtype for s in load_manifest(folder).state} == {"float16"}
    texts = list(manifest.samples[:4])
    want = [t.text for t in Translator(folder, device="cpu")(texts, beam=4)]
    for script in (["translate.js", str(folder), "--beam", "4"], ["beam.js", str(folder), "4", "1"]):
        result = subprocess.run(["node", *script, *texts], cwd=NODE_DIR, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == want, script[0]
