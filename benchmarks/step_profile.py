"""Where a decoder step's time goes: ONNX Runtime's own profile of the step loop, per op type.

    python benchmarks/step_profile.py EXPORT_DIR [--sentences 4] [--tokens 32] [--threads 2] [--device cuda]
        [--beam 4] [--batch 16]

Greedy batch 1 unless told, exactly ``--tokens`` tokens per sentence (EOS suppressed), as
``bench --fixed-length``; ``--sentences`` counts batches.
"""

import argparse
import collections
import json

import onnxruntime as ort

from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.runtime.ort.backend import OrtBackend, session_options
from s2s_deploy.runtime.ort.step_loop import StepLoops
from s2s_deploy.runtime.search import SearchConfig, search
from s2s_deploy.runtime.translator import encode_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir")
    parser.add_argument("--sentences", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1, help="sentences per batch (repeated from the samples)")
    args = parser.parse_args()
    manifest = load_manifest(args.export_dir)
    backend = OrtBackend(manifest, device=args.device, threads=args.threads, cuda_graph=False)  # a replay has no nodes
    options = session_options(args.threads)
    options.enable_profiling = True
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if args.device == "cuda" else ["CPUExecutionProvider"]
    profiled = ort.InferenceSession(str(manifest.graph_path(manifest.decoder)), options, providers=providers)
    backend.loops = StepLoops(manifest, backend.device, profiled, capture=False,  # the step loop on this session
                              uncaptured=lambda: profiled, on_step=backend.count_step)
    config = SearchConfig(args.beam, 1, args.tokens, min_len=args.tokens)
    samples = manifest.samples
    for first in range(args.sentences):
        batch = [samples[(first + i) % len(samples)] for i in range(args.batch)]
        search(backend, *encode_batch(batch, manifest.src_vocab), config)
    with open(backend.decoder.end_profiling()) as handle:
        events = json.load(handle)
    runs = [e for e in events if e.get("name") == "model_run"]
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    by_op: collections.Counter = collections.Counter()
    nodes: collections.Counter = collections.Counter()
    providers_used: collections.Counter = collections.Counter()
    for event in kernels:
        by_op[event["args"]["op_name"]] += event["dur"]
        nodes[event["args"]["op_name"]] += 1
        providers_used[event["args"].get("provider", "?")] += 1
    total = sum(by_op.values())
    print(f"{len(runs)} steps: model_run {sum(e['dur'] for e in runs) / len(runs):.0f} us, "
          f"kernels {total / len(runs):.0f} us per step (profiling adds its own overhead)")
    print("nodes per step by provider:", {p: n // len(runs) for p, n in providers_used.items()})
    print("| op | us per step | nodes | share of kernel time |\n|---|---|---|---|")
    for op, duration in by_op.most_common():
        print(f"| {op} | {duration / len(runs):.0f} | {nodes[op] // len(runs)} | {duration / total:.1%} |")


if __name__ == "__main__":
    main()
