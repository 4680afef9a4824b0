"""Tokenisation that needs nothing but the manifest: the runtime and the trainer share it.

Special ids are data, not positions: a vocabulary built here puts ``<pad> <bos> <eos> <unk>`` at
0..3, but one read from a checkpoint or manifest may hold them anywhere (Marian's pad is its last
id and its EOS is 0), and ``bos`` and ``unk`` may be absent.

Levels: ``char`` and ``word`` split text here; ``sentencepiece`` splits it into pieces with the
vocabulary's ``.model`` and maps them through ``tokens``; ``hf`` runs a ``tokenizer.json``
whose ids must agree with ``tokens`` (checked on load); ``moses`` normalises and tokenises with
Moses rules (``sacremoses``), splits each token into BPE pieces and maps them through ``tokens``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from s2s_deploy.errors import S2SError
from s2s_deploy.format.subword import (
    HF,
    MOSES,
    SENTENCEPIECE,
    HFTokenizer,
    MosesBPE,
    SentencePieceModel,
    TokenizerFile,
    load_model,
)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
LEVELS = ("char", "word", SENTENCEPIECE, HF, MOSES)
SUBWORD_LEVELS = (SENTENCEPIECE, HF, MOSES)
BUILT_LEVELS = ("char", "word")  # the levels ``Vocabulary.build`` makes from text alone
FileReader = Callable[[str, str], bytes]
"""``(file name, sha256) -> bytes``: how ``from_dict`` gets a tokenizer file (folder or checkpoint)."""
_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_WRAP = "[^A-Za-z0-9]*"
"""What may wrap a code in the token it names (``code_ids``)."""


class VocabularyError(S2SError, ValueError):
    """A vocabulary that cannot be right (ids out of range, duplicates, unknown level)."""


@dataclass(frozen=True)
class Vocabulary:
    """``tokens[i]`` is the string of id ``i``; the special ids say which ids play which role.

    ``encode(text)`` returns ``prefix + ids + suffix`` (the suffix is ``(eos_id,)`` unless given),
    so a model whose source reads ``<s> ... </s>`` or ``... </s> en_XX`` says so here.
    ``decode`` stops at EOS and drops pad, bos, the decoder start and ``hidden`` ids.
    ``languages``: the ids whose tokens name a target language, for a model told which language to
    write by a forced first token or a decoder prompt (``target_lang`` turns a code into its id);
    ``tasks``: likewise the ids whose tokens name a task (Whisper's ``<|translate|>``, for ``task``).
    A code names a listed token by ``code_ids``' rule. ``upper_case``: the decoded text is
    upper-cased (Python's ``str.upper``), as Speech2Text's tokenizer does with ``do_upper_case``
    (LibriSpeech's models write lower-case pieces); manifest format 8.
    """

    tokens: tuple[str, ...]
    level: str = "char"
    pad_id: int = 0
    bos_id: int | None = 1
    eos_id: int = 2
    unk_id: int | None = 3
    decoder_start_id: int | None = None  # None: bos_id
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] | None = None
    hidden: tuple[int, ...] = ()
    tokenizer: TokenizerFile | None = None
    languages: tuple[int, ...] = ()
    tasks: tuple[int, ...] = ()
    upper_case: bool = False
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _skip: frozenset[int] = field(init=False, repr=False, compare=False)
    _model: SentencePieceModel | HFTokenizer | MosesBPE | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise VocabularyError(f"unknown tokenisation level {self.level!r}; known: {', '.join(LEVELS)}")
        object.__setattr__(self, "tokens", tuple(self.tokens))
        if self.decoder_start_id is None:
            if self.bos_id is None:
                raise VocabularyError("a vocabulary without bos needs an explicit decoder_start id")
            object.__setattr__(self, "decoder_start_id", self.bos_id)
        if self.suffix is None:
            object.__setattr__(self, "suffix", (self.eos_id,))
        object.__setattr__(self, "prefix", tuple(self.prefix))
        object.__setattr__(self, "suffix", tuple(self.suffix))
        object.__setattr__(self, "hidden", tuple(self.hidden))
        object.__setattr__(self, "languages", tuple(self.languages))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        size = len(self.tokens)
        for role, value in self.special_ids().items():
            if value is not None and not _is_id(value, size):
                raise VocabularyError(f"special id {role}={value!r} is not an id of this {size}-token vocabulary")
        for name in ("prefix", "suffix", "hidden", "languages", "tasks"):
            bad = [i for i in getattr(self, name) if not _is_id(i, size)]
            if bad:
                raise VocabularyError(f"{name} holds {bad[0]!r}, not an id of this {size}-token vocabulary")
        if len(set(self.tokens)) != size:
            raise VocabularyError("a vocabulary has duplicate tokens")
        object.__setattr__(self, "_index", {t: i for i, t in enumerate(self.tokens)})
        skip = {self.pad_id, self.bos_id, self.decoder_start_id, *self.hidden}
        object.__setattr__(self, "_skip", frozenset(i for i in skip if i is not None))
        object.__setattr__(self, "_model", self._load_model())

    def _load_model(self) -> SentencePieceModel | HFTokenizer | MosesBPE | None:
        if (self.tokenizer is not None) != (self.level in SUBWORD_LEVELS):
            raise VocabularyError(f"a {self.level} vocabulary {'needs' if self.tokenizer is None else 'takes no'} "
                                  "tokenizer file")
        if self.tokenizer is None:
            return None
        model = load_model(self.level, self.tokenizer)
        if isinstance(model, HFTokenizer):
            wrong = [(t, i) for t, i in model.vocab().items() if i >= len(self.tokens) or self.tokens[i] != t]
            if wrong:
                raise VocabularyError(f"{self.tokenizer.name} gives {wrong[0][0]!r} id {wrong[0][1]}, which the "
                                      "vocabulary's tokens disagree with")
        return model

    @classmethod
    def build(cls, texts: Iterable[str], level: str = "char", min_count: int = 1,
              decoder_start: str = BOS) -> Vocabulary:
        """Specials at 0..3, then the tokens of ``texts`` sorted; ``decoder_start`` names the start token."""
        if level not in BUILT_LEVELS:
            raise VocabularyError(f"a vocabulary is built from text at level {' or '.join(BUILT_LEVELS)}, "
                                  f"not {level!r}")
        counts = Counter(tok for text in texts for tok in split(text, level))
        kept = sorted(t for t, c in counts.items() if c >= min_count and t not in SPECIALS)
        tokens = SPECIALS + tuple(kept)
        if decoder_start not in tokens:
            raise VocabularyError(f"decoder start token {decoder_start!r} is not in the vocabulary")
        return cls(tokens, level, decoder_start_id=tokens.index(decoder_start))

    def __len__(self) -> int:
        return len(self.tokens)

    def special_ids(self) -> dict[str, int | None]:
        return {"pad": self.pad_id, "bos": self.bos_id, "eos": self.eos_id, "unk": self.unk_id,
                "decoder_start": self.decoder_start_id}

    def encode(self, text: str, add_eos: bool = True) -> list[int]:
        """Ids of ``text``; with ``add_eos`` framed by ``prefix`` and ``suffix`` (EOS by default)."""
        if isinstance(self._model, HFTokenizer):
            ids = self._model.ids(text)
        else:
            pieces = self._model.pieces(text) if self._model is not None else split(text, self.level)
            ids = [self._id(tok) for tok in pieces]
        return [*self.prefix, *ids, *self.suffix] if add_eos else ids

    def _id(self, token: str) -> int:
        found = self._index.get(token, self.unk_id)
        if found is None:
            raise VocabularyError(f"token {token!r} is not in the vocabulary, which has no unk")
        return found

    def decode(self, ids: Iterable[int]) -> str:
        """At the ``hf`` level a hidden id also splits the text: each run of kept ids between hidden
        ones is detokenised alone, as Whisper's tokenizer decodes around the timestamps it then drops
        (two bytes of one character on either side of a timestamp stay two broken characters)."""
        kept, runs = [], []
        for i in ids:
            if i == self.eos_id:
                break
            if i in self.hidden and isinstance(self._model, HFTokenizer):
                runs.append(kept)
                kept = []
            elif i not in self._skip:
                kept.append(i)
        if isinstance(self._model, HFTokenizer):
            text = "".join(self._model.text(run) for run in (*runs, kept) if run)
        else:
            words = [self.tokens[i] if 0 <= i < len(self.tokens) else UNK for i in kept]
            text = self._model.text(words) if self._model is not None else (
                ("" if self.level == "char" else " ").join(words))
        return text.upper() if self.upper_case else text

    def to_dict(self) -> dict[str, Any]:
        data = {"level": self.level, "tokens": list(self.tokens), "special": self.special_ids(),
                "prefix": list(self.prefix), "suffix": list(self.suffix), "hidden": list(self.hidden)}
        if self.tokenizer is not None:
            data["tokenizer"] = {"file": self.tokenizer.name, "sha256": self.tokenizer.sha256}
        for name in ("languages", "tasks"):
            if getattr(self, name):
                data[name] = list(getattr(self, name))
        if self.upper_case:  # written only when on: a format-7 reader never meets the key otherwise
            data["upper_case"] = True
        return data

    def code_ids(self, code: str, listed: Iterable[int]) -> tuple[int, ...]:
        """The ids among ``listed`` that ``code`` names (docs/manifest.md's rule, so every client
        agrees): the token equal to it; else each token equal to it wrapped in characters other than
        ASCII letters and digits (``fr`` names ``<|fr|>`` and ``__fr__``, never ``fra_Latn``). One
        id is a match; none or several are not."""
        listed = tuple(listed)
        exact = tuple(i for i in listed if self.tokens[i] == code)
        if exact or not code:
            return exact
        wrapped = re.compile(f"{_WRAP}{re.escape(code)}{_WRAP}")
        return tuple(i for i in listed if wrapped.fullmatch(self.tokens[i]))

    def language_id(self, code: str) -> int | None:
        """The id of the language token ``code`` names (None: no one token of ``languages``)."""
        return _one(self.code_ids(code, self.languages))

    def task_id(self, code: str) -> int | None:
        """The id of the task token ``code`` names (None: no one token of ``tasks``)."""
        return _one(self.code_ids(code, self.tasks))

    def code_of(self, token_id: int) -> str:
        """The shortest code naming ``token_id``'s token: the token less its wrapping (``<|fr|>``: ``fr``)."""
        return re.sub(f"^{_WRAP}|{_WRAP}$", "", self.tokens[token_id]) or self.tokens[token_id]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], decoder_start_id: int | None = None,
                  read_file: FileReader | None = None) -> Vocabulary:
        """Reads ``to_dict`` and the older ``{level, tokens}`` form, whose specials sit at 0..3
        (``decoder_start_id`` then comes from the caller: format-2 manifests keep it apart).
        A subword vocabulary's file comes from ``read_file`` and must match its recorded sha256."""
        tokens = tuple(data["tokens"])
        level = data.get("level", "char")
        special = data.get("special")
        if special is None:
            if tokens[: len(SPECIALS)] != SPECIALS:
                raise VocabularyError(f"a vocabulary without special ids must start with {' '.join(SPECIALS)}")
            return cls(tokens, level, decoder_start_id=decoder_start_id)
        return cls(
            tokens, level, pad_id=special["pad"], bos_id=special.get("bos"), eos_id=special["eos"],
            unk_id=special.get("unk"), decoder_start_id=special.get("decoder_start"),
            prefix=tuple(data.get("prefix", ())), suffix=_optional_ids(data.get("suffix")),
            hidden=tuple(data.get("hidden", ())), tokenizer=_tokenizer_file(data.get("tokenizer"), read_file),
            languages=tuple(data.get("languages", ())), tasks=tuple(data.get("tasks", ())),
            upper_case=bool(data.get("upper_case", False)),
        )

    @classmethod
    def from_sentencepiece(cls, path: str | Path, name: str | None = None, **fields: Any) -> Vocabulary:
        """Ids are the model's own: ``tokens`` lists its pieces, the specials are its pad/bos/eos/unk.
        ``fields`` override any of them (``decoder_start_id``, ``suffix``...)."""
        file = TokenizerFile.read(path, name)
        model = SentencePieceModel(file)
        special = model.special_ids()
        if special["pad"] is None or special["eos"] is None:
            raise VocabularyError(f"{file.name} defines no pad or eos piece: give pad_id and eos_id")
        ids = {f"{role}_id": value for role, value in special.items()}
        return cls(model.piece_table(), SENTENCEPIECE, tokenizer=file, **{**ids, **fields})

    @classmethod
    def from_hf_tokenizer(cls, path: str | Path, pad: str, eos: str, bos: str | None = None,
                          unk: str | None = None, name: str | None = None, **fields: Any) -> Vocabulary:
        """Ids are the tokenizer's; the specials are named by their token strings."""
        file = TokenizerFile.read(path, name)
        model = HFTokenizer(file)
        table = {i: t for t, i in model.vocab().items()}
        if sorted(table) != list(range(len(table))):
            raise VocabularyError(f"{file.name} has gaps in its ids: list the tokens yourself")
        ids = {f"{role}_id": None if token is None else model.token_id(token)
               for role, token in (("pad", pad), ("eos", eos), ("bos", bos), ("unk", unk))}
        return cls(tuple(table[i] for i in range(len(table))), HF, tokenizer=file, **{**ids, **fields})


def _tokenizer_file(entry: Mapping[str, str] | None, read_file: FileReader | None) -> TokenizerFile | None:
    if entry is None:
        return None
    if read_file is None:
        raise VocabularyError(f"the vocabulary's tokenizer file {entry['file']!r} has nowhere to be read from")
    file = TokenizerFile(entry["file"], read_file(entry["file"], entry["sha256"]))
    if file.sha256 != entry["sha256"]:
        raise VocabularyError(f"tokenizer file {entry['file']} modified: it does not match its sha256 (or is corrupt)")
    return file


def _one(found: tuple[int, ...]) -> int | None:
    return found[0] if len(found) == 1 else None


def _is_id(value: object, size: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < size


def _optional_ids(value: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


def split(text: str, level: str) -> list[str]:
    if level == "char":
        return list(text)
    return _WORD.findall(text)
