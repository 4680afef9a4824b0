"""The torch-free front ends against transformers' own extractors, on real audio and images.

The speech clips under tests/data were made with espeak-ng (tests/data/README.md); the music is
synthesised chords; silence is zeros. Tolerances and the measured figures: docs/parity.md,
"Front ends".
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends import (
    KaldiFbank,
    VitImage,
    WhisperLogMel,
    frontend_from_json,
    frontend_from_preprocessor_config,
    load_audio,
    resample,
)

DATA = Path(__file__).parent / "data"
SPEECH = {rate: DATA / f"speech_{rate}hz.flac" for rate in (8000, 16000, 44100)}

AUDIO_ATOL = 2e-4  # docs/parity.md: largest measured 4.7e-5 (Whisper), 6.8e-6 (Speech2Text)
IMAGE_ATOL = 1e-6  # docs/parity.md: measured 0 (the same Pillow resize, the same float arithmetic)


def needs(module: str, why: str):
    return pytest.importorskip(module, reason=f"{module} is not installed: {why}")


def chords(rate: int, seconds: float = 3.0) -> np.ndarray:
    """Three decaying major chords with five harmonics each, a second apiece: music-like, not speech."""
    t = np.arange(int(rate * seconds)) / rate
    out = np.zeros_like(t)
    for i, root in enumerate((220.0, 246.94, 196.0)):
        part = (t >= i) & (t < i + 1)
        for ratio in (1.0, 5 / 4, 3 / 2, 2.0):
            for harmonic in range(1, 6):
                out[part] += (
                    0.05 / harmonic * np.sin(2 * np.pi * root * ratio * harmonic * t[part]) * np.exp(-3 * (t[part] - i))
                )
    return out.astype(np.float32)


def inputs_at(rate: int) -> dict[str, np.ndarray]:
    """Every test input brought to ``rate``: the three speech files, chords made at 16 and 44.1 kHz, silence."""
    needs("soundfile", "the audio front ends read files with it")
    needs("soxr", "the audio front ends resample with it")
    clips = {f"speech {source} Hz": load_audio(path, rate) for source, path in SPEECH.items()}
    clips |= {f"chords {source} Hz": resample(chords(source), source, rate) for source in (16000, 44100)}
    clips["silence"] = np.zeros(rate, dtype=np.float32)
    return clips


WHISPER_CONFIGS = {
    "base (80 mels)": {},
    "large-v3 (128 mels)": {"feature_size": 128},
    "8 s window": {"chunk_length": 8},
}


@pytest.mark.parametrize("config", WHISPER_CONFIGS.values(), ids=list(WHISPER_CONFIGS))
def test_whisper_log_mel_matches_transformers(config: dict) -> None:
    transformers = needs("transformers", "the reference for the Whisper front end")
    reference = transformers.WhisperFeatureExtractor(**config)
    ours = WhisperLogMel.from_preprocessor_config(reference.to_dict())
    assert (ours.n_mels, ours.n_frames) == (reference.feature_size, reference.nb_max_frames)
    for name, clip in inputs_at(16000).items():
        expected = reference(clip, sampling_rate=16000, return_tensors="np").input_features[0]
        features = ours(clip)
        assert features.shape == expected.shape and features.dtype == np.float32, name
        assert np.abs(features - expected).max() <= AUDIO_ATOL, name


@pytest.mark.parametrize("cmvn", [True, False], ids=["with utterance CMVN", "raw log energies"])
def test_kaldi_fbank_matches_transformers(cmvn: bool) -> None:
    transformers = needs("transformers", "the reference for the Speech2Text front end")
    reference = transformers.Speech2TextFeatureExtractor(do_ceptral_normalize=cmvn)
    ours = KaldiFbank.from_preprocessor_config(reference.to_dict())
    for name, clip in inputs_at(16000).items():
        if name == "silence" and cmvn:
            continue  # test_kaldi_fbank_keeps_silence_finite
        expected = reference(clip, sampling_rate=16000, return_tensors="np").input_features[0]
        features = ours(clip)
        assert features.shape == expected.shape and features.dtype == np.float32, name
        assert np.abs(features - expected).max() <= AUDIO_ATOL, name


def test_kaldi_fbank_keeps_silence_finite() -> None:
    """Digital silence has no variance to divide by: transformers returns non-finite values, we return zeros."""
    transformers = needs("transformers", "the reference for the Speech2Text front end")
    silence = np.zeros(16000, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = transformers.Speech2TextFeatureExtractor()(silence, sampling_rate=16000).input_features[0]
    assert not np.isfinite(expected).all()
    features = KaldiFbank()(silence)
    assert features.shape == (98, 80) and np.abs(features).max() < 1e-6


def test_kaldi_fbank_of_a_clip_shorter_than_a_frame_is_empty() -> None:
    assert KaldiFbank()(np.ones(399)).shape == (0, 80)


def test_resampling_is_the_hugging_face_pipelines() -> None:
    """load_audio resamples as librosa does by default (soxr HQ), which the datasets library uses."""
    soundfile = needs("soundfile", "the audio front ends read files with it")
    librosa = needs("librosa", "the reference for resampling")
    for rate, path in SPEECH.items():
        data, found = soundfile.read(path, dtype="float32")
        assert found == rate
        expected = librosa.resample(data, orig_sr=rate, target_sr=16000)
        np.testing.assert_array_equal(load_audio(path, 16000), expected)


def test_load_audio_averages_channels_and_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    soundfile = needs("soundfile", "the audio front ends read files with it")
    left = np.linspace(-0.5, 0.5, 8000, dtype=np.float32)
    soundfile.write(tmp_path / "stereo.wav", np.stack([left, -left / 2], axis=1), 8000, subtype="FLOAT")
    np.testing.assert_allclose(load_audio(tmp_path / "stereo.wav", 8000), left / 4, atol=1e-7)
    (tmp_path / "notes.wav").write_text("not audio")
    with pytest.raises(S2SError, match=r"cannot read audio .*notes\.wav"):
        load_audio(tmp_path / "notes.wav", 16000)
    with pytest.raises(S2SError, match="audio file not found"):
        load_audio(tmp_path / "missing.flac", 16000)


def test_a_missing_library_is_named_with_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def without_soxr(name: str, *args):
        if name == "soxr":
            raise ImportError("No module named 'soxr'")
        return real(name, *args)

    monkeypatch.setattr("importlib.import_module", without_soxr)
    with pytest.raises(
        S2SError, match=r'^resampling audio needs soxr, which is not installed: pip install "s2s-deploy\[audio\]"$'
    ):
        resample(np.zeros(800, dtype=np.float32), 8000, 16000)


def test_the_audio_front_ends_run_without_torch_or_transformers() -> None:
    needs("soundfile", "the audio front ends read files with it")
    needs("soxr", "the audio front ends resample with it")
    code = (
        "import sys\nsys.modules['torch'] = sys.modules['transformers'] = None\n"
        "from s2s_deploy.frontends import WhisperLogMel, KaldiFbank, load_audio\n"
        f"clip = load_audio({str(SPEECH[44100])!r}, 16000)\n"
        "print(WhisperLogMel()(clip).shape, KaldiFbank()(clip).shape)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "(80, 3000) (113, 80)"


def picture(width: int, height: int):
    """Gradients, a filled disc and text: edges and smooth areas for the resampling filters."""
    image_module = needs("PIL.Image", "the image front end resizes with Pillow")
    from PIL import ImageDraw

    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // (width - 1), y * 255 // (height - 1), (x + y) % 256], axis=-1).astype(np.uint8)
    image = image_module.fromarray(pixels)
    draw = ImageDraw.Draw(image)
    draw.text((5, 5), "Invoice 2021-03-03", fill=(0, 0, 0))
    draw.ellipse((width // 4, height // 4, width // 2, height // 2), fill=(200, 30, 30))
    return image


def transparent(image):
    """``image`` with alpha falling from opaque on the left to clear on the right: transformers
    composites it onto white, where a plain RGB conversion would keep the hidden colours."""
    from PIL import Image

    alpha = np.repeat(np.linspace(255, 0, image.width).astype(np.uint8)[None, :], image.height, axis=0)
    image.putalpha(Image.fromarray(alpha))
    return image


VIT_CONFIGS = {
    "vit-base": {},
    "trocr (384, bicubic)": {"size": {"height": 384, "width": 384}, "resample": 3},
    "imagenet stats, 224x320, lanczos": {
        "size": {"height": 224, "width": 320},
        "resample": 1,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
    },
    "no normalisation": {"do_normalize": False},
}


@pytest.mark.parametrize("config", VIT_CONFIGS.values(), ids=list(VIT_CONFIGS))
def test_vit_image_matches_transformers(config: dict) -> None:
    transformers = needs("transformers", "the reference for the image front end")
    noise = np.random.default_rng(0).integers(0, 256, (300, 200, 3), dtype=np.uint8)
    images = {
        "landscape": picture(640, 360),
        "smaller than the output": picture(50, 30),
        "noise": noise,
        "grey": picture(200, 100).convert("L"),
        "with alpha": picture(120, 90).convert("RGBA"),
        "transparent": transparent(picture(120, 90)),
    }
    reference = transformers.ViTImageProcessorPil(**config, do_convert_rgb=True)
    ours = frontend_from_preprocessor_config(reference.to_dict())
    assert isinstance(ours, VitImage)
    for name, image in images.items():
        expected = reference(image, return_tensors="np").pixel_values[0]
        pixels = ours(image)
        assert pixels.shape == expected.shape and pixels.dtype == np.float32, name
        assert np.abs(pixels - expected).max() <= IMAGE_ATOL, name


def test_image_processors_with_other_steps_are_refused() -> None:
    donut = {"image_processor_type": "DonutImageProcessor", "do_thumbnail": True, "do_pad": True}
    with pytest.raises(S2SError, match="no front end for 'DonutImageProcessor'"):
        frontend_from_preprocessor_config(donut)
    with pytest.raises(S2SError, match="do_center_crop not supported"):
        VitImage.from_preprocessor_config({"do_center_crop": True, "crop_size": 224})
    with pytest.raises(S2SError, match="not a fixed height and width"):
        VitImage.from_preprocessor_config({"size": {"shortest_edge": 224}})
    with pytest.raises(S2SError, match="dither"):
        WhisperLogMel.from_preprocessor_config({"feature_extractor_type": "WhisperFeatureExtractor", "dither": 1e-4})
    with pytest.raises(S2SError, match="is not one of WhisperFeatureExtractor"):
        WhisperLogMel.from_preprocessor_config({"feature_extractor_type": "Speech2TextFeatureExtractor"})


@pytest.mark.parametrize(
    "frontend",
    [
        WhisperLogMel(n_mels=128, chunk_length=6),
        KaldiFbank(normalize_vars=False),
        VitImage(height=384, width=384, resample=3, image_mean=(0.485, 0.456, 0.406)),
    ],
    ids=lambda f: f.kind,
)
def test_the_manifest_form_round_trips(frontend) -> None:
    data = json.loads(json.dumps(frontend.to_json()))
    assert data["kind"] == frontend.kind
    assert frontend_from_json(data) == frontend == type(frontend).from_json(data)


def test_the_manifest_form_refuses_what_it_does_not_know() -> None:
    with pytest.raises(S2SError, match="unknown kind 'mfcc'"):
        frontend_from_json({"kind": "mfcc"})
    with pytest.raises(S2SError, match="unknown parameters window"):
        frontend_from_json({**WhisperLogMel().to_json(), "window": "hamming"})
    with pytest.raises(S2SError, match="expected kind 'kaldi_fbank'"):
        KaldiFbank.from_json(WhisperLogMel().to_json())
    with pytest.raises(S2SError, match="hop_length must be positive"):
        frontend_from_json({**WhisperLogMel().to_json(), "hop_length": 0})


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("kind", ["JPEG", "PNG"])
def test_exif_orientation_is_applied_as_transformers_load_image_applies_it(tmp_path: Path, orientation: int,
                                                                           kind: str) -> None:
    """Cameras store pixels as the sensor saw them and say in EXIF how to turn them; transformers'
    ``load_image`` turns them (``ImageOps.exif_transpose``), so the file gives its features, not the raw pixels'."""
    transformers = needs("transformers", "the reference for reading image files")
    from PIL import Image

    from s2s_deploy.frontends import load_image

    path = tmp_path / f"photo.{kind.lower()}"
    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation
    picture(160, 90).save(path, format=kind, exif=exif)
    reference = transformers.ViTImageProcessorPil(do_convert_rgb=True)
    expected = reference(transformers.image_utils.load_image(str(path)), return_tensors="np").pixel_values[0]
    ours = frontend_from_preprocessor_config(reference.to_dict())
    image = load_image(path)
    assert image.size == ((90, 160) if orientation >= 5 else (160, 90))  # 5-8 turn it a quarter
    assert np.abs(ours(image) - expected).max() <= IMAGE_ATOL
    if orientation != 1:  # the raw pixels would have given other features
        with Image.open(path) as raw:
            assert np.abs(ours(raw.convert("RGB")) - expected).max() > 0.1


@pytest.mark.parametrize(("mode", "pixels", "fragment"), [
    ("I;16", (np.arange(64 * 48).reshape(48, 64) * 20).astype(np.uint16), "16-bit (Pillow mode I;16)"),
    ("F", np.linspace(0, 1, 64 * 48, dtype=np.float32).reshape(48, 64), "32-bit float (Pillow mode F)"),
    ("I", (np.arange(64 * 48).reshape(48, 64) * 1000).astype(np.int32), "32-bit integer (Pillow mode I)"),
])
def test_images_of_more_than_8_bits_are_refused_in_one_line(tmp_path: Path, mode: str, pixels: np.ndarray,
                                                            fragment: str) -> None:
    """Pillow's RGB conversion clips them to 0-255, and so does transformers' ``load_image`` (checked here):
    a 16-bit grey image comes out nearly all white, a float one all black. Nothing scales them: refused."""
    transformers = needs("transformers", "the reference for reading image files")
    from PIL import Image

    from s2s_deploy.frontends import load_image

    path = tmp_path / ("wide.png" if mode == "I;16" else "wide.tiff")
    Image.fromarray(pixels).save(path)
    with Image.open(path) as opened:
        assert opened.mode == mode
    clipped = np.asarray(transformers.image_utils.load_image(str(path)))
    assert clipped.dtype == np.uint8 and (np.mean(clipped == 255) > 0.9 or clipped.max() <= 1)
    with pytest.raises(S2SError) as refused:
        load_image(path)
    assert fragment in str(refused.value) and "convert it to 8-bit first" in str(refused.value)
    assert "\n" not in str(refused.value)
