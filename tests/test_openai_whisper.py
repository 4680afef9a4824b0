"""Whisper's real vocabulary and mel filters, from openai-whisper's own assets, against our decoding.

The ``openai-whisper`` package (a dev dependency, read here only, never at run time) ships Whisper's
byte-level BPE as ``whisper/assets/multilingual.tiktoken`` and its mel filters as ``mel_filters.npz``.
transformers' ``TikTokenConverter`` makes the BPE a ``tokenizer.json``; Whisper's special tokens
follow it at openai-whisper's ids (``<|endoftext|>`` 50257, ``<|startoftranscript|>``, 99 languages,
the task and control tokens, 1,501 timestamps up to 51864), the timestamps as non-special added
tokens as in the hub's folders. Nothing is fetched: tiktoken's cache is off and a socket that
connects fails the test.

Checked (docs/parity.md, "A real Whisper vocabulary"): our text and segment decoding of that
vocabulary, as exported by ``export --hf``, against openai-whisper's ``Tokenizer.decode`` and
``decode_with_timestamps`` and transformers' ``WhisperTokenizer`` (``WhisperTokenizerFast`` is the
same class in transformers 5) on random token streams and on ``generate``'s; multilingual text
encoded by openai-whisper and decoded by us; and ``whisper_log_mel`` against openai-whisper's
``log_mel_spectrogram`` on the same samples, with its ``mel_filters.npz`` against our filters.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from s2s_deploy.frontends import WhisperLogMel, load_audio
from s2s_deploy.frontends.audio import WHISPER_MAX_FREQUENCY, slaney_mel_filters

openai_whisper = pytest.importorskip("whisper", reason="openai-whisper (the dev extra) holds Whisper's assets")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ASSETS = Path(openai_whisper.__file__).parent / "assets"

DATA = Path(__file__).parent / "data"
RATE = 16000
AUDIO_ATOL = 2e-4  # docs/parity.md, "Front ends": the bound every audio front end is held to
LANGUAGES = 99  # multilingual.tiktoken's models before large-v3: 51,865 ids
MULTILINGUAL = ("twenty-one weeks after December 31, 1999", "vingt et une semaines après le 31 décembre 1999",
                "einundzwanzig Wochen nach dem 31. Dezember 1999", "Двадцать одна неделя после 31 декабря",
                "1999年12月31日から21週間後", "1999년 12월 31일 이후 21주", "二十一周后，即一九九九年十二月三十一日",
                "واحد وعشرون أسبوعا بعد 31 ديسمبر", "ça coûte 5 € — naïve café 🎉", "  two  spaces\tand a tab\n",
                "they 're here , are n't they ?")


@contextmanager
def offline() -> Iterator[None]:
    """No network and no tiktoken cache: the assets are read from openai-whisper's folder only."""

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("the network was touched while reading openai-whisper's assets")

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken then opens the path itself, no cache read or written
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket, "create_connection", refuse)
        yield


def real_tokenizer(languages: int = LANGUAGES) -> tuple[Any, Any]:
    """(the ``tokenizers`` tokenizer made from ``multilingual.tiktoken`` by transformers' converter with
    Whisper's special tokens, openai-whisper's ``Tokenizer``), both read offline from the assets."""
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    with offline():
        reference = openai_whisper.tokenizer.get_tokenizer(True, num_languages=languages)
        encoding = reference.encoding
        specials = sorted(encoding._special_tokens.items(), key=lambda item: item[1])
        stamps = [token for token, i in specials if i >= reference.timestamp_begin]
        controls = [token for token, i in specials if i < reference.timestamp_begin]
        converted = TikTokenConverter(vocab_file=str(ASSETS / "multilingual.tiktoken"), pattern=encoding._pat_str,
                                      extra_special_tokens=controls).converted()
    converted.add_tokens([AddedToken(token, special=False, normalized=False) for token in stamps])
    return converted, reference


@pytest.fixture(scope="module")
def tokenizers_pair() -> tuple[Any, Any]:
    return real_tokenizer()


def test_the_converted_vocabulary_is_openai_whispers(tokenizers_pair: tuple[Any, Any]) -> None:
    """Every id of the tiktoken encoding (50,257 byte-level pieces, then the specials) is where
    openai-whisper has it, and text encodes to the same ids."""
    converted, reference = tokenizers_pair
    encoding = reference.encoding
    assert converted.get_vocab_size(with_added_tokens=True) == encoding.n_vocab == 51865
    vocab = converted.get_vocab(with_added_tokens=True)
    assert {token: vocab[token] for token in encoding._special_tokens} == encoding._special_tokens
    assert [vocab[token] for token in ("<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>", "<|0.00|>",
                                       "<|30.00|>")] == [reference.eot, reference.sot, reference.no_timestamps,
                                                         reference.timestamp_begin, encoding.n_vocab - 1]
    for text in MULTILINGUAL:
        assert converted.encode(text, add_special_tokens=False).ids == reference.encode(text)


def test_a_100_language_vocabulary_puts_yue_before_the_tasks() -> None:
    """large-v3's 51,866 ids: ``<|yue|>`` is the 100th language and every later id moves by one."""
    converted, reference = real_tokenizer(100)
    vocab = converted.get_vocab(with_added_tokens=True)
    assert len(vocab) == 51866 and vocab["<|yue|>"] == reference.special_tokens["<|yue|>"] == 50358
    assert vocab["<|translate|>"] == reference.translate == 50359 and vocab["<|0.00|>"] == reference.timestamp_begin


# The front end


def test_mel_filters_are_openai_whispers() -> None:
    """``mel_filters.npz`` is librosa's Slaney filters stored in float32 (librosa rounds the triangles
    to float32, then scales them in float32: two roundings); ours are computed in float64. Measured:
    at most 1.3e-9 apart (80 and 128 bins), 1.05e-7 relative, 118 of 16,080 values (80 bins) a unit in
    the last place off their float32 rounding of ours; 1e-7 relative moves a log10 energy by 5e-8."""
    eps = np.finfo(np.float32).eps
    with np.load(ASSETS / "mel_filters.npz", allow_pickle=False) as stored:
        for mels in (80, 128):
            theirs = stored[f"mel_{mels}"]
            ours = slaney_mel_filters(RATE, 400, mels, WHISPER_MAX_FREQUENCY).T
            assert theirs.shape == ours.shape == (mels, 201)
            assert (np.abs(theirs - ours) <= 2 * eps * ours).all()  # two float32 roundings, zeros kept zero
            assert np.count_nonzero(ours) > 2 * mels  # triangles, not a sparse accident


def clips() -> dict[str, np.ndarray]:
    """espeak-ng speech (tests/data, read by ``load_audio``), noise, two tones, and a clip longer than
    the 30-s window (the 16 kHz speech repeated, then a tone it ends inside, 41 s and 5 samples: so the
    last frame's window crosses the clip's end)."""
    found = {f"speech {rate} Hz": load_audio(DATA / f"speech_{rate}hz.flac", RATE) for rate in (8000, 16000, 44100)}
    rng = np.random.default_rng(0)
    t = np.arange(7 * RATE) / RATE
    found["noise"] = rng.normal(0, 0.1, 5 * RATE).astype(np.float32)
    found["tones"] = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 3150 * t)).astype(np.float32)
    speech = found["speech 16000 Hz"]
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(12 * RATE) / RATE)).astype(np.float32)
    found["41 s"] = np.concatenate([speech] * 22 + [tone])[: 41 * RATE + 5]
    return found


@pytest.mark.parametrize("mels", [80, 128])
def test_log_mel_is_openai_whispers(mels: int) -> None:
    """A clip of at most 30 s: ``log_mel_spectrogram(pad_or_trim(audio))``, as openai-whisper's
    ``decode`` examples feed it, against our window. A longer clip: ``log_mel_spectrogram(audio)``
    against ``whole``: every frame, scaled by the clip's loudest, within the front ends' bound.
    ``transcribe`` pads 30 s of zeros before its STFT, where we (and ``WhisperFeatureExtractor``)
    reflect at the clip's end: that changes only a last frame whose window crosses the end."""
    front = WhisperLogMel(n_mels=mels)
    for name, audio in clips().items():
        longer = len(audio) > front.n_samples
        ours = front.whole(audio) if longer else front(audio)
        theirs = openai_whisper.log_mel_spectrogram(
            torch.from_numpy(audio if longer else openai_whisper.pad_or_trim(audio)), mels).numpy()
        assert ours.shape == theirs.shape == (mels, max(front.n_frames, len(audio) // front.hop_length)), name
        assert np.abs(ours - theirs).max() <= AUDIO_ATOL, name
        padded = openai_whisper.log_mel_spectrogram(torch.from_numpy(audio), mels,
                                                    padding=openai_whisper.audio.N_SAMPLES)
        content = padded.shape[-1] - openai_whisper.audio.N_FRAMES  # transcribe's content_frames
        whole = front.whole(audio)
        apart = np.abs(whole[:, :content] - padded[:, :content].numpy()).max(axis=0)
        assert (apart <= AUDIO_ATOL).all() if not longer else (apart[:-1] <= AUDIO_ATOL).all(), name
        if longer:  # the last frame's window runs 35 samples past the end: zeros there, reflected here
            assert apart[-1] > 0.1, name


# The exported vocabulary

MAX_NEW = 24
CLIPS = 12


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, tokenizers_pair: tuple[Any, Any]) -> dict[str, Any]:
    """A tiny random Whisper (1+1 layers, d_model 64, a 1-s window) over the real vocabulary, saved with
    ``WhisperTokenizer.save_pretrained`` (``clean_up_tokenization_spaces`` on) and exported with
    ``export --hf``; its tokenizer read back from the folder, as a user loads it."""
    from test_hf_whisper import clips as chirps
    from test_hf_whisper import lean

    from s2s_deploy.cli import main
    from s2s_deploy.runtime.decoding import resolve
    from s2s_deploy.runtime.transcriber import Transcriber

    converted, reference = tokenizers_pair
    root = tmp_path_factory.mktemp("openai-whisper")
    hf_dir, out = root / "hf", root / "out"
    eot, sot, no_timestamps = reference.eot, reference.sot, reference.no_timestamps
    controls = [token for token, i in sorted(reference.special_tokens.items(), key=lambda item: item[1])
                if eot < i < reference.timestamp_begin]
    transformers.WhisperTokenizer(tokenizer_object=converted, unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                  eos_token="<|endoftext|>", extra_special_tokens=controls).save_pretrained(hf_dir)
    settings = json.loads((hf_dir / "tokenizer_config.json").read_text())
    settings["clean_up_tokenization_spaces"] = True  # transformers 5 ignores it for a BPE, and so must the export
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(settings))
    config = transformers.WhisperConfig(
        vocab_size=reference.encoding.n_vocab, num_mel_bins=80, d_model=64, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=50, max_target_positions=64, pad_token_id=eot, bos_token_id=eot, eos_token_id=eot,
        decoder_start_token_id=sot, suppress_tokens=list(range(sot, no_timestamps)),
        begin_suppress_tokens=[reference.encode(" ")[0], eot], init_std=0.3)
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    extractor = transformers.WhisperFeatureExtractor(feature_size=80, sampling_rate=RATE, hop_length=160,
                                                     chunk_length=1, n_fft=400)
    audio = chirps(CLIPS, 0.3, 1.0, seed=3)
    features = torch.from_numpy(np.stack([extractor(a, sampling_rate=RATE)["input_features"][0] for a in audio]))
    lean(model, features, [eot], 0.85, keep=0.5)
    lean(model, features, list(range(reference.timestamp_begin, reference.timestamp_begin + 51)), 0.45, keep=0.5)
    generation = model.generation_config
    generation.lang_to_id = {f"<|{code}|>": reference.to_language_token(code)
                             for code in reference.all_language_codes}
    generation.task_to_id = {"translate": reference.translate, "transcribe": reference.transcribe}
    generation.no_timestamps_token_id = no_timestamps
    generation.max_initial_timestamp_index = 10
    generation.is_multilingual = True
    generation.language, generation.task = "en", "transcribe"
    generation._from_model_config = False  # as a hub folder's: transformers drops these keys otherwise
    model.save_pretrained(hf_dir)
    extractor.save_pretrained(hf_dir)
    result = CliRunner().invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    transcriber = Transcriber(out, device="cpu")
    manifest = transcriber.translator.manifest
    return {"model": model, "hf": transformers.WhisperTokenizer.from_pretrained(hf_dir), "reference": reference,
            "hf_fast": transformers.WhisperTokenizerFast.from_pretrained(hf_dir),
            "converted": converted, "transcriber": transcriber, "audio": audio, "vocab": manifest.tgt_vocab,
            "timed": resolve(manifest, {"timestamps": True}), "features": [transcriber.features(a) for a in audio]}


@pytest.mark.slow
def test_the_export_keeps_openai_whispers_ids(exported: dict[str, Any]) -> None:
    """The manifest's tokens are the converted tokenizer's, id for id; its 99 languages, two tasks and
    1,501 hidden timestamps are openai-whisper's ids, and timestamps start at its ``timestamp_begin``."""
    vocab, reference = exported["vocab"], exported["reference"]
    table = {i: token for token, i in exported["converted"].get_vocab(with_added_tokens=True).items()}
    assert vocab.tokens == tuple(table[i] for i in range(len(table)))
    assert sorted(vocab.languages) == sorted(reference.all_language_tokens) and len(vocab.languages) == LANGUAGES
    assert set(vocab.tasks) == {reference.translate, reference.transcribe}
    assert vocab.hidden == tuple(range(reference.timestamp_begin, len(vocab)))
    assert vocab.eos_id == reference.eot and vocab.decoder_start_id == reference.sot
    assert exported["timed"].timestamp_begin == reference.timestamp_begin
    assert exported["hf"].all_special_ids[-1] + 1 == reference.timestamp_begin  # transformers' own rule
    assert exported["hf"].clean_up_tokenization_spaces  # read, and ignored for a BPE by transformers 5


def broken_pieces(reference: Any) -> list[int]:
    """Text ids whose bytes are not UTF-8 alone (a piece of a character): where decoders can differ."""
    found = []
    for i in range(reference.eot):
        try:
            reference.encoding.decode_single_token_bytes(i).decode("utf-8")
        except UnicodeDecodeError:
            found.append(i)
    return found


def text_runs(ids: list[int], eot: int, timestamp_begin: int) -> list[list[int]]:
    """The text ids (below ``<|endoftext|>``) of each run between timestamps."""
    runs: list[list[int]] = [[]]
    for i in ids:
        if i >= timestamp_begin:
            runs.append([])
        elif i < eot:
            runs[-1].append(i)
    return runs


@pytest.mark.slow
def test_random_streams_decode_as_transformers_and_openai_whisper(exported: dict[str, Any]) -> None:
    """300 seeded streams of text ids (a third of them pieces of characters), special tokens and
    timestamps, some with ``<|endoftext|>`` inside. Ours stops at ``<|endoftext|>``, so the references
    read up to it. transformers' ``decode(skip_special_tokens=True)``: equal. openai-whisper's ``decode``
    keeps special tokens' text and decodes across timestamps at once; its ``transcribe`` decodes the text
    ids (below ``<|endoftext|>``), equal to ours run by run between timestamps. Where a timestamp splits
    a character, its whole text joins the bytes and ours (and transformers') shows two U+FFFD.
    ``WhisperTokenizerFast`` (the same class as ``WhisperTokenizer`` in transformers 5) read the same."""
    vocab, reference = exported["vocab"], exported["reference"]
    eot, begin, size = reference.eot, reference.timestamp_begin, len(vocab)
    pieces = broken_pieces(reference)
    rng = np.random.default_rng(0)
    joined_apart = 0
    for _ in range(300):
        kinds = rng.choice(4, size=int(rng.integers(1, 40)), p=[0.4, 0.3, 0.1, 0.2])
        ids = [int(rng.integers(0, eot)) if kind == 0 else int(rng.choice(pieces)) if kind == 1
               else int(rng.integers(eot + 1, begin)) if kind == 2 else int(rng.integers(begin, size))
               for kind in kinds]
        if rng.random() < 0.3:
            ids.insert(int(rng.integers(0, len(ids) + 1)), eot)
        if ids[0] == reference.sot_prev:  # transformers strips a prompt the output starts with; ours has none
            ids[0] = reference.sot
        upto = ids[: ids.index(eot)] if eot in ids else ids
        ours = vocab.decode(ids)
        assert ours == exported["hf"].decode(upto, skip_special_tokens=True), ids
        assert ours == exported["hf_fast"].decode(upto, skip_special_tokens=True), ids
        assert ours == "".join(reference.decode(run) for run in text_runs(upto, eot, begin)), ids
        whole = reference.decode([i for i in upto if i < eot])
        if ours != whole:
            joined_apart += 1
            assert "\ufffd" in ours, ids
    assert joined_apart > 0  # the streams did split characters at timestamps


def timed_stream(rng: np.random.Generator, begin: int, pieces: list[int], eot: int) -> tuple[list[int], bool, int]:
    """One window's output as Whisper's timestamp rules shape it: a timestamp, text, a timestamp pair
    between segments, rising times under 30 s; ending on a lone timestamp or on a pair. With whether
    it ends on a lone one, and its segment count."""
    time, ids = int(rng.integers(0, 50)), []
    ids.append(begin + time)
    segments = int(rng.integers(1, 5))
    single = bool(rng.random() < 0.5)
    for k in range(segments):
        ids += [int(rng.choice(pieces)) if rng.random() < 0.3 else int(rng.integers(0, eot))
                for _ in range(int(rng.integers(1, 8)))]
        time += int(rng.integers(1, 200))
        ids.append(begin + time)
        if k < segments - 1 or not single:
            time += int(rng.integers(0, 3))
            ids.append(begin + time)
    return ids, single, segments


@pytest.mark.slow
def test_random_segments_are_transformers_and_openai_whispers(exported: dict[str, Any]) -> None:
    """200 seeded timestamped windows cut by the runtime's ``split`` and decoded by the exported vocabulary.
    Each segment's text is openai-whisper's ``decode`` of its text ids (as its ``transcribe`` makes a
    segment's text) and transformers' ``decode(output_offsets=True)`` offset text. Times: the offsets'
    where the window holds a timestamp pair; written as ``<|start|>text<|end|>``, a window ending on a
    lone timestamp is then openai-whisper's ``decode_with_timestamps`` (and transformers'). A window
    without a pair is one segment from the window's start to its last timestamp, as openai-whisper's
    ``transcribe`` and transformers' ``generate`` make it; transformers' tokenizer alone starts that
    offset at the first timestamp instead (we follow the two decoders, whose segments users get)."""
    from s2s_deploy.runtime.timestamps import split

    vocab, hf, reference, config = exported["vocab"], exported["hf"], exported["reference"], exported["timed"]
    eot, begin = reference.eot, reference.timestamp_begin
    pieces = broken_pieces(reference)
    rng = np.random.default_rng(1)
    for _ in range(200):
        ids, single, segments = timed_stream(rng, begin, pieces, eot)
        cut, _advance = split(ids, 0, 3000, config)
        ours = [(piece.start, piece.end, vocab.decode(piece.tokens)) for piece in cut]
        offsets = [(*offset["timestamp"], offset["text"]) for offset in hf.decode(ids, output_offsets=True)["offsets"]]
        assert [text for *_, text in ours] == [text for *_, text in offsets], ids
        assert [text for *_, text in ours] == [reference.decode([i for i in p.tokens if i < eot]) for p in cut]
        if segments == 1 and single:  # no pair
            assert len(ours) == 1 and ours[0][:2] == (0.0, offsets[0][1]), ids
            continue
        assert ours == offsets, ids
        if single:
            written = "".join(f"<|{start:.2f}|>{text}<|{end:.2f}|>" for start, end, text in ours)
            assert written == reference.decode_with_timestamps(ids) == hf.decode(ids, decode_with_timestamps=True)


@pytest.mark.slow
def test_multilingual_text_round_trips(exported: dict[str, Any]) -> None:
    """Text encoded by openai-whisper decodes to itself with the exported vocabulary, behind a decoder
    prompt and between timestamps, and the exported tokenizer encodes it to openai-whisper's ids."""
    vocab, hf, reference = exported["vocab"], exported["hf"], exported["reference"]
    for text in MULTILINGUAL:
        ids = reference.encode(text)
        assert vocab.encode(text, add_eos=False) == ids
        stamps = (reference.timestamp_begin, reference.timestamp_begin + 50)
        framed = [*reference.sot_sequence, stamps[0], *ids, stamps[1], reference.eot]
        assert vocab.decode(framed) == vocab.decode(ids) == text == hf.decode(framed, skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("language", ["en", "ja"])
def test_generated_streams_decode_as_transformers_and_openai_whisper(exported: dict[str, Any], language: str) -> None:
    """``generate(return_timestamps=True, return_segments=True)``'s sequences (decoder prompt, timestamps
    and ``<|endoftext|>`` included) on 12 clips: our text is transformers' ``batch_decode``, our segments
    its segments decoded by it, and each segment's text openai-whisper's ``decode`` of its text ids."""
    hf, reference, clips = exported["hf"], exported["reference"], exported["features"]
    eot, begin = reference.eot, reference.timestamp_begin
    with torch.no_grad():
        out = exported["model"].generate(
            input_features=torch.from_numpy(np.stack(clips)),
            attention_mask=torch.ones(len(clips), clips[0].shape[-1], dtype=torch.long), max_new_tokens=MAX_NEW,
            language=language, return_timestamps=True, return_segments=True)
    sequences = [[int(i) for i in row] for row in out["sequences"]]
    ours = exported["transcriber"](exported["audio"], beam=1, max_len=MAX_NEW, target_lang=language, timestamps=True)
    assert [t.text for t in ours] == hf.batch_decode(out["sequences"], skip_special_tokens=True)
    assert sum(bool(t.text.strip()) for t in ours) >= CLIPS // 2
    for row, segments, got in zip(sequences, out["segments"], ours, strict=True):
        tokens = [[int(i) for i in segment["tokens"]] for segment in segments]
        want = [(float(s["start"]), float(s["end"]), hf.decode(t, skip_special_tokens=True))
                for s, t in zip(segments, tokens, strict=True)]
        assert [(s.start, s.end, s.text) for s in got.segments] == want
        assert [s.text for s in got.segments] == [reference.decode([i for i in t if i < eot]) for t in tokens]
        assert got.text == "".join(reference.decode(run) for run in text_runs(row, eot, begin))
    assert sum(len(t.segments) for t in ours) >= CLIPS
    assert any(i >= begin for row in sequences for i in row)  # timestamps really occur
