"""The vision encoder-decoder settings tests/test_hf_vision.py leaves out, against ``generate``.

    python benchmarks/vision_variants.py [deit|cross ...]

``deit``: a DeiT encoder (distillation token) of width 48 behind ``enc_to_dec_proj``, no q/k/v biases,
a TrOCR decoder with sinusoidal positions, ``scale_embedding``, no embedding LayerNorm and ReLU,
ImageNet mean/std and bilinear resizing. ``cross``: the same but with ``cross_attention_hidden_size``
48 (the decoder's cross-attention reads the encoder's width), q/k/v biases and an embedding LayerNorm.
Each exports a tiny random folder (seeded, no network) and prints the front end's largest
|ours − transformers| and the tokens identical to ``generate`` on the test's 20 PNGs, greedy and beam 4
(the rows of docs/families.md). ``generate`` runs on the in-memory model: transformers 5.24 leaves
a sinusoidal TrOCR table on the meta device in ``from_pretrained``, so the loaded one cannot decode.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from click.testing import CliRunner
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import test_hf_vision as shared

from s2s_deploy.cli import main
from s2s_deploy.runtime.captioner import Captioner


def run(variant: str, root: Path) -> None:
    pictures = root / "images"
    pictures.mkdir(parents=True)
    paths = shared.images(pictures)
    encoder_type = transformers.DeiTConfig
    encoder = encoder_type(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=96, initializer_range=0.3, qkv_bias=variant == "cross")
    decoder = transformers.TrOCRConfig(
        vocab_size=shared.VOCAB, d_model=64, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=128,
        max_position_embeddings=64, init_std=0.3, bos_token_id=0, pad_token_id=1, eos_token_id=2,
        decoder_start_token_id=2, use_learned_position_embeddings=False, scale_embedding=True,
        layernorm_embedding=variant == "cross", activation_function="relu",
        cross_attention_hidden_size=48 if variant == "cross" else None)
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 2, 1, 2
    processor = transformers.ViTImageProcessorPil(size={"height": 32, "width": 32}, resample=2, do_convert_rgb=True,
                                                  image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    theirs = np.stack([processor(Image.open(p), return_tensors="np").pixel_values[0] for p in paths])
    torch.manual_seed(0)
    model = transformers.VisionEncoderDecoderModel(config).eval()
    shared.favour_eos(model, torch.from_numpy(theirs))
    model.save_pretrained(root / "hf")
    processor.save_pretrained(root / "hf")
    result = CliRunner().invoke(main, ["export", "--hf", str(root / "hf"), "--out", str(root / "out")])
    if result.exit_code:
        raise SystemExit(result.output)
    captioner = Captioner(root / "out", device="cpu")
    ours = np.stack([captioner.features(p) for p in paths])
    print(f"{variant}: front end max |diff| {float(np.abs(ours - theirs).max()):.2g}")
    for beams in (1, 4):
        config = captioner.translator.search_config(beams, 1, shared.MAX_NEW)
        found = captioner.translator.engine.search(ours, np.ones(len(ours), dtype=np.int64), config)
        want = shared.generated(model, ours, beams)
        same = sum(hyps[0].tokens == row for hyps, row in zip(found, want, strict=True))
        early = sorted(len(row) for row in want if len(row) < shared.MAX_NEW)
        print(f"{variant}: beam {beams}: {same}/{len(want)} identical to generate; ended early {len(early)} {early}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    for name in sys.argv[1:] or ["deit", "cross"]:
        work = Path(tempfile.mkdtemp())
        try:
            run(name, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
