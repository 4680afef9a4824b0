"""faster-whisper's word timing and ``hallucination_silence_threshold`` against their own code.

The tiny timestamped Whisper of tests/test_hf_whisper_timestamps.py, with alignment heads, is exported
once with ``--word-timestamps``. ``align`` (runtime/align.py, CTranslate2's ``Whisper.align`` on our
engine) must give, on the same window and text tokens, the token times and probabilities of openai-whisper's
own ``timing.find_alignment``, which CTranslate2 reimplements, run on the same weights loaded into
openai-whisper's ``Whisper`` model.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai_whisper = pytest.importorskip("whisper")

HEADS = [[1, 0], [1, 2], [0, 3]]


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory, hf_exports: Any) -> dict[str, Any]:
    from test_hf_whisper_timestamps import save_timestamp_whisper

    from s2s_deploy.runtime.transcriber import Transcriber

    hf_dir = tmp_path_factory.mktemp("hallucination") / "hf"
    save_timestamp_whisper(hf_dir, 0.55, keep=0.5)
    raw = json.loads((hf_dir / "generation_config.json").read_text())
    (hf_dir / "generation_config.json").write_text(json.dumps({**raw, "alignment_heads": HEADS}))
    out = hf_exports.get(hf_dir, "--word-timestamps")
    return {"hf_dir": hf_dir, "out": out, "transcriber": Transcriber(out, device="cpu")}


def openai_model(hf_dir: Any) -> Any:
    """The folder's weights in openai-whisper's ``Whisper`` (the names transformers' converter maps),
    its alignment heads set to the folder's."""
    import whisper.model as wm

    hf = transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir, local_files_only=True).eval()
    c = hf.config
    assert torch.equal(hf.proj_out.weight, hf.model.decoder.embed_tokens.weight)  # openai-whisper's logits are tied
    dims = wm.ModelDimensions(c.num_mel_bins, c.max_source_positions, c.d_model, c.encoder_attention_heads,
                              c.encoder_layers, c.vocab_size, c.max_target_positions, c.d_model,
                              c.decoder_attention_heads, c.decoder_layers)
    model = wm.Whisper(dims)
    for block, ffn in [*((b, c.encoder_ffn_dim) for b in model.encoder.blocks),
                       *((b, c.decoder_ffn_dim) for b in model.decoder.blocks)]:  # openai-whisper's is 4 d_model
        linear = torch.nn.Linear
        block.mlp = torch.nn.Sequential(linear(c.d_model, ffn), torch.nn.GELU(), linear(ffn, c.d_model))
    renames = [(".layers.", ".blocks."), ("encoder.embed_positions.weight", "encoder.positional_embedding"),
               ("decoder.embed_positions.weight", "decoder.positional_embedding"),
               ("decoder.embed_tokens", "decoder.token_embedding"), ("encoder.layer_norm", "encoder.ln_post"),
               ("decoder.layer_norm", "decoder.ln"), (".self_attn.q_proj.", ".attn.query."),
               (".self_attn.k_proj.", ".attn.key."), (".self_attn.v_proj.", ".attn.value."),
               (".self_attn.out_proj.", ".attn.out."), (".self_attn_layer_norm.", ".attn_ln."),
               (".encoder_attn.q_proj.", ".cross_attn.query."), (".encoder_attn.k_proj.", ".cross_attn.key."),
               (".encoder_attn.v_proj.", ".cross_attn.value."), (".encoder_attn.out_proj.", ".cross_attn.out."),
               (".encoder_attn_layer_norm.", ".cross_attn_ln."), (".fc1.", ".mlp.0."), (".fc2.", ".mlp.2."),
               (".final_layer_norm.", ".mlp_ln.")]
    state = {}
    for key, value in hf.model.state_dict().items():
        for theirs, ours in renames:
            key = key.replace(theirs, ours)
        state[key] = value
    model.load_state_dict(state, strict=True)
    heads = torch.zeros(dims.n_text_layer, dims.n_text_head, dtype=torch.bool)
    for layer, head in HEADS:
        heads[layer, head] = True
    model.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)
    return model.eval()


def per_token(eot: int, sot_sequence: list[int], no_timestamps: int) -> Any:
    """A tokenizer for ``find_alignment`` whose every token is a word: its word times are then the token
    times (``jump_times``), its word probabilities the token probabilities."""
    return SimpleNamespace(sot_sequence=sot_sequence, no_timestamps=no_timestamps, eot=eot,
                           split_to_word_tokens=lambda tokens: ([str(t) for t in tokens], [[t] for t in tokens]))


def jump_times(alignments: tuple[tuple[int, int], ...]) -> np.ndarray:
    """faster-whisper's ``find_alignment`` reading of CTranslate2's pairs: each text index's first time."""
    text = np.array([pair[0] for pair in alignments])
    time = np.array([pair[1] for pair in alignments])
    jumps = np.pad(np.diff(text), (1, 0), constant_values=1).astype(bool)
    return time[jumps] / 50


def test_align_is_openai_whispers_find_alignment(whisper: dict[str, Any]) -> None:
    from test_hf_whisper import EOS, FR, NO_TIMESTAMPS, SOT, TRANSCRIBE, clips
    from test_hf_whisper_timestamps import BEGIN

    from s2s_deploy.runtime.align import align

    transcriber = whisper["transcriber"]
    model = openai_model(whisper["hf_dir"])
    sot_sequence = [SOT, FR, TRANSCRIBE]
    tokenizer = per_token(EOS, sot_sequence, NO_TIMESTAMPS)
    rng = np.random.default_rng(3)
    audio = clips(8, 0.3, 1.0, seed=4)
    features_all = np.stack([transcriber.features(clip) for clip in audio])
    config = transcriber.translator.search_config(max_len=20)
    found = transcriber.translator.engine.search(features_all, np.full(len(audio), features_all.shape[-1]), config)
    compared = 0
    for clip, features, hyps in zip(audio, features_all, found, strict=True):
        num_frames = min(features.shape[-1], round(len(clip) / 160))
        generated = [t for t in hyps[0].tokens if t < EOS]
        for text in (generated, rng.integers(3, 100, int(rng.integers(1, 12))).tolist()):
            if not text:
                continue
            ours = align(transcriber.translator.backend, features[None], sot_sequence, [text], num_frames,
                         NO_TIMESTAMPS)[0]
            with torch.no_grad():
                theirs = openai_whisper.timing.find_alignment(model, tokenizer, text, torch.from_numpy(features),
                                                              num_frames)
            times = jump_times(ours.alignments)
            assert len(times) == len(text) + 1 and len(ours.text_token_probs) == len(text)
            np.testing.assert_array_equal(times[:-1], [w.start for w in theirs])
            np.testing.assert_array_equal(times[1:], [w.end for w in theirs])
            np.testing.assert_allclose(ours.text_token_probs, [w.probability for w in theirs], rtol=1e-4, atol=1e-6)
            compared += 1
    assert compared >= 12
    assert BEGIN > EOS  # timestamps are not text: align is never fed them


class AligningDecoder:
    """tests/test_fallback.py's stand-in for CTranslate2 (``generate`` through our engine), with ``align``
    through runtime/align.py: faster-whisper's word timing then reads our alignment."""

    def __init__(self, transcriber: Any, config: Any, sot: int, prev: int) -> None:
        from test_fallback import OurDecoder

        self.decoder = OurDecoder(transcriber, config, sot, prev)
        self.backend, self.config = transcriber.translator.backend, config
        self.device = "cpu"
        self.aligned = 0

    def generate(self, features: np.ndarray, prompts: list[list[int]], **kwargs: Any) -> list[Any]:
        return self.decoder.generate(features, prompts, **kwargs)

    def align(self, features: np.ndarray, start_sequence: list[int], text_tokens: list[list[int]], num_frames: int,
              median_filter_width: int) -> list[Any]:
        from s2s_deploy.runtime.align import align

        src = np.repeat(np.asarray(features, dtype=np.float32)[None], len(text_tokens), axis=0)
        self.aligned += 1
        return align(self.backend, src, start_sequence, text_tokens, num_frames, self.config.timestamp_begin - 1,
                     median_filter_width)


def faster_whisper_words(whisper: dict[str, Any], config: Any, features: np.ndarray,
                         threshold: float | None) -> list[Any]:
    """faster-whisper's ``generate_segments`` with ``word_timestamps=True`` and ``threshold`` over one clip's
    features, our engine standing in for CTranslate2's ``generate`` and ``align``."""
    from test_fallback import faster_whisper_run

    found, decoder = faster_whisper_run(
        whisper, config, features, AligningDecoder, without_timestamps=False, word_timestamps=True,
        prepend_punctuations="\"'“¿([{-", append_punctuations="\"'.。,，!！?？:：”)]}、",
        hallucination_silence_threshold=threshold)
    assert decoder.aligned, "faster-whisper never aligned a window"
    return found


def silent_clips() -> list[np.ndarray]:
    """Speech-like bursts of tests/test_hf_whisper.py's clips between silences of 0.3 to 2 s."""
    from test_hf_whisper import clips

    rng = np.random.default_rng(11)
    bursts = clips(12, 0.3, 0.9, seed=12)
    found = []
    for k in range(6):
        parts = []
        for burst in bursts[2 * k: 2 * k + 2]:
            parts += [np.zeros(int(rng.uniform(0.3, 2.0) * 16000), np.float32), burst]
        parts.append(np.zeros(int(rng.uniform(0.3, 2.0) * 16000), np.float32))
        found.append(np.concatenate(parts))
    return found


FALLBACK = {"beam": 5, "temperature": (0.0, 0.2, 0.4, 0.6, 0.8, 1.0), "best_of": 2, "seed": 7,
            "log_prob_threshold": -1.0, "compression_ratio_threshold": 2.4, "no_speech_threshold": 0.6,
            "condition_on_previous_text": True}
"""faster-whisper's transcription (its preset's thresholds, beam 5, earlier text carried), best of 2."""


@pytest.mark.parametrize(("threshold", "search"), [(0.1, {}), (0.5, {}), (1.0, {}), (0.5, FALLBACK)])
def test_the_silence_skip_is_faster_whisper_s(whisper: dict[str, Any], threshold: float,
                                              search: dict[str, Any]) -> None:
    transcriber = whisper["transcriber"]
    suppressed = tuple(sorted({*transcriber.translator.search_config().suppress_tokens, *range(108, 127)}))
    options = {"beam": 1, "max_len": 20, "timestamps": True, "suppress_blank": True, "suppress_tokens": suppressed,
               "temperature": (0.0,), "hallucination_silence_threshold": threshold, **search}
    audio = silent_clips()
    ours = transcriber(audio, **options)
    config = transcriber.translator.search_config(**options)
    fired = 0
    for clip, found in zip(audio, ours, strict=True):
        features = transcriber.features(clip, whole=True)
        theirs = faster_whisper_words(whisper, config, features, threshold)
        plain = faster_whisper_words(whisper, config, features, None)
        fired += [(s.start, s.end) for s in theirs] != [(s.start, s.end) for s in plain]
        kept = [s for s in found.segments if s.start != s.end and s.text.strip()]
        assert [s.text for s in kept] == [s.text for s in theirs]
        np.testing.assert_allclose([(s.start, s.end) for s in kept], [(s.start, s.end) for s in theirs], atol=1e-9)
        words = [w for s in theirs for w in s.words]
        assert [w.text for w in found.words] == [w.word.strip() for w in words]
        np.testing.assert_allclose([(w.start, w.end) for w in found.words], [(w.start, w.end) for w in words],
                                   atol=1e-9)
    assert fired, "the threshold skipped nothing"


def test_an_export_without_alignment_heads_is_refused_in_one_line(whisper: dict[str, Any], hf_exports: Any,
                                                                  tmp_path: Any) -> None:
    import soundfile
    from click.testing import CliRunner
    from test_hf_whisper import clips

    from s2s_deploy.cli import main

    plain = hf_exports.get(whisper["hf_dir"])  # no --word-timestamps: no alignment heads
    clip = tmp_path / "clip.wav"
    audio = clips(1, 2.5, 3.0, seed=2)[0]
    soundfile.write(clip, audio, 16000)
    flag = ["--hallucination-silence-threshold", "0.5"]
    result = CliRunner().invoke(main, ["transcribe", str(plain), str(clip), *flag])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "has no alignment heads; export it with --word-timestamps" in result.output
    out = tmp_path / "x.json"
    result = CliRunner().invoke(main, ["transcribe", str(whisper["out"]), str(clip), *flag, "--max-len", "20",
                                       "--output", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    ours = whisper["transcriber"](clip, hallucination_silence_threshold=0.5, max_len=20)[0]
    assert json.loads(out.read_text())[0]["text"] == ours.text and ours.text.strip()


def test_serve_takes_the_threshold(whisper: dict[str, Any], hf_exports: Any, tmp_path: Any) -> None:
    """``/transcribe?hallucination_silence_threshold=0.5&timestamps=true`` answers as ``Transcriber``; an export
    without alignment heads is a 400 in one line."""
    import soundfile
    from starlette.testclient import TestClient

    from s2s_deploy.serve.app import BatchLimits, ServeConfig, create_app

    path = tmp_path / "clip.wav"
    soundfile.write(path, silent_clips()[0], 16000)
    params = {"timestamps": "true", "hallucination_silence_threshold": "0.5", "max_len": "20"}
    [want] = whisper["transcriber"]([str(path)], timestamps=True, hallucination_silence_threshold=0.5, max_len=20)
    assert want.segments
    with TestClient(create_app(ServeConfig(str(whisper["out"]), BatchLimits(window_ms=1), threads=1))) as http:
        response = http.post("/transcribe", params=params, content=path.read_bytes())
        assert response.status_code == 200, response.text
        [got] = response.json()["transcriptions"]
        assert got["text"] == want.text
        # the window's facts (avg_log_prob, ...) differ by float32 rounding across thread counts: not compared
        assert [(g["start"], g["end"], g["text"]) for g in got["segments"]] == [(s.start, s.end, s.text)
                                                                                for s in want.segments]
    plain = hf_exports.get(whisper["hf_dir"])
    with TestClient(create_app(ServeConfig(str(plain), BatchLimits(window_ms=1), threads=1))) as http:
        refused = http.post("/transcribe", params=params, content=path.read_bytes())
        assert refused.status_code == 400 and "has no alignment heads" in refused.text
