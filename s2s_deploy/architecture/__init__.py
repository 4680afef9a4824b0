"""What a plugin declares and where it comes from, torch-free: ``list``, the registry and the
manifest's plugin facts never import torch; the torch side (``export/``) builds the model."""
