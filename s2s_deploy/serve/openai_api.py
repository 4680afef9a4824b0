"""The OpenAI-compatible audio API: ``POST /v1/audio/transcriptions``, ``POST /v1/audio/translations``,
``GET /v1/models`` and ``GET /v1/models/{id}``, so the official ``openai`` client (and anything that
speaks OpenAI's audio API) works against ``serve`` unchanged.

A request is a multipart form (``file``, ``model``, ``language``, ``prompt``, ``response_format``,
``temperature``, ``timestamp_granularities[]``: ``segment`` and ``word``, the latter timed as
``transcribe --word-timestamps`` times them), parsed by Starlette's ``request.form()``; the clip then
takes the native ``/transcribe``'s path (service.transcribe_upload: the front-end thread, then a batch
shared with every other request's clips). ``model`` is accepted and ignored: a server serves one export,
listed by ``/v1/models`` under its folder's name. Errors come in OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``, with the native API's status codes.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from s2s_deploy.errors import S2SError
from s2s_deploy.format.subtitles import subtitles
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.features import Segment
from s2s_deploy.runtime.transcriber import Transcriber
from s2s_deploy.serve.service import Clip, Reading, refusal_status, transcribe_upload

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
"""``response_format`` values: OpenAI's for whisper-1."""
TIMED_FORMATS = ("srt", "vtt", "verbose_json")
"""Formats that carry segments: an export with timestamp tokens decodes them with ``timestamps`` on."""
FIELDS = {
    "transcriptions": ("file", "model", "language", "prompt", "response_format", "temperature",
                       "timestamp_granularities[]", "stream"),
    "translations": ("file", "model", "prompt", "response_format", "temperature", "stream"),
}
"""The form fields each endpoint takes (OpenAI's); any other is refused, naming it."""
SEGMENT_FACTS = (("temperature", "temperature"), ("avg_log_prob", "avg_logprob"),
                 ("compression_ratio", "compression_ratio"), ("no_speech_prob", "no_speech_prob"))
"""A segment's window facts as OpenAI names them, given where the decoder measured them (the
temperature fallback's windows), else left out."""
TASKS = {"transcriptions": "transcribe", "translations": "translate"}
"""verbose_json's ``task`` per endpoint."""
OWNER = "s2s-deploy"


class OpenAIError(S2SError):
    """A request OpenAI's API would refuse: ``param`` names the form field at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    """OpenAI's error body; ``type`` is ``invalid_request_error`` for a 4xx and ``server_error`` for a 5xx."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


@dataclass(frozen=True)
class AudioRequest:
    """A parsed form: the upload's bytes, the answer's format, and the decoding options it maps to."""

    data: bytes
    response_format: str
    temperature: float
    options: dict[str, Any]
    words: bool = False
    """``timestamp_granularities[]`` holds ``word``: verbose_json's ``words``, timed as ``--word-timestamps``."""
    segments: bool = True
    """verbose_json's ``segments``: left out where only ``word`` granularity was asked for."""


def _text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if isinstance(value, UploadFile):
        raise OpenAIError(f"'{name}' must be a text field, not a file", name)
    return value


def _temperature(text: str | None) -> float:
    if text is None or not text.strip():
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise OpenAIError(f"'temperature' must be a number between 0 and 1, not {text!r}", "temperature") from None
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise OpenAIError(f"'temperature' must be between 0 and 1, not {text}", "temperature")
    return value


def decoding_options(transcriber: Transcriber, endpoint: str, language: str | None, prompt: str | None,
                     temperature: float, timed: bool) -> dict[str, Any]:
    """OpenAI's fields as this export's decoding options. ``language`` is the spoken language, the
    export's ``target_lang`` code (Whisper's ``<|en|>``); translations ask for the export's ``translate``
    task code; a temperature above 0 samples (top-k off, that temperature), 0 decodes with the export's
    own search, as ``transcribe`` does; ``timed``: a format with segments, on an export with timestamp tokens."""
    vocab = transcriber.manifest.tgt_vocab
    options: dict[str, Any] = {}
    if endpoint == "translations":
        if vocab.task_id("translate") is None:
            raise OpenAIError("this export has no 'translate' task token, so it cannot translate speech to English: "
                              "use /v1/audio/transcriptions", "model", code="unsupported_task")
        options["task"] = "translate"
    elif vocab.task_id("transcribe") is not None:
        options["task"] = "transcribe"
    if language:
        if not vocab.languages:
            raise OpenAIError(f"this export names no languages, so 'language' ({language!r}) cannot be set: "
                              "leave it out", "language")
        options["target_lang"] = language
    if prompt:
        options["prompt"] = prompt
    if temperature > 0:
        options.update(beam=1, sampling_topk=0, sampling_temperature=temperature)
    if timed and transcriber.translator.search_config().timestamp_begin >= 1:
        options["timestamps"] = True
    return options


async def read_form(request: Request, endpoint: str, transcriber: Transcriber, max_bytes: int) -> AudioRequest:
    """The multipart form, checked field by field; the upload is refused (413) before it is read when its
    declared length is over ``max_bytes``."""
    declared = request.headers.get("content-length", "")
    if not declared.isdigit() or int(declared) > max_bytes:
        raise OpenAIError(f"the request must be at most {max_bytes} bytes with a Content-Length", "file", 413)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise OpenAIError("send a multipart/form-data request with the audio in the 'file' field", "file")
    try:
        form = await request.form(max_files=1, max_fields=16)
    except HTTPException as exc:
        raise OpenAIError(f"cannot read the multipart form: {exc.detail}") from None
    try:
        unknown = sorted(set(form) - set(FIELDS[endpoint]))
        if unknown:
            raise OpenAIError(f"unknown field {unknown[0]!r}; known: {', '.join(FIELDS[endpoint])}", unknown[0])
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise OpenAIError("the audio must be a file in the 'file' field", "file")
        data = await upload.read()
        if not data:
            raise OpenAIError("the uploaded file is empty", "file")
        response_format = _text(form, "response_format") or "json"
        if response_format not in FORMATS:
            raise OpenAIError(f"'response_format' must be one of {', '.join(FORMATS)}, not {response_format!r}",
                              "response_format")
        granularities = form.getlist("timestamp_granularities[]")
        if any(g not in ("segment", "word") for g in granularities):
            raise OpenAIError(f"'timestamp_granularities[]' must be 'segment' or 'word', not "
                              f"{next(g for g in granularities if g not in ('segment', 'word'))!r}",
                              "timestamp_granularities[]")
        if granularities and response_format != "verbose_json":
            raise OpenAIError("'timestamp_granularities[]' needs response_format verbose_json",
                              "timestamp_granularities[]")
        if (_text(form, "stream") or "false") != "false":
            raise OpenAIError("streamed answers are not served: leave 'stream' out", "stream")
        temperature = _temperature(_text(form, "temperature"))
        options = decoding_options(transcriber, endpoint, _text(form, "language"), _text(form, "prompt"),
                                   temperature, response_format in TIMED_FORMATS)
        return AudioRequest(data, response_format, temperature, options, "word" in granularities,
                            not granularities or "segment" in granularities)
    finally:
        await form.close()


def timed(clip: Clip, request: AudioRequest) -> tuple[Segment, ...]:
    """The decoder's timed segments (none where it heard nothing), or, from an export without timestamp
    tokens, one segment spanning the whole clip."""
    if request.options.get("timestamps"):
        return clip.result.segments
    return (Segment(0.0, clip.duration, clip.result.text),)


def segments_of(clip: Clip, request: AudioRequest) -> list[dict[str, Any]]:
    """verbose_json's segments. Fields OpenAI gives that the decoder did not measure are left out."""
    found = []
    for number, segment in enumerate(timed(clip, request)):
        row: dict[str, Any] = {"id": number, "start": segment.start, "end": segment.end, "text": segment.text,
                               "temperature": request.temperature}
        for ours, theirs in SEGMENT_FACTS:
            value = getattr(segment, ours, None)
            if value is not None:
                row[theirs] = value
        found.append(row)
    return found


def answer(clip: Clip, request: AudioRequest, endpoint: str) -> Response:
    """The transcription in the asked format, shaped as OpenAI's: JSON for json and verbose_json,
    text/plain for text (the text and a newline, as ``transcribe`` prints it), srt and vtt."""
    result, fmt = clip.result, request.response_format
    if fmt == "json":
        return JSONResponse({"text": result.text})
    if fmt == "text":
        return PlainTextResponse(result.text + "\n")
    if fmt == "verbose_json":
        words = ({"words": [{"word": w.text, "start": w.start, "end": w.end} for w in result.words]}
                 if request.words else {})
        segments = {"segments": segments_of(clip, request)} if request.segments else {}
        return JSONResponse({"task": TASKS[endpoint], "language": result.language, "duration": clip.duration,
                             "text": result.text, **words, **segments})
    return PlainTextResponse(subtitles(timed(clip, request), f".{fmt}"))


def openai_routes(state: dict[str, Any], max_beam: int, max_bytes: int) -> list[Route]:
    """The routes, over the app's ``state`` (translator, transcriber, batcher, front_end, set by its
    lifespan); ``max_bytes``: the largest request, as for ``/transcribe``."""

    def model() -> dict[str, Any]:
        """The one model: the export folder's name, ``created`` when its manifest was written."""
        folder = Path(state["translator"].manifest.directory)
        return {"id": folder.name, "object": "model", "created": int((folder / "manifest.json").stat().st_mtime),
                "owned_by": OWNER}

    def audio(endpoint: str) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            transcriber: Transcriber | None = state["transcriber"]
            if transcriber is None:
                return error_response(400, "this export translates text, not audio: POST JSON to /translate",
                                      "model", "unsupported_model")
            try:
                parsed = await read_form(request, endpoint, transcriber, max_bytes)
                search: SearchConfig = transcriber.translator.search_config(**parsed.options)
                if search.beam_size > max_beam:
                    raise OpenAIError(f"the export's default beam {search.beam_size} exceeds this server's largest, "
                                      f"{max_beam}")
                clip = await transcribe_upload(transcriber, state["batcher"], state["front_end"], parsed.data,
                                               search, reading=Reading(words=parsed.words))
            except OpenAIError as exc:
                return error_response(exc.status, str(exc), exc.param, exc.code)
            except S2SError as exc:
                return error_response(refusal_status(exc), str(exc))
            return answer(clip, parsed, endpoint)

        return handle

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model()]})

    async def one_model(request: Request) -> JSONResponse:
        found = model()
        if request.path_params["model"] != found["id"]:
            return error_response(404, f"the model {request.path_params['model']!r} does not exist; this server "
                                       f"serves {found['id']!r}", "model", "model_not_found")
        return JSONResponse(found)

    async def not_found(request: Request) -> JSONResponse:
        return error_response(404, f"no route {request.method} {request.url.path}: this server speaks "
                                   "/v1/audio/transcriptions, /v1/audio/translations and /v1/models",
                              code="unknown_url")

    return [Route("/v1/audio/transcriptions", audio("transcriptions"), methods=["POST"]),
            Route("/v1/audio/translations", audio("translations"), methods=["POST"]),
            Route("/v1/models", models), Route("/v1/models/{model:path}", one_model),
            Route("/v1/{rest:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])]

