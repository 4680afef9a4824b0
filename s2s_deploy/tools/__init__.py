"""Graph tools that need onnx but never torch: generate.onnx, quantisation, attention maps, plots."""
