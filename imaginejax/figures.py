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
* ``results.md`` — the markdown table of :func:`imaginejax.stats.results_table` (final evaluation);
* ``protocol.png`` / ``protocol.csv`` — for sweeps of the reference protocol (runs naming their data
  source), per level the three data conditions side by side (:func:`protocol_rows`).

Plots use matplotlib's non-interactive Agg backend (no display needed); matplotlib is imported only here.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from imaginejax.files import atomic_path, write_text
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
      data: the imaginary source the runs mixed in (``""``: none or an unnamed buffer), e.g. ``"oracle/easy"``.
      ratio: the runs' imaginary fraction.
      hp: the swept hyperparameters that vary within the sweep, as text (``""`` when none).
    """

    label: str
    algo: str
    steps: np.ndarray
    success: dict[str, np.ndarray]
    data: str = ""
    ratio: float = 0.0
    hp: str = ""


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


def _hp_labels(table: list[dict[str, Any]]) -> dict[int, str]:
    """Configuration index -> the hyperparameters that vary within the sweep (``""`` when none)."""
    varying = sorted({k for row in table for k in row["hp"]
                      if len({r["hp"].get(k) for r in table}) > 1})
    return {row["config"]: ", ".join(f"{k} {row['hp'][k]:g}" for k in varying if k in row["hp"]) for row in table}


def _config_labels(table: list[dict[str, Any]]) -> dict[int, str]:
    """Configuration index -> its data source (``real only`` or ``<source> r``; ``ratio r`` for sweeps
    without named sources) plus the hyperparameters that vary within the sweep."""
    hp = _hp_labels(table)
    labels = {}
    for row in table:
        data = row.get("data", "")
        head = (f"{data} {row['ratio']:g}" if data else "real only") if any(r.get("data") for r in table) \
            else f"ratio {row['ratio']:g}"
        labels[row["config"]] = ", ".join([head] + ([hp[row["config"]]] if hp[row["config"]] else []))
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
        labels, hp = _config_labels(table), _hp_labels(table)
        for config in sorted({row["config"] for row in table}):
            rows = [row for row in table if row["config"] == config]
            members = [row["run"] for row in rows if finite[row["run"]]]
            if not members:
                continue
            success = {lv: np.asarray([[by_run[run][i][f"success/{lv}"] for run in members] for i in intervals],
                                      np.float64) for lv in levels}
            groups.append(GroupCurves(label=f"{algo}, {labels[config]}", algo=algo, steps=steps, success=success,
                                      data=rows[0].get("data", ""), ratio=float(rows[0]["ratio"]),
                                      hp=hp[config]))
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


CONDITIONS = {"real": "real only", "imaginary": "real + imaginary", "oracle": "real + oracle"}


def protocol_rows(groups: Sequence[GroupCurves], levels: Sequence[str], statistic: str = "iqm", reps: int = 2000,
                  seed: int = 0, last: int = 5) -> list[dict[str, Any]]:
    """The reference protocol's comparison: per algorithm (and swept hyperparameters and ratio), level and
    data condition, the statistic over seeds of each run's success averaged over its last ``last``
    evaluations, with its stratified-bootstrap 95 % interval.

    A level L compares the runs on real data only with the runs that mixed in L's own data
    (``imaginary/L``, ``oracle/L``, or the ``…/pooled`` buffer); ``train`` has the real-only runs alone.

    Returns:
      Dicts with keys algo, hp, ratio, level, condition, n, evaluations, step, point, low, high, mean
      (rates in [0, 1]); empty when no group names a data source.
    """
    stat = STATISTICS[statistic]
    if not any(g.data for g in groups):
        return []
    rows = []
    for algo, hp in dict.fromkeys((g.algo, g.hp) for g in groups):
        mine = [g for g in groups if g.algo == algo and g.hp == hp]
        real = [g for g in mine if not g.data]
        for ratio in sorted({g.ratio for g in mine if g.data}) or [0.0]:
            for level in levels:
                for condition in CONDITIONS:
                    if condition == "real":
                        found = real
                    elif level == "train":
                        continue
                    else:
                        found = [g for g in mine if g.ratio == ratio
                                 and g.data in (f"{condition}/{level}", f"{condition}/pooled")]
                    if not found:
                        continue
                    group = found[0]
                    k = min(last, len(group.steps))
                    scores = group.success[level][-k:].mean(0)
                    ci = stratified_bootstrap_ci(scores, stat, reps=reps, seed=seed)
                    rows.append({"algo": algo, "hp": hp, "ratio": ratio, "level": level, "condition": condition,
                                 "n": int(scores.size), "evaluations": k, "step": int(group.steps[-1]),
                                 "point": ci.point, "low": ci.low, "high": ci.high, "mean": float(scores.mean())})
    return rows


def _quality_cell(summary: Mapping[str, Any] | None) -> str:
    if not summary:
        return "—"
    cell = f"{100 * summary['goal_consistency']:.1f} / {100 * summary['consistent_and_legal_rate']:.1f}"
    exceeds = summary.get("exceeds_dynamics_rate")
    return cell + (f" / {100 * exceeds:.1f}" if exceeds is not None else " / —")


def protocol_table(rows: Sequence[Mapping[str, Any]], statistic: str = "iqm",
                   quality: Mapping[str, Mapping[str, Any]] | None = None, reps: int = 2000) -> str:
    """Markdown of :func:`protocol_rows`: one line per algorithm and level, the three conditions side by
    side; ↑ / ↓ mark a mixed condition whose 95 % interval lies wholly above / below real only's.

    Args:
      rows: from :func:`protocol_rows`.
      quality: level -> the imaginary data's quality summary
        (:func:`~imaginejax.imaginer.quality.summarize`), shown beside the level.
    """
    name = "IQM" if statistic == "iqm" else "mean"
    head = ("| algorithm | level | " + " | ".join(CONDITIONS.values()) + " | imaginary data: reaches goal / "
            "consistent & legal / steps exceeding dynamics (%) |\n|---|---|" + "---:|" * len(CONDITIONS) + "---:|")
    lines = [head]
    keys = list(dict.fromkeys((r["algo"], r["hp"], r["ratio"], r["level"]) for r in rows))
    several_ratios = len({r["ratio"] for r in rows}) > 1
    for algo, hp, ratio, level in keys:
        cells = {r["condition"]: r for r in rows if (r["algo"], r["hp"], r["ratio"], r["level"]) == (algo, hp, ratio, level)}
        base = cells.get("real")
        texts = []
        for condition in CONDITIONS:
            r = cells.get(condition)
            if r is None:
                texts.append("—")
                continue
            mark = ""
            if base is not None and condition != "real":
                mark = " ↑" if r["low"] > base["high"] else " ↓" if r["high"] < base["low"] else ""
            texts.append(f"{100 * r['point']:.1f} [{100 * r['low']:.1f}, {100 * r['high']:.1f}]{mark}")
        label = algo + (f" ({hp})" if hp else "") + (f", ratio {ratio:g}" if several_ratios else "")
        q = _quality_cell((quality or {}).get(level)) if level != "train" else ""
        lines.append(f"| {label} | {level} | " + " | ".join(texts) + f" | {q} |")
    seeds = sorted({r["n"] for r in rows})
    evals = sorted({r["evaluations"] for r in rows})
    steps = sorted({r["step"] for r in rows})
    return ("\n".join(lines) + f"\n\nSuccess rate (%): {name} over {'/'.join(map(str, seeds))} seeds of each run's mean "
            f"over its last {'/'.join(map(str, evals))} evaluations (up to {'/'.join(map(str, steps))} updates), "
            f"[95 % stratified-bootstrap interval, {reps} replicates]; every task of a level evaluated equally "
            "often. Each novel level's mixed runs drew that level's data only (the reference protocol) unless "
            "the sweep pooled them.")


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


def write_figures(groups: Sequence[GroupCurves], levels: Sequence[str], out_dir: str | os.PathLike[str], *,
                  statistic: str = "iqm", reps: int = 2000, seed: int = 0, last: int = 5) -> dict[str, Path]:
    """Writes the learning curves, the bar chart, their CSV data and the results table.

    Args:
      groups, levels: from :func:`load_curves`.
      out_dir: created if needed; files are replaced atomically.
      statistic: ``"iqm"`` or ``"mean"`` over seeds.
      reps, seed: bootstrap replicates and seed of the 95 % intervals.
      last: evaluations averaged per run in the protocol figure (:func:`protocol_rows`).

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

    text = table(groups, levels, statistic, reps, seed)
    write_text(out / "results.md", text + "\n")
    written["results"] = out / "results.md"
    return written
