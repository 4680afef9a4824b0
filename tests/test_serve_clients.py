"""The APIs clients already speak, served beside the native one: the official ``openai`` client against
``serve``'s OpenAI-compatible audio API, and ``libretranslatepy`` (with plain HTTP per LibreTranslate's
schema) against its LibreTranslate-compatible text API, each on a live server on 127.0.0.1, each
answer held against what the CLI prints for the same input."""

from __future__ import annotations

import asyncio
import html
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("python_multipart")
from starlette.testclient import TestClient
from test_serve import SPEECH_CLIPS, _start

from s2s_deploy.errors import S2SError
from s2s_deploy.runtime.decoding import resolve
from s2s_deploy.serve.app import ServeConfig, create_app
from s2s_deploy.serve.batcher import BatchLimits
from s2s_deploy.serve.libretranslate import (
    LibreTranslateError,
    html_pieces,
    languages_of,
    parse_fields,
    parse_pair,
)


def cli(*args: str) -> list[str]:
    """What ``s2s-deploy ARGS --quiet`` prints, one line each."""
    result = subprocess.run([sys.executable, "-m", "s2s_deploy", *args, "--quiet"], capture_output=True, text=True,
                            timeout=300, check=True)
    return result.stdout.splitlines()


@pytest.fixture(scope="module")
def transformer(exports):
    return exports.get("transformer")[1]


@pytest.fixture(scope="module")
def live_transformer(transformer):
    process, url = _start(transformer, "--threads", "1", "--window-ms", "50")
    yield url
    process.terminate()
    process.wait(timeout=60)


def test_libretranslate_client_gets_what_translate_prints(transformer, live_transformer) -> None:
    """libretranslatepy's ``translate`` and ``languages``, and LibreTranslate's JSON body with a list
    ``q``, against a live server: every text is what ``s2s-deploy translate`` prints for it; the native
    JSON body on the same path still gets the native answer, whatever content type it declares."""
    from libretranslatepy import LibreTranslateAPI

    texts = list(transformer.samples[:6])
    expected = cli("translate", str(transformer.directory), *texts)
    client = LibreTranslateAPI(live_transformer, api_key="ignored")
    assert client.languages() == [{"code": "en", "name": "en", "targets": ["fr"]}]  # the training record's en-fr
    assert [client.translate(text, "en", "fr") for text in texts] == expected
    assert [client.translate(text, "auto", "fr") for text in texts[:2]] == expected[:2]

    listed = httpx.post(f"{live_transformer}/translate", json={"q": texts, "source": "en", "target": "fr"})
    assert listed.status_code == 200 and listed.json() == {"translatedText": expected}
    native = httpx.post(f"{live_transformer}/translate", json={"texts": texts[:2]})
    assert [t["text"] for t in native.json()["translations"]] == expected[:2]
    # `curl -d '{"texts": ...}'` declares its JSON a urlencoded form: still the native API's
    curl_style = httpx.post(f"{live_transformer}/translate", content=json.dumps({"texts": texts[:2]}),
                            headers={"content-type": "application/x-www-form-urlencoded"})
    assert [t["text"] for t in curl_style.json()["translations"]] == expected[:2]


def test_libretranslate_alternatives_html_and_refusals(transformer, live_transformer) -> None:
    """``alternatives`` are the n-best after the best (``translate --n-best``); ``format=html`` translates
    the text between tags and keeps the tags; what LibreTranslate refuses gets its ``{"error"}`` and 400."""
    texts = list(transformer.samples[6:9])
    beam = max(resolve(transformer).beam_size, 3)
    nbest = cli("translate", str(transformer.directory), *texts, "--beam", str(beam), "--n-best", "3")
    answer = httpx.post(f"{live_transformer}/translate",
                        data={"q": texts[0], "source": "en", "target": "fr", "alternatives": "2"}).json()
    assert answer == {"translatedText": nbest[0], "alternatives": nbest[1:3]}

    first, second = cli("translate", str(transformer.directory), texts[1], texts[2])
    markup = f'<p class="x">{texts[1]} <b>{texts[2]}</b></p>\n<script>var a = "{texts[1]}";</script>'
    answer = httpx.post(f"{live_transformer}/translate", json={"q": markup, "target": "fr", "format": "html"}).json()
    assert answer == {"translatedText": f'<p class="x">{first} <b>{second}</b></p>\n'
                                        f'<script>var a = "{texts[1]}";</script>'}

    for body, message in [
        ({"q": "four nights", "source": "en", "target": "de"}, "'de' is not supported as a target language: use fr"),
        ({"q": "four nights", "source": "de", "target": "fr"}, "'de' is not supported as a source language"),
        ({"q": [], "target": "fr"}, "'q' must be a string or a non-empty list of strings"),
        ({"q": "  ", "target": "fr"}, "text 1 is empty"),
        ({"q": "four nights", "target": "fr", "format": "pdf"}, "'format' must be text or html"),
        ({"q": "four nights", "target": "fr", "glossary": "x"}, "unknown field 'glossary'"),
        ({"q": "four nights", "target": "fr", "alternatives": "many"}, "'alternatives' must be a whole number"),
    ]:
        for sent in ({"json": body}, {"data": body}):
            if "data" in sent and not isinstance(body["q"], str):
                continue
            response = httpx.post(f"{live_transformer}/translate", **sent)
            assert response.status_code == 400 and list(response.json()) == ["error"], response.text
            assert response.json()["error"].startswith(message), response.text


def test_html_pieces_keep_the_markup() -> None:
    markup = '<!DOCTYPE html><?xml x?><p title="a&amp;b">x &lt; y<br/> <!-- c --></p><style>p {}</style>'
    pieces = html_pieces(markup)
    assert pieces == [(False, "<!DOCTYPE html>"), (False, "<?xml x?>"), (False, '<p title="a&amp;b">'),
                      (True, "x < y"), (False, "<br/>"), (False, " "), (False, "<!-- c -->"), (False, "</p>"),
                      (False, "<style>"), (False, "p {}"), (False, "</style>")]
    assert "".join(html.escape(piece, quote=False) if text else piece for text, piece in pieces) == markup


def test_languages_come_from_the_export_the_flag_or_the_training_record(transformer, tmp_path: Path) -> None:
    """An export that lists language codes serves them as targets; else ``--languages``, else the
    training record's pair; with none, a LibreTranslate request is refused with the fix."""
    assert languages_of(transformer, None).as_json() == [{"code": "en", "name": "en", "targets": ["fr"]}]
    bare = replace(transformer, training={})
    assert languages_of(bare, parse_pair("de:en")).as_json() == [{"code": "de", "name": "de", "targets": ["en"]}]
    with pytest.raises(LibreTranslateError, match="start serve with --languages SRC:TGT"):
        parse_fields({"q": "x", "target": "fr"}, languages_of(bare, None))
    with pytest.raises(S2SError, match="give the source and target codes as SRC:TGT"):
        parse_pair("en-fr")
    result = subprocess.run([sys.executable, "-m", "s2s_deploy", "serve", str(transformer.directory), "--languages",
                             "fr"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0
    assert "--languages fr: give the source and target codes as SRC:TGT" in result.stderr


def test_openai_routes_on_a_text_export_answer_in_openai_shape(transformer) -> None:
    with TestClient(create_app(ServeConfig(str(transformer.directory), BatchLimits(), threads=1))) as http:
        assert http.get("/v1/models").json() == {"object": "list", "data": [
            {"id": "transformer", "object": "model", "created": http.get("/v1/models/transformer").json()["created"],
             "owned_by": "s2s-deploy"}]}
        response = http.post("/v1/audio/transcriptions", files={"file": ("a.flac", b"x")}, data={"model": "m"})
        assert response.status_code == 400
        assert response.json() == {"error": {"message": "this export translates text, not audio: POST JSON to "
                                             "/translate", "type": "invalid_request_error", "param": "model",
                                             "code": "unsupported_model"}}
        missing = http.get("/v1/models/whisper-1")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        assert http.post("/v1/chat/completions", json={}).json()["error"]["code"] == "unknown_url"


def _cues(subtitle: str, mark: str) -> list[tuple[str, str, str]]:
    return re.findall(rf"(\d\d:\d\d:\d\d{mark}\d\d\d) --> (\d\d:\d\d:\d\d{mark}\d\d\d)\n(.*)\n", subtitle)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # openai marks translations.create so
def test_openai_client_gets_what_transcribe_prints(exports) -> None:
    """The official ``openai`` client, unchanged but for its base URL, against a live server on the
    bundled speech export: json, text, srt, vtt and verbose_json give the text ``s2s-deploy transcribe``
    prints for each clip (the speech export has no timestamp tokens: one segment spans the clip);
    concurrent uploads share batches; refusals come back as the client's own exceptions."""
    import openai
    import soundfile

    from s2s_deploy.format.subtitles import clock

    speech = exports.get("speech")[1]
    expected = cli("transcribe", str(speech.directory), *map(str, SPEECH_CLIPS))
    process, url = _start(speech, "--threads", "1", "--window-ms", "300")
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list()] == ["speech"]
        for clip, text in zip(SPEECH_CLIPS, expected, strict=True):
            duration = soundfile.info(str(clip)).duration
            with clip.open("rb") as audio:
                assert client.audio.transcriptions.create(model="whisper-1", file=audio).text == text
            got = client.audio.transcriptions.create(model="x", file=clip, response_format="text")
            assert got == text + "\n"
            verbose = client.audio.transcriptions.create(model="x", file=clip, response_format="verbose_json",
                                                         timestamp_granularities=["segment"])
            assert verbose.text == text and verbose.task == "transcribe" and verbose.language is None
            assert abs(verbose.duration - duration) < 1e-3
            assert [(s.id, s.start, s.text, s.temperature) for s in verbose.segments] == [(0, 0.0, text, 0.0)]
            assert abs(verbose.segments[0].end - duration) < 1e-3
            for fmt, mark in (("srt", ","), ("vtt", ".")):
                subtitle = client.audio.transcriptions.create(model="x", file=clip, response_format=fmt)
                assert _cues(subtitle, mark) == [(clock(0.0, mark), clock(verbose.duration, mark), text)]
            assert subtitle.startswith("WEBVTT\n\n")

        async def together() -> list[str]:
            async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as concurrent:
                answers = await asyncio.gather(*(concurrent.audio.transcriptions.create(model="x", file=clip)
                                                 for clip in SPEECH_CLIPS))
            return [a.text for a in answers]

        assert asyncio.run(together()) == expected
        assert httpx.get(f"{url}/health").json()["largest"] >= 2  # the uploads shared a batch

        def refused(**fields: object) -> dict:
            with pytest.raises(openai.BadRequestError) as caught:
                client.audio.transcriptions.create(model="x", **fields)  # type: ignore[call-overload]
            return caught.value.body  # type: ignore[return-value]

        clip = SPEECH_CLIPS[0]
        assert refused(file=("junk.flac", b"not audio"))["message"].startswith("cannot read audio from the upload")
        assert refused(file=clip, response_format="tsv")["param"] == "response_format"
        assert refused(file=clip, timestamp_granularities=["word"])["param"] == "timestamp_granularities[]"
        assert refused(file=clip, temperature=2)["param"] == "temperature"
        assert refused(file=clip, language="en")["param"] == "language"  # the export names no languages
        with pytest.raises(openai.BadRequestError) as caught:
            client.audio.translations.create(model="x", file=clip)
        assert caught.value.body["code"] == "unsupported_task"  # type: ignore[index]
        raw = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "x"}, files={"other": ("a", b"x")})
        assert raw.status_code == 400 and json.loads(raw.text)["error"] == {
            "message": "unknown field 'other'; known: file, model, language, prompt, response_format, temperature, "
                       "timestamp_granularities[], stream", "type": "invalid_request_error", "param": "other",
            "code": None}
    finally:
        process.terminate()
        process.wait(timeout=60)
