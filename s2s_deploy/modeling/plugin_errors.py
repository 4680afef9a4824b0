"""Plugin authors' mistakes as one line: which plugin, which tensor or spec, and the likely fix.

Torch and the ONNX exporters fail with traces of hundreds of lines whose first line rarely says
what the author did wrong. The checks here run on the example tensors before export; whatever
still fails inside ``torch.onnx.export`` is matched against known causes for a hint. The full
trace stays on the exception chain, and what torch printed meanwhile (a TorchScript IR dump, an FX
graph) on a note of the error: ``s2s-deploy --debug`` prints both.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from s2s_deploy.errors import ContractError, S2SError


class PluginError(S2SError):
    """A plugin's model or specs do not do what its contract says."""


# (text found in the exception's type, message or chain, hint)
_HINTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("pack_padded_sequence", "PackedSequence", "_pack_padded", "pad_packed", "but got FakeTensor"),
     "dynamo cannot trace Python values read from tensors, as packed sequences (pack_padded_sequence) do: set "
     "exporter = \"torchscript\" in the plugin (or pass --exporter torchscript)"),
    (("GuardOnDataDependentSymNode", "data-dependent", "data dependent", "Could not guard on data-dependent",
      "UserError: Could not extract specialized integer"),
     "a shape or slice depends on tensor values (e.g. x[:, :lengths.max()]): compute sizes from shapes and mask "
     "instead, or try --exporter torchscript"),
    (("index out of range in self",),
     "a token id beyond an embedding table: size the source embedding with src_vocab_size and the target's "
     "embedding and output layer with tgt_vocab_size in build() (are the two swapped?)"),
    (("UnsupportedOperatorError", "not supported", "No decomposition", "unsupported", "OnnxExporterError",
      "is not implemented", "ConversionError"),
     "an operator the exporter cannot translate: replace it with supported torch ops, or try the other "
     "exporter (--exporter dynamo|torchscript)"),
)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in found):
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _first_line(exc: BaseException) -> str:
    text = _ANSI.sub("", str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


@contextmanager
def _torch_output() -> Iterator[list[bytes]]:
    """Hold what is written to stdout and stderr at the file-descriptor level (torch's C++ side
    prints its IR dumps there, past Python); the list holds the bytes once the block ends."""
    held: list[bytes] = []
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        saved = (os.dup(1), os.dup(2))
    except OSError:  # no descriptors to redirect (closed, or not a process-level stream)
        yield held
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield held
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            held.append(sink.read())


@contextmanager
def plugin_errors(plugin: str, what: str, hint: str | None = None, hold_output: bool = True) -> Iterator[None]:
    """Re-raise anything but our own errors as one PluginError line naming ``plugin`` and ``what``;
    ``hint`` is the likely fix when no known cause matches. With ``hold_output`` torch's own prints
    wait: they are replayed after a success, and kept on the error (for ``--debug``) after a failure."""
    held: list[bytes] = []
    try:
        with _torch_output() if hold_output else nullcontext(held) as held:
            yield
    except S2SError as exc:
        _keep(exc, held)
        raise
    except Exception as exc:
        chain = _chain(exc)
        text = "\n".join(f"{type(e).__name__}: {e}" for e in chain)
        found = next((h for needles, h in _HINTS if any(n in text for n in needles)), None)
        found = found or hint or "rerun with `s2s-deploy --debug ...` for the full trace"
        error = PluginError(f"plugin {plugin!r}: {what} failed ({_first_line(chain[-1])}); likely fix: {found}")
        _keep(error, held)
        raise error from exc
    if held and held[0]:
        os.write(2, held[0])


def _keep(exc: BaseException, held: list[bytes]) -> None:
    if held and held[0].strip():
        exc.add_note("torch printed before the failure:\n" + held[0].decode(errors="replace").rstrip())


def call_plugin(plugin: str, what: str, function: Callable[..., Any], *args: Any, hint: str | None = None) -> Any:
    """``function(*args)`` (a plugin's model method) with its failures as one PluginError line."""
    with plugin_errors(plugin, what, hint):
        return function(*args)


def check_encoded(plugin: str, encoded: Any, expected: Sequence[str]) -> None:
    """``encode`` must return a dict holding every memory and encoder-initialised state name."""
    if not isinstance(encoded, Mapping):
        raise ContractError(f"plugin {plugin!r}: encode() returned {type(encoded).__name__}, not a dict of tensors "
                            f"named {', '.join(expected)}")
    missing = [name for name in expected if name not in encoded]
    if missing:
        raise ContractError(f"plugin {plugin!r}: encode() returned no {missing[0]!r} (it returned "
                            f"{', '.join(map(repr, encoded)) or 'nothing'}); likely fix: make memory_specs/"
                            "state_specs names match the keys encode() returns")


def check_batch_axes(plugin: str, kind: str, specs: Sequence[Any], tensors: Sequence[Any], batch: int) -> None:
    """Each memory or state tensor must have ``batch`` rows along its declared ``batch_axis``."""
    for spec, tensor in zip(specs, tensors, strict=True):
        shape = tuple(tensor.shape)
        axis = spec.batch_axis
        if axis >= len(shape) or shape[axis] != batch:
            found = [i for i, size in enumerate(shape) if size == batch]
            fix = f"batch_axis={found[0]}" if len(found) == 1 else "the axis that holds the batch"
            raise ContractError(f"plugin {plugin!r}: {kind} {spec.name!r} has shape {shape}, whose axis {axis} is "
                                f"not the batch ({batch}); likely fix: {fix} in its spec")
