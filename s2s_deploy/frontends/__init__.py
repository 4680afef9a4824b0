"""Torch-free front ends: what turns audio or an image into an encoder's float input.

Each is a frozen config built from a Hugging Face folder's ``preprocessor_config.json`` and
stored in the manifest as ``to_json()``, so the runtime computes the features the model was
trained on without transformers or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends.audio import AUDIO, KaldiFbank, WhisperLogMel, decode_audio, load_audio, resample
from s2s_deploy.frontends.image import IMAGE, VitImage, load_image

FrontEnd = WhisperLogMel | KaldiFbank | VitImage

_BY_KIND: dict[str, type[FrontEnd]] = {cls.kind: cls for cls in (WhisperLogMel, KaldiFbank, VitImage)}
_BY_PROCESSOR: dict[str, type[FrontEnd]] = {
    "WhisperFeatureExtractor": WhisperLogMel,
    "Speech2TextFeatureExtractor": KaldiFbank,
    "ViTImageProcessor": VitImage,
    "ViTImageProcessorPil": VitImage,
    "ViTFeatureExtractor": VitImage,
}


def frontend_from_json(data: Mapping[str, Any]) -> FrontEnd:
    """The front end a manifest records, chosen by its ``kind``."""
    kind = data.get("kind")
    if kind not in _BY_KIND:
        raise S2SError(f"front end: unknown kind {kind!r}; known: {', '.join(sorted(_BY_KIND))}")
    return _BY_KIND[kind].from_json(data)


def frontend_from_preprocessor_config(config: Mapping[str, Any]) -> FrontEnd:
    """The front end a ``preprocessor_config.json`` describes, chosen by its processor type."""
    name = config.get("feature_extractor_type") or config.get("image_processor_type")
    if name not in _BY_PROCESSOR:
        raise S2SError(
            f"preprocessor_config.json: no front end for {name!r}; supported: {', '.join(sorted(_BY_PROCESSOR))}"
        )
    return _BY_PROCESSOR[name].from_preprocessor_config(config)


__all__ = [
    "AUDIO",
    "IMAGE",
    "FrontEnd",
    "KaldiFbank",
    "VitImage",
    "WhisperLogMel",
    "decode_audio",
    "frontend_from_json",
    "frontend_from_preprocessor_config",
    "load_audio",
    "load_image",
    "resample",
]
