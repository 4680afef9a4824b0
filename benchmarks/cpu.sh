#!/usr/bin/env bash
# The commands behind docs/performance.md. Run on an otherwise idle machine; results go to $OUT.
# usage: bash benchmarks/cpu.sh [OUT_DIR]
set -euo pipefail
OUT=${1:-benchmarks/results}
mkdir -p "$OUT" exported

# 1. Bundled models: PyTorch eager vs ONNX Runtime (step loop) vs generate.onnx, greedy and beam 4.
for arch in transformer gru lstm bahdanau rnnsearch convs2s; do
    s2s-deploy export --arch "$arch" --out "exported/$arch" --force
    s2s-deploy fuse "exported/$arch"
done
taskset -c 1 s2s-deploy bench exported/{transformer,gru,lstm,bahdanau,rnnsearch,convs2s} \
    --beams 1,4 --batches 1,4,32 --sentences 32 --reps 3 --threads 1 \
    --systems pytorch,onnxruntime-cpu,onnxruntime-generate,onnxruntime-cuda \
    --json "$OUT/bundled.json" --plot "$OUT/bundled.png" | tee "$OUT/bundled.md"

# 2. Transformer-base size (6+6, d 512, FFN 2048, vocab 32k), seeded random weights, exactly 32 tokens,
#    the peers' grid; then the same model quantised to int8.
s2s-deploy bench --synthetic transformer:base --synthetic-dir "$OUT/synthetic" --vocab-size 32000 \
    --fixed-length 32 --beams 1,4 --batches 1,4,16 --sentences 32 --reps 2 --threads 2 \
    --systems pytorch,onnxruntime-cpu,onnxruntime-generate \
    --json "$OUT/base-fp32.json" | tee "$OUT/base-fp32.md"
s2s-deploy quantize "$OUT/synthetic/transformer-base" --int8 --force --no-evaluate
s2s-deploy fuse "$OUT/synthetic/transformer-base-int8"
s2s-deploy bench "$OUT/synthetic/transformer-base-int8" \
    --fixed-length 32 --beams 1,4 --batches 1,4,16 --sentences 32 --reps 2 --threads 2 \
    --systems onnxruntime-cpu,onnxruntime-generate --json "$OUT/base-int8.json" | tee "$OUT/base-int8.md"
