"""The results tables of :class:`~imaginejax.results.Results`: one function, :func:`table`, for every caller.

* **Three-way table** (sweeps whose runs name their data source, the reference protocol): per
  algorithm and level, real only / real + imaginary / real + oracle side by side. A run's score is its
  success averaged over its last ``last`` evaluations; a cell is the statistic over seeds with its
  stratified-bootstrap 95 % interval (:func:`protocol_rows`); ↑ / ↓ mark a mixed condition whose interval
  lies wholly above / below real only's. Level L compares the real-only runs with the runs that mixed in
  L's own data (``imaginary/L``, ``oracle/L``, or the ``…/pooled`` buffer).
* **Plain table**: one row per algorithm and configuration, one column per level, at the last
  evaluation (:func:`imaginejax.stats.results_table`).

Runs frozen as non-finite are left out (:meth:`~imaginejax.results.Results.groups`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from imaginejax.results import Group, Results
from imaginejax.stats import iqm, mean, results_table, stratified_bootstrap_ci

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


def protocol_rows(groups: Sequence[Group], levels: Sequence[str], statistic: str = "iqm", reps: int = 2000,
                  seed: int = 0, last: int = 5) -> list[dict[str, Any]]:
    """The three-way comparison: per algorithm (and swept hyperparameters and ratio), level and data
    condition, the statistic over seeds of each run's mean success over its last ``last`` evaluations.

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
    """Markdown of :func:`protocol_rows`: a line per algorithm and level, the three conditions side by side
    and, beside each novel level, its imaginary data's quality (level -> summary of
    :func:`~imaginejax.imaginer.quality.summarize`)."""
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
