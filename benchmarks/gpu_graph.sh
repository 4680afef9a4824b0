#!/usr/bin/env bash
# The CUDA-graph figures in docs/performance.md: PyTorch eager on CUDA, ONNX Runtime's CUDA step
# loop, and the same loop replaying captured CUDA graphs (runtime/cuda_graph.py), fp32, on
# transformer-base with seeded random weights and the peers' grid (exactly 32 tokens).
# Needs onnxruntime-gpu and a GPU. usage: bash benchmarks/gpu_graph.sh [OUT_DIR] [WORK_DIR]
set -euo pipefail
OUT=${1:-benchmarks/results/gpu-graph}
WORK=${2:-$OUT}
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import onnxruntime as o, torch; print('onnxruntime', o.__version__, o.get_available_providers()); \
print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$OUT/device.txt"
grid=(--fixed-length 32 --beams 1,4 --batches 1,16 --sentences 32 --reps 3 --threads 2)
s2s-deploy bench --synthetic transformer:base --synthetic-dir "$WORK/synthetic" --vocab-size 32000 "${grid[@]}" \
    --systems pytorch-cuda,onnxruntime-cuda,onnxruntime-cuda-graph \
    --json "$OUT/base-graph-cuda.json" | tee "$OUT/base-graph-cuda.md"
