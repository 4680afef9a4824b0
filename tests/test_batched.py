"""Batched long-form (the ``batched`` option, runtime/batched.py) against faster-whisper's
``BatchedInferencePipeline``, and under batching.

Fast: a window's segments equal faster-whisper's ``_split_segments_by_timestamps`` (which the batched
pipeline calls on each window with ``seek=0``) on 2,000 seeded token streams of every shape (pairs, a
lone timestamp at the end, none, an unfinished last segment); the fixed cuts; the options it refuses.

Slow (the tiny timestamped Whisper of tests/test_hf_whisper_timestamps.py, one-second window, exported
once; clips of 1.2-3.5 s, so two to four windows each): every window decoded alone has the tokens and the
scores, bit for bit, it has in a batch with other files' windows, in batches of 1, 2, 3, 8 and all 19, at
1 and 2 threads, greedy and beam 4; faster-whisper's own ``BatchedInferencePipeline.transcribe``, given our
windows as its ``clip_timestamps`` and our tokens for each window, yields our segments (times to its 1 ms
rounding, tokens); the CLI, serve and the preset.
"""

from __future__ import annotations

import json
from itertools import pairwise
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from s2s_deploy.cli import main
from s2s_deploy.runtime.batched import fixed_windows, window_segments
from s2s_deploy.runtime.decoding import DecodingError, SearchConfig

BEGIN = 50364  # Whisper's <|0.00|>
PRECISION, STRIDE = 0.02, 2


def faster_whisper_split(tokens: list[int], offset: float, duration: float) -> list[dict[str, Any]]:
    """faster-whisper's own ``_split_segments_by_timestamps``, called as ``BatchedInferencePipeline.forward``
    calls it (``seek=0``, ``segment_size = ceil(duration) * frames_per_second``)."""
    transcribe = pytest.importorskip("faster_whisper.transcribe")
    model = SimpleNamespace(time_precision=PRECISION, input_stride=STRIDE)
    segments, _seek, _single = transcribe.WhisperModel._split_segments_by_timestamps(
        model, SimpleNamespace(timestamp_begin=BEGIN), tokens, offset, int(np.ceil(duration) * 100), duration, 0)
    return segments


def stream(rng: np.random.Generator) -> list[int]:
    """A window's output as a timestamped model writes it: segments of text between timestamps, some
    adjacent pairs, maybe a lone timestamp or an unfinished segment at the end, maybe no timestamps."""
    tokens: list[int] = []
    at = int(rng.integers(0, 20))
    for _ in range(int(rng.integers(0, 5))):
        if rng.random() < 0.9:
            tokens.append(BEGIN + at)
        tokens += [int(t) for t in rng.integers(0, 50000, int(rng.integers(0, 6)))]
        at += int(rng.integers(0, 400))
        if rng.random() < 0.85:
            tokens.append(BEGIN + min(at, 1500))
    if rng.random() < 0.3:
        tokens += [int(t) for t in rng.integers(0, 50000, int(rng.integers(1, 4)))]
    return tokens


def test_segments_are_the_batched_pipeline_s() -> None:
    rng = np.random.default_rng(46)
    config = SearchConfig(timestamps=True, timestamp_begin=BEGIN)
    shapes = set()
    for _ in range(2000):
        tokens = stream(rng)
        start = int(rng.integers(0, 20)) * 3000
        frames = int(rng.choice([3000, int(rng.integers(1, 3000))]))
        ours = window_segments(tokens, start, frames, config)
        theirs = faster_whisper_split(tokens, start * PRECISION / STRIDE, frames * PRECISION / STRIDE)
        assert [(p.start, p.end, list(p.tokens)) for p in ours] == [(s["start"], s["end"], s["tokens"])
                                                                     for s in theirs], tokens
        pairs = sum(a >= BEGIN and b >= BEGIN for a, b in pairwise(tokens))
        shapes.add((min(pairs, 2), bool(tokens) and tokens[-1] >= BEGIN, len(ours)))
    assert len(shapes) >= 8  # pairs or none, timestamp endings or text endings, one or many segments


def test_fixed_windows() -> None:
    """A window of ``window`` frames from frame 0, the last what is left: 65.3 s at 100 frames/s is
    30 + 30 + 5.3 s, as ``clip_timestamps`` [0-30, 30-60, 60-65.3] cut it for the batched pipeline."""
    cuts = fixed_windows([6530, 3000, 120, 6000], 3000)
    assert [(c.item, c.start, c.frames) for c in cuts] == [
        (0, 0, 3000), (0, 3000, 3000), (0, 6000, 530), (1, 0, 3000), (2, 0, 120), (3, 0, 3000), (3, 3000, 3000)]
    assert fixed_windows([0], 3000) == []


def test_batched_refuses_carried_text() -> None:
    with pytest.raises(DecodingError, match="batched windows are decoded independently"):
        SearchConfig(batched=True, condition_on_previous_text=True, prompt_start=7)
    with pytest.raises(DecodingError, match="batched windows are decoded independently"):
        SearchConfig(batched=True, initial_prompt=(3, 4), prompt_start=7)
    assert SearchConfig(batched=True, prompt=(3, 4), prompt_start=7).prompt == (3, 4)


def test_a_whole_window_without_timestamp_tokens() -> None:
    """An export without timestamp tokens: each window is one segment over its frames."""
    [piece] = window_segments((5, 6, 7), 6000, 530, SearchConfig())
    assert (piece.start, piece.end, piece.tokens) == (60.0, 60.0 + 5.3, (5, 6, 7))


def test_an_encoder_batch_one_row_at_a_time_is_each_row_alone() -> None:
    """``encode_rows`` (runtime/ort/backend.py): every output of a batch is its row's output alone, joined
    along each output's own batch axis (0, and 1 for a transposed one). And why it exists: ONNX Runtime's
    ``Conv`` over the tiny test Whisper's stem (80 -> 64 channels, 100 frames, 2 threads) sums a row alone
    otherwise than the same row among others, which it cuts across its threads by output positions."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from s2s_deploy.runtime.ort.backend import encode_rows

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(0, 0.1, (64, 80, 3)).astype(np.float32), "weight")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["src", "weight"], ["conv"], kernel_shape=[3], pads=[1, 1]),
         helper.make_node("Transpose", ["conv"], ["across"], perm=[1, 0, 2])], "stem",
        [helper.make_tensor_value_info("src", TensorProto.FLOAT, ["batch", 80, 100]),
         helper.make_tensor_value_info("src_len", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("conv", TensorProto.FLOAT, ["batch", 64, 100]),
         helper.make_tensor_value_info("across", TensorProto.FLOAT, [64, "batch", 100])], [weight])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                   .SerializeToString(), options, providers=["CPUExecutionProvider"])
    src = rng.normal(-0.2, 0.5, (8, 80, 100)).astype(np.float32)
    src_len = np.full(8, 100, dtype=np.int64)
    rows = encode_rows(session, ["conv", "across"], src, src_len, {"conv": 0, "across": 1})
    alone = [session.run(None, {"src": src[i: i + 1], "src_len": src_len[i: i + 1]}) for i in range(8)]
    assert np.array_equal(rows["conv"], np.concatenate([a[0] for a in alone]))
    assert np.array_equal(rows["across"], np.concatenate([a[1] for a in alone], axis=1))
    whole = session.run(None, {"src": src, "src_len": src_len})[0]
    assert not np.array_equal(whole[:1], alone[0][0]), (
        "ONNX Runtime's one-row Conv now sums as a row among others: a features encoder could batch again "
        "(docs/parity.md, 'The batch')")


# ----------------------------------------------------------------------------- the tiny Whisper
@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("transformers")
    import transformers
    from test_hf_whisper import clips
    from test_hf_whisper_timestamps import save_timestamp_whisper

    from s2s_deploy.runtime.transcriber import Transcriber

    root = tmp_path_factory.mktemp("batched")
    save_timestamp_whisper(root / "hf", 0.55, keep=0.5)
    result = CliRunner().invoke(main, ["export", "--hf", str(root / "hf"), "--out", str(root / "out")])
    assert result.exit_code == 0, result.output
    transcriber = Transcriber(root / "out", device="cpu")
    audio = clips(6, 1.2, 3.5, seed=1)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(root / "hf", local_files_only=True).eval()
    return {"root": root, "out": root / "out", "transcriber": transcriber, "audio": audio, "model": model,
            "features": [transcriber.features(a, whole=True) for a in audio]}


def windows_of(whisper: dict[str, Any], config: SearchConfig) -> list[Any]:
    """Every clip's batched windows (runtime/features.py's ``batched``), all clips in one call."""
    return whisper["transcriber"].batched(whisper["features"], config)


@pytest.mark.slow
def test_a_window_alone_equals_it_among_other_files(whisper: dict[str, Any]) -> None:
    """A window's tokens and scores, to the bit, do not depend on its batchmates: alone, among its
    file's windows and the other files', in batches of 8 and of all 19 (docs/decoding.md)."""
    transcriber = whisper["transcriber"]
    for beams in (1, 4):
        config = transcriber.translator.search_config(beams, 1, 20, batched=True, timestamps=True)
        together = windows_of(whisper, config)
        window = transcriber.window(whisper["features"])
        assert [len(s.windows) for s in together] == [-(-f.shape[-1] // window) for f in whisper["features"]]
        assert min(len(s.windows) for s in together) >= 2
        assert any(len(p.tokens) > 2 for s in together for p in s.pieces)
        for features, found in zip(whisper["features"], together, strict=True):
            for w in found.windows:
                [alone] = transcriber.batched([features[:, w.seek: w.seek + w.frames]], config)
                [single] = alone.windows
                assert single.best == w.best
        eights = transcriber.batched(whisper["features"], config, batch_size=8)  # other batchmates, bit for bit
        assert [[w.best for w in s.windows] for s in eights] == [[w.best for w in s.windows] for s in together]


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_a_window_s_answer_does_not_depend_on_the_batch_s_size(whisper: dict[str, Any], threads: int) -> None:
    """Every window of the six clips as an input of its own, decoded in batches of 1, 2, 3, 8 and all
    19 (so each window is alone, or has one, two, seven or eighteen batchmates, at every position), on
    1 and 2 intra-op threads, greedy and beam 4: the same hypothesis, tokens and score, to the bit.
    Before the encoder ran a features batch one row at a time, ONNX Runtime's one-row convolution (its
    threads split the output positions) moved a window's scores alone at 2 threads: greedy 19 of 19
    windows, by up to 3.3e-6; beam 4 18 of 19, by up to 6.9e-7 (docs/parity.md, "The batch")."""
    from s2s_deploy.runtime.transcriber import Transcriber

    transcriber = Transcriber(whisper["out"], device="cpu", threads=threads)
    features = whisper["features"]
    cuts = fixed_windows([f.shape[-1] for f in features], transcriber.window(features))
    windows = [features[c.item][:, c.start: c.start + c.frames] for c in cuts]
    assert len(windows) == 19 and len({w.shape[-1] for w in windows}) > 1  # whole windows and shorter last ones
    for beams in (1, 4):
        config = transcriber.translator.search_config(beams, 1, 20, batched=True, timestamps=True)
        found = {size: [s.windows[0].best for s in transcriber.batched(windows, config, batch_size=size)]
                 for size in (1, 2, 3, 8, len(windows))}
        assert sum(len(h.tokens) for h in found[1]) > 2 * len(windows)  # windows say something
        for size in (1, 2, 3, 8):
            assert found[size] == found[len(windows)], (beams, size)


@pytest.mark.slow
@pytest.mark.parametrize("timestamps", [False, True])
def test_faster_whisper_s_pipeline_makes_our_segments(whisper: dict[str, Any], timestamps: bool) -> None:
    """faster-whisper's ``BatchedInferencePipeline.transcribe`` over each clip, no VAD, our windows as its
    ``clip_timestamps``; where it would call CTranslate2 it is handed our tokens for that window. Its
    segments (offsets, durations, cuts, tokens, times rounded to 1 ms) must be ours."""
    import tokenizers
    from faster_whisper import BatchedInferencePipeline
    from faster_whisper.feature_extractor import FeatureExtractor
    from faster_whisper.transcribe import WhisperModel
    from test_hf_whisper_timestamps import RATE

    transcriber = whisper["transcriber"]
    config = transcriber.translator.search_config(1, 1, 20, batched=True, timestamps=timestamps)
    found = transcriber(whisper["audio"], config=config)
    sought = windows_of(whisper, config)
    vocab = transcriber.manifest.tgt_vocab  # the texts: faster-whisper's decode drops ids above EOS, which this
    # test vocabulary (EOS 100) gives to words 108-126, so its segments' tokens are read with ours
    hf_tokenizer = tokenizers.Tokenizer.from_file(str(whisper["root"] / "hf" / "tokenizer.json"))
    for audio, result, mine in zip(whisper["audio"], found, sought, strict=True):
        model = SimpleNamespace(feature_extractor=FeatureExtractor(feature_size=80, chunk_length=1),
                                frames_per_second=100, time_precision=PRECISION, input_stride=STRIDE,
                                hf_tokenizer=hf_tokenizer, model=SimpleNamespace(is_multilingual=True),
                                logger=SimpleNamespace(info=lambda *a: None, warning=lambda *a: None))
        model._split_segments_by_timestamps = WhisperModel._split_segments_by_timestamps.__get__(model)
        pipeline = BatchedInferencePipeline(model)
        given = iter(mine.windows)

        def ours(features: np.ndarray, tokenizer: Any, options: Any, given: Any = given) -> tuple[None, list]:
            assert options.without_timestamps is not timestamps and not options.condition_on_previous_text
            return None, [{"tokens": list(next(given).best.tokens), "avg_logprob": 0.0, "no_speech_prob": 0.0}
                          for _ in range(len(features))]

        pipeline.generate_segment_batched = ours
        clip_timestamps = [{"start": w.seek / 100, "end": (w.seek + w.frames) / 100} for w in mine.windows]
        segments, _info = pipeline.transcribe(audio, language="fr", clip_timestamps=clip_timestamps, batch_size=3,
                                              vad_filter=False, without_timestamps=not timestamps, suppress_tokens=[])
        segments = list(segments)
        assert next(given, None) is None  # every window decoded once
        assert transcriber.sampling_rate == RATE
        if timestamps:
            assert [(s.start, s.end) for s in segments] == [(round(p.start, 3), round(p.end, 3)) for p in mine.pieces]
            assert [s.tokens for s in segments] == [list(p.tokens) for p in mine.pieces]
            assert [vocab.decode(s.tokens) for s in segments] == [p.text for p in result.segments]
            assert [(p.start, p.end) for p in mine.pieces] == [(p.start, p.end) for p in result.segments]
        else:  # without timestamps asked for, a window's end comes from the clip's samples (theirs) or frames (ours)
            assert [t for s in segments for t in (s.start, s.end)] == pytest.approx(
                [t for p in mine.pieces for t in (p.start, p.end)], abs=1e-3)
            assert [s.tokens for s in segments] == [list(p.tokens) for p in mine.pieces]
            assert " ".join(t for s in segments if (t := vocab.decode(s.tokens).strip())) == result.text
            assert not result.segments


@pytest.mark.slow
def test_transcribe_batched(whisper: dict[str, Any], tmp_path: Any) -> None:
    """``transcribe --batched`` writes what ``Transcriber(..., batched=True)`` returns, the files' windows
    sharing batches of ``--batch-size``; carried text is refused in one line."""
    soundfile = pytest.importorskip("soundfile")
    from test_hf_whisper_timestamps import RATE

    paths = []
    for i, audio in enumerate(whisper["audio"]):
        paths.append(tmp_path / f"clip{i}.wav")
        soundfile.write(paths[-1], audio, RATE, subtype="FLOAT")
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), *map(str, paths), "--batched",
                                       "--timestamps", "--batch-size", "5", "--max-len", "20", "--output", str(out),
                                       "--quiet"])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    found = whisper["transcriber"]([str(p) for p in paths], batched=True, timestamps=True, max_len=20)
    assert [r["text"] for r in rows] == [t.text for t in found]
    assert [[(s["start"], s["end"], s["text"]) for s in r["segments"]] for r in rows] == [
        [(s.start, s.end, s.text) for s in t.segments] for t in found]
    assert max(s.end for t in found for s in t.segments) > 1.0  # segments past the first window
    refused = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(paths[0]), "--batched",
                                        "--condition-on-previous-text", "--quiet"])
    assert refused.exit_code != 0 and "batched windows are decoded independently" in refused.output
    assert "Traceback" not in refused.output and len(refused.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_preset_with_batched_is_the_batched_pipeline_s(whisper: dict[str, Any]) -> None:
    """``--preset faster-whisper --batched``: ``BatchedInferencePipeline.transcribe``'s defaults, not
    ``WhisperModel.transcribe``'s (which carry text, fall back and time segments)."""
    translator = whisper["transcriber"].translator
    sequential = translator.search_config(preset="faster-whisper")
    batched = translator.search_config(preset="faster-whisper", batched=True)
    assert sequential.condition_on_previous_text and sequential.temperature and sequential.timestamps
    assert (batched.beam_size, batched.alpha, batched.suppress_blank) == (5, 1.0, True)
    assert batched.suppress_tokens == sequential.suppress_tokens
    assert not (batched.condition_on_previous_text or batched.temperature or batched.timestamps)
    assert batched.compression_ratio_threshold is None and batched.no_speech_threshold is None


@pytest.mark.slow
def test_serve_transcribes_batched(whisper: dict[str, Any], tmp_path: Any) -> None:
    """``/transcribe?batched=true`` answers as ``Transcriber(..., batched=True)``; carried text is refused."""
    soundfile = pytest.importorskip("soundfile")
    from starlette.testclient import TestClient
    from test_hf_whisper_timestamps import RATE

    from s2s_deploy.serve.app import BatchLimits, ServeConfig, create_app

    path = tmp_path / "clip.wav"
    soundfile.write(path, whisper["audio"][4], RATE)
    [want] = whisper["transcriber"]([str(path)], batched=True, timestamps=True)
    assert want.segments
    app = create_app(ServeConfig(str(whisper["out"]), BatchLimits(window_ms=1), threads=1))
    with TestClient(app) as http:
        response = http.post("/transcribe", params={"batched": "true", "timestamps": "true"},
                             content=path.read_bytes())
        assert response.status_code == 200, response.text
        [got] = response.json()["transcriptions"]
        assert got["text"] == want.text
        assert got["segments"] == [{"start": s.start, "end": s.end, "text": s.text} for s in want.segments]
        refused = http.post("/transcribe", params={"batched": "true", "condition_on_previous_text": "true"},
                            content=path.read_bytes())
        assert refused.status_code == 400 and "decoded independently" in refused.text
