"""Graph I/O names of state tensors, made in one place for export, backends and manifest readers."""


def init_name(state: str) -> str:
    """Encoder output holding the first value of an ``init="encoder"`` state."""
    return f"init_{state}"


def past_name(state: str) -> str:
    """Decoder input: the state as the previous step left it."""
    return f"past_{state}"


def present_name(state: str) -> str:
    """Decoder output: the state for the next step."""
    return f"present_{state}"
