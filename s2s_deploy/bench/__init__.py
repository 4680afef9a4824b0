"""Benchmarks: the runner (PyTorch, ONNX Runtime, generate.onnx) and the roofline."""
