"""Subword tokenisers a vocabulary may name: a SentencePiece ``.model`` or a Hugging Face
``tokenizer.json``, run by the ``sentencepiece`` and ``tokenizers`` packages (both torch-free).

The file travels as bytes: copied into an export folder (its sha256 in the manifest) and
embedded in a checkpoint, so an export never reads a tokenizer from anywhere else.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import inside

SENTENCEPIECE, HF = "sentencepiece", "hf"
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


def load_model(level: str, file: TokenizerFile) -> SentencePieceModel | HFTokenizer:
    return SentencePieceModel(file) if level == SENTENCEPIECE else HFTokenizer(file)
