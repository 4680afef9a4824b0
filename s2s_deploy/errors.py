"""User-facing errors: the CLI prints them as one line and exits non-zero."""


class S2SError(Exception):
    """An expected failure caused by input, configuration or environment, never by a bug."""


class UnknownNameError(S2SError):
    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        listed = ", ".join(sorted(known)) or "(none)"
        super().__init__(f"unknown {kind} {name!r}; known: {listed}")


class ContractError(S2SError):
    """A plugin does not satisfy the contract; raised when it registers."""


class CheckpointError(S2SError):
    pass


class ManifestError(S2SError):
    pass


class ParityError(S2SError):
    pass
