"""The Starlette application: POST /translate (text exports) or POST /transcribe (exports whose
encoder reads audio), GET /health, GET /metadata.

Status codes: 400 for a malformed request or bad options (one line in ``error``), 413 for a
request that can never fit one batch, 503 when the queue is full. Uvicorn stops taking
connections on SIGTERM and lets requests in flight finish before the lifespan closes the batcher.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from s2s_deploy.errors import S2SError
from s2s_deploy.format.decoding import OPTIONS as DECODING_OPTIONS
from s2s_deploy.format.decoding import Code
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.transcriber import Transcriber
from s2s_deploy.runtime.translator import Translator, translate, unpadded
from s2s_deploy.serve.batcher import Batcher, BatchLimits, Decode, QueueFullError, TooLargeError

CONFIG_ENV = "S2S_DEPLOY_SERVE_CONFIG"
"""How ``--workers N`` hands the settings to each worker process (uvicorn imports the factory)."""

SWITCHES = ("timestamps", "condition_on_previous_text", "suppress_blank")
REALS = ("compression_ratio_threshold", "log_prob_threshold", "no_speech_threshold", "prompt_reset_on_temperature")
"""Numbers passed on to resolve, which checks their ranges (``alpha`` is checked here, as before)."""
WHOLES = ("best_of", "seed")
OPTIONS = ("beam", "n_best", "alpha", "max_len", "target_lang", "task", "timestamps", "prompt", "preset",
           "temperature", "initial_prompt", *WHOLES, *REALS, *SWITCHES[1:])
CODES = tuple(o.name for o in DECODING_OPTIONS if isinstance(o.kind, Code) and o.name in OPTIONS)
"""Options whose value is a code (a string), as the option table kinds them."""
STRINGS = (*CODES, "prompt", "preset", "temperature", "initial_prompt")
"""Options whose value is a string (codes, a prompt's text, the preset's name, the temperatures
comma-separated): the rest are numbers or switches."""
MAX_BODY_BYTES = 1 << 20
"""A larger JSON body is refused (413) before it is read."""
MAX_AUDIO_BYTES = 32 << 20
"""A larger upload to /transcribe is refused (413) before it is read: 16-bit 16 kHz WAV holds 17 minutes."""


@dataclass(frozen=True)
class ServeConfig:
    export_dir: str
    limits: BatchLimits = field(default_factory=BatchLimits)
    device: str = "cpu"
    threads: int | None = None
    max_beam: int = 16

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> ServeConfig:
        raw = json.loads(os.environ[CONFIG_ENV])
        return cls(**{**raw, "limits": BatchLimits(**raw["limits"])})


class BadRequestError(S2SError):
    pass


def _integer(body: dict[str, Any], key: str, low: int, high: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f">= {low}"
        raise BadRequestError(f"{key!r} must be an integer {bounds}")
    return value


def parse_options(fields: dict[str, Any], translator: Translator, max_beam: int) -> SearchConfig:
    """The request's options over the export's own defaults, or a BadRequestError naming the first problem."""
    manifest = translator.manifest
    beam = _integer(fields, "beam", 1, min(max_beam, len(manifest.tgt_vocab) - 1))
    n_best = _integer(fields, "n_best", 1, None)
    max_len = _integer(fields, "max_len", 1, manifest.max_target_length)
    alpha = fields.get("alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
                              or not math.isfinite(alpha) or alpha < 0):
        raise BadRequestError("'alpha' must be a finite number >= 0")
    strings = {key: fields.get(key) for key in STRINGS}
    for key, value in strings.items():
        if value is not None and not isinstance(value, str):
            raise BadRequestError(f"{key!r} must be a {'code ' if key in CODES else ''}string")
    switches = {key: fields.get(key) for key in SWITCHES}
    for key, value in switches.items():
        if value is not None and not isinstance(value, bool):
            raise BadRequestError(f"{key!r} must be true or false")
    wholes = {key: _integer(fields, key, 0, None) for key in WHOLES}
    reals = {key: fields.get(key) for key in REALS}
    for key, value in reals.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise BadRequestError(f"{key!r} must be a number")
    # what the request leaves out: the export's
    config = translator.search_config(beam, n_best, max_len, alpha, **switches, **strings, **wholes, **reals)
    if config.beam_size > max_beam:
        raise BadRequestError(f"the export's default beam {config.beam_size} exceeds this server's largest, "
                              f"{max_beam}: name a smaller 'beam'")
    return config


def parse_request(body: Any, translator: Translator, max_beam: int) -> tuple[list[str], SearchConfig]:
    """texts and a SearchConfig from the JSON body, or a BadRequestError naming the first problem."""
    if not isinstance(body, dict):
        raise BadRequestError("the body must be a JSON object with 'texts'")
    unknown = sorted(set(body) - {"texts", *OPTIONS})
    if unknown:
        raise BadRequestError(f"unknown field {unknown[0]!r}; known: texts, {', '.join(OPTIONS)}")
    texts = body.get("texts")
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise BadRequestError("'texts' must be a non-empty list of strings")
    for number, text in enumerate(texts, 1):
        if not text.strip():
            raise BadRequestError(f"text {number} is empty")
    return texts, parse_options(body, translator, max_beam)


def parse_query(query: dict[str, str], translator: Translator, max_beam: int) -> SearchConfig:
    """/transcribe's options, given as query parameters (the body is the audio)."""
    unknown = sorted(set(query) - set(OPTIONS))
    if unknown:
        raise BadRequestError(f"unknown parameter {unknown[0]!r}; known: {', '.join(OPTIONS)}")
    fields: dict[str, Any] = {}
    for key, text in query.items():
        try:
            if key in SWITCHES:
                if text not in ("true", "false"):
                    raise BadRequestError(f"{key!r} must be true or false, not {text!r}")
                fields[key] = text == "true"
                continue
            fields[key] = text if key in STRINGS else float(text) if key in ("alpha", *REALS) else int(text)
        except ValueError:
            raise BadRequestError(f"{key!r} must be a number, not {text!r}") from None
    return parse_options(fields, translator, max_beam)


def text_lengths(translator: Translator, texts: list[str]) -> list[int]:
    """Each text's source length in tokens; a text over the model's limit can never fit (413)."""
    manifest = translator.manifest
    lengths = [len(manifest.src_vocab.encode(text)) for text in texts]
    limit = manifest.max_source_length
    for number, length in enumerate(lengths, 1):
        if limit is not None and length > limit:
            raise TooLargeError(f"text {number} has {length} tokens; the model's limit is {limit}")
    return lengths


def text_decoder(translator: Translator) -> Decode:
    manifest = translator.manifest

    def decode(texts: list[str], config: SearchConfig) -> list[Any]:
        return translate(translator.engine, texts, manifest.src_vocab, manifest.tgt_vocab, config,
                         batch_size=len(texts), max_source_length=manifest.max_source_length,
                         exact=unpadded(manifest))

    return decode


def _hypotheses(result: Any) -> dict[str, Any]:
    return {"text": result.text, "score": result.score,
            "hypotheses": [{"text": text, "score": score} for text, score in result.hypotheses]}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _refusal(exc: S2SError) -> JSONResponse:
    """413 for what can never fit a batch, 503 for a full queue, 400 for anything else the request got wrong."""
    status = 413 if isinstance(exc, TooLargeError) else 503 if isinstance(exc, QueueFullError) else 400
    return _error(status, str(exc))


def _declared_length(request: Request, limit: int) -> int | None:
    declared = request.headers.get("content-length", "")
    return int(declared) if declared.isdigit() and int(declared) <= limit else None


def create_app(config: ServeConfig) -> Starlette:
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The event loop parses requests while a batch runs: idle decoder threads must not spin.
        translator = Translator(config.export_dir, device=config.device, threads=config.threads, spin=False)
        transcriber = Transcriber(translator) if translator.manifest.encoder_input.is_features else None
        batcher = Batcher(transcriber.decode if transcriber else text_decoder(translator), config.limits)
        batcher.start()
        # One front-end thread: a burst of uploads waits here for its features, rather than
        # each taking a thread of its own beside the --threads the decoder was given.
        front_end = ThreadPoolExecutor(max_workers=1, thread_name_prefix="s2s-front-end")
        state.update(translator=translator, transcriber=transcriber, batcher=batcher, front_end=front_end)
        yield
        await batcher.aclose()
        front_end.shutdown(wait=True)

    async def translate_endpoint(request: Request) -> JSONResponse:
        translator, batcher = state["translator"], state["batcher"]
        if state["transcriber"] is not None:
            return _error(400, "this export reads audio: POST the audio file to /transcribe")
        if _declared_length(request, MAX_BODY_BYTES) is None:
            return _error(413, f"the body must be at most {MAX_BODY_BYTES} bytes with a Content-Length")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the body is not valid JSON")
        try:
            texts, search = parse_request(body, translator, config.max_beam)
            results = await batcher.submit(texts, text_lengths(translator, texts), search)
        except S2SError as exc:
            return _refusal(exc)
        return JSONResponse({"translations": [{"source": r.source, **_hypotheses(r)} for r in results]})

    async def transcribe_endpoint(request: Request) -> JSONResponse:
        """The body is one audio file (any format soundfile reads); options are query parameters."""
        transcriber, batcher = state["transcriber"], state["batcher"]
        if transcriber is None:
            return _error(400, "this export translates text: POST JSON to /translate")
        if _declared_length(request, MAX_AUDIO_BYTES) is None:
            return _error(413, f"the audio must be at most {MAX_AUDIO_BYTES} bytes with a Content-Length")
        data = await request.body()
        if not data:
            return _error(400, "the body is empty: send the audio file's bytes")
        try:
            search = parse_query(dict(request.query_params), transcriber.translator, config.max_beam)
            # the front end (decode, resample, features) runs beside the batch thread, not in the event loop
            features = await asyncio.get_running_loop().run_in_executor(state["front_end"], transcriber.features,
                                                                        data, "from the upload", True)
            frames = int(features.shape[transcriber.source.length_axis - 1])
            if transcriber.source.length_axis == len(transcriber.source.shape):  # a long clip runs a window at a time
                frames = min(frames, transcriber.window([features]))
            [result] = await batcher.submit([features], [frames], search)
        except S2SError as exc:
            return _refusal(exc)
        timed = {"segments": [s.row() for s in result.segments]} if search.timestamps else {}
        return JSONResponse({"transcriptions": [{**_hypotheses(result), "language": result.language, **timed}]})

    async def health(request: Request) -> JSONResponse:
        batcher: Batcher = state["batcher"]
        return JSONResponse({"status": "ok", "pid": os.getpid(), "queued": batcher.queued,
                             **asdict(batcher.stats)})

    async def metadata(request: Request) -> JSONResponse:
        translator: Translator = state["translator"]
        manifest = translator.manifest
        return JSONResponse({
            "plugin": {"name": manifest.plugin, "version": manifest.plugin_version,
                       "description": manifest.plugin_description},
            "vocab_size": {"source": len(manifest.src_vocab), "target": len(manifest.tgt_vocab)},
            "endpoint": "/transcribe" if state["transcriber"] is not None else "/translate",
            "limits": {"max_source_length": manifest.max_source_length,
                       "max_target_length": manifest.max_target_length, "max_beam": config.max_beam},
            "batching": asdict(config.limits),
            "search": dict(manifest.search),
            "decoding": asdict(translator.search_config()),  # what a request that names no option decodes with
            "provider": translator.notice,
        })

    routes = [Route("/translate", translate_endpoint, methods=["POST"]),
              Route("/transcribe", transcribe_endpoint, methods=["POST"]),
              Route("/health", health), Route("/metadata", metadata)]
    return Starlette(routes=routes, lifespan=lifespan)


def app_from_env() -> Starlette:
    """The factory uvicorn imports in each worker process (``--workers N``)."""
    return create_app(ServeConfig.from_env())
