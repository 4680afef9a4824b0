"""Denormals flushed to zero in a decoder step, on every thread that runs it.

``LogSoftmax`` over a large vocabulary is 5x slower when a row's logits spread more than ~87
below its maximum: the exponentials of those entries are denormal floats, which x86 CPUs
compute in microcode (MLAS, [64, 250112] rows at 2 threads: 47 ms, against 9.5 ms with
flush-to-zero; a random-weight mT5-small-sized head reaches that spread). Flushing them changes
no output of ``LogSoftmax``: they enter only its sum, below one unit in the last place of a sum
of at least 1. ONNX Runtime flushes its own worker threads with ``session.set_denormal_as_zero``;
the thread that calls ``run`` also computes a share of each kernel, so it must flush too, or a
row's bits would depend on which thread computed it. MXCSR is per thread: ``flushing`` sets
FTZ and DAZ for the duration of one run and restores the caller's own, so no user code runs
with them. Where the calling thread's MXCSR cannot be set (not x86-64 Linux with glibc),
nothing is flushed anywhere."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import platform
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import onnxruntime as ort

FLUSH_KEY = "session.set_denormal_as_zero"
MXCSR_FLUSH = 0x8040
"""MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6)."""

R = TypeVar("R")


class _FloatEnv(ctypes.Structure):
    """glibc's x86-64 ``fenv_t``: the x87 environment (28 bytes), then MXCSR."""

    _fields_ = [("x87", ctypes.c_uint8 * 28), ("mxcsr", ctypes.c_uint32)]


@functools.cache
def _libm() -> Any | None:
    """glibc's libm where ``fenv_t`` has the layout above; None elsewhere."""
    if platform.machine() not in ("x86_64", "AMD64") or not sys.platform.startswith("linux"):
        return None
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libm.so.6")
    except OSError:
        return None


def available() -> bool:
    """Whether this process can flush denormals on the calling thread (and so does, in steps)."""
    return _libm() is not None


def mxcsr() -> int | None:
    """The calling thread's MXCSR (None where it cannot be read)."""
    libm = _libm()
    if libm is None:
        return None
    env = _FloatEnv()
    libm.fegetenv(ctypes.byref(env))
    return int(env.mxcsr)


def flush_in(options: ort.SessionOptions) -> None:
    """Have ``options``' worker threads flush denormals, where the calling thread can too."""
    if available():
        options.add_session_config_entry(FLUSH_KEY, "1")


@contextlib.contextmanager
def caller_kept() -> Iterator[None]:
    """The calling thread's MXCSR as it was: ONNX Runtime sets the creating thread's flags from
    the first session a process makes, for good."""
    libm = _libm()
    if libm is None:
        yield
        return
    env = _FloatEnv()
    ref = ctypes.byref(env)
    libm.fegetenv(ref)
    try:
        yield
    finally:
        libm.fesetenv(ref)


def call_flushed(run: Callable[..., R], *args: Any) -> R:
    """``run(*args)`` with the calling thread flushing denormals while it runs (1.4 us a call):
    for a callable that changes from call to call, without making a wrapper each time."""
    libm = _libm()
    if libm is None:
        return run(*args)
    env = _FloatEnv()
    ref = ctypes.byref(env)
    libm.fegetenv(ref)
    kept = env.mxcsr
    env.mxcsr = kept | MXCSR_FLUSH
    libm.fesetenv(ref)
    try:
        return run(*args)
    finally:
        env.mxcsr = kept
        libm.fesetenv(ref)


def flushing(run: Callable[..., R]) -> Callable[..., R]:
    """``run`` made to flush denormals on the calling thread while it runs (``call_flushed``)."""
    if _libm() is None:
        return run
    return functools.partial(call_flushed, run)
