"""Figures: attention heatmaps and benchmark charts, written straight to image files.

matplotlib is an optional extra, imported only here and only when a figure is drawn. Figures
render through the Agg canvas directly, so no GUI backend or global pyplot state is touched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from s2s_deploy.errors import S2SError
from s2s_deploy.pictures.attention import SINGLE_MAP, AttentionComparison, AttentionMap

CMAP = "Reds"
VISIBLE_SPACE = "␣"


def require_matplotlib() -> None:
    """Fail with the install hint before a long decode, not after it."""
    _agg()


def _agg() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ModuleNotFoundError as exc:
        raise S2SError("install the plot extra: pip install 's2s-deploy[plot]'") from exc
    return Figure, FigureCanvasAgg


def _figure(**kwargs: Any) -> Any:
    figure_type, canvas_type = _agg()
    figure = figure_type(layout="constrained", **kwargs)
    canvas_type(figure)
    return figure


def _save(figure: Any, path: str | Path, dpi: int = 100) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        figure.savefig(path, dpi=dpi)
    except ValueError as exc:  # an extension matplotlib cannot write
        raise S2SError(f"cannot write {path}: {exc}") from exc
    return path


def _label(token: str) -> str:
    return VISIBLE_SPACE if token == " " else token


def _cell_inches(amap: AttentionMap, columns: int, rows: int | None = None) -> float:
    """Shrink cells as panels and tokens multiply, so a many-head grid stays about a screen in size,
    but never below what keeps a character label legible."""
    across = columns * len(amap.source_tokens)
    down = (rows or amap.grid[0]) * len(amap.target_tokens)
    return float(np.clip(min(13.0 / across, 10.0 / down), 0.11, 0.28))


def _draw(container: Any, amap: AttentionMap, cell: float, vmax: float, colorbar: bool = True) -> None:
    """``colorbar=False`` keeps the bar's room but hides it, so side-by-side maps stay the same size."""
    rows, columns = amap.grid
    axes = container.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)
    fontsize = float(np.clip(cell * 58, 5, 9))
    image = None
    for index, ax in enumerate(axes.flat):
        image = ax.imshow(amap.weights[:, index, :], cmap=CMAP, vmin=0.0, vmax=vmax, aspect="equal")
        if amap.panels[index] != SINGLE_MAP:
            ax.set_title(amap.panels[index], fontsize=fontsize + 1)
        ax.xaxis.tick_top()
        ax.set_xticks(range(len(amap.source_tokens)), [_label(t) for t in amap.source_tokens], fontsize=fontsize)
        ax.set_yticks(range(len(amap.target_tokens)), [_label(t) for t in amap.target_tokens], fontsize=fontsize)
        ax.tick_params(length=0, labeltop=index < columns, labelleft=index % columns == 0)
    for ax in axes.flat:  # after every set_xticks, which resets the shared axes' labels
        for tick in ax.get_xticklabels():  # characters stay upright, longer tokens turn to fit a column
            tick.set_rotation(90 if len(tick.get_text()) > 1 else 0)
    for ax in axes[0, :]:
        ax.xaxis.set_label_position("top")
        ax.set_xlabel("source", fontsize=fontsize + 1)
    for ax in axes[:, 0]:
        ax.set_ylabel("target", fontsize=fontsize + 1)
    bar = container.colorbar(image, ax=axes, shrink=0.6, aspect=30, label="attention weight")
    bar.ax.set_visible(colorbar)


def _size(amap: AttentionMap, cell: float) -> tuple[float, float]:
    rows, columns = amap.grid
    return (columns * (len(amap.source_tokens) * cell + 0.7) + 1.2,
            rows * (len(amap.target_tokens) * cell + 0.9) + 0.6)


def plot_attention(amap: AttentionMap, path: str | Path, title: str | None = None) -> Path:
    """One heatmap per panel in a layers × heads grid: target tokens down, source tokens across the top."""
    cell = _cell_inches(amap, amap.grid[1])
    figure = _figure(figsize=_size(amap, cell))
    _draw(figure, amap, cell, float(amap.weights.max()))
    if title:
        figure.suptitle(title, fontsize=10)
    return _save(figure, path)


def plot_comparison(comparison: AttentionComparison, path: str | Path, reduce: str = "mean") -> Path:
    """Reference and candidate on one colour scale (one colour bar); the title gives their max |Δ|
    over every panel (before any reduction). Single maps sit side by side; per-head grids are
    stacked, reference above candidate, so each keeps a screen's width."""
    maps = [comparison.reference.reduce(reduce), comparison.candidate.reduce(reduce)]
    rows, columns = maps[0].grid
    stacked = columns > 1
    cell = _cell_inches(maps[0], columns if stacked else 2 * columns, 2 * rows if stacked else rows)
    width, height = _size(maps[0], cell)
    figure = _figure(figsize=(width, 2 * height + 0.4) if stacked else (2 * width, height + 0.4))
    vmax = max(float(m.weights.max()) for m in maps)
    for index, (sub, amap) in enumerate(zip(figure.subfigures(2, 1) if stacked else figure.subfigures(1, 2), maps,
                                            strict=True)):
        _draw(sub, amap, cell, vmax, colorbar=index == 1)
        sub.suptitle(amap.backend, fontsize=10)
    figure.suptitle(f"{maps[0].backend} vs {maps[1].backend}: max |Δ attention| = {comparison.max_abs_diff:.1e}",
                    fontsize=11)
    return _save(figure, path)


def plot_benchmark(
    rows: Sequence[Mapping[str, Any]], path: str | Path, *, value: str = "tokens_per_s", kind: str = "bar",
    title: str | None = None,
) -> Path:
    """``value`` per ``setting`` (x axis), one bar group or line per ``system``."""
    if not rows:
        raise S2SError("no benchmark rows to plot")
    if kind not in ("bar", "line"):
        raise S2SError(f"unknown chart kind {kind!r}; known: bar, line")
    settings = list(dict.fromkeys(str(r["setting"]) for r in rows))
    systems = list(dict.fromkeys(str(r["system"]) for r in rows))
    table = {(str(r["system"]), str(r["setting"])): float(r[value]) for r in rows}
    figure = _figure(figsize=(max(4.0, 0.9 * len(settings) * max(1, len(systems)) ** 0.5 + 2), 3.5))
    ax = figure.subplots()
    x = np.arange(len(settings))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        ys = [table.get((system, s), np.nan) for s in settings]
        if kind == "bar":
            ax.bar(x + (i - (len(systems) - 1) / 2) * width, ys, width, label=system)
        else:
            ax.plot(x, ys, marker="o", label=system)
    ax.set_xticks(x, settings)
    ax.set_ylabel(value.replace("_", " "))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=8)
    return _save(figure, path)
