"""Reproduce a rare race under threads: tests/test_threads.py's eight-thread plan on the bundled GRU,
run ITERATIONS times on fresh Translators. About 1 in 12-30 runs fails with ONNX Runtime's Gather
"indices element out of data bounds" in a beam step (session 21: 5 of 60 on main, 2 of 60 on
0b52ade; open in issue #45's closing notes).

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
