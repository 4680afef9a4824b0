"""The Hugging Face original of an export, for ``parity --reference HF_DIR``.

``GenerateEngine`` is the reference for tokens: ``transformers``' own ``generate``, at the
folder's own generation settings, so parity sees what a user of ``generate`` sees (our search
run over their model would hide a difference in the search itself). ``HFBackend`` is the
reference for each step's log-probs: their model (``AutoModelForSeq2SeqLM``, local files only),
not our port of it, rerun over the whole prefix without a cache at every step: slow, but with
nothing of ours in the path. A family whose uncached forward is not what its cached ``generate``
computes (the plugin's ``hf_step_cache``) is stepped with transformers' own cache instead, one
token a step, the cache reordered by the search's backpointers as ``generate`` reorders it.

With timestamps (``parity --timestamps``), ``GenerateEngine.timed`` is the reference for tokens and
segments: ``generate(return_timestamps=True, return_segments=True)`` on each whole clip alone.

Features of different lengths (a batch of clips padded along their frames) are encoded, and
generated from, one input at a time at its own length: a ``transformers`` encoder may let a
batch's padding into a convolution despite its ``attention_mask`` (Speech2Text's subsampler
does), and an export must not, so the reference is what ``generate`` gives for each clip alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from s2s_deploy.errors import S2SError
from s2s_deploy.format.decoding import OPEN_SLOT
from s2s_deploy.format.source import TOKEN_SOURCE, SourceSpec
from s2s_deploy.frontends.source import medium_for
from s2s_deploy.runtime.backend import Backend, DecodeRun
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.search import Hypothesis
from s2s_deploy.runtime.timestamps import Piece
from s2s_deploy.verify.timestamps import Timed

AUTO_CLASSES = ("AutoModelForSeq2SeqLM", "AutoModelForSpeechSeq2Seq", "AutoModelForImageTextToText",
                "AutoModelForVision2Seq")
"""transformers' auto classes of encoder-decoders, text first; each version defines some of them."""

"""What transformers calls an encoder's features, by the front end's medium."""


def load_transformers_model(directory: str | Path) -> Any:
    """The first of ``AUTO_CLASSES`` that takes the folder's config, from local files; one line
    naming the extra if transformers is missing."""
    try:
        import transformers
    except ImportError as exc:
        raise S2SError('the Hugging Face reference needs transformers: pip install "s2s-deploy[hf]"') from exc
    if not Path(directory, "config.json").is_file():
        raise S2SError(f"{directory} is not a Hugging Face model folder (no config.json)")
    classes = [getattr(transformers, name) for name in AUTO_CLASSES if hasattr(transformers, name)]
    for auto in classes:
        try:
            return auto.from_pretrained(str(directory), local_files_only=True, use_safetensors=None)
        except ValueError as exc:  # another kind of model: the next auto class
            if "Unrecognized configuration class" not in str(exc) or auto is classes[-1]:
                raise S2SError(f"transformers cannot load {directory}: {str(exc).splitlines()[0]}") from exc
        except OSError as exc:
            raise S2SError(f"transformers cannot load {directory}: {str(exc).splitlines()[0]}") from exc
    raise S2SError(f"transformers {transformers.__version__} has none of {', '.join(AUTO_CLASSES)}")


@contextmanager
def in_transformers(what: str) -> Iterator[None]:
    """A failure inside transformers' own model (a bug of its, such as a table left on the meta device
    by ``from_pretrained``) as one line naming it, not a traceback through their code."""
    try:
        yield
    except (RuntimeError, NotImplementedError, ValueError, TypeError, IndexError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise S2SError(f"transformers' {what} failed on the reference model: {first}") from exc


def encoder_inputs(src: np.ndarray, src_len: np.ndarray, source: SourceSpec) -> dict[str, torch.Tensor | None]:
    """``src`` as transformers names it (``input_ids``, or the name its medium's row gives)
    and its ``attention_mask`` over the frames; none for features that fill every row (a fixed window
    such as Whisper's, whose encoder takes no mask) or that have no frames (images)."""
    lengths = torch.from_numpy(np.asarray(src_len, dtype=np.int64))
    if source.is_features:
        data = torch.from_numpy(np.ascontiguousarray(src, dtype=np.float32))
        axis = source.length_axis
        full = axis is None or bool((lengths == data.shape[axis]).all())
        frames = None if full else torch.arange(data.shape[axis])[None, :] < lengths[:, None]
        return {medium_for(source).transformers_input: data, "attention_mask": None if full else frames.long()}
    ids = torch.from_numpy(np.asarray(src, dtype=np.int64))
    return {"input_ids": ids, "attention_mask": (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()}


def one_at_a_time(src: np.ndarray, src_len: np.ndarray, source: SourceSpec) -> list[dict[str, torch.Tensor]] | None:
    """Each row of padded features cut to its own frames, without a mask, as one clip is fed alone;
    None where no row is padded (or the source is not features with a frames axis)."""
    axis = source.length_axis
    if not source.is_features or axis is None or all(int(n) == src.shape[axis] for n in src_len):
        return None
    name = medium_for(source).transformers_input
    data = torch.from_numpy(np.ascontiguousarray(src, dtype=np.float32))
    return [{name: data[i : i + 1].narrow(axis, 0, int(length))} for i, length in enumerate(src_len)]


class HFBackend(Backend):
    name = "transformers"

    def __init__(self, model: Any, decoder_start_id: int, eos_id: int, source: SourceSpec = TOKEN_SOURCE,
                 cached: bool = False, language_ids: tuple[int, ...] = ()) -> None:
        """``source``: what the export's encoder reads (the manifest's ``encoder_input``); ``cached``:
        step transformers with its own cache, as ``generate`` does (the plugin's ``hf_step_cache``)."""
        self.model = model.float().eval()
        self.decoder_start_id, self.eos_id, self.source = decoder_start_id, eos_id, source
        self.language_ids = tuple(sorted(language_ids))
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.cached = cached

    def describe(self) -> dict[str, Any]:
        import transformers

        return {"backend": self.name, "transformers": transformers.__version__}

    @torch.no_grad()
    def start(self, src: np.ndarray, src_len: np.ndarray, expand: int = 1, keep_attention: bool = False) -> DecodeRun:
        inputs = encoder_inputs(src, src_len, self.source)
        rows = one_at_a_time(src, src_len, self.source)
        encoder = self.model.get_encoder()
        with in_transformers("encoder"):
            if rows is None:
                encoded = encoder(**inputs).last_hidden_state
            else:  # each clip alone, its states right-padded with zeros (masked in cross-attention)
                alone = [encoder(**row).last_hidden_state[0] for row in rows]
                encoded = torch.nn.utils.rnn.pad_sequence(alone, batch_first=True)
        return _HFRun(self.model, encoded, inputs["attention_mask"], expand, self.cached)


class _HFRun(DecodeRun):
    def __init__(self, model: Any, encoded: torch.Tensor, mask: torch.Tensor | None, expand: int,
                 cached: bool) -> None:
        self.model, self.expand = model, expand
        self.encoded, self.mask = encoded, mask
        self.history: torch.Tensor | None = None  # (rows, steps so far)
        self.cache: Any = None
        from transformers.modeling_outputs import BaseModelOutput

        self.wrap = BaseModelOutput  # encoder_outputs as the models read them (ProphetNet's reads it by name)
        if cached:
            from transformers import DynamicCache, EncoderDecoderCache

            self.cache = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))

    @torch.no_grad()
    def step(self, tokens: np.ndarray, reorder: np.ndarray) -> np.ndarray:
        rows = len(tokens)
        # a first step fed one row per sentence runs on the untiled memory, like our backends
        times = self.expand if self.history is not None or rows != self.encoded.shape[0] else 1
        encoded = self.encoded.repeat_interleave(times, dim=0) if times > 1 else self.encoded
        mask = self.mask.repeat_interleave(times, dim=0) if times > 1 and self.mask is not None else self.mask
        new = torch.from_numpy(np.asarray(tokens, dtype=np.int64))[:, None]
        backpointers = torch.from_numpy(np.asarray(reorder, dtype=np.int64))
        first = self.history is None
        self.history = new if first else torch.cat([self.history[backpointers], new], dim=1)
        encoder_outputs = self.wrap(last_hidden_state=encoded)
        with in_transformers("forward"):
            if self.cache is None:
                out = self.model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=self.history,
                                 use_cache=False)
            else:  # one token against the cache, reordered (and tiled after a first step per sentence) by backpointers
                if not first:
                    self.cache.reorder_cache(backpointers)
                out = self.model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=new,
                                 cache=self.cache, use_cache=True)
        return torch.log_softmax(out.logits[:, -1].float(), dim=-1).numpy()

    def step_top(self, tokens: np.ndarray, reorder: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        log_probs = torch.from_numpy(self.step(tokens, reorder))
        values, ids = torch.topk(log_probs, k, dim=-1)
        return values.numpy(), ids.numpy()

    def close(self) -> None:
        """Nothing is pooled."""


class GenerateEngine:
    """``model.generate`` as a SearchEngine. Only ``beam_size`` and ``max_len`` (as
    ``num_beams`` and ``max_new_tokens``) are passed: everything else is the folder's own
    ``generation_config.json`` and ``generate``'s defaults, which the export must reproduce.
    Scores are ``generate``'s for beam search, NaN for greedy (it reports none). Its sequences
    start with the decoder start and the export's decoder prompt, whose open slot (-1) stands for
    any of ``language_ids`` (the language ``generate`` detected, which each Hypothesis's ``prompt``
    carries); a row that starts otherwise (``generate`` built another prompt) is returned whole,
    so it differs from ours."""

    name = "transformers generate"

    def __init__(self, model: Any, decoder_start_id: int, eos_id: int, source: SourceSpec = TOKEN_SOURCE,
                 language_ids: tuple[int, ...] = ()) -> None:
        self.model = model.float().eval()
        self.decoder_start_id, self.eos_id, self.source = decoder_start_id, eos_id, source
        self.language_ids = frozenset(language_ids)
        self.outputs: list[tuple[int, ...]] = []  # every hypothesis's tokens, for the tokenizer check

    @torch.no_grad()
    def search(self, src: np.ndarray, src_len: np.ndarray, config: SearchConfig) -> list[list[Hypothesis]]:
        inputs = encoder_inputs(src, src_len, self.source)
        batches = one_at_a_time(src, src_len, self.source) or [{k: v for k, v in inputs.items() if v is not None}]
        sequences: list[list[int]] = []
        scored: list[float] = []
        with in_transformers("generate"):
            for batch in batches:
                out = self.model.generate(**batch, num_beams=config.beam_size, max_new_tokens=config.max_len,
                                          output_scores=True, return_dict_in_generate=True)
                sequences += out.sequences.tolist()
                scores = getattr(out, "sequences_scores", None)
                scored += scores.tolist() if scores is not None else [float("nan")] * len(out.sequences)
        head = [self.decoder_start_id, *config.decoder_prompt]
        found = []
        for i, full in enumerate(sequences):
            ours = len(full) >= len(head) and all(
                want == got or (want == OPEN_SLOT and got in self.language_ids)
                for want, got in zip(head, full, strict=False))
            row = full[len(head):] if ours else full
            finished = self.eos_id in row
            tokens = tuple(row[: row.index(self.eos_id)] if finished else row)
            score = scored[i]
            prompt = tuple(full[1: len(head)]) if ours else tuple(config.decoder_prompt)
            found.append([Hypothesis(tokens, (), score, finished, prompt)])
            self.outputs.append(tokens)
        return found

    @torch.no_grad()
    def timed(self, features: Sequence[np.ndarray], config: SearchConfig) -> list[Timed]:
        """``generate(return_timestamps=True, return_segments=True)`` on each whole input alone, at its
        own length and without a mask (so a clip longer than the window goes through ``generate``'s own
        seek loop): its new tokens up to EOS, and its segments' times and tokens. Only the beam size and
        ``max_len`` (per window) are passed, as in ``search``."""
        name = medium_for(self.source).transformers_input
        found = []
        with in_transformers("generate"):
            for item in features:
                data = torch.from_numpy(np.ascontiguousarray(item[None], dtype=np.float32))
                out = self.model.generate(**{name: data}, num_beams=config.beam_size, max_new_tokens=config.max_len,
                                          return_timestamps=True, return_segments=True)
                row = out["sequences"][0].tolist()
                tokens = tuple(row[: row.index(self.eos_id)] if self.eos_id in row else row)
                segments = tuple(Piece(float(s["start"]), float(s["end"]), tuple(s["tokens"].tolist()))
                                 for s in out["segments"][0])
                found.append(Timed(tokens, segments))
        return found
