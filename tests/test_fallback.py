"""The temperature fallback, no-speech skipping and carried earlier text (runtime/fallback.py) against
faster-whisper's and openai-whisper's own code.

The tiny timestamped Whisper of tests/test_hf_whisper_timestamps.py is exported once. faster-whisper's
own seek loop (``WhisperModel.generate_segments``, with its ``generate_with_fallback``, its prompt
building, no-speech skip and prompt reset) then transcribes the same clips with our decoder standing
in for CTranslate2: each ``generate`` call it makes decodes that one window, at the temperature and
with the prompt it asks for, through our engine (``Windows.attempt``). Its segments (times, text,
temperature, average log-prob, compression ratio, no-speech probability) must equal what our
``Transcriber`` returns on its own; so every decision (which temperature each window ends at, which
window is skipped, what earlier text each window is fed) is faster-whisper's. The thresholds are the
medians of what the model gives, so that windows both pass and fall back; the test asserts that
fallbacks, skips and prompt resets all occur.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from s2s_deploy.cli import main
from s2s_deploy.errors import S2SError
from s2s_deploy.runtime.decoding import DecodingError, SearchConfig

faster_whisper = pytest.importorskip("faster_whisper.transcribe")

SCHEDULE = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@pytest.mark.parametrize("text", ["", "a", "w5 w17 w5 w17 w5 w17 w5 w17 w5 w17", "ça va? 日本語のテキスト " * 7,
                                  "the quick brown fox jumps over the lazy dog"])
def test_compression_ratio_is_theirs(text: str) -> None:
    from s2s_deploy.runtime.fallback import compression_ratio

    openai_utils = pytest.importorskip("whisper.utils")

    if not text:  # zlib of nothing is 8 bytes: a ratio of 0, as theirs
        assert compression_ratio(text) == 0.0 == faster_whisper.get_compression_ratio(text)
        return
    assert compression_ratio(text) == faster_whisper.get_compression_ratio(text) == openai_utils.compression_ratio(text)
    assert compression_ratio(text) == len(text.encode()) / len(zlib.compress(text.encode()))


def test_a_no_speech_threshold_needs_the_export_s_token() -> None:
    with pytest.raises(DecodingError, match="names no no-speech token"):
        SearchConfig(no_speech_threshold=0.6)
    with pytest.raises(DecodingError, match="initial_prompt instead of prompt"):
        SearchConfig(condition_on_previous_text=True, prompt=(3,), prompt_start=7)
    assert SearchConfig(no_speech_threshold=0.6, no_speech_token=9).no_speech_threshold == 0.6


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory, hf_exports: Any) -> dict[str, Any]:
    pytest.importorskip("transformers")
    from test_hf_whisper import clips
    from test_hf_whisper_timestamps import save_timestamp_whisper

    from s2s_deploy.runtime.transcriber import Transcriber

    hf_dir = tmp_path_factory.mktemp("fallback") / "hf"
    save_timestamp_whisper(hf_dir, 0.55, keep=0.5)
    out = hf_exports.get(hf_dir)
    audio = [*clips(6, 1.2, 3.5, seed=1), np.random.default_rng(5).normal(0, 1e-3, 24000).astype(np.float32)]
    return {"hf_dir": hf_dir, "out": out, "transcriber": Transcriber(out, device="cpu"), "audio": audio}


class OurDecoder:
    """What faster-whisper's ``WhisperModel`` calls ``self.model``: each ``generate`` decodes the one
    window it is given through our engine, at the temperature and with the prompt it asks for, and
    answers as CTranslate2 does (tokens, the length-penalised score, the no-speech probability)."""

    device = "cpu"

    def __init__(self, transcriber: Any, config: SearchConfig, sot: int, prev: int) -> None:
        from s2s_deploy.runtime.fallback import Windows

        manifest = transcriber.manifest
        self.windows = Windows(transcriber.translator.engine.search, manifest.tgt_vocab,
                               manifest.max_target_length, config, 1)
        self.config, self.sot, self.prev = config, sot, prev
        self.calls: list[tuple[float, tuple[int, ...]]] = []

    def generate(self, features: np.ndarray, prompts: list[list[int]], **kwargs: Any) -> list[Any]:
        prompt = prompts[0]
        start = prompt.index(self.sot)
        previous = tuple(prompt[1:start]) if prompt[0] == self.prev else ()
        temperature = kwargs.get("sampling_temperature", 0.0)
        config = self.windows.window_config(replace(self.config, decoder_prompt=tuple(prompt[start + 1:])), previous)
        # what faster-whisper asks CTranslate2 for is what our config decodes with
        assert kwargs["beam_size"] == (config.beam_size if temperature == 0 else 1)
        assert kwargs.get("num_hypotheses", config.best_of) == config.best_of
        assert kwargs["max_initial_timestamp_index"] == config.max_initial_timestamp
        assert kwargs["length_penalty"] == config.alpha and kwargs["suppress_blank"] == config.suppress_blank
        assert kwargs["return_no_speech_prob"] and kwargs.get("sampling_topk", 0) == 0
        src = np.asarray(features, dtype=np.float32)[None]
        attempt = self.windows.attempt(src, np.array([src.shape[-1]]), config,
                                       self.config.temperature.index(temperature), temperature)[0]
        self.calls.append((temperature, previous))
        tokens = list(attempt.hypothesis.tokens)
        assert tokens, "CTranslate2's score cannot say an empty window's log-prob"
        score = sum(attempt.hypothesis.token_log_probs) / len(tokens) ** kwargs["length_penalty"]
        return [SimpleNamespace(sequences_ids=[tokens], scores=[score], no_speech_prob=attempt.no_speech_prob)]


def faster_whisper_run(whisper: dict[str, Any], config: SearchConfig, features: np.ndarray, decoder_type: Any,
                       **overrides: Any) -> tuple[list[Any], Any]:
    """faster-whisper's ``generate_segments`` over one clip's features, ``decoder_type(transcriber, config, sot,
    sot_prev)`` (``OurDecoder`` or one that wraps it) standing in for CTranslate2; ``overrides`` are
    ``TranscriptionOptions``' fields beyond those ``config`` sets."""
    import tokenizers
    from faster_whisper.feature_extractor import FeatureExtractor
    from faster_whisper.tokenizer import Tokenizer

    tokenizer = Tokenizer(tokenizers.Tokenizer.from_file(str(whisper["hf_dir"] / "tokenizer.json")), True,
                          "transcribe", "fr")
    model = object.__new__(faster_whisper.WhisperModel)
    decoder = decoder_type(whisper["transcriber"], config, tokenizer.sot, tokenizer.sot_prev)
    model.model, model.logger = decoder, logging.getLogger("faster_whisper")
    model.feature_extractor = FeatureExtractor(feature_size=80, sampling_rate=16000, hop_length=160, chunk_length=1,
                                               n_fft=400)
    window = model.feature_extractor.nb_max_frames  # its pad_or_trim pads to 30 s: the rest is zeros
    model.encode = lambda segment: segment[:, :window]  # the window's features: our decoder runs its own encoder
    model.input_stride, model.time_precision = config.timestamp_frames, config.time_precision
    model.frames_per_second, model.tokens_per_second = 100, 50
    model.max_length = whisper["transcriber"].manifest.max_target_length
    options = replace(faster_whisper.TranscriptionOptions(
        beam_size=config.beam_size, best_of=config.best_of, patience=1, length_penalty=config.alpha,
        repetition_penalty=1, no_repeat_ngram_size=0, log_prob_threshold=config.log_prob_threshold,
        no_speech_threshold=config.no_speech_threshold, compression_ratio_threshold=config.compression_ratio_threshold,
        condition_on_previous_text=config.condition_on_previous_text,
        prompt_reset_on_temperature=config.prompt_reset_on_temperature, temperatures=list(config.temperature),
        initial_prompt=None, prefix=None, suppress_blank=config.suppress_blank,
        suppress_tokens=list(config.suppress_tokens), without_timestamps=not config.timestamps,
        max_initial_timestamp=config.max_initial_timestamp * config.time_precision, word_timestamps=False,
        prepend_punctuations="", append_punctuations="", multilingual=False, max_new_tokens=None,
        clip_timestamps="0", hallucination_silence_threshold=None, hotwords=None), **overrides)
    # faster-whisper counts features.shape[-1] - 1 frames (its extractor makes one more than it reads)
    padded = np.concatenate([features, np.zeros_like(features[:, :1])], axis=1)
    return list(model.generate_segments(padded, tokenizer, options, False)), decoder


def faster_whisper_segments(whisper: dict[str, Any], config: SearchConfig, features: np.ndarray,
                            initial_prompt: str | None) -> tuple[list[Any], OurDecoder]:
    """faster-whisper's ``generate_segments`` over one clip's features, our decoder standing in for CTranslate2."""
    found, decoder = faster_whisper_run(whisper, config, features, OurDecoder, initial_prompt=initial_prompt)
    assert whisper["transcriber"].manifest.tgt_vocab.decoder_start_id == decoder.sot
    return found, decoder


def between(values: list[float]) -> float:
    """Halfway between the two middle distinct values: a threshold no window sits on (faster-whisper
    averages a window's log-probs in its own order, float32 rounding apart, which must not decide)."""
    distinct = sorted(set(values))
    middle = len(distinct) // 2
    return (distinct[middle - 1] + distinct[middle]) / 2


def window_facts(found: list[Any]) -> list[tuple[float, float, float | None]]:
    return [(s.avg_log_prob, s.compression_ratio, s.no_speech_prob) for t in found for s in t.segments]


@pytest.mark.slow
@pytest.mark.parametrize("beams", [1, 5])
def test_fallback_decisions_are_faster_whisper_s(whisper: dict[str, Any], beams: int,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    transcriber, audio = whisper["transcriber"], whisper["audio"]
    # ids 108..126 are words of the test vocabulary above <|endoftext|> (100); faster-whisper's decode drops
    # every id from <|endoftext|> on as special, as it is in a real Whisper vocabulary: never produced here
    suppressed = tuple(sorted({*transcriber.translator.search_config().suppress_tokens, *range(108, 127)}))
    base = {"beam": beams, "max_len": 20, "timestamps": True, "suppress_blank": True, "suppress_tokens": suppressed}
    # the model's own spread of per-window log-probs, compression ratios and no-speech probabilities
    first = window_facts(transcriber(audio, temperature=(0.0,), **base))
    avg, ratio, no_speech = (between([f[k] for f in first]) for k in range(3))
    options = {**base, "temperature": SCHEDULE, "best_of": 2, "log_prob_threshold": avg,
               "compression_ratio_threshold": ratio, "no_speech_threshold": no_speech,
               "condition_on_previous_text": True, "initial_prompt": "w3 w9 w12", "seed": 7}
    ours = transcriber(audio, **options)
    config = transcriber.translator.search_config(**options)
    assert config.initial_prompt == (3, 9, 12)
    calls, theirs_all = [], []
    with caplog.at_level(logging.DEBUG, logger="faster_whisper"):
        for clip, found in zip(audio, ours, strict=True):
            theirs, decoder = faster_whisper_segments(whisper, config, transcriber.features(clip, whole=True),
                                                      "w3 w9 w12")
            calls += decoder.calls
            theirs_all += theirs
            kept = [s for s in found.segments if s.start != s.end and s.text.strip()]  # the ones faster-whisper yields
            assert [s.text for s in kept] == [s.text for s in theirs]
            for mine, other in zip(kept, theirs, strict=True):
                assert mine.start == pytest.approx(other.start, abs=1e-9)
                # a window without a timestamp pair ends, as generate ends it, on the timestamp grid (0.02 s)
                # below its frame count, faster-whisper at the frame (0.01 s): docs/decoding.md
                assert mine.end == pytest.approx(other.end, abs=1e-9) or (
                    0 < other.end - mine.end < 0.01 + 1e-9 and round(other.end * 100) % 2 == 1)
                assert mine.temperature == other.temperature
                # faster-whisper's window ran alone, ours in a batch of every clip's, so the same bits
                # (docs/parity.md, "The batch"); its average is its own sum of them, float32 rounding apart
                assert mine.avg_log_prob == pytest.approx(other.avg_logprob, rel=1e-5)
                assert mine.compression_ratio == other.compression_ratio
                assert mine.no_speech_prob == other.no_speech_prob
    temperatures = [t for t, _ in calls]
    assert temperatures.count(0.0) < len(temperatures), "no window fell back"
    assert {s.temperature for s in theirs_all} & {0.0} and {s.temperature for s in theirs_all} - {0.0}
    assert "No speech threshold is met" in caplog.text, "no window was skipped as silence"
    assert "Reset prompt" in caplog.text, "no window reset the earlier text"
    assert any(previous and previous[:3] != (3, 9, 12) for _, previous in calls), "no text was carried"


@pytest.mark.slow
def test_without_the_new_options_nothing_changes(whisper: dict[str, Any]) -> None:
    """The defaults stay generate's: greedy and beam 5 give today's tokens; a schedule of 0 alone, with no
    threshold, decodes each window once, greedy tokens unchanged (beam search keeps generate's ranking too)."""
    transcriber, audio = whisper["transcriber"], whisper["audio"]
    for beams in (1, 5):
        plain = transcriber(audio, beam=beams, max_len=20, timestamps=True)
        once = transcriber(audio, beam=beams, max_len=20, timestamps=True, temperature=(0.0,))
        assert [t.text for t in once] == [t.text for t in plain]
        assert [[(s.start, s.end) for s in t.segments] for t in once] == [[(s.start, s.end) for s in t.segments]
                                                                          for t in plain]
        assert all(s.temperature is None for t in plain for s in t.segments)
        assert all(s.temperature == 0.0 for t in once for s in t.segments)


@pytest.mark.slow
def test_sampling_is_seeded_and_independent_of_batchmates(whisper: dict[str, Any]) -> None:
    transcriber, audio = whisper["transcriber"], whisper["audio"]
    options = {"max_len": 20, "timestamps": True, "temperature": (0.6, 1.0), "best_of": 2,
               "log_prob_threshold": 0.0}  # every window falls back: every answer is sampled
    together = transcriber(audio, **options, seed=3)
    alone = [transcriber(clip, **options, seed=3)[0] for clip in audio[:3]]
    assert [t.text for t in together[:3]] == [t.text for t in alone]
    assert [t.text for t in transcriber(audio, **options, seed=3)] == [t.text for t in together]
    assert [t.text for t in transcriber(audio, **options, seed=4)] != [t.text for t in together]
    assert all(s.temperature == 1.0 for t in together for s in t.segments)


@pytest.mark.slow
def test_preset_turns_on_faster_whisper_s_defaults(whisper: dict[str, Any], tmp_path: Path) -> None:
    transcriber = whisper["transcriber"]
    manifest = transcriber.manifest
    config = transcriber.translator.search_config(preset="faster-whisper")
    assert (config.beam_size, config.best_of, config.alpha, config.temperature) == (5, 5, 1.0, SCHEDULE)
    assert (config.compression_ratio_threshold, config.log_prob_threshold, config.no_speech_threshold) == (2.4, -1.0,
                                                                                                          0.6)
    assert config.condition_on_previous_text and config.suppress_blank and config.timestamps
    from test_hf_whisper import NO_SPEECH

    assert manifest.search["no_speech_token"] == NO_SPEECH  # <|nospeech|>, found by the plugin's hf_no_speech_token
    assert config.max_initial_timestamp == 50 and config.no_speech_token == NO_SPEECH
    vocab = manifest.tgt_vocab
    assert {*vocab.tasks, vocab.decoder_start_id, config.prompt_start, config.no_speech_token} <= set(
        config.suppress_tokens)
    assert {vocab.eos_id} <= set(config.begin_suppress_tokens)
    overridden = transcriber.translator.search_config(preset="faster-whisper", beam=2, temperature="0,0.5")
    assert (overridden.beam_size, overridden.temperature) == (2, (0.0, 0.5))
    out = tmp_path / "x.json"
    clip = tmp_path / "clip.wav"
    import soundfile

    soundfile.write(clip, whisper["audio"][0], 16000)
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(clip), "--preset", "faster-whisper",
                                       "--best-of", "1", "--max-len", "20", "--output", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    import json

    rows = json.loads(out.read_text())
    assert rows[0]["segments"] and all("temperature" in s for s in rows[0]["segments"])


def test_text_exports_refuse_the_window_options(exports: Any) -> None:
    from s2s_deploy.runtime.translator import Translator

    translator = Translator(exports.get("gru")[1].directory, device="cpu")
    for options in ({"temperature": (0.0, 0.2)}, {"log_prob_threshold": -1.0}):
        with pytest.raises(S2SError, match="read audio window by window"):
            translator.search_config(**options)


@pytest.mark.slow
@pytest.mark.parametrize("context", [(), (3, 9, 12)])
def test_no_speech_probability_is_read_after_the_start_token(whisper: dict[str, Any], context: tuple[int, ...]) -> None:
    """openai-whisper's ``no_speech_prob`` is the softmax at ``<|startoftranscript|>``'s position, after any
    earlier text: transformers' model on the same features and tokens gives ours."""
    import torch
    import transformers
    from test_hf_whisper import NO_SPEECH, PREV, SOT

    from s2s_deploy.runtime.fallback import Windows

    transcriber = whisper["transcriber"]
    manifest = transcriber.manifest
    features = np.stack([transcriber.features(clip) for clip in whisper["audio"]])
    config = transcriber.translator.search_config(max_len=5, temperature=(0.0,), timestamps=True)
    windows = Windows(transcriber.translator.engine.search, manifest.tgt_vocab, manifest.max_target_length, config,
                      len(features))
    outcomes = windows.decode(features, np.full(len(features), features.shape[-1]), config, context)
    ours = np.array([outcome.kept.no_speech_prob for outcome in outcomes])
    model = transformers.WhisperForConditionalGeneration.from_pretrained(whisper["hf_dir"], local_files_only=True)
    tokens = torch.tensor([[PREV, *context, SOT] if context else [SOT]] * len(features))
    with torch.no_grad():
        logits = model.eval()(input_features=torch.from_numpy(features), decoder_input_ids=tokens).logits
    theirs = logits[:, -1].float().softmax(-1)[:, NO_SPEECH].numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    assert len(set(np.round(ours, 8))) > 1  # it depends on the audio


def test_an_export_without_whisper_s_tokens_takes_what_applies(exports: Any) -> None:
    """The bundled speech demo names no no-speech token, no prompt start and no timestamps: the preset
    leaves those parts off (and says nothing), asking for them is one line, and the fallback runs on
    what remains; sampling from its features is seeded whatever the batch."""
    from s2s_deploy.runtime.transcriber import Transcriber

    transcriber = Transcriber(exports.get("speech")[1].directory, device="cpu")
    config = transcriber.translator.search_config(preset="faster-whisper")
    assert config.temperature == SCHEDULE and config.beam_size == 5
    assert config.no_speech_threshold is None and not config.condition_on_previous_text and not config.timestamps
    with pytest.raises(S2SError, match="names no no-speech token"):
        transcriber.translator.search_config(no_speech_threshold=0.6)
    with pytest.raises(S2SError, match="takes no prompt"):
        transcriber.translator.search_config(condition_on_previous_text=True)
    clips = sorted((Path(__file__).parent / "data").glob("speech_*hz.flac"))
    plain = transcriber(clips, beam=4)
    once = transcriber(clips, beam=4, temperature=(0.0,))
    assert [t.text for t in once] == [t.text for t in plain]
    sampled = {"temperature": (1.0,), "best_of": 2, "seed": 11}
    together = transcriber(clips, **sampled)
    assert [transcriber(clip, **sampled)[0].text for clip in clips] == [t.text for t in together]
