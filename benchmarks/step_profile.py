"""Where a decoder step's time goes, by operator type: ONNX Runtime's own profiler over one
``translate_ids`` call on a batch of the race's inputs (``inputs.json`` beside the export).

    python benchmarks/step_profile.py /tmp/race/mt5/s2s-int8 --beam 4

Prints, for each session that ran (encoder, decoder step), its kernels' total time and the
largest operator types. Profiling adds its own overhead: read the shares, not the milliseconds."""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

from s2s_deploy.runtime.ort import backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--top", type=int, default=14)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="step-profile-"))
    made = backend.session_options

    def profiled(*a, **k):  # every session this process makes writes a profile
        options = made(*a, **k)
        options.enable_profiling = True
        options.profile_file_prefix = str(folder / "p")
        return options

    backend.session_options = profiled
    from s2s_deploy.runtime.translator import Translator

    sources = json.loads((args.export.parent / "inputs.json").read_text())["sources"][: args.batch_size]
    translator = Translator(args.export, device="cpu", threads=2)
    translator.translate_ids(sources, beam=args.beam, n_best=1, max_len=args.length, min_len=args.length,
                             alpha=1.0, batch_size=args.batch_size)
    del translator  # a session writes its profile when it ends
    import gc

    gc.collect()
    for path in sorted(folder.glob("p_*.json")):
        total: collections.Counter[str] = collections.Counter()
        calls: collections.Counter[str] = collections.Counter()
        for event in json.loads(path.read_text()):
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                total[event["args"]["op_name"]] += event["dur"]
                calls[event["args"]["op_name"]] += 1
        whole = sum(total.values())
        if not whole:
            continue
        print(f"{path.name}: kernels {whole / 1000:.1f} ms")
        for op, us in total.most_common(args.top):
            print(f"  {op:28s} {us / 1000:9.1f} ms {100 * us / whole:5.1f}%  calls {calls[op]}")


if __name__ == "__main__":
    main()
