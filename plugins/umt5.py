"""UMT5 (Hugging Face ``UMT5ForConditionalGeneration``): T5 (plugins/t5.py) with a relative
position table in every layer's self-attention instead of one per stack."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from s2s_deploy_plugins.t5 import T5Config, T5Plugin


class UMT5Plugin(T5Plugin):
    name = "umt5"
    version = "1.0"
    description = "Hugging Face UMT5: T5 with a relative position bias table in every layer"
    presets: ClassVar[dict[str, T5Config]] = {
        "tiny": T5Config(feed_forward_proj="gated-gelu", relative_bias_every_layer=True)}
    hf_model_types = ("umt5",)

    def config_from_hf(self, hf: Mapping[str, Any], tied: bool) -> T5Config:
        return replace(super().config_from_hf(hf, tied), relative_bias_every_layer=True)


PLUGIN = UMT5Plugin()
