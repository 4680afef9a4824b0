"""The LibreTranslate-compatible text API: ``POST /translate`` with LibreTranslate's fields and
``GET /languages``, so LibreTranslate clients and plugins work against ``serve`` on a text export.

``POST /translate`` is also the native API's path. The two are told apart by the body alone: a form
(urlencoded or multipart, as LibreTranslate clients send) or a JSON object with ``q`` is
LibreTranslate's; anything else goes to the native handler unchanged (a JSON object with ``texts``,
whatever its declared content type, since ``curl -d`` calls JSON a form, and every malformed body,
which keeps its native error). The sentences then take the native path (service.translate_texts: a
batch shared with other requests).

Fields: ``q`` (a string, or a list of strings), ``source``, ``target``, ``format`` (``text``, or
``html``: the text between tags is translated, the tags kept), ``alternatives`` (that many more
hypotheses, from the n-best), ``api_key`` (ignored). Languages: the export's target language codes
where it lists them (``target`` becomes ``target_lang``), else the pair ``serve --languages SRC:TGT``
names or the training record's task names (``en-fr``). ``source`` must be ``auto`` or one the
export reads. Errors are LibreTranslate's ``{"error": "..."}`` with the native status codes.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import Manifest
from s2s_deploy.runtime.translator import Translator
from s2s_deploy.serve.service import refusal_status, translate_texts

Endpoint = Callable[[Request], Awaitable[Response]]
FIELDS = ("q", "source", "target", "format", "alternatives", "api_key")
URLENCODED, MULTIPART = "application/x-www-form-urlencoded", "multipart/form-data"
AUTO = "auto"
PAIR = re.compile(r"([a-z]{2,3})-([a-z]{2,3})")
"""A training record's task that names a language pair (``en-fr``)."""
MAX_ALTERNATIVES = 8


class LibreTranslateError(S2SError):
    """A request LibreTranslate would refuse (400)."""


@dataclass(frozen=True)
class Languages:
    """Which codes a request may name: ``sources`` read (besides ``auto``), ``targets`` written;
    ``listed``: the targets are the export's language codes (``target`` becomes ``target_lang``)."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    listed: bool

    def as_json(self) -> list[dict[str, Any]]:
        """``GET /languages``: LibreTranslate's rows; the name is the code (no language names ship here)."""
        return [{"code": code, "name": code, "targets": list(self.targets)} for code in self.sources]


def languages_of(manifest: Manifest, pair: tuple[str, str] | None) -> Languages:
    """The export's listed target languages, else ``pair`` (``serve --languages``), else the pair its
    training record's task names; an export with none serves no LibreTranslate request."""
    vocab = manifest.tgt_vocab
    if pair is None and isinstance(task := manifest.training.get("task"), str) and (match := PAIR.fullmatch(task)):
        pair = (match[1], match[2])
    if vocab.languages:
        codes = tuple(vocab.code_of(i) for i in vocab.languages)
        return Languages((pair[0],) if pair else codes, codes, True)
    return Languages((pair[0],), (pair[1],), False) if pair else Languages((), (), False)


def parse_pair(text: str) -> tuple[str, str]:
    """``serve --languages en:fr``: the source and target codes an export without language tokens serves."""
    source, colon, target = text.partition(":")
    if not colon or not source.strip() or not target.strip() or ":" in target:
        raise S2SError(f"--languages {text}: give the source and target codes as SRC:TGT, e.g. en:fr")
    return source.strip(), target.strip()


def _strings(value: Any) -> tuple[list[str], bool]:
    """``q`` as texts, and whether it was a list (the answer is then a list too)."""
    if isinstance(value, str):
        return [value], False
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value), True
    raise LibreTranslateError("'q' must be a string or a non-empty list of strings")


class _Pieces(HTMLParser):
    """HTML cut into markup, kept as written, and text, to translate (``script`` and ``style`` kept)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pieces: list[tuple[bool, str]] = []  # (is text to translate, piece)
        self._raw = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.pieces.append((False, self.get_starttag_text() or ""))
        self._raw += tag in ("script", "style")

    def handle_startendtag(self, tag: str, attrs: Any) -> None:
        self.pieces.append((False, self.get_starttag_text() or ""))

    def handle_endtag(self, tag: str) -> None:
        self.pieces.append((False, f"</{tag}>"))
        self._raw -= tag in ("script", "style") and self._raw > 0

    def handle_data(self, data: str) -> None:  # unescaped; a piece kept as it is is escaped again
        self.pieces.append((True, data) if not self._raw and data.strip()
                           else (False, data if self._raw else html.escape(data, quote=False)))

    def handle_comment(self, data: str) -> None:
        self.pieces.append((False, f"<!--{data}-->"))

    def handle_decl(self, decl: str) -> None:
        self.pieces.append((False, f"<!{decl}>"))

    def handle_pi(self, data: str) -> None:
        self.pieces.append((False, f"<?{data}>"))

    def unknown_decl(self, data: str) -> None:
        self.pieces.append((False, f"<![{data}]>"))


def html_pieces(markup: str) -> list[tuple[bool, str]]:
    """``markup`` as (translate?, piece): a piece to translate is unescaped text, the rest markup as written."""
    parser = _Pieces()
    parser.feed(markup)
    parser.close()
    return parser.pieces


def _spaced(original: str, translated: str) -> str:
    """The translation with the original's leading and trailing whitespace (tags often sit beside spaces)."""
    lead = original[: len(original) - len(original.lstrip())]
    trail = original[len(original.rstrip()):]
    return lead + translated + trail


@dataclass(frozen=True)
class LibreRequest:
    texts: list[str]
    as_list: bool
    html: bool
    options: dict[str, Any]
    alternatives: int


def parse_fields(fields: Mapping[str, Any], languages: Languages) -> LibreRequest:
    """LibreTranslate's fields, checked, as texts and decoding options."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise LibreTranslateError(f"unknown field {unknown[0]!r}; known: {', '.join(FIELDS)}")
    if "q" not in fields:
        raise LibreTranslateError("Invalid request: missing q parameter")
    texts, as_list = _strings(fields["q"])
    fmt = fields.get("format") or "text"
    if fmt not in ("text", "html"):
        raise LibreTranslateError(f"'format' must be text or html, not {fmt!r}")
    if not languages.targets:
        raise LibreTranslateError("this export names no languages: start serve with --languages SRC:TGT "
                                  "(e.g. en:fr) to serve LibreTranslate requests")
    source, target = fields.get("source") or AUTO, fields.get("target")
    if not isinstance(source, str) or (source != AUTO and source not in languages.sources):
        raise LibreTranslateError(f"{source!r} is not supported as a source language: use auto or "
                                  f"{', '.join(languages.sources)}")
    if not isinstance(target, str) or target not in languages.targets:
        known = ", ".join(languages.targets[:20]) + (" ..." if len(languages.targets) > 20 else "")
        raise LibreTranslateError(f"{target!r} is not supported as a target language: use {known}"
                                  if target else "Invalid request: missing target parameter")
    try:
        alternatives = int(fields.get("alternatives") or 0)
    except (TypeError, ValueError):
        raise LibreTranslateError("'alternatives' must be a whole number") from None
    if not 0 <= alternatives <= MAX_ALTERNATIVES:
        raise LibreTranslateError(f"'alternatives' must be between 0 and {MAX_ALTERNATIVES}")
    options: dict[str, Any] = {"target_lang": target} if languages.listed else {}
    if alternatives:
        options["n_best"] = alternatives + 1  # the beam is widened to it where the export's is narrower
    return LibreRequest(texts, as_list, fmt == "html", options, alternatives)


def libretranslate_routes(native: Endpoint, state: dict[str, Any], languages_flag: str | None, max_beam: int,
                          max_body: int) -> list[Route]:
    """``POST /translate`` (LibreTranslate's form, or ``native`` for the native API's body) and
    ``GET /languages``, over the app's ``state`` (translator, transcriber, batcher, set by its lifespan);
    ``languages_flag``: ``serve --languages``."""
    pair = parse_pair(languages_flag) if languages_flag else None

    def refused(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    async def decode(fields: Mapping[str, Any]) -> Response:
        translator: Translator = state["translator"]
        if state["transcriber"] is not None:
            return refused(400, "this export reads audio: POST the audio file to /transcribe or "
                                "/v1/audio/transcriptions")
        try:
            request = parse_fields(fields, languages_of(translator.manifest, pair))
            for number, text in enumerate(request.texts, 1):
                if not text.strip():
                    raise LibreTranslateError(f"text {number} is empty")
            options = dict(request.options)
            if request.alternatives:  # alternatives widen the export's own beam where it is narrower
                options["beam"] = max(translator.search_config().beam_size, request.alternatives + 1)
            config = translator.search_config(**options)
            if config.beam_size > max_beam:
                raise LibreTranslateError(f"a beam of {config.beam_size} exceeds this server's largest, {max_beam}")
            pieces = [html_pieces(text) if request.html else [(True, text)] for text in request.texts]
            sentences = [piece.strip() if request.html else piece
                         for found in pieces for translate, piece in found if translate]
            results = await translate_texts(translator, state["batcher"], sentences, config) if sentences else []
        except S2SError as exc:
            return refused(refusal_status(exc), str(exc))
        done = iter(results)
        translated, alternatives = [], []
        for found in pieces:
            texts: list[list[str]] = [[] for _ in range(request.alternatives + 1)]
            for translate, piece in found:
                hypotheses = [text for text, _ in next(done).hypotheses] if translate else []
                for rank, text in enumerate(texts):
                    if not translate:
                        text.append(piece)
                    elif request.html:
                        text.append(_spaced(piece, html.escape(hypotheses[min(rank, len(hypotheses) - 1)],
                                                               quote=False)))
                    else:
                        text.append(hypotheses[min(rank, len(hypotheses) - 1)])
            translated.append("".join(texts[0]))
            alternatives.append(["".join(text) for text in texts[1:]])
        body: dict[str, Any] = {"translatedText": translated if request.as_list else translated[0]}
        if request.alternatives:
            body["alternatives"] = alternatives if request.as_list else alternatives[0]
        return JSONResponse(body)

    async def translate(request: Request) -> Response:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        declared = request.headers.get("content-length", "")
        if not declared.isdigit() or int(declared) > max_body:
            return await native(request)  # refuses it (413), as for any body
        if content_type != MULTIPART:
            try:  # JSON whatever its declared type: `curl -d '{"texts": ...}'` sends it as a urlencoded form
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                if content_type != URLENCODED:
                    return await native(request)  # says the body is not valid JSON
            else:
                return await (decode(body) if isinstance(body, dict) and "q" in body and "texts" not in body
                              else native(request))
        try:
            async with request.form(max_files=1, max_fields=1024) as form:
                if any(isinstance(value, UploadFile) for _, value in form.multi_items()):
                    return refused(400, "send the text in 'q', not as a file")
                fields: dict[str, Any] = {key: (values if key == "q" and len(values) > 1 else values[0])
                                          for key in form for values in [form.getlist(key)]}
        except HTTPException as exc:
            return refused(400, f"cannot read the form: {exc.detail}")
        return await decode(fields)

    async def languages(request: Request) -> JSONResponse:
        return JSONResponse(languages_of(state["translator"].manifest, pair).as_json())

    return [Route("/translate", translate, methods=["POST"]), Route("/languages", languages)]
