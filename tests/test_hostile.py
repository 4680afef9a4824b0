"""Hostile export folders, checkpoints, options and file-system faults: one line and a non-zero
exit, or the right result; nothing outside an export folder opened, no input ever overwritten."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from s2s_deploy.architecture.registry import Registry
from s2s_deploy.cli import main
from s2s_deploy.errors import ContractError, S2SError
from s2s_deploy.export.exporter import _record, export_model
from s2s_deploy.format import files as staging
from s2s_deploy.format.manifest import load_manifest, sha256_of
from s2s_deploy.jobs import files
from s2s_deploy.modeling.checkpoint import load_checkpoint
from s2s_deploy.runtime.backend import Backend, DecodeRun
from s2s_deploy.runtime.search import SearchConfig, search
from s2s_deploy.runtime.translator import Translator
from s2s_deploy.verify.tolerance import StepTolerance
from s2s_deploy_plugins.gru import GRUPlugin

BUNDLED = Path(__file__).resolve().parents[1] / "plugins" / "checkpoints"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def doubtless(err: str) -> str:
    """stderr without the doubt warnings that a tiny export's random weights earn on every text
    (tests/test_honest_output.py)."""
    return "".join(line for line in err.splitlines(keepends=True) if ": low confidence (mean log-prob" not in line)


def one_line(code: int, stderr: str, fragment: str = "") -> str:
    """The contract of every refusal: exit 1, one error line, last on stderr (after any progress
    notice such as "exporting ..."), no trace."""
    assert code == 1, stderr
    lines = stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:], stderr
    assert fragment in lines[-1], lines[-1]
    assert "Traceback" not in stderr and len(lines) <= 2
    return lines[-1]


@pytest.fixture(scope="module")
def gru(exports) -> Path:
    return exports.get("gru")[1].directory


def tampered(gru: Path, tmp_path: Path, edit: Callable[[dict], None]) -> Path:
    folder = tmp_path / "export"
    shutil.copytree(gru, folder)
    raw = json.loads((folder / "manifest.json").read_text())
    edit(raw)
    (folder / "manifest.json").write_text(json.dumps(raw))
    return folder


def _set(path: str, value: object) -> Callable[[dict], None]:
    def edit(raw: dict) -> None:
        *parents, last = path.split(".")
        node = raw
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is KeyError:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value
    return edit


MANIFEST_CASES = [
    ("graphs.encoder.file", "../../../etc/passwd", "outside the export folder"),
    ("graphs.encoder.file", "/etc/passwd", "relative path"),
    ("checkpoint.file", "../../x.safetensors", "outside the export folder"),
    ("special_tokens.eos", 100_000, "special_tokens.eos"),
    ("special_tokens.eos", -1, "special_tokens.eos"),
    ("special_tokens.decoder_start", "1", "special_tokens.decoder_start"),
    ("search.alpha", "x", "search.alpha"),
    ("search.alpha", KeyError, "'alpha' is a required property"),
    ("search.beam_size", "abc", "search.beam_size"),  # decoding defaults are typed: no int("abc") later
    ("search.min_len", [1], "search.min_len"),
    ("search.bad_words_ids", [["x"]], "search.bad_words_ids"),
    ("state.0.batch_axis", "1", "state.0.batch_axis"),
    ("state.0.init", "later", "state.0.init"),
    ("memory", {"a": 1}, "memory"),
    ("graphs.decoder.outputs.0.name", "renamed", "renamed"),
    ("graphs.decoder.outputs.0.role", "nonsense", "role"),
    ("plugin", KeyError, "plugin"),
    ("vocab.target.level", "byte", "vocab.target.level"),
    ("limits.max_target_length", -3, "limits.max_target_length"),
]


@pytest.mark.parametrize(("key", "value", "fragment"), MANIFEST_CASES, ids=[f"{k}={v}" for k, v, _ in MANIFEST_CASES])
def test_tampered_manifest_is_one_line(gru: Path, tmp_path: Path, key: str, value: object, fragment: str) -> None:
    folder = tampered(gru, tmp_path, _set(key, value))
    one_line(*run("translate", str(folder), "March 3")[::2], fragment)


def test_vocabularies_are_checked_against_the_graphs(gru: Path, tmp_path: Path) -> None:
    folder = tampered(gru, tmp_path, lambda raw: raw["vocab"]["target"]["tokens"].pop())
    one_line(*run("translate", str(folder), "a")[::2], "the decoder scores")
    shutil.rmtree(folder)
    folder = tampered(gru, tmp_path, lambda raw: raw["vocab"]["source"]["tokens"].pop())
    one_line(*run("translate", str(folder), "a")[::2], "the encoder embeds")


def test_nan_and_deep_nesting_in_the_manifest(gru: Path, tmp_path: Path) -> None:
    folder = tampered(gru, tmp_path, lambda raw: None)
    text = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text(text.replace('"alpha": 0.75', '"alpha": NaN'))
    one_line(*run("translate", str(folder), "a")[::2], "NaN")
    deep = '"search": {"x": ' + "[" * 5000 + "]" * 5000 + ","
    (folder / "manifest.json").write_text(text.replace('"search": {', deep))
    one_line(*run("translate", str(folder), "a")[::2], "nests")


def test_unknown_keys_are_allowed_for_newer_writers(gru: Path, tmp_path: Path) -> None:
    def edit(raw: dict) -> None:
        raw["something_new"] = {"any": [1, 2]}
        raw["search"]["beam_size"] = 4
    folder = tampered(gru, tmp_path, edit)
    assert load_manifest(folder).plugin == "gru"


def test_a_symlinked_graph_outside_the_folder_is_refused(gru: Path, tmp_path: Path) -> None:
    folder = tampered(gru, tmp_path, lambda raw: None)
    outside = tmp_path / "elsewhere.onnx"
    shutil.move(folder / "encoder.onnx", outside)
    (folder / "encoder.onnx").symlink_to(outside)
    one_line(*run("translate", str(folder), "a")[::2], "outside the export folder")


def test_external_data_outside_the_folder_is_refused(gru: Path, tmp_path: Path) -> None:
    folder = tampered(gru, tmp_path, lambda raw: None)
    model = onnx.load(str(folder / "encoder.onnx"))
    tensor = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "../../../../etc/passwd"
    tensor.ClearField("raw_data")
    onnx.save(model, str(folder / "encoder.onnx"))
    raw = json.loads((folder / "manifest.json").read_text())
    raw["graphs"]["encoder"]["sha256"] = sha256_of(folder / "encoder.onnx")
    (folder / "manifest.json").write_text(json.dumps(raw))
    one_line(*run("translate", str(folder), "a")[::2], "outside the export folder")


def test_a_zero_byte_or_swapped_graph_with_an_updated_hash_is_one_line(gru: Path, tmp_path: Path) -> None:
    folder = tampered(gru, tmp_path, lambda raw: None)
    (folder / "encoder.onnx").write_bytes(b"")
    raw = json.loads((folder / "manifest.json").read_text())
    raw["graphs"]["encoder"]["sha256"] = sha256_of(folder / "encoder.onnx")
    (folder / "manifest.json").write_text(json.dumps(raw))
    one_line(*run("translate", str(folder), "a")[::2])
    shutil.copyfile(folder / "decoder.onnx", folder / "encoder.onnx")
    raw["graphs"]["encoder"]["sha256"] = sha256_of(folder / "encoder.onnx")
    (folder / "manifest.json").write_text(json.dumps(raw))
    one_line(*run("translate", str(folder), "a")[::2], "graph swapped")


def test_parity_tolerance_never_comes_from_the_manifest(exports, tmp_path: Path) -> None:
    from s2s_deploy.modeling.torch_backend import torch_backend_for
    from s2s_deploy.runtime.ort.backend import OrtBackend
    from s2s_deploy.verify.parity import check_parity

    gru = exports.get("gru")[1].directory
    folder = tampered(gru, tmp_path, lambda raw: raw["validation"].update(atol=1e9, min_token_agreement=0.0))
    manifest = load_manifest(folder)
    report = check_parity(manifest, torch_backend_for(manifest), OrtBackend(manifest, device="cpu"),
                          list(manifest.samples[:2]), beam_size=2, max_len=8)
    assert report.atol == GRUPlugin.parity_atol and report.min_token_agreement == 1.0


# --- NaN ---------------------------------------------------------------------------------------

def test_nan_never_passes_as_no_difference() -> None:
    assert StepTolerance().compare(np.zeros((1, 3)), np.full((1, 3), np.nan)).max_abs_diff == float("inf")
    with pytest.raises(S2SError, match="not finite"):
        _record({}, ("log_probs",), (torch.full((2, 3), float("nan")),), (np.full((2, 3), np.nan, np.float32),), "x")


def test_nan_weights_are_refused_at_export(tmp_path: Path) -> None:
    plugin = GRUPlugin()
    model = plugin.build(plugin.preset("d2l"), 10, 10)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    from s2s_deploy.format.vocab import Vocabulary

    vocab = Vocabulary.build(["abcdef"])
    with pytest.raises(S2SError, match="NaN or inf"):
        export_model(plugin, model, plugin.preset("d2l"), vocab, vocab, tmp_path / "out",
                     checkpoint_path=tmp_path / "none", source="test")
    assert not (tmp_path / "out").exists()


class _NaNRun(DecodeRun):
    def __init__(self, rows: int, vocab: int) -> None:
        self.rows, self.vocab = rows, vocab

    def close(self) -> None:
        pass

    def step(self, tokens: np.ndarray, reorder: np.ndarray) -> np.ndarray:
        return np.full((len(tokens), self.vocab), np.nan, np.float32)

    def step_top(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.tile(np.arange(k, dtype=np.int64) + 3, (len(tokens), 1))
        return np.full((len(tokens), k), np.nan, np.float32), ids


class NaNBackend(Backend):
    """A model whose every log-prob is NaN, as an all-NaN export produces."""

    name, decoder_start_id, eos_id, vocab_size = "nan", 1, 2, 12

    def start(self, src: np.ndarray, src_len: np.ndarray, expand: int = 1, keep_attention: bool = False) -> DecodeRun:
        return _NaNRun(len(src) * expand, self.vocab_size)


@pytest.mark.parametrize("beam", [1, 3])
def test_search_on_nan_log_probs_is_one_line(beam: int) -> None:
    src, src_len = np.full((2, 3), 5, np.int64), np.array([3, 2])
    with pytest.raises(S2SError, match="NaN log-probs"):
        search(NaNBackend(), src, src_len, SearchConfig(beam, 1, 6))


# --- options and API misuse ---------------------------------------------------------------------

@pytest.mark.parametrize(("args", "fragment"), [
    (["--alpha", "nan"], "alpha"), (["--alpha", "inf"], "alpha"), (["--alpha", "-1"], "alpha"),
    (["--beam", "999"], "smaller than the target vocabulary"),
])
def test_bad_search_options(gru: Path, args: list[str], fragment: str) -> None:
    one_line(*run("translate", str(gru), "March 3", *args)[::2], fragment)


def test_max_len_beyond_the_position_table_is_refused(gru: Path, tmp_path: Path) -> None:
    folder = tampered(gru, tmp_path, lambda raw: raw["limits"].update(max_target_length=20))
    one_line(*run("translate", str(folder), "a", "--max-len", "21")[::2], "position table")


def test_forgetting_the_export_folder(tmp_path: Path) -> None:
    one_line(*run("translate", "March 3, 2021")[::2], "export folder not found")


def test_preset_with_a_checkpoint_is_refused(tmp_path: Path) -> None:
    one_line(*run("export", "--arch", "gru", "--checkpoint", str(BUNDLED / "gru.safetensors"), "--preset", "d2l",
                  "--out", str(tmp_path / "o"))[::2], "--preset")


def test_translator_input_types(gru: Path) -> None:
    translator = Translator(gru, device="cpu", threads=1)
    (one,) = translator("March 3, 2021")
    assert one.source == "March 3, 2021" and one.text == translator(["March 3, 2021"])[0].text
    with pytest.raises(S2SError, match="input 1 is a int"):
        translator([5, b"x"])
    with pytest.raises(S2SError, match="input 2 is a bytes"):
        translator(["a", b"x"])


def test_same_lines_with_and_without_output(gru: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes("March 3\n\nMay 1\u2028June 2\x0cJuly 4\r\n\n1999\n".encode())
    code, shown, _ = run("translate", str(gru), "--input", str(source))
    assert code == 0
    out = tmp_path / "out.txt"
    code, _, err = run("translate", str(gru), "--input", str(source), "--output", str(out), "--quiet")
    assert code == 0, err
    assert shown == out.read_text(encoding="utf-8")
    assert shown.count("\n") == 5 and shown.splitlines()[1] == "" and shown.splitlines()[3] == ""


# --- data loss ----------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["same", "hardlink", "symlink", "part-symlink"])
def test_output_never_overwrites_the_input(gru: Path, tmp_path: Path, how: str) -> None:
    source = tmp_path / "in.txt"
    source.write_text("March 3\nMay 1\n")
    before = source.read_bytes()
    output = tmp_path / "out.txt"
    if how == "same":
        output = source
    elif how == "hardlink":
        os.link(source, output)
    elif how == "symlink":
        output.symlink_to(source)
    else:
        Path(f"{output}.part").symlink_to(source)
    one_line(*run("translate", str(gru), "--input", str(source), "--output", str(output))[::2],
             "would overwrite the input")
    assert source.read_bytes() == before


def test_a_symlink_planted_at_the_part_file_is_not_followed(gru: Path, tmp_path: Path) -> None:
    source, output, victim = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "victim.txt"
    source.write_text("March 3\n")
    victim.write_text("precious")
    Path(f"{output}.part").symlink_to(victim)
    one_line(*run("translate", str(gru), "--input", str(source), "--output", str(output))[::2], "symbolic link")
    assert victim.read_text() == "precious" and not output.exists()


def test_a_second_writer_of_the_same_output_is_refused(gru: Path, tmp_path: Path) -> None:
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("March 3\n")
    fd = os.open(f"{output}.part", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        one_line(*run("translate", str(gru), "--input", str(source), "--output", str(output))[::2], "another run")
    finally:
        os.close(fd)
    assert not output.exists()


def test_export_force_replaces_only_an_earlier_export(tmp_path: Path) -> None:
    thesis = tmp_path / "work"
    thesis.mkdir()
    (thesis / "thesis.tex").write_text("years of work")
    one_line(*run("export", "--arch", "gru", "--out", str(thesis), "--force")[::2], "not an earlier s2s-deploy output")
    assert (thesis / "thesis.tex").read_text() == "years of work"
    link = tmp_path / "link"
    link.symlink_to(thesis)
    one_line(*run("export", "--arch", "gru", "--out", str(link), "--force")[::2], "symbolic link")
    cwd = Path.cwd()
    os.chdir(thesis)
    try:
        one_line(*run("export", "--arch", "gru", "--out", ".", "--force")[::2], "current folder")
    finally:
        os.chdir(cwd)
    assert (thesis / "thesis.tex").exists()


def test_quantize_never_onto_its_source(gru: Path) -> None:
    before = sha256_of(gru / "encoder.onnx")
    one_line(*run("quantize", str(gru), "--int8", "--out", str(gru), "--force")[::2], "is the export being quantised")
    assert sha256_of(gru / "encoder.onnx") == before


# --- file-system faults ---------------------------------------------------------------------------

def _fault(err: int) -> Callable[..., None]:
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(err, os.strerror(err))
    return fail


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_file_fault_while_translating_keeps_the_input_and_no_output(gru: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("March 3\nMay 1\n")
    monkeypatch.setattr(files.os, "fsync", _fault(err))
    line = one_line(*run("translate", str(gru), "--input", str(source), "--output", str(output), "--quiet")[::2])
    assert os.strerror(err) in line
    assert source.read_text() == "March 3\nMay 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_full_disk_during_export_leaves_no_staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import s2s_deploy.export.exporter as exporter

    monkeypatch.setattr(exporter.shutil, "copyfile", _fault(errno.ENOSPC))
    line = one_line(*run("export", "--arch", "gru", "--out", str(tmp_path / "out"))[::2])
    assert "No space left" in line
    assert list(tmp_path.iterdir()) == []


def test_read_only_folder_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staging.tempfile, "mkdtemp", _fault(errno.EROFS))
    one_line(*run("export", "--arch", "gru", "--out", str(tmp_path / "out"))[::2], "Read-only file system")


def test_leftovers_of_killed_runs_are_removed_and_umask_followed(tmp_path: Path) -> None:
    dead = tmp_path / ".out.tmp-999999999-abc"
    dead.mkdir()
    (dead / "encoder.onnx").write_bytes(b"half")
    alive = tmp_path / f".out.tmp-{os.getppid()}-abc"
    alive.mkdir()
    old = os.umask(0o022)
    try:
        with staging.staged_directory(tmp_path / "out", force=False) as work:
            (work / "manifest.json").write_text("{}")
    finally:
        os.umask(old)
    assert not dead.exists() and alive.exists()
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755


def test_resume_without_a_part_file_says_so(gru: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("March 3\n")
    one_line(*run("translate", str(gru), "--input", str(source), "--output", str(tmp_path / "o.txt"),
                  "--resume")[::2], "no interrupted run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


@pytest.mark.parametrize("sidecar", [
    '{"format": "s2s-deploy-partial/1"}', "[]", '{"format": "s2s-deploy-partial/1", "counts": 5}', "\xff", "nul",
])
def test_tampered_sidecar_is_one_line(gru: Path, tmp_path: Path, sidecar: str) -> None:
    source, output = tmp_path / "in.txt", tmp_path / "o.txt"
    source.write_text("March 3\n")
    Path(f"{output}.part").write_text("x\n")
    Path(f"{output}.part.json").write_text(sidecar)
    one_line(*run("translate", str(gru), "--input", str(source), "--output", str(output), "--resume")[::2], "corrupt")
    assert source.read_text() == "March 3\n"


def test_time_based_resume_point_inside_a_chunk(gru: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C after two batches of the first chunk keeps them; the resumed file is byte-identical."""
    translator = Translator(gru, device="cpu", threads=1)
    lines = [translator.manifest.samples[i % len(translator.manifest.samples)] for i in range(40)]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n")
    options = files.FileOptions(batch_size=8, chunk_lines=1000)
    whole = tmp_path / "whole.txt"
    files.translate_file(translator, str(source), str(whole), options, progress=False)

    monkeypatch.setattr(files, "SAVE_SECONDS", 0.0)
    engine = translator.engine

    class Counting:
        """The real engine, counting its batches; Ctrl-C at batch ``stop_at``."""

        name = engine.name

        def __init__(self, stop_at: int | None) -> None:
            self.calls, self.stop_at = 0, stop_at

        def search(self, *args: object) -> object:
            self.calls += 1
            if self.calls == self.stop_at:
                raise KeyboardInterrupt
            return engine.search(*args)

    output = tmp_path / "out.txt"
    translator.engine = Counting(stop_at=3)
    with pytest.raises(files.TranslationInterrupted, match="16 of the next chunk"):
        files.translate_file(translator, str(source), str(output), options, progress=False)
    translator.engine = resumed = Counting(stop_at=None)
    files.translate_file(translator, str(source), str(output), options, resume=True, progress=False)
    from s2s_deploy.runtime.translator import batches_of

    ids = [translator.manifest.src_vocab.encode(line) for line in lines]
    batches = batches_of(ids, translator.padding, options.batch_size)
    assert len(batches) > 3 and resumed.calls == len(batches) - 2  # the first 2 kept from the interrupted run
    assert output.read_bytes() == whole.read_bytes()


# --- checkpoints ------------------------------------------------------------------------------------

def _checkpoint(tmp_path: Path, edit_config: dict | None = None, drop: str | None = None) -> Path:
    src = BUNDLED / "transformer.safetensors"
    with safe_open(str(src), "pt") as handle:
        metadata = dict(handle.metadata())
    if edit_config:
        metadata["config"] = json.dumps(json.loads(metadata["config"]) | edit_config)
    if drop:
        metadata.pop(drop)
    path = tmp_path / "bad.safetensors"
    save_file(load_file(str(src)), str(path), metadata=metadata)
    return path


@pytest.mark.parametrize(("edit", "fragment"), [
    ({"num_heads": 0}, "num_heads=0"), ({"max_len": -5}, "max_len=-5"), ({"d_model": "128"}, "whole number"),
    ({"d_model": 1 << 20}, "refusing to allocate"), ({"dropout": float("nan")}, "finite"),
    ({"d_model": 130}, "config expects"),
])
def test_bad_checkpoint_config_is_refused_before_allocating(tmp_path: Path, edit: dict, fragment: str) -> None:
    with pytest.raises(S2SError, match=fragment):
        load_checkpoint(_checkpoint(tmp_path, edit))


def test_checkpoint_metadata_and_header_bounds(tmp_path: Path) -> None:
    with pytest.raises(S2SError, match="plugin_version"):
        load_checkpoint(_checkpoint(tmp_path, drop="plugin_version"))
    crafted = tmp_path / "crafted.safetensors"
    crafted.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(S2SError, match="header"):
        load_checkpoint(crafted)


# --- plugin authors -----------------------------------------------------------------------------------

def _export_with(plugin: GRUPlugin, tmp_path: Path) -> None:
    from s2s_deploy.format.vocab import Vocabulary

    vocab = Vocabulary.build(["abcdefgh"])
    config = plugin.preset("d2l")
    export_model(plugin, plugin.build(config, len(vocab), len(vocab)), config, vocab, vocab, tmp_path / "o",
                 checkpoint_path=tmp_path / "none", source="test")


def test_encode_returning_the_wrong_key(tmp_path: Path) -> None:
    from s2s_deploy.modeling.contract import MemorySpec

    plugin = type("WrongKey", (GRUPlugin,), {"name": "wrongkey",
                                              "memory_specs": lambda self, c: (MemorySpec("ctx", 0),)})()
    with pytest.raises(ContractError, match=r"plugin 'wrongkey': encode\(\) returned no 'ctx'.*likely fix"):
        _export_with(plugin, tmp_path)


def test_wrong_state_batch_axis(tmp_path: Path) -> None:
    from s2s_deploy.modeling.contract import StateSpec

    plugin = type("WrongAxis", (GRUPlugin,), {"name": "wrongaxis",
                                              "state_specs": lambda self, c: (StateSpec("h", 0, "encoder"),)})()
    with pytest.raises(ContractError, match=r"state 'h' has shape .* likely fix: batch_axis=1"):
        _export_with(plugin, tmp_path)


def test_unsupported_op_is_one_line_and_debug_shows_the_trace(tmp_path: Path, monkeypatch) -> None:
    from s2s_deploy_plugins.models.gru import GRUSeq2Seq

    class Bessel(GRUSeq2Seq):
        def encode(self, src, src_len):  # type: ignore[no-untyped-def]
            out = super().encode(src, src_len)
            return {"context": out["context"] + 0 * torch.special.bessel_j0(out["context"]), "h": out["h"]}

    plugin = type("Bessel", (GRUPlugin,), {"name": "bessel", "build": lambda self, c, s, t: Bessel(c, s, t)})()
    from s2s_deploy.modeling.plugin_errors import PluginError

    with pytest.raises(PluginError, match=r"plugin 'bessel': torchscript export of the encoder .* likely fix: "
                                          r"an operator the exporter cannot translate"):
        _export_with(plugin, tmp_path)


def test_debug_flag_prints_the_trace_before_the_line(tmp_path: Path) -> None:
    code, _, err = run("--debug", "translate", str(tmp_path / "nowhere"), "a")
    assert code == 1 and err.strip().splitlines()[-1].startswith("error: ")
    code, _, err = run("--debug", "export", "--arch", "gru", "--checkpoint", str(tmp_path / "x.st"),
                       "--out", str(tmp_path / "o"))
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: checkpoint not found")


def test_third_party_reusing_a_builtin_name_disables_only_itself(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from importlib.metadata import EntryPoint, entry_points

    import s2s_deploy.architecture.registry as registry

    module = type(sys)("fake_third_party")
    module.PLUGIN = type("Impostor", (GRUPlugin,), {"description": "not ours"})()
    monkeypatch.setitem(sys.modules, "fake_third_party", module)
    impostor = EntryPoint("gru", "fake_third_party:PLUGIN", registry.ENTRY_POINT_GROUP)
    broken = EntryPoint("broken", "no_such_module_x:PLUGIN", registry.ENTRY_POINT_GROUP)
    real = list(entry_points(group=registry.ENTRY_POINT_GROUP))
    monkeypatch.setattr(registry, "entry_points", lambda group: [impostor, broken, *real])
    fresh = Registry()
    names = {entry.plugin.name: entry for entry in fresh.entries()}
    assert {"gru", "transformer", "lstm"} <= set(names)
    assert names["gru"].builtin and type(names["gru"].plugin) is GRUPlugin
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("warning: plugin entry point") for w in warnings)


def test_ray_address_that_refuses_fails_fast() -> None:
    from s2s_deploy.jobs.distributed import _probe

    with pytest.raises(S2SError, match="cannot reach the Ray cluster"):
        _probe("127.0.0.1:1")



def _wav(frames: int, rate: int, body: bytes) -> bytes:
    """A 16-bit mono PCM WAV whose header says ``frames`` at ``rate`` and holds ``body``."""
    size = 2 * frames
    return (b"RIFF" + struct.pack("<I", 36 + size) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, 2 * rate,
            2, 16) + b"data" + struct.pack("<I", size) + body)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from s2s_deploy.architecture.registry import get_plugin
    from s2s_deploy.export.sources import load_source

    plugin = get_plugin("speech")
    work = tmp_path_factory.mktemp("speech")
    source = load_source(plugin, None, "tiny", work)
    export_model(plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, work / "export",
                 checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples)
    return work / "export"


HOSTILE_MEDIA = [  # (file name, bytes, what the one line says): issue 48's table, each refused from the header
    ("1hz.wav", _wav(2000, 1, bytes(4000)), "a sampling rate of 1 Hz is outside the plausible 1000-384000 Hz"),
    ("5h36m.wav", _wav(20000, 1, bytes(40000)), "a sampling rate of 1 Hz is outside"),
    ("384khz+.wav", _wav(2000, 400_000, bytes(4000)), "a sampling rate of 400000 Hz is outside"),
]


@pytest.mark.parametrize(("name", "data", "fragment"), HOSTILE_MEDIA, ids=[row[0] for row in HOSTILE_MEDIA])
def test_hostile_audio_headers_are_one_line_before_decoding(speech: Path, tmp_path: Path, name: str,
                                                            data: bytes, fragment: str) -> None:
    """Before, the 4 KB one took 2.2 GB and 98 s and the 40 KB one a 49-line MemoryError."""
    import time

    path = tmp_path / name
    path.write_bytes(data)
    started = time.perf_counter()
    code, _, err = run("transcribe", str(speech), str(path))
    one_line(code, err, fragment)
    assert time.perf_counter() - started < 30  # the export's load, not minutes of resampling


def test_an_array_at_an_implausible_rate_is_one_line(speech: Path) -> None:
    """``Transcriber()([(samples, 1.5)])`` was killed by the OOM killer at 12.4 GB."""
    from s2s_deploy.runtime.transcriber import Transcriber

    transcriber = Transcriber(speech, device="cpu", max_duration=5)
    with pytest.raises(S2SError, match=r"clip 1: a sampling rate of 1\.5 Hz is outside"):
        transcriber([(np.zeros(24000, dtype=np.float32), 1.5)])
    with pytest.raises(S2SError, match=r"clip 1: 6\.0 s of audio is over the limit of 5 s"):
        transcriber([np.zeros(96000, dtype=np.float32)])
    lines: list[str] = []  # float audio scaled by 1e6 gave 96 'h's with no word of warning
    loud = Transcriber(transcriber.translator, warn=lines.append)
    loud([np.sin(np.arange(8000, dtype=np.float32) / 7) * 1e6], max_len=4)
    assert lines == ["warning: clip 1 peaks at 1e+06, far outside ±1: scale float samples to [-1, 1] "
                     "(the text will be unreliable)"]


def test_a_truncated_wav_warns_once_and_reads_what_it_holds(speech: Path, tmp_path: Path) -> None:
    """Before, a WAV whose header promised twice its data decoded the half it had, silently."""
    tone = (0.3 * np.sin(np.arange(16000) / 5) * 32767).astype("<i2").tobytes()
    whole, half = tmp_path / "whole.wav", tmp_path / "half.wav"
    whole.write_bytes(_wav(16000, 16000, tone))
    half.write_bytes(_wav(16000, 16000, tone[: len(tone) // 2]))
    (tmp_path / "half-as-such.wav").write_bytes(_wav(8000, 16000, tone[: len(tone) // 2]))
    code, out, err = run("transcribe", str(speech), str(half), "--max-len", "4", "--quiet")
    assert code == 0 and doubtless(err) == (f"warning: audio {half} is truncated: its header promises 32000 bytes of "
                                            "audio, the file holds 16000; reading what it holds\n")
    code, honest, err = run("transcribe", str(speech), str(tmp_path / "half-as-such.wav"), "--max-len", "4", "--quiet")
    assert (code, honest, doubtless(err)) == (0, out, "")  # the half it holds, read as a file that says so
    assert doubtless(run("transcribe", str(speech), str(whole), "--max-len", "4", "--quiet")[2]) == ""


def test_an_image_bomb_is_one_line(tmp_path: Path) -> None:
    """A 12000x12000 PNG passed with Pillow's raw two-line warning and took 1.2 GB; now it is refused from
    its header (test_media_cli.py measures the memory)."""
    import warnings

    from PIL import Image

    from s2s_deploy.frontends.image import load_image

    big = tmp_path / "big.png"
    Image.new("L", (12000, 12000), 0).save(big)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(S2SError, match=r"is 12000x12000 pixels, over the budget of 67108864"):
            load_image(big)
