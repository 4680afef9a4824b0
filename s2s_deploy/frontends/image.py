"""The image front end of ViT-style processors: resize with Pillow, rescale, normalise, channels first.

It computes what transformers' ``ViTImageProcessor`` (its Pillow backend) computes, and what
TrOCR's processor does, since TrOCR uses it. Processors that also crop, pad or make thumbnails
(Donut's default path) are refused by name rather than approximated.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.frontends.config import FrontEndConfig, expect_type, positive
from s2s_deploy.frontends.optional import optional_module

BILINEAR = 2
"""Pillow's code for bilinear resampling, the ViT processors' default (0 nearest, 3 bicubic, 1 Lanczos)."""

IMAGE = "image"
PROBE_SIZE = 16
"""The side of the grey square a front end is probed with at export."""

_PROCESSORS = ("ViTImageProcessor", "ViTImageProcessorPil", "ViTFeatureExtractor")
_UNSUPPORTED_STEPS = ("do_center_crop", "do_thumbnail", "do_align_long_axis", "do_pad")


def to_rgb(image: Any) -> Any:
    """A Pillow image as RGB, transparency composited onto white, as transformers' ``convert_to_rgb``
    does (a plain ``convert("RGB")`` would drop the alpha and keep whatever colour hides under it)."""
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image_module = optional_module("PIL.Image", "preprocessing images")
        rgba = image.convert("RGBA")
        white = image_module.new("RGBA", rgba.size, (255, 255, 255, 255))
        return image_module.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


MAX_PIXELS = 1 << 26
"""The largest image read (67 megapixels, 8192x8192): judged from the header before the pixels are
decoded, since a few kilobytes of PNG can hold an image of gigabytes. Downscaling while decoding
(Pillow's JPEG draft mode) would feed the model other pixels than transformers' processor, so a larger
image is refused in one line rather than approximated."""


WIDE_MODES = {"I;16": "16-bit", "I;16B": "16-bit", "I;16L": "16-bit", "I;16N": "16-bit", "I": "32-bit integer",
              "F": "32-bit float"}
"""Pillow's modes of more than 8 bits a channel. Converting them to RGB clips every value to 0-255 (a
16-bit grey image comes out nearly all white, a float one in [0, 1] all black), and so does transformers'
``load_image`` and its processors' ``convert_to_rgb``; nothing scales them, so they are refused."""


def load_image(path: str | Path, max_pixels: int = MAX_PIXELS) -> Any:
    """A file's image as an RGB Pillow image, as transformers' ``load_image`` reads one: turned upright by
    its EXIF orientation (``ImageOps.exif_transpose``), then palette, grey and alpha images converted by
    ``to_rgb``. One over ``max_pixels`` is refused from its header, before its pixels are decoded; one of
    more than 8 bits a channel (``WIDE_MODES``) is refused in one line."""
    image_module = optional_module("PIL.Image", "reading images")
    path = Path(path)
    if path.is_dir():
        raise S2SError(f"{path} is a directory, not an image file")
    if not path.is_file():
        raise S2SError(f"image file not found: {path}")
    try:
        with warnings.catch_warnings():  # Pillow's own bomb warning: the budget below says it in one line
            warnings.simplefilter("ignore", image_module.DecompressionBombWarning)
            opened = image_module.open(path)
        with opened as image:
            width, height = image.size
            if width * height > max_pixels:
                raise S2SError(f"image {path} is {width}x{height} pixels, over the budget of {max_pixels} "
                               f"({width * height / 1e6:.0f} > {max_pixels / 1e6:.0f} megapixels): scale it down")
            if image.mode in WIDE_MODES:
                raise S2SError(f"image {path} is {WIDE_MODES[image.mode]} (Pillow mode {image.mode}), which would be "
                               "clipped to 0-255 as transformers' load_image clips it: convert it to 8-bit first")
            image_ops = optional_module("PIL.ImageOps", "reading images")
            upright = image_ops.exif_transpose(image)  # a copy, loaded: the file closes here
            return to_rgb(upright)
    except image_module.DecompressionBombError as exc:  # over twice Pillow's own limit: refused at open
        raise S2SError(f"image {path} is over the budget of {max_pixels} pixels: scale it down "
                       f"({exc})") from exc
    except (OSError, ValueError) as exc:  # UnidentifiedImageError: OSError
        raise S2SError(f"cannot read image {path}: {exc}") from exc


@dataclass(frozen=True)
class VitImage(FrontEndConfig):
    """A (3, height, width) float32 array: resized to a fixed size, scaled to [0, 1], normalised per channel."""

    kind: ClassVar[str] = "vit_image"
    reads: ClassVar[str] = IMAGE
    height: int = 224
    width: int = 224
    resample: int = BILINEAR
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)

    def __post_init__(self) -> None:
        positive(self.kind, height=self.height, width=self.width)
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or not all(s > 0 for s in self.image_std):
            raise S2SError(f"front end {self.kind}: image_mean and image_std need 3 values, std positive")

    @classmethod
    def from_preprocessor_config(cls, config: Mapping[str, Any]) -> VitImage:
        expect_type(config, "image_processor_type", _PROCESSORS)
        steps = [step for step in _UNSUPPORTED_STEPS if config.get(step)]
        if steps:
            raise S2SError(f"preprocessor_config.json: {', '.join(steps)} not supported by the ViT image front end")
        size = config.get("size", 224)
        if isinstance(size, int):
            height = width = size
        elif isinstance(size, Mapping) and {"height", "width"} <= set(size):
            height, width = int(size["height"]), int(size["width"])
        else:
            raise S2SError(f"preprocessor_config.json: size {size!r} is not a fixed height and width")

        def per_channel(value: Any) -> tuple[float, ...]:
            return tuple(float(v) for v in value) if isinstance(value, (list, tuple)) else (float(value),) * 3

        return cls(
            height=height,
            width=width,
            resample=int(config.get("resample", BILINEAR)),
            do_resize=bool(config.get("do_resize", True)),
            do_rescale=bool(config.get("do_rescale", True)),
            rescale_factor=float(config.get("rescale_factor", 1 / 255)),
            do_normalize=bool(config.get("do_normalize", True)),
            image_mean=per_channel(config.get("image_mean", 0.5)),
            image_std=per_channel(config.get("image_std", 0.5)),
        )

    def probe(self) -> np.ndarray:
        return np.full((PROBE_SIZE, PROBE_SIZE, 3), 128, dtype=np.uint8)

    def __call__(self, image: Any) -> np.ndarray:
        """A Pillow image, or a (height, width, 3) uint8 array, as the encoder's (3, height, width) input."""
        image_module = optional_module("PIL.Image", "preprocessing images")
        if isinstance(image, np.ndarray):
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
                raise S2SError(f"image array must be (height, width, 3) uint8, got {image.shape} {image.dtype}")
            image = image_module.fromarray(image)
        image = to_rgb(image)
        if self.do_resize:
            image = image.resize((self.width, self.height), resample=self.resample)
        # Rescaled in float64 and then cast, as transformers does, so the two agree to the last bit.
        pixels = np.asarray(image, dtype=np.float64)
        if self.do_rescale:
            pixels = pixels * self.rescale_factor
        pixels = pixels.astype(np.float32)
        if self.do_normalize:
            pixels = (pixels - np.asarray(self.image_mean, np.float32)) / np.asarray(self.image_std, np.float32)
        return np.ascontiguousarray(pixels.transpose(2, 0, 1))
