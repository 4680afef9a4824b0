"""Which beam stopping rule? Each rule against the same beam run to max_len (the best the beam
can find) and, on a tiny random model, against exhaustive search over every sequence.

Rules (a sentence stops when ...):
- ``eos-top/n``: the step's best candidate is EOS and n hypotheses have finished (the rule
  before; its 1-best depends on n-best, so it is run at n = 1 and n = 4);
- ``patience-p``: K*p hypotheses have finished (CTranslate2's ``patience``, without its
  top-beam early exit, which reads n-best too);
- ``hf``: K have finished and the K-th best scores at least the best live beam's
  ``log P / (t+1)**alpha`` (Hugging Face's default, ``early_stopping=False``);
- ``full``: never early (the beam runs to max_len).

usage: python benchmarks/beam_stopping.py [EXPORT_DIR ...]   (default: every exported/* folder)
Prints one table row per rule: how often its 1-best equals the full beam's, how often it is
worse, and the decoder steps it costs; then the tiny-model exhaustive comparison.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.runtime.ort.backend import OrtBackend
from s2s_deploy.runtime.search import SearchConfig, search
from s2s_deploy.runtime.translator import encode_batch

Step = Callable[[list[int], list[int]], tuple[np.ndarray, np.ndarray]]  # (tokens, parents) -> (lp, ids)
RULES = ["eos-top/1", "eos-top/4", "patience-1", "patience-2", "hf", "full"]


def beam(step: Step, k: int, vocab: int, eos: int, start: int, alpha: float, max_len: int,
         rule: str) -> tuple[tuple[int, ...], float, int]:
    """One sentence's beam search (the ranking of docs/manifest.md), stopping by ``rule``.
    Returns the 1-best tokens, its score and the number of steps run."""
    w = min(2 * k, vocab)
    sums = np.array([0.0] + [-np.inf] * (k - 1))
    histories: list[tuple[int, ...]] = [()] * k
    tokens, parents = [start] * k, list(range(k))
    finished: list[tuple[float, tuple[int, ...]]] = []
    for t in range(max_len):
        lp, ids = step(tokens, parents)
        cand = sorted(((sums[j] + float(lp[j, r]), j, int(ids[j, r]), j * w + r) for j in range(k) for r in range(w)),
                      key=lambda c: (-c[0], c[3]))[: 2 * k]
        top_is_eos = cand[0][2] == eos
        for score, j, token, _ in cand[:k]:
            if token == eos and score > -np.inf:
                finished.append((score / (t + 1) ** alpha, histories[j]))
        live = [c for c in cand if c[2] != eos or c[0] == -np.inf][:k]
        sums = np.array([c[0] for c in live])
        histories = [(*histories[c[1]], c[2]) for c in live]
        tokens, parents = [c[2] for c in live], [c[1] for c in live]
        n = len(finished)
        if rule.startswith("eos-top/"):
            done = top_is_eos and n >= int(rule.split("/")[1])
        elif rule.startswith("patience-"):
            done = n >= k * int(rule.split("-")[1])
        elif rule == "hf":
            done = n >= k and sorted((s for s, _ in finished), reverse=True)[k - 1] >= sums.max() / (t + 1) ** alpha
        else:
            done = False
        if done:
            break
    else:
        finished += [(s / max_len ** alpha, h) for s, h in zip(sums, histories, strict=True) if s > -np.inf]
    best = sorted(finished, key=lambda f: -f[0])[0]
    return best[1], best[0], t + 1


def ort_step(run, k: int) -> Step:
    w = [min(2 * k, run.backend.vocab_size)]

    def step(tokens: list[int], parents: list[int]) -> tuple[np.ndarray, np.ndarray]:
        return run.step_top(np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64), w[0])

    return step


def real_models(folders: list[Path], k: int = 4) -> None:
    print("| export | alpha | max_len | rule | 1-best = full beam | worse than full | steps |")
    print("|---|---|---|---|---|---|---|")
    for folder in folders:
        manifest = load_manifest(folder)
        backend = OrtBackend(manifest, device="cpu", threads=1)
        texts = [*manifest.samples[:20], "twenty-three thousand four hundred and five", "2064", "1 2 3 4 5 6"]
        for alpha, max_len in ((0.75, 40), (1.0, 12), (0.0, 40)):
            results = {rule: [] for rule in RULES}
            for text in texts:
                src, src_len = encode_batch([text], manifest.src_vocab, manifest.max_source_length)
                for rule in RULES:
                    with backend.start(src, src_len, expand=k) as run:
                        results[rule].append(beam(ort_step(run, k), k, backend.vocab_size, backend.eos_id,
                                                  backend.decoder_start_id, alpha, max_len, rule))
                engine = search(backend, src, src_len, SearchConfig(k, 1, max_len, alpha))[0][0]
                assert engine.tokens == results["hf"][-1][0], (folder.name, text, "search.py differs from 'hf'")
            for rule in RULES:
                same = sum(r[0] == f[0] for r, f in zip(results[rule], results["full"], strict=True))
                worse = sum(r[1] < f[1] - 1e-12 for r, f in zip(results[rule], results["full"], strict=True))
                steps = sum(r[2] for r in results[rule])
                print(f"| {folder.name} | {alpha} | {max_len} | {rule} | {same}/{len(texts)} | {worse} | {steps} |")


def tiny_exhaustive(cases: int = 200, vocab: int = 5, max_len: int = 6, k: int = 2) -> None:
    """A random first-order model (log p of the next token given the last one and the step),
    small enough to score every sequence: how often each rule finds the true optimum."""
    rng = np.random.default_rng(0)
    eos, start = 0, vocab  # the start token is an extra row of the tables
    hits = {rule: [0, 0, 0] for rule in RULES}  # optimum found, beam-full found, steps
    for _ in range(cases):
        logits = rng.normal(0, 2.0, (max_len, vocab + 1, vocab))
        table = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        alpha = float(rng.choice([0.0, 0.75, 1.0]))
        best = -np.inf
        for length in range(1, max_len + 1):
            for body in itertools.product(range(1, vocab), repeat=length - 1):
                seq = (start, *body, eos)
                s = sum(table[t, seq[t], seq[t + 1]] for t in range(length))
                best = max(best, s / length ** alpha)
        for body in itertools.product(range(1, vocab), repeat=max_len):  # unfinished at max_len
            seq = (start, *body)
            best = max(best, sum(table[t, seq[t], seq[t + 1]] for t in range(max_len)) / max_len ** alpha)
        t_box = [0]

        def step(tokens: list[int], parents: list[int], t_box=t_box, table=table) -> tuple[np.ndarray, np.ndarray]:
            lp = table[t_box[0], tokens].astype(np.float32)
            t_box[0] += 1
            ids = np.argsort(-lp, axis=1, kind="stable")[:, : min(2 * k, vocab)]
            return np.take_along_axis(lp, ids, 1), ids

        full = None
        for rule in reversed(RULES):  # "full" first
            t_box[0] = 0
            _, score, steps = beam(step, k, vocab, eos, start, alpha, max_len, rule)
            full = score if rule == "full" else full
            hits[rule][0] += abs(score - best) < 1e-5
            hits[rule][1] += abs(score - full) < 1e-9
            hits[rule][2] += steps
    print(f"\ntiny random models: V={vocab}, K={k}, max_len={max_len}, {cases} cases, alpha in 0/0.75/1")
    print("| rule | 1-best = exhaustive optimum | = full beam | steps |")
    print("|---|---|---|---|")
    for rule in RULES:
        print(f"| {rule} | {hits[rule][0]}/{cases} | {hits[rule][1]}/{cases} | {hits[rule][2]} |")


if __name__ == "__main__":
    given = [Path(p) for p in sys.argv[1:]] or sorted(p for p in Path("exported").iterdir() if p.is_dir())
    real_models(given)
    tiny_exhaustive()
