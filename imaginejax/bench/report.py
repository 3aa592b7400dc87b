"""The results tables of :class:`~imaginejax.bench.results.Results`: one function, :func:`table`, for every caller.

* **Three-way table** (sweeps whose runs name their data source, the reference protocol): per
  algorithm and level, real only / real + imaginary / real + oracle side by side. A run's score is its
  success averaged over its last ``last`` evaluations; a cell is the statistic over seeds with its
  stratified-bootstrap 95 % interval (:func:`protocol_rows`); ↑ / ↓ mark a mixed condition whose interval
  lies wholly above / below real only's. Level L compares the real-only runs with the runs that mixed in
  L's own data (``imaginary/L``, ``oracle/L``, or the ``…/pooled`` buffer).
* **Plain table**: one row per algorithm and configuration, one column per level, at the last
  evaluation (:func:`imaginejax.bench.stats.results_table`).
* **Three-way table over environments** (:func:`aggregate`, one workspace per environment): a cell is the
  statistic over the (seeds, environments) matrix of run scores with the environments as the bootstrap's
  strata; it exists only where every environment has that algorithm, level and condition. Both three-way
  tables read the runs of a cell with :func:`cell_runs`.

Runs frozen as non-finite are left out (:meth:`~imaginejax.bench.results.Results.groups`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from imaginejax.bench.results import Group, Results
from imaginejax.bench.stats import iqm, mean, results_table, stratified_bootstrap_ci

STATISTICS = {"iqm": iqm, "mean": mean}
CONDITIONS = {"real": "real only", "imaginary": "real + imaginary", "oracle": "real + oracle"}


def table(results: Results, statistic: str = "iqm", reps: int = 2000, seed: int = 0, last: int = 5, *,
          three_way: bool = True, plain: bool = True) -> str:
    """The markdown results: the three-way table (when asked for and runs name their data sources),
    then the plain table (when asked for, or when there is no three-way table).

    Args:
      results: the runs.
      statistic: ``"iqm"`` or ``"mean"`` over seeds.
      reps, seed: bootstrap replicates and seed of the 95 % intervals.
      last: evaluations averaged per run in the three-way table.
      three_way, plain: which tables.

    Raises:
      ValueError: every run is non-finite.
    """
    groups = results.groups()
    if not groups:
        raise ValueError("every run is non-finite: nothing to report")
    rows = protocol_rows(groups, results.levels, statistic, reps, seed, last) if three_way else []
    parts = [protocol_table(rows, statistic, results.quality(), reps)] if rows else []
    if plain or not parts:
        parts.append(plain_table(groups, results.levels, statistic, reps, seed))
    return "\n\nEvery configuration on every level (last evaluation):\n\n".join(parts)


def plain_table(groups: Sequence[Group], levels: Sequence[str], statistic: str = "iqm", reps: int = 2000,
                seed: int = 0) -> str:
    """Markdown table of the last evaluation: a row per group, a column per level and one for all."""
    final = {g.label: {lv: g.success[lv][-1] for lv in levels} for g in groups}
    steps = sorted({int(g.steps[-1]) for g in groups})
    text = results_table(final, levels, statistic=STATISTICS[statistic], reps=reps, seed=seed)
    return text + f"\nSuccess rate (%) at the last evaluation ({', '.join(map(str, steps))} updates)."


Key = tuple[str, str, float, str, str]  # algo, hp, ratio, level, condition


@dataclasses.dataclass(frozen=True)
class CellRuns:
    """The runs of one three-way cell.

    Attributes:
      scores: (n,) each run's mean success over its last ``evaluations`` evaluations.
      evaluations: k, the evaluations averaged (``last``, or all when fewer).
      step: gradient updates at the last evaluation.
    """

    scores: np.ndarray
    evaluations: int
    step: int


def cell_runs(groups: Sequence[Group], levels: Sequence[str], last: int = 5) -> dict[Key, CellRuns]:
    """Per algorithm (and swept hyperparameters and ratio), level and data condition, its runs' scores.

    Level L pairs the real-only group with the groups that mixed in L's own data (``imaginary/L``,
    ``oracle/L``) or the pooled buffer; the train level has real only. Empty when no group names a data
    source.
    """
    if not any(g.data for g in groups):
        return {}
    cells = {}
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
                    cells[(algo, hp, ratio, level, condition)] = CellRuns(
                        scores=group.success[level][-k:].mean(0), evaluations=k, step=int(group.steps[-1]))
    return cells


def protocol_rows(groups: Sequence[Group], levels: Sequence[str], statistic: str = "iqm", reps: int = 2000,
                  seed: int = 0, last: int = 5) -> list[dict[str, Any]]:
    """The three-way comparison: per cell of :func:`cell_runs`, the statistic over seeds of the run scores.

    Returns:
      Dicts with keys algo, hp, ratio, level, condition, n, evaluations, step, point, low, high, mean
      (rates in [0, 1]); empty when no group names a data source.
    """
    stat = STATISTICS[statistic]
    rows = []
    for (algo, hp, ratio, level, condition), cell in cell_runs(groups, levels, last).items():
        ci = stratified_bootstrap_ci(cell.scores, stat, reps=reps, seed=seed)
        rows.append({"algo": algo, "hp": hp, "ratio": ratio, "level": level, "condition": condition,
                     "n": int(cell.scores.size), "evaluations": cell.evaluations, "step": cell.step,
                     "point": ci.point, "low": ci.low, "high": ci.high, "mean": float(cell.scores.mean())})
    return rows


def _quality_cell(summary: Mapping[str, Any] | None) -> str:
    if not summary:
        return "—"
    cell = f"{100 * summary['goal_consistency']:.1f} / {100 * summary['consistent_and_legal_rate']:.1f}"
    exceeds = summary.get("exceeds_dynamics_rate")
    return cell + (f" / {100 * exceeds:.1f}" if exceeds is not None else " / —")


def _label(algo: str, hp: str, ratio: float, several_ratios: bool) -> str:
    return algo + (f" ({hp})" if hp else "") + (f", ratio {ratio:g}" if several_ratios else "")


def _three_way_lines(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """Per algorithm and level of ``rows``: its label, the level and each condition's cell text ("—" where
    there is no row or its point is None; ↑ / ↓ where the interval lies wholly above / below real only's)."""
    keys = list(dict.fromkeys((r["algo"], r["hp"], r["ratio"], r["level"]) for r in rows))
    several_ratios = len({r["ratio"] for r in rows}) > 1
    lines = []
    for algo, hp, ratio, level in keys:
        cells = {r["condition"]: r for r in rows if (r["algo"], r["hp"], r["ratio"], r["level"]) == (algo, hp, ratio, level)}
        base = cells.get("real")
        texts = []
        for condition in CONDITIONS:
            r = cells.get(condition)
            if r is None or r["point"] is None:
                texts.append("—")
                continue
            mark = ""
            if base is not None and base["point"] is not None and condition != "real":
                mark = " ↑" if r["low"] > base["high"] else " ↓" if r["high"] < base["low"] else ""
            texts.append(f"{100 * r['point']:.1f} [{100 * r['low']:.1f}, {100 * r['high']:.1f}]{mark}")
        lines.append((_label(algo, hp, ratio, several_ratios), level, texts))
    return lines


def protocol_table(rows: Sequence[Mapping[str, Any]], statistic: str = "iqm",
                   quality: Mapping[str, Mapping[str, Any]] | None = None, reps: int = 2000) -> str:
    """Markdown of :func:`protocol_rows`: a line per algorithm and level, the three conditions side by side
    and, beside each novel level, its imaginary data's quality (level -> summary of
    :func:`~imaginejax.imaginer.quality.summarize`)."""
    name = "IQM" if statistic == "iqm" else "mean"
    head = ("| algorithm | level | " + " | ".join(CONDITIONS.values()) + " | imaginary data: reaches goal / "
            "consistent & legal / steps exceeding dynamics (%) |\n|---|---|" + "---:|" * len(CONDITIONS) + "---:|")
    lines = [head]
    for label, level, texts in _three_way_lines(rows):
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


# ---------------------------------------------------------------------------------------------------
# Over environments
# ---------------------------------------------------------------------------------------------------
def aggregate_rows(envs: Mapping[str, Results], statistic: str = "iqm", reps: int = 2000, seed: int = 0,
                   last: int = 5) -> list[dict[str, Any]]:
    """The three-way comparison over environments: per cell of :func:`cell_runs` that every environment
    has, the statistic over the (n, E) matrix of run scores, the E environments as the bootstrap's strata.

    Environments with different seed counts give each cell the first n runs of every environment, n the
    smallest count.

    Args:
      envs: environment name -> its results (one workspace each).

    Returns:
      Dicts with :func:`protocol_rows`' keys, where n is the seeds per environment and evaluations, step
      and seeds (the runs before cutting to n) map environment -> value, plus lacking: the environments
      without the cell (then point, low, high and mean are None).

    Raises:
      ValueError: an environment's runs are all non-finite or name no data source.
    """
    stat = STATISTICS[statistic]
    per_env = {}
    for env, results in envs.items():
        groups = results.groups()
        if not groups:
            raise ValueError(f"every run of {env} is non-finite: nothing to aggregate")
        per_env[env] = cell_runs(groups, results.levels, last)
        if not per_env[env]:
            raise ValueError(f"no run of {env} names a data source (real / imaginary / oracle): it has no "
                             "three-way table to aggregate; train it with imaginejax bench")
    rows = []
    for key in dict.fromkeys(k for cells in per_env.values() for k in cells):
        algo, hp, ratio, level, condition = key
        row: dict[str, Any] = {"algo": algo, "hp": hp, "ratio": ratio, "level": level, "condition": condition}
        lacking = tuple(env for env, cells in per_env.items() if key not in cells)
        if lacking:
            rows.append(row | {"lacking": lacking, "n": 0, "evaluations": {}, "step": {}, "seeds": {},
                               "point": None, "low": None, "high": None, "mean": None})
            continue
        cells = {env: per_env[env][key] for env in envs}
        n = min(c.scores.size for c in cells.values())
        scores = np.stack([c.scores[:n] for c in cells.values()], axis=1)  # (n, E)
        ci = stratified_bootstrap_ci(scores, stat, reps=reps, seed=seed)
        rows.append(row | {"lacking": (), "n": n, "evaluations": {e: c.evaluations for e, c in cells.items()},
                           "step": {e: c.step for e, c in cells.items()},
                           "seeds": {e: int(c.scores.size) for e, c in cells.items()},
                           "point": ci.point, "low": ci.low, "high": ci.high, "mean": float(scores.mean())})
    return rows


def aggregate_table(rows: Sequence[Mapping[str, Any]], origins: Mapping[str, str], statistic: str = "iqm",
                    reps: int = 2000) -> str:
    """Markdown of :func:`aggregate_rows`: a line per algorithm and level, the three conditions side by
    side; the notes say which environments lacked a "—" cell, where seed counts were cut, and where each
    environment came from (``origins``: environment -> its workspace)."""
    name = "IQM" if statistic == "iqm" else "mean"
    lines = ["| algorithm | level | " + " | ".join(CONDITIONS.values()) + " |\n|---|---|" + "---:|" * len(CONDITIONS)]
    lines += [f"| {label} | {level} | " + " | ".join(texts) + " |" for label, level, texts in _three_way_lines(rows)]
    present = [r for r in rows if not r["lacking"]]
    seeds = "/".join(str(n) for n in sorted({r["n"] for r in present})) or "no"
    notes = [f"Success rate (%) over {len(origins)} environments: {name} of each cell's (seed × environment) "
             f"matrix of run scores, {seeds} seeds per environment, a run's score being its mean success over "
             "its last evaluations [95 % stratified-bootstrap interval with the environments as strata, "
             f"{reps} replicates]; ↑ / ↓: interval wholly above / below real only's."]
    cut = sorted({(e, s, r["n"]) for r in present for e, s in r["seeds"].items() if s > r["n"]})
    if cut:
        notes.append("Environments ran different numbers of seeds: a cell takes the first n runs of every "
                     "environment, n the smallest count (" + ", ".join(f"{e} {s} → {n}" for e, s, n in cut) + ").")
    several_ratios = len({r["ratio"] for r in rows}) > 1
    labels = [_label(r["algo"], r["hp"], r["ratio"], several_ratios) for r in rows]
    missing: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for label, r in zip(labels, rows):
        if r["lacking"]:
            missing.setdefault((label, r["lacking"]), []).append(f"{r['level']} {CONDITIONS[r['condition']]}")
    if missing:
        notes.append("—: " + "; ".join(
            f"{label} {'has no runs' if len(cells) == labels.count(label) else 'has no ' + ', '.join(cells)} in "
            f"{', '.join(lacking)}" for (label, lacking), cells in missing.items()) + ".")
    where = []
    for env, origin in origins.items():
        evals = "/".join(str(k) for k in sorted({r["evaluations"][env] for r in present}))
        steps = "/".join(str(k) for k in sorted({r["step"][env] for r in present}))
        where.append(f"{env} ({origin}" + (f": last {evals} evaluations up to {steps} updates)" if present else ")"))
    notes.append("Environments: " + ", ".join(where) + ".")
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def aggregate(envs: Mapping[str, Results], origins: Mapping[str, str], statistic: str = "iqm", reps: int = 2000,
              seed: int = 0, last: int = 5) -> str:
    """The markdown three-way table over environments (:func:`aggregate_rows`, :func:`aggregate_table`).

    Args:
      envs: environment name -> its results.
      origins: environment name -> where its results came from (shown under the table).
      statistic, reps, seed, last: as in :func:`table`.
    """
    return aggregate_table(aggregate_rows(envs, statistic, reps, seed, last), origins, statistic, reps)
