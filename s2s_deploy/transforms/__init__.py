"""Graph transforms that need onnx but never torch: fuse, quantize, fp16, share, inspect."""
