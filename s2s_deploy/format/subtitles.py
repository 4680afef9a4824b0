"""Subtitle files from timed segments: SubRip (``.srt``) and WebVTT (``.vtt``). ``transcribe --output``
and ``serve``'s OpenAI-compatible ``response_format`` write the same text. Standard library only."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def subtitles(segments: Iterable[Any], suffix: str) -> str:
    """SubRip (``.srt``: numbered cues, ``00:00:01,500``) or WebVTT (``.vtt``: a header, ``00:00:01.500``)
    cues, one per segment (anything with ``start``, ``end`` in seconds and ``text``); both formats are
    this simple, so no library is needed."""

    mark = "," if suffix == ".srt" else "."
    cues = [f"{clock(s.start, mark)} --> {clock(s.end, mark)}\n{s.text}\n" for s in segments]
    if suffix == ".srt":
        return "\n".join(f"{i}\n{cue}" for i, cue in enumerate(cues, start=1))
    return "WEBVTT\n\n" + "\n".join(cues)


def clock(seconds: float, mark: str) -> str:
    """``HH:MM:SS`` then ``mark`` and milliseconds: SubRip's ``,`` or WebVTT's ``.``."""
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    whole, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{mark}{millis:03d}"
