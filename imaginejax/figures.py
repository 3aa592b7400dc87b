"""Figures of :class:`~imaginejax.results.Results`: learning curves and per-level bar charts.

For every group of seeds (:meth:`~imaginejax.results.Results.groups`), level and evaluation the point
estimate (IQM by default, or the mean) over seeds and its stratified-bootstrap 95 % interval come from
:mod:`imaginejax.stats`.

Output (:func:`write_figures`), everything under one directory:

* ``curves-<level>.png`` — success rate (%) against gradient updates, one line per group with its 95 %
  band; ``curves.csv`` — the plotted numbers (group, level, step, n, point, low, high, mean);
* ``bars.png`` — final success rate per level, one bar per group with its 95 % interval;
  ``bars.csv`` — the plotted numbers;
* ``results.md`` — the plain table of :func:`imaginejax.report.table`;
* ``protocol.png`` / ``protocol.csv`` — for sweeps whose runs name their data source, per level the
  three data conditions side by side (:func:`imaginejax.report.protocol_rows`).

Plots use matplotlib's non-interactive Agg backend (no display needed); matplotlib is imported only here.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from imaginejax.files import atomic_path, write_text
from imaginejax.report import CONDITIONS, STATISTICS, protocol_rows, table
from imaginejax.results import Group, Results
from imaginejax.stats import stratified_bootstrap_ci


def curve_rows(groups: Sequence[Group], levels: Sequence[str], statistic: str = "iqm",
               reps: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
    """One row per (group, level, evaluation): point estimate over seeds and its bootstrap 95 % interval.

    Returns:
      Dicts with keys group, algo, level, step, n, point, low, high, mean (rates in [0, 1]).
    """
    stat = STATISTICS[statistic]
    rows = []
    for group in groups:
        for level in levels:
            for i, step in enumerate(group.steps):
                scores = group.success[level][i]
                ci = stratified_bootstrap_ci(scores, stat, reps=reps, seed=seed)
                rows.append({"group": group.label, "algo": group.algo, "level": level, "step": int(step),
                             "n": int(scores.size), "point": ci.point, "low": ci.low, "high": ci.high,
                             "mean": float(scores.mean())})
    return rows


def final_rows(groups: Sequence[Group], levels: Sequence[str], statistic: str = "iqm",
               reps: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
    """Like :func:`curve_rows` for the last evaluation only (what the bar chart shows)."""
    last = [dataclasses.replace(g, steps=g.steps[-1:], success={lv: v[-1:] for lv, v in g.success.items()})
            for g in groups]
    return curve_rows(last, levels, statistic, reps, seed)


def _styles(groups: Sequence[Group]) -> dict[str, tuple[Any, str, str]]:
    """Group label -> (colour, line style, bar hatch): one colour per algorithm, one line style / hatch
    per configuration within it, so curves stay distinguishable beyond ten groups."""
    import matplotlib

    palette = matplotlib.colormaps["tab10"].colors
    algos = list(dict.fromkeys(g.algo for g in groups))
    seen: dict[str, int] = {}
    out = {}
    for g in groups:
        k = seen.get(g.algo, 0)
        seen[g.algo] = k + 1
        out[g.label] = (palette[algos.index(g.algo) % len(palette)], ("-", "--", ":", "-.")[k % 4],
                        ("", "//", "..", "xx")[k % 4])
    return out


def _save_protocol_figure(rows: Sequence[Mapping[str, Any]], levels: Sequence[str], path: Path, name: str) -> None:
    """One panel per level; per algorithm (and hyperparameters, ratio) the three conditions as bars."""
    import matplotlib.pyplot as plt

    colours = {"real": "#7f7f7f", "imaginary": "#1f77b4", "oracle": "#2ca02c"}
    fig, axes = plt.subplots(1, len(levels), figsize=(3.2 * len(levels) + 1.5, 3.6), sharey=True, squeeze=False)
    for ax, level in zip(axes[0], levels):
        mine = [r for r in rows if r["level"] == level]
        keys = list(dict.fromkeys((r["algo"], r["hp"], r["ratio"]) for r in mine))
        width = 0.8 / len(CONDITIONS)
        for c, condition in enumerate(CONDITIONS):
            for k, key in enumerate(keys):
                r = next((r for r in mine if (r["algo"], r["hp"], r["ratio"]) == key and r["condition"] == condition),
                         None)
                if r is None:
                    continue
                ax.bar(k - 0.4 + (c + 0.5) * width, 100 * r["point"], width,
                       yerr=[[100 * max(r["point"] - r["low"], 0)], [100 * max(r["high"] - r["point"], 0)]],
                       capsize=2, color=colours[condition], label=CONDITIONS[condition] if k == 0 else None)
        ax.set_xticks(range(len(keys)), [k[0] + (f"\n{k[1]}" if k[1] else "") for k in keys], fontsize="small")
        ax.set_title(level)
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel(f"success rate (%), {name} over seeds")
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_legend_handles_labels()[0]}
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=3, fontsize="small",
               bbox_to_anchor=(0.5, 1.08))
    _save(fig, path)
    plt.close(fig)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _save(fig: Any, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")


def write_figures(results: Results, out_dir: str | os.PathLike[str], *, statistic: str = "iqm", reps: int = 2000,
                  seed: int = 0, last: int = 5) -> dict[str, Path]:
    """Writes the learning curves, the bar chart, their CSV data and the plain results table.

    Args:
      results: the runs (groups of seeds are plotted; non-finite runs left out).
      out_dir: created if needed; files are replaced atomically.
      statistic: ``"iqm"`` or ``"mean"`` over seeds.
      reps, seed: bootstrap replicates and seed of the 95 % intervals.
      last: evaluations averaged per run in the three-way comparison.

    Returns:
      name -> path of every file written (``curves-<level>``, ``curves_csv``, ``bars``, ``bars_csv``,
      ``results``, and ``protocol`` / ``protocol_csv`` for sweeps with named data sources).
    """
    try:
        import matplotlib
    except ImportError:
        from imaginejax.progress import MissingDependency

        raise MissingDependency("figures need matplotlib, which is not installed: pip install 'imaginejax[figures]' "
                                "(or pip install matplotlib), or skip them with --no-figures / "
                                "--set report.figures=false") from None
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    groups, levels = results.groups(), results.levels
    if not groups:
        raise ValueError("no groups to plot: every run is non-finite or no sweep was found")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    name = "IQM" if statistic == "iqm" else "mean"

    styles = _styles(groups)
    curves = curve_rows(groups, levels, statistic, reps, seed)
    _write_csv(out / "curves.csv", curves)
    written["curves_csv"] = out / "curves.csv"
    for level in levels:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for group in groups:
            rows = [r for r in curves if r["group"] == group.label and r["level"] == level]
            x = [r["step"] for r in rows]
            colour, dashes, _ = styles[group.label]
            ax.plot(x, [100 * r["point"] for r in rows], color=colour, linestyle=dashes, marker="o",
                    markersize=3, label=group.label)
            ax.fill_between(x, [100 * r["low"] for r in rows], [100 * r["high"] for r in rows],
                            color=colour, alpha=0.15, linewidth=0)
        ax.set_xlabel("gradient updates")
        ax.set_ylabel(f"success rate (%), {name} over seeds")
        ax.set_title(f"{level}: {name} with 95 % stratified-bootstrap band")
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
        path = out / f"curves-{level}.png"
        _save(fig, path)
        plt.close(fig)
        written[f"curves-{level}"] = path

    bars = final_rows(groups, levels, statistic, reps, seed)
    _write_csv(out / "bars.csv", bars)
    written["bars_csv"] = out / "bars.csv"
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.4, 2.0 + 0.22 * len(levels) * len(groups))), 4.0))
    width = 0.8 / len(groups)
    centres = np.arange(len(levels))
    for g, group in enumerate(groups):
        rows = [next(r for r in bars if r["group"] == group.label and r["level"] == lv) for lv in levels]
        point = np.asarray([100 * r["point"] for r in rows])
        err = np.asarray([[100 * (r["point"] - r["low"]) for r in rows], [100 * (r["high"] - r["point"]) for r in rows]])
        colour, _, hatch = styles[group.label]
        ax.bar(centres - 0.4 + (g + 0.5) * width, point, width, yerr=np.maximum(err, 0), capsize=2,
               color=colour, hatch=hatch, edgecolor="white", label=group.label)
    ax.set_xticks(centres, list(levels))
    ax.set_ylabel(f"final success rate (%), {name} over seeds")
    ax.set_title("final evaluation, 95 % stratified-bootstrap intervals")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, out / "bars.png")
    plt.close(fig)
    written["bars"] = out / "bars.png"

    protocol = protocol_rows(groups, levels, statistic, reps, seed, last)
    if protocol:
        _write_csv(out / "protocol.csv", protocol)
        written["protocol_csv"] = out / "protocol.csv"
        _save_protocol_figure(protocol, levels, out / "protocol.png", name)
        written["protocol"] = out / "protocol.png"

    write_text(out / "results.md", table(results, statistic, reps, seed, three_way=False) + "\n")
    written["results"] = out / "results.md"
    return written
