"""The Starlette application: POST /translate (text exports) or POST /transcribe (exports whose
encoder reads audio), GET /health, GET /metadata; beside them the OpenAI-compatible audio API
(openai_api.py: /v1/audio/transcriptions, /v1/audio/translations, /v1/models) and the
LibreTranslate-compatible text API (libretranslate.py: its form of POST /translate, GET /languages).

Status codes: 400 for a malformed request or bad options (one line in ``error``), 413 for a
request that can never fit one batch or audio longer than ``max_duration`` (judged from the header,
before decoding), 503 when the queue is full. /transcribe takes the file's bytes as the body, or a
multipart form's ``file`` field. Uvicorn stops taking
connections on SIGTERM and lets requests in flight finish before the lifespan closes the batcher.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import json
import logging
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from s2s_deploy.errors import S2SError
from s2s_deploy.format.decoding import BY_NAME, Ids, Real, Switch, Whole, shown
from s2s_deploy.format.decoding import OPTIONS as TABLE
from s2s_deploy.frontends.vad import VadOptions
from s2s_deploy.runtime.decoding import DecodingError, SearchConfig
from s2s_deploy.runtime.transcriber import Transcriber
from s2s_deploy.runtime.translator import Translator, translate
from s2s_deploy.serve.batcher import Batcher, BatchLimits, Decode
from s2s_deploy.serve.libretranslate import libretranslate_routes
from s2s_deploy.serve.openai_api import openai_routes
from s2s_deploy.serve.service import (
    LOG,
    Clip,
    Reading,
    Stream,
    refusal_status,
    transcribe_upload,
    translate_texts,
    upload_decoder,
)

CONFIG_ENV = "S2S_DEPLOY_SERVE_CONFIG"
"""How ``--workers N`` hands the settings to each worker process (uvicorn imports the factory)."""

OPTIONS = {"beam": "beam_size", "n_best": "n_best", "alpha": "alpha", "max_len": "max_len",
           "target_lang": "target_lang", "task": "task", "timestamps": "timestamps", "prompt": "prompt",
           **{name: name for name in ("preset", "temperature", "best_of", "seed", "compression_ratio_threshold",
                                      "log_prob_threshold", "no_speech_threshold", "condition_on_previous_text",
                                      "initial_prompt", "prompt_reset_on_temperature", "suppress_blank", "batched",
                                      "hallucination_silence_threshold")}}
"""The options a request may name, as ``Translator`` names them, and the table's option each sets
(the temperature fallback's by their own names, as ``transcribe`` takes them)."""
QUERY_OPTIONS = {**OPTIONS, **{option.name: option.name for option in TABLE
                                if option.cli_flag and option.name not in OPTIONS.values()
                                and not (isinstance(option.kind, Ids) and option.kind.strings != "text")}}
"""/transcribe's decoding options (query parameters): every option ``transcribe`` has a flag for, by the
table's name where a request's JSON has no name of its own, but lists of token ids (``--suppress``)."""
VAD_PARAMETERS = {"vad_threshold": ("threshold", float), "vad_neg_threshold": ("neg_threshold", float),
                  "vad_min_speech_ms": ("min_speech_duration_ms", int),
                  "vad_min_silence_ms": ("min_silence_duration_ms", int),
                  "vad_speech_pad_ms": ("speech_pad_ms", int), "vad_max_speech_s": ("max_speech_duration_s", float)}
"""``transcribe``'s ``--vad-*`` flags as query parameters, and the ``VadOptions`` field each sets (which
checks it). ``--vad-model`` has none: a request does not name files on the server."""
READING = ("vad", *VAD_PARAMETERS, "word_timestamps", "stream")
"""/transcribe's parameters that are not decoding options: how the clip is read and answered."""
SPELLED = {option: name for name, option in QUERY_OPTIONS.items()}
MAX_BODY_BYTES = 1 << 20
"""A larger JSON body is refused (413) before it is read."""
MAX_AUDIO_BYTES = 32 << 20
"""A larger upload to /transcribe is refused (413) before it is read: 16-bit 16 kHz WAV holds 17 minutes."""
MAX_AUDIO_SECONDS = 900.0
"""The default longest upload: judged from the header before decoding (413), since a few kilobytes of
header may claim hours, and a long clip holds the front-end thread while it is read."""


@dataclass(frozen=True)
class ServeConfig:
    export_dir: str
    limits: BatchLimits = field(default_factory=BatchLimits)
    device: str = "cpu"
    threads: int | None = None
    max_beam: int = 16
    log_level: str = "warning"
    """``--log-level``: ``debug`` logs each streamed window as it is decoded and each line as it is sent."""
    languages: str | None = None
    """``SRC:TGT`` (``--languages``): the pair LibreTranslate requests name, for an export that lists none."""
    max_duration: float | None = MAX_AUDIO_SECONDS
    """Seconds of audio an upload may hold (None: no limit)."""

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> ServeConfig:
        raw = json.loads(os.environ[CONFIG_ENV])
        return cls(**{**raw, "limits": BatchLimits(**raw["limits"])})


class BadRequestError(S2SError):
    pass


def parse_options(fields: dict[str, Any], translator: Translator, max_beam: int) -> SearchConfig:
    """The request's options over the export's own defaults, checked once, by ``resolve``; a
    BadRequestError names the first problem, and the option as the request names it."""
    try:
        config = translator.search_config(**fields)  # what the request leaves out: the export's
    except DecodingError as exc:
        raise BadRequestError(_spelled(exc)) from None
    if config.beam_size > max_beam:
        whose = "" if fields.get("beam") is not None else "the export's default "
        raise BadRequestError(f"{whose}beam {config.beam_size} exceeds this server's largest, {max_beam}: "
                              "name a smaller 'beam'")
    return config


def _spelled(exc: DecodingError) -> str:
    """resolve's one line, with the option it refuses named as a request names it (``'beam'``)."""
    message = str(exc)
    if exc.option is None or not message.startswith(exc.option):
        return message
    return repr(SPELLED.get(exc.option, exc.option)) + message[len(exc.option):]


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
    return texts, parse_options({key: body[key] for key in OPTIONS if key in body}, translator, max_beam)


def parse_query(query: dict[str, str], translator: Translator, max_beam: int) -> SearchConfig:
    """/transcribe's decoding options, given as query parameters (the body is the audio); the
    parameters of ``READING`` are left to ``parse_reading``."""
    unknown = sorted(set(query) - set(QUERY_OPTIONS) - set(READING))
    if unknown:
        raise BadRequestError(f"unknown parameter {unknown[0]!r}; known: {', '.join([*QUERY_OPTIONS, *READING])}")
    fields = {key: _typed(key, text) for key, text in query.items() if key in QUERY_OPTIONS}
    return parse_options(fields, translator, max_beam)


def parse_reading(query: dict[str, str]) -> tuple[Reading, bool]:
    """/transcribe's ``vad`` (and its ``vad_*`` parameters, checked by ``VadOptions`` as ``transcribe
    --vad``'s are), ``word_timestamps`` and ``stream`` (NDJSON lines); a ``vad_*`` without ``vad=true`` is
    refused, as ``--vad-*`` without ``--vad`` is."""
    switches = {key: _switch(key, query[key]) for key in ("vad", "word_timestamps", "stream") if key in query}
    given = {key: _number(key, query[key], kind) for key, (_, kind) in VAD_PARAMETERS.items() if key in query}
    if given and not switches.get("vad"):
        raise BadRequestError(f"{', '.join(repr(key) for key in given)}: pass vad=true too")
    try:
        vad = VadOptions(**{VAD_PARAMETERS[key][0]: value for key, value in given.items()}) \
            if switches.get("vad") else None
    except S2SError as exc:
        raise BadRequestError(str(exc)) from None
    return Reading(vad, switches.get("word_timestamps", False)), switches.get("stream", False)


def _switch(key: str, text: str) -> bool:
    if text not in ("true", "false"):
        raise BadRequestError(f"{key!r} must be true or false, not {shown(text)}")
    return text == "true"


def _number(key: str, text: str, kind: type) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise BadRequestError(f"{key!r} must be a {'whole ' if kind is int else ''}number, not {shown(text)}") \
            from None


def _typed(key: str, text: str) -> Any:
    """A query parameter's text as the JSON value its option's kind takes (resolve then checks it)."""
    kind = BY_NAME[QUERY_OPTIONS[key]].kind
    if isinstance(kind, Switch):
        if text not in ("true", "false"):
            raise BadRequestError(f"{key!r} must be true or false, not {shown(text)}")
        return text == "true"
    if not isinstance(kind, Whole | Real):
        return text
    try:
        return int(text) if isinstance(kind, Whole) else float(text)
    except ValueError:
        raise BadRequestError(f"{key!r} must be a number, not {shown(text)}") from None


def multipart_file(content_type: str, body: bytes) -> bytes:
    """The ``file`` field of a browser-style upload (``curl -F file=@clip.flac``), parsed with the standard
    library; anything else is one line with the two ways to send audio."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    parts = list(message.iter_parts()) if message.is_multipart() else []
    found = [part for part in parts if part.get_param("name", header="content-disposition") == "file"]
    if not found:
        raise BadRequestError("a multipart upload must hold the audio in a field named 'file' "
                              "(curl -F file=@clip.flac), or send the file's bytes as the body "
                              "(curl --data-binary @clip.flac)")
    return found[0].get_payload(decode=True) or b""


def text_decoder(translator: Translator) -> Decode:
    manifest = translator.manifest

    def decode(texts: list[str], config: SearchConfig) -> list[Any]:
        return translate(translator.engine, texts, manifest.src_vocab, manifest.tgt_vocab, config,
                         batch_size=len(texts), max_source_length=manifest.max_source_length,
                         padding=translator.padding)

    return decode


def transcription_body(clip: Clip, search: SearchConfig, reading: Reading) -> dict[str, Any]:
    """/transcribe's answer: the text and hypotheses, the language, with ``timestamps`` the segments and
    with ``word_timestamps`` the words, as ``transcribe --output x.json`` writes them."""
    result = clip.result
    timed = {"segments": [s.row() for s in result.segments]} if search.timestamps else {}
    words = {"words": [{"start": w.start, "end": w.end, "word": w.text} for w in result.words]} if reading.words else {}
    return {"transcriptions": [{**_hypotheses(result), **result.row(search), "language": result.language, **timed,
                                **words}]}


def _log_to_stderr(level: str) -> None:
    """The serve logger's lines on stderr at ``level`` (uvicorn configures only its own loggers)."""
    if not LOG.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(message)s"))
        LOG.addHandler(handler)
    LOG.setLevel(level.upper())


def _hypotheses(result: Any) -> dict[str, Any]:
    return {"text": result.text, "score": result.score,
            "hypotheses": [{"text": text, "score": score} for text, score in result.hypotheses]}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _refusal(exc: S2SError) -> JSONResponse:
    return _error(refusal_status(exc), str(exc))


def _declared_length(request: Request, limit: int) -> int | None:
    declared = request.headers.get("content-length", "")
    return int(declared) if declared.isdigit() and int(declared) <= limit else None


def create_app(config: ServeConfig) -> Starlette:
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The event loop parses requests while a batch runs: idle decoder threads must not spin.
        translator = Translator(config.export_dir, device=config.device, threads=config.threads, spin=False)
        transcriber = (Transcriber(translator, max_duration=config.max_duration)
                       if translator.manifest.encoder_input.is_features else None)
        batcher = Batcher(upload_decoder(transcriber) if transcriber else text_decoder(translator), config.limits)
        _log_to_stderr(config.log_level)
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
            results = await translate_texts(translator, batcher, texts, search)
        except S2SError as exc:
            return _refusal(exc)
        return JSONResponse({"translations": [{"source": r.source, **_hypotheses(r)} for r in results]})

    async def transcribe_endpoint(request: Request) -> Response:
        """The body is one audio file (any format soundfile reads); options are query parameters.
        ``stream=true``: NDJSON, a ``{"segment": ...}`` line per segment as it is decoded, then the whole
        answer's line; every refusal before decoding starts is still a status and one line."""
        transcriber, batcher = state["transcriber"], state["batcher"]
        if transcriber is None:
            return _error(400, "this export translates text: POST JSON to /translate")
        if _declared_length(request, MAX_AUDIO_BYTES) is None:
            return _error(413, f"the audio must be at most {MAX_AUDIO_BYTES} bytes with a Content-Length")
        data = await request.body()
        if not data:
            return _error(400, "the body is empty: send the audio file's bytes")
        try:
            query = dict(request.query_params)
            search = parse_query(query, transcriber.translator, config.max_beam)
            reading, streamed = parse_reading(query)
            if request.headers.get("content-type", "").startswith("multipart/form-data"):
                data = multipart_file(request.headers["content-type"], data)
            if streamed:
                return await stream_transcription(transcriber, data, search, reading)
            clip = await transcribe_upload(transcriber, batcher, state["front_end"], data, search, reading=reading)
        except S2SError as exc:
            return _refusal(exc)
        return JSONResponse(transcription_body(clip, search, reading))

    async def stream_transcription(transcriber: Transcriber, data: bytes, search: SearchConfig,
                                   reading: Reading) -> Response:
        """Decoding starts; once the clip is read and queued the answer is 200 and NDJSON, else the
        refusal's status and line as unstreamed."""
        stream, taken = Stream(), asyncio.Event()
        task = asyncio.ensure_future(transcribe_upload(transcriber, state["batcher"], state["front_end"], data,
                                                       search, reading=reading, stream=stream, taken=taken.set))
        task.add_done_callback(stream.finish)
        waiting = asyncio.ensure_future(taken.wait())
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if task.done() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

        async def lines() -> AsyncIterator[bytes]:
            sent = 0
            try:
                while (segments := await stream.queue.get()) is not Stream.DONE:
                    for segment in segments:
                        yield (json.dumps({"segment": segment.row()}, ensure_ascii=False) + "\n").encode()
                        sent += 1
                        LOG.debug("stream %d: line %d sent", stream.number, sent)
                try:
                    last = transcription_body(task.result(), search, reading)
                except S2SError as exc:  # a batch that failed after the answer began
                    last = {"error": str(exc), "status": refusal_status(exc)}
                yield (json.dumps(last, ensure_ascii=False) + "\n").encode()
            finally:
                task.cancel()  # a client that went away leaves nothing decoding for it

        return StreamingResponse(lines(), media_type="application/x-ndjson")

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
                       "max_target_length": manifest.max_target_length, "max_beam": config.max_beam,
                       "max_duration": config.max_duration},
            "batching": asdict(config.limits),
            "search": dict(manifest.search),
            "decoding": asdict(translator.search_config()),  # what a request that names no option decodes with
            "provider": translator.notice,
        })

    routes = [*libretranslate_routes(translate_endpoint, state, config.languages, config.max_beam, MAX_BODY_BYTES),
              Route("/transcribe", transcribe_endpoint, methods=["POST"]),
              Route("/health", health), Route("/metadata", metadata),
              *openai_routes(state, config.max_beam, MAX_AUDIO_BYTES)]
    return Starlette(routes=routes, lifespan=lifespan)


def app_from_env() -> Starlette:
    """The factory uvicorn imports in each worker process (``--workers N``)."""
    return create_app(ServeConfig.from_env())
