"""Images in, text out, from an export whose front end reads images: resize → rescale → normalise
(the manifest's ``vit_image`` parameters, Pillow and numpy) → search → detokenise.

No torch and no transformers at run time; the search is the text path's, with every decoding
option of docs/decoding.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends import IMAGE, load_image
from s2s_deploy.frontends.media import MEDIA
from s2s_deploy.runtime.features import Decoded, FeatureReader

Image = str | Path | np.ndarray
"""A file path (any format Pillow reads; grey, palette and alpha images become RGB), or a
``(height, width, 3)`` uint8 RGB array."""

Caption = Decoded
"""One image's text (``Decoded``: source, text, score, hypotheses)."""


class Captioner(FeatureReader):
    """The image API: ``Captioner("exported/trocr")(["line.png", pixels], beam=4)``.

    ``options``: any decoding option by name, as ``Translator`` takes them; defaults come from the
    manifest (the folder's generation_config.json for an ``export --hf``)."""

    medium = MEDIA[IMAGE]

    def single(self, images: Any) -> bool:
        return isinstance(images, str | Path) or (isinstance(images, np.ndarray) and images.ndim == 3)

    def load(self, image: Image, label: str) -> Any:
        """A path read as an RGB Pillow image, or a checked ``(height, width, 3)`` uint8 array."""
        if isinstance(image, str | Path):
            return load_image(image)
        if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            shown = f"{image.shape} {image.dtype}" if isinstance(image, np.ndarray) else type(image).__name__
            raise S2SError(f"{label}: an image array must be (height, width, 3) uint8 RGB, not {shown}")
        if 0 in image.shape:
            raise S2SError(f"{label}: the image is empty ({image.shape[1]}x{image.shape[0]} pixels)")
        return image
