"""LED (Hugging Face ``LEDForConditionalGeneration``, ``model_type`` ``led``), from ``transformers``'
arithmetic: BART's layers (post-norm, an embedding LayerNorm, no embedding scale, tied output and
``final_logits_bias``) whose encoder self-attention is Longformer's sliding window.

**Positions.** Both stacks read their learned table from position 0 (no BART ``+ 2``); the encoder's
holds ``max_encoder_position_embeddings`` rows, the decoder's ``max_decoder_position_embeddings``.

**The sliding window.** Encoder layer ``i`` lets token ``t`` see the tokens ``t - w .. t + w`` of its
sentence, ``w = attention_window[i] / 2``; padding is masked with the float minimum, as
``transformers`` adds it. ``transformers`` pads the source to a multiple of the largest window and
computes the window's ``2w + 1`` scores in overlapping chunks. Here the padded sequence is cut into
blocks of ``w`` tokens and each block's queries score the keys of their own block and both
neighbours (``3w`` keys, ``s2s_deploy.modeling.parts.three_blocks``), those farther than ``w`` or on
padding masked. That is exact: a real token's softmax runs over the same keys with the same scores,
and a masked key's weight is ``exp(min - max) = 0`` exactly, so only the order of float sums
differs; a token never sees a key more than ``w`` away, so how far the source is padded changes
nothing (padding is to a multiple of the largest ``w``, which every layer's ``w`` divides). It costs
``3w`` scores per token and head against ``transformers``' ``2w + 1``: linear in the source
length, as Longformer's, where a banded mask over full attention would hold ``L²`` scores per head
(16,384 tokens at 16 heads: 17 GB of float32 per sentence and layer).

**Global attention is not exported.** ``generate`` gives no token global attention unless it is
passed a ``global_attention_mask``, and the runtime has no such input, so the exported encoder is
``generate``'s without one; the ``query_global``/``key_global``/``value_global`` weights are not
exported. (LED's documentation recommends global attention on the first token for summarisation:
that is a ``generate(..., global_attention_mask=...)`` the export does not reproduce.)

Refused at export, one line naming the key, where ``transformers`` itself cannot run the model: a
window list whose length is not ``encoder_layers``, an odd window, a window of 2 (its chunking
fails for a one-sided window of 1) and a layer's window that does not divide the largest (it pads
only to the largest, and the chunking then fails on most lengths).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from s2s_deploy.architecture.declaration import HFWeights
from s2s_deploy.architecture.encoder_decoder import (
    EncoderDecoderConfig,
    EncoderDecoderPlugin,
    PositionKind,
    hf_encoder_decoder_config,
)
from s2s_deploy.errors import CheckpointError

GLOBAL_PROJECTION = re.compile(r"\.longformer_self_attn\.(query|key|value)_global\.")


@dataclass(frozen=True)
class LEDConfig(EncoderDecoderConfig):
    """BART's config (``max_position_embeddings`` is the decoder's table) plus the encoder's:
    ``attention_window`` per encoder layer (even, at least 4, each dividing the largest) and its
    position table."""

    positions: PositionKind = "learned_from_zero"
    attention_window: tuple[int, ...] = (4, 8)
    max_encoder_position_embeddings: int = 128

    def __post_init__(self) -> None:
        windows = self.attention_window
        if not isinstance(windows, (list, tuple)) or len(windows) != self.encoder_layers or not all(
                isinstance(w, int) and not isinstance(w, bool) and w >= 4 and w % 2 == 0 for w in windows):
            raise CheckpointError(f"led: config attention_window={windows!r:.60} must list one even window of at "
                                  f"least 4 per encoder layer ({self.encoder_layers})")
        if any(max(windows) % w for w in windows):
            raise CheckpointError(f"led: config attention_window={list(windows)!r:.60}: every layer's window must "
                                  "divide the largest (transformers pads the source to the largest only)")
        table = self.max_encoder_position_embeddings
        if isinstance(table, bool) or not isinstance(table, int) or table < max(windows):
            raise CheckpointError(f"led: config max_encoder_position_embeddings={table!r:.40} must be a whole "
                                  f"number at least the largest attention_window, {max(windows)}")
        object.__setattr__(self, "attention_window", tuple(windows))  # a list when read back from JSON


class LEDPlugin(EncoderDecoderPlugin):
    name = "led"
    version = "1.0"
    description = "Hugging Face LED: BART whose encoder attends within a sliding window (no global tokens)"
    config_type = LEDConfig
    model = "s2s_deploy_plugins.models.led:LED"
    presets: ClassVar[dict[str, LEDConfig]] = {"tiny": LEDConfig()}
    default_preset = "tiny"
    hf_model_types = ("led",)

    def max_source_length(self, config: LEDConfig) -> int:
        """``transformers`` reads positions for the source padded to a multiple of the largest
        window, so the longest source is the table's size rounded down to one."""
        widest = max(config.attention_window)
        return config.max_encoder_position_embeddings // widest * widest

    def config_from_hf(self, hf: Mapping[str, Any]) -> LEDConfig:
        windows = hf.get("attention_window", 512)
        if isinstance(windows, int) and not isinstance(windows, bool):
            windows = [windows] * int(hf["encoder_layers"])
        # transformers' defaults for the tables a config.json leaves out
        decoder_table = hf.get("max_decoder_position_embeddings", 1024)
        base = hf_encoder_decoder_config({**hf, "max_position_embeddings": decoder_table},
                                         positions="learned_from_zero", scale_embedding=False)
        return LEDConfig(**{**asdict(base), "attention_window": windows,
                            "max_encoder_position_embeddings": hf.get("max_encoder_position_embeddings", 16384)})

    def from_hf(self, hf: Mapping[str, Any], tensors: Mapping[str, Any]) -> HFWeights:
        """``led.`` instead of BART's ``model.``; the global-attention projections are left out."""
        kept = {name.removeprefix("led."): t for name, t in tensors.items() if not GLOBAL_PROJECTION.search(name)}
        return super().from_hf(hf, kept)


PLUGIN = LEDPlugin()
