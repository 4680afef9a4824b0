"""Margins behind the per-step parity tolerance (docs/parity.md).

For every export given: PyTorch (1 thread) against ONNX Runtime at intra-op threads 1/2/4,
sequential and parallel execution, teacher-forcing PyTorch's greedy output on the stored
samples. Each cell is the largest |delta log p| where a search can act (each side's top 16 and
every log p >= -10: verify/tolerance.py), with the whole vocabulary's largest diff beside it.
Then the smallest diffs that real bugs produce, on the same comparison:
- the cached step omits a final LayerNorm that ``forward`` applies (models with an ``output`` layer);
- one decoder weight tensor edited by +0.01 (the largest float initializer of decoder.onnx).

usage: python benchmarks/parity_margins.py [EXPORT_DIR ...] [--samples N]   (default: exported/*, 8 samples)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper

from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.modeling.torch_backend import torch_backend_for
from s2s_deploy.runtime.ort import backend as ort_backend
from s2s_deploy.runtime.scoring import forced_tokens, teacher_forced
from s2s_deploy.runtime.search import SearchConfig, greedy
from s2s_deploy.runtime.translator import encode_batch
from s2s_deploy.verify.checks import forward_step_comparison
from s2s_deploy.verify.tolerance import NO_DIFF, StepDiff, StepTolerance

MODES = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL, "parallel": ort.ExecutionMode.ORT_PARALLEL}
TOL = StepTolerance()


def with_mode(mode: ort.ExecutionMode):
    """ONNX Runtime sessions made with this execution mode (the runtime always uses sequential)."""
    plain = ort_backend.session_options

    def options(threads: int | None = None, spin: bool = True) -> ort.SessionOptions:
        made = plain(threads, spin)
        made.execution_mode = mode
        made.inter_op_num_threads = threads or 1
        return made

    return options


def compare(reference, candidate, src, src_len, targets) -> tuple[StepDiff, float]:
    worst, whole = NO_DIFF, 0.0
    for step in teacher_forced([reference, candidate], src, src_len, targets):
        x, y = (values[step.live] for values in step.log_probs)
        worst = worst.merge(TOL.compare(x, y))
        whole = max(whole, float(np.nanmax(np.abs(x.astype(np.float64) - y))))
    return worst, whole


def edited_copy(folder: Path, scratch: Path) -> Path:
    """The export with its decoder's largest float weight tensor shifted by +0.01."""
    target = scratch / folder.name
    target.mkdir()
    for item in folder.iterdir():
        if item.is_file() and item.name != "manifest.json":
            (target / item.name).symlink_to(item.resolve())
    manifest = load_manifest(folder)
    decoder_file = manifest.decoder.file
    model = onnx.load(str(folder / decoder_file))
    floats = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    biggest = max(floats, key=lambda i: np.prod(i.dims))
    biggest.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(biggest) + np.float32(0.01), biggest.name))
    (target / decoder_file).unlink()
    onnx.save(model, str(target / decoder_file))
    manifest.moved_to(target).with_graph("decoder", target / decoder_file).write()
    return target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folders", nargs="*", type=Path)
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    folders = args.folders or sorted(p for p in Path("exported").iterdir() if (p / "manifest.json").is_file())
    torch.set_num_threads(1)
    rows, bugs = [], []
    for folder in folders:
        manifest = load_manifest(folder)
        reference = torch_backend_for(manifest)
        src, src_len = encode_batch(list(manifest.samples[: args.samples]), manifest.src_vocab,
                                    manifest.max_source_length)
        targets = [h.tokens for h in greedy(reference, src, src_len, SearchConfig(1, 1, 64))]
        fwd = forward_step_comparison(reference.model, reference, src, src_len, targets, TOL)
        rows.append(f"| {folder.name} | forward vs decode_step (PyTorch) | {fwd.max_abs_diff:.2e} | |")
        for mode_name, mode in MODES.items():
            ort_backend.session_options = with_mode(mode)
            for threads in (1, 2, 4):
                candidate = ort_backend.OrtBackend(manifest, device="cpu", threads=threads)
                diff, whole = compare(reference, candidate, src, src_len, targets)
                rows.append(f"| {folder.name} | ORT {mode_name}, {threads} threads | {diff.max_abs_diff:.2e} | "
                            f"{whole:.2e} |")
        ort_backend.session_options = with_mode(MODES["sequential"])
        with tempfile.TemporaryDirectory() as scratch:
            edited = ort_backend.OrtBackend(load_manifest(edited_copy(folder, Path(scratch))), device="cpu", threads=1)
            diff, _ = compare(reference, edited, src, src_len, targets)
            bugs.append(f"| {folder.name} | decoder weight +0.01 | {diff.max_abs_diff:.2e} |")
        output = getattr(reference.model, "output", None)
        if isinstance(output, torch.nn.Linear):
            def normed(module, inputs):
                return (torch.nn.functional.layer_norm(inputs[0], inputs[0].shape[-1:]),)

            handle = output.register_forward_pre_hook(normed)
            model = reference.model
            try:  # forward applies the extra LayerNorm; the step (run without the hook) does not
                with torch.no_grad():
                    forced = torch.from_numpy(forced_tokens(reference.decoder_start_id, reference.eos_id, targets))
                    hooked = torch.log_softmax(model(torch.from_numpy(src), torch.from_numpy(src_len), forced), -1)
            finally:
                handle.remove()
            plain = torch.log_softmax(model(torch.from_numpy(src), torch.from_numpy(src_len), forced), -1).detach()
            worst = NO_DIFF
            for row, tokens in enumerate(targets):
                worst = worst.merge(TOL.compare(hooked[row, : len(tokens) + 1].numpy(),
                                                plain[row, : len(tokens) + 1].numpy()))
            bugs.append(f"| {folder.name} | step omits a final LayerNorm | {worst.max_abs_diff:.2e} |")
        print(f"done {folder.name}", flush=True)
    print("| export | comparison | max abs diff where a search can act | whole vocabulary |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    print("\n| export | injected bug | max abs diff where a search can act |")
    print("|---|---|---|")
    print("\n".join(bugs))


if __name__ == "__main__":
    main()
