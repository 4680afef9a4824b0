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


TOP_K = "top_k"
"""Decoder input (int64, shape (1,), default 1): how many candidates per row ``top_*`` hold."""

TOP_OUTPUTS = ("top_log_probs", "top_ids")
"""Decoder outputs: each row's ``top_k`` best log-probs and token ids, best first, ties to the
lower id. A search fetches these instead of the whole (rows, vocabulary) ``log_probs``."""

ROLLBACK = "rollback"
"""The k-position decoder's input (int64, 0-d): positions dropped from the end of every growing
state before the step (the drafted tokens a speculative search rejected)."""
