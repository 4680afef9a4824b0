"""A Whisper folder with a tokenizer in Whisper's own layout, written by ``transformers.WhisperTokenizer``.

The other Whisper tests use a word-level ``tokenizer.json``. Hub folders ship a byte-level BPE
instead, followed by ``<|endoftext|>``, ``<|startoftranscript|>``, 100 language tokens, the task
and control tokens, and 1,501 timestamps ``<|0.00|>`` .. ``<|30.00|>``, stored as added tokens.
Here a small byte-level BPE (trained by ``tokenizers`` on a few English, French and German lines)
takes the place of GPT-2's 50,256 merges, and ``WhisperTokenizer`` adds the special tokens in the
hub's order and saves the folder's ``tokenizer.json``, as the hub's files were made. Our
text and segment texts must equal what transformers' tokenizer decodes from ``generate``'s tokens,
for any language code of the 100.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_hf_whisper import clips, lean

from s2s_deploy.cli import main

transformers = pytest.importorskip("transformers")
whisper_tokenization = pytest.importorskip("transformers.models.whisper.tokenization_whisper")

RATE = 16000
MAX_NEW = 16
CLIPS = 12
CORPUS = ("twenty-one weeks after December 31, 1999", "vingt et une semaines après le 31 décembre 1999",
          "einundzwanzig Wochen nach dem 31. Dezember 1999", "ça coûte 5 € — naïve café", "Mittwoch, 3. März 2021")
CONTROL = ("<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>")
STAMPS = 1501


def whisper_tokenizer(root: Path) -> Any:
    """``WhisperTokenizer`` over a byte-level BPE of 350 ids, with Whisper's special tokens after it."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(list(CORPUS) * 20, vocab_size=350, min_frequency=1, show_progress=False)
    vocab = bpe.get_vocab()
    vocab["<|endoftext|>"] = len(vocab)  # GPT-2's last id, as in Whisper's vocab.json
    bpe.save_model(str(root))
    merges = [tuple(line.split()) for line in (root / "merges.txt").read_text().splitlines()[1:] if line.strip()]
    tokenizer = transformers.WhisperTokenizer(vocab=vocab, merges=merges)
    languages = [f"<|{code}|>" for code in whisper_tokenization.LANGUAGES]
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|startoftranscript|>", *languages, *CONTROL]})
    tokenizer.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(STAMPS)])
    return tokenizer


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from s2s_deploy.runtime.transcriber import Transcriber

    root = tmp_path_factory.mktemp("whisper-tokenizer")
    hf_dir, out = root / "hf", root / "out"
    hf_dir.mkdir()
    tokenizer = whisper_tokenizer(root)
    ids = tokenizer.convert_tokens_to_ids
    eos, sot, no_timestamps = ids("<|endoftext|>"), ids("<|startoftranscript|>"), ids("<|notimestamps|>")
    specials = list(range(sot, no_timestamps))
    config = transformers.WhisperConfig(
        vocab_size=len(tokenizer), num_mel_bins=80, d_model=64, encoder_layers=1, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=50, max_target_positions=64, pad_token_id=eos, bos_token_id=eos, eos_token_id=eos,
        decoder_start_token_id=sot, suppress_tokens=specials, begin_suppress_tokens=[ids("Ġ"), eos], init_std=0.3)
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    extractor = transformers.WhisperFeatureExtractor(feature_size=80, sampling_rate=RATE, hop_length=160,
                                                     chunk_length=1, n_fft=400)
    audio = clips(CLIPS, 0.3, 1.0, seed=3)
    features = torch.from_numpy(np.stack([extractor(a, sampling_rate=RATE)["input_features"][0] for a in audio]))
    lean(model, features, [eos], 0.85, keep=0.5)
    lean(model, features, list(range(no_timestamps + 1, no_timestamps + 52)), 0.45, keep=0.5)  # 0.00-1.00 s
    generation = model.generation_config
    generation.lang_to_id = {f"<|{code}|>": ids(f"<|{code}|>") for code in whisper_tokenization.LANGUAGES}
    generation.task_to_id = {"translate": ids("<|translate|>"), "transcribe": ids("<|transcribe|>")}
    generation.no_timestamps_token_id = no_timestamps
    generation.max_initial_timestamp_index = 10
    generation.is_multilingual = True
    generation.language, generation.task = "en", "transcribe"
    generation._from_model_config = False  # as a hub folder's: transformers drops these keys otherwise
    model.save_pretrained(hf_dir)
    extractor.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    result = CliRunner().invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    transcriber = Transcriber(out, device="cpu")
    yield {"model": model, "tokenizer": tokenizer, "transcriber": transcriber, "audio": audio,
           "features": [transcriber.features(a) for a in audio], "eos": eos}


def test_the_folder_is_whisper_s_layout(whisper: dict[str, Any]) -> None:
    """The export lists the 100 languages and both tasks, and ids sit where Whisper's tokenizer puts them."""
    from s2s_deploy.format.manifest import load_manifest

    vocab = load_manifest(whisper["transcriber"].translator.manifest.directory).tgt_vocab
    tokenizer = whisper["tokenizer"]
    assert len(vocab) == len(tokenizer) == 350 + 1 + 1 + 100 + len(CONTROL) + STAMPS
    assert len(vocab.languages) == 100 and len(vocab.tasks) == 2
    assert tokenizer.convert_ids_to_tokens(len(tokenizer) - 1) == "<|30.00|>"


@pytest.mark.parametrize("language", ["en", "de", "yue"])
def test_texts_and_segments_are_what_the_tokenizer_decodes(whisper: dict[str, Any], language: str) -> None:
    """A language code of the 100 (``yue``: the last one large-v3 added) picks the same token as
    ``generate(language=...)``; our text is the tokenizer's ``batch_decode`` of ``generate``'s tokens,
    and each segment's times and text are ``generate(return_segments=True)``'s, decoded by the tokenizer. Timestamped:
    this model leans toward timestamps, and without ``return_timestamps`` transformers' own answers
    then depend on how ``generate`` is called (batched, it cuts a row at a timestamp pair)."""
    tokenizer, clips = whisper["tokenizer"], whisper["features"]
    with torch.no_grad():
        out = whisper["model"].generate(input_features=torch.from_numpy(np.stack(clips)),
                                        attention_mask=torch.ones(len(clips), clips[0].shape[-1], dtype=torch.long),
                                        max_new_tokens=MAX_NEW, language=language, return_timestamps=True,
                                        return_segments=True)
    ours = whisper["transcriber"](whisper["audio"], beam=1, max_len=MAX_NEW, target_lang=language, timestamps=True)
    assert [t.text for t in ours] == tokenizer.batch_decode(out["sequences"], skip_special_tokens=True)
    assert sum(bool(t.text.strip()) for t in ours) >= CLIPS // 4  # texts, not only empty strings
    assert {t.language for t in ours} == {language}
    for segments, got in zip(out["segments"], ours, strict=True):
        want = [(float(s["start"]), float(s["end"]), tokenizer.decode(s["tokens"], skip_special_tokens=True))
                for s in segments]
        assert [(s.start, s.end, s.text) for s in got.segments] == want
    assert sum(len(t.segments) for t in ours) >= CLIPS  # segments really occur
