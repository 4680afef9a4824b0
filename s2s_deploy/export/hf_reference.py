"""The Hugging Face original of an export, for ``parity --reference HF_DIR``.

``GenerateEngine`` is the reference for tokens: ``transformers``' own ``generate``, at the
folder's own generation settings, so parity sees what a user of ``generate`` sees (our search
run over their model would hide a difference in the search itself). ``HFBackend`` is the
reference for each step's log-probs: their model (``AutoModelForSeq2SeqLM``, local files only),
not our port of it, rerun over the whole prefix without a cache at every step: slow, but with
nothing of ours in the path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from s2s_deploy.errors import S2SError
from s2s_deploy.format.decoding import OPEN_SLOT
from s2s_deploy.runtime.backend import Backend, DecodeRun
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.search import Hypothesis


def load_transformers_model(directory: str | Path) -> Any:
    """``AutoModelForSeq2SeqLM`` (else ``AutoModelForSpeechSeq2Seq``) from a local folder; one line
    naming the extra if it is missing."""
    try:
        from transformers import AutoModelForSeq2SeqLM, AutoModelForSpeechSeq2Seq
    except ImportError as exc:
        raise S2SError('the Hugging Face reference needs transformers: pip install "s2s-deploy[hf]"') from exc
    if not Path(directory, "config.json").is_file():
        raise S2SError(f"{directory} is not a Hugging Face model folder (no config.json)")
    try:
        try:
            return AutoModelForSeq2SeqLM.from_pretrained(str(directory), local_files_only=True, use_safetensors=None)
        except ValueError as exc:  # a speech model (Whisper) is no text-to-text one: its own auto class
            if "Unrecognized configuration class" not in str(exc):
                raise
            return AutoModelForSpeechSeq2Seq.from_pretrained(str(directory), local_files_only=True,
                                                             use_safetensors=None)
    except (OSError, ValueError) as exc:
        raise S2SError(f"transformers cannot load {directory}: {str(exc).splitlines()[0]}") from exc


def encoder_inputs(src: np.ndarray, src_len: np.ndarray, features: bool) -> dict[str, torch.Tensor | None]:
    """``src`` as transformers names it (``input_ids``, or ``input_features`` for a speech encoder)
    and its ``attention_mask`` over the length axis; none for features that fill every row (a
    fixed window such as Whisper's, whose encoder takes no mask)."""
    lengths = torch.from_numpy(np.asarray(src_len, dtype=np.int64))
    if features:
        data = torch.from_numpy(np.ascontiguousarray(src, dtype=np.float32))
        full = bool((lengths == data.shape[-1]).all())
        mask = None if full else (torch.arange(data.shape[-1])[None, :] < lengths[:, None]).long()
        return {"input_features": data, "attention_mask": mask}
    ids = torch.from_numpy(np.asarray(src, dtype=np.int64))
    return {"input_ids": ids, "attention_mask": (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()}


class HFBackend(Backend):
    name = "transformers"

    def __init__(self, model: Any, decoder_start_id: int, eos_id: int, features: bool = False,
                 language_ids: tuple[int, ...] = ()) -> None:
        self.model = model.float().eval()
        self.decoder_start_id, self.eos_id, self.features = decoder_start_id, eos_id, features
        self.language_ids = tuple(sorted(language_ids))
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])

    def describe(self) -> dict[str, Any]:
        import transformers

        return {"backend": self.name, "transformers": transformers.__version__}

    @torch.no_grad()
    def start(self, src: np.ndarray, src_len: np.ndarray, expand: int = 1, keep_attention: bool = False) -> DecodeRun:
        inputs = encoder_inputs(src, src_len, self.features)
        encoded = self.model.get_encoder()(**inputs).last_hidden_state
        return _HFRun(self.model, encoded, inputs["attention_mask"], expand)


class _HFRun(DecodeRun):
    def __init__(self, model: Any, encoded: torch.Tensor, mask: torch.Tensor | None, expand: int) -> None:
        self.model, self.expand = model, expand
        self.encoded, self.mask = encoded, mask
        self.history: torch.Tensor | None = None  # (rows, steps so far)

    @torch.no_grad()
    def step(self, tokens: np.ndarray, reorder: np.ndarray) -> np.ndarray:
        rows = len(tokens)
        # a first step fed one row per sentence runs on the untiled memory, like our backends
        times = self.expand if self.history is not None or rows != self.encoded.shape[0] else 1
        encoded = self.encoded.repeat_interleave(times, dim=0) if times > 1 else self.encoded
        mask = self.mask.repeat_interleave(times, dim=0) if times > 1 and self.mask is not None else self.mask
        new = torch.from_numpy(np.asarray(tokens, dtype=np.int64))[:, None]
        self.history = new if self.history is None else torch.cat(
            [self.history[torch.from_numpy(np.asarray(reorder, dtype=np.int64))], new], dim=1)
        out = self.model(encoder_outputs=(encoded,), attention_mask=mask, decoder_input_ids=self.history,
                         use_cache=False)
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

    def __init__(self, model: Any, decoder_start_id: int, eos_id: int, features: bool = False,
                 language_ids: tuple[int, ...] = ()) -> None:
        self.model = model.float().eval()
        self.decoder_start_id, self.eos_id, self.features = decoder_start_id, eos_id, features
        self.language_ids = frozenset(language_ids)

    @torch.no_grad()
    def search(self, src: np.ndarray, src_len: np.ndarray, config: SearchConfig) -> list[list[Hypothesis]]:
        inputs = {k: v for k, v in encoder_inputs(src, src_len, self.features).items() if v is not None}
        out = self.model.generate(**inputs, num_beams=config.beam_size, max_new_tokens=config.max_len,
                                  output_scores=True, return_dict_in_generate=True)
        scores = getattr(out, "sequences_scores", None)
        head = [self.decoder_start_id, *config.decoder_prompt]
        found = []
        for i, full in enumerate(out.sequences.tolist()):
            ours = len(full) >= len(head) and all(
                want == got or (want == OPEN_SLOT and got in self.language_ids)
                for want, got in zip(head, full, strict=False))
            row = full[len(head):] if ours else full
            finished = self.eos_id in row
            tokens = tuple(row[: row.index(self.eos_id)] if finished else row)
            score = float(scores[i]) if scores is not None else float("nan")
            prompt = tuple(full[1: len(head)]) if ours else tuple(config.decoder_prompt)
            found.append([Hypothesis(tokens, (), score, finished, prompt)])
        return found
