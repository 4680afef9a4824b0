"""The torch side: the model half of the plugin contract, checkpoints, export, the PyTorch backend and parity."""
