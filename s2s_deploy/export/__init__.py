"""The torch side: the plugin contract, registry, checkpoints, export, the PyTorch backend and parity."""
