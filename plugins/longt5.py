"""LongT5 (Hugging Face ``LongT5ForConditionalGeneration``, ``model_type`` ``longt5``), from
``transformers``' arithmetic: T5 (plugins/t5.py) whose encoder attends locally.

The decoder is T5's, so the step contract is T5's: a self-attention K/V cache per layer and the
cross-attention K/V computed by the encoder. Only the encoder's self-attention differs:

``local``: the sequence is cut into blocks of ``local_radius + 1`` tokens (padded to a whole
number of blocks); each block's queries see the keys of the block itself and of its two
neighbours, those farther than ``local_radius`` masked, plus the relative position bias of those
``(block, 3 * block)`` offsets (an integer bucket table computed once). Masked scores get
``-1e10``, as ``transformers`` gives them.

``transient-global``: the same, plus one key and value per whole ``global_block_size`` tokens of
the sentence (a shorter tail joins the last block), each from that block's sum of the layer's
normed inputs, RMS-normalised again; a query's bias towards one is the first layer's
``global_relative_attention_bias`` by block distance, and ``-1e10`` where the sentence has no such
block. The block of a token is ``position // global_block_size`` in integers, which is what
``transformers``' float cumulative sum gives whenever ``1 / global_block_size`` is exact in
float32 (every power of two, 16 by default). Two more global columns than any sentence has are
always present and always masked, so their count never traces as 0 or 1 (a dimension the
exporter would fix); a masked score adds exactly 0 to the softmax.

Module names follow ``transformers`` (``encoder.block.0.layer.0.LocalSelfAttention.q``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from s2s_deploy.errors import CheckpointError
from s2s_deploy_plugins.t5 import T5Config, T5Plugin


@dataclass(frozen=True)
class LongT5Config(T5Config):
    local_radius: int = 127
    transient_global: bool = False
    global_block_size: int = 16


class LongT5Plugin(T5Plugin):
    name = "longt5"
    version = "1.0"
    description = "Hugging Face LongT5: T5 whose encoder attends locally (and to transient global blocks)"
    config_type = LongT5Config
    presets: ClassVar[dict[str, LongT5Config]] = {
        "tiny": LongT5Config(local_radius=3),
        "tiny-tglobal": LongT5Config(local_radius=3, transient_global=True, global_block_size=4)}
    hf_model_types = ("longt5",)
    model = "s2s_deploy_plugins.models.longt5:LongT5"

    def config_from_hf(self, hf: Mapping[str, Any], tied: bool) -> LongT5Config:
        kind = hf.get("encoder_attention_type", "local")
        if kind not in ("local", "transient-global"):
            raise CheckpointError(f"longt5: unknown encoder_attention_type {kind!r}")
        return LongT5Config(**asdict(super().config_from_hf(hf, tied)), local_radius=int(hf.get("local_radius", 127)),
                            transient_global=kind == "transient-global",
                            global_block_size=int(hf.get("global_block_size", 16)))


PLUGIN = LongT5Plugin()
