"""Aggregate statistics over seeds: IQM, mean, stratified-bootstrap 95 % confidence intervals, tables.

Definitions (Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice"):

* **IQM**, the interquartile mean of n scores: sort them, drop ``floor(n/4)`` from each end, average
  the rest (what ``scipy.stats.trim_mean(x, 0.25)`` computes; with n = 4 the middle two).
* **Stratified bootstrap**: scores form a (runs, tasks) matrix; one bootstrap replicate resamples, with
  replacement, the runs *of each task column separately* (the tasks are the strata) and recomputes the
  statistic on the resampled matrix. The 95 % interval is the 2.5 and 97.5 percentiles of the replicates
  (percentile method). With one task it is the ordinary bootstrap over seeds.

The bootstrap is ``scipy.stats.bootstrap`` (scipy ships with jax) with one sample per task column and
``paired=False``, which resamples each column on its own: exactly the stratified bootstrap above, with the
percentile method and an explicit seed. ``rliable`` (1.2.0) computes the same statistics but pulls 22
packages (arch, statsmodels, pandas, seaborn, ...); the tests check ours against hand-computed cases and
``scipy.stats.trim_mean``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

Statistic = Callable[[np.ndarray], np.ndarray]  # (..., runs, tasks) -> (...)


def iqm(scores: np.ndarray) -> np.ndarray:
    """Interquartile mean over the last two axes.

    Args:
      scores: (..., runs, tasks); all runs × tasks values of a leading index are pooled.

    Returns:
      (...) the mean of the pooled values after dropping floor(n/4) from each end (n = runs × tasks).
    """
    scores = np.asarray(scores, np.float64)
    flat = np.sort(scores.reshape(scores.shape[:-2] + (-1,)), axis=-1)
    n = flat.shape[-1]
    cut = n // 4
    return flat[..., cut:n - cut].mean(-1)


def mean(scores: np.ndarray) -> np.ndarray:
    """Mean over the last two axes: (..., runs, tasks) -> (...)."""
    return np.asarray(scores, np.float64).mean(axis=(-2, -1))


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate with its 95 % (or other) confidence interval."""

    point: float
    low: float
    high: float

    def format(self, scale: float = 100.0, digits: int = 1) -> str:
        """E.g. ``'72.5 [65.0, 80.0]'`` (values × ``scale``)."""
        f = lambda v: f"{scale * v:.{digits}f}"
        return f"{f(self.point)} [{f(self.low)}, {f(self.high)}]"


def stratified_bootstrap_ci(scores: np.ndarray, statistic: Statistic = iqm, *, reps: int = 2000,
                            confidence: float = 0.95, seed: int = 0) -> Interval:
    """Point estimate and percentile confidence interval by the stratified bootstrap.

    Args:
      scores: (runs, tasks) or (runs,) (one task): e.g. final success of each seed on each level.
      statistic: maps (..., runs, tasks) -> (...); :func:`iqm` or :func:`mean`.
      reps: number of bootstrap replicates.
      confidence: coverage of the interval (0.95: the 2.5 and 97.5 percentiles).
      seed: NumPy generator seed (explicit, so intervals are reproducible).

    Returns:
      :class:`Interval` (point = statistic of the data, low / high = percentiles of the replicates).
    """
    scores = np.asarray(scores, np.float64)
    if scores.ndim == 1:
        scores = scores[:, None]
    if scores.ndim != 2 or scores.shape[0] < 1:
        raise ValueError(f"scores must be (runs, tasks) or (runs,), got shape {scores.shape}")
    if not np.isfinite(scores).all():
        raise ValueError("scores contain NaN or inf: drop non-finite runs first (TrainResult.finite)")
    point = float(statistic(scores[None])[0])
    if scores.shape[0] < 2 or np.ptp(scores, axis=0).max() == 0.0:
        # One seed, or every task's seeds agree: every replicate equals the data (scipy needs >= 2
        # observations per sample and warns on degenerate ones).
        return Interval(point=point, low=point, high=point)
    from scipy.stats import bootstrap

    def stratified(*columns: np.ndarray, axis: int = -1) -> np.ndarray:
        # columns: one (..., runs) resample per task -> (..., runs, tasks)
        return statistic(np.stack([np.moveaxis(c, axis, -1) for c in columns], axis=-1))

    result = bootstrap(tuple(scores.T), stratified, n_resamples=reps, confidence_level=confidence,
                       method="percentile", paired=False, vectorized=True,
                       random_state=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return Interval(point=point, low=float(low), high=float(high))


def results_table(groups: Mapping[str, Mapping[str, np.ndarray]], levels: Sequence[str], *,
                  statistic: Statistic = iqm, reps: int = 2000, seed: int = 0, scale: float = 100.0,
                  aggregate: bool = True) -> str:
    """Markdown table: one row per group (algorithm / configuration), one column per level.

    Each cell is ``IQM [low, high]`` (or the chosen statistic) over the group's seeds with a bootstrap
    95 % interval, plus the mean; the optional last column aggregates all levels with the levels as
    strata.

    Args:
      groups: row name -> level -> (seeds,) scores in [0, 1] (e.g. final success rates).
      levels: column order.
      statistic: :func:`iqm` (default) or :func:`mean`.
      reps, seed: bootstrap replicates and seed.
      scale: multiplier for display (100: percent).
      aggregate: add an "all levels" column (requires the same seeds on every level).

    Returns:
      The table as a markdown string.
    """
    name = "IQM" if statistic is iqm else getattr(statistic, "__name__", "statistic")
    columns = list(levels) + (["all levels"] if aggregate else [])
    head = ("| group | " + " | ".join(columns) + " |\n|---|" + "---:|" * len(columns) + "\n")
    rows = []
    for group, per_level in groups.items():
        cells = []
        for level in levels:
            s = np.asarray(per_level[level], np.float64)
            ci = stratified_bootstrap_ci(s, statistic, reps=reps, seed=seed)
            cells.append(f"{ci.format(scale)} (mean {scale * s.mean():.1f}, n={s.size})")
        if aggregate:
            matrix = np.stack([np.asarray(per_level[level], np.float64) for level in levels], axis=1)
            ci = stratified_bootstrap_ci(matrix, statistic, reps=reps, seed=seed)
            cells.append(f"{ci.format(scale)} (mean {scale * matrix.mean():.1f})")
        rows.append(f"| {group} | " + " | ".join(cells) + " |")
    note = (f"\n\n{name} over seeds, [95 % stratified-bootstrap interval, {reps} replicates]; "
            "the aggregate column treats levels as strata.")
    return head + "\n".join(rows) + note


def group_runs(configs: Sequence[int], scores: Mapping[str, np.ndarray], finite: np.ndarray | None = None,
               names: Mapping[int, str] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Splits per-run scores into per-configuration groups for :func:`results_table`.

    Args:
      configs: (R,) configuration index of each run (``RunSpec.config`` of a sweep table).
      scores: level -> (R,) scores (e.g. ``result.success[level][-1]``).
      finite: (R,) bool; runs frozen as non-finite are left out (None keeps all).
      names: configuration index -> row name (default ``"config <c>"``).

    Returns:
      row name -> level -> (seeds,) scores, configurations in increasing order.
    """
    configs = np.asarray(configs)
    keep = np.ones(configs.shape, bool) if finite is None else np.asarray(finite, bool)
    out: dict[str, dict[str, np.ndarray]] = {}
    for c in np.unique(configs):
        mask = (configs == c) & keep
        if not mask.any():
            continue
        label = (names or {}).get(int(c), f"config {int(c)}")
        out[label] = {level: np.asarray(v)[mask] for level, v in scores.items()}
    return out
