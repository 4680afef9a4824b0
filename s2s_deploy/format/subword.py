"""Subword tokenisers a vocabulary may name: a SentencePiece ``.model``, a Hugging Face
``tokenizer.json``, or a Moses + BPE description (fairseq's WMT19 models, FSMT), run by the
``sentencepiece``, ``tokenizers`` and (optional, the ``moses`` extra) ``sacremoses`` packages,
all torch-free.

The file travels as bytes: copied into an export folder (its sha256 in the manifest) and
embedded in a checkpoint, so an export never reads a tokenizer from anywhere else.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import inside

SENTENCEPIECE, HF, MOSES = "sentencepiece", "hf", "moses"
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_EXPORT_FILES = re.compile(r"^manifest\.json$|\.(onnx|ort|safetensors|part|tmp)$")  # an export's own files


class TokenizerFileError(S2SError, ValueError):
    pass


@dataclass(frozen=True)
class TokenizerFile:
    """A tokenizer model: ``name`` is its file name in an export folder, ``data`` its bytes."""

    name: str
    data: bytes = field(repr=False, compare=False)
    sha256: str = field(init=False)

    def __post_init__(self) -> None:
        if not _PLAIN_NAME.match(self.name) or _EXPORT_FILES.search(self.name):
            raise TokenizerFileError(f"tokenizer file name {self.name!r} must be a plain file name, not an "
                                     "export's graph, checkpoint or manifest")
        object.__setattr__(self, "sha256", hashlib.sha256(self.data).hexdigest())

    @classmethod
    def read(cls, path: str | Path, name: str | None = None) -> TokenizerFile:
        path = Path(path)
        try:
            return cls(name or path.name, path.read_bytes())
        except OSError as exc:
            raise TokenizerFileError(f"cannot read tokenizer file {path}: {exc.strerror}") from exc


def write_files(files: Iterable[TokenizerFile | None], directory: Path) -> None:
    """Copy tokenizer files into an export folder; one name, one content."""
    written: dict[str, str] = {}
    for file in files:
        if file is None:
            continue
        if written.setdefault(file.name, file.sha256) != file.sha256:
            raise TokenizerFileError(f"the source and target tokenizers differ but are both named {file.name!r}")
        inside(directory, file.name, TokenizerFileError, "tokenizer file").write_bytes(file.data)


WORD_START = "\u2581"  # SentencePiece's word-start mark


class SentencePieceModel:
    """Text to pieces and pieces to text; the vocabulary's token table maps pieces to ids."""

    def __init__(self, file: TokenizerFile) -> None:
        import sentencepiece

        self.processor = sentencepiece.SentencePieceProcessor()
        try:
            self.processor.LoadFromSerializedProto(file.data)
        except (RuntimeError, OSError) as exc:
            raise TokenizerFileError(f"{file.name} is not a SentencePiece model: {exc}") from exc

    def pieces(self, text: str) -> list[str]:
        return self.processor.encode(text, out_type=str)

    def text(self, pieces: list[str]) -> str:
        """As MarianTokenizer decodes: a piece the model does not hold (opus-mt's target ids
        include pieces only ``source.spm`` has) comes back raw, its ``▁`` then made a space."""
        return self.processor.decode_pieces(pieces).replace(WORD_START, " ").strip()

    def special_ids(self) -> dict[str, int | None]:
        """The model's own pad/bos/eos/unk ids (SentencePiece says -1 for an absent one)."""
        p = self.processor
        ids = {"pad": p.pad_id(), "bos": p.bos_id(), "eos": p.eos_id(), "unk": p.unk_id()}
        return {role: (i if i >= 0 else None) for role, i in ids.items()}

    def piece_table(self) -> tuple[str, ...]:
        return tuple(self.processor.id_to_piece(i) for i in range(self.processor.get_piece_size()))


class HFTokenizer:
    """A ``tokenizers`` tokenizer: text to ids, ids to text. Its own special-token handling is
    off when encoding (the vocabulary's prefix and suffix frame a sentence instead)."""

    def __init__(self, file: TokenizerFile) -> None:
        from tokenizers import Tokenizer

        try:
            self.tokenizer = Tokenizer.from_str(file.data.decode("utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON; bytes may not be UTF-8
            raise TokenizerFileError(f"{file.name} is not a tokenizers tokenizer.json: {exc}") from exc
        self.name = file.name

    def ids(self, text: str) -> list[int]:
        try:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        except Exception as exc:  # e.g. a WordLevel model whose unknown token is not in its vocabulary
            raise TokenizerFileError(f"{self.name} cannot encode {text[:40]!r}: {exc}") from exc

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise TokenizerFileError(f"token {token!r} is not in the tokenizer")
        return found


BPE_CACHE_WORDS = 65_536
"""Distinct words whose BPE merges a Moses + BPE vocabulary keeps (about 10 MB)."""


class MosesBPE:
    """Moses punctuation normalisation and tokenisation (``sacremoses``), then BPE over each Moses
    token with ``</w>`` ending a word's last piece (XLM's and FSMT's subword-nmt style); back: the
    pieces joined at ``</w>`` and Moses-detokenised. The file is JSON: ``{"lang", "lower_case",
    "merges"}`` (``merges``: the ranked pairs, as ``merges.txt`` lists them); the pieces map to ids
    through the vocabulary's ``tokens`` (docs/manifest.md states each step)."""

    def __init__(self, file: TokenizerFile) -> None:
        try:
            spec = json.loads(file.data.decode("utf-8"))
            self.lang, self.lower_case = str(spec["lang"]), bool(spec.get("lower_case", False))
            self.ranks = {(str(a), str(b)): rank for rank, (a, b) in enumerate(spec["merges"])}
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise TokenizerFileError(f"{file.name} is not a Moses + BPE description: {exc}") from exc
        try:
            import sacremoses
        except ImportError as exc:
            raise TokenizerFileError(f'{file.name}: a moses vocabulary needs sacremoses: pip install '
                                     '"s2s-deploy[moses]"') from exc
        self.normalizer = sacremoses.MosesPunctNormalizer(lang=self.lang, pre_replace_unicode_punct=True,
                                                          post_remove_control_chars=True)
        self.tokenizer = sacremoses.MosesTokenizer(lang=self.lang)
        self.detokenizer = sacremoses.MosesDetokenizer(lang=self.lang)
        self.bpe = functools.lru_cache(maxsize=BPE_CACHE_WORDS)(self._merged)
        """``_merged`` with the last ``BPE_CACHE_WORDS`` distinct words kept: a server's vocabulary of
        words is unbounded, its memory must not be (and lru_cache is safe under threads)."""

    def pieces(self, text: str) -> list[str]:
        if self.lower_case:
            text = text.lower()
        words = self.tokenizer.tokenize(self.normalizer.normalize(text), aggressive_dash_splits=True,
                                        return_str=False, escape=True)
        return [piece for word in words if word for piece in self.bpe(word)]

    def _merged(self, word: str) -> tuple[str, ...]:
        """The lowest-ranked adjacent pair merged until none is ranked; ``</w>`` on the last piece."""
        parts = [*word[:-1], word[-1] + "</w>"]
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b)), i) for i, (a, b) in enumerate(pairwise(parts))]
            ranked = [(rank, i) for rank, i in pairs if rank is not None]
            if not ranked:
                break
            _, at = min(ranked)
            best = parts[at], parts[at + 1]
            merged, i = [], 0
            while i < len(parts):  # every occurrence of the pair, left to right
                if i < len(parts) - 1 and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return tuple(parts)

    def text(self, pieces: list[str]) -> str:
        words = "".join(p.replace(" ", "").replace("</w>", " ") for p in pieces).split()
        return self.detokenizer.detokenize(words)


def load_model(level: str, file: TokenizerFile) -> SentencePieceModel | HFTokenizer | MosesBPE:
    if level == MOSES:
        return MosesBPE(file)
    return SentencePieceModel(file) if level == SENTENCEPIECE else HFTokenizer(file)
