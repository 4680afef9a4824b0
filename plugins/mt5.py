"""mT5 (Hugging Face ``MT5ForConditionalGeneration``): T5 (plugins/t5.py) under another name.

``transformers``' MT5 projects the decoder output as it is, never rescaling it by
``d_model**-0.5``, whatever ``tie_word_embeddings`` says; that is the one setting read differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from s2s_deploy_plugins.t5 import T5Plugin


class MT5Plugin(T5Plugin):
    name = "mt5"
    version = "1.0"
    description = "Hugging Face mT5: T5 without the decoder output rescale"
    hf_model_types = ("mt5",)

    def scales_outputs(self, hf: Mapping[str, Any]) -> bool:
        return False


PLUGIN = MT5Plugin()
