"""PyTorch vs ONNX Runtime on the same inputs: per-step log-probs and whole search results.

Token disagreement is a failure, never a warning: it is what users would see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from s2s_deploy.architecture.registry import exported_plugin
from s2s_deploy.errors import CheckpointError
from s2s_deploy.export.checkpoint import build_model, load_checkpoint
from s2s_deploy.export.checks import forward_step_comparison
from s2s_deploy.export.contract import Seq2SeqModel
from s2s_deploy.export.tolerance import NO_DIFF, StepDiff, StepTolerance, plugin_tolerance
from s2s_deploy.export.torch_backend import TorchBackend
from s2s_deploy.format.manifest import Manifest, sha256_of
from s2s_deploy.frontends import AUDIO, IMAGE, FrontEnd
from s2s_deploy.runtime.backend import Backend
from s2s_deploy.runtime.decoding import SearchConfig, resolve
from s2s_deploy.runtime.features import pad_features
from s2s_deploy.runtime.scoring import teacher_forced
from s2s_deploy.runtime.search import SearchEngine, StepLoop, search
from s2s_deploy.runtime.translator import encode_batch
from s2s_deploy.transforms.quantize import MIN_TOKEN_AGREEMENT


@dataclass(frozen=True)
class SearchAgreement:
    mode: str
    total: int
    identical: int
    max_score_diff: float
    mismatches: tuple[tuple[str, str, str], ...] = field(default=())

    @property
    def agreement(self) -> float:
        return self.identical / self.total


@dataclass(frozen=True)
class ParityReport:
    """``tolerance`` is None for a quantised export: it is judged on token agreement alone.
    ``forward_step`` compares the PyTorch model's teacher-forced ``forward`` with its own
    step-by-step ``decode_step`` (a cached step that forgets a layer fails here, not in users' hands)."""

    tolerance: StepTolerance | None
    step: StepDiff
    searches: tuple[SearchAgreement, ...]
    inputs: int
    min_token_agreement: float = 1.0
    forward_step: StepDiff | None = None
    forward_tolerance: StepTolerance | None = None
    batch: SearchAgreement | None = None
    batch_must_agree: bool = True

    @property
    def atol(self) -> float | None:
        return None if self.tolerance is None else self.tolerance.atol

    @property
    def step_max_abs_diff(self) -> float:
        return self.step.max_abs_diff

    @property
    def log_probs_ok(self) -> bool:
        return self.tolerance is None or self.step.worst <= 1.0

    @property
    def forward_ok(self) -> bool:
        return self.forward_step is None or self.forward_step.worst <= 1.0

    @property
    def passed(self) -> bool:
        batch_ok = self.batch is None or not self.batch_must_agree or self.batch.identical == self.batch.total
        return (self.log_probs_ok and self.forward_ok and batch_ok
                and all(s.agreement >= self.min_token_agreement for s in self.searches))


def torch_backend_for(
    manifest: Manifest, checkpoint: str | Path | None = None, device: str = "cpu"
) -> TorchBackend:
    """Rebuild the PyTorch original of an export from the checkpoint it was exported from."""
    plugin = exported_plugin(manifest.plugin, manifest.plugin_origin)
    recorded = manifest.checkpoint
    if checkpoint is None and recorded is None:
        raise CheckpointError(f"{manifest.directory} records no checkpoint: pass --checkpoint FILE")
    path = Path(checkpoint) if checkpoint else manifest.directory / recorded.file
    if checkpoint is None and not recorded.included:
        raise CheckpointError(f"{manifest.directory} was exported without its checkpoint: pass --checkpoint FILE "
                              f"(the one with sha256 {recorded.sha256[:16]}...)")
    if checkpoint is None and not path.is_file():
        raise CheckpointError(f"{path} is missing: restore it, or pass --checkpoint FILE")
    if checkpoint is None and sha256_of(path) != recorded.sha256:
        raise CheckpointError(f"{path} is not the checkpoint this folder was exported from (sha256 differs)")
    loaded = load_checkpoint(path)
    model = build_model(loaded, plugin)
    if loaded.tgt_vocab != manifest.tgt_vocab or loaded.src_vocab != manifest.src_vocab:
        raise CheckpointError(f"{path} has different vocabularies from the export in {manifest.directory}")
    return TorchBackend(plugin, model, loaded.config, loaded.tgt_vocab, device=device)


Encode = Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]
"""Parity inputs (texts, or labels of audio clips) → the encoder's padded ``src`` and ``src_len``."""


def text_encoder(manifest: Manifest) -> Encode:
    return lambda texts: encode_batch(list(texts), manifest.src_vocab, manifest.max_source_length)


def feature_encoder(manifest: Manifest, inputs: dict[str, Any]) -> Encode:
    """Inputs by label (audio at the front end's rate, or images), through the export's own front end,
    padded along the frames."""
    from s2s_deploy.frontends.source import checked_features, frontend_for

    source = manifest.encoder_input
    frontend = frontend_for(source)
    featurised = {label: checked_features(source, frontend(item), label) for label, item in inputs.items()}
    return lambda labels: pad_features([featurised[label] for label in labels], source)


def feature_inputs(frontend: FrontEnd, paths: Sequence[str] | None = None) -> dict[str, Any]:
    """Parity inputs for an export that reads features: the files ``paths`` lists, read as the front
    end's medium, or seeded synthetic ones (``SYNTHETIC``)."""
    from s2s_deploy.frontends import load_audio, load_image

    if paths is None:
        return SYNTHETIC[frontend.reads](frontend)
    if frontend.reads == AUDIO:
        return {path: load_audio(path, frontend.sampling_rate) for path in paths}
    return {path: load_image(path) for path in paths}


def synthetic_clips(sampling_rate: int, count: int = 16, seed: int = 0, seconds: tuple[float, float] = (0.3, 1.5),
                    label: str = "synthetic clip") -> dict[str, np.ndarray]:
    """Seeded parity audio for an export that reads features and stores no samples: chirps of
    ``seconds`` (0.3-1.5 s) in noise of varied levels; shapes and decoding rules, not words, are what
    they test. Timestamped parity adds a few longer than the window, under another ``label``."""
    rng = np.random.default_rng(seed)
    clips = {}
    for i in range(count):
        t = np.arange(int(sampling_rate * rng.uniform(*seconds))) / sampling_rate
        f0, f1 = rng.uniform(100, min(3000, sampling_rate / 3), 2)
        chirp = 0.3 * np.sin(2 * np.pi * (f0 + (f1 - f0) * t / (2 * t[-1])) * t)
        clips[f"{label} {i + 1}"] = (chirp + rng.normal(0, rng.uniform(0.01, 0.2), len(t))).astype(np.float32)
    return clips


def synthetic_images(count: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded parity images: RGB gradients of 16-96 pixels a side under uniform noise, with a dark band
    across some; the front end resizes them to the model's size."""
    rng = np.random.default_rng(seed)
    images = {}
    for i in range(count):
        height, width = (int(n) for n in rng.integers(16, 97, 2))
        y, x = np.mgrid[0:height, 0:width]
        slope = rng.uniform(-3, 3, (2, 3))
        pixels = 128 + x[..., None] * slope[0] + y[..., None] * slope[1] + rng.normal(0, rng.uniform(5, 60),
                                                                                       (height, width, 3))
        if i % 2:
            top = int(rng.integers(0, height))
            pixels[top : top + max(1, height // 5)] *= 0.2
        images[f"synthetic image {i + 1}"] = np.clip(pixels, 0, 255).astype(np.uint8)
    return images


SYNTHETIC: dict[str, Callable[[Any], dict[str, Any]]] = {
    AUDIO: lambda frontend: synthetic_clips(frontend.sampling_rate),
    IMAGE: lambda frontend: synthetic_images(),
}
"""Seeded parity inputs by the front end's medium."""


def check_parity(
    manifest: Manifest, reference: Backend, candidate: Backend, sources: Sequence[str], *,
    beam_size: int = 4, max_len: int = 64, atol: float | None = None, rtol: float | None = None,
    batch_size: int = 16, reference_search: SearchEngine | None = None, encode: Encode | None = None,
) -> ParityReport:
    """Tokens of ``reference_search`` (default: our search over ``reference``) against our search
    over ``candidate``, greedy and beam, and each step's log-probs of ``reference`` against
    ``candidate``'s. With a ``reference_search`` of its own (``generate``), both sides decode at the
    export's own settings (the manifest's ``search`` block), but the beam size and ``max_len``, and
    untimed (export/timestamp_parity.py checks timestamps); without one, plain searches from the
    export's decoder prompt. ``encode``: how ``sources`` become the encoder's input (default: texts
    through the source vocabulary)."""
    plugin = exported_plugin(manifest.plugin, manifest.plugin_origin)
    quantised = manifest.quantization is not None
    tolerance = None if quantised and atol is None and rtol is None else plugin_tolerance(plugin, atol, rtol)
    forward_tolerance = plugin_tolerance(plugin, atol, rtol)
    encode = encode or text_encoder(manifest)
    prompt = tuple(manifest.search.get("decoder_prompt", ()))
    if reference_search is None:
        reference_search = StepLoop(reference)
        modes = [(name, SearchConfig(beam, 1, max_len, decoder_prompt=prompt))
                 for name, beam in (("greedy", 1), (f"beam{beam_size}", beam_size))]
    else:
        modes = [(name, resolve(manifest, {"beam_size": beam, "n_best": 1, "max_len": max_len, "timestamps": False}))
                 for name, beam in (("greedy", 1), (f"beam{beam_size}", beam_size))]
    agreements = {name: [0, 0.0, []] for name, _ in modes}
    step_diff, forward_diff = NO_DIFF, NO_DIFF
    model = getattr(reference, "model", None)  # a PyTorch reference: check its step against its forward
    for start in range(0, len(sources), batch_size):
        chunk = list(sources[start : start + batch_size])
        src, src_len = encode(chunk)
        for name, config in modes:
            want, got = reference_search.search(src, src_len, config), search(candidate, src, src_len, config)
            tally = agreements[name]
            for text, w, g in zip(chunk, want, got, strict=True):
                if w[0].tokens == g[0].tokens:
                    tally[0] += 1
                    if np.isfinite(w[0].score):  # generate reports no greedy score
                        tally[1] = max(tally[1], abs(w[0].score - g[0].score))
                else:
                    decode = manifest.tgt_vocab.decode
                    tally[2].append((text, decode(w[0].tokens), decode(g[0].tokens)))
            if name == "greedy":  # teacher-forced after the decoder prompt each sentence was fed (its language)
                forced = [(*h[0].prompt, *h[0].tokens) for h in want]
                step_diff = step_diff.merge(
                    forced_step_comparison(reference, candidate, src, src_len, forced, tolerance or forward_tolerance))
                if isinstance(model, Seq2SeqModel):
                    forward_diff = forward_diff.merge(
                        forward_step_comparison(model, reference, src, src_len, forced, forward_tolerance))
    searches = tuple(
        SearchAgreement(name, len(sources), tally[0], tally[1], tuple(tally[2]))
        for name, tally in agreements.items()
    )
    per_tensor = quantised and manifest.quantization.per_tensor  # batch-dependent by choice
    # the token agreement a quantised copy must keep comes from its kind, not from the manifest under test
    min_agreement = MIN_TOKEN_AGREEMENT[manifest.quantization.kind] if quantised else 1.0
    return ParityReport(tolerance, step_diff, searches, len(sources), min_agreement,
                        forward_diff if isinstance(model, Seq2SeqModel) else None, forward_tolerance,
                        batch_agreement(manifest, candidate, sources, max_len, encode), not per_tensor)


BATCH_ROWS = 32


def batch_agreement(manifest: Manifest, backend: Backend, sources: Sequence[str], max_len: int,
                    encode: Encode | None = None) -> SearchAgreement:
    """Greedy tokens of ``backend`` in batches of 32 against one sentence at a time: a
    sentence's translation must not depend on its batchmates."""
    encode = encode or text_encoder(manifest)
    prompt = tuple(manifest.search.get("decoder_prompt", ()))
    config, identical, mismatches = SearchConfig(1, 1, max_len, decoder_prompt=prompt), 0, []
    for start in range(0, len(sources), BATCH_ROWS):
        chunk = list(sources[start : start + BATCH_ROWS])
        together = search(backend, *encode(chunk), config)
        for text, hyps in zip(chunk, together, strict=True):
            alone = search(backend, *encode([text]), config)
            if alone[0][0].tokens == hyps[0].tokens:
                identical += 1
            else:
                decode = manifest.tgt_vocab.decode
                mismatches.append((text, decode(alone[0][0].tokens), decode(hyps[0].tokens)))
    return SearchAgreement(f"batch {BATCH_ROWS}", len(sources), identical, 0.0, tuple(mismatches))


def forced_step_diff(
    reference: Backend, candidate: Backend, src: np.ndarray, src_len: np.ndarray,
    targets: Sequence[Sequence[int]],
) -> float:
    """Max |Δ log p| where a search can act, teacher-forcing the same tokens through both."""
    return forced_step_comparison(reference, candidate, src, src_len, targets, StepTolerance()).max_abs_diff


def forced_step_comparison(
    reference: Backend, candidate: Backend, src: np.ndarray, src_len: np.ndarray,
    targets: Sequence[Sequence[int]], tolerance: StepTolerance,
) -> StepDiff:
    """Teacher-force the same tokens through both backends; compare every step's log-probs
    where a search can act (``StepTolerance``)."""
    worst = NO_DIFF
    for step in teacher_forced([reference, candidate], src, src_len, targets):
        worst = worst.merge(tolerance.compare(*step.log_probs))
    return worst
