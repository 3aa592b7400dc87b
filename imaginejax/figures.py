"""Figures and the results table of one or more sweeps: learning curves and per-level bar charts.

Input: sweep run directories, each holding ``sweep.json`` (the run table written by
:func:`imaginejax.sweep.run_sweep`) and ``metrics.jsonl`` (:mod:`imaginejax.runlog`). A directory
given to :func:`find_sweeps` is either such a sweep directory or a workspace of the ``imaginejax``
command whose ``runs/<algorithm>/`` sub-directories are.

Runs are grouped by (algorithm, configuration): runs of a group differ only in their seed. Runs frozen as
non-finite (``finite`` false at their last logged interval) are left out, as in :mod:`imaginejax.report`.
For every group, level and evaluation the point estimate (IQM by default, or the mean) over seeds and
its stratified-bootstrap 95 % interval come from :mod:`imaginejax.stats`.

Output (:func:`write_figures`), everything under one directory:

* ``curves-<level>.png`` — success rate (%) against gradient updates, one line per group with its 95 %
  band; ``curves.csv`` — the plotted numbers (group, level, step, n, point, low, high, mean);
* ``bars.png`` — final success rate per level, one bar per group with its 95 % interval;
  ``bars.csv`` — the plotted numbers;
* ``results.md`` — the markdown table of :func:`imaginejax.stats.results_table` (final evaluation).

Plots use matplotlib's non-interactive Agg backend (no display needed); matplotlib is imported only here.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from imaginejax.runlog import MetricsLog
from imaginejax.stats import iqm, mean, results_table, stratified_bootstrap_ci

STATISTICS = {"iqm": iqm, "mean": mean}


@dataclasses.dataclass(frozen=True)
class GroupCurves:
    """Success rates of one group of runs (one algorithm and configuration, several seeds).

    Attributes:
      label: display name, e.g. ``"bc, ratio 0.5"``.
      algo: algorithm name.
      steps: (I,) gradient updates at each evaluation.
      success: level -> (I, n) success rate of each of the group's n finite runs at each evaluation.
    """

    label: str
    algo: str
    steps: np.ndarray
    success: dict[str, np.ndarray]


def find_sweeps(path: str | os.PathLike[str]) -> list[Path]:
    """Sweep directories under ``path``: itself if it holds ``sweep.json``, else ``runs/*/`` that do.

    Raises:
      FileNotFoundError: no sweep found (the message says what was looked for).
    """
    path = Path(path)
    if (path / "sweep.json").is_file():
        return [path]
    found = sorted(p.parent for p in path.glob("runs/*/sweep.json"))
    if not found:
        raise FileNotFoundError(f"no sweep in {path}: expected {path / 'sweep.json'} or "
                                f"{path / 'runs' / '<algorithm>' / 'sweep.json'} (written by imaginejax train / bench)")
    return found


def _algo_name(sweep_dir: Path, record: dict[str, Any]) -> str:
    """The registry name for a workspace's ``runs/<name>``, else the name recorded by the engine."""
    return sweep_dir.name if sweep_dir.parent.name == "runs" else str(record.get("algo", sweep_dir.name))


def _config_labels(table: list[dict[str, Any]]) -> dict[int, str]:
    """Configuration index -> ``ratio r`` plus the hyperparameters that vary within the sweep."""
    varying = sorted({k for row in table for k in row["hp"]
                      if len({r["hp"].get(k) for r in table}) > 1})
    labels = {}
    for row in table:
        parts = [f"ratio {row['ratio']:g}"] + [f"{k} {row['hp'][k]:g}" for k in varying if k in row["hp"]]
        labels[row["config"]] = ", ".join(parts)
    return labels


def load_curves(sweep_dirs: Sequence[str | os.PathLike[str]]) -> tuple[list[GroupCurves], list[str]]:
    """Reads sweeps into per-group learning curves.

    Args:
      sweep_dirs: sweep directories (see :func:`find_sweeps`).

    Returns:
      (groups, levels): groups in sweep order then configuration order; levels in logged order. Only
      evaluations every run of the sweep has reached are kept (a running sweep shows its common prefix).

    Raises:
      ValueError: a sweep has no metrics yet, or sweeps disagree on the levels.
    """
    groups: list[GroupCurves] = []
    levels: list[str] | None = None
    for sweep_dir in map(Path, sweep_dirs):
        sweep = json.loads((sweep_dir / "sweep.json").read_text())
        records = MetricsLog(sweep_dir).records()
        if not records:
            raise ValueError(f"{sweep_dir / 'metrics.jsonl'} has no records yet: wait for the first interval")
        found = [k.split("/", 1)[1] for k in records[0] if k.startswith("success/")]
        if levels is None:
            levels = found
        elif found != levels:
            raise ValueError(f"{sweep_dir} evaluates levels {found}, other sweeps {levels}: report them separately")
        table = sweep["runs"]
        by_run: dict[int, dict[int, dict[str, Any]]] = {}
        for r in records:
            by_run.setdefault(int(r["run"]), {})[int(r["interval"])] = r
        runs = [row["run"] for row in table]
        common = min(len(by_run.get(run, {})) for run in runs)
        if common == 0:
            raise ValueError(f"{sweep_dir}: some runs have no metrics yet; wait for the first interval of every chunk")
        intervals = list(range(1, common + 1))
        steps = np.asarray([by_run[runs[0]][i]["step"] for i in intervals], np.int64)
        finite = {run: bool(by_run[run][intervals[-1]]["finite"]) for run in runs}
        algo = _algo_name(sweep_dir, sweep)
        labels = _config_labels(table)
        for config in sorted({row["config"] for row in table}):
            members = [row["run"] for row in table if row["config"] == config and finite[row["run"]]]
            if not members:
                continue
            success = {lv: np.asarray([[by_run[run][i][f"success/{lv}"] for run in members] for i in intervals],
                                      np.float64) for lv in levels}
            groups.append(GroupCurves(label=f"{algo}, {labels[config]}", algo=algo, steps=steps, success=success))
    return groups, list(levels or [])


def curve_rows(groups: Sequence[GroupCurves], levels: Sequence[str], statistic: str = "iqm",
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


def final_rows(groups: Sequence[GroupCurves], levels: Sequence[str], statistic: str = "iqm",
               reps: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
    """Like :func:`curve_rows` for the last evaluation only (what the bar chart shows)."""
    last = [dataclasses.replace(g, steps=g.steps[-1:], success={lv: v[-1:] for lv, v in g.success.items()})
            for g in groups]
    return curve_rows(last, levels, statistic, reps, seed)


def table(groups: Sequence[GroupCurves], levels: Sequence[str], statistic: str = "iqm", reps: int = 2000,
          seed: int = 0) -> str:
    """Markdown results table of the final evaluation (:func:`imaginejax.stats.results_table`)."""
    final = {g.label: {lv: g.success[lv][-1] for lv in levels} for g in groups}
    steps = sorted({int(g.steps[-1]) for g in groups})
    text = results_table(final, levels, statistic=STATISTICS[statistic], reps=reps, seed=seed)
    return text + f"\nSuccess rate (%) at the last evaluation ({', '.join(map(str, steps))} updates)."


def _styles(groups: Sequence[GroupCurves]) -> dict[str, tuple[Any, str, str]]:
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


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def _save(fig: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    tmp.replace(path)


def write_figures(groups: Sequence[GroupCurves], levels: Sequence[str], out_dir: str | os.PathLike[str], *,
                  statistic: str = "iqm", reps: int = 2000, seed: int = 0) -> dict[str, Path]:
    """Writes the learning curves, the bar chart, their CSV data and the results table.

    Args:
      groups, levels: from :func:`load_curves`.
      out_dir: created if needed; files are replaced atomically.
      statistic: ``"iqm"`` or ``"mean"`` over seeds.
      reps, seed: bootstrap replicates and seed of the 95 % intervals.

    Returns:
      name -> path of every file written (``curves-<level>``, ``curves_csv``, ``bars``, ``bars_csv``,
      ``results``).
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

    text = table(groups, levels, statistic, reps, seed)
    tmp = out / ".results.md.tmp"
    tmp.write_text(text + "\n")
    tmp.replace(out / "results.md")
    written["results"] = out / "results.md"
    return written
