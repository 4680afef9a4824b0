"""Every decoding setting verification runs, decided in one place and built through runtime/decoding.

Without a reference of its own, parity compares the model, not a folder's options: plain searches
(the option table's defaults) from the export's decoder prompt. Against ``generate``, both sides decode
at the export's own settings, but the beam size and ``max_len``. ``max_len`` has one rule, here.
"""

from __future__ import annotations

from dataclasses import dataclass

from s2s_deploy.format.manifest import Manifest
from s2s_deploy.runtime.decoding import SearchConfig, manifest_defaults, plain, resolve

DEFAULT_MAX_LEN = 64
"""Target tokens a parity search may run to: long enough to reach EOS on the samples, short enough to be quick."""


@dataclass(frozen=True)
class ParityPlan:
    """The searches one parity run makes: ``modes`` (greedy, then beam) untimed, ``timed_modes`` with
    timestamps where ``timed``, and ``batch`` for the batchmates check."""

    beam_size: int
    max_len: int
    own_settings: bool
    """Decode at the export's own settings (the reference is ``generate``), not plain searches."""
    timed: bool
    prompt: tuple[int, ...]
    manifest: Manifest

    def _config(self, beam: int, timestamps: bool) -> SearchConfig:
        if self.own_settings or timestamps:
            return resolve(self.manifest, {"beam_size": beam, "n_best": 1, "max_len": self.max_len,
                                           "timestamps": timestamps})
        return plain(beam, self.max_len, decoder_prompt=self.prompt)

    def _named(self, timestamps: bool) -> tuple[tuple[str, SearchConfig], ...]:
        return tuple((name, self._config(beam, timestamps))
                     for name, beam in (("greedy", 1), (f"beam{self.beam_size}", self.beam_size)))

    @property
    def modes(self) -> tuple[tuple[str, SearchConfig], ...]:
        return self._named(timestamps=False)

    @property
    def timed_modes(self) -> tuple[tuple[str, SearchConfig], ...]:
        return self._named(timestamps=True) if self.timed else ()

    @property
    def batch(self) -> SearchConfig:
        """Greedy, plain: a sentence's tokens in a batch against alone."""
        return plain(1, self.max_len, decoder_prompt=self.prompt)


def parity_max_len(manifest: Manifest, given: int | None, own_settings: bool) -> int:
    """``given``, else: against ``generate``, the export's own (``generate``'s ``max_new_tokens``);
    with a decoder prompt, at most what fits the positions after it; with a target position table, one
    short of it (the teacher-forced comparison feeds one step past a hypothesis cut at ``max_len``);
    else ``DEFAULT_MAX_LEN``."""
    if given is not None:
        return given
    if own_settings:
        return resolve(manifest).max_len
    if manifest.search.get("decoder_prompt"):
        return min(DEFAULT_MAX_LEN, resolve(manifest).max_len)
    if manifest.max_target_length is not None:
        return min(DEFAULT_MAX_LEN, manifest.max_target_length - 1)
    return DEFAULT_MAX_LEN


def plan_parity(manifest: Manifest, *, beam_size: int = 4, max_len: int | None = None,
                timestamps: bool | None = None, own_settings: bool = False) -> ParityPlan:
    """The plan for ``parity``'s options: ``timestamps`` None follows the export's own search block."""
    timed = bool(manifest_defaults(manifest).get("timestamps", False)) if timestamps is None else timestamps
    return ParityPlan(beam_size, parity_max_len(manifest, max_len, own_settings), own_settings, timed,
                      tuple(manifest.search.get("decoder_prompt", ())), manifest)
