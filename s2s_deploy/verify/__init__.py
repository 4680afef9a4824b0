"""Does the export decode as its original does? Export-time checks, PyTorch-vs-ONNX parity, timestamped
parity, and ``transformers``' own ``generate`` as the reference, at settings planned in one place."""
