"""``imaginejax report RUN_DIR``: the statistics table of a finished (or running) sweep.

Reads ``sweep.json`` (the run table written by :func:`imaginejax.sweep.run_sweep`) and ``metrics.jsonl``
(:mod:`imaginejax.runlog`), takes each run's success rate at the last logged interval, groups runs by
configuration (runs differing only in seed), leaves out runs frozen as non-finite, and prints the
per-level markdown table of :func:`imaginejax.stats.results_table` (IQM and mean over seeds with
stratified-bootstrap 95 % intervals). ``--out`` also writes it to a file (atomically).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from imaginejax.files import write_text
from imaginejax.stats import group_runs, iqm, mean, results_table


def config_label(run: dict) -> str:
    """Row name of a configuration: its data source (or ratio) and swept hyperparameters."""
    data = run.get("data", "")
    head = f"{data} {run['ratio']:g}" if data else f"ratio {run['ratio']:g}"
    parts = [head] + [f"{k} {v:g}" for k, v in sorted(run["hp"].items())]
    return ", ".join(parts)


def report(run_dir: Path, statistic: str = "iqm", reps: int = 2000, seed: int = 0) -> str:
    """The markdown results table of the sweep in ``run_dir`` (see the module docstring)."""
    table = json.loads((run_dir / "sweep.json").read_text())["runs"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if not records:
        raise SystemExit(f"{run_dir / 'metrics.jsonl'} has no records yet")
    last = {}
    for r in records:
        if r["run"] not in last or r["interval"] >= last[r["run"]]["interval"]:
            last[r["run"]] = r
    missing = [row["run"] for row in table if row["run"] not in last]
    if missing:
        raise SystemExit(f"runs {missing} have no metrics yet in {run_dir}: wait for the sweep to finish")
    levels = [k.split("/", 1)[1] for k in records[0] if k.startswith("success/")]
    runs = [row["run"] for row in table]
    scores = {lv: np.asarray([last[r][f"success/{lv}"] for r in runs], np.float64) for lv in levels}
    finite = np.asarray([bool(last[r]["finite"]) for r in runs])
    names = {row["config"]: config_label(row) for row in table}
    groups = group_runs([row["config"] for row in table], scores, finite, names)
    interval = max(r["interval"] for r in last.values())
    text = results_table(groups, levels, statistic=iqm if statistic == "iqm" else mean, reps=reps, seed=seed)
    frozen = int((~finite).sum())
    note = f"\nSuccess rate (%) at interval {interval}" + (f"; {frozen} non-finite run(s) left out." if frozen else ".")
    return text + note


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="imaginejax report", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a sweep's run directory (holds sweep.json, metrics.jsonl)")
    parser.add_argument("--statistic", choices=("iqm", "mean"), default="iqm",
                        help="point estimate over seeds (default: interquartile mean)")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap replicates for the 95%% intervals")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (intervals are reproducible)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    text = report(args.run_dir, args.statistic, args.reps, args.seed)
    print(text)
    if args.out is not None:
        write_text(args.out, text + "\n")
    return text
