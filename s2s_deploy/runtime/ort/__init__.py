"""The engine over ONNX Runtime: sessions, the step loop and the generate.onnx engine."""
