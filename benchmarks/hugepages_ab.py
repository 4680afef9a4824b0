"""One side of the huge-pages A/B (docs/performance.md, "Huge pages"): run it in alternating processes,
with and without ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc 2.35 or later; the kernel's
transparent huge pages in ``madvise`` or ``always`` mode), which a process reads only at start.

usage: python benchmarks/hugepages_ab.py EXPORT_DIR [SENTENCES]
Prints greedy tokens per process-CPU second, one sentence at a time and in one batch of up to 16
(exactly 24 tokens each), and the process's AnonHugePages: whether huge pages were used at all.
"""

from __future__ import annotations

import os
import sys
import time

from s2s_deploy.runtime.translator import Translator

TOKENS = 24


def main() -> None:
    translator = Translator(sys.argv[1], device="cpu", threads=1)
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    texts = (list(translator.manifest.samples) * count)[:count]
    translator(texts[:1], beam=1, max_len=TOKENS, min_len=TOKENS)  # warm-up
    started = time.process_time()
    for text in texts:
        translator([text], beam=1, max_len=TOKENS, min_len=TOKENS)
    alone = time.process_time() - started
    started = time.process_time()
    translator(texts, beam=1, batch_size=16, max_len=TOKENS, min_len=TOKENS)
    batched = time.process_time() - started
    with open(f"/proc/{os.getpid()}/smaps_rollup") as smaps:
        huge = next((line.split()[1] for line in smaps if line.startswith("AnonHugePages")), "?")
    print(f"{os.environ.get('GLIBC_TUNABLES', 'default'):24s} x1 {len(texts) * TOKENS / alone:7.1f} tok per CPU-s, "
          f"x{min(16, len(texts))} {len(texts) * TOKENS / batched:7.1f} tok per CPU-s, AnonHugePages {huge} kB")


if __name__ == "__main__":
    main()
