"""What a newcomer meets in the first hour: the quick start twice, help, messages and labels."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from s2s_deploy.cli import main
from s2s_deploy.format.manifest import sha256_of
from s2s_deploy.modeling.checkpoint import content_digest


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_unchanged_re_export_is_up_to_date(exports) -> None:
    """The README's quick start run twice: the second export finds the same thing and succeeds."""
    _, manifest = exports.get("gru")
    before = (manifest.directory / "manifest.json").read_bytes()
    code, out, err = run("export", "--arch", "gru", "--out", str(manifest.directory))
    assert code == 0, err
    assert "up to date" in out
    assert (manifest.directory / "manifest.json").read_bytes() == before


def _relaid(checkpoint: Path, out: Path) -> Path:
    """``checkpoint`` with its metadata in the opposite order: what safetensors' hash-map order
    does to two saves of the same weights."""
    data = checkpoint.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    header["__metadata__"] = dict(reversed(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    assert len(text) <= size
    out.write_bytes(data[:8] + text.ljust(size) + data[8 + size :])
    return out


def test_re_export_of_the_same_weights_laid_out_otherwise_is_up_to_date(exports, tmp_path) -> None:
    """Seeded random weights are saved again on every export, in other bytes: the content decides."""
    source, manifest = exports.get("gru")
    relaid = _relaid(source.checkpoint_path, tmp_path / "relaid.safetensors")
    assert sha256_of(relaid) != sha256_of(source.checkpoint_path)
    assert content_digest(relaid) == content_digest(source.checkpoint_path)
    before = (manifest.directory / "manifest.json").read_bytes()
    code, out, err = run("export", "--arch", "gru", "--checkpoint", str(relaid), "--out", str(manifest.directory))
    assert code == 0, err
    assert "up to date" in out
    assert (manifest.directory / "manifest.json").read_bytes() == before


def test_content_digest_sees_a_changed_weight(exports, tmp_path) -> None:
    source, _ = exports.get("gru")
    data = bytearray(source.checkpoint_path.read_bytes())
    data[-1] ^= 1
    changed = tmp_path / "changed.safetensors"
    changed.write_bytes(bytes(data))
    assert content_digest(changed) != content_digest(source.checkpoint_path)


def test_manifest_names_the_checkpoint_without_its_path(exports) -> None:
    source, manifest = exports.get("gru")
    recorded = manifest.to_dict()["source"]
    assert str(source.checkpoint_path.parent) not in recorded
    assert source.checkpoint_path.name in recorded and manifest.to_dict()["checkpoint"]["sha256"] in recorded


def _commands() -> list[click.Command]:
    return [main, *main.commands.values()]


def test_top_level_help_shows_whole_summaries() -> None:
    code, out, _ = run("--help")
    assert code == 0
    assert "..." not in out.split("Commands:")[1]
    for name, command in main.commands.items():
        summary = command.get_short_help_str(limit=60)
        assert not summary.endswith("...") and f"  {summary}" in out, name


def test_every_option_has_help() -> None:
    missing = [f"{command.name} {param.opts[0]}" for command in _commands() for param in command.params
               if isinstance(param, click.Option) and not (param.help or "").strip()]
    assert missing == []


def test_list_reads_plugins_without_importing_torch(tmp_path: Path) -> None:
    """Built-ins (entry points) and a --plugin file subclassing one, in a fresh interpreter."""
    plugin_file = tmp_path / "my_arch.py"
    plugin_file.write_text("from s2s_deploy_plugins.transformer import TransformerPlugin\n"
                           "class MyArch(TransformerPlugin):\n    name = 'myarch'\n    version = '0.1'\n"
                           "PLUGIN = MyArch()\n")
    code = ("import sys\nfrom click.testing import CliRunner\nfrom s2s_deploy.cli import main\n"
            f"result = CliRunner().invoke(main, ['list', '--plugin', {str(plugin_file)!r}])\n"
            "print(result.output)\nprint('torch imported:', 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "torch imported: False" in out
    assert "myarch       v0.1   Transformer" in out and f"from file {plugin_file}" in out
    assert "presets: small, d2l, base (default small); exporter: torchscript; from entry point " \
           "s2s_deploy_plugins.gru:PLUGIN" in out


def test_list_works_where_torch_is_missing(tmp_path: Path) -> None:
    """The runtime-only install: every built-in lists from its declaration, a --plugin file that
    subclasses one does too, and a one-file plugin whose model needs torch is one line naming the extra."""
    from importlib.metadata import entry_points

    subclass = tmp_path / "sub_arch.py"
    subclass.write_text("from s2s_deploy_plugins.gru import GRUPlugin\n"
                        "class Sub(GRUPlugin):\n    name = 'sub_arch'\nPLUGIN = Sub()\n")
    with_torch = tmp_path / "with_torch.py"
    with_torch.write_text("import torch\nPLUGIN = None\n")
    code = ("import sys\nsys.modules['torch'] = None\nfrom click.testing import CliRunner\n"
            "from s2s_deploy.cli import main\n"
            f"for extra in ([], ['--plugin', {str(subclass)!r}], ['--plugin', {str(with_torch)!r}]):\n"
            "    result = CliRunner().invoke(main, ['list', *extra])\n"
            "    print('exit', result.exit_code)\n    print(result.stdout)\n    print(result.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    plain, subclassed, refused = out.split("exit ")[1:]
    for ep in entry_points(group="s2s_deploy.plugins"):
        assert plain.startswith("0") and f"from entry point {ep.value}" in plain, ep.value
    assert subclassed.startswith("0") and "sub_arch     v1.0   GRU encoder-decoder" in subclassed
    assert refused.startswith("1")
    assert 'error: `s2s-deploy list` needs torch, which is not installed: pip install "s2s-deploy[export]"' in refused


def test_list_shows_a_plugin_file_with_computed_attributes(tmp_path: Path) -> None:
    plugin_file = tmp_path / "computed.py"
    plugin_file.write_text("from s2s_deploy_plugins.gru import GRUPlugin\n"
                           "class Computed(GRUPlugin):\n    name = 'computed'\n    presets = dict(GRUPlugin.presets)\n"
                           "PLUGIN = Computed()\n")
    code, out, err = run("list", "--plugin", str(plugin_file))
    assert code == 0, err
    assert "computed" in out and "presets: small, d2l, base" in out


def test_translate_says_what_a_wrong_path_is(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    folder = manifest.directory
    cases = [
        (["twenty-one weeks"], "'twenty-one weeks' is not an export folder: run `s2s-deploy translate DIR TEXT"),
        ([str(folder / "checkpoint.safetensors"), "x"], "is a checkpoint, not an export folder: run "
                                                        "`s2s-deploy export --arch NAME --checkpoint"),
        ([str(folder / "checkpoint.safetensors")], "is a checkpoint, not an export folder"),
        ([str(folder / "encoder.onnx"), "x"], f"is one file of an export: pass its folder, {folder}"),
        ([str(tmp_path / "missing"), "x"], "export folder not found"),
    ]
    for args, fragment in cases:
        code, _, err = run("translate", *args)
        assert code == 1 and len(err.strip().splitlines()) == 1 and fragment in err, (args, err)


def test_output_in_a_missing_folder_names_the_output(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    source = tmp_path / "in.txt"
    source.write_text(f"{manifest.samples[0]}\n")
    output = tmp_path / "nonexistent" / "o.txt"
    code, _, err = run("translate", str(manifest.directory), "--input", str(source), "--output", str(output))
    assert code == 1
    assert f"cannot write {output}: folder {output.parent} does not exist" in err and ".part" not in err


def test_characters_outside_the_vocabulary_are_reported_once(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    assert not {"ü", "€"} & set(manifest.src_vocab.tokens)
    code, out, err = run("translate", str(manifest.directory), f"{manifest.samples[0]} ü€ü", "ü")
    assert code == 0 and len(out.splitlines()) == 2, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: 4 characters outside the model's vocabulary became <unk>: 'ü' x3, '€' x1"]
    source = tmp_path / "in.txt"
    source.write_text(f"{manifest.samples[0]} €\n{manifest.samples[1]}\n€ ü\n")
    code, _, err = run("translate", str(manifest.directory), "--input", str(source), "--output",
                       str(tmp_path / "out.txt"), "--chunk-lines", "1")
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [
        "warning: 3 characters outside the model's vocabulary became <unk>: '€' x2, 'ü' x1"]
    code, _, err = run("translate", str(manifest.directory), manifest.samples[0])
    assert "warning" not in err


def test_train_draws_no_bar_when_stderr_is_not_a_terminal(monkeypatch, tmp_path: Path) -> None:
    import s2s_deploy.train.trainer as trainer
    from s2s_deploy.errors import S2SError

    seen: dict[str, object] = {}

    def fake_train(*args: object, progress: bool, **kwargs: object) -> None:
        seen["progress"] = progress
        raise S2SError("stopped before training")

    monkeypatch.setattr(trainer, "train", fake_train)
    code, _, err = run("train", "--arch", "gru", "--epochs", "1", "--max-train", "8", "--out",
                       str(tmp_path / "m.safetensors"))
    assert code == 1 and "stopped before training" in err
    assert seen == {"progress": False}  # CliRunner's stderr is no terminal


def test_evaluate_warns_about_another_task_and_shows_progress(exports, capsys) -> None:
    from s2s_deploy.runtime.ort.backend import OrtBackend
    from s2s_deploy.train.evaluate import evaluate

    _, manifest = exports.get("gru")
    assert manifest.to_dict()["training"]["task"] == "en-fr"
    code, out, err = run("evaluate", str(manifest.directory), "--task", "en-zh", "--limit", "2",
                         "--backends", "onnxruntime", "--beam", "2")
    assert code == 0, err
    assert "warning: " in err and "was trained on en-fr, not en-zh" in err
    assert "onnxruntime" in out and "onnxruntime greedy" in err  # its progress, off a terminal too (a log shows it)
    code, _, err = run("evaluate", str(manifest.directory), "--limit", "2", "--backends", "onnxruntime", "--beam", "2")
    assert code == 0 and "warning" not in err
    evaluate(manifest, [OrtBackend(manifest, device="cpu")], limit=3, beam_size=2, progress=True)
    bars = capsys.readouterr().err
    assert "onnxruntime greedy" in bars and "onnxruntime beam2" in bars and "/3 [" in bars


def test_bench_rows_labels_and_baseline(exports, tmp_path: Path) -> None:
    from s2s_deploy.bench.runner import (
        BenchResult,
        BenchSettings,
        chart_rows,
        chart_title,
        markdown_table,
        run_benchmark,
        synthetic_export,
    )

    _, manifest = exports.get("gru")
    settings = BenchSettings(beams=(1,), batches=(1, 16, 64), sentences=3, reps=1, warmup=0, threads=1, max_len=12,
                             systems=("onnxruntime-cpu",))
    result = run_benchmark([manifest.directory], settings)
    assert [r.batch for r in result.rows] == [1, 3]  # 16 and 64 both run the 3 sentences there are
    labels = [row["setting"] for row in chart_rows(result.rows)]
    assert labels == [f"{manifest.directory.name}\nbeam 1, batch 1", f"{manifest.directory.name}\nbeam 1, batch 3"]
    title = chart_title(result, settings)
    assert "3 sentences" in title and "1 threads" in title and "up to 12 tokens" in title
    int8 = dataclasses.replace(result.rows[0], precision="int8", ratio_to_pytorch=1.5)
    table = markdown_table(BenchResult((int8,)))
    assert "× PyTorch fp32" in table and "1.50 (int8 vs fp32 PyTorch)" in table
    assert synthetic_export("gru", 16, tmp_path).name == "gru-small"


def test_bench_plot_needs_matplotlib_before_the_run(exports, monkeypatch) -> None:
    import s2s_deploy.bench.runner as bench

    _, manifest = exports.get("gru")
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    monkeypatch.setattr(bench, "run_benchmark", lambda *a: pytest.fail("ran the benchmark first"))
    code, _, err = run("bench", str(manifest.directory), "--plot", "chart.png")
    assert code == 1 and "install the plot extra" in err


def test_inspect_lists_generate_and_only_providers_that_start(exports, monkeypatch, tmp_path: Path) -> None:
    import onnxruntime

    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.transforms.fuse import GENERATE_FILE, add_to_manifest, fuse_generate

    _, shared = exports.get("gru")
    manifest = load_manifest(shutil.copytree(shared.directory, tmp_path / "gru"))
    add_to_manifest(manifest, fuse_generate(manifest, manifest.directory / GENERATE_FILE), beam=True)
    real = onnxruntime.get_available_providers()
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["NoSuchExecutionProvider", *real])
    code, out, err = run("inspect", str(manifest.directory))
    assert code == 0, err
    assert "generate (generate.onnx): opset" in out
    line = next(line for line in out.splitlines() if line.startswith("execution providers"))
    assert line.startswith("execution providers that start here: ") and "CPUExecutionProvider" in line
    assert line.endswith("(installed but cannot start here: NoSuchExecutionProvider)")
    assert "NoSuch" not in err


def test_quantize_carries_generate_over_refused_from_the_quantised_graphs(exports, tmp_path: Path) -> None:
    from s2s_deploy.format.manifest import load_manifest, sha256_of
    from s2s_deploy.runtime.translator import Translator
    from s2s_deploy.transforms.fuse import GENERATE_FILE, add_to_manifest, fuse_generate
    from s2s_deploy.transforms.quantize import quantize_export

    _, shared = exports.get("gru")
    manifest = load_manifest(shutil.copytree(shared.directory, tmp_path / "gru"))
    add_to_manifest(manifest, fuse_generate(manifest, manifest.directory / GENERATE_FILE), beam=True)
    manifest = load_manifest(manifest.directory)
    report = quantize_export(manifest, "int8", tmp_path / "gru-int8")
    assert report.generate is not None and "re-fused from the quantised graphs" in report.generate
    quantised = load_manifest(tmp_path / "gru-int8")
    entry = quantised.to_dict()["graphs"]["generate"]
    assert entry["sha256"] == sha256_of(quantised.directory / GENERATE_FILE)
    assert entry["sha256"] != manifest.to_dict()["graphs"]["generate"]["sha256"]
    sources = list(manifest.samples[:4])
    loop = [t.text for t in Translator(quantised.directory, device="cpu")(sources, beam=2)]
    graph = [t.text for t in Translator(quantised.directory, device="cpu", engine="graph")(sources, beam=2)]
    assert graph == loop


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def test_transformer_attention_compare_is_readable(exports, tmp_path: Path) -> None:
    """Default: the mean of every layer and head, side by side; --reduce none: the grids stacked."""
    _, manifest = exports.get("transformer")
    text = "Wednesday, March 3, 2021"
    args = ["attention", str(manifest.directory), text, "--compare", "--device", "cpu", "--max-len", "24"]
    code, out, err = run(*args, "--out", str(tmp_path / "mean.png"))
    assert code == 0, err
    panels = out.split("source tokens, ")[1].strip()
    assert panels.startswith("mean of ") and panels.endswith(" maps")
    width, height = png_size(tmp_path / "mean.png")
    assert 800 <= width <= 2000 and 400 <= height <= 1000
    code, out, err = run(*args, "--reduce", "none", "--out", str(tmp_path / "heads.png"))
    assert code == 0, err
    width, height = png_size(tmp_path / "heads.png")
    assert width <= 2000 and height <= 2200
