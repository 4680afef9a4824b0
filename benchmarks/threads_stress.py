"""tests/test_threads.py's eight-thread plan on the bundled GRU, run ITERATIONS times on fresh
Translators: the reproducer of a race found in session 21. A widening step's cached binding (the past
read with one row per sentence) was keyed by the batch's rows alone, so a step loop that had run 3
sentences at beam 4 gave its 3-row binding to 6 sentences at beam 2 (12 rows both), and ONNX Runtime's
Gather failed ("indices element out of data bounds"): 5 of 60 runs before the fix, 0 of 120 after.
Which step loop a batch gets depends on the threads, hence the rarity.

    python benchmarks/threads_stress.py 60
"""

from __future__ import annotations

import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from conftest import export_arch  # noqa: E402
from test_threads import plans, run_together  # noqa: E402

from s2s_deploy.format.manifest import load_manifest  # noqa: E402
from s2s_deploy.runtime.translator import Translator  # noqa: E402


def main(iterations: int) -> None:
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="threads-stress-"))
    export_arch("gru", root)
    manifest = load_manifest(root / "gru")
    failures = 0
    for iteration in range(iterations):
        translator = Translator(manifest.directory, device="cpu", threads=1)
        try:
            run_together(translator, plans(list(manifest.samples), seed=3))
        except Exception as exc:  # the race: report where it struck and go on
            failures += 1
            frames = [line for line in traceback.format_exc().splitlines() if "s2s_deploy" in line]
            print(f"iteration {iteration}: {str(exc).splitlines()[0][:160]} at {frames[-1].strip()}")
    print(f"{failures} of {iterations} runs failed")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
