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
    from s2s_deploy.export.parity import check_parity, torch_backend_for
    from s2s_deploy.export.timestamp_parity import (
        check_timestamps,
        long_inputs,
        stepwise,
        timestamp_window,
        whole_features,
    )
    from s2s_deploy.export.tokenizer_parity import report_json, report_lines
    from s2s_deploy.format.manifest import load_manifest
    from s2s_deploy.runtime.decoding import manifest_defaults, resolve
    from s2s_deploy.runtime.ort.backend import OrtBackend
    from s2s_deploy.runtime.search import StepLoop

    load_plugin_files(plugin_files)
    if atol is not None and not 0 <= atol < float("inf"):
        raise S2SError(f"--atol must be a finite number >= 0, not {atol}")
    manifest = load_manifest(export_dir)
    timed = manifest_defaults(manifest).get("timestamps", False) if timestamps is None else timestamps
    window = timestamp_window(manifest) if timed else None  # where timestamps cannot apply: one line, now
    source = manifest.encoder_input
    sources = read_lines(input_path) if input_path else list(manifest.samples)
    encode, whole = None, {}
    if source.is_features:  # --input lists audio or image files; without it, seeded synthetic ones
        from s2s_deploy.export.parity import feature_encoder, feature_inputs
        from s2s_deploy.frontends.source import frontend_for

        inputs = feature_inputs(frontend_for(source), sources if input_path else None)
        sources, encode = list(inputs), feature_encoder(manifest, inputs)
        if timed:  # read whole, so that a clip longer than the window is sought through
            whole = whole_features(manifest, inputs | ({} if input_path else long_inputs(manifest)))
    if not sources:
        raise S2SError(f"{export_dir} stores no sample inputs; pass --input FILE")
    generate = None
    if reference_dir is not None:
        from s2s_deploy.architecture.registry import exported_plugin
        from s2s_deploy.export.hf_reference import GenerateEngine, HFBackend, load_transformers_model

        if checkpoint:
            raise S2SError("--reference and --checkpoint name two originals: give one")
        model = load_transformers_model(reference_dir)
        cached = exported_plugin(manifest.plugin, manifest.plugin_origin).hf_step_cache
        languages = manifest.tgt_vocab.languages
        reference = HFBackend(model, manifest.decoder_start_id, manifest.eos_id, source, cached, languages)
        generate = GenerateEngine(model, manifest.decoder_start_id, manifest.eos_id, source, languages)
        max_len = max_len or resolve(manifest).max_len
    else:
        reference = torch_backend_for(manifest, checkpoint)
        if manifest.search.get("decoder_prompt"):  # 64 tokens after the prompt may not fit the positions
            max_len = max_len or min(64, resolve(manifest).max_len)
    if max_len is None and manifest.max_target_length is not None:
        # the teacher-forced comparison feeds one step past a hypothesis cut at max_len
        max_len = min(64, manifest.max_target_length - 1)
    candidate = OrtBackend(manifest, device=device, graph_format="ort" if ort_format else "onnx")
    echo_device(candidate.choice.notice(), candidate.choice.provider)
    report = check_parity(manifest, reference, candidate, sources, beam_size=beam, max_len=max_len or 64, atol=atol,
                          rtol=rtol, reference_search=generate, encode=encode)
    timed_rows = ()
    if timed:
        timed_reference = generate.timed if generate is not None else stepwise(StepLoop(reference), window)
        timed_rows = check_timestamps(manifest, timed_reference, stepwise(StepLoop(candidate), window), whole,
                                      beam_size=beam, max_len=max_len or 64)
    tokenizer = None
    if generate is not None:  # the export's own text in and out against transformers' tokenizer
        from s2s_deploy.export.tokenizer_parity import check_reference_tokenizer

        tokenizer = check_reference_tokenizer(reference_dir, manifest, generate.outputs,
                                              sources if input_path and not source.is_features else None)
    passed = (report.passed and all(t.agreement >= report.min_token_agreement for t in timed_rows)
              and (tokenizer is None or tokenizer.passed))
    tol = report.forward_tolerance
    if as_json:
        click.echo(json.dumps({
            "passed": passed, "inputs": report.inputs, "atol": report.atol,
            "rtol": None if report.tolerance is None else report.tolerance.rtol,
            "min_token_agreement": report.min_token_agreement,
            "step_max_abs_diff": report.step_max_abs_diff, "step_worst_ratio": report.step.worst,
            "forward_step_max_abs_diff": None if report.forward_step is None else report.forward_step.max_abs_diff,
            "forward_step_ok": report.forward_ok,
            "batch_agreement": None if report.batch is None else {
                "identical": report.batch.identical, "total": report.batch.total, "rows": report.batch.mode},
            "searches": [{"mode": s.mode, "identical": s.identical, "total": s.total,
                          "agreement": s.agreement, "max_score_diff": s.max_score_diff,
                          "mismatches": [dict(zip(("source", "pytorch", "onnx"), m, strict=True))
                                         for m in s.mismatches]} for s in report.searches],
            "timestamps": [{"mode": t.mode, "inputs": t.total, "longer_than_window": t.long, "segments": t.segments,
                            "tokens_identical": t.tokens_identical, "segments_identical": t.segments_identical,
                            "identical": t.identical, "agreement": t.agreement,
                            "mismatches": [dict(zip(("source", "pytorch", "onnx"), m, strict=True))
                                           for m in t.mismatches]} for t in timed_rows],
            "tokenizer": None if tokenizer is None else report_json(tokenizer),
        }, indent=2, ensure_ascii=False))
    else:
        if report.atol is None:
            click.echo(f"per-step log-prob max |diff| {report.step_max_abs_diff:.2e} (quantised: informative; "
                       f"tokens must agree on >= {report.min_token_agreement:.0%} of inputs)")
        else:
            ok = "ok" if report.log_probs_ok else "FAIL"
            click.echo(f"per-step log-prob max |diff| {report.step_max_abs_diff:.2e} where a search can act "
                       f"(atol {report.atol:g} + rtol {report.tolerance.rtol:g}*|log p|) {ok}")
        if report.forward_step is not None:
            ok = "ok" if report.forward_ok else "FAIL"
            click.echo(f"PyTorch decode_step vs teacher-forced forward: max |diff| "
                       f"{report.forward_step.max_abs_diff:.2e} (atol {tol.atol:g} + rtol {tol.rtol:g}*|log p|) {ok}")
        if report.batch is not None:
            b = report.batch
            ok = "ok" if b.identical == b.total else "FAIL"
            click.echo(f"ONNX Runtime {b.mode} vs one at a time: tokens identical {b.identical}/{b.total} {ok}")
        for s in report.searches:
            verdict = "ok" if s.agreement >= report.min_token_agreement else "FAIL"
            click.echo(f"{s.mode:<8} tokens identical {s.identical}/{s.total} ({s.agreement:.1%}), "
                       f"score max |diff| {s.max_score_diff:.2e} {verdict}")
            for source, want, got in s.mismatches[:5]:
                click.echo(f"  {source!r}: {'generate' if generate else 'pytorch'} {want!r} onnx {got!r}")
        for t in timed_rows:
            verdict = "ok" if t.agreement >= report.min_token_agreement else "FAIL"
            click.echo(f"{t.mode:<8} tokens identical {t.tokens_identical}/{t.total}, segments identical "
                       f"{t.segments_identical}/{t.total} ({t.segments} segments; {t.long} inputs longer than the "
                       f"window) {verdict}")
            for source, want, got in t.mismatches[:5]:
                click.echo(f"  {source!r}: {'generate' if generate else 'pytorch'} {want!r} onnx {got!r}")
        for line in report_lines(tokenizer) if tokenizer is not None else ():
            click.echo(line)
        click.echo("parity: PASS" if passed else "parity: FAIL")
    if not passed:
        sys.exit(1)
