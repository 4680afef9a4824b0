"""``s2s-deploy bench``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from s2s_deploy.cli.group import load_plugin_files, main, plugin_option


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError as exc:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise click.BadParameter("values must be positive")
    return values


@main.command("bench")
@click.argument("export_dirs", nargs=-1, type=click.Path(file_okay=False))
@click.option("--synthetic", default=None, metavar="ARCH:PRESET",
              help="Also export and measure a seeded random model of this preset, e.g. transformer:base.")
@click.option("--vocab-size", type=click.IntRange(8), default=32000, show_default=True,
              help="Vocabulary of the --synthetic model.")
@click.option("--synthetic-dir", type=click.Path(file_okay=False), default=None,
              help="Keep the --synthetic export here (e.g. to quantize it) [default: a temporary folder].")
@click.option("--fixed-length", type=click.IntRange(1), default=None,
              help="Generate exactly this many tokens per sentence (EOS suppressed until then).")
@click.option("--beams", default="1,4", show_default=True, help="Beam sizes, comma-separated.")
@click.option("--batches", default="1,16,64", show_default=True, help="Batch sizes, comma-separated.")
@click.option("--sentences", type=click.IntRange(1), default=64, show_default=True,
              help="Sentences per pass, cycled from the samples stored in each export.")
@click.option("--reps", type=click.IntRange(1), default=3, show_default=True, help="Timed repetitions.")
@click.option("--warmup", type=click.IntRange(0), default=1, show_default=True, help="Untimed passes first.")
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True,
              help="Threads for both PyTorch and ONNX Runtime.")
@click.option("--systems", default="pytorch,onnxruntime-cpu,onnxruntime-generate,onnxruntime-cuda",
              show_default=True, help="Comma-separated: pytorch, onnxruntime-cpu, onnxruntime-generate (the fused "
              "generate.onnx; run `s2s-deploy fuse` first), pytorch-cuda, onnxruntime-cuda (the step loop, "
              "uncaptured), onnxruntime-cuda-graph (replaying CUDA graphs, as translate does on CUDA), "
              "onnxruntime-generate-cuda.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, help="Write a chart (PNG).")
@click.option("--roofline", is_flag=True,
              help="Also measure this machine's bandwidth and GEMM limits and give each ONNX Runtime CPU cell as a "
              "share of its bound, with the step's matrix products timed alone and the measured step beside it.")
@plugin_option
def bench_command(export_dirs: tuple[str, ...], synthetic: str | None, vocab_size: int, synthetic_dir: str | None,
                  fixed_length: int | None,
                  beams: str, batches: str, sentences: int, reps: int, warmup: int, threads: int, systems: str,
                  json_path: str | None, plot_path: str | None, roofline: bool, plugin_files: tuple[str, ...]) -> None:
    """Measure speed and memory, PyTorch against ONNX Runtime.

    Tokens/s, latency, engine overhead and peak memory of the same search on each system.
    """
    from s2s_deploy.bench.runner import (
        SYSTEMS,
        BenchSettings,
        beam_costs,
        chart_rows,
        chart_title,
        markdown_table,
        run_benchmark,
        scratch_dir,
        synthetic_export,
    )
    from s2s_deploy.errors import S2SError
    from s2s_deploy.format.manifest import load_manifest

    load_plugin_files(plugin_files)
    if plot_path:
        from s2s_deploy.pictures.plot import require_matplotlib

        require_matplotlib()  # before the run, not after it
    chosen = tuple(s.strip() for s in systems.split(","))
    unknown = sorted(set(chosen) - set(SYSTEMS))
    if unknown:
        raise S2SError(f"unknown system {unknown[0]!r}; known: {', '.join(SYSTEMS)}")
    if synthetic_dir and not synthetic:
        raise S2SError("--synthetic-dir keeps the --synthetic export: give --synthetic ARCH:PRESET")
    dirs = [Path(d) for d in export_dirs]
    for d in dirs:
        load_manifest(d)
    if synthetic:
        click.echo(f"exporting synthetic {synthetic} (vocab {vocab_size})...", err=True)
        workdir = Path(synthetic_dir) if synthetic_dir else scratch_dir()
        workdir.mkdir(parents=True, exist_ok=True)
        dirs.append(synthetic_export(synthetic, vocab_size, workdir))
    if not dirs:
        raise S2SError("nothing to benchmark: give export folders or --synthetic ARCH:PRESET")
    settings = BenchSettings(beams=_ints(beams), batches=_ints(batches), sentences=sentences, reps=reps,
                             warmup=warmup, threads=threads, fixed_length=fixed_length, systems=chosen)
    timed = None
    if roofline:
        from s2s_deploy.bench import roofline as roof

        timed = roof.SameMinute({d.name: (m := load_manifest(d)).graph_path(m.decoder) for d in dirs}, threads)
    result = run_benchmark(dirs, settings, after_pass=timed.after_pass if timed else None)
    click.echo(markdown_table(result))
    cells: list = []
    if timed is not None:
        cells, limits = roof.roofline_cells(result.rows, timed)
        click.echo(roof.markdown(cells, limits))
    if json_path:
        Path(json_path).write_text(json.dumps({
            "machine": result.machine, "settings": asdict(settings),
            "rows": [asdict(r) for r in result.rows], "skipped": result.skipped,
            "beam_costs": [asdict(c) for c in beam_costs(result.rows)],
            "roofline": [{**asdict(c), "share": c.share, "products_share": c.products_share,
                          "step_share": c.step_share, "ceilings": [b.ceiling for b in c.budgets]} for c in cells],
        }, indent=2))
    if plot_path:
        from s2s_deploy.pictures.plot import plot_benchmark

        plot_benchmark(chart_rows(result.rows), Path(plot_path), title=chart_title(result, settings))
