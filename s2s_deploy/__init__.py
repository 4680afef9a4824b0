"""s2s-deploy: PyTorch seq2seq models to ONNX, with greedy and beam search and parity checks.

Importing this package imports neither torch nor onnxruntime; ``s2s_deploy.runtime`` needs only
numpy and onnxruntime.
"""

__version__ = "0.1.0"

from s2s_deploy import moved as _moved

_moved.install()
