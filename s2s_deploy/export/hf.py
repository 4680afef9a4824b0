"""A local Hugging Face model folder as an export source, without importing ``transformers``.

The folder is untrusted: only files inside it are opened, weights come through safetensors or
``torch.load(weights_only=True)`` (never unpickled), and the family is found by asking every
registered plugin which ``config.json`` ``model_type`` it loads (``hf_model_types``). The
model's own decoding settings (``generation_config.json``) become the export's search defaults.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from s2s_deploy.architecture.registry import REGISTRY
from s2s_deploy.errors import CheckpointError, UnknownNameError
from s2s_deploy.export.hf_tokenizer import (
    SlowTokenizer,
    framing,
    load_auto_tokenizer,
    read_slow_tokenizer,
    with_cleanup,
)
from s2s_deploy.format.decoding import OPEN_SLOT
from s2s_deploy.format.files import inside as contained
from s2s_deploy.format.subword import HF, MOSES, SENTENCEPIECE, HFTokenizer, TokenizerFile
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.modeling.checkpoint import Checkpoint, build_model, save_checkpoint
from s2s_deploy.modeling.contract import ArchitecturePlugin, HFWeights

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
UNUSED = "<unused:"
"""How the name of an id beyond the tokenizer's begins (``_padded_table``)."""
SAMPLE_COUNT = 16
SAMPLE_SEED = 0


@dataclass(frozen=True)
class HFFolder:
    directory: Path
    config: dict[str, Any]
    generation: dict[str, Any]
    tensors: dict[str, torch.Tensor]


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_FILE).is_file()


def inside(directory: Path, name: str) -> Path:
    return contained(directory, name, CheckpointError, what="file", folder="model folder")


def _json(directory: Path, name: str, required: bool) -> dict[str, Any]:
    path = inside(directory, name)
    if not path.is_file():
        if required:
            raise CheckpointError(f"{directory} has no {name}: is it a Hugging Face model folder?")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    return data


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every weight as float32 (or its integer dtype), from safetensors (one file or shards) or a
    ``pytorch_model.bin`` read with ``weights_only=True``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    single, index = inside(directory, "model.safetensors"), inside(directory, "model.safetensors.index.json")
    loaded: dict[str, torch.Tensor] = {}
    try:
        if single.is_file() or index.is_file():
            names = [single.name] if single.is_file() else sorted(
                set(_json(directory, index.name, True)["weight_map"].values()))
            shards = [inside(directory, name) for name in names]
            for shard in shards:
                loaded.update(load_file(str(shard)))
        elif inside(directory, "pytorch_model.bin").is_file():
            state = torch.load(inside(directory, "pytorch_model.bin"), map_location="cpu", weights_only=True)
            if not isinstance(state, dict):
                raise CheckpointError(f"{directory}/pytorch_model.bin does not hold a state dict")
            loaded = dict(state)
        else:
            raise CheckpointError(f"{directory} has no model.safetensors, shards or pytorch_model.bin")
    except (SafetensorError, OSError, RuntimeError, KeyError, ValueError) as exc:  # weights_only refusals too
        raise CheckpointError(f"{directory}: cannot read the weights safely: {exc}") from exc
    return {name: t.float() if t.is_floating_point() else t for name, t in loaded.items()}


def read_config(directory: str | Path) -> dict[str, Any]:
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"Hugging Face model folder not found: {directory}")
    return _json(directory, CONFIG_FILE, True)


def read_folder(directory: str | Path) -> HFFolder:
    config = read_config(directory)
    directory = Path(directory)
    return HFFolder(directory, config, _json(directory, GENERATION_FILE, False), _tensors(directory))


def plugin_for(config: Mapping[str, Any]) -> ArchitecturePlugin:
    """The registered plugin whose ``hf_model_types`` holds ``config.json``'s ``model_type``."""
    model_type = str(config.get("model_type", ""))
    known = {t: entry.plugin for entry in REGISTRY.entries() for t in entry.plugin.hf_model_types}
    if model_type not in known:
        raise UnknownNameError("Hugging Face model_type", model_type, list(known))
    return known[model_type]


def _setting(config: Mapping[str, Any], generation: Mapping[str, Any], key: str) -> Any:
    """generation_config.json first, then config.json (older folders keep generation keys there)."""
    return generation[key] if key in generation else config.get(key)


def special_ids(config: Mapping[str, Any], generation: Mapping[str, Any]) -> dict[str, int | None]:
    """pad, bos, eos, unk and the decoder start (fed at step 0) as the config names them."""
    def first(key: str) -> int | None:
        value = _setting(config, generation, key)
        return int(value[0] if isinstance(value, list) else value) if value is not None else None

    ids = {role: first(f"{role}_token_id") for role in ("pad", "bos", "eos", "unk", "decoder_start")}
    if ids["eos"] is None or ids["pad"] is None:
        raise CheckpointError("config.json names no eos_token_id or pad_token_id")
    if ids["decoder_start"] is None:
        ids["decoder_start"] = ids["bos"] if ids["bos"] is not None else ids["pad"]
    return ids


GENERATE_DEFAULTS: dict[str, Any] = {
    "num_beams": 1, "length_penalty": 1.0, "early_stopping": False, "min_length": 0, "max_length": 20,
    "no_repeat_ngram_size": 0, "repetition_penalty": 1.0, "do_sample": False, "top_k": 50, "top_p": 1.0,
    "temperature": 1.0,
}
"""What ``generate`` takes for a setting ``generation_config.json`` leaves out (transformers 5.24,
``GenerationConfig._get_default_generation_params``). ``save_pretrained`` omits every setting at
its default, so most folders rely on these."""

UNSUPPORTED = {  # generation_config.json settings whose effect the runtime does not reproduce, at their no-op
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
    "exponential_decay_length_penalty": None, "sequence_bias": None,
    "renormalize_logits": False, "num_beam_groups": 1, "diversity_penalty": 0.0, "constraints": None,
    "force_words_ids": None, "stop_strings": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
    "min_p": None, "guidance_scale": None, "watermarking_config": None,
}


def search_defaults(config: Mapping[str, Any], generation: Mapping[str, Any]) -> dict[str, Any]:
    """What ``generate`` decodes with, from generation_config.json and, for what it leaves out,
    ``generate``'s own defaults, under the manifest's ``search`` names; so the runtime decodes
    as ``generate`` does without transformers. A setting it would not reproduce is refused."""
    def setting(key: str) -> Any:
        value = _setting(config, generation, key)
        return GENERATE_DEFAULTS.get(key) if value is None else value

    for key, no_op in UNSUPPORTED.items():
        value = _setting(config, generation, key)
        if value is not None and value != no_op:
            raise CheckpointError(f"generation_config.json sets {key}={value!r}, which s2s-deploy's search does not "
                                  "reproduce; remove it from the folder to export the model without it")
    eos = special_ids(config, generation)["eos"]
    defaults: dict[str, Any] = {
        "beam_size": int(setting("num_beams")), "alpha": float(setting("length_penalty")),
        "early_stopping": setting("early_stopping"), "no_repeat_ngram_size": int(setting("no_repeat_ngram_size")),
    }
    if (encoder_ngrams := _setting(config, generation, "encoder_no_repeat_ngram_size")) is not None:
        defaults["encoder_no_repeat_ngram_size"] = int(encoder_ngrams)
    new_tokens = _setting(config, generation, "max_new_tokens")
    max_length = _setting(config, generation, "max_length")
    if new_tokens is not None:
        defaults["max_len"] = int(new_tokens)
    elif max_length is not None:  # Hugging Face counts the decoder start token; we count generated tokens
        defaults["max_len"] = max(1, int(max_length) - 1)
    else:  # 20 new tokens, the start token within the position table
        positions = config.get("max_position_embeddings")
        defaults["max_len"] = GENERATE_DEFAULTS["max_length"] if positions is None else max(
            1, min(GENERATE_DEFAULTS["max_length"] + 1, int(positions)) - 1)
    min_new = _setting(config, generation, "min_new_tokens")
    defaults["min_len"] = int(min_new) if min_new is not None else max(0, int(setting("min_length")) - 1)
    for theirs, ours in (("bad_words_ids", "bad_words_ids"), ("suppress_tokens", "suppress_tokens"),
                         ("begin_suppress_tokens", "begin_suppress_tokens")):
        if (value := _setting(config, generation, theirs)) is not None:
            defaults[ours] = value
    forced_bos = _setting(config, generation, "forced_bos_token_id")
    if forced_bos is not None:
        defaults["forced_bos"] = int(forced_bos)
    forced_eos = _setting(config, generation, "forced_eos_token_id")
    if forced_eos is not None:
        if (list(forced_eos) if isinstance(forced_eos, list) else [forced_eos]) != [eos]:
            raise CheckpointError(f"generation_config.json forces {forced_eos!r} at the length limit, not the "
                                  f"EOS token {eos}: s2s-deploy's search forces only EOS")
        defaults["forced_eos"] = True
    if setting("do_sample"):
        if defaults["beam_size"] > 1:
            raise CheckpointError("generation_config.json samples inside beam search (do_sample with num_beams > 1), "
                                  "which s2s-deploy's search does not do")
        defaults.update(sampling_topk=int(setting("top_k")), sampling_topp=float(setting("top_p")),
                        sampling_temperature=float(setting("temperature")))
    if defaults["early_stopping"] not in (True, False, "never"):
        raise CheckpointError(f"generation_config.json sets early_stopping={defaults['early_stopping']!r}: "
                              'true, false or "never" expected')
    return defaults


def vocabulary(size: int, ids: Mapping[str, int | None]) -> Vocabulary:
    """An ids-only vocabulary: ``t<id>`` words (specials by their role), so text made of them
    round-trips to ids; the special ids are the model's own."""
    names = {ids["pad"]: "<pad>", ids["eos"]: "</s>", ids["unk"]: "<unk>", ids["bos"]: "<s>"}
    tokens = tuple(names.get(i, f"t{i}") for i in range(size))
    return Vocabulary(tokens, "word", pad_id=ids["pad"], bos_id=ids["bos"], eos_id=ids["eos"], unk_id=ids["unk"],
                      decoder_start_id=ids["decoder_start"])


def tokenizer_vocabulary(file: TokenizerFile, size: int, ids: Mapping[str, int | None],
                         framing: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> Vocabulary:
    """A ``tokenizer.json`` as an ``hf`` vocabulary, so the export takes text: its ids must be the
    model's first ones, without gaps (``_padded_table`` names any spare rows). The framing its
    post-processor adds around a sentence (``<s> ... </s>``, ``... </s>``, ``... </s> en_XX``)
    becomes the vocabulary's prefix and suffix (no framing at all: EOS after), unless ``framing``
    (the prefix and suffix transformers' own tokenizer adds) says otherwise. Refused if it disagrees."""
    model = HFTokenizer(file)
    table = {i: token for token, i in model.vocab().items()}
    if sorted(table) != list(range(len(table))) or len(table) > size:
        raise CheckpointError(f"{file.name} holds {len(table)} ids, not the model's 0..{size - 1}: move it aside to "
                              "export an ids-only vocabulary")
    probe = "a"
    plain = model.ids(probe)
    framed = model.tokenizer.encode(probe, add_special_tokens=True).ids
    at = next((i for i in range(len(framed) - len(plain) + 1) if framed[i : i + len(plain)] == plain), None)
    if not plain or at is None:
        raise CheckpointError(f"{file.name}: cannot tell which special tokens frame a sentence")
    prefix, suffix = (tuple(framed[:at]), tuple(framed[at + len(plain):]) or None) if framing is None else framing
    return Vocabulary(_padded_table(table, size), HF, pad_id=ids["pad"], bos_id=ids["bos"],
                      eos_id=ids["eos"], unk_id=ids["unk"], decoder_start_id=ids["decoder_start"],
                      prefix=prefix, suffix=suffix, tokenizer=file)


def folder_tokenizer(directory: Path) -> TokenizerFile | None:
    """The folder's ``tokenizer.json``, with transformers' ``clean_up_tokenization`` written into its
    decoder where ``tokenizer_config.json`` turns it on (``decode`` would run it; transformers 5
    skips it for a BPE model)."""
    path = inside(directory, TOKENIZER_FILE)
    if not path.is_file():
        return None
    file = TokenizerFile.read(path)
    settings = _json(directory, TOKENIZER_CONFIG_FILE, False)
    if settings.get("clean_up_tokenization_spaces"):
        kind = json.loads(file.data.decode("utf-8")).get("model", {}).get("type")
        if kind != "BPE" or settings.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"):
            file = TokenizerFile(TOKENIZER_FILE, with_cleanup(file.data.decode("utf-8")).encode("utf-8"))
    return file


def _padded_table(table: Mapping[int, str], size: int) -> tuple[str, ...]:
    """Token strings of ids 0..size-1. A model's embedding may have more rows than its tokenizer
    has ids (T5: 32,128 against 32,100); those ids get names no text can produce."""
    return tuple(table.get(i, f"{UNUSED}{i}>") for i in range(size))


def sentencepiece_vocabularies(directory: Path, files: tuple[str, str, str], size: int,
                               ids: Mapping[str, int | None], slow: SlowTokenizer | None = None,
                               ) -> tuple[Vocabulary, Vocabulary] | None:
    """A family's own SentencePiece files (the plugin's ``hf_sentencepiece_files``; opus-mt's
    ``source.spm``, ``target.spm``, ``vocab.json``; M2M100's one ``sentencepiece.bpe.model`` twice):
    each model splits its side's text into pieces, and the JSON maps a piece to the model's id
    (unknown pieces to unk); a source sentence ends with EOS. With the folder's tokenizer as
    transformers loads it (``slow``), its added tokens join the table (M2M100's ``__fr__``), it
    frames a source sentence (``__en__ ... </s>``), and its special ids are hidden from the text,
    as ``decode(skip_special_tokens=True)`` drops them. None unless all files are there."""
    source, target, table_file = (inside(directory, name) for name in files)
    if not all(path.is_file() for path in (source, target, table_file)):
        return None
    mapping = _json(directory, files[2], True)
    table = {i: piece for piece, i in mapping.items() if isinstance(i, int)}
    if slow is not None:
        table |= {i: token for token, i in slow.vocab.items() if i not in table and 0 <= i < size}
    if sorted(table) != list(range(len(table))) or len(table) > size:
        raise CheckpointError(f"{table_file} maps {len(table)} ids, not the model's 0..{size - 1}")
    tokens = _padded_table(table, size)
    unk = ids["unk"] if ids["unk"] is not None else mapping.get("<unk>")  # some configs name no unk id
    special: dict[str, Any] = {"pad_id": ids["pad"], "bos_id": ids["bos"], "eos_id": ids["eos"], "unk_id": unk,
                               "decoder_start_id": ids["decoder_start"]}
    framing: dict[str, Any] = {}
    if slow is not None:
        framing = {"prefix": slow.prefix, "suffix": slow.suffix or None,
                   "hidden": tuple(i for i in slow.special if 0 <= i < size)}
    return (Vocabulary(tokens, SENTENCEPIECE, tokenizer=TokenizerFile.read(source), **special,
                       **{k: v for k, v in framing.items() if k != "hidden"}),
            Vocabulary(tokens, SENTENCEPIECE, tokenizer=TokenizerFile.read(target), **special,
                       **{k: v for k, v in framing.items() if k == "hidden"},
                       upper_case=slow is not None and slow.upper_case))


def moses_vocabularies(directory: Path, files: tuple[str, str, str], weights: HFWeights,
                       ids: Mapping[str, int | None],
                       failures: list[str] | None = None) -> tuple[Vocabulary, Vocabulary] | None:
    """A family's Moses + BPE files (the plugin's ``hf_moses_files``; FSMT's ``vocab-src.json``,
    ``vocab-tgt.json``, ``merges.txt``) as two ``moses`` vocabularies, each its own table and
    language (the tokenizer's ``src_lang`` and ``tgt_lang``, ``do_lower_case``), framed and with
    hidden ids as the folder's tokenizer (transformers, at export) frames and decodes. None without
    the files or without transformers to read the languages from (``failures``: as ``load_auto_tokenizer``'s)."""
    paths = [inside(directory, name) for name in files]
    tokenizer = load_auto_tokenizer(directory, failures) if all(path.is_file() for path in paths) else None
    framed = framing(tokenizer) if tokenizer is not None else None
    if tokenizer is None or framed is None or not all(hasattr(tokenizer, a) for a in ("src_lang", "tgt_lang")):
        return None
    lines = paths[2].read_text(encoding="utf-8").split("\n")[:-1]
    merges = [line.split()[:2] for line in lines if len(line.split()) >= 2]
    lower = bool(getattr(tokenizer, "do_lower_case", False))
    hidden = tuple(sorted(set(tokenizer.all_special_ids)))
    special = {"pad_id": ids["pad"], "bos_id": ids["bos"], "eos_id": ids["eos"], "unk_id": ids["unk"],
               "decoder_start_id": ids["decoder_start"]}
    found = []
    for side, (name, size, lang) in enumerate(((files[0], weights.src_vocab_size, tokenizer.src_lang),
                                               (files[1], weights.tgt_vocab_size, tokenizer.tgt_lang))):
        mapping = _json(directory, name, True)
        table = {i: token for token, i in mapping.items() if isinstance(i, int)}
        if sorted(table) != list(range(len(table))) or len(table) > size:
            raise CheckpointError(f"{name} maps {len(table)} ids, not the model's 0..{size - 1}")
        # FSMT's config names no unk id: the tokenizer's unknown token, in this side's table
        unk = ids["unk"] if ids["unk"] is not None else mapping.get(str(tokenizer.unk_token))
        spec = {"lang": str(lang), "lower_case": lower, "merges": merges}
        file = TokenizerFile(f"moses-{'source' if side == 0 else 'target'}.json",
                             json.dumps(spec, ensure_ascii=False).encode("utf-8"))
        framing_of = {"prefix": framed[0], "suffix": framed[1]} if side == 0 else {
            "hidden": tuple(i for i in hidden if 0 <= i < size)}
        found.append(Vocabulary(_padded_table(table, size), MOSES, tokenizer=file, **(special | {"unk_id": unk}),
                                **framing_of))
    return found[0], found[1]


def text_vocabularies(plugin: ArchitecturePlugin, directory: Path, weights: HFWeights,
                      ids: Mapping[str, int | None],
                      failures: list[str] | None = None) -> tuple[Vocabulary, Vocabulary]:
    """The folder's own tokenizer files: first the family's SentencePiece files, then a
    ``tokenizer.json``, then (where transformers is installed) one converted from the family's
    slow tokenizer files (``hf_tokenizer.py``); without any, ids-only vocabularies. ``failures``
    (if given) gets why, one line each, wherever transformers raised reading the folder's tokenizer."""
    size = weights.src_vocab_size
    if plugin.hf_moses_files is not None:
        moses = moses_vocabularies(directory, plugin.hf_moses_files, weights, ids, failures)
        if moses is not None:
            return moses
    if size == weights.tgt_vocab_size:  # the families here share one vocabulary
        files = plugin.hf_sentencepiece_files
        if files is not None and all(inside(directory, name).is_file() for name in files):
            found = sentencepiece_vocabularies(directory, files, size, ids,
                                               read_slow_tokenizer(directory, size, failures=failures))
            if found is not None:
                return found
        file, framing = folder_tokenizer(directory), None
        if file is None:
            slow = read_slow_tokenizer(directory, size, plugin.hf_tokenizer_converter, failures)
            if slow is not None and slow.tokenizer_json is not None:
                file = TokenizerFile(TOKENIZER_FILE, slow.tokenizer_json.encode("utf-8"))
                framing = slow.prefix, slow.suffix
        if file is not None:
            shared = tokenizer_vocabulary(file, size, ids, framing)
            return shared, shared
    return vocabulary(weights.src_vocab_size, ids), vocabulary(weights.tgt_vocab_size, ids)


def sample_texts(vocab: Vocabulary, count: int = SAMPLE_COUNT) -> tuple[str, ...]:
    """Seeded random sentences of ordinary tokens, of mixed lengths, for parity checks."""
    rng = random.Random(SAMPLE_SEED)
    specials = {i for i in vocab.special_ids().values() if i is not None}
    ordinary = [i for i in range(len(vocab.tokens)) if i not in specials]
    texts = (vocab.decode([rng.choice(ordinary) for _ in range(rng.randint(2, 12))]) for _ in range(count))
    return tuple(text for text in texts if text.strip())


def matching_ids(vocab: Vocabulary, pattern: str) -> tuple[int, ...]:
    """The ids whose tokens the plugin's ``hf_language_codes`` (``hf_task_codes``, ``hf_hidden_tokens``,
    ``hf_prompt_token``, ``hf_no_speech_token``) matches in full (none for an ids-only vocabulary, whose
    tokens are ``t<id>``)."""
    code = re.compile(pattern)
    return tuple(i for i, token in enumerate(vocab.tokens) if code.fullmatch(token))


@dataclass(frozen=True)
class HFSource:
    checkpoint: Checkpoint
    model: torch.nn.Module
    search: dict[str, Any]
    samples: tuple[str, ...]
    alignment_heads: tuple[tuple[int, int], ...] = ()
    ids_only: str | None = None
    """Why the folder's own tokenizer files were not read (the plugin's ``hf_ids_only``, or the
    exception transformers raised reading them, in one line), where they were not."""


def load_hf(plugin: ArchitecturePlugin, directory: str | Path) -> HFSource:
    folder = read_folder(directory)
    model_type = folder.config.get("model_type")
    if model_type not in plugin.hf_model_types:
        raise CheckpointError(f"{directory} holds a {model_type!r} model; {plugin.name} loads "
                              f"{', '.join(plugin.hf_model_types) or 'no Hugging Face models'}")
    files = {name: _json(Path(directory), name, True) for name in plugin.hf_files}
    weights = plugin.from_hf(folder.config, folder.tensors, **({"files": files} if files else {}))
    ids = special_ids(folder.config, folder.generation)
    failures: list[str] = []
    src_vocab, tgt_vocab = text_vocabularies(plugin, Path(directory), weights, ids, failures)
    listed = {name: matching_ids(tgt_vocab, pattern) for name, pattern in
              (("languages", plugin.hf_language_codes), ("tasks", plugin.hf_task_codes),
               ("hidden", plugin.hf_hidden_tokens)) if pattern is not None}
    tgt_vocab = replace(tgt_vocab, **listed)
    search = plugin.hf_search(folder.config, folder.generation, search_defaults(folder.config, folder.generation))
    for key, attribute in (("prompt_start", "hf_prompt_token"), ("no_speech_token", "hf_no_speech_token")):
        pattern = getattr(plugin, attribute)
        if pattern is None:
            continue
        found = matching_ids(tgt_vocab, pattern)
        if len(found) > 1:
            raise CheckpointError(f"{directory}: {len(found)} target tokens match the plugin's {attribute} "
                                  f"{pattern!r}; it must name one")
        search |= {key: found[0]} if found else {}
    if OPEN_SLOT in search.get("decoder_prompt", ()) and not tgt_vocab.languages:
        raise CheckpointError(f"{directory}: generate would detect the language, but without a {TOKENIZER_FILE} "
                              "naming its language tokens the export cannot list them: add the folder's "
                              f"{TOKENIZER_FILE}, or set the language in {GENERATION_FILE}")
    info = {"hf_model_type": model_type, "hf_folder": Path(directory).name}
    checkpoint = Checkpoint(plugin.name, plugin.version, weights.config, src_vocab, tgt_vocab, weights.tensors, info)
    model = build_model(checkpoint, plugin)
    ids_only = None
    if not (src_vocab.tokenizer or tgt_vocab.tokenizer):
        ids_only = plugin.hf_ids_only.get(str(model_type)) or (
            f"transformers read no tokenizer from it ({failures[-1]})" if failures else None)
    return HFSource(checkpoint, model, search, sample_texts(src_vocab),
                    plugin.hf_alignment_heads(folder.config, folder.generation), ids_only)


def save_hf_checkpoint(source: HFSource, plugin: ArchitecturePlugin, path: Path) -> Path:
    """The converted weights as an s2s-deploy checkpoint, so ``parity`` runs from the export alone."""
    c = source.checkpoint
    return save_checkpoint(path, plugin, c.config, source.model, c.src_vocab, c.tgt_vocab, c.info)
