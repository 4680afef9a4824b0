"""An encoder that reads features: the source spec through contract, export, manifest and runtime.

One export of the speech plugin's tiny preset (seeded random weights: shapes, not words), then
the sample clips of tests/data transcribed by the torch-free runtime against the PyTorch model.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from s2s_deploy.architecture.registry import get_plugin
from s2s_deploy.cli import main
from s2s_deploy.errors import ContractError, ManifestError, S2SError
from s2s_deploy.export.exporter import export_model
from s2s_deploy.export.sources import load_source
from s2s_deploy.format.manifest import FORMAT, load_manifest
from s2s_deploy.format.source import FEATURES, FRAMES, TOKEN_SOURCE, SourceSpec
from s2s_deploy.frontends import WhisperLogMel
from s2s_deploy.frontends.source import check_frontend
from s2s_deploy.modeling.contract import validate_plugin
from s2s_deploy.modeling.torch_backend import TorchBackend
from s2s_deploy.runtime.decoding import resolve
from s2s_deploy.runtime.search import search
from s2s_deploy.runtime.transcriber import Transcriber, pad_features
from s2s_deploy.train.metrics import error_rate
from s2s_deploy_plugins.speech import SpeechPlugin

DATA = Path(__file__).parent / "data"
CLIPS = sorted(str(path) for path in DATA.glob("speech_*.flac"))


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory):
    plugin = get_plugin("speech")
    work = tmp_path_factory.mktemp("speech")
    source = load_source(plugin, None, "tiny", work)
    out = work / "export"
    export_model(plugin, source.model, source.config, source.src_vocab, source.tgt_vocab, out,
                 checkpoint_path=source.checkpoint_path, source=source.description, samples=source.samples)
    return plugin, source, out


def test_export_declares_features_and_their_front_end(speech) -> None:
    _, _, out = speech
    manifest = load_manifest(out)
    assert manifest.to_dict()["format"] == FORMAT
    spec = manifest.encoder_input
    assert (spec.kind, spec.shape, spec.dtype) == (FEATURES, (16, FRAMES), "float32")
    assert dict(spec.frontend) == WhisperLogMel(n_mels=16, chunk_length=1).to_json()
    src = next(io for io in manifest.to_dict()["graphs"]["encoder"]["inputs"] if io["name"] == "src")
    assert (src["role"], src["dtype"], len(src["shape"])) == ("source_features", "float32", 3)
    assert manifest.samples == ()  # text samples are no input to this encoder
    validation = manifest.to_dict()["validation"]
    assert max(validation["max_abs_diff"].values()) <= validation["atol"]


@pytest.mark.parametrize("beam", [1, 3])
def test_transcription_equals_the_pytorch_search(speech, beam: int) -> None:
    plugin, source, out = speech
    transcriber = Transcriber(out, device="cpu")
    config = transcriber.translator.search_config(beam, beam, 12)
    # the clips as cut to the 1-s window (Transcriber reads a longer clip window by window, n_best 1)
    found = transcriber.decode([transcriber.features(clip) for clip in CLIPS], config, CLIPS)
    backend = TorchBackend(plugin, source.model, source.config, source.tgt_vocab)
    src, src_len = pad_features([transcriber.features(clip) for clip in CLIPS], transcriber.source)
    want = search(backend, src, src_len, transcriber.translator.search_config(beam, beam, 12))
    assert [t.source for t in found] == CLIPS
    for transcription, hyps in zip(found, want, strict=True):
        assert [text for text, _ in transcription.hypotheses] == [source.tgt_vocab.decode(h.tokens) for h in hyps]
        np.testing.assert_allclose([s for _, s in transcription.hypotheses], [h.score for h in hyps], atol=1e-4)
    alone = [transcriber.decode([transcriber.features(clip)], config)[0].text for clip in CLIPS]
    assert alone == [t.text for t in found]


def test_a_long_clip_is_read_in_windows_cut_at_pauses_and_the_texts_joined_by_a_space(exports) -> None:
    """The bundled speech model has no timestamp tokens, and its manifest says ``window_cut: pause``: a
    clip of the three spoken clips said three times over, 0.8-s pauses between them, is cut into windows
    that end in the pauses (never in a clip), each decoded alone (padded with the clip's lowest value, as
    docs/manifest.md says), the texts stripped and joined by one space; ``window_cut="fixed"`` reads whole
    8-s windows instead."""
    from s2s_deploy.frontends import load_audio
    from s2s_deploy.runtime.pauses import pause_windows

    transcriber = Transcriber(exports.get("speech")[1].directory, device="cpu")
    assert transcriber.manifest.search["window_cut"] == "pause"
    rate = transcriber.sampling_rate
    gap = np.zeros(int(0.8 * rate), dtype=np.float32)  # the model reads speech that starts its window
    spoken = [load_audio(clip, rate) for clip in CLIPS] * 3
    samples = np.concatenate([part for clip in spoken for part in (clip, gap)])
    whole = transcriber.features(samples, whole=True)
    window = transcriber.window([whole])
    assert 2 * window < whole.shape[-1] <= 3 * window
    ends = pause_windows(whole, window)
    hop = rate // 100
    spans, at = [], 0
    for clip in spoken:
        spans.append((at // hop, (at + len(clip)) // hop + 1))
        at += len(clip) + len(gap)
    assert not [end for end in ends[:-1] if any(a <= end <= b for a, b in spans)], (ends, spans)
    config = transcriber.translator.search_config()
    texts, start = [], 0
    for end in ends:
        part = np.full_like(whole[:, :window], whole.min())
        part[:, : end - start] = whole[:, start:end]
        texts.append(transcriber.decode([part], config)[0].text.strip())
        start = end
    assert sum(bool(text) for text in texts) >= 2
    assert transcriber(samples)[0].text == " ".join(text for text in texts if text)
    fixed = []
    for start in range(0, whole.shape[-1], window):
        part = np.zeros_like(whole[:, :window])
        part[:, : whole[:, start : start + window].shape[-1]] = whole[:, start : start + window]
        fixed.append(transcriber.decode([part], config)[0].text.strip())
    assert transcriber(samples, window_cut="fixed")[0].text == " ".join(text for text in fixed if text)


def test_arrays_in_any_rate_give_what_files_give(speech) -> None:
    import soundfile

    _, _, out = speech
    transcriber = Transcriber(out, device="cpu")
    samples, rate = soundfile.read(CLIPS[0], dtype="float32")
    from_file = transcriber.features(CLIPS[0])
    np.testing.assert_array_equal(transcriber.features((samples, rate)), from_file)
    assert transcriber(CLIPS[0], max_len=8)[0].text == transcriber((samples, rate), max_len=8)[0].text


def test_transcribe_command_lines_json_and_one_line_errors(speech, tmp_path: Path, monkeypatch) -> None:
    """...and the options are resolved once, by the command (the reader takes the ready config)."""
    from s2s_deploy.runtime import translator

    _, _, out = speech
    runner = CliRunner()
    resolved = []
    monkeypatch.setattr(translator, "resolve", lambda *args: resolved.append(args) or resolve(*args))
    result = runner.invoke(main, ["transcribe", str(out), *CLIPS, "--max-len", "8", "--quiet"])
    assert result.exit_code == 0, result.output
    assert len(resolved) == 1 and resolved[0][1]["max_len"] == 8
    lines = result.stdout.splitlines()  # stderr: the random weights' doubt warnings
    assert len(lines) == len(CLIPS)
    target = tmp_path / "out.json"
    result = runner.invoke(main, ["transcribe", str(out), *CLIPS, "--max-len", "8", "--quiet", "--output", str(target)])
    assert result.exit_code == 0, result.output
    rows = json.loads(target.read_text())
    assert [row["file"] for row in rows] == CLIPS and [row["text"] for row in rows] == lines
    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("not audio")
    for args in (["transcribe", str(out), str(not_audio)], ["transcribe", str(out), str(tmp_path / "missing.flac")],
                 ["transcribe", str(out), CLIPS[0], "--output", str(tmp_path / "a.srt")],
                 ["translate", str(out), "some text"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 1
        assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("error:"), result.output


def test_parity_runs_on_audio_files_and_synthetic_clips(speech, tmp_path: Path) -> None:
    """A features export's parity: the clips through its front end, ONNX Runtime against PyTorch."""
    _, _, out = speech
    listing = tmp_path / "clips.txt"
    listing.write_text("\n".join(CLIPS) + "\n")
    for extra in ([], ["--input", str(listing)]):
        result = CliRunner().invoke(main, ["parity", str(out), "--max-len", "8", "--beam", "2", *extra])
        assert result.exit_code == 0 and "parity: PASS" in result.output, result.output
        assert f"tokens identical {16 if not extra else len(CLIPS)}/" in result.output


@pytest.mark.parametrize(("edit", "message"), [
    (lambda e: e.update(shape=[16]), "axes"),
    (lambda e: e.update(shape=[16, "frames", "frames"]), "frames"),
    (lambda e: e.update(dtype="int64"), "dtype"),
    (lambda e: e.update(shape=[16, 4, "frames"]), "axes"),
    (lambda e: e.pop("frontend"), "front end"),
    (lambda e: e.update(kind="pixels"), "kind"),
    (lambda e: e.update(pad_value="zero"), "pad_value"),
])
def test_a_bad_source_spec_is_one_line(speech, tmp_path: Path, edit, message: str) -> None:
    _, _, out = speech
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    raw = json.loads((copy / "manifest.json").read_text())
    edit(raw["encoder_input"])
    (copy / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ManifestError) as info:
        load_manifest(copy)
    assert message in str(info.value) and "\n" not in str(info.value)
    result = CliRunner().invoke(main, ["transcribe", str(copy), CLIPS[0]])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1


def test_an_unknown_front_end_is_one_line(speech, tmp_path: Path) -> None:
    _, _, out = speech
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    raw = json.loads((copy / "manifest.json").read_text())
    raw["encoder_input"]["frontend"]["kind"] = "mfcc"
    (copy / "manifest.json").write_text(json.dumps(raw))
    result = CliRunner().invoke(main, ["transcribe", str(copy), CLIPS[0]])
    assert result.exit_code == 1 and "unknown kind 'mfcc'" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_token_exports_read_as_tokens_in_every_format(exports, tmp_path: Path) -> None:
    _, manifest = exports.get("transformer")
    assert manifest.encoder_input == TOKEN_SOURCE
    assert manifest.to_dict()["encoder_input"] == {"kind": "tokens", "dtype": "int64"}
    copy = tmp_path / "old"
    shutil.copytree(manifest.directory, copy)
    raw = json.loads((copy / "manifest.json").read_text())
    del raw["encoder_input"]
    raw["format"] = "s2s-deploy-manifest/3"
    raw["search"]["length_penalty_alpha"] = raw["search"].pop("alpha")  # format 3 names it so
    (copy / "manifest.json").write_text(json.dumps(raw))
    assert load_manifest(copy).encoder_input == TOKEN_SOURCE
    with pytest.raises(S2SError, match="use translate"):
        Transcriber(copy, device="cpu")


def test_pad_features_pads_the_frames_axis_with_the_pad_value() -> None:
    for shape, items in (((2, FRAMES), [np.ones((2, 3)), np.ones((2, 5))]),
                         ((FRAMES, 2), [np.ones((3, 2)), np.ones((5, 2))])):
        spec = SourceSpec(FEATURES, shape, "float32", -2.0, {"kind": "whisper_log_mel"})
        src, src_len = pad_features(items, spec)
        assert src_len.tolist() == [3, 5] and src.dtype == np.float32
        first = src[0] if shape[0] == 2 else src[0].T
        assert (first[:, :3] == 1).all() and (first[:, 3:] == -2).all()


def test_the_contract_refuses_a_bad_source_spec() -> None:
    bad = SourceSpec(FEATURES, (16, FRAMES, FRAMES), "float32", 0.0, {"kind": "whisper_log_mel"})
    plugin = type("NoFrames", (SpeechPlugin,), {"name": "noframes", "source_spec": lambda self, config: bad})()
    with pytest.raises(ContractError, match="frames"):
        validate_plugin(plugin)


def test_export_refuses_a_front_end_of_another_shape() -> None:
    plugin = SpeechPlugin()
    config = plugin.preset("tiny")
    assert config.n_mels == 16
    spec = dataclasses.replace(plugin.source_spec(config), shape=(80, FRAMES))
    with pytest.raises(S2SError, match=r"encoder reads \(80, frames\)"):
        check_frontend("speech", spec)


def test_error_rates_count_edits_over_reference_length() -> None:
    assert error_rate(["a b c", "x"], ["a c", "x y"]) == pytest.approx(2 / 4)
    assert error_rate(["kitten"], ["sitting"], "char") == pytest.approx(3 / 7)


def test_evaluate_and_quantize_score_a_speech_dataset(speech, tmp_path: Path, monkeypatch) -> None:
    """``--task speech:DIR``: evaluate and quantize's accuracy table read a dataset folder's features and
    transcripts (here the sample clips, two of whose targets are what the model says), and a recorded
    dataset that is not on this machine skips the table in one line instead of failing."""
    pytest.importorskip("sacrebleu")
    from s2s_deploy.frontends import load_audio
    from s2s_deploy.train import speech_data

    _, _, out = speech
    frontend = WhisperLogMel.from_json(load_manifest(out).encoder_input.frontend)
    transcriber = Transcriber(out, device="cpu")  # on the features a dataset holds: cut to the window
    said = [t.text for t in transcriber.decode([transcriber.features(c) for c in CLIPS],
                                               transcriber.translator.search_config())]
    audio = {f"clip{i}": load_audio(clip, frontend.sampling_rate) for i, clip in enumerate(CLIPS)}
    utterances = [speech_data.Utterance(f"clip{i}", target, "en-us", "m1", 175, 50)
                  for i, target in enumerate([*said[:2], "pas ça"])]
    monkeypatch.setattr(speech_data, "synthesise", lambda utterance, rate: audio[utterance.source])
    data = tmp_path / "data"
    data.mkdir()
    shard = speech_data.write_shard(data / "test-00000.npz", utterances, frontend)
    (data / "metadata.json").write_text(json.dumps({"task": "en-fr", "seed": 0, "frontend": frontend.to_json(),
                                                    "splits": {"test": {"count": 3, "shards": [shard]}}}))
    result = CliRunner().invoke(main, ["evaluate", str(out), "--task", f"speech:{data}", "--backends", "onnxruntime"])
    assert result.exit_code == 0, result.output
    assert "| test | onnxruntime | greedy |" in result.output and "| 66.7% |" in result.output, result.output
    result = CliRunner().invoke(main, ["quantize", str(out), "--int8", "--out", str(tmp_path / "int8"),
                                       "--task", f"speech:{data}"])
    assert result.exit_code == 0, result.output
    assert "| fp32 | greedy |" in result.output and "| int8 | beam4 |" in result.output, result.output
    result = CliRunner().invoke(main, ["quantize", str(out), "--int8", "--out", str(tmp_path / "int8"), "--force",
                                       "--task", "speech:elsewhere"])
    assert result.exit_code == 0 and "needs the speech dataset 'elsewhere' here" in result.output, result.output


def test_vocal_tract_warp_stretches_each_utterances_mel_axis_within_its_range() -> None:
    """A ramp over the mel bins comes back as the same ramp times one factor per row (clamped at the
    top bin), each factor inside ``[1 - warp, 1 + warp]``; an even spectrum is left as it is."""
    from s2s_deploy_plugins.models.speech import _warped

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    mels, warp = 80, 0.1
    ramp = torch.arange(mels, dtype=torch.float32)[None, :, None].expand(64, mels, 5)
    out = _warped(ramp, warp)
    factors = out[:, 1, 0]  # bin 1 reads position 1 × factor
    assert factors.min() >= 1 - warp and factors.max() <= 1 + warp and factors.std() > 0.02
    expected = (torch.arange(mels)[None, :] * factors[:, None]).clamp(max=mels - 1)
    torch.testing.assert_close(out[:, :, 3], expected, rtol=0, atol=1e-4)
    flat = torch.full((4, mels, 7), -0.5)
    torch.testing.assert_close(_warped(flat, warp), flat)
