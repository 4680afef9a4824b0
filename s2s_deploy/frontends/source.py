"""A features source's front end, rebuilt from the manifest and held to the shape the encoder declares."""

from __future__ import annotations

from typing import Any

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.format.source import SourceSpec
from s2s_deploy.frontends import FrontEnd, frontend_from_json
from s2s_deploy.frontends.frames import StreamedFeatures
from s2s_deploy.frontends.media import Medium, medium_of


def use_instead(source: SourceSpec) -> str:
    """The command that reads what ``source`` reads, named from its front end's medium."""
    if not source.is_features:
        return "translate (or Translator)"
    return medium_for(source).readers


def medium_for(source: SourceSpec) -> Medium:
    """The medium a features source's front end reads."""
    return medium_of(frontend_for(source))


def frontend_for(source: SourceSpec) -> FrontEnd:
    """The front end a features source names, its parameters checked (one line when they are wrong)."""
    if not source.is_features or source.frontend is None:
        raise S2SError("this export reads token ids, not audio or images: use translate")
    return frontend_from_json(source.frontend)


def checked_features(source: SourceSpec, features: np.ndarray | StreamedFeatures,
                     label: str) -> np.ndarray | StreamedFeatures:
    """``features`` as the encoder's dtype, refused in one line unless every axis but the frames
    has the size the source declares (streamed features: cast piece by piece as they are made)."""
    want = source.item_shape(0)
    frames = None if source.length_axis is None else source.length_axis - 1
    shape = tuple(features.shape)
    if len(shape) != len(want) or any(a != b for i, (a, b) in enumerate(zip(shape, want, strict=True)) if i != frames):
        shown = ", ".join(str(d) for d in source.shape)
        raise S2SError(f"{label}: the front end made features of shape {shape}, the encoder reads ({shown})")
    if frames is not None and shape[frames] == 0:
        raise S2SError(f"{label}: too short to make a single frame of features")
    if isinstance(features, StreamedFeatures):
        return features.astype(source.dtype)
    return np.ascontiguousarray(features, dtype=source.dtype)


def featurise(source: SourceSpec, item: Any, label: str, whole: bool = False,
              frontend: FrontEnd | None = None) -> np.ndarray:
    """One raw input (samples at the front end's rate, or an image) as the encoder's input: the
    export's own front end (``whole``: uncut, for window-by-window reading), checked against the
    declared shape. The one loop every reader of features goes through: the readers, serve, parity."""
    frontend = frontend or frontend_for(source)
    return checked_features(source, (frontend.whole if whole else frontend)(item), label)


def check_frontend(plugin: str, source: SourceSpec) -> None:
    """At export: the declared front end exists and makes features of the declared shape from its
    neutral probe (a second of silence, a grey image), so a layout mistake fails here rather than
    in deployment."""
    try:
        frontend = frontend_for(source)
        checked_features(source, frontend(frontend.probe()), f"a neutral {frontend.reads} input")
    except S2SError as exc:
        raise S2SError(f"plugin {plugin}: source front end: {exc}") from exc
