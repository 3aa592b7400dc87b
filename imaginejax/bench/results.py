"""The results of sweeps: one object, built in memory by training and read back from disk the same.

A :class:`Results` holds every run of every algorithm (its algorithm, seed, ratio, data source,
hyperparameters, success and return at each evaluation, per-task success at the last one, whether it
stayed finite), each sweep's metadata (what ``sweep.json`` records besides the runs) and the data
sources' summaries (``sources.json`` of a workspace). :func:`from_sweep` builds it from a trained
:class:`~imaginejax.training.sweep.SweepResult`; :func:`load_sweep` reads it from a sweep directory or a
workspace, and gives back exactly what :func:`from_sweep` built (``load_sweep(dir) == results``).

On disk, a sweep directory holds ``sweep.json`` (:func:`imaginejax.training.sweep.run_sweep`), ``metrics.jsonl``
(:mod:`imaginejax.core.runlog`) and ``task_success.json`` (:func:`save_task_success`); a workspace holds
``runs/<algorithm>/`` sweep directories and ``sources.json``. A sweep still running is read up to the
last evaluation every run has reached.

:meth:`Results.groups` splits the runs into groups of seeds (one algorithm and configuration each), what
:mod:`imaginejax.bench.report` and :mod:`imaginejax.bench.figures` compute statistics over. Outside equality, a result
knows where each algorithm's trained states are (in memory after training, the final checkpoints of a
workspace read back), so :meth:`Results.policy` gives any run's :class:`~imaginejax.bench.policy.Policy`, the run
picked by its fields with :func:`find_run`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from imaginejax.core.files import RETRAIN, fields_of, read_json, write_json
from imaginejax.core.runlog import MetricsLog

if TYPE_CHECKING:
    from imaginejax.algos.base import Spec
    from imaginejax.algos.networks import NetConfig
    from imaginejax.training.sweep import SweepResult

SWEEP_FILE = "sweep.json"
TASK_SUCCESS_FILE = "task_success.json"
SOURCES_FILE = "sources.json"
# How to recover each record when it is damaged: training rewrites all three.
@dataclasses.dataclass(frozen=True)
class Run:
    """One trained run (values as plain Python numbers, so results compare with ``==``).

    Attributes:
      algo: algorithm registry name.
      run, config, seed, ratio, hp, data: its row of the sweep table (:class:`~imaginejax.training.sweep.RunSpec`).
      steps: (I,) gradient updates at each evaluation.
      success, returns: level -> (I,) success rate and mean return at each evaluation.
      task_success: level -> (K,) success on each task at the last evaluation (empty when not recorded).
      finite: False when the run went non-finite and was frozen.
    """

    algo: str
    run: int
    config: int
    seed: int
    ratio: float
    hp: dict[str, float]
    data: str
    steps: tuple[int, ...]
    success: dict[str, tuple[float, ...]]
    returns: dict[str, tuple[float, ...]]
    task_success: dict[str, tuple[float, ...]]
    finite: bool


@dataclasses.dataclass(frozen=True)
class Group:
    """The finite runs of one algorithm and configuration (they differ only in seed).

    Attributes:
      label: display name, e.g. ``"bc, imaginary/easy 0.5"``.
      algo, data, ratio: as in :class:`Run`.
      hp: the hyperparameters that vary within the sweep, as text (``""`` when none).
      steps: (I,) gradient updates at each evaluation.
      success: level -> (I, n) success of each of the n runs at each evaluation.
    """

    label: str
    algo: str
    steps: np.ndarray
    success: dict[str, np.ndarray]
    data: str = ""
    ratio: float = 0.0
    hp: str = ""


@dataclasses.dataclass(frozen=True)
class TrainedRuns:
    """The trained states of one algorithm's runs, with what rebuilds its algorithm record.

    Attributes:
      env: environment registry name.
      spec, net, options: the algorithm's interface, network (None: reference) and static options.
      states: the algorithm states with a leading axis over ``runs``.
      runs: the global run index of each row of ``states``.
      source: where they come from (``"memory"`` or a checkpoint path).
    """

    env: str
    spec: Spec
    net: NetConfig | None
    options: dict[str, Any]
    states: Any
    runs: tuple[int, ...]
    source: str = "memory"

    def row(self, run: int) -> int:
        """The row of ``states`` that holds global run ``run``."""
        return self.runs.index(run)


@dataclasses.dataclass(frozen=True)
class Results:
    """Every run of one or more sweeps.

    Attributes:
      runs: in sweep order (algorithms in order, each sweep's runs in table order).
      levels: the evaluated levels, in evaluation order.
      tasks: level -> each task's first instruction (empty when not recorded).
      sweeps: algorithm -> its ``sweep.json`` record without the run table (plan, engine settings, ...).
      sources: data source name (``"imaginary/easy"``) -> its summary (trajectories, quality, filters).
      trained: algorithm -> its :class:`TrainedRuns` (in memory) or its sweep directory (read from the
        final checkpoint when a policy is asked for); not part of equality.
    """

    runs: tuple[Run, ...]
    levels: tuple[str, ...]
    tasks: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    sweeps: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    sources: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    trained: dict[str, TrainedRuns | Path] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def groups(self) -> list[Group]:
        """Groups of finite runs in sweep order, then configuration order (empty groups dropped)."""
        out = []
        for algo in dict.fromkeys(r.algo for r in self.runs):
            mine = [r for r in self.runs if r.algo == algo]
            labels, hp = _config_labels(mine), _hp_labels(mine)
            for config in sorted({r.config for r in mine}):
                rows = [r for r in mine if r.config == config]
                members = [r for r in rows if r.finite]
                if not members:
                    continue
                success = {lv: np.asarray([r.success[lv] for r in members], np.float64).T for lv in self.levels}
                out.append(Group(label=f"{algo}, {labels[config]}", algo=algo, steps=np.asarray(rows[0].steps),
                                 success=success, data=rows[0].data, ratio=rows[0].ratio, hp=hp[config]))
        return out

    def quality(self) -> dict[str, dict[str, Any]]:
        """level -> the quality summary of its imaginary data, where recorded."""
        return {name.split("/", 1)[1]: value["quality"] for name, value in self.sources.items()
                if name.startswith("imaginary/") and value.get("quality")}

    def merge(self, other: "Results") -> "Results":
        """The runs of both (``other``'s after these); the levels must agree."""
        if self.runs and other.runs and self.levels != other.levels:
            raise ValueError(f"sweeps evaluate levels {list(other.levels)} and {list(self.levels)}: report them "
                             "separately")
        return Results(runs=self.runs + other.runs, levels=self.levels or other.levels,
                       tasks={**self.tasks, **other.tasks}, sweeps={**self.sweeps, **other.sweeps},
                       sources={**self.sources, **other.sources}, trained={**self.trained, **other.trained})


def _hp_labels(runs: Sequence[Run]) -> dict[int, str]:
    """Configuration -> the hyperparameters that vary within the sweep (``""`` when none)."""
    varying = sorted({k for r in runs for k in r.hp if len({s.hp.get(k) for s in runs}) > 1})
    return {r.config: ", ".join(f"{k} {r.hp[k]:g}" for k in varying if k in r.hp) for r in runs}


def _config_labels(runs: Sequence[Run]) -> dict[int, str]:
    """Configuration -> its data source (``real only`` or ``<source> r``; ``ratio r`` for sweeps without
    named sources) and the hyperparameters that vary within the sweep."""
    hp, named = _hp_labels(runs), any(r.data for r in runs)
    labels = {}
    for r in runs:
        head = (f"{r.data} {r.ratio:g}" if r.data else "real only") if named else f"ratio {r.ratio:g}"
        labels[r.config] = ", ".join([head] + ([hp[r.config]] if hp[r.config] else []))
    return labels


# ---------------------------------------------------------------------------------------------------
# One run by its fields
# ---------------------------------------------------------------------------------------------------
REAL_ONLY = ("real", "real only", "")  # what names the real-only runs (data "" in a run table)
SELECTORS = ("algo", "seed", "ratio", "data", "hp")


def _selector(run: Run, field: str) -> str:
    """``field=value`` of ``run`` as it is passed to :func:`find_run` (real-only data as ``'real'``)."""
    value = getattr(run, field)
    if field == "ratio":
        return f"ratio={value:g}"
    if field == "data":
        return f"data={value or 'real'!r}"
    return f"{field}={value!r}"


def find_run(results: Results, algo: str | None = None, seed: int | None = None, ratio: float | None = None,
             data: str | None = None, hp: Mapping[str, float] | None = None) -> Run:
    """The one run of ``results`` that matches every given field; ``data`` is a source name
    (``"imaginary/easy"``) or real only (``"real"``, ``"real only"`` or ``""``).

    Raises:
      ValueError: no run or several runs match. For several, the message gives the values the matches
        differ in and the fewest fields that tell them apart; for none, every value each field takes.
    """
    wanted = "" if data in REAL_ONLY else data
    runs = [r for r in results.runs
            if (algo is None or r.algo == algo) and (seed is None or r.seed == seed)
            and (ratio is None or r.ratio == float(ratio)) and (data is None or r.data == wanted)
            and (hp is None or all(r.hp.get(k) == float(v) for k, v in hp.items()))]
    if len(runs) == 1:
        return runs[0]
    asked = ", ".join(f"{k}={v!r}" for k, v in dict(algo=algo, seed=seed, ratio=ratio, data=data, hp=hp).items()
                      if v is not None) or "no field given"
    if not results.runs:
        raise ValueError(f"0 runs match ({asked}): the results hold no runs")
    pool = runs or list(results.runs)
    values = {f: list(dict.fromkeys(_selector(r, f) for r in pool)) for f in SELECTORS}
    if values["hp"] == ["hp={}"]:
        del values["hp"]
    if not runs:
        raise ValueError(f"0 runs match ({asked}); the runs have "
                         + "; ".join(" or ".join(v) for v in values.values()))
    differ = [f for f in values if len(values[f]) > 1]
    fewest = next((list(names) for n in range(1, len(differ) + 1) for names in itertools.combinations(differ, n)
                   if len({tuple(_selector(r, f) for f in names) for r in runs}) == len(runs)), None)
    if fewest is None:
        raise ValueError(f"{len(runs)} runs match ({asked}) and agree in every field (runs "
                         f"{', '.join(str(r.run) for r in runs)}): the results hold the same run more than once")
    flags = ", ".join(f"--{f}" for f in fewest if f != "hp")
    raise ValueError(f"{len(runs)} runs match ({asked}), differing in "
                     + "; ".join(" or ".join(values[f]) for f in differ)
                     + f": name one by adding {' and '.join(fewest)}"
                     + (f" (imaginejax export: {flags})" if flags else ""))


def _floats(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(values).ravel())


# ---------------------------------------------------------------------------------------------------
# In memory
# ---------------------------------------------------------------------------------------------------
def from_sweep(algo: str, sweep: SweepResult, tasks: Mapping[str, Sequence[str]] | None = None,
               sources: Mapping[str, Mapping[str, Any]] | None = None) -> Results:
    """The results of a trained sweep.

    Args:
      algo: the algorithm's registry name.
      sweep: the sweep result.
      tasks: level -> task names (:func:`task_names`).
      sources: data source name -> summary (a workspace's ``sources.json``).
    """
    result = sweep.result
    levels = tuple(result.success)
    steps = tuple(int(s) for s in result.steps)
    runs = tuple(
        Run(algo=algo, run=spec.run, config=spec.config, seed=spec.seed, ratio=spec.ratio, hp=dict(spec.hp),
            data=spec.data, steps=steps,
            success={lv: _floats(result.success[lv][:, i]) for lv in levels},
            returns={lv: _floats(result.returns[lv][:, i]) for lv in levels},
            task_success={lv: _floats(result.task_success[lv][i]) for lv in levels} if tasks else {},
            finite=bool(result.finite[i]))
        for i, spec in enumerate(sweep.sweep.table))
    return Results(runs=runs, levels=levels, tasks={lv: tuple(t) for lv, t in (tasks or {}).items()},
                   sweeps={algo: json.loads(json.dumps(sweep.meta))},
                   sources=json.loads(json.dumps(dict(sources or {}))))


def task_names(eval_levels: Mapping[str, tuple[Any, Any]]) -> dict[str, list[str]]:
    """level -> each task's first instruction, from the evaluated environments."""
    out = {}
    for level, (env, params) in eval_levels.items():
        strings = env.instructions(level)
        out[level] = [strings[int(m)] for m in np.asarray(params.phrasing_ids)[:, 0]]
    return out


def save_task_success(run_dir: str | os.PathLike[str], results: Results) -> None:
    """``run_dir/task_success.json``: per level the task names and every run's success on each task at
    the last evaluation (``runs`` × ``tasks``, rows in sweep order)."""
    levels = {lv: {"tasks": list(results.tasks[lv]), "success": [list(r.task_success[lv]) for r in results.runs]}
              for lv in results.levels}
    write_json(Path(run_dir) / TASK_SUCCESS_FILE, {"runs": [r.run for r in results.runs], "levels": levels})


# ---------------------------------------------------------------------------------------------------
# From disk
# ---------------------------------------------------------------------------------------------------
def find_sweeps(path: str | os.PathLike[str]) -> list[Path]:
    """Sweep directories under ``path``: itself if it holds ``sweep.json``, else ``runs/*/`` that do.

    Raises:
      FileNotFoundError: no sweep found (the message says what was looked for).
    """
    path = Path(path)
    if (path / SWEEP_FILE).is_file():
        return [path]
    found = sorted(p.parent for p in path.glob(f"runs/*/{SWEEP_FILE}"))
    if not found:
        raise FileNotFoundError(f"no sweep in {path}: expected {path / SWEEP_FILE} or "
                                f"{path / 'runs' / '<algorithm>' / SWEEP_FILE} (written by imaginejax train / bench)")
    return found


class NoRecordsYet(ValueError):
    """A sweep has not finished the first interval of every run (nothing to report yet)."""


def _number(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _load_one(sweep_dir: Path) -> Results:
    record = read_json(sweep_dir / SWEEP_FILE, RETRAIN)
    with fields_of(sweep_dir / SWEEP_FILE, RETRAIN):
        table = [dict(run=int(row["run"]), config=int(row["config"]), seed=int(row["seed"]), ratio=float(row["ratio"]),
                      hp={str(k): float(v) for k, v in row["hp"].items()}, data=str(row.get("data", "")))
                 for row in record.pop("runs")]
    algo = sweep_dir.name if sweep_dir.parent.name == "runs" else str(record.get("algo", sweep_dir.name))
    records = MetricsLog(sweep_dir).records()
    if not records:
        raise NoRecordsYet(f"{sweep_dir / 'metrics.jsonl'} has no records yet: wait for the first interval")
    levels = tuple(k.split("/", 1)[1] for k in records[0] if k.startswith("success/"))
    by_run: dict[int, dict[int, dict[str, Any]]] = {}
    for r in records:
        by_run.setdefault(int(r["run"]), {})[int(r["interval"])] = r
    common = min(len(by_run.get(row["run"], {})) for row in table)
    if common == 0:
        raise NoRecordsYet(f"{sweep_dir}: some runs have no metrics yet; wait for the first interval of every chunk")
    intervals = range(1, common + 1)
    task_file = sweep_dir / TASK_SUCCESS_FILE
    saved = read_json(task_file, RETRAIN) if task_file.is_file() else {"runs": [], "levels": {}}
    with fields_of(task_file, RETRAIN):
        row_of = {int(run): i for i, run in enumerate(saved["runs"])}
        tasks = {str(lv): tuple(map(str, v["tasks"])) for lv, v in saved["levels"].items()}
        per_task = {lv: [tuple(map(float, v["success"][i])) for i in row_of.values()] for lv, v in saved["levels"].items()}
    runs = []
    for row in table:
        mine = [by_run[row["run"]][i] for i in intervals]
        i = row_of.get(row["run"])
        runs.append(Run(
            algo=algo, **row, steps=tuple(int(m["step"]) for m in mine),
            success={lv: tuple(_number(m[f"success/{lv}"]) for m in mine) for lv in levels},
            returns={lv: tuple(_number(m[f"return/{lv}"]) for m in mine) for lv in levels},
            task_success={} if i is None else {lv: v[i] for lv, v in per_task.items()},
            finite=bool(mine[-1]["finite"])))
    return Results(runs=tuple(runs), levels=levels, tasks=tasks, sweeps={algo: record}, trained={algo: sweep_dir})


def load_sweep(path: str | os.PathLike[str]) -> Results:
    """The results of a sweep directory, or of every sweep of a workspace with its ``sources.json``. A
    workspace's sweep that has not finished its first interval (an algorithm still compiling, or stopped
    early) is left out with a warning naming it, so the finished algorithms can be reported.

    Raises:
      FileNotFoundError: no sweep under ``path``.
      NoRecordsYet: the sweep, or every sweep of the workspace, has no metrics yet.
      ValueError: sweeps disagree on the levels.
    """
    results = Results(runs=(), levels=())
    sweeps = find_sweeps(path)
    waiting: list[NoRecordsYet] = []
    for sweep_dir in sweeps:
        try:
            results = results.merge(_load_one(sweep_dir))
        except NoRecordsYet as error:
            waiting.append(error)
    if len(waiting) == len(sweeps):
        raise waiting[0]
    for error in waiting:
        warnings.warn(f"left out, not finished: {error}", RuntimeWarning, stacklevel=2)
    sources = Path(path) / SOURCES_FILE
    if sources.is_file():
        results = dataclasses.replace(results, sources=read_json(sources, RETRAIN))
    return results
