"""Audio read block by block: the streamed features equal the whole clip's bit for bit, and a header is
judged (rate, duration, truncation) before the audio is decoded."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends import KaldiFbank, WhisperLogMel
from s2s_deploy.frontends.audio import BLOCK_FRAMES, AudioFile, AudioTooLongError, load_audio
from s2s_deploy.frontends.frames import StreamedFeatures

soundfile = pytest.importorskip("soundfile")
soxr = pytest.importorskip("soxr")


def synthetic(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """Tones gliding in pitch and loudness, noise, and stretches of digital silence (so the floor
    8 below the loudest clamps), in two channels that differ."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    tone = 0.4 * np.sin(2 * np.pi * (220 + 40 * np.sin(t / 7)) * t) * (0.5 + 0.5 * np.sin(t / 3))
    audio = tone + 0.02 * rng.standard_normal(len(t))
    audio[(t % 50) < 4] = 0.0
    return np.stack([audio, 0.5 * audio + 0.01 * rng.standard_normal(len(t))], axis=1).astype(np.float32)


def one_shot(path: Path, target: int) -> np.ndarray:
    """What the front end read before it streamed: the whole file, channels averaged, soxr one-shot."""
    data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    mono = data.astype(np.float64).mean(axis=1).astype(np.float32)
    return mono if rate == target else soxr.resample(mono, rate, target, quality="HQ").astype(np.float32)


@pytest.mark.parametrize(("seconds", "rate", "kind"), [
    (150.0, 44100, "FLAC"),  # minutes, resampled
    (130.5, 16000, "WAV"),   # at the model's rate: no resampler
    (61.3, 8000, "FLAC"),
    (5.0, 22050, "WAV"),     # shorter than the window: the one-shot path
])
def test_streamed_features_equal_the_whole_clips_bit_for_bit(tmp_path: Path, seconds: float, rate: int,
                                                             kind: str) -> None:
    path = tmp_path / f"clip.{kind.lower()}"
    soundfile.write(str(path), synthetic(seconds, rate), rate, format=kind)
    frontend = WhisperLogMel(chunk_length=8)
    expected = frontend.whole(one_shot(path, 16000))
    opened = AudioFile(path, "clip", 16000)
    streamed = frontend.stream(opened, "clip", opened.expected)
    assert streamed.shape == expected.shape
    assert streamed.flags.c_contiguous or seconds <= 8  # long: no copy left for checked_features to make
    assert np.array_equal(streamed, expected)
    assert np.array_equal(load_audio(path, 16000), one_shot(path, 16000))


@pytest.mark.parametrize("block", [1000, BLOCK_FRAMES, 300_001])
def test_any_block_size_and_an_unknown_length_give_the_same_features(block: int) -> None:
    audio = synthetic(75.0, 16000, seed=1).mean(axis=1).astype(np.float32)
    frontend = WhisperLogMel(chunk_length=30, n_mels=128)
    blocks = (audio[i: i + block] for i in range(0, len(audio), block))
    assert np.array_equal(frontend.stream(blocks, "clip"), frontend.whole(audio))


def test_a_front_end_that_cannot_stream_joins_the_blocks() -> None:
    audio = synthetic(3.0, 16000).mean(axis=1).astype(np.float32)
    blocks = (audio[i: i + 7000] for i in range(0, len(audio), 7000))
    assert np.array_equal(KaldiFbank()(audio), KaldiFbank().stream(blocks, "clip"))


def wav(frames: int, rate: int, data: bytes | None = None, channels: int = 1) -> bytes:
    """A 16-bit PCM WAV whose header says ``frames`` at ``rate``, holding ``data`` (all the frames' zeros
    if None)."""
    body = bytes(2 * frames * channels) if data is None else data
    size = 2 * frames * channels
    header = (b"RIFF" + struct.pack("<I", 36 + size) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, channels, rate,
              rate * 2 * channels, 2 * channels, 16) + b"data" + struct.pack("<I", size))
    return header + body


@pytest.mark.parametrize(("data", "fragment"), [
    (wav(2000, 1), "a sampling rate of 1 Hz is outside the plausible 1000-384000 Hz"),
    (wav(2000, 768_000), "a sampling rate of 768000 Hz is outside"),
])
def test_an_implausible_rate_is_refused_from_the_header(data: bytes, fragment: str) -> None:
    with pytest.raises(S2SError, match=fragment):
        AudioFile(data, "upload", 16000)


def test_a_duration_over_the_limit_is_refused_before_decoding() -> None:
    data = wav(16000 * 20, 16000)
    with pytest.raises(AudioTooLongError, match=r"upload: 20\.0 s of audio is over the limit of 10 s"):
        AudioFile(data, "upload", 16000, max_duration=10)
    assert AudioFile(data, "upload", 16000, max_duration=20).expected == 16000 * 20


def test_a_truncated_file_is_read_with_one_warning() -> None:
    tone = (0.3 * np.sin(np.arange(16000) / 5) * 32767).astype("<i2").tobytes()
    truncated = wav(16000, 16000, tone)[: 44 + len(tone) // 2]
    lines: list[str] = []
    audio = np.concatenate(list(AudioFile(truncated, "upload", 16000, warn=lines.append)))
    assert len(audio) == 8000
    assert lines == ["warning: audio upload is truncated: its header promises 32000 bytes of audio, "
                     "the file holds 16000; reading what it holds"]
    whole: list[str] = []
    assert len(np.concatenate(list(AudioFile(wav(16000, 16000, tone), "upload", 16000, warn=whole.append)))) == 16000
    assert whole == []


def test_nan_and_empty_audio_are_one_line(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.array([0.0, np.nan, 0.1], dtype=np.float32), 16000, format="WAV", subtype="FLOAT")
    with pytest.raises(S2SError, match="NaN or infinite"):
        list(AudioFile(buffer.getvalue(), "upload", 16000))
    (tmp_path / "empty.wav").write_bytes(wav(0, 16000))
    with pytest.raises(S2SError, match="no audio samples"):
        load_audio(tmp_path / "empty.wav", 16000)
    with pytest.raises(S2SError, match="is a directory, not an audio file"):
        load_audio(tmp_path, 16000)


@pytest.mark.parametrize(("scale", "warning"), [
    (1e6, "warning: audio upload peaks at 3e+05, far outside ±1: scale float samples to [-1, 1] "
          "(the text will be unreliable)"),
    (5.0, "warning: audio upload is heavily clipped: 53.6% of its samples are at full scale "
          "(the text may be unreliable)"),
    (1.0, None),
])
def test_audio_far_outside_full_scale_or_clipped_gets_one_warning(scale: float, warning: str | None) -> None:
    tone = (0.3 * np.sin(np.arange(32000) / 7)).astype(np.float32) * scale
    samples = tone if scale > 2 else np.clip(tone, -1, 1)  # a recorder clips; float audio scaled wrong does not
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, 16000, format="WAV", subtype="FLOAT")
    lines: list[str] = []
    list(AudioFile(buffer.getvalue(), "upload", 16000, warn=lines.append))
    assert lines == ([warning] if warning else [])


@pytest.mark.parametrize(("seconds", "rate", "kind", "chunk"), [
    (150.0, 44100, "FLAC", 8),   # minutes, resampled, the bundled speech model's 8-s window
    (95.0, 16000, "WAV", 30),    # Whisper's 30-s window, no resampler
])
def test_windows_made_as_the_decoder_reads_them_equal_the_whole_clips(tmp_path: Path, seconds: float, rate: int,
                                                                      kind: str, chunk: int) -> None:
    """Two passes (the loudest frame first, then the windows as asked) give ``whole``'s features bit
    for bit, read forward in overlapping windows as the seek loop reads them, and again from the start."""
    path = tmp_path / f"clip.{kind.lower()}"
    soundfile.write(str(path), synthetic(seconds, rate, seed=3), rate, format=kind)
    frontend = WhisperLogMel(chunk_length=chunk)
    expected = frontend.whole(one_shot(path, 16000))
    streamed = frontend.frames(AudioFile(path, "clip", 16000), "clip", frontend.window)
    assert isinstance(streamed, StreamedFeatures)
    assert streamed.shape == expected.shape
    seek, window = 0, frontend.window
    while seek < expected.shape[-1]:  # windows that overlap, as a seek back to a timestamp makes them
        got = streamed[..., seek: seek + window]
        assert np.array_equal(got, expected[..., seek: seek + window])
        seek += window - 137
    assert np.array_equal(streamed[..., 5: 5 + window], expected[..., 5: 5 + window])  # back to the start
    held = streamed[..., expected.shape[-1] - 3: expected.shape[-1] + 50]
    assert np.array_equal(held, expected[..., -3:])


def test_a_clip_within_one_window_is_an_array_and_streaming_holds_no_whole_clip(tmp_path: Path) -> None:
    path = tmp_path / "clip.wav"
    soundfile.write(str(path), synthetic(40.0, 16000), 16000)
    opened = AudioFile(path, "clip", 16000)
    expected = WhisperLogMel(chunk_length=8).stream(opened, "clip", opened.expected)
    within = WhisperLogMel(chunk_length=8).frames(AudioFile(path, "clip", 16000), "clip", window=None)
    assert isinstance(within, np.ndarray) and np.array_equal(within, expected)
    within = WhisperLogMel(chunk_length=8).frames(AudioFile(path, "clip", 16000), "clip", window=4000)
    assert isinstance(within, np.ndarray) and np.array_equal(within, expected)
    streamed = WhisperLogMel(chunk_length=8).frames(AudioFile(path, "clip", 16000), "clip", window=800)
    assert isinstance(streamed, StreamedFeatures)
    streamed[..., 3000:3800]
    assert streamed._held.shape[-1] < 3800  # a window and a piece held, never the clip's 4000 frames
