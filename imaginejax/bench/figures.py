"""Figures of :class:`~imaginejax.bench.results.Results`: learning curves and per-level bar charts.

For every group of seeds (:meth:`~imaginejax.bench.results.Results.groups`), level and evaluation the point
estimate (IQM by default, or the mean) over seeds and its stratified-bootstrap 95 % interval come from
:mod:`imaginejax.bench.stats`.

Output (:func:`write_figures`), everything under one directory:

* ``curves.png`` — success rate (%) against gradient updates: one panel row per algorithm, one column
  per level, one line per data condition (ratio, hyperparameters) with its 95 % band; ``curves.csv`` —
  the plotted numbers (group, level, step, n, point_pct, low_pct, high_pct, mean_pct);
* ``bars.png`` — final success rate per level, one bar per group with its 95 % interval and, when
  given, the random policy's success as a dashed line; ``bars.csv`` — the plotted numbers;
* ``results.md`` — the plain table of :func:`imaginejax.bench.report.table`;
* ``protocol.png`` / ``protocol.csv`` — for sweeps whose runs name their data source, per level the
  data conditions it has (real only, + imaginary, + oracle) side by side (:func:`imaginejax.bench.report.protocol_rows`).

Each figure is built by its ``*_figure`` function and saved at :data:`DPI`. Plots use matplotlib's
non-interactive Agg backend (no display needed); matplotlib is imported only here.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from imaginejax.bench.report import CONDITIONS, STATISTICS, protocol_rows, table
from imaginejax.bench.results import Group, Results
from imaginejax.bench.stats import stratified_bootstrap_ci
from imaginejax.core.files import atomic_path, write_text


def curves(results: Results, statistic: str = "iqm", reps: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
    """Learning curves of ``results``: per group, level and evaluation the point estimate over seeds and its
    95 % interval (:func:`curve_rows` of its groups; :func:`write_figures` plots them)."""
    return curve_rows(results.groups(), results.levels, statistic, reps, seed)


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


def _line_styles(groups: Sequence[Group]) -> dict[str, tuple[Any, str]]:
    """Group label -> (colour, line style). With named data sources the colour is the condition (real only
    grey, imaginary blue, oracle green) and the line style tells the sources (levels, ratios) apart;
    otherwise one colour per configuration, the same in every algorithm's row."""
    import matplotlib

    palette = matplotlib.colormaps["tab10"].colors
    dashes = ("-", "--", ":", "-.")
    if any(g.data for g in groups):
        colours = {"": "#7f7f7f", "imaginary": "#1f77b4", "oracle": "#2ca02c"}
        out, seen = {}, {}
        for g in groups:
            kind = g.data.split("/", 1)[0]
            k = seen[g.algo, kind] = seen.get((g.algo, kind), -1) + 1
            out[g.label] = (colours.get(kind, palette[3]), dashes[k % len(dashes)])
        return out
    conditions = list(dict.fromkeys(_condition(g) for g in groups))
    return {g.label: (palette[conditions.index(_condition(g)) % len(palette)],
                      dashes[conditions.index(_condition(g)) // len(palette) % len(dashes)]) for g in groups}


def _shown(group: Group, level: str) -> bool:
    """Whether a level's panel draws the group: a novel level shows the real-only runs and the runs that
    mixed in that level's own (or the pooled) data, the comparison of the reference protocol."""
    return not group.data or level == "train" or group.data.endswith((f"/{level}", "/pooled"))


def _condition(group: Group) -> str:
    """The group's label without its algorithm: its data condition, ratio and varying hyperparameters."""
    return group.label.removeprefix(f"{group.algo}, ") or group.algo


def _title(results: Results, groups: Sequence[Group], env: str | None, name: str) -> str:
    """``<env>: <statistic> over <n> seeds, <updates> updates`` (the environment when known)."""
    seeds = sorted({int(g.success[results.levels[0]].shape[1]) for g in groups})
    updates = sorted({int(g.steps[-1]) for g in groups})
    return (f"{env + ': ' if env else ''}{name} over {'/'.join(map(str, seeds))} seeds, "
            f"{'/'.join(f'{u:,}' for u in updates)} updates, 95 % stratified-bootstrap intervals")


DPI = 150  # every figure: sharp when a README or a paper shrinks it
FONT = 9  # points, legends and tick labels


def _subplots(rows: int, cols: int, **kwargs: Any) -> tuple[Any, Any]:
    """``plt.subplots`` with legible tick labels on every panel (always a 2-D array of axes)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, squeeze=False, **kwargs)
    for ax in axes.flat:
        ax.tick_params(labelsize=FONT)
    return fig, axes


def curves_figure(curves: Sequence[Mapping[str, Any]], groups: Sequence[Group], levels: Sequence[str],
                  title: str, name: str) -> Any:
    """One panel row per algorithm, one column per level; each condition of the algorithm a line with its band."""
    algos = list(dict.fromkeys(g.algo for g in groups))
    styles = _line_styles(groups)
    fig, axes = _subplots(len(algos), len(levels), figsize=(2.9 * len(levels) + 2.6, 2.3 * len(algos) + 0.8),
                          sharex=True, sharey=True)
    for row, algo in enumerate(algos):
        for col, level in enumerate(levels):
            ax = axes[row][col]
            for group in (g for g in groups if g.algo == algo and _shown(g, level)):
                rows = [r for r in curves if r["group"] == group.label and r["level"] == level]
                x = [r["step"] for r in rows]
                colour, dashes = styles[group.label]
                ax.plot(x, [100 * r["point"] for r in rows], color=colour, linestyle=dashes, marker="o",
                        markersize=3, label=_condition(group))
                ax.fill_between(x, [100 * r["low"] for r in rows], [100 * r["high"] for r in rows],
                                color=colour, alpha=0.12, linewidth=0)
            ax.set_ylim(-2, 102)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(level)
            if row == len(algos) - 1:
                ax.set_xlabel("gradient updates")
            if col == 0:
                ax.set_ylabel(f"{algo}\nsuccess (%)")
        handles = {h.get_label(): h for ax in axes[row] for h in ax.get_legend_handles_labels()[0]}
        axes[row][-1].legend(list(handles.values()), list(handles), fontsize=FONT, loc="upper left",
                             bbox_to_anchor=(1.02, 1.0))
    note = ("; a novel level's panel shows real only and the runs that mixed in its own data"
            if any(g.data for g in groups) else "")
    fig.suptitle(f"{title}\n{name} success rate (%) against gradient updates{note}", fontsize="medium")
    fig.tight_layout()
    return fig


def bars_figure(bars: Sequence[Mapping[str, Any]], groups: Sequence[Group], levels: Sequence[str], title: str,
                name: str, floor: Mapping[str, float] | None) -> Any:
    """One panel row per algorithm: per level one bar per configuration with its interval (colour and
    hatch as the curves' colour and line style), and the random policy's success as a dashed line."""
    styles = _line_styles(groups)
    hatches = {"-": "", "--": "//", ":": "..", "-.": "xx"}
    algos = list(dict.fromkeys(g.algo for g in groups))
    most = max(sum(g.algo == a for g in groups) for a in algos)
    fig, axes = _subplots(len(algos), 1, figsize=(min(18.0, max(6.4, 2.5 + 0.3 * len(levels) * most)),
                                                  2.6 * len(algos) + 0.9), sharey=True)
    centres = np.arange(len(levels))
    for ax, algo in zip(axes[:, 0], algos):
        mine = [g for g in groups if g.algo == algo]
        width = 0.8 / len(mine)
        for g, group in enumerate(mine):
            rows = [next(r for r in bars if r["group"] == group.label and r["level"] == lv) for lv in levels]
            point = np.asarray([100 * r["point"] for r in rows])
            err = np.asarray([[100 * (r["point"] - r["low"]) for r in rows],
                              [100 * (r["high"] - r["point"]) for r in rows]])
            colour, dashes = styles[group.label]
            ax.bar(centres - 0.4 + (g + 0.5) * width, point, width, yerr=np.maximum(err, 0), capsize=2,
                   color=colour, hatch=hatches[dashes], edgecolor="white", label=_condition(group))
        for i, level in enumerate(levels):
            if floor and level in floor:
                ax.hlines(100 * floor[level], i - 0.45, i + 0.45, colors="black", linestyles="--", linewidth=1.2,
                          label="random policy" if i == 0 else None)
        ax.set_xticks(centres, list(levels))
        ax.set_ylabel(f"{algo}\nfinal success (%)")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{title}\n{name} success rate (%) at the last evaluation", fontsize="medium")
    fig.tight_layout()
    return fig


def protocol_figure(rows: Sequence[Mapping[str, Any]], levels: Sequence[str], env: str | None, name: str) -> Any:
    """The three-way comparison of :func:`imaginejax.bench.report.protocol_rows`: one panel per level with rows, a
    tick per algorithm (and hyperparameters, ratio) and its conditions' bars centred on the tick.

    Only the conditions present are drawn (the train level has real only). A panel's width follows its
    widest group of bars, so every bar in the figure is equally wide.
    """
    colours = {"real": "#7f7f7f", "imaginary": "#1f77b4", "oracle": "#2ca02c"}
    panels: dict[str, dict[tuple, list]] = {}  # level -> tick (algo, hp, ratio) -> its rows, in CONDITIONS order
    for r in sorted(rows, key=lambda r: list(CONDITIONS).index(r["condition"])):
        panels.setdefault(r["level"], {}).setdefault((r["algo"], r["hp"], r["ratio"]), []).append(r)
    levels = [lv for lv in levels if lv in panels]
    several_ratios = len({r["ratio"] for r in rows}) > 1
    # A tick's slot holds its level's widest group of bars, and at least two bar widths for the tick label.
    slots = [max(2, *map(len, panels[lv].values())) for lv in levels]
    widths = [len(panels[lv]) * slot for lv, slot in zip(levels, slots)]
    fig, axes = _subplots(1, len(levels), sharey=True, layout="constrained", figsize=(0.6 * sum(widths) + 1.2, 4.0),
                          gridspec_kw={"width_ratios": widths})
    for ax, level, slot in zip(axes[0], levels, slots):
        width = 0.8 / slot
        for tick, cell in enumerate(panels[level].values()):
            for i, r in enumerate(cell):
                ax.bar(tick + (i - (len(cell) - 1) / 2) * width, 100 * r["point"], width,
                       yerr=[[100 * max(r["point"] - r["low"], 0)], [100 * max(r["high"] - r["point"], 0)]],
                       capsize=2, color=colours[r["condition"]], label=CONDITIONS[r["condition"]])
        ax.set_xticks(range(len(panels[level])), [algo + (f"\n{hp}" if hp else "") + (f"\nratio {ratio:g}" if
                                                  several_ratios else "") for algo, hp, ratio in panels[level]])
        ax.set_xlim(-0.5, len(panels[level]) - 0.5)
        ax.set_title(level)
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel(f"{name} success rate (%)")
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_legend_handles_labels()[0]}
    order = [label for label in CONDITIONS.values() if label in handles]
    fig.legend([handles[label] for label in order], order, loc="outside lower center", ncol=len(order), fontsize=FONT)
    seeds = "/".join(str(n) for n in sorted({r["n"] for r in rows}))
    last = "/".join(str(k) for k in sorted({r["evaluations"] for r in rows}))
    steps = "/".join(f"{s:,}" for s in sorted({r["step"] for r in rows}))
    fig.suptitle(f"{env + ': ' if env else ''}success per level, {' / '.join(order)} ({name}, 95 % CI)\n"
                 f"{name} over {seeds} seeds of each run's mean over its last {last} evaluations ({steps} updates), "
                 "stratified-bootstrap intervals", fontsize="medium")
    return fig


PERCENT = ("point", "low", "high", "mean")


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rates written in percent, their columns named ``<key>_pct``, like every table and figure."""
    rows = [{(f"{k}_pct" if k in PERCENT else k): (100 * v if k in PERCENT else v) for k, v in r.items()} for r in rows]
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _save(fig: Any, path: Path) -> None:
    """Writes ``fig`` at :data:`DPI` and closes it."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def write_figures(results: Results, out_dir: str | os.PathLike[str], *, statistic: str = "iqm", reps: int = 2000,
                  seed: int = 0, last: int = 5, env: str | None = None,
                  floor: Mapping[str, float] | None = None) -> dict[str, Path]:
    """Writes the learning curves, the bar chart, their CSV data and the plain results table.

    Args:
      results: the runs (groups of seeds are plotted; non-finite runs left out).
      out_dir: created if needed; files are replaced atomically.
      statistic: ``"iqm"`` or ``"mean"`` over seeds.
      reps, seed: bootstrap replicates and seed of the 95 % intervals.
      last: evaluations averaged per run in the three-way comparison.
      env: the environment, named in the titles (None: not named).
      floor: level -> the random policy's success rate in [0, 1], drawn on the bar chart (None: not drawn).

    Returns:
      name -> path of every file written (``curves``, ``curves_csv``, ``bars``, ``bars_csv``, ``results``,
      and ``protocol`` / ``protocol_csv`` for sweeps with named data sources).
    """
    try:
        import matplotlib
    except ImportError:
        from imaginejax.training.progress import MissingDependency

        raise MissingDependency("figures need matplotlib, which is not installed: pip install 'imaginejax[figures]' "
                                "(or pip install matplotlib), or skip them with --no-figures / "
                                "--set report.figures=false") from None
    matplotlib.use("Agg", force=False)

    groups, levels = results.groups(), results.levels
    if not groups:
        raise ValueError("no groups to plot: every run is non-finite or no sweep was found")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = "IQM" if statistic == "iqm" else "mean"
    title = _title(results, groups, env, name)
    written = {"curves_csv": out / "curves.csv", "curves": out / "curves.png", "bars_csv": out / "bars.csv",
               "bars": out / "bars.png"}

    curves = curve_rows(groups, levels, statistic, reps, seed)
    _write_csv(written["curves_csv"], curves)
    _save(curves_figure(curves, groups, levels, title, name), written["curves"])
    bars = final_rows(groups, levels, statistic, reps, seed)
    _write_csv(written["bars_csv"], bars)
    _save(bars_figure(bars, groups, levels, title, name, floor), written["bars"])

    protocol = protocol_rows(groups, levels, statistic, reps, seed, last)
    if protocol:
        _write_csv(out / "protocol.csv", protocol)
        written["protocol_csv"] = out / "protocol.csv"
        _save(protocol_figure(protocol, levels, env, name), out / "protocol.png")
        written["protocol"] = out / "protocol.png"

    write_text(out / "results.md", table(results, statistic, reps, seed, three_way=False) + "\n")
    written["results"] = out / "results.md"
    return written
