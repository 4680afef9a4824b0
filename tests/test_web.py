"""The browser page in a real headless Chromium (puppeteer-core): it must translate every bundled
export's samples exactly as ``s2s-deploy translate`` does, greedy and beam 4, and transcribe the
test clips with the bundled speech model exactly as ``Transcriber`` does."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from s2s_deploy.architecture.registry import REGISTRY
from s2s_deploy.errors import S2SError
from s2s_deploy.frontends.audio import KaldiFbank, WhisperLogMel, load_audio
from s2s_deploy.runtime.transcriber import Transcriber
from s2s_deploy.runtime.translator import Translator
from s2s_deploy.web.bundle import ORT_DIR, ORT_FILES, PAGE_FILES, PAGE_FRONTENDS, write_web_bundle
from s2s_deploy.web.defaults import SEARCH_JS, rendered

ROOT = Path(__file__).resolve().parents[1]
CLIPS = sorted((ROOT / "tests" / "data").glob("speech_*hz.flac"))
AT_RATE = ROOT / "tests" / "data" / "speech_16000hz.flac"
"""The clip already at the speech model's rate: the browser decodes it without resampling."""
WEB_DIR = ROOT / "examples" / "web"
DIST = WEB_DIR / "node_modules" / "onnxruntime-web" / "dist"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BEAMS = (1, 4)
HARD = ("the forty-second of Smarch", "twenty-one weeks after December 31, 1999 and then", "Mittwoch, 3. März 2021",
        "xyz")
"""Inputs the models are unsure of: beam 4 and greedy disagree on some (gru: two of these)."""


def browser_missing() -> str | None:
    if shutil.which("node") is None:
        return "Node.js is not installed"
    if CHROMIUM is None:
        return "Chromium is not installed (apt-get install chromium; .ci/run tries)"
    if not (WEB_DIR / "node_modules" / "puppeteer-core").is_dir() or not DIST.is_dir():
        return "run `npm install` in examples/web first (.ci/run does)"
    return None


needs_browser = pytest.mark.skipif(browser_missing() is not None, reason=browser_missing() or "")


@contextlib.contextmanager
def static_site(folder: Path) -> Iterator[str]:
    """``folder`` served on 127.0.0.1 only, by the standard library's static server: its URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served on 127.0.0.1 only."""
    folder = tmp_path / "site"
    folder.mkdir()
    with static_site(folder) as url:
        yield folder, url


def run_page(url: str, screenshot: Path, job: dict, timeout: int = 600) -> dict:
    """What examples/web/drive.js prints for ``job`` on the page at ``url``."""
    result = subprocess.run(["node", "drive.js", url, str(screenshot)], cwd=WEB_DIR, input=json.dumps(job),
                            capture_output=True, text=True, timeout=timeout,
                            env={"CHROMIUM": CHROMIUM or "", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


TEXT_ARCHS = sorted(entry.plugin.name for entry in REGISTRY.entries()
                    if not entry.plugin.source_spec(entry.plugin.preset()).is_features)


@needs_browser
@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_page_translates_like_the_cli(exports, served, tmp_path: Path, arch: str) -> None:
    _, manifest = exports.get(arch)
    site, url = served
    folder = site / arch
    shutil.copytree(manifest.directory, folder)
    write_web_bundle(folder, DIST)
    texts = [*manifest.samples, *HARD]
    screenshot = tmp_path / f"{arch}.png"
    page = run_page(f"{url}/{arch}/index.html", screenshot, {"texts": texts, "beams": list(BEAMS)})
    translator = Translator(folder, device="cpu")
    for beam in BEAMS:
        assert [r["text"] for r in page[str(beam)]] == [t.text for t in translator(texts, beam=beam)], f"beam {beam}"
        assert all(r["ms"] > 0 for r in page[str(beam)])
    assert screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")


@needs_browser
def test_page_transcribes_like_the_transcriber(exports, served, tmp_path: Path) -> None:
    """The bundled speech model (whisper_log_mel) in the page: the samples Python reads give the same
    features to float32 rounding (both front ends, Whisper's real 30 s window too) and the same text,
    greedy and beam 4, a clip of three windows included (read window by window, as ``transcribe``
    does). A file decoded by the browser is exact at the front end's rate (16 kHz)."""
    assert len(CLIPS) == 3, "tests/data lost its speech clips"
    soundfile = pytest.importorskip("soundfile", reason="soundfile is not installed: the clips are read with it")
    pytest.importorskip("soxr", reason="soxr is not installed: the clips are resampled with it")
    _, manifest = exports.get("speech")
    site, url = served
    folder = site / "speech"
    shutil.copytree(manifest.directory, folder)
    write_web_bundle(folder, DIST)
    for clip in CLIPS:
        shutil.copy(clip, folder / clip.name)
    transcriber = Transcriber(folder, device="cpu")
    clips = [load_audio(clip, transcriber.sampling_rate) for clip in CLIPS]
    gap = np.zeros(4 * transcriber.sampling_rate, dtype=np.float32)  # and all three in one clip of three windows
    clips.append(np.concatenate([part for clip in clips for part in (clip, gap)]))
    frontends = [transcriber.frontend, WhisperLogMel(), KaldiFbank()]
    microphone = tmp_path / "microphone.wav"  # what Chromium's fake capture device plays, in a loop
    soundfile.write(microphone, clips[CLIPS.index(AT_RATE)], transcriber.sampling_rate, subtype="PCM_16")
    page = run_page(f"{url}/speech/index.html", tmp_path / "speech.png", {
        "clips": [clip.tolist() for clip in clips], "beams": list(BEAMS), "files": [clip.name for clip in CLIPS],
        "frontends": [f.to_json() for f in frontends],
        "upload": str(AT_RATE), "record": str(microphone)})
    for frontend, computed in zip(frontends, page["features"], strict=True):
        for clip, data in zip(clips, computed, strict=True):
            want = frontend(clip)
            diff = float(np.abs(np.asarray(data, dtype=np.float32).reshape(want.shape) - want).max())
            print(f"{frontend.kind} ({want.shape}): max |JS - numpy| {diff:.3g}")
            assert diff <= 1e-6, frontend  # docs/parity.md: float64 in both, rounded once to float32
    for clip, data in zip(clips, page["whole"], strict=True):  # what a clip past the window is read from
        want = transcriber.frontend.whole(clip)
        assert np.abs(np.asarray(data, dtype=np.float32).reshape(want.shape) - want).max() <= 1e-6
    for beam in BEAMS:
        assert [r["text"] for r in page["beams"][str(beam)]] == [t.text for t in transcriber(clips, beam=beam)], beam
    # The browser's own decoding: at the front end's rate no resampler runs; Chromium scales positive
    # 16-bit samples by 1/32767 (soundfile: 1/32768), which moves no token on this clip.
    i = CLIPS.index(AT_RATE)
    decoded = np.asarray(page["decoded"][i], dtype=np.float32)
    assert decoded.shape == clips[i].shape and np.abs(decoded - clips[i]).max() < 1 / 32767
    for beam in BEAMS:
        assert page["files"][str(beam)][i]["text"] == transcriber(clips[i], beam=beam)[0].text
    # The others: Chromium's resampler.
    for clip, samples, want in zip(CLIPS, page["decoded"], clips[: len(CLIPS)], strict=True):
        n = min(len(samples), len(want))
        print(f"{clip.name} decoded by the browser: {len(samples)} samples (soundfile and soxr: {len(want)}), "
              f"max |difference| {np.abs(np.asarray(samples[:n]) - want[:n]).max():.3g}")
    assert [row[:2] for row in page["upload"]] == [[AT_RATE.name, transcriber(str(AT_RATE), beam=4)[0].text]]
    assert page["garbage"].startswith("cannot decode the audio: ") and "\n" not in page["garbage"]
    # A recording passes through the browser's lossy codec and starts wherever the loop was: it must be
    # transcribed, but nothing fixes its text.
    [(source, text, _)] = page["record"]
    print(f"{source}: {text!r}")
    assert source.startswith("recording (")
    assert (tmp_path / "speech.png").stat().st_size > 10_000


def test_search_js_defaults_are_generated_from_the_option_table() -> None:
    """search.js's BUILT_IN and ALIASES are the option table's (format/decoding.py), never a hand copy:
    after changing a row, rerun `python -m s2s_deploy.web.defaults`."""
    text = SEARCH_JS.read_text(encoding="utf-8")
    assert rendered(text) == text, "search.js's defaults are stale: run python -m s2s_deploy.web.defaults"


def test_web_bundle_refuses_a_front_end_the_page_does_not_compute(exports, tmp_path: Path) -> None:
    """An image model gets one line rather than a page that cannot run."""
    featured = [e.plugin.name for e in REGISTRY.entries()
                if e.plugin.source_spec(e.plugin.preset()).frontend
                and e.plugin.source_spec(e.plugin.preset()).frontend["kind"] not in PAGE_FRONTENDS]
    assert featured, "every front end has a page: this test has nothing to refuse"
    _, manifest = exports.get(featured[0])
    with pytest.raises(S2SError, match="features, which the browser page does not compute: text models and"):
        write_web_bundle(manifest.directory, tmp_path)
    assert not (manifest.directory / PAGE_FILES[0]).exists()


def gru_and_dist(exports: Any, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the gru export (a page is written into it) and an onnxruntime-web ``dist`` folder whose
    files hold their own names."""
    _, manifest = exports.get("gru")
    dist = tmp_path / "dist"
    dist.mkdir()
    for name in ORT_FILES:
        (dist / name).write_bytes(name.encode())
    folder = tmp_path / "gru"
    shutil.copytree(manifest.directory, folder)
    return folder, dist


def test_web_bundle_copies_the_page_and_refuses_to_overwrite(exports, tmp_path: Path) -> None:
    folder, dist = gru_and_dist(exports, tmp_path)
    write_web_bundle(folder, dist)
    for name in PAGE_FILES:
        assert (folder / name).read_bytes() == (ROOT / "s2s_deploy" / "web" / name).read_bytes()
    for name in ORT_FILES:
        assert (folder / ORT_DIR / name).read_bytes() == name.encode()
    with pytest.raises(S2SError, match="already exists; pass --force"):
        write_web_bundle(folder, dist)
    write_web_bundle(folder, dist, force=True)
    (dist / ORT_FILES[-1]).unlink()
    with pytest.raises(S2SError, match=f"lacks onnxruntime-web's {ORT_FILES[-1]}"):
        write_web_bundle(folder, dist, force=True)


def test_web_command_says_what_is_missing_in_one_line(exports, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from s2s_deploy.cli import main

    _, manifest = exports.get("gru")
    folder = tmp_path / "gru"
    shutil.copytree(manifest.directory, folder)
    result = CliRunner().invoke(main, ["web", str(folder), "--ort-web", str(tmp_path / "nowhere")])
    assert result.exit_code == 1
    assert result.output.strip() == f"error: {tmp_path / 'nowhere'} lacks onnxruntime-web's {ORT_FILES[0]}"
    assert not (folder / "index.html").exists()
