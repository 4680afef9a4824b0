"""What every front end shares: a frozen config that travels in the manifest as a plain JSON dict.

The manifest carries ``to_json()``; a runtime in any language rebuilds the same front end from
it, so the deployed features never depend on the folder's ``preprocessor_config.json`` again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from s2s_deploy.errors import S2SError

Config = TypeVar("Config", bound="FrontEndConfig")


class FrontEndConfig:
    """A mixin for frozen dataclasses: ``kind`` names the computation, the fields its parameters,
    ``reads`` what it takes (``audio`` or ``image``), so the runtime picks its loader and command
    by the medium, never by the model."""

    kind: ClassVar[str]
    reads: ClassVar[str]

    def probe(self) -> Any:
        """A neutral input (a second of silence, a grey image): at export, the front end must make
        features of the declared shape from it."""
        raise NotImplementedError

    @property
    def window(self) -> int | None:
        """The frames of the fixed window the front end cuts an input to (None: it cuts nothing), so
        a runtime can tell that ``whole`` made more and read the rest window by window."""
        return None

    def whole(self, item: Any) -> Any:
        """The features of the whole input, for a search that seeks through it window by window
        (timestamps): the front end's own features unless it cuts a fixed window (then it overrides this)."""
        return self(item)  # type: ignore[operator]

    def to_json(self) -> dict[str, Any]:
        """``kind`` plus every field, with tuples as lists: what json.dumps writes into the manifest."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return {"kind": self.kind, **{k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}}

    @classmethod
    def from_json(cls: type[Config], data: Mapping[str, Any]) -> Config:
        """The front end ``to_json`` wrote; a wrong kind or an unknown key is one line, not a guess."""
        if data.get("kind") != cls.kind:
            raise S2SError(f"front end: expected kind {cls.kind!r}, found {data.get('kind')!r}")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - names - {"kind"})
        if unknown:
            raise S2SError(f"front end {cls.kind}: unknown parameters {', '.join(unknown)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k != "kind"})


def expect_type(config: Mapping[str, Any], key: str, accepted: tuple[str, ...]) -> None:
    """Refuse a preprocessor_config.json written for another processor (when it says which)."""
    found = config.get(key)
    if found is not None and found not in accepted:
        raise S2SError(f"preprocessor_config.json: {key} {found!r} is not one of {', '.join(accepted)}")


def positive(owner: str, **values: float) -> None:
    """One line for a parameter that must be positive (a zero hop or rate would loop or divide by zero)."""
    for name, value in values.items():
        if not value > 0:
            raise S2SError(f"front end {owner}: {name} must be positive, got {value!r}")
