"""The torch kit plugins build with: the model half of the contract, shared parts, the two exportable
graphs, checkpoints, the PyTorch backend, and plugin authors' mistakes as one line."""
