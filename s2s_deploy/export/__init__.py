"""Torch → ONNX: where an export's weights come from (a checkpoint, a bundled one, a Hugging Face
folder, seeded random weights), the exporter itself, and ``generate.onnx``'s search graph."""
