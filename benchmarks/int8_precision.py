"""int8 products with and without ONNX Runtime's ``session.x64quantprecision`` (docs/parity.md,
"int8 on CPUs without VNNI").

usage:
  python benchmarks/int8_precision.py products
      one MatMulInteger at worst-case values against numpy's int64 sums, the option off and on
  python benchmarks/int8_precision.py scores EXPORT_DIR {0,1} OUT.json [--sentences 100]
      the export's n-best (greedy, and beam 4 with 4-best) with the option forced off or on
  python benchmarks/int8_precision.py compare REFERENCE.json OTHER.json ...
      how far each file's scores and tokens are from the reference's
  python benchmarks/int8_precision.py time EXPORT_DIR [--rounds 7]
      process CPU time of 64 sentences at batch 16 (greedy, beam 4), the option off and on in
      turn in one process (1 thread), medians, and whether both gave the same scores

On a VNNI machine, emulate an AVX2 one with ``qemu-x86_64 -cpu Haswell .venv/bin/python
benchmarks/int8_precision.py ...`` (qemu-user 7.2 or later; ~13 min for 100 sentences): the
runtime reads /proc/cpuinfo, which qemu-user does not change, so ``scores`` forces the option.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from s2s_deploy.runtime.ort import backend

KEY = backend.PRECISE_INT8_KEY


def products() -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    m, k, n = 16, 512, 256
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a[:4], w[:, :8] = 255, 127
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "zero"], ["y"])], "products",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [m, n])],
        [helper.make_tensor("w", TensorProto.INT8, [k, n], w.tobytes(), raw=True),
         helper.make_tensor("zero", TensorProto.UINT8, [], [128])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    exact = (a.astype(np.int64) - 128) @ w.astype(np.int64)
    for value in ("0", "1"):
        options = ort.SessionOptions()
        options.add_session_config_entry(KEY, value)
        (got,) = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(None, {"a": a})
        print(f"{KEY}={value}: {int((got != exact).sum())} of {got.size} sums differ from the exact ones, "
              f"by up to {int(np.abs(got - exact).max())}")


def translator_with(export_dir: str, value: str):
    """A Translator whose sessions take the option as asked, whatever the CPU's flags say."""
    from s2s_deploy.runtime.translator import Translator

    plain = backend.session_options

    def forced(*args: object, **kwargs: object):
        options = plain(*args, **kwargs)
        options.add_session_config_entry(KEY, value)
        return options

    backend.session_options = forced
    try:
        return Translator(export_dir, device="cpu", threads=1)
    finally:
        backend.session_options = plain


def timed(export_dir: str, rounds: int) -> None:
    import time

    from s2s_deploy.train.tasks import generate_pairs

    translators = {value: translator_with(export_dir, value) for value in ("0", "1")}
    texts = [pair.source for pair in generate_pairs("en-fr", 64, seed=11)]
    for beam in (1, 4):
        seconds: dict[str, list[float]] = {value: [] for value in translators}
        answers = {value: t(texts, beam=beam, batch_size=16) for value, t in translators.items()}  # warm-up
        for r in range(rounds):
            for value in ("0", "1") if r % 2 == 0 else ("1", "0"):
                started = time.process_time()
                translators[value](texts, beam=beam, batch_size=16)
                seconds[value].append(time.process_time() - started)
        off, on = (float(np.median(seconds[v])) for v in ("0", "1"))
        print(f"beam {beam}: {KEY}=0 {off:.3f} s, =1 {on:.3f} s of CPU (x{on / off:.3f}); "
              f"same scores: {answers['0'] == answers['1']}")


def scores(export_dir: str, value: str, out: str, sentences: int) -> None:
    from s2s_deploy.train.tasks import generate_pairs

    translator = translator_with(export_dir, value)
    texts = [pair.source for pair in generate_pairs("en-fr", sentences, seed=11)]
    found = {beam: [[list(h) for h in t.hypotheses] for t in translator(texts, beam=beam, n_best=beam)]
             for beam in (1, 4)}
    with open(out, "w") as handle:
        json.dump(found, handle)


def compare(reference: str, others: list[str]) -> None:
    with open(reference) as handle:
        ref = json.load(handle)
    for name in others:
        with open(name) as handle:
            other = json.load(handle)
        for beam, lists in ref.items():
            pairs = list(zip(lists, other[beam], strict=True))
            best = max(abs(p[0][1] - q[0][1]) for p, q in pairs)
            worst = max(abs(x[1] - y[1]) for p, q in pairs for x, y in zip(p, q, strict=False))
            spelled = sum([x[0] for x in p] != [y[0] for y in q] for p, q in pairs)
            print(f"{name} against {reference}, beam {beam}: n-best lists spelled otherwise {spelled}/{len(pairs)}, "
                  f"1-best score within {best:.2g}, any score within {worst:.2g}")


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["products"]:
        products()
    elif args[:1] == ["scores"] and len(args) in (4, 6):
        scores(args[1], args[2], args[3], int(args[5]) if len(args) == 6 else 100)
    elif args[:1] == ["compare"] and len(args) >= 3:
        compare(args[1], args[2:])
    elif args[:1] == ["time"] and len(args) in (2, 4):
        timed(args[1], int(args[3]) if len(args) == 4 else 7)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
