"""An s2s-deploy row in ``../shared/peers``'s harness, on the identical Marian model.

The harness times Hugging Face, Optimum and CTranslate2 on one seeded random Marian
transformer-base (``make_model.py`` writes it to /tmp/peers/marian-base). This script adds
our engine to the harness's ``SYSTEMS`` and runs its ``one`` mode, so the row is timed by the
same code, on the same 32 inputs, with 2 threads and exactly 32 generated tokens per sentence
(``min_len = max_len = 32``). ``bench_peers.py report`` then tabulates every row.

    s2s-deploy export --hf /tmp/peers/marian-base --out /tmp/peers/s2s-fp32 --no-checkpoint
    s2s-deploy quantize /tmp/peers/s2s-fp32 --out /tmp/peers/s2s-int8
    python benchmarks/peers_row.py --peers ../shared/peers --export /tmp/peers/s2s-fp32 \
        --label "s2s-deploy fp32" --reps 4
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any


def load_harness(peers: Path) -> Any:
    spec = importlib.util.spec_from_file_location("bench_peers", peers / "bench_peers.py")
    if spec is None or spec.loader is None or not (peers / "bench_peers.py").is_file():
        raise SystemExit(f"error: no bench_peers.py in {peers}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class S2SDeploy:
    """The harness's engine interface: ``name``, ``versions()``, ``generate(batch, beam)``."""

    def __init__(self, export: Path, threads: int, gen_len: int, engine: str) -> None:
        from s2s_deploy.runtime.translator import Translator

        self.translator = Translator(export, device="cpu", threads=threads, engine=engine)
        quantization = self.translator.manifest.quantization
        quantized = quantization.kind if quantization else "fp32"
        self.name = f"s2s-deploy {quantized}"
        self.threads, self.gen_len, self.engine = threads, gen_len, engine

    def versions(self) -> dict[str, Any]:
        import dataclasses

        import onnxruntime

        import s2s_deploy

        quantization = self.translator.manifest.quantization
        return {"s2s-deploy": s2s_deploy.__version__, "onnxruntime": onnxruntime.__version__,
                "engine": self.engine, "intra_threads": self.threads,
                "quantization": quantization and dataclasses.asdict(quantization)}

    def generate(self, batch: list[list[int]], beam: int) -> list[list[int]]:
        hyps = self.translator.translate_ids(batch, beam=beam, n_best=1, max_len=self.gen_len,
                                             min_len=self.gen_len, alpha=1.0, batch_size=len(batch))
        return [list(h[0].tokens) for h in hyps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=Path, required=True, help="the folder of bench_peers.py")
    parser.add_argument("--export", type=Path, required=True, help="an s2s-deploy export of marian-base")
    parser.add_argument("--label", default=None, help="row name [default: s2s-deploy <precision>]")
    parser.add_argument("--engine", choices=["loop", "graph"], default="loop")
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--b1-beam4-sents", type=int, default=32)
    args = parser.parse_args()
    from s2s_deploy.errors import S2SError

    harness = load_harness(args.peers)
    harness.SYSTEMS["s2s"] = lambda: S2SDeploy(args.export, harness.THREADS, harness.GEN_LEN, args.engine)
    try:
        harness.run_one(argparse.Namespace(system="s2s", label=args.label, reps=args.reps,
                                           b1_beam4_sents=args.b1_beam4_sents))
    except S2SError as exc:  # a missing export or generate.onnx: one line, as the CLI says it
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
