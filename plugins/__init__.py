"""Built-in architecture plugins, installed as ``s2s_deploy_plugins`` and registered as entry points."""

from pathlib import Path

CHECKPOINT_DIR = Path(__file__).parent / "checkpoints"
