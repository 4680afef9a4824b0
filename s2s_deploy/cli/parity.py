"""``s2s-deploy parity``: ONNX Runtime against the PyTorch original."""

from __future__ import annotations

import json

import click

from s2s_deploy.cli.extras import require
from s2s_deploy.cli.group import device_option, echo_device, load_plugin_files, main, plugin_option, read_lines


@main.command("parity")
@click.argument("export_dir", type=click.Path())
@click.option("--input", "input_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Sentences to check, one per line, or audio or image files for an export that reads them "
                   "[default: the samples stored at export; for audio or images, seeded synthetic ones]. With "
                   "--reference, the sentences are also tokenised by both tokenizers [default: a built-in "
                   "multilingual sample].")
@click.option("--beam", type=click.IntRange(2), default=4, show_default=True, help="Beam size of the beam check.")
@click.option("--max-len", type=click.IntRange(1), default=None,
              help="Most target tokens [default: 64; with --reference, the export's own, generate's max_new_tokens].")
@click.option("--atol", type=click.FloatRange(0), default=None,
              help="Per-step log-prob tolerance, atol + rtol*|log p| [default: the plugin's].")
@click.option("--rtol", type=click.FloatRange(0), default=None, help="See --atol [default: the plugin's].")
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help="The PyTorch original [default: the checkpoint stored in the export].")
@click.option("--reference", "reference_dir", type=click.Path(file_okay=False), default=None,
              help="A Hugging Face model folder: compare tokens with transformers' own generate at the folder's "
                   "settings, and log-probs with its model (needs [hf]).")
@click.option("--timestamps/--no-timestamps", default=None,
              help="Also check timestamped decoding (transcribe --timestamps): tokens and timed segments of each "
                   "input read whole, window by window, greedy and beam; with --reference, against generate("
                   "return_timestamps=True); synthetic inputs gain clips longer than the window [default: on where "
                   "the export's search turns timestamps on].")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--ort-format", is_flag=True, help="Check the .ort graphs instead of the .onnx ones.")
@device_option
@plugin_option
def parity_command(export_dir: str, input_path: str | None, beam: int, max_len: int | None, atol: float | None,
                   rtol: float | None, checkpoint: str | None, reference_dir: str | None, timestamps: bool | None,
                   as_json: bool, ort_format: bool, device: str, plugin_files: tuple[str, ...]) -> None:
    """Check that ONNX Runtime decodes exactly like PyTorch.

    Decodes with both, greedy and beam; exits 1 unless they agree.
    """
    require("parity", "export")
    if reference_dir is not None:
        require("parity", "hf")
    import sys

    from s2s_deploy.errors import S2SError
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.modeling.torch_backend import torch_backend_for
    from s2s_deploy.runtime.ort.backend import OrtBackend
    from s2s_deploy.runtime.search import StepLoop
    from s2s_deploy.verify.parity import check_parity
    from s2s_deploy.verify.plan import plan_parity
    from s2s_deploy.verify.report import Verdict
    from s2s_deploy.verify.timestamps import (
        check_timestamps,
        long_inputs,
        stepwise,
        timestamp_window,
        whole_features,
    )

    load_plugin_files(plugin_files)
    if atol is not None and not 0 <= atol < float("inf"):
        raise S2SError(f"--atol must be a finite number >= 0, not {atol}")
    manifest = load_manifest(export_dir)
    plan = plan_parity(manifest, beam_size=beam, max_len=max_len, timestamps=timestamps,
                       own_settings=reference_dir is not None)
    window = timestamp_window(manifest) if plan.timed else None  # where timestamps cannot apply: one line, now
    source = manifest.encoder_input
    sources = read_lines(input_path) if input_path else list(manifest.samples)
    encode, whole = None, {}
    if source.is_features:  # --input lists audio or image files; without it, seeded synthetic ones
        from s2s_deploy.frontends.source import frontend_for, medium_for
        from s2s_deploy.verify.parity import feature_encoder

        inputs = medium_for(source).read_files(frontend_for(source), sources if input_path else None)
        sources, encode = list(inputs), feature_encoder(manifest, inputs)
        if plan.timed:  # read whole, so that a clip longer than the window is sought through
            whole = whole_features(manifest, inputs | ({} if input_path else long_inputs(manifest)))
    if not sources:
        raise S2SError(f"{export_dir} stores no sample inputs; pass --input FILE")
    generate = None
    if reference_dir is not None:
        from s2s_deploy.architecture.registry import exported_plugin
        from s2s_deploy.verify.reference import GenerateEngine, HFBackend, load_transformers_model

        if checkpoint:
            raise S2SError("--reference and --checkpoint name two originals: give one")
        model = load_transformers_model(reference_dir)
        cached = exported_plugin(manifest.plugin, manifest.plugin_origin).hf_step_cache
        languages = manifest.tgt_vocab.languages
        reference = HFBackend(model, manifest.decoder_start_id, manifest.eos_id, source, cached, languages)
        generate = GenerateEngine(model, manifest.decoder_start_id, manifest.eos_id, source, languages)
    else:
        reference = torch_backend_for(manifest, checkpoint)
    candidate = OrtBackend(manifest, device=device, graph_format="ort" if ort_format else "onnx")
    echo_device(candidate.choice.notice(), candidate.choice.provider)
    report = check_parity(manifest, reference, candidate, sources, reference_search=generate, encode=encode,
                          atol=atol, rtol=rtol, plan=plan)
    timed_rows = ()
    if plan.timed:
        timed_reference = generate.timed if generate is not None else stepwise(StepLoop(reference), window)
        timed_rows = check_timestamps(manifest, timed_reference, stepwise(StepLoop(candidate), window), whole,
                                      plan=plan)
    tokenizer = None
    if generate is not None:  # the export's own text in and out against transformers' tokenizer
        from s2s_deploy.export.tokenizer_parity import check_reference_tokenizer

        tokenizer = check_reference_tokenizer(reference_dir, manifest, generate.outputs,
                                              sources if input_path and not source.is_features else None)
    verdict = Verdict(report, timed_rows, "generate" if generate else "pytorch", tokenizer)
    if as_json:
        click.echo(json.dumps(verdict.to_json(), indent=2, ensure_ascii=False))
    else:
        for line in verdict.lines():
            click.echo(line)
    if not verdict.passed:
        sys.exit(1)
