"""Hugging Face vision encoder-decoders (ViT + TrOCR) against ``transformers``' own
``VisionEncoderDecoderModel.generate``.

A tiny random model (32x32 images, 8x8 patches, width 64, 2+2 layers, 128 ids; TrOCR's specials
``<s>`` 0, ``<pad>`` 1, ``</s>`` 2 as start and end, 3 ``<unk>``) is saved with ``save_pretrained``
beside a ``ViTImageProcessor``'s ``preprocessor_config.json`` (bicubic, as TrOCR's) and a word-level
``tokenizer.json``; no network. It is exported once with ``export --hf``, and 20 seeded synthetic
PNGs of different sizes and modes (RGB, grey, RGBA with transparency), read by the torch-free front
end, must decode token-identically to ``generate`` on the same pixels, greedy and beam 4.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from s2s_deploy.cli import main

transformers = pytest.importorskip("transformers")
image_module = pytest.importorskip("PIL.Image", reason="the image front end resizes with Pillow")

VOCAB = 128
BOS, PAD, EOS, UNK = 0, 1, 2, 3
SIZE = 32
MAX_NEW = 20
INPUTS = 20
IMAGE_ATOL = 1e-6  # docs/parity.md, "Front ends": measured 0


def vision_config() -> Any:
    encoder = transformers.ViTConfig(image_size=SIZE, patch_size=8, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128, initializer_range=0.3)
    decoder = transformers.TrOCRConfig(vocab_size=VOCAB, d_model=64, decoder_layers=2, decoder_attention_heads=4,
                                       decoder_ffn_dim=128, max_position_embeddings=64, init_std=0.3,
                                       bos_token_id=BOS, pad_token_id=PAD, eos_token_id=EOS,
                                       decoder_start_token_id=EOS)  # peaked, tie-free logits (0.02: near-uniform)
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = EOS, PAD, EOS
    return config


def images(folder: Path, count: int = INPUTS) -> list[Path]:
    """Seeded PNGs, 12 to 90 pixels a side: gradients under noise, with a dark band; every third grey,
    every third RGBA with uneven transparency (composited on white, as transformers does)."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        height, width = (int(n) for n in rng.integers(12, 91, 2))
        y, x = np.mgrid[0:height, 0:width]
        slope = rng.uniform(-4, 4, (2, 3))
        pixels = 128 + x[..., None] * slope[0] + y[..., None] * slope[1] + rng.normal(0, 40, (height, width, 3))
        top = int(rng.integers(0, height))
        pixels[top : top + max(1, height // 4)] *= rng.uniform(0, 0.5)
        image = image_module.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        if i % 3 == 1:
            image = image.convert("L")
        elif i % 3 == 2:
            alpha = np.clip(rng.uniform(0, 255) + x * rng.uniform(-3, 3), 0, 255).astype(np.uint8)
            image.putalpha(image_module.fromarray(alpha))
        paths.append(folder / f"image{i:02d}.png")
        image.save(paths[-1])
    return paths


def tokenizer_json(folder: Path) -> None:
    """One id per word: ``w<id>`` but the specials, a sentence framed ``<s> ... </s>`` as RoBERTa's."""
    from test_hf_families import write_word_level

    specials = {BOS: "<s>", PAD: "<pad>", EOS: "</s>", UNK: "<unk>"}
    write_word_level(folder, [specials.get(i, f"w{i}") for i in range(VOCAB)], "<s> $A </s>", ("<s>", "</s>"))


def favour_eos(model: Any, pixels: torch.Tensor, strength: float = 0.9) -> None:
    """Random weights almost never pick EOS: point its output row along the mean state the output
    layer reads, so its logit is ``strength`` times a typical best one and captions end at varied lengths."""
    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone())  # untied from the token table
    model.config.decoder.tie_word_embeddings = False
    seen = []
    hook = head.register_forward_hook(lambda _m, args, out: seen.append((args[0], out)))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model(pixel_values=pixels[:8], decoder_input_ids=torch.randint(4, VOCAB, (8, 12), generator=generator))
    hook.remove()
    states, logits = seen[0][0].reshape(-1, seen[0][0].shape[-1]), seen[0][1].reshape(-1, VOCAB)
    mean = states.mean(0)
    with torch.no_grad():
        head.weight[EOS] = mean * (strength * logits.max(-1).values.median()) / mean.dot(mean)



@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from s2s_deploy.runtime.captioner import Captioner

    root = tmp_path_factory.mktemp("vision")
    hf_dir, out, pictures = root / "trocr-hf", root / "trocr", root / "images"
    pictures.mkdir()
    paths = images(pictures)
    processor = transformers.ViTImageProcessorPil(size={"height": SIZE, "width": SIZE}, resample=3,
                                                  do_convert_rgb=True)
    opened = [image_module.open(path) for path in paths]
    hf_pixels = np.stack([processor(image, return_tensors="np").pixel_values[0] for image in opened])
    torch.manual_seed(0)
    model = transformers.VisionEncoderDecoderModel(vision_config()).eval()
    favour_eos(model, torch.from_numpy(hf_pixels))
    model.save_pretrained(hf_dir)
    processor.save_pretrained(hf_dir)
    tokenizer_json(hf_dir)
    result = CliRunner().invoke(main, ["export", "--hf", str(hf_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    loaded = transformers.VisionEncoderDecoderModel.from_pretrained(hf_dir, local_files_only=True).eval()
    captioner = Captioner(out, device="cpu")
    ours = np.stack([captioner.features(path) for path in paths])
    return {"hf_dir": hf_dir, "out": out, "model": loaded, "captioner": captioner, "paths": paths,
            "pixels": ours, "hf_pixels": hf_pixels}


def generated(model: Any, pixels: np.ndarray, beams: int) -> list[tuple[int, ...]]:
    """``generate``'s tokens after the decoder start, up to the first EOS."""
    with torch.no_grad():
        out = model.generate(pixel_values=torch.from_numpy(pixels), num_beams=beams, max_new_tokens=MAX_NEW)
    rows = [row[1:] for row in out.tolist()]
    return [tuple(row[: row.index(EOS)] if EOS in row else row) for row in rows]


def decoded(vision: dict[str, Any], beams: int, rows: int = INPUTS) -> list[tuple[int, ...]]:
    captioner = vision["captioner"]
    pixels = vision["pixels"][:rows]
    config = captioner.translator.search_config(beams, 1, MAX_NEW)
    src_len = np.ones(len(pixels), dtype=np.int64)
    return [hyps[0].tokens for hyps in captioner.translator.engine.search(pixels, src_len, config)]


def test_front_end_agrees_with_the_image_processor(vision: dict[str, Any]) -> None:
    assert vision["pixels"].shape == (INPUTS, 3, SIZE, SIZE)
    assert np.abs(vision["pixels"] - vision["hf_pixels"]).max() <= IMAGE_ATOL


def test_manifest_declares_the_image_front_end(vision: dict[str, Any]) -> None:
    from s2s_deploy.format.manifest import load_manifest

    manifest = load_manifest(vision["out"])
    spec = manifest.encoder_input
    assert spec.shape == (3, SIZE, SIZE) and spec.length_axis is None
    assert dict(spec.frontend) == {"kind": "vit_image", "height": SIZE, "width": SIZE, "resample": 3,
                                   "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255,
                                   "do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    assert manifest.decoder_start_id == EOS and manifest.eos_id == EOS


@pytest.mark.parametrize("beams", [1, 4])
def test_vision_matches_generate(vision: dict[str, Any], beams: int) -> None:
    ours = decoded(vision, beams)
    theirs = generated(vision["model"], vision["pixels"], beams)
    assert ours == theirs
    assert any(len(row) < MAX_NEW for row in theirs) and any(len(row) == MAX_NEW for row in theirs)
    assert len(set(theirs)) > INPUTS // 2  # the images decode differently: the encoder is read


def test_parity_reference_runs_on_images(vision: dict[str, Any], tmp_path: Path) -> None:
    listing = tmp_path / "images.txt"
    listing.write_text("".join(f"{path}\n" for path in vision["paths"][:8]))
    for extra in ([], ["--input", str(listing)]):
        result = CliRunner().invoke(main, ["parity", str(vision["out"]), "--reference", str(vision["hf_dir"]),
                                           "--max-len", "12", *extra])
        assert result.exit_code == 0 and "parity: PASS" in result.output, result.output
        assert f"tokens identical {8 if extra else 16}/" in result.output


def test_caption_prints_what_the_api_returns(vision: dict[str, Any], tmp_path: Path) -> None:
    paths = [str(p) for p in vision["paths"][:4]]
    result = CliRunner().invoke(main, ["caption", str(vision["out"]), *paths, "--beam", "4", "--n-best", "2",
                                       "--max-len", str(MAX_NEW), "--quiet"])
    assert result.exit_code == 0, result.output
    found = vision["captioner"](paths, beam=4, n_best=2, max_len=MAX_NEW)
    # n-best over several files: each line starts with its file's name
    assert result.output.splitlines() == [f"{c.source}\t{text}" for c in found for text, _ in c.hypotheses]
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    result = CliRunner().invoke(main, ["caption", str(vision["out"]), paths[0], str(tmp_path / "missing.png"),
                                       str(broken), paths[1], "--beam", "4", "--max-len", str(MAX_NEW), "--quiet"])
    assert result.exit_code == 1  # the good images printed, each bad one named, the failure at the end
    assert result.stdout.splitlines() == [found[0].text, found[1].text]
    errors = result.stderr.splitlines()
    assert errors[0] == f"error: image file not found: {tmp_path / 'missing.png'}"
    assert errors[1].startswith(f"error: cannot read image {broken}: ")
    assert errors[2:] == ["error: 2 of 4 image files could not be read (each named above)"]
    want = generated(vision["model"], vision["pixels"][:4], 4)
    assert [c.text for c in found] == [" ".join(f"w{i}" for i in row) for row in want]
    array = np.asarray(image_module.open(paths[0]).convert("RGB"))
    assert vision["captioner"](array, beam=4, max_len=MAX_NEW)[0].text == found[0].text


def test_caption_refuses_bad_input_in_one_line(vision: dict[str, Any], exports: Any, tmp_path: Path) -> None:
    from s2s_deploy.errors import S2SError

    not_image = tmp_path / "notes.png"
    not_image.write_text("not an image")
    _, text_export = exports.get("transformer")  # shared with the other tests of a session
    for export, args, message in (
            (vision["out"], [str(not_image)], "cannot read image"),
            (vision["out"], [str(tmp_path / "missing.png")], "not found"),
            (vision["out"], [str(vision["paths"][0]), "--output", str(tmp_path / "a.srt")], "--output"),
            (text_export.directory, [str(vision["paths"][0])], "use translate")):
        result = CliRunner().invoke(main, ["caption", str(export), *args])
        assert result.exit_code != 0 and message in result.output, result.output
        assert result.output.startswith("error:") and len(result.output.strip().splitlines()) == 1
    with pytest.raises(S2SError, match=r"\(height, width, 3\) uint8"):
        vision["captioner"](np.zeros((4, 4, 1), dtype=np.uint8))
    result = CliRunner().invoke(main, ["translate", str(vision["out"]), "w5 w6"])
    assert result.exit_code != 0 and "use caption" in result.output, result.output


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c, p: c["decoder"].update(model_type="bert"), "a 'bert' decoder"),
    (lambda c, p: c["encoder"].update(model_type="swin"), "a 'swin' encoder"),
    (lambda c, p: p.update(size={"height": 64, "width": 64}), "encoder reads exactly 32x32"),
    (lambda c, p: p.update(do_center_crop=True), "do_center_crop"),
])
def test_export_refuses_what_it_does_not_reproduce(vision: dict[str, Any], tmp_path: Path, edit: Any,
                                                   message: str) -> None:
    folder = tmp_path / "hf"
    shutil.copytree(vision["hf_dir"], folder)
    names = ("config.json", "preprocessor_config.json")
    config, processor = (json.loads((folder / name).read_text()) for name in names)
    edit(config, processor)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    result = CliRunner().invoke(main, ["export", "--hf", str(folder), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("error:")
