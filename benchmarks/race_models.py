"""Seeded random models of deployed sizes for the family races (issue #36), and their inputs.

``../shared/peers`` races one Marian transformer-base. The larger families are raced the same way
on a model of their real shape with random weights, built here so every engine converts the same
folder: an NLLB-200-distilled-600M-sized M2M100 (d 1024, 12+12 layers, FFN 4096, 16 heads, a
256,206-token vocabulary) and an mT5-small-sized model (d 512, 8+8 layers, gated-GELU FFN 1024,
6 heads of 64, an untied 250,112-token vocabulary). Run it with the peers' interpreter (the
converters need ``transformers`` < 4.58), then convert the folder with each engine:

    P=/work/peers-venv/bin/python R=/tmp/race/nllb
    $P benchmarks/race_models.py nllb --out $R
    $P -m ctranslate2.converters.transformers --model $R/hf --output_dir $R/ct2-fp32 --force
    $P -m ctranslate2.converters.transformers --model $R/hf --output_dir $R/ct2-int8 --quantization int8 --force
    /work/peers-venv/bin/optimum-cli export onnx --model $R/hf --task text2text-generation-with-past $R/optimum
    s2s-deploy export --hf $R/hf --out $R/s2s-fp32 --no-checkpoint
    s2s-deploy quantize $R/s2s-fp32 --out $R/s2s-int8

The folder's ``inputs.json`` holds the 32 source id sequences every engine decodes (as the
harness's: 15 to 25 ids, the family's EOS last), drawn from a seeded generator. The generation
config is neutral (no forced BOS/EOS, no length or beam defaults): the race passes everything.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

SEED = 20261127
SENTENCES = 32


def nllb_config() -> Any:
    from transformers import M2M100Config

    return M2M100Config(vocab_size=256206, d_model=1024, encoder_layers=12, decoder_layers=12,
                        encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
                        decoder_ffn_dim=4096, max_position_embeddings=1024, scale_embedding=True,
                        activation_function="relu", pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        decoder_start_token_id=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


def mt5_config() -> Any:
    from transformers import MT5Config

    return MT5Config(vocab_size=250112, d_model=512, d_kv=64, d_ff=1024, num_layers=8, num_decoder_layers=8,
                     num_heads=6, feed_forward_proj="gated-gelu", tie_word_embeddings=False, pad_token_id=0,
                     eos_token_id=1, decoder_start_token_id=0, dropout_rate=0.0)


FAMILIES = {"nllb": (nllb_config, "M2M100ForConditionalGeneration", ("<s>", "<pad>", "</s>", "<unk>")),
            "mt5": (mt5_config, "MT5ForConditionalGeneration", ("<pad>", "</s>", "<unk>"))}


def write_tokenizer(folder: Path, size: int, specials: tuple[str, ...]) -> None:
    """A word-level tokenizer of the model's size (``t<id>`` words): the converters read the
    vocabulary through ``AutoTokenizer``; every engine is fed ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {w: i for i, w in enumerate([*specials, *(f"t{i}" for i in range(len(specials), size))])}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    named = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    if "<s>" in specials:
        named["bos_token"] = "<s>"
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, **named).save_pretrained(folder)


def build(family: str, out: Path) -> None:
    import torch
    import transformers

    config_of, class_name, specials = FAMILIES[family]
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(config_of()).eval()
    generation = model.generation_config
    generation.forced_bos_token_id = generation.forced_eos_token_id = None
    generation.max_length, generation.num_beams = 512, 1
    model.save_pretrained(out / "hf")
    write_tokenizer(out / "hf", model.config.vocab_size, specials)
    rng = random.Random(SEED)
    first, eos = len(specials), model.config.eos_token_id
    sources = [[rng.randint(first, model.config.vocab_size - 1) for _ in range(rng.randint(15, 25) - 1)] + [eos]
               for _ in range(SENTENCES)]
    (out / "inputs.json").write_text(json.dumps({"seed": SEED, "family": family, "sources": sources}))
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{family}: {parameters / 1e6:.1f}M parameters in {out / 'hf'}; {SENTENCES} inputs in {out / 'inputs.json'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    build(args.family, args.out)


if __name__ == "__main__":
    main()
