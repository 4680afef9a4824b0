"""Training as in the seeds' ``train_seq2seq`` (d2l), for any plugin, through the contract only.

Teacher forcing (decoder input ``<bos>`` + target, label target + ``<eos>``), cross-entropy
that ignores padding, Adam with warmup and cosine decay, gradient clipping, and batches of
similar lengths so little compute goes to padding. Each epoch greedy-decodes the valid split
and the checkpoint with the best exact match is kept. Runs are deterministic given the seed
and the thread count, and a resumed run continues exactly where the interrupted one stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor
from tqdm import tqdm

from s2s_deploy.errors import CheckpointError, ContractError, S2SError
from s2s_deploy.format.files import atomic_path
from s2s_deploy.format.vocab import BUILT_LEVELS, Vocabulary
from s2s_deploy.modeling.checkpoint import build_model, load_checkpoint, save_checkpoint
from s2s_deploy.modeling.contract import ArchitecturePlugin, Seq2SeqModel
from s2s_deploy.modeling.plugin_errors import plugin_errors
from s2s_deploy.train.metrics import Scores, score
from s2s_deploy.train.tasks import Pair, TaskSplits

STATE_FORMAT = "s2s-deploy-train-state/1"
SAMPLE_COUNT = 32
"""Held-out test sources stored in the checkpoint: export's parity inputs, with no task generator needed."""
LENGTH_SLACK = 10


@dataclass(frozen=True)
class TrainConfig:
    """Everything besides the model config that decides the trained weights."""

    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3
    warmup_steps: int = 300
    clip_norm: float = 1.0
    seed: int = 0
    threads: int = 2
    level: str = "char"
    max_train: int | None = None
    max_valid: int | None = None
    device: str = "cpu"
    patience: int | None = None

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.threads < 1:
            raise S2SError("epochs, batch size and threads must be at least 1")
        if self.patience is not None and self.patience < 1:
            raise S2SError("patience must be at least 1 epoch")
        if not self.lr > 0 or self.clip_norm <= 0 or self.warmup_steps < 0:
            raise S2SError("lr and clip norm must be positive, warmup steps non-negative")
        if self.level not in BUILT_LEVELS:
            raise S2SError(f"unknown tokenisation level {self.level!r}; known: {', '.join(BUILT_LEVELS)}")


@dataclass(frozen=True)
class EpochStats:
    epoch: int
    loss: float
    tokens_per_s: float
    valid: Scores


@dataclass(frozen=True)
class TrainResult:
    checkpoint: Path
    best_epoch: int
    best: Scores
    history: tuple[EpochStats, ...]
    test: Scores | None = None


@dataclass(frozen=True)
class Encoded:
    """A split as id lists: source ids end with ``<eos>``, as do target ids."""

    src: tuple[tuple[int, ...], ...]
    tgt: tuple[tuple[int, ...], ...]


def train_state_path(checkpoint: str | Path) -> Path:
    """Where the last epoch's weights and optimizer moments live beside a checkpoint, for --resume."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.name + ".train-state")


def encode_pairs(pairs: Sequence[Pair], src_vocab: Vocabulary, tgt_vocab: Vocabulary) -> Encoded:
    return Encoded(
        tuple(tuple(src_vocab.encode(p.source)) for p in pairs),
        tuple((*tgt_vocab.encode(p.target, add_eos=False), tgt_vocab.eos_id) for p in pairs),
    )


def pad(rows: Sequence[Sequence[int]], pad_id: int, prefix: int | None = None) -> Tensor:
    extra = 0 if prefix is None else 1
    out = torch.full((len(rows), max(len(r) for r in rows) + extra), pad_id, dtype=torch.int64)
    for i, row in enumerate(rows):
        if prefix is not None:
            out[i, 0] = prefix
        out[i, extra : extra + len(row)] = torch.tensor(row, dtype=torch.int64)
    return out


def make_batches(data: Encoded, batch_size: int, seed: int, pool: int = 50) -> list[list[int]]:
    """Shuffle, sort pools of ``pool`` batches by length, cut, shuffle the batch order."""
    rng = random.Random(seed)
    order = list(range(len(data.src)))
    rng.shuffle(order)
    batches = []
    for start in range(0, len(order), batch_size * pool):
        chunk = sorted(order[start : start + batch_size * pool], key=lambda i: (len(data.src[i]), len(data.tgt[i])))
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def length_limit(data: Encoded, slack: int = LENGTH_SLACK) -> dict[str, float]:
    """``max_len = a * source_len + b`` that every training target fits with ``slack`` tokens to
    spare: the default that stops a looping model long before a fixed limit would."""
    ratio = max((len(t) - slack) / max(len(s), 1) for s, t in zip(data.src, data.tgt, strict=True))
    return {"max_len_a": math.ceil(max(ratio, 0.0) * 20) / 20, "max_len_b": slack}


def masked_cross_entropy(logits: Tensor, labels: Tensor, pad_id: int) -> tuple[Tensor, int]:
    """Summed cross-entropy over non-padding labels (d2l's MaskedSoftmaxCELoss), and their count."""
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=pad_id,
                           reduction="sum")
    return loss, int((labels != pad_id).sum())


def learning_rate(step: int, total_steps: int, cfg: TrainConfig) -> float:
    """Linear warmup (post-norm Transformers diverge without it), then cosine decay to 5%."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def initial_state(plugin: ArchitecturePlugin, config: Any, encoded: dict[str, Tensor], batch: int,
                  device: torch.device | str) -> dict[str, Tensor]:
    """The decoder state before the first step: zeros per the spec, or the encoder's value."""
    state = {}
    for spec in plugin.state_specs(config):
        if spec.init == "zeros":
            state[spec.name] = torch.zeros(spec.zeros_shape(batch), dtype=getattr(torch, spec.dtype), device=device)
        elif spec.name in encoded:
            state[spec.name] = encoded[spec.name]
        else:
            raise ContractError(f"{plugin.name}: encode() returned no initial value for state {spec.name!r}")
    return state


@torch.no_grad()
def greedy_decode(
    model: Seq2SeqModel,
    plugin: ArchitecturePlugin,
    config: Any,
    sources: Sequence[str],
    src_vocab: Vocabulary,
    tgt_vocab: Vocabulary,
    max_steps: int,
    batch_size: int = 250,
    device: torch.device | str = "cpu",
) -> list[str]:
    """Batched greedy search with the PyTorch model's encode/decode_step, for validation."""
    limit = plugin.max_target_length(config)
    max_steps = min(max_steps, limit) if limit else max_steps
    was_training = model.training
    model.eval()
    start, eos = tgt_vocab.decoder_start_id, tgt_vocab.eos_id
    ids = [src_vocab.encode(s) for s in sources]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    results: list[str] = [""] * len(ids)
    for first in range(0, len(order), batch_size):
        chunk = order[first : first + batch_size]
        src = pad([ids[i] for i in chunk], src_vocab.pad_id).to(device)
        src_len = torch.tensor([len(ids[i]) for i in chunk], dtype=torch.int64, device=device)
        encoded = model.encode(src, src_len)
        memory = {spec.name: encoded[spec.name] for spec in plugin.memory_specs(config)}
        state = initial_state(plugin, config, encoded, len(chunk), device)
        tokens = torch.full((len(chunk),), start, dtype=torch.int64, device=device)
        done = torch.zeros(len(chunk), dtype=torch.bool, device=device)
        steps = []
        for t in range(max_steps):
            out = model.decode_step(tokens, torch.tensor(t, dtype=torch.int64, device=device), memory, state)
            state = out.state
            tokens = out.log_probs.argmax(-1).masked_fill(done, eos)
            steps.append(tokens)
            done |= tokens == eos
            if bool(done.all()):
                break
        rows = torch.stack(steps, dim=1).tolist()
        for i, row in zip(chunk, rows, strict=True):
            results[i] = tgt_vocab.decode(row)
    model.train(was_training)
    return results


def evaluate(
    model: Seq2SeqModel, plugin: ArchitecturePlugin, config: Any, pairs: Sequence[Pair], src_vocab: Vocabulary,
    tgt_vocab: Vocabulary, tokenize: str, max_steps: int, device: torch.device | str = "cpu",
) -> tuple[Scores, list[str]]:
    hypotheses = greedy_decode(model, plugin, config, [p.source for p in pairs], src_vocab, tgt_vocab, max_steps,
                               device=device)
    return score(hypotheses, [p.target for p in pairs], tokenize), hypotheses


def _fits(plugin: ArchitecturePlugin, config: Any, pairs: Sequence[Pair], vocab_src: Vocabulary,
          vocab_tgt: Vocabulary) -> list[Pair]:
    """Drop pairs longer than the model's position limits (``<bos>``/``<eos>`` included)."""
    src_limit, tgt_limit = plugin.max_source_length(config), plugin.max_target_length(config)
    return [
        p for p in pairs
        if (src_limit is None or len(vocab_src.encode(p.source)) <= src_limit)
        and (tgt_limit is None or len(vocab_tgt.encode(p.target)) <= tgt_limit)
    ]


def train(
    plugin: ArchitecturePlugin,
    config: Any,
    splits: TaskSplits,
    cfg: TrainConfig,
    out: str | Path,
    *,
    resume: str | Path | None = None,
    info: dict[str, Any] | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = print,
) -> TrainResult:
    """Train, keeping the best-by-exact-match checkpoint at ``out`` and the last epoch's state beside it.

    With ``resume``, the checkpoint fixes config and vocabularies (``config`` is ignored); if its
    train state exists, training continues from its last epoch up to ``cfg.epochs`` in total.
    """
    emit = log or (lambda _: None)
    out = Path(out)
    torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    train_pairs = list(splits.train[: cfg.max_train] if cfg.max_train else splits.train)
    valid_pairs = list(splits.valid[: cfg.max_valid] if cfg.max_valid else splits.valid)
    if not train_pairs or not valid_pairs:
        raise S2SError(f"task {splits.name}: the train and valid splits must not be empty")

    start_epoch, step, best_key, history = 0, 0, (-1.0, -1.0), []
    best_epoch, best_scores = 0, None
    state_tensors: dict[str, Tensor] = {}
    param_groups: list[dict[str, Any]] = []
    if resume is not None:
        checkpoint = load_checkpoint(resume)
        if checkpoint.arch != plugin.name:
            raise CheckpointError(f"cannot resume: {resume} is a {checkpoint.arch!r} checkpoint, not {plugin.name!r}")
        config, src_vocab, tgt_vocab = checkpoint.config, checkpoint.src_vocab, checkpoint.tgt_vocab
        model = build_model(checkpoint, plugin)
        saved = _load_train_state(train_state_path(resume), checkpoint.arch)
        if saved is not None:
            meta, state_tensors = saved
            param_groups = meta["param_groups"]
            start_epoch, step = meta["epoch"], meta["step"]
            best_key, best_epoch = tuple(meta["best_key"]), meta["best_epoch"]
            history = [_stats_from_dict(h) for h in meta["history"]]
            best_scores = history[best_epoch - 1].valid if best_epoch else None
            model.load_state_dict({k[len("model."):]: v for k, v in state_tensors.items() if k.startswith("model.")},
                                  strict=False)
            emit(f"resuming from epoch {start_epoch} of {resume}")
        else:
            emit(f"{resume} has no train state: fine-tuning its weights with a fresh optimizer")
    else:
        src_vocab = Vocabulary.build((p.source for p in train_pairs), cfg.level)
        tgt_vocab = Vocabulary.build((p.target for p in train_pairs), cfg.level,
                                     decoder_start=plugin.special_tokens.decoder_start)
        torch.manual_seed(cfg.seed)
        with plugin_errors(plugin.name, "build()"):
            model = plugin.build(config, len(src_vocab), len(tgt_vocab))
    model.to(device)

    if start_epoch >= cfg.epochs:
        raise S2SError(f"nothing to do: {resume} was already trained for {start_epoch} epochs; raise --epochs")
    kept = _fits(plugin, config, train_pairs, src_vocab, tgt_vocab)
    if len(kept) < len(train_pairs):
        emit(f"skipping {len(train_pairs) - len(kept)} training pairs longer than the model's limits")
    data = encode_pairs(kept, src_vocab, tgt_vocab)
    if not data.src:
        raise S2SError("no training pair fits the model's length limits")
    max_steps = max(len(t) for t in data.tgt) + 10
    bos = tgt_vocab.decoder_start_id
    pad_id = tgt_vocab.pad_id

    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)
    if state_tensors:
        optimizer.load_state_dict(_unflatten_optimizer(state_tensors, param_groups))
    batches_per_epoch = math.ceil(len(data.src) / cfg.batch_size)
    total_steps = cfg.epochs * batches_per_epoch
    base_info = {
        **(info or {}), "task": splits.name, "seed": cfg.seed, "epochs": cfg.epochs,
        "train_config": dataclasses.asdict(cfg), "train_pairs": len(data.src), "valid_pairs": len(valid_pairs),
        "samples": [pair.source for pair in splits.test[:SAMPLE_COUNT]],
        "search": length_limit(data),
    }
    began_training = time.perf_counter()

    for epoch in range(start_epoch + 1, cfg.epochs + 1):
        model.train()
        torch.manual_seed(cfg.seed * 100_003 + epoch)
        batches = make_batches(data, cfg.batch_size, seed=cfg.seed * 100_003 + epoch)
        total_loss, total_tokens, began = 0.0, 0, time.perf_counter()
        bar = tqdm(batches, desc=f"epoch {epoch}/{cfg.epochs}", disable=not progress, leave=False, unit="batch")
        for batch in bar:
            src = pad([data.src[i] for i in batch], src_vocab.pad_id).to(device)
            src_len = torch.tensor([len(data.src[i]) for i in batch], dtype=torch.int64, device=device)
            tgt_rows = [data.tgt[i] for i in batch]
            labels = pad(tgt_rows, pad_id).to(device)
            tgt_in = pad([r[:-1] for r in tgt_rows], pad_id, prefix=bos).to(device)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, total_steps, cfg)
            optimizer.zero_grad(set_to_none=True)
            with plugin_errors(plugin.name, "forward() and backward() on a training batch", hold_output=False):
                loss_sum, tokens = masked_cross_entropy(model(src, src_len, tgt_in), labels, pad_id)
                (loss_sum / tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            optimizer.step()
            step += 1
            total_loss += loss_sum.item()
            total_tokens += tokens
            elapsed = time.perf_counter() - began
            bar.set_postfix(loss=f"{total_loss / total_tokens:.3f}", tok_s=f"{total_tokens / max(elapsed, 1e-9):.0f}")
        bar.close()
        elapsed = time.perf_counter() - began
        with plugin_errors(plugin.name, "greedy decoding of the valid split", hold_output=False):
            valid, _ = evaluate(model, plugin, config, valid_pairs, src_vocab, tgt_vocab, splits.bleu_tokenize,
                                max_steps, device)
        stats = EpochStats(epoch, total_loss / total_tokens, total_tokens / max(elapsed, 1e-9), valid)
        history.append(stats)
        improved = (valid.exact_match, valid.bleu) > best_key
        if improved:
            best_key, best_epoch, best_scores = (valid.exact_match, valid.bleu), epoch, valid
            save_checkpoint(out, plugin, config, model, src_vocab, tgt_vocab, {
                **base_info, "epoch": epoch, "valid_bleu": valid.bleu, "valid_exact_match": valid.exact_match,
                "valid_d2l_bleu": valid.d2l_bleu, "history": [_stats_to_dict(h) for h in history],
            })
        _save_train_state(train_state_path(out), plugin, model, optimizer, {
            "epoch": epoch, "step": step, "best_key": list(best_key), "best_epoch": best_epoch,
            "history": [_stats_to_dict(h) for h in history],
        })
        emit(f"epoch {epoch}/{cfg.epochs}: loss {stats.loss:.4f}, {stats.tokens_per_s:.0f} tokens/s, "
             f"valid {valid.summary()}{' (best, saved)' if improved else ''}")
        if cfg.patience is not None and epoch - best_epoch >= cfg.patience:
            emit(f"stopping early: no better valid exact match for {cfg.patience} epochs")
            break
    assert best_scores is not None
    extra = {"train_seconds": round(time.perf_counter() - began_training, 1)}
    test = _score_test_split(out, plugin, splits, max_steps, device, extra) if splits.test else None
    if test is not None:
        emit(f"test (epoch {best_epoch} checkpoint): {test.summary()}")
        if "ood_exact_match" in extra:
            emit(f"ood: exact match {100 * extra['ood_exact_match']:.1f}%, BLEU {extra['ood_bleu']:.2f}")
    return TrainResult(out, best_epoch, best_scores, tuple(history), test)


def _score_test_split(out: Path, plugin: ArchitecturePlugin, splits: TaskSplits, max_steps: int,
                      device: torch.device, extra: dict[str, Any]) -> Scores:
    """Score the kept checkpoint once on the test (and ood) split and record it in its info (never used to select)."""
    checkpoint = load_checkpoint(out)
    model = build_model(checkpoint, plugin).to(device)
    scored = {}
    for split in ("test", "ood"):
        pairs = getattr(splits, split)
        if pairs:
            scores, _ = evaluate(model, plugin, checkpoint.config, pairs, checkpoint.src_vocab, checkpoint.tgt_vocab,
                                 splits.bleu_tokenize, max_steps + 10, device)
            extra |= {f"{split}_bleu": scores.bleu, f"{split}_exact_match": scores.exact_match,
                      f"{split}_d2l_bleu": scores.d2l_bleu, f"{split}_pairs": scores.count}
            scored[split] = scores
    save_checkpoint(out, plugin, checkpoint.config, model, checkpoint.src_vocab, checkpoint.tgt_vocab,
                    {**checkpoint.info, **extra})
    return scored["test"]


def _stats_to_dict(stats: EpochStats) -> dict[str, Any]:
    return dataclasses.asdict(stats)


def _stats_from_dict(data: dict[str, Any]) -> EpochStats:
    return EpochStats(data["epoch"], data["loss"], data["tokens_per_s"], Scores(**data["valid"]))


def _save_train_state(path: Path, plugin: ArchitecturePlugin, model: Seq2SeqModel,
                      optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
    """Optimizer moments flattened into safetensors, so resuming never unpickles anything."""
    state = optimizer.state_dict()
    tensors: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, value in model.state_dict().items():
        if value.data_ptr() not in seen:  # safetensors refuses the second name of a tied weight
            seen.add(value.data_ptr())
            tensors[f"model.{name}"] = value.detach().contiguous().cpu()
    for index, values in state["state"].items():
        for key, value in values.items():
            if not isinstance(value, Tensor):
                raise CheckpointError(f"optimizer state {key!r} is not a tensor; cannot store it")
            tensors[f"optim.{index}.{key}"] = value.detach().contiguous().cpu()
    metadata = {"format": STATE_FORMAT, "arch": plugin.name,
                "meta": json.dumps({**meta, "param_groups": state["param_groups"]})}
    with atomic_path(path) as temporary:
        save_file(tensors, str(temporary), metadata=metadata)


def _load_train_state(path: Path, arch: str) -> tuple[dict[str, Any], dict[str, Tensor]] | None:
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
        meta = json.loads(metadata["meta"])
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable train state: {exc}") from exc
    if metadata.get("format") != STATE_FORMAT or metadata.get("arch") != arch:
        raise CheckpointError(f"{path} is not a train state for {arch!r}")
    return meta, tensors


def _unflatten_optimizer(tensors: dict[str, Tensor], param_groups: list[dict[str, Any]]) -> dict[str, Any]:
    state: dict[int, dict[str, Tensor]] = {}
    for name, tensor in tensors.items():
        if name.startswith("optim."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = tensor
    return {"state": state, "param_groups": param_groups}
