"""``s2s-deploy serve``: the HTTP service (needs the ``[serve]`` extra)."""

from __future__ import annotations

import os

import click

from s2s_deploy.cli.group import main
from s2s_deploy.errors import S2SError


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def split_threads(workers: int, threads: int | None, cores: int) -> int:
    """Each worker process runs one batch at a time on ``threads`` ONNX Runtime threads, so the
    server uses workers × threads cores, and more is refused. By default each worker leaves one of
    its share of the cores to its event loop (HTTP, JSON): on 2 cores, an intra-op pool whose idle
    threads may not spin waited seconds per batch for its sleeping threads to wake (measured,
    benchmarks/NOTES.md), one thread did not."""
    if workers > cores:
        raise S2SError(f"--workers {workers} exceed the {cores} available cores")
    if threads is None:
        return max(1, cores // workers - 1)
    if workers * threads > cores:
        raise S2SError(f"--workers {workers} × --threads {threads} = {workers * threads} threads exceed the "
                       f"{cores} available cores")
    return threads


@main.command("serve")
@click.argument("export_dir", type=click.Path())
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port to listen on.")
@click.option("--workers", type=click.IntRange(1), default=1, show_default=True,
              help="Processes, each with its own model and batcher.")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="ONNX Runtime threads per worker [default: available cores / workers - 1, at least 1]; "
                   "workers × threads may not exceed the cores.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="cpu", show_default=True,
              help="ONNX Runtime device; auto uses CUDA only if it works.")
@click.option("--window-ms", type=click.FloatRange(0), default=5.0, show_default=True,
              help="How long a batch waits for more requests after its first one.")
@click.option("--max-batch", type=click.IntRange(1), default=64, show_default=True, help="Sentences per batch.")
@click.option("--max-tokens", type=click.IntRange(1), default=16384, show_default=True,
              help="Per batch: items × longest source (tokens, or frames for audio) × beam; a larger request gets 413.")
@click.option("--max-queue", type=click.IntRange(1), default=1024, show_default=True,
              help="Sentences waiting per worker; beyond it requests get 503.")
@click.option("--max-beam", type=click.IntRange(1), default=16, show_default=True,
              help="Largest beam a request may ask for.")
@click.option("--languages", default=None, metavar="SRC:TGT",
              help="The language pair LibreTranslate requests name (e.g. en:fr), for a text export that lists no "
                   "language codes [default: the pair its training record names].")
@click.option("--max-duration", type=click.FloatRange(0, min_open=True), default=None,
              help="Longest audio upload in seconds, judged from its header before it is decoded; a longer one "
                   "gets 413 [default: serve.app.MAX_AUDIO_SECONDS, 900].")
@click.option("--log-level", type=click.Choice(["warning", "info", "debug"]), default="warning", show_default=True,
              help="What goes to stderr; debug also logs each streamed window as it is decoded and each line as it "
                   "is sent.")
def serve_command(export_dir: str, host: str, port: int, workers: int, threads: int | None, device: str,
                  window_ms: float, max_batch: int, max_tokens: int, max_queue: int, max_beam: int,
                  languages: str | None, max_duration: float | None, log_level: str) -> None:
    """Serve an export over HTTP, with dynamic batching.

    POST /translate (JSON texts), or POST /transcribe (an audio file) for an export that reads audio;
    GET /health, GET /metadata. Beside them, OpenAI's audio API (POST /v1/audio/transcriptions and
    /v1/audio/translations, GET /v1/models) and LibreTranslate's (its form of POST /translate, GET /languages).
    """
    try:
        import python_multipart  # noqa: F401  (the OpenAI-compatible uploads, LibreTranslate's forms)
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise S2SError(f"serve needs the [serve] extra: pip install \"s2s-deploy[serve]\" ({exc.name} missing)") \
            from exc
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.runtime.decoding import resolve
    from s2s_deploy.serve.app import CONFIG_ENV, ServeConfig
    from s2s_deploy.serve.batcher import BatchLimits
    from s2s_deploy.serve.libretranslate import parse_pair

    if languages is not None:
        parse_pair(languages)  # a bad pair fails here, once, not in every worker

    manifest = load_manifest(export_dir)  # a bad folder fails here, once, not in every worker
    if manifest.encoder_input.is_features:
        from s2s_deploy.frontends.media import MEDIA
        from s2s_deploy.frontends.source import medium_for

        medium = medium_for(manifest.encoder_input)
        if medium.endpoint is None:
            served = ", ".join(m.name for m in MEDIA.values() if m.endpoint)
            raise S2SError(f"{export_dir} reads {medium.name} input, which serve does not take yet (it takes text "
                           f"and {served}): decode it with {medium.readers}")
    beam = resolve(manifest).beam_size
    if beam > max_beam:
        raise S2SError(f"{export_dir} decodes with beam {beam} by default (its search.beam_size), over --max-beam "
                       f"{max_beam}: raise --max-beam")
    cores = available_cores()
    per_worker = split_threads(workers, threads, cores)
    config = ServeConfig(str(os.path.abspath(export_dir)), BatchLimits(window_ms, max_batch, max_tokens, max_queue),
                         device, per_worker, max_beam, log_level=log_level, languages=languages,
                         **({"max_duration": max_duration} if max_duration is not None else {}))
    os.environ[CONFIG_ENV] = config.to_env()
    click.echo(f"serving {export_dir} on http://{host}:{port} with {workers} worker(s) × {per_worker} thread(s) "
               f"({cores} cores)", err=True)
    from s2s_deploy.serve.nodelay import NoDelayH11Protocol

    uvicorn.run("s2s_deploy.serve.app:app_from_env", factory=True, host=host, port=port, workers=workers,
                log_level=log_level, timeout_graceful_shutdown=30, http=NoDelayH11Protocol)
