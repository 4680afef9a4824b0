"""Copy the browser page and onnxruntime-web's wasm build beside an export, so that any static
file server serves a translator (or, for an export that reads audio, a transcriber).
onnxruntime-web itself comes from npm (never from this package)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import write_atomically
from s2s_deploy.format.manifest import load_manifest

PAGE_FILES = ("index.html", "app.js", "frontend.js", "search.js")
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


def write_web_bundle(export_dir: str | Path, dist: str | Path | None = None, force: bool = False) -> list[Path]:
    """The page files into ``export_dir`` and onnxruntime-web into ``export_dir/ort``; refuses to
    replace existing files unless ``force``. Returns the paths written."""
    manifest = load_manifest(export_dir)  # a bad folder fails before anything is written
    frontend = (manifest.encoder_input.frontend or {}).get("kind")
    if manifest.encoder_input.is_features and frontend not in PAGE_FRONTENDS:
        raise S2SError(f"{manifest.directory} reads {frontend} features, which the browser page does not compute: "
                       f"text models and the {' and '.join(PAGE_FRONTENDS)} front ends only")
    folder = find_dist(dist)
    directory = manifest.directory
    targets = [directory / name for name in PAGE_FILES] + [directory / ORT_DIR / name for name in ORT_FILES]
    existing = [t for t in targets if t.exists()]
    if existing and not force:
        raise S2SError(f"{existing[0]} already exists; pass --force to replace the page")
    (directory / ORT_DIR).mkdir(exist_ok=True)
    page = resources.files("s2s_deploy.web")
    for name in PAGE_FILES:
        write_atomically(directory / name, page.joinpath(name).read_bytes())
    for name in ORT_FILES:
        write_atomically(directory / ORT_DIR / name, (folder / name).read_bytes())
    return targets
