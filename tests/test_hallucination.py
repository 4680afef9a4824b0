"""faster-whisper's word timing and ``hallucination_silence_threshold`` against their own code.

The tiny timestamped Whisper of tests/test_hf_whisper_timestamps.py, with alignment heads, is exported
once with ``--word-timestamps``. ``align`` (runtime/align.py, CTranslate2's ``Whisper.align`` on our
engine) must give, on the same window and text tokens, the token times and probabilities of openai-whisper's
own ``timing.find_alignment``, which CTranslate2 reimplements, run on the same weights loaded into
openai-whisper's ``Whisper`` model.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai_whisper = pytest.importorskip("whisper")

HEADS = [[1, 0], [1, 2], [0, 3]]


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory, hf_exports: Any) -> dict[str, Any]:
    from test_hf_whisper_timestamps import save_timestamp_whisper

    from s2s_deploy.runtime.transcriber import Transcriber

    hf_dir = tmp_path_factory.mktemp("hallucination") / "hf"
    save_timestamp_whisper(hf_dir, 0.55, keep=0.5)
    raw = json.loads((hf_dir / "generation_config.json").read_text())
    (hf_dir / "generation_config.json").write_text(json.dumps({**raw, "alignment_heads": HEADS}))
    out = hf_exports.get(hf_dir, "--word-timestamps")
    return {"hf_dir": hf_dir, "out": out, "transcriber": Transcriber(out, device="cpu")}


def openai_model(hf_dir: Any) -> Any:
    """The folder's weights in openai-whisper's ``Whisper`` (the names transformers' converter maps),
    its alignment heads set to the folder's."""
    import whisper.model as wm

    hf = transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir, local_files_only=True).eval()
    c = hf.config
    assert torch.equal(hf.proj_out.weight, hf.model.decoder.embed_tokens.weight)  # openai-whisper's logits are tied
    dims = wm.ModelDimensions(c.num_mel_bins, c.max_source_positions, c.d_model, c.encoder_attention_heads,
                              c.encoder_layers, c.vocab_size, c.max_target_positions, c.d_model,
                              c.decoder_attention_heads, c.decoder_layers)
    model = wm.Whisper(dims)
    for block, ffn in [*((b, c.encoder_ffn_dim) for b in model.encoder.blocks),
                       *((b, c.decoder_ffn_dim) for b in model.decoder.blocks)]:  # openai-whisper's is 4 d_model
        linear = torch.nn.Linear
        block.mlp = torch.nn.Sequential(linear(c.d_model, ffn), torch.nn.GELU(), linear(ffn, c.d_model))
    renames = [(".layers.", ".blocks."), ("encoder.embed_positions.weight", "encoder.positional_embedding"),
               ("decoder.embed_positions.weight", "decoder.positional_embedding"),
               ("decoder.embed_tokens", "decoder.token_embedding"), ("encoder.layer_norm", "encoder.ln_post"),
               ("decoder.layer_norm", "decoder.ln"), (".self_attn.q_proj.", ".attn.query."),
               (".self_attn.k_proj.", ".attn.key."), (".self_attn.v_proj.", ".attn.value."),
               (".self_attn.out_proj.", ".attn.out."), (".self_attn_layer_norm.", ".attn_ln."),
               (".encoder_attn.q_proj.", ".cross_attn.query."), (".encoder_attn.k_proj.", ".cross_attn.key."),
               (".encoder_attn.v_proj.", ".cross_attn.value."), (".encoder_attn.out_proj.", ".cross_attn.out."),
               (".encoder_attn_layer_norm.", ".cross_attn_ln."), (".fc1.", ".mlp.0."), (".fc2.", ".mlp.2."),
               (".final_layer_norm.", ".mlp_ln.")]
    state = {}
    for key, value in hf.model.state_dict().items():
        for theirs, ours in renames:
            key = key.replace(theirs, ours)
        state[key] = value
    model.load_state_dict(state, strict=True)
    heads = torch.zeros(dims.n_text_layer, dims.n_text_head, dtype=torch.bool)
    for layer, head in HEADS:
        heads[layer, head] = True
    model.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)
    return model.eval()


def per_token(eot: int, sot_sequence: list[int], no_timestamps: int) -> Any:
    """A tokenizer for ``find_alignment`` whose every token is a word: its word times are then the token
    times (``jump_times``), its word probabilities the token probabilities."""
    return SimpleNamespace(sot_sequence=sot_sequence, no_timestamps=no_timestamps, eot=eot,
                           split_to_word_tokens=lambda tokens: ([str(t) for t in tokens], [[t] for t in tokens]))


def jump_times(alignments: tuple[tuple[int, int], ...]) -> np.ndarray:
    """faster-whisper's ``find_alignment`` reading of CTranslate2's pairs: each text index's first time."""
    text = np.array([pair[0] for pair in alignments])
    time = np.array([pair[1] for pair in alignments])
    jumps = np.pad(np.diff(text), (1, 0), constant_values=1).astype(bool)
    return time[jumps] / 50


def test_align_is_openai_whispers_find_alignment(whisper: dict[str, Any]) -> None:
    from test_hf_whisper import clips
    from test_hf_whisper_timestamps import BEGIN, EOS, FR, NO_TIMESTAMPS, SOT, TRANSCRIBE

    from s2s_deploy.runtime.align import align

    transcriber = whisper["transcriber"]
    model = openai_model(whisper["hf_dir"])
    sot_sequence = [SOT, FR, TRANSCRIBE]
    tokenizer = per_token(EOS, sot_sequence, NO_TIMESTAMPS)
    rng = np.random.default_rng(3)
    audio = clips(8, 0.3, 1.0, seed=4)
    features_all = np.stack([transcriber.features(clip) for clip in audio])
    config = transcriber.translator.search_config(max_len=20)
    found = transcriber.translator.engine.search(features_all, np.full(len(audio), features_all.shape[-1]), config)
    compared = 0
    for clip, features, hyps in zip(audio, features_all, found, strict=True):
        num_frames = min(features.shape[-1], round(len(clip) / 160))
        generated = [t for t in hyps[0].tokens if t < EOS]
        for text in (generated, rng.integers(3, 100, int(rng.integers(1, 12))).tolist()):
            if not text:
                continue
            ours = align(transcriber.translator.backend, features[None], sot_sequence, [text], num_frames,
                         NO_TIMESTAMPS)[0]
            with torch.no_grad():
                theirs = openai_whisper.timing.find_alignment(model, tokenizer, text, torch.from_numpy(features),
                                                              num_frames)
            times = jump_times(ours.alignments)
            assert len(times) == len(text) + 1 and len(ours.text_token_probs) == len(text)
            np.testing.assert_array_equal(times[:-1], [w.start for w in theirs])
            np.testing.assert_array_equal(times[1:], [w.end for w in theirs])
            np.testing.assert_allclose(ours.text_token_probs, [w.probability for w in theirs], rtol=1e-4, atol=1e-6)
            compared += 1
    assert compared >= 12
    assert BEGIN > EOS  # timestamps are not text: align is never fed them
