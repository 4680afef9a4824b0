#!/usr/bin/env bash
# The CUDA figures in docs/performance.md: PyTorch eager on CUDA against ONNX Runtime's CUDA provider
# (the step loop through IOBinding, and the fused generate.onnx), fp32 and fp16, on transformer-base
# with seeded random weights, the peers' grid (exactly 32 tokens). Needs onnxruntime-gpu and a GPU.
# usage: [SYSTEMS=a,b,...] bash benchmarks/gpu.sh [OUT_DIR] [WORK_DIR (the exports)]
# SYSTEMS defaults to all four CUDA rows; onnxruntime-cuda-graph is what translate runs on CUDA.
set -euo pipefail
OUT=${1:-benchmarks/results/gpu}
WORK=${2:-$OUT}
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import onnxruntime as o, torch; print('onnxruntime', o.__version__, o.get_available_providers()); \
print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$OUT/device.txt"

SYSTEMS=${SYSTEMS:-pytorch-cuda,onnxruntime-cuda,onnxruntime-cuda-graph,onnxruntime-generate-cuda}
grid=(--fixed-length 32 --beams 1,4 --batches 1,16 --sentences 32 --reps 3 --threads 2)
s2s-deploy bench --synthetic transformer:base --synthetic-dir "$WORK/synthetic" --vocab-size 32000 "${grid[@]}" \
    --systems "$SYSTEMS" \
    --json "$OUT/base-fp32-cuda.json" | tee "$OUT/base-fp32-cuda.md"
s2s-deploy quantize "$WORK/synthetic/transformer-base" --fp16 --force --no-evaluate
s2s-deploy fuse "$WORK/synthetic/transformer-base-fp16"
s2s-deploy bench "$WORK/synthetic/transformer-base-fp16" "${grid[@]}" \
    --systems "$SYSTEMS" \
    --json "$OUT/base-fp16-cuda.json" | tee "$OUT/base-fp16-cuda.md"
