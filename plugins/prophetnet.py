"""ProphetNet and XLM-ProphetNet (Hugging Face ``ProphetNetForConditionalGeneration``,
``model_type`` ``prophetnet`` and ``xlm-prophetnet``), from ``transformers``' arithmetic without
importing it. XLM-ProphetNet is the same model under another name (its modeling file was a copy
of ProphetNet's, its config ProphetNet's with other defaults), so both map through one
``config_from_hf``.

The encoder is BERT-like: learned positions read at ``1 + index`` (clamped to the table), an
embedding LayerNorm, post-norm layers. The decoder runs ``1 + ngram`` streams through each layer:
the main stream (the tokens so far, a causal self-attention) and ``ngram`` predicting streams, each
attending to the main stream's keys and values and its own. ``generate`` reads the logits of the
first predicting stream (``predict_logits[:, 0]``, fed ``ngram_embeddings[ngram - 1]`` plus the
position one past the token's); the other streams never reach it, so they are not computed.

Its cache (``use_cache=True``) holds only the main stream's keys and values, so the step contract
is the usual one: one token in, a self-attention K/V cache per layer grown by one, the cross K/V
from the encoder. A step runs two queries (the main stream's and the first predicting stream's)
over the cache, the main key and the predicting stream's own key. Both add a relative position
bias that the hidden state itself projects (``relative_pos_embeddings``: a ``(buckets, heads)``
row per query), read at bucket ``t - j`` (main) and ``t + 1 - j`` (predicting; ``0`` for its
own key), as ``generate``'s cached steps compute them. A whole-prefix forward without the cache
(``use_cache=False``) reads that bias in another order and gives other logits; the export follows
``generate`` (``hf_step_cache``).

Two settings ``generate`` itself cannot decode are refused: ``pad_token_id`` other than 0 (its
cached positions assume it) and a decoder without cross-attention.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from s2s_deploy.architecture.declaration import (
    ArchitecturePlugin,
    HFWeights,
    MemorySpec,
    StateSpec,
    cross_memory_specs,
    self_attention_cache,
)
from s2s_deploy.errors import CheckpointError


@dataclass(frozen=True)
class ProphetNetConfig:
    d_model: int = 128
    encoder_layers: int = 2
    decoder_layers: int = 2
    encoder_attention_heads: int = 4
    decoder_attention_heads: int = 4
    encoder_ffn_dim: int = 512
    decoder_ffn_dim: int = 512
    max_position_embeddings: int = 128
    ngram: int = 2
    num_buckets: int = 32
    relative_max_distance: int = 128
    activation_function: str = "gelu"
    tie_word_embeddings: bool = True
    dropout: float = 0.0


class ProphetNetPlugin(ArchitecturePlugin):
    name = "prophetnet"
    version = "1.0"
    description = "Hugging Face ProphetNet/XLM-ProphetNet: n-gram predicting streams, content-projected relative bias"
    config_type = ProphetNetConfig
    model = "s2s_deploy_plugins.models.prophetnet:ProphetNet"
    presets: ClassVar[dict[str, ProphetNetConfig]] = {"tiny": ProphetNetConfig()}
    default_preset = "tiny"
    exporter = "dynamo"
    parity_atol = 3e-4
    """Measured on tests/test_hf_families.py's tiny model (weights at std 0.3): float32 PyTorch and
    ONNX Runtime each come within 0.9e-4 and 1.2e-4 of a float64 run (log p above -10), and up
    to 1.9e-4 of each other, beyond the default 1e-4 + 1e-5 * |log p| though both round honestly:
    every layer adds a content-projected bias to its scores, in both streams."""
    has_attention = True
    hf_model_types = ("prophetnet", "xlm-prophetnet")
    hf_tokenizer_converter = "BertConverter"  # ProphetNetTokenizer is BERT's WordPiece, run in Python
    hf_ids_only: ClassVar[dict[str, str]] = {"xlm-prophetnet": (
        "transformers 5 ships no XLMProphetNetTokenizer to read its sentencepiece.bpe.model with or to check "
        "an export against (docs/families.md)")}
    hf_step_cache = True

    def memory_specs(self, config: ProphetNetConfig) -> tuple[MemorySpec, ...]:
        return cross_memory_specs(config.decoder_layers)

    def state_specs(self, config: ProphetNetConfig) -> tuple[StateSpec, ...]:
        heads = config.decoder_attention_heads
        return self_attention_cache(config.decoder_layers, heads, config.d_model // heads)

    def max_target_length(self, config: ProphetNetConfig) -> int | None:
        """Step ``t`` reads position rows ``1 + t`` and ``2 + t``; ``generate``'s cached steps do
        not clamp them, so the table bounds the target."""
        return config.max_position_embeddings - 2

    def config_from_hf(self, hf: Mapping[str, Any], tied: bool) -> ProphetNetConfig:
        if hf.get("pad_token_id", 0) != 0:
            raise CheckpointError(f"{self.name}: config pad_token_id={hf.get('pad_token_id')!r} is not supported: "
                                  "transformers' cached generate reads positions as if it were 0 (and refuses others)")
        if hf.get("add_cross_attention", True) is False:
            raise CheckpointError(f"{self.name}: config add_cross_attention=false: a decoder that does not read "
                                  "the encoder is not a translation model")
        hidden, heads = int(hf["hidden_size"]), int(hf["num_decoder_attention_heads"])
        if hidden % heads or hidden % int(hf["num_encoder_attention_heads"]):
            raise CheckpointError(f"{self.name}: config hidden_size={hidden} is not a multiple of the attention heads")
        return ProphetNetConfig(
            d_model=hidden, encoder_layers=hf["num_encoder_layers"], decoder_layers=hf["num_decoder_layers"],
            encoder_attention_heads=hf["num_encoder_attention_heads"], decoder_attention_heads=heads,
            encoder_ffn_dim=hf["encoder_ffn_dim"], decoder_ffn_dim=hf["decoder_ffn_dim"],
            max_position_embeddings=hf.get("max_position_embeddings", 512), ngram=hf.get("ngram", 2),
            num_buckets=hf.get("num_buckets", 32), relative_max_distance=hf.get("relative_max_distance", 128),
            activation_function=hf.get("activation_function", "gelu"), tie_word_embeddings=tied)

    def from_hf(self, hf: Mapping[str, Any], tensors: Mapping[str, Any]) -> HFWeights:
        """Hugging Face names minus ``prophetnet.``; the encoder's and decoder's copies of the one
        word table dropped (refused if they differ), ``lm_head`` kept only when it is not that table."""
        names = ("prophetnet.word_embeddings.weight", "prophetnet.encoder.word_embeddings.weight",
                 "prophetnet.decoder.word_embeddings.weight")
        shared = next((tensors[name] for name in names if name in tensors), None)
        if shared is None:
            raise CheckpointError(f"{self.name}: the folder holds no prophetnet.word_embeddings.weight")
        weights: dict[str, Any] = {"word_embeddings.weight": shared}
        head = tensors.get("lm_head.weight")
        tied = head is None or bool(head.equal(shared))
        for name, tensor in tensors.items():
            key = name.removeprefix("prophetnet.")
            if key.endswith("word_embeddings.weight"):
                if not tensor.equal(shared):
                    raise CheckpointError(f"{self.name}: {name} differs from the shared word table: separate "
                                          "encoder and decoder embeddings are not supported")
                continue
            if tied and key == "lm_head.weight":
                continue
            weights[key] = tensor
        vocab = int(hf["vocab_size"])
        return HFWeights(self.config_from_hf(hf, tied), weights, vocab, vocab)


PLUGIN = ProphetNetPlugin()
