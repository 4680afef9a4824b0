"""A Hugging Face folder's tokenizer as the runtime reads it, made at export time.

Older folders ship only a family's "slow" tokenizer files (``spiece.model``,
``sentencepiece.bpe.model``, ``vocab.json`` with ``merges.txt``, ``prophetnet.tokenizer``) and no
``tokenizer.json``. Where ``transformers`` is installed, the export loads the folder's own
tokenizer with ``AutoTokenizer`` and keeps what it tokenises with: the ``tokenizers`` tokenizer it
built from those files (transformers' own converters run inside ``from_pretrained``), or, for a
tokenizer written in Python, the converter the plugin names (``hf_tokenizer_converter``). Nothing
here is written by hand: the conversion is transformers', and ``parity --reference`` checks the
result against the same ``AutoTokenizer`` on a multilingual sample (``tokenizer_parity.py``).

``decode`` in transformers may also run ``clean_up_tokenization`` (a ``tokenizer_config.json``
setting) after the ``tokenizers`` decoder; ``with_cleanup`` writes those string replacements into
the ``tokenizer.json``'s decoder, so the runtime, which runs ``tokenizers`` alone, decodes alike.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

CLEANUP_REPLACEMENTS: tuple[tuple[str, str], ...] = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
    (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))
"""``PreTrainedTokenizerBase.clean_up_tokenization``'s replacements, in its order (transformers 4 and 5)."""

PROBE = "a"


def why(error: BaseException) -> str:
    """An exception as one line: its type and its message's first line (transformers' may run on)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


@dataclass(frozen=True)
class SlowTokenizer:
    """What the folder's ``AutoTokenizer`` says about itself, for the export's vocabulary.

    ``vocab``: token to id, added tokens included (M2M100's ``__fr__`` follow ``vocab.json``);
    ``prefix``/``suffix``: the ids it frames a sentence with; ``special``: the ids
    ``decode(skip_special_tokens=True)`` drops; ``tokenizer_json``: a ``tokenizer.json`` that
    tokenises as it does (None where transformers has no converter for it); ``upper_case``: its
    ``decode`` upper-cases the text (``do_upper_case``, Speech2Text's LibriSpeech folders)."""

    vocab: dict[str, int]
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    special: tuple[int, ...]
    tokenizer_json: str | None
    upper_case: bool = False


def load_auto_tokenizer(directory: Path, failures: list[str] | None = None) -> Any | None:
    """``AutoTokenizer.from_pretrained`` on the folder's own files, or, where it fails, the class
    that ``tokenizer_config.json`` names (transformers 5 maps UMT5 and Pegasus-X to a generic class
    that reads only a ``tokenizer.json``, though their folders name ``T5Tokenizer`` and ship
    ``spiece.model``). None without transformers or without tokenizer files it can load; where
    transformers raised on the way to None, ``failures`` (if given) gets why, in one line, so that an
    export that falls back to ids only can say so."""
    try:
        import transformers
    except ImportError:
        return None
    errors = Exception  # transformers' loaders raise many kinds (tokenizers' bare Exception among them)

    def read_files(tokenizer: Any) -> bool:
        """transformers 5 may build an empty tokenizer from a config alone (or from a class it mapped
        the model type to earlier in the process): only one read from the folder's files counts."""
        names = getattr(tokenizer, "vocab_files_names", {}).values()
        return any((Path(directory) / name).is_file() for name in names)

    raised = None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except errors as error:
        tokenizer, raised = None, why(error)
    if tokenizer is None or not read_files(tokenizer):
        try:
            named = json.loads((Path(directory) / "tokenizer_config.json").read_text(encoding="utf-8"))
            name = named.get("tokenizer_class") if isinstance(named, dict) else None
        except (OSError, ValueError):  # no config naming a class: AutoTokenizer's answer stands
            name = None
        if name is not None:
            try:
                tokenizer = getattr(transformers, str(name)).from_pretrained(str(directory), local_files_only=True)
            except errors as error:
                tokenizer, raised = None, why(error)
    if tokenizer is not None and read_files(tokenizer):
        return tokenizer
    if raised is not None and failures is not None:
        failures.append(raised)
    return None


def framing(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ids the tokenizer puts before and after a sentence's own (None if it cannot be told)."""
    plain = list(tokenizer(PROBE, add_special_tokens=False)["input_ids"])
    framed = list(tokenizer(PROBE)["input_ids"])
    at = next((i for i in range(len(framed) - len(plain) + 1) if framed[i: i + len(plain)] == plain), None)
    if not plain or at is None:
        return None
    return tuple(framed[:at]), tuple(framed[at + len(plain):])


def cleans_up(tokenizer: Any) -> bool:
    """Whether transformers' ``decode`` runs ``clean_up_tokenization`` after the tokenizer's own
    decoding: the setting, except where a ``tokenizers`` BPE model makes transformers 5 skip it."""
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return True
    return (type(backend.model).__name__ != "BPE"
            or bool(getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
                            False)))


def with_cleanup(tokenizer_json: str) -> str:
    """The tokenizer with ``clean_up_tokenization`` appended to its decoder: the tokens decoded as
    before, fused into one string, then each replacement in turn (a ``tokenizers`` decoder acts on
    every token; after ``Fuse`` there is one). Without a decoder, ``tokenizers`` joins tokens with
    spaces: each token is given a leading space, and the first one stripped after fusing."""
    data = json.loads(tokenizer_json)
    steps = [data["decoder"]] if data.get("decoder") else [
        {"type": "Replace", "pattern": {"Regex": "^"}, "content": " "}]
    steps.append({"type": "Fuse"})
    if not data.get("decoder"):
        steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    steps += [{"type": "Replace", "pattern": {"String": old}, "content": new} for old, new in CLEANUP_REPLACEMENTS]
    data["decoder"] = {"type": "Sequence", "decoders": steps}
    return json.dumps(data, ensure_ascii=False)


def _with_framing(backend: Any, tokenizer: Any, prefix: tuple[int, ...], suffix: tuple[int, ...]) -> str:
    """The ``tokenizers`` tokenizer with a post-processor framing a sentence as ``tokenizer`` does
    (a converter writes its class's usual template, which need not be the family's), and the
    tokenizer's special tokens registered as special."""
    from tokenizers import AddedToken, processors

    # its special tokens as the tokenizer's added special tokens, which decode(skip_special_tokens) drops
    backend.add_special_tokens([AddedToken(str(token), special=True, normalized=False)
                                for token in tokenizer.all_special_tokens])
    names = tokenizer.convert_ids_to_tokens([*prefix, *suffix])
    by_id = dict(zip([*prefix, *suffix], names, strict=True))
    single = " ".join([*(by_id[i] for i in prefix), "$A", *(by_id[i] for i in suffix)])
    backend.post_processor = processors.TemplateProcessing(single=single,
                                                           special_tokens=[(n, i) for i, n in by_id.items()])
    return backend.to_str()


def read_slow_tokenizer(directory: Path, size: int, converter: str | None = None,
                        failures: list[str] | None = None) -> SlowTokenizer | None:
    """The folder's tokenizer as transformers loads it, its ids up to the model's ``size`` (None
    without transformers, or where it loads none). A ``tokenizers``-backed tokenizer gives its own
    ``tokenizer.json``; a Python one goes through ``converter`` (a class of
    ``transformers.convert_slow_tokenizer``) if the plugin names one, and gives none otherwise.
    ``failures``: as ``load_auto_tokenizer``'s, also for a tokenizer or a converter that raised."""
    tokenizer = load_auto_tokenizer(directory, failures)
    if tokenizer is None:
        return None
    try:
        framed = framing(tokenizer)
    except Exception as error:  # a tokenizer that cannot encode one letter is none the export can use
        if failures is not None:
            failures.append(f"{type(tokenizer).__name__} could not encode {PROBE!r}: {why(error)}")
        return None
    if framed is None:
        return None
    prefix, suffix = framed
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = dict(tokenizer.get_vocab())
    # M2M100's language tokens are in neither get_vocab() nor the added tokens in transformers 5:
    # the ids up to the model's size that it names other than unk
    known = set(vocab.values())
    unk = getattr(tokenizer, "unk_token", None)
    for i in (i for i in range(size) if i not in known):
        try:
            token = tokenizer.convert_ids_to_tokens(i)
        except (IndexError, KeyError, ValueError):  # Marian's asks SentencePiece, which refuses
            continue
        if token is not None and token != unk:
            vocab.setdefault(str(token), i)
    found = SlowTokenizer(vocab, prefix, suffix, tuple(sorted(set(tokenizer.all_special_ids))), None,
                          bool(getattr(tokenizer, "do_upper_case", False)))
    text = None
    if backend is not None:
        text = backend.to_str()
    elif converter is not None:
        # the module by its full name: ``from transformers import convert_slow_tokenizer`` gives the
        # function of that name once transformers has re-run its __init__ (processing_utils'
        # direct_transformers_import replaces the lazy package after the module was imported)
        convert_slow_tokenizer = importlib.import_module("transformers.convert_slow_tokenizer")

        # a converter writes its class's template (BERT's [CLS] ... [SEP]), replaced below by the
        # tokenizer's own framing; it needs the template's tokens to exist (ProphetNet has no [CLS])
        for role in ("cls_token", "sep_token", "bos_token", "eos_token"):
            if getattr(tokenizer, role, None) is None:
                setattr(tokenizer, role, tokenizer.convert_ids_to_tokens((suffix or prefix or (0,))[-1]))
        try:
            converted = getattr(convert_slow_tokenizer, converter)(tokenizer).converted()
        except Exception as error:  # the converter does not fit this tokenizer: the export stays ids-only
            if failures is not None:
                failures.append(f"{converter} could not convert {type(tokenizer).__name__}: {why(error)}")
            return found
        text = _with_framing(converted, tokenizer, prefix, suffix)
    if text is not None and cleans_up(tokenizer):
        text = with_cleanup(text)
    return replace(found, tokenizer_json=text)
