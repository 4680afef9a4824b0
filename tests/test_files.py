"""File translation: order, blank and long lines, UTF-8 errors, and resuming to the same bytes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from s2s_deploy.cli import main
from s2s_deploy.errors import S2SError
from s2s_deploy.jobs import files
from s2s_deploy.jobs.files import FileOptions, TranslationInterrupted, translate_file
from s2s_deploy.runtime.translator import Translator

LIMIT = 16  # source tokens, EOS included: 15 characters
MAX_LEN = 12


@pytest.fixture(scope="module")
def translator(exports, tmp_path_factory: pytest.TempPathFactory) -> Translator:
    """The small export, with a source limit short enough that samples cross it."""
    _, manifest = exports.get("gru")
    copy = tmp_path_factory.mktemp("limited") / "export"
    shutil.copytree(manifest.directory, copy)
    raw = json.loads((copy / "manifest.json").read_text())
    raw["limits"]["max_source_length"] = LIMIT
    (copy / "manifest.json").write_text(json.dumps(raw))
    return Translator(copy, device="cpu", threads=1)


def short_lines(translator: Translator, count: int) -> list[str]:
    samples = [s[: LIMIT - 1 - i % 5] for i, s in enumerate(translator.manifest.samples)]
    return [samples[i % len(samples)] for i in range(count)]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def options(translator: Translator, beam: int | None = None, **changes) -> FileOptions:
    """File options with the decoding options resolved against the export, as the CLI does."""
    search = translator.search_config(beam, max_len=MAX_LEN)
    return FileOptions(**{"search": search, "batch_size": 4, "chunk_lines": 8, **changes})


def expected(translator: Translator, lines: list[str], **kwargs) -> list[str]:
    return [t.text for t in translator(lines, max_len=MAX_LEN, batch_size=4, **kwargs)]


def test_order_blank_lines_and_equal_to_translator(translator: Translator, tmp_path: Path) -> None:
    texts = short_lines(translator, 20)
    lines = [*texts[:3], "", *texts[3:10], "   ", *texts[10:], ""]
    source = write(tmp_path / "in.txt", lines)
    summary = translate_file(translator, str(source), str(tmp_path / "out.txt"), options(translator, chunk_lines=100),
                             progress=False)
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    assert [o for line, o in zip(lines, out, strict=False) if not line.strip()] == ["", "", ""]
    assert [o for line, o in zip(lines, out, strict=False) if line.strip()] == expected(translator, texts)
    assert (summary.counts.lines, summary.counts.blank) == (len(lines), 3)
    assert not (tmp_path / "out.txt.part").exists() and not (tmp_path / "out.txt.part.json").exists()


def test_chunks_batches_beam_and_scores_keep_alignment(translator: Translator, tmp_path: Path) -> None:
    texts = short_lines(translator, 11)
    lines = ["", *texts, "x" * 40]
    source = write(tmp_path / "in.txt", lines)
    translate_file(translator, str(source), str(tmp_path / "out.txt"),
                   options(translator, beam=2, scores=True, chunk_lines=5),
                   progress=False)
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert len(out) == len(lines) and out[0] == ""
    assert all(float(line.split("\t")[0]) <= 0 for line in out[1:])
    translate_file(translator, str(source), str(tmp_path / "one.txt"),
                   options(translator, beam=2, scores=True, chunk_lines=100),
                   progress=False)
    single = (tmp_path / "one.txt").read_text(encoding="utf-8").splitlines()
    assert [line.split("\t")[-1] for line in out] == [line.split("\t")[-1] for line in single]


def test_on_long(translator: Translator, tmp_path: Path) -> None:
    long = "abcdefghijklmnopqrstuvwxyz"
    texts = short_lines(translator, 3)
    source = write(tmp_path / "in.txt", [texts[0], long, texts[1], long + long, texts[2]])
    runs = {}
    for mode in ("truncate", "skip"):
        summary = translate_file(translator, str(source), str(tmp_path / f"{mode}.txt"),
                                 options(translator, on_long=mode),
                                 progress=False)
        runs[mode] = (tmp_path / f"{mode}.txt").read_text(encoding="utf-8").splitlines()
        assert len(runs[mode]) == 5
        assert (summary.counts.truncated, summary.counts.skipped) == ((2, 0) if mode == "truncate" else (0, 2))
        assert f"2 {'truncated' if mode == 'truncate' else 'skipped'}" in summary.describe()
    assert runs["skip"][1] == runs["skip"][3] == ""
    assert [runs["skip"][i] for i in (0, 2, 4)] == [runs["truncate"][i] for i in (0, 2, 4)]
    assert runs["truncate"][1] == runs["truncate"][3] == expected(translator, [long[: LIMIT - 1]])[0]
    with pytest.raises(S2SError, match=r"input line 2 has 27 tokens, over the model's limit of 16"):
        translate_file(translator, str(source), str(tmp_path / "error.txt"),
                       options(translator, on_long="error"), progress=False)
    assert not (tmp_path / "error.txt").exists() and not (tmp_path / "error.txt.part").exists()


def test_invalid_utf8_names_the_line(translator: Translator, tmp_path: Path) -> None:
    good = short_lines(translator, 12)
    source = tmp_path / "in.txt"
    source.write_bytes("\n".join(good).encode() + b"\nab\xffc\n" + b"tail\r\n")
    with pytest.raises(S2SError, match=r"input line 13 is not valid UTF-8 \(byte 3 of the line\)"):
        translate_file(translator, str(source), str(tmp_path / "out.txt"), options(translator), progress=False)
    assert not (tmp_path / "out.txt").exists()
    translate_file(translator, str(source), str(tmp_path / "out.txt"),
                   options(translator, errors="replace"), resume=True,
                   progress=False)
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert len(out) == 14
    assert out[12:] == expected(translator, ["ab\ufffdc", "tail"])


def interrupt_after(monkeypatch: pytest.MonkeyPatch, chunks: int) -> None:
    real = files.translate_chunk
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) > chunks:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(files, "translate_chunk", flaky)


def test_interrupted_run_resumes_to_the_same_file(translator: Translator, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    lines = short_lines(translator, 30)
    lines[5] = ""
    source = write(tmp_path / "in.txt", lines)
    translate_file(translator, str(source), str(tmp_path / "whole.txt"), options(translator), progress=False)
    out = tmp_path / "out.txt"
    with monkeypatch.context() as patch:
        interrupt_after(patch, 2)
        with pytest.raises(TranslationInterrupted, match=r"16 lines are safe in .*out\.txt\.part; .*--resume"):
            translate_file(translator, str(source), str(out), options(translator), progress=False)
    assert not out.exists()
    state = json.loads((tmp_path / "out.txt.part.json").read_text())
    assert state["counts"]["lines"] == 16
    with pytest.raises(S2SError, match="holds 16 lines from an earlier run: pass --resume"):
        translate_file(translator, str(source), str(out), options(translator), progress=False)
    with monkeypatch.context() as patch:
        interrupt_after(patch, 1)
        with pytest.raises(TranslationInterrupted, match="24 lines are safe"):
            translate_file(translator, str(source), str(out), options(translator), resume=True, progress=False)
    summary = translate_file(translator, str(source), str(out), options(translator), resume=True, progress=False)
    assert out.read_bytes() == (tmp_path / "whole.txt").read_bytes()
    assert (summary.resumed, summary.counts.lines, summary.counts.blank) == (24, 30, 1)
    assert not (tmp_path / "out.txt.part").exists() and not (tmp_path / "out.txt.part.json").exists()


def test_resume_refuses_other_input_or_options(translator: Translator, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    lines = short_lines(translator, 20)
    source = write(tmp_path / "in.txt", lines)
    out = tmp_path / "out.txt"
    with monkeypatch.context() as patch:
        interrupt_after(patch, 1)
        with pytest.raises(TranslationInterrupted):
            translate_file(translator, str(source), str(out), options(translator, on_long="error"), progress=False)
    other = write(tmp_path / "other.txt", lines)
    with pytest.raises(S2SError, match=r"cannot resume .*made from .*in\.txt, not .*other\.txt"):
        translate_file(translator, str(other), str(out), options(translator), resume=True, progress=False)
    with pytest.raises(S2SError, match="made with beam_size=1, not beam_size=2"):
        translate_file(translator, str(source), str(out), options(translator, beam=2), resume=True, progress=False)
    write(source, ["changed", *lines[1:]])
    with pytest.raises(S2SError, match="the first 8 lines of the input changed"):
        translate_file(translator, str(source), str(out), options(translator), resume=True, progress=False)
    write(source, [*lines, "appended"])
    translate_file(translator, str(source), str(out), options(translator, on_long="skip"), resume=True, progress=False)
    assert len(out.read_text().splitlines()) == 21


def test_empty_input_gives_empty_output(translator: Translator, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"")
    summary = translate_file(translator, str(source), str(tmp_path / "out.txt"), options(translator), progress=False)
    assert (tmp_path / "out.txt").read_bytes() == b"" and summary.counts.lines == 0


def run(*args: str, stdin: str | None = None):
    return CliRunner().invoke(main, list(args), input=stdin)


def test_cli_file_stdin_stdout_and_summary(translator: Translator, tmp_path: Path) -> None:
    lines = short_lines(translator, 6)
    lines[2] = ""
    source = write(tmp_path / "in.txt", lines)
    export = str(translator.manifest.directory)
    common = ("--max-len", str(MAX_LEN), "--batch-size", "4", "--device", "cpu")
    result = run("translate", export, "--input", str(source), "--output", str(tmp_path / "out.txt"), *common)
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("translated 6 lines to ")
    piped = run("translate", export, "--input", "-", "--output", "-", "--quiet", *common, stdin=source.read_text())
    assert piped.exit_code == 0, piped.stderr
    assert piped.stdout == (tmp_path / "out.txt").read_text(encoding="utf-8")
    assert piped.stderr.strip().splitlines() == [piped.stderr.strip()]


def test_output_takes_the_manifests_beam_like_the_terminal(translator: Translator, tmp_path: Path) -> None:
    """An export whose manifest says beam 4 decodes ``--output`` files with beam 4 too, not greedy."""
    copy = tmp_path / "beam4"
    shutil.copytree(translator.manifest.directory, copy)
    raw = json.loads((copy / "manifest.json").read_text())
    raw["search"]["beam_size"] = 4
    (copy / "manifest.json").write_text(json.dumps(raw))
    lines = short_lines(translator, 12)
    source = write(tmp_path / "in.txt", lines)
    common = ("--max-len", str(MAX_LEN), "--device", "cpu", "--quiet")
    to_file = run("translate", str(copy), "--input", str(source), "--output", "-", *common)
    on_terminal = run("translate", str(copy), *lines, *common)
    assert to_file.exit_code == 0 and on_terminal.exit_code == 0, to_file.stderr + on_terminal.stderr
    assert to_file.stdout == on_terminal.stdout
    beam4 = [t.text for t in Translator(copy, device="cpu")(lines, beam=4, max_len=MAX_LEN)]
    assert to_file.stdout.splitlines() == beam4


def test_cli_interrupt_and_option_errors(translator: Translator, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    source = write(tmp_path / "in.txt", short_lines(translator, 3))
    export = str(translator.manifest.directory)
    monkeypatch.setattr(files, "translate_chunk", lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt))
    result = run("translate", export, "--input", str(source), "--output", str(tmp_path / "out.txt"), "--quiet")
    assert result.exit_code == 130
    assert result.stderr.strip() == "interrupted before the first 10000 lines were done; nothing to resume"
    for args, message in ((("--input", str(source), "--resume"), "--resume needs --output"),
                          (("hello", "--output", "x.txt"), "--output translates --input FILE"),
                          (("--input", str(source), "--output", "x.txt", "--n-best", "2"), "--n-best needs")):
        result = run("translate", export, *args)
        assert result.exit_code == 1 and result.stderr.startswith("error: ") and message in result.stderr


def test_without_ray_one_line_error(translator: Translator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    source = write(tmp_path / "in.txt", ["abc"])
    result = run("translate", str(translator.manifest.directory), "--input", str(source),
                 "--output", str(tmp_path / "out.txt"), "--ray")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: install the ray extra: pip install 's2s-deploy[ray]'"


def test_file_translation_needs_no_torch(translator: Translator, tmp_path: Path) -> None:
    source = write(tmp_path / "in.txt", short_lines(translator, 3))
    code = ("import sys; sys.modules['torch'] = None\nfrom s2s_deploy.cli import main\n"
            f"main(['translate', {str(translator.manifest.directory)!r}, '--input', {str(source)!r}, "
            f"'--output', '-', '--max-len', '{MAX_LEN}', '--device', 'cpu', '--batch-size', '4'])\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected(translator, short_lines(translator, 3))
