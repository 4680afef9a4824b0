"""Training a model whose encoder reads features, on a speech dataset folder (``train/speech_data.py``).

The text trainer's recipe (teacher forcing, Adam with warmup and cosine decay, clipping, the
checkpoint with the best valid exact match kept), with utterances' features as the source: each
batch is restored from the shards' trimmed storage to exactly what the front end computes at run
time, and the plugin's declared front end must be the dataset's. Validation and the final test on
the held-out voices decode greedily through ``TorchBackend`` and the runtime's own search, and
report exact match, WER and CER.

    s2s-deploy train --arch speech --task speech:DATASET_DIR
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import sha256_of
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.frontends import WhisperLogMel
from s2s_deploy.modeling.checkpoint import build_model, load_checkpoint, save_checkpoint
from s2s_deploy.modeling.contract import ArchitecturePlugin, Seq2SeqModel
from s2s_deploy.modeling.torch_backend import TorchBackend
from s2s_deploy.runtime.decoding import plain
from s2s_deploy.runtime.search import greedy
from s2s_deploy.train.metrics import error_rate, exact_match
from s2s_deploy.train.speech_data import HELD_OUT_SPLITS, SPEECH_TASK, FeatureSplit, load_metadata
from s2s_deploy.train.trainer import TrainConfig, learning_rate, masked_cross_entropy, pad


@dataclass(frozen=True)
class SpeechScores:
    exact_match: float
    wer: float
    cer: float
    count: int

    def summary(self) -> str:
        return f"exact match {self.exact_match:.2%}, WER {self.wer:.2%}, CER {self.cer:.2%} (n={self.count})"


@dataclass(frozen=True)
class SpeechResult:
    checkpoint: Path
    best_epoch: int
    best: SpeechScores
    test: SpeechScores | None


def check_frontend(plugin: ArchitecturePlugin, config: Any, frontend: WhisperLogMel) -> None:
    """The model must be trained on the features its export will compute."""
    declared = plugin.source_spec(config)
    if not declared.is_features or dict(declared.frontend or {}) != frontend.to_json():
        raise S2SError(f"{plugin.name}: the dataset's front end {frontend.to_json()} is not the model's "
                       f"{dict(declared.frontend or {}) or 'token ids'}; choose a matching preset or remake the data")


@torch.no_grad()
def transcribe_split(model: Seq2SeqModel, plugin: ArchitecturePlugin, config: Any, tgt_vocab: Vocabulary,
                     split: FeatureSplit, device: torch.device, batch_size: int = 200) -> list[str]:
    """Greedy hypotheses for every utterance of ``split``, decoded by the runtime's own search."""
    backend = TorchBackend(plugin, model, config, tgt_vocab, device=str(device))
    max_len = plugin.max_target_length(config) or 128
    found: list[str] = []
    for start in range(0, len(split), batch_size):
        src, src_len = split.features(range(start, min(start + batch_size, len(split))))
        found += [tgt_vocab.decode(h.tokens) for h in greedy(backend, src, src_len, plain(max_len=max_len))]
    model.train()
    return found


def speech_scores(hypotheses: Sequence[str], references: Sequence[str]) -> SpeechScores:
    return SpeechScores(exact_match(hypotheses, references), error_rate(hypotheses, references, "word"),
                        error_rate(hypotheses, references, "char"), len(references))


def train_speech(
    plugin: ArchitecturePlugin, config: Any, folder: Path, cfg: TrainConfig, out: str | Path, *,
    info: dict[str, Any] | None = None, time_limit: float | None = None, init: str | Path | None = None,
    every_epoch: bool = False, log: Callable[[str], None] = print,
) -> SpeechResult:
    """Train on ``folder``'s train split, keep the best-by-valid-exact-match checkpoint at ``out``,
    then score it once on the test split (the held-out voices). ``time_limit`` (seconds) ends
    training early, after the epoch it falls in is validated; ``cfg.max_train``/``max_valid`` take
    the first utterances of each split. ``init`` starts from that checkpoint's weights (same
    architecture and vocabularies) with ``config``'s training settings and a fresh schedule: a
    fine-tune on new voices that keeps what the model learnt of the task. ``every_epoch`` also keeps
    each epoch's weights (``out``'s stem + ``-epochN``), to choose on another held-out set than valid
    or to average checkpoints."""
    out = Path(out)
    torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    metadata = load_metadata(folder)
    frontend = WhisperLogMel.from_json(metadata["frontend"])
    check_frontend(plugin, config, frontend)
    train_split = FeatureSplit(folder, "train", frontend, cfg.max_train)
    valid_split = FeatureSplit(folder, "valid", frontend, cfg.max_valid)
    limit = plugin.max_target_length(config)
    if init is None:
        src_vocab = Vocabulary.build(train_split.sources, cfg.level)
        tgt_vocab = Vocabulary.build(train_split.targets, cfg.level, decoder_start=plugin.special_tokens.decoder_start)
    else:  # the source is features, its vocabulary only a record: the start's, so new phrasings fit it
        src_vocab, tgt_vocab = _vocabularies_of(init, train_split.targets)
    targets = [(*tgt_vocab.encode(t, add_eos=False), tgt_vocab.eos_id) for t in train_split.targets]
    keep = [i for i, t in enumerate(targets) if limit is None or len(t) < limit]
    if len(keep) < len(targets):
        log(f"skipping {len(targets) - len(keep)} utterances whose target is over the model's {limit} positions")
    torch.manual_seed(cfg.seed)
    model = plugin.build(config, len(src_vocab), len(tgt_vocab))
    started_from = {} if init is None else {"initialised_from": _load_initial_weights(model, plugin, init, src_vocab,
                                                                                      tgt_vocab)}
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)
    total_steps = cfg.epochs * math.ceil(len(keep) / cfg.batch_size)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    base_info = {**(info or {}), "task": f"{SPEECH_TASK}{folder.name}", "speech_data": {
        k: metadata.get(k) for k in ("task", "seed", "sizes", "frontend", "held_out_for_test", "espeak_ng")},
        "train_config": dataclasses.asdict(cfg), "train_utterances": len(keep), "valid_utterances": len(valid_split),
        **started_from}
    step, best_key, best_epoch, best = 0, -1.0, 0, None
    began = time.perf_counter()
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        order = keep[:]
        random.Random(cfg.seed * 100_003 + epoch).shuffle(order)
        total_loss, total_tokens, epoch_began = 0.0, 0, time.perf_counter()
        for first in range(0, len(order), cfg.batch_size):
            rows = order[first : first + cfg.batch_size]
            src, src_len = train_split.features(rows)
            labels = pad([targets[r] for r in rows], tgt_vocab.pad_id).to(device)
            tgt_in = pad([targets[r][:-1] for r in rows], tgt_vocab.pad_id, prefix=tgt_vocab.decoder_start_id)
            if time_limit is not None:  # the schedule decays over the budget when that ends first
                step = max(step, int(total_steps * (time.perf_counter() - began) / time_limit))
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(min(step, total_steps), total_steps, cfg)
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                logits = model(torch.from_numpy(src).to(device), torch.from_numpy(src_len).to(device),
                               tgt_in.to(device))
            loss_sum, tokens = masked_cross_entropy(logits.float(), labels, tgt_vocab.pad_id)
            (loss_sum / tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            optimizer.step()
            step += 1
            total_loss, total_tokens = total_loss + loss_sum.item(), total_tokens + tokens
            if time_limit is not None and time.perf_counter() - began > time_limit:
                break
        valid = speech_scores(transcribe_split(model, plugin, config, tgt_vocab, valid_split, device),
                              valid_split.targets)
        improved = valid.exact_match > best_key
        if every_epoch:
            save_checkpoint(out.with_name(f"{out.stem}-epoch{epoch}{out.suffix}"), plugin, config, model, src_vocab,
                            tgt_vocab, {**base_info, "epoch": epoch, "valid": dataclasses.asdict(valid)})
        if improved:
            best_key, best_epoch, best = valid.exact_match, epoch, valid
            save_checkpoint(out, plugin, config, model, src_vocab, tgt_vocab, {
                **base_info, "epoch": epoch, "valid": dataclasses.asdict(valid)})
        log(f"epoch {epoch}/{cfg.epochs}: loss {total_loss / max(total_tokens, 1):.4f}, "
            f"{time.perf_counter() - epoch_began:.0f} s, valid {valid.summary()}{' (best, saved)' if improved else ''}")
        if time_limit is not None and time.perf_counter() - began > time_limit:
            log(f"stopping: the {time_limit:.0f} s training budget is spent")
            break
    assert best is not None
    test = _score_test(out, plugin, folder, frontend, device, time.perf_counter() - began, log)
    return SpeechResult(out, best_epoch, best, test)


def _load_initial_weights(model: Seq2SeqModel, plugin: ArchitecturePlugin, init: str | Path, src_vocab: Vocabulary,
                          tgt_vocab: Vocabulary) -> dict[str, Any]:
    """``init``'s weights into ``model``, refused in one line unless its architecture, vocabularies and
    tensor shapes are the run's; what it was, for the new checkpoint's info."""
    start = load_checkpoint(init)
    if start.arch != plugin.name:
        raise S2SError(f"cannot start from {init}: it is a {start.arch!r} checkpoint, not {plugin.name!r}")
    if start.src_vocab.tokens != src_vocab.tokens or start.tgt_vocab.tokens != tgt_vocab.tokens:
        raise S2SError(f"cannot start from {init}: its vocabularies are not the ones this run uses")
    try:
        model.load_state_dict(build_model(start, plugin).state_dict())
    except RuntimeError as error:  # torch lists every mismatch; the first says enough
        first = next((line.strip() for line in str(error).splitlines()[1:] if line.strip()), str(error))
        raise S2SError(f"cannot start from {init}: its weights do not fit this config ({first})") from None
    return {"path": str(init), "sha256": sha256_of(Path(init)), "command": start.info.get("command"),
            "epoch": start.info.get("epoch"), "test": start.info.get("test")}


def _vocabularies_of(init: str | Path, targets: Sequence[str]) -> tuple[Vocabulary, Vocabulary]:
    """``init``'s vocabularies, refused in one line when a training target has a character its target
    vocabulary lacks (the model could never write it)."""
    start = load_checkpoint(init)
    known = set(start.tgt_vocab.tokens)
    missing = sorted({ch for text in targets for ch in text} - known)
    if missing:
        raise S2SError(f"cannot start from {init}: the training targets hold {''.join(missing)!r}, "
                       "which its target vocabulary lacks")
    return start.src_vocab, start.tgt_vocab


def _score_test(out: Path, plugin: ArchitecturePlugin, folder: Path, frontend: WhisperLogMel, device: torch.device,
                seconds: float, log: Callable[[str], None]) -> SpeechScores | None:
    """The kept checkpoint scored once on each held-out split the dataset has (``test``: the held-out
    voices; ``natural`` and ``nonspeech`` where made), recorded in its info (never used to select);
    returns the ``test`` scores."""
    metadata = load_metadata(folder)
    checkpoint = load_checkpoint(out)
    model = build_model(checkpoint, plugin).to(device)
    scores: dict[str, SpeechScores] = {}
    for name in HELD_OUT_SPLITS:
        if not metadata.get("splits", {}).get(name, {}).get("shards"):
            continue
        split = FeatureSplit(folder, name, frontend)
        scores[name] = speech_scores(transcribe_split(model, plugin, checkpoint.config, checkpoint.tgt_vocab, split,
                                                      device), split.targets)
        said = (f"empty transcript on {scores[name].exact_match:.2%} (n={scores[name].count})" if name == "nonspeech"
                else scores[name].summary())
        log(f"{name} (held-out voices, epoch {checkpoint.info.get('epoch')} checkpoint): {said}")
    if not scores:
        return None
    extra = {f"test_{name}": dataclasses.asdict(value) for name, value in scores.items() if name != "test"}
    save_checkpoint(out, plugin, checkpoint.config, model, checkpoint.src_vocab, checkpoint.tgt_vocab,
                    {**checkpoint.info, **({"test": dataclasses.asdict(scores["test"])} if "test" in scores else {}),
                     **extra, "train_seconds": round(seconds, 1)})
    return scores.get("test")

