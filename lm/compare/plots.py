"""Pictures for comparing position schemes: loss curves, loss against context length, task
accuracy, induction heads forming, passkey grids, attention maps, the sinusoid table and the
attention score by query-key offset.

A leaf: every function draws plain numbers it is handed (numpy arrays, lists) into a PNG and
knows nothing of runs or models. Figures are built as ``matplotlib.figure.Figure`` objects, never
through ``pyplot``: no GUI backend and no global state, so drawing works headless (PNGs are
rendered by Agg) and never disturbs a notebook's own figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

Run = tuple[Sequence[float], Sequence[float]]
"""One run's curve: x values and y values of the same length."""
Curves = dict[str, list[Run]]
"""Runs grouped by what they compare (for example the position scheme): one group, one colour,
its seeds drawn as a mean line with the min-max range shaded."""

DPI = 100
# Whitespace tokens made visible on an axis.
VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
# Above this many tokens an attention map labels every k-th one, so the labels stay legible.
MAX_TICK_LABELS = 48


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def _colours(n: int) -> list:
    """One colour per group: tab10's ten, then tab20's lighter halves, so that up to twenty
    groups (a sweep of ten values, twice over) are told apart."""
    tab10, tab20 = matplotlib.colormaps["tab10"], matplotlib.colormaps["tab20"]
    return [tab10(i) if i < 10 else tab20((2 * i + 1) % 20) for i in range(n)]


def _draw_group(ax: Axes, runs: list[Run], colour, label: str, style: str = "-") -> None:
    """Mean over seeds, the min-max range shaded. Seeds log at the same steps, so their points
    line up by index (a run cut short contributes its first points only)."""
    n = min(len(y) for _, y in runs)
    if n == 0:
        return
    xs = np.array([np.asarray(x[:n], dtype=float) for x, _ in runs])  # (seeds, n)
    ys = np.array([np.asarray(y[:n], dtype=float) for _, y in runs])
    x = xs.mean(axis=0)
    seeds = f" ({len(runs)} seeds)" if len(runs) > 1 else ""
    marker = "o" if n == 1 else None  # a single logged point is a dot, not an invisible line
    mean = ys.mean(axis=0)
    ax.plot(x, mean, color=colour, label=label + seeds, linewidth=1.5, marker=marker, ls=style)
    if len(runs) > 1:
        ax.fill_between(x, ys.min(axis=0), ys.max(axis=0), color=colour, alpha=0.2, linewidth=0)


def _figure_legend(fig: Figure, axes: Sequence[Axes]) -> None:
    """One legend for the whole figure, below the panels (constrained layout makes room), so it
    covers no curve, no other legend and no axis label however long its labels are."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if entries:
        # As many columns as fit the figure's width: about 7 px a character plus the line.
        width = fig.get_figwidth() * fig.dpi
        widest = max(len(label) for label in entries) * 7 + 60
        cols = max(1, min(len(entries), 3, int(width // widest)))
        fig.legend(list(entries.values()), list(entries), loc="outside lower center", ncols=cols)


def loss_curves_figure(panels: dict[str, Curves], xlabel: str) -> Figure:
    """Side-by-side panels (e.g. training and validation loss) against a shared x quantity."""
    fig = Figure(figsize=(6 * len(panels), 5), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    labels = list(dict.fromkeys(label for curves in panels.values() for label in curves))
    colours = dict(zip(labels, _colours(len(labels)), strict=True))
    for ax, (name, curves) in zip(axes, panels.items(), strict=True):
        for label, runs in curves.items():
            _draw_group(ax, runs, colours[label], label)
        ax.set(xlabel=xlabel, ylabel="loss (nats/token)", title=name)
        ax.grid(alpha=0.3)
        if not ax.lines:
            ax.text(0.5, 0.5, "nothing logged", ha="center", va="center", transform=ax.transAxes)
    _figure_legend(fig, axes)
    return fig


def loss_curves(panels: dict[str, Curves], xlabel: str, path: str | Path) -> Path:
    return _save(loss_curves_figure(panels, xlabel), path)


def loss_vs_context(curves: Curves, trained: dict[str, int], path: str | Path) -> Path:
    """Validation loss against evaluation context length, one line per group (the mean over
    seeds, the min-max range shaded), on a log-scaled length axis, as in the ALiBi paper's
    Figure 1.

    A NaN loss (no answer at that length) breaks the line and is named in the legend. A dotted
    vertical line marks the trained context: grey when every group shares it, else one per group
    in its colour. The legend sits beside the axes, never over the lines.
    """
    return _save(loss_vs_context_figure(curves, trained), path)


def _height(groups: int) -> float:
    """Inches for a one-panel figure whose legend lists ``groups``: past six, each adds room,
    so that thirteen schemes' legend does not squeeze the curves flat."""
    return 5.5 + 0.3 * max(0, groups - 6)


def loss_vs_context_figure(curves: Curves, trained: dict[str, int]) -> Figure:
    fig = Figure(figsize=(8, _height(len(curves))), layout="constrained")
    ax = fig.subplots()
    lengths: set[float] = set()
    one_length = len(set(trained.values())) == 1  # every run trained at one context length
    colours = _colours(len(curves))
    for i, ((group, runs), colour) in enumerate(zip(curves.items(), colours, strict=True)):
        style = "-" if i < 10 else "--"  # past tab10's ten colours, the lighter ones dashed too
        order = np.argsort(np.asarray(runs[0][0], dtype=float))
        x = np.asarray(runs[0][0], dtype=float)[order]
        ys = np.array([np.asarray(y, dtype=float)[order] for _, y in runs])  # (seeds, lengths)
        mean = ys.mean(axis=0)
        lengths.update(x.tolist())
        missing = ", ".join(str(int(v)) for v in x[np.isnan(mean)])
        label = f"{group} (n/a at {missing})" if missing else group
        if len(runs) > 1:
            label += f" ({len(runs)} seeds)"
            low, high = ys.min(axis=0), ys.max(axis=0)
            ax.fill_between(x, low, high, color=colour, alpha=0.2, linewidth=0)
        ax.plot(x, mean, color=colour, linestyle=style, marker="o", markersize=4, label=label)
        if not one_length:
            ax.axvline(trained[group], color=colour, linestyle=":", linewidth=1)
    if one_length:
        ax.axvline(next(iter(trained.values())), color="grey", linestyle=":", linewidth=1.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(lengths), [str(int(v)) for v in sorted(lengths)])
    ax.minorticks_off()
    ax.set(
        xlabel="evaluation context length (tokens, log scale); dotted: trained length",
        ylabel="validation loss (nats/token)",
        title="Length extrapolation",
    )
    ax.grid(alpha=0.3)
    _figure_legend(fig, [ax])
    return fig


def accuracy_vs_length(curves: Curves, trained: dict[str, range], path: str | Path) -> Path:
    """Exact-match accuracy against task length, one line per group (the mean over seeds, the
    min-max range shaded); the trained lengths shaded grey (each group's, when they differ)."""
    return _save(accuracy_vs_length_figure(curves, trained), path)


def accuracy_vs_length_figure(curves: Curves, trained: dict[str, range]) -> Figure:
    fig = Figure(figsize=(7, _height(len(curves))), layout="constrained")
    ax = fig.subplots()
    for lengths in dict.fromkeys(trained.values()):
        ax.axvspan(lengths[0] - 0.5, lengths[-1] + 0.5, color="grey", alpha=0.15, linewidth=0)
    for (group, runs), colour in zip(curves.items(), _colours(len(curves)), strict=True):
        _draw_group(ax, runs, colour, group)
    ax.set(
        xlabel="length of the task (symbols or digits); shaded: the trained lengths",
        ylabel="exact-match accuracy",
        title="Accuracy against length",
        ylim=(-0.02, 1.02),
    )
    ax.grid(alpha=0.3)
    _figure_legend(fig, [ax])
    return fig


def induction_vs_step(
    curves: Curves, threshold: float, path: str | Path, panels: Panels | None = None
) -> Path:
    """The best induction score among a run's heads against step, one line per group (the mean
    over seeds, the min-max range shaded); dotted, the score at which its heads are said to have
    formed (docs/heads.md). With ``panels``, a grid of small panels, each drawing the groups it
    names in colours of its own and its own legend in its upper left, where every curve is
    still at the floor (a group may be in several panels, as a reference: first, it is blue in
    each)."""
    return _save(induction_vs_step_figure(curves, threshold, panels), path)


Panels = dict[str, Sequence[str]]
"""Panel title to the groups it draws, in order."""


def induction_vs_step_figure(
    curves: Curves, threshold: float, panels: Panels | None = None
) -> Figure:
    title = f"Induction heads forming (dotted: {threshold:g}, formed)"
    grid = panels or {title: list(curves)}
    cols = min(2, len(grid))
    rows = math.ceil(len(grid) / cols)
    size = (8, _height(len(curves))) if cols == 1 else (11, 3.6 * rows)
    fig = Figure(figsize=size, layout="constrained")
    axes = list(fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).flat)
    for i, (ax, (name, groups)) in enumerate(zip(axes, grid.items(), strict=False)):
        for k, (group, colour) in enumerate(zip(groups, _colours(len(groups)), strict=True)):
            _draw_group(ax, curves[group], colour, group, "-" if k < 10 else "--")  # past tab10
        ax.axhline(threshold, color="grey", linestyle=":", linewidth=1.2)
        ax.set(title=name, ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
        if i + cols >= len(grid):  # the bottom panel of its column
            ax.set(xlabel="step")
            ax.xaxis.set_tick_params(labelbottom=True)
        if i % cols == 0:
            ax.set(ylabel="best induction score among the heads")
        if panels:
            ax.legend(loc="upper left", fontsize="small")
    for ax in axes[len(grid) :]:  # a last row left half empty
        ax.remove()
    if panels:
        fig.suptitle(title)
    else:
        _figure_legend(fig, axes)
    return fig


def accuracy_by_split(curves: dict[str, list[list[float]]], splits: Sequence[str], path) -> Path:
    """A split task's errors (flip-flop's, counting's, selective copy's): for each split, one bar
    per group, its height the mean error rate over seeds (1 - exact match), each seed a dot on
    it, so the spread shows."""
    return _save(accuracy_by_split_figure(curves, splits), path)


def accuracy_by_split_figure(curves: dict[str, list[list[float]]], splits: Sequence[str]) -> Figure:
    """``curves``: per group, each seed's accuracy in every split, in the order of ``splits``."""
    fig = Figure(figsize=(7, _height(len(curves))), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(1, len(curves))
    for k, ((group, seeds), colour) in enumerate(
        zip(curves.items(), _colours(len(curves)), strict=True)
    ):
        errors = 1.0 - np.array(seeds, dtype=float)  # (seeds, splits)
        x = np.arange(len(splits)) - 0.4 + width * (k + 0.5)
        label = group + (f" ({len(seeds)} seeds)" if len(seeds) > 1 else "")
        ax.bar(x, errors.mean(axis=0), width * 0.9, color=colour, alpha=0.45, label=label)
        for row in errors:
            ax.plot(x, row, linestyle="none", marker="o", markersize=3.5, color=colour)
    ax.set_xticks(np.arange(len(splits)), list(splits))
    ax.set(
        xlabel="evaluation split; bars: the mean over seeds, dots: each seed",
        ylabel="error rate (1 − exact match)",
        title="Errors by split",
    )
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, axis="y")
    _figure_legend(fig, [ax])
    return fig


Grid = tuple[Sequence[int], Sequence[float], Sequence[Sequence[float]]]
"""A passkey run's grid: its lengths, its depths (0 to 1) and the accuracy of each (length, depth)
cell, a row per length (NaN where none was measured)."""


def passkey_heatmaps(grids: dict[str, Grid], k_max: dict[str, int | None], path) -> Path:
    """One heatmap per run of passkey accuracy, lengths down and depths across (Position
    Interpolation's and Landmark attention's passkey grid), each cell its accuracy written in;
    the title gives the run's k_max."""
    return _save(passkey_heatmaps_figure(grids, k_max), path)


def passkey_heatmaps_figure(grids: dict[str, Grid], k_max: dict[str, int | None]) -> Figure:
    columns = min(3, len(grids))
    rows = -(-len(grids) // columns)
    fig = Figure(figsize=(4.2 * columns, 3.6 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, columns)).ravel()
    for ax, (label, (lengths, depths, cells)) in zip(axes, grids.items(), strict=False):
        grid = np.array(cells, dtype=float)  # (lengths, depths)
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            text = "n/a" if math.isnan(value) else f"{value:.0%}"
            colour = "black" if not math.isnan(value) and value > 0.6 else "white"
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
        ax.set_xticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        ax.set_yticks(range(len(lengths)), [str(n) for n in lengths])
        found = k_max.get(label)
        ax.set(xlabel="depth of the key", ylabel="length (characters)")
        ax.set_title(f"{label}\nk_max {found if found is not None else 'none'}", fontsize=9)
    for ax in axes[len(grids) :]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes[: len(grids)].tolist(), label="exact match of the 5 digits")
    return fig


def token_label(token: str) -> str:
    """A token as an axis label: whitespace made visible, so a space is not a blank tick."""
    return "".join(VISIBLE.get(c, c) for c in token) or "∅"


def attention_maps(
    weights: np.ndarray,
    tokens: Sequence[str],
    titles: Sequence[str],
    path: str | Path,
    suptitle: str = "",
) -> Path:
    """Attention matrices ``A`` ``[n, T, T]`` (rows: queries, columns: keys) as a grid of heat maps.

    Entries above the diagonal (keys a causal query may not see) are masked and drawn grey, so the
    causal triangle shows as its own shape rather than as weights that happen to be zero. All
    panels share one colour scale, so heads can be compared.
    """
    n, T = weights.shape[0], weights.shape[-1]
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    side = min(10.0, max(3.5, 0.16 * T))  # inches per panel: room for one label per token
    fig = Figure(figsize=(side * cols + 1, side * rows + 0.5), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#d9d9d9")
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    labels = [token_label(t) for t in tokens]
    every = math.ceil(T / MAX_TICK_LABELS)
    ticks = np.arange(0, T, every)
    image = None
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.set_axis_off()
            continue
        shown = np.ma.masked_where(future, weights[i])
        image = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=float(weights.max()))
        ax.set_xticks(ticks, [labels[t] for t in ticks], rotation=90, fontsize=8)
        ax.set_yticks(ticks, [labels[t] for t in ticks], fontsize=8)
        ax.set(xlabel="key", ylabel="query", title=titles[i])
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    if suptitle:
        fig.suptitle(suptitle)
    return _save(fig, path)


def sinusoids(table: np.ndarray, path: str | Path, slices: Sequence[int] = (0, 2, 5)) -> Path:
    """The sinusoid table ``p [L, d]``, as in the notes' "four sinusoidal features for d=4".

    Small ``d`` (up to 8): each feature against position, points at integer positions (the only
    ones a model sees), and the whole vector ``p_l`` printed at the ``slices`` positions. Wider
    tables are one heat map, position against feature.
    """
    L, d = table.shape
    if d > 8:
        fig = Figure(figsize=(8, 4.5), layout="constrained")
        ax = fig.subplots()
        image = ax.imshow(table.T, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, origin="lower")
        fig.colorbar(image, ax=ax, label="p[l, j]")
        ax.set(xlabel="position l", ylabel="feature j", title=f"Sinusoid table, d={d}")
        return _save(fig, path)
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    positions = np.arange(L)
    for j in range(d):
        i, fn = j // 2, ("sin" if j % 2 == 0 else "cos")
        ax.plot(positions, table[:, j], marker="o", markersize=3, label=f"p[l,{j}] = {fn}(l·ω{i})")
    for l in (s for s in slices if s < L):
        ax.axvline(l, color="grey", linestyle="--", linewidth=0.8)
        vector = ", ".join(f"{v:.2f}" for v in table[l])
        ax.annotate(
            f"p{l} = [{vector}]",
            (l, -1.15),
            rotation=90,
            fontsize=8,
            va="bottom",
            ha="right",
        )
    ax.set(
        xlabel="position l",
        ylabel="value",
        ylim=(-1.2, 1.2),
        title=f"Sinusoidal positions, d={d}: ωi = 10000^(-2i/d)",
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def score_by_offset(
    profile: np.ndarray,
    path: str | Path,
    title: str = "",
    ylabel: str = "mean score q·k/√d_k",
    layers: Sequence[int] | None = None,
) -> Path:
    """Mean attention score (or a position bias) against query-key offset ``[layers, heads,
    offsets]``, one panel per layer (titled by ``layers``, default 0, 1, ...) and one line per
    head."""
    n_layer, n_head, n_offset = profile.shape
    cols = min(n_layer, 4)
    rows = math.ceil(n_layer / cols)
    fig = Figure(figsize=(4.5 * cols, 3.5 * rows + 0.5), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    offsets = np.arange(n_offset)
    for i, ax in enumerate(axes.flat):
        if i >= n_layer:
            ax.set_axis_off()
            continue
        for h in range(n_head):
            ax.plot(offsets, profile[i, h], label=f"head {h}", linewidth=1.2)
        layer = i if layers is None else layers[i]
        ax.set(xlabel="offset: query position - key position", title=f"layer {layer}")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    axes.flat[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(fig, path)
