"""Sweep definitions: seeds × numeric hyperparameters × data sources × real/imaginary ratios, flattened
to a run axis.

A :class:`Sweep` is either a *grid* (the Cartesian product of value lists) or a *list* of explicit runs.
Either way it flattens to R runs with a table ``run index -> (seed, hyperparameter values, data, ratio)``;
``data`` names the imaginary source a run mixes into its batches (``""``: none, real data only; e.g.
``"imaginary/easy"``, ``"oracle/easy"``). :meth:`Sweep.build` turns it into what the engine takes: keys
(R, 2), the algorithm's hp pytree with a leading R axis, ratios (R,), source indices (R,) into
:attr:`Sweep.data_names`. Hyperparameters are named by their path in the hp pytree (``learning_rate``,
``alpha``; nested fields would be joined by dots); only scalar leaves can be swept, the others
are broadcast from the base hp.

Conventions:

* Grid order: ratio, then the hyperparameters in the order given, then the seed *innermost*, so the
  seeds of one configuration are contiguous and share a ``config`` index (what statistics group over).
* A run's key is ``PRNGKey(seed)``: runs that differ only in hyperparameters or ratio share their
  randomness (initialisation, minibatch indices), common random numbers that sharpen comparisons.

:func:`run_sweep` estimates memory before anything is compiled (:meth:`Trainer.memory_estimate`),
picks the largest chunk of runs that fits the budget on every device, and trains the chunks one after
another (results concatenated in run order). What chunking does not bound — every run's final state,
table row and results, held on the host until the sweep ends — is checked against the host's available
memory first (:func:`check_host_memory`, from :meth:`Sweep.grid_size` before a table is built).

Across processes (:mod:`imaginejax.core.distributed`): every process calls :func:`run_sweep` with the same
sweep and datasets; their digests are compared before anything compiles, the memory budget is the
smallest of the processes', only the writer (process 0) writes ``run_dir``, and every process returns
the same result, its state gathered to host arrays.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from imaginejax.core import distributed
from imaginejax.core.files import write_json
from imaginejax.data.budget import available_memory
from imaginejax.data.types import Transitions
from imaginejax.training.kernel import MemoryEstimate, TrainResult, default_mesh
from imaginejax.training.loop import Trainer

PyTree = Any


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One row of a sweep table.

    Attributes:
      run: index on the run axis.
      config: index of the configuration (hyperparameters + ratio); runs differing only in seed share it.
      seed: the run's seed (its key is ``PRNGKey(seed)``).
      ratio: imaginary fraction of each batch.
      hp: swept hyperparameter name -> value.
      data: the imaginary source mixed in (``""``: none).
    """

    run: int
    config: int
    seed: int
    ratio: float
    hp: dict[str, float]
    data: str = ""


@dataclasses.dataclass(frozen=True)
class SweepArrays:
    """A sweep as engine inputs: keys (R, 2) uint32, hp pytree with leading R, ratios (R,) float32,
    sources (R,) int32 (index into :attr:`Sweep.data_names`; 0 for runs without a source)."""

    keys: np.ndarray
    hp: PyTree
    ratios: np.ndarray
    sources: np.ndarray


@dataclasses.dataclass(frozen=True)
class Sweep:
    """R runs; build with :meth:`grid` or :meth:`from_runs`. ``table`` lists them in run order."""

    table: tuple[RunSpec, ...]

    @classmethod
    def grid(cls, seeds: Sequence[int] | int, ratios: Sequence[float] = (0.0,),
             hp: Mapping[str, Sequence[float]] | None = None, data: Sequence[str] | None = None) -> "Sweep":
        """The Cartesian product data × ratios × hp values × seeds (seed innermost).

        With ``data`` given, a run without a source (``""``) has ratio 0 whatever ``ratios`` says, and a run
        with a source a ratio > 0 (ratio 0 with a source would be real-only training again), so e.g.
        ``data=("", "imaginary/easy"), ratios=(0.0, 0.5)`` gives real-only runs and 50/50 runs. Without
        ``data`` every ratio is swept over one imaginary buffer (the engine's single ``imag``).

        Args:
          seeds: seed values, or an int n for seeds 0..n-1.
          ratios: imaginary fractions in [0, 1].
          hp: hyperparameter name -> values (each list non-empty).
          data: imaginary source names (``""``: none); None: one unnamed buffer.
        """
        seeds = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
        hp = dict(hp or {})
        if not seeds:
            raise ValueError("a sweep needs at least one seed")
        for name, values in hp.items():
            if len(values) == 0:
                raise ValueError(f"hyperparameter {name!r} has no values")
        names = list(hp)
        table, run, config = [], 0, 0
        for source in ("",) if data is None else data:
            for ratio in (ratios if data is None else [0.0] if not source else [r for r in ratios if r > 0]):
                for values in itertools.product(*(hp[n] for n in names)):
                    for seed in seeds:
                        table.append(RunSpec(run=run, config=config, seed=seed, ratio=float(ratio),
                                             hp={n: float(v) for n, v in zip(names, values)}, data=str(source)))
                        run += 1
                    config += 1
        return cls(_checked(table))

    @staticmethod
    def grid_size(seeds: Sequence[int] | int, ratios: Sequence[float] = (0.0,),
                  hp: Mapping[str, Sequence[float]] | None = None, data: Sequence[str] | None = None) -> int:
        """R of :meth:`grid` with the same arguments, counted without building the table."""
        per_config = seeds if isinstance(seeds, int) else len(seeds)
        for values in (hp or {}).values():
            per_config *= len(values)
        if data is None:
            return per_config * len(ratios)
        positive = sum(r > 0 for r in ratios)
        return per_config * sum(1 if not source else positive for source in data)

    @classmethod
    def from_runs(cls, runs: Sequence[Mapping[str, float]]) -> "Sweep":
        """An explicit list: each entry has ``seed``, optionally ``ratio`` (default 0), ``data`` (default
        ``""``) and hp values.

        Runs with equal (data, ratio, hp values) share a ``config`` index, numbered in order of appearance.
        """
        table, configs = [], {}
        for run, entry in enumerate(runs):
            entry = dict(entry)
            if "seed" not in entry:
                raise ValueError(f"run {run} has no 'seed': every run of a list sweep needs one")
            seed, ratio = int(entry.pop("seed")), float(entry.pop("ratio", 0.0))
            data = str(entry.pop("data", ""))
            values = {k: float(v) for k, v in entry.items()}
            config = configs.setdefault((data, ratio, tuple(sorted(values.items()))), len(configs))
            table.append(RunSpec(run=run, config=config, seed=seed, ratio=ratio, hp=values, data=data))
        return cls(_checked(table))

    @property
    def num_runs(self) -> int:
        """R."""
        return len(self.table)

    @property
    def data_names(self) -> tuple[str, ...]:
        """The imaginary sources the runs mix in, in order of first appearance (``""`` excluded)."""
        return tuple(dict.fromkeys(spec.data for spec in self.table if spec.data))

    def build(self, base_hp: PyTree) -> SweepArrays:
        """Engine inputs for this sweep.

        Args:
          base_hp: the algorithm's hp for ONE run (e.g. ``algo.default_hp(spec)``); swept names must be
            scalar leaves of it, the other leaves are repeated R times.

        Returns:
          :class:`SweepArrays` (keys (R, 2) uint32, hp with leading R in the leaves' dtypes, ratios (R,)).
        """
        leaves = hp_leaves(base_hp)
        swept = sorted({name for spec in self.table for name in spec.hp})
        for name in swept:
            if name not in leaves:
                close = difflib.get_close_matches(name, list(leaves), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ValueError(f"{name!r} is not a hyperparameter of this algorithm; {hint}its hp has: "
                                 f"{', '.join(leaves)}")
            if np.ndim(leaves[name]) != 0:
                raise ValueError(f"hyperparameter {name!r} has shape {np.shape(leaves[name])}: only scalar "
                                 "hyperparameters can be swept")
        flat, treedef = jax.tree_util.tree_flatten_with_path(base_hp)
        columns = []
        for path, leaf in flat:
            name = _path_name(path)
            leaf = np.asarray(leaf)
            if name in swept:
                values = np.asarray([spec.hp.get(name, leaf.item()) for spec in self.table])
                cast = values.astype(leaf.dtype)
                if np.issubdtype(leaf.dtype, np.integer) and not np.array_equal(cast, values):
                    raise ValueError(f"hyperparameter {name!r} is an integer ({leaf.dtype}); got non-integer "
                                     f"values {values[cast != values].tolist()}")
                columns.append(cast)
            else:
                columns.append(np.broadcast_to(leaf, (self.num_runs,) + leaf.shape).copy())
        hp = jax.tree_util.tree_unflatten(treedef, columns)
        keys = _keys([spec.seed for spec in self.table])
        ratios = np.asarray([spec.ratio for spec in self.table], np.float32)
        index = {name: i for i, name in enumerate(self.data_names)}
        sources = np.asarray([index.get(spec.data, 0) for spec in self.table], np.int32)
        return SweepArrays(keys=keys, hp=hp, ratios=ratios, sources=sources)

    def to_json(self) -> list[dict[str, Any]]:
        """The table as JSON-ready records."""
        return [dataclasses.asdict(spec) for spec in self.table]


def _keys(seeds: Sequence[int]) -> np.ndarray:
    """(R, 2) uint32 ``PRNGKey(seed)`` of every seed: one vmapped call (R calls took 20 s per 80,000 runs)."""
    seeds = np.asarray(seeds)
    if seeds.size and np.iinfo(np.int32).min <= seeds.min() and seeds.max() <= np.iinfo(np.int32).max:
        return np.asarray(jax.vmap(jax.random.PRNGKey)(seeds.astype(np.int32))).astype(np.uint32)
    return np.stack([np.asarray(jax.random.PRNGKey(int(s))) for s in seeds.tolist()]).astype(np.uint32)


def _checked(table: list[RunSpec]) -> tuple[RunSpec, ...]:
    if not table:
        raise ValueError("the sweep is empty")
    for spec in table:
        if not 0.0 <= spec.ratio <= 1.0:
            raise ValueError(f"run {spec.run}: ratio must be in [0, 1], got {spec.ratio}")
        if not spec.data and spec.ratio > 0 and any(s.data for s in table):
            raise ValueError(f"run {spec.run}: ratio {spec.ratio} but no data source, while other runs name one: "
                             "give every run that mixes imaginary data its 'data'")
    return tuple(table)


def _path_name(path: tuple) -> str:
    parts = []
    for entry in path:
        for attr in ("name", "key", "idx"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
    return ".".join(parts)


def hp_leaves(hp: PyTree) -> dict[str, np.ndarray]:
    """Name (dotted pytree path) -> leaf of an hp pytree, e.g. ``{'learning_rate': array(1e-3)}``."""
    return {_path_name(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(hp)[0]}


# ---------------------------------------------------------------------------------------------------
# Memory and chunking
# ---------------------------------------------------------------------------------------------------
def default_memory_budget() -> int:
    """Usable bytes per device: 80 % of an accelerator's limit, or half the host's available RAM on CPU."""
    device = jax.local_devices()[0]  # another process's devices have no statistics here
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return int(0.8 * stats["bytes_limit"])
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        available = 8 << 30
    return int(0.5 * available / max(1, jax.local_device_count()))


class SweepMemoryError(MemoryError, ValueError):
    """A sweep that cannot fit in memory, refused before it allocates (the message gives the numbers)."""


# Host bytes of one run besides its state: the table row (~240 B measured), its JSON (~85 B), its results
# and hp columns; plus per interval and level its success and return (Python floats in Results).
ROW_BYTES, INTERVAL_LEVEL_BYTES = 1024, 96


def host_bytes_per_run(state: PyTree, num_intervals: int, num_levels: int) -> int:
    """Host bytes one run holds until its sweep ends, whatever the chunking: ``state`` (one run's, arrays or
    ``jax.ShapeDtypeStruct``) + :data:`ROW_BYTES` + :data:`INTERVAL_LEVEL_BYTES` × intervals × levels."""
    nbytes = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(state))
    return nbytes + ROW_BYTES + INTERVAL_LEVEL_BYTES * num_intervals * num_levels


def check_host_memory(num_runs: int, per_run: int, what: str, fix: str, available: int | None = None) -> None:
    """Refuses ``num_runs`` runs of ``per_run`` host bytes (:func:`host_bytes_per_run`) when they exceed the
    host's available memory (``available``; None: :func:`~imaginejax.data.budget.available_memory`), or half
    of it on a CPU, where training takes the other half (:func:`default_memory_budget`).

    Raises:
      SweepMemoryError: naming ``what`` (the runs, e.g. the setting that makes them), the estimate and ``fix``.
    """
    available = available_memory() if available is None else int(available)
    cpu = jax.default_backend() == "cpu"
    if num_runs * per_run > (available // 2 if cpu else available):
        share = (f"more than half of the {_mib(available)} available (training takes the other half on a CPU)"
                 if cpu else f"more than the {_mib(available)} available")
        raise SweepMemoryError(f"{what}: {num_runs:,} runs would hold ~{_mib(num_runs * per_run)} of host memory "
                               f"whatever the chunking ({per_run / 1024:,.1f} KiB per run: its final state, table row "
                               f"and results), {share}: {fix}")


def plan_chunks(num_runs: int, estimate: MemoryEstimate, budget: int, num_devices: int) -> int:
    """Largest number of runs per chunk whose estimate fits ``budget`` bytes on each device.

    Args:
      num_runs: R.
      estimate: per-run and shared bytes (:meth:`Trainer.memory_estimate`).
      budget: bytes available per device.
      num_devices: D, devices the run axis is laid on.

    Returns:
      runs per chunk: R when everything fits, else a multiple of D (each device's share fits).

    Raises:
      SweepMemoryError: not even one run per device fits (the message gives the numbers).
    """
    per_device = (budget - estimate.shared) // max(estimate.per_run, 1)
    if per_device < 1:
        raise SweepMemoryError(f"one run needs ~{_mib(estimate.total(1))} (datasets {_mib(estimate.shared)}, "
                          f"{_mib(estimate.per_run)} per run) but the budget is {_mib(budget)} per device: "
                          "lower batch_size / eval_episodes / network widths, or raise memory_budget")
    return int(min(num_runs, per_device * num_devices))


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


# ---------------------------------------------------------------------------------------------------
# Running a sweep
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class SweepResult:
    """A trained sweep: its table, the engine's result (run axis in table order), the plan used and
    ``meta``, what ``sweep.json`` records besides the table (plan, devices, budget, engine, algorithm)."""

    sweep: Sweep
    result: TrainResult
    runs_per_chunk: int
    estimate: MemoryEstimate
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


def run_sweep(trainer: Trainer, sweep: Sweep, base_hp: PyTree, real: Transitions,
              imag: Transitions | Mapping[str, Transitions] | None = None, *, memory_budget: int | None = None, mesh: Any = "auto",
              run_dir: str | os.PathLike[str] | None = None,
              log: Callable[[str], None] | None = None, **train_kwargs: Any) -> SweepResult:
    """Trains every run of ``sweep``, chunked to fit ``memory_budget``.

    Args:
      trainer: from :func:`imaginejax.training.loop.make_train`.
      sweep: the runs.
      base_hp: hp of one run; swept values override it (:meth:`Sweep.build`).
      real: the real transitions.
      imag: one imaginary buffer (every run with ratio > 0 mixes it in), a mapping from each of
        :attr:`Sweep.data_names` to its buffer, or None (every ratio must be 0).
      memory_budget: bytes per device (None: :func:`default_memory_budget`).
      mesh: as :meth:`Trainer.train`.
      run_dir: metrics (JSONL, CSV) and ``sweep.json`` (the table and plan) go here; None: nowhere.
      log: progress sink (None: stderr).
      **train_kwargs: passed to :meth:`Trainer.train` (checkpoint_dir, checkpoint_every, resume, ...).

    Returns:
      A :class:`SweepResult`.

    Raises:
      SweepMemoryError: the runs' host memory (:func:`check_host_memory`) or one run's device memory
        (:func:`plan_chunks`) does not fit.
    """
    if isinstance(imag, Mapping):
        missing = [name for name in sweep.data_names if name not in imag]
        if missing:
            raise ValueError(f"the sweep's runs mix in {', '.join(missing)} but imag has only "
                             f"{', '.join(imag) or 'nothing'}")
        imag = [imag[name] for name in sweep.data_names] or None
    state = trainer.state_shape(base_hp, real)
    check_host_memory(sweep.num_runs, host_bytes_per_run(state, trainer.config.num_intervals, len(trainer.levels)),
                      "the sweep", "train fewer runs per call (seeds, hyperparameter values, data sources)")
    arrays = sweep.build(base_hp)
    estimate = trainer.memory_estimate(base_hp, real, imag)
    resolved = default_mesh() if mesh == "auto" else mesh
    num_devices = 1 if resolved is None else int(resolved.devices.size)
    budget = default_memory_budget() if memory_budget is None else int(memory_budget)
    many = jax.process_count() > 1
    if many:
        budget = distributed.smallest(budget)  # every process must cut the same chunks
        distributed.check_same(_inputs(trainer, sweep, arrays, real, imag))
    chunk = plan_chunks(sweep.num_runs, estimate, budget, num_devices)
    if log is None:
        log = lambda s: print(s, flush=True, file=sys.stderr)
    log(f"sweep: {sweep.num_runs} runs on {num_devices} device(s)"
        + (f" of {jax.process_count()} processes" if many else "")
        + f"; estimated {_mib(estimate.per_run)} per run + "
        f"{_mib(estimate.shared)} shared, budget {_mib(budget)} per device -> "
        f"{-(-sweep.num_runs // chunk)} chunk(s) of <= {chunk} runs")
    meta = {"runs_per_chunk": chunk, "devices": num_devices, "processes": jax.process_count(),
            "estimate": dataclasses.asdict(estimate), "budget": budget, "engine": dataclasses.asdict(trainer.config),
            "algo": trainer.algo.name}
    writes = run_dir is not None and distributed.is_writer()
    if writes:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        write_json(Path(run_dir) / "sweep.json", {"runs": sweep.to_json(), **meta})
    result = trainer.train(arrays.keys, arrays.hp, real, imag, arrays.ratios, log=log, mesh=resolved,
                           runs_per_chunk=chunk, run_dir=run_dir if writes else None, source=arrays.sources,
                           **train_kwargs)
    if many:
        result = dataclasses.replace(result, state=distributed.gather(result.state))
    return SweepResult(sweep=sweep, result=result, runs_per_chunk=chunk, estimate=estimate, meta=meta)


def _inputs(trainer: Trainer, sweep: Sweep, arrays: SweepArrays, real: Transitions,
            imag: Sequence[Transitions] | Transitions | None) -> dict[str, str]:
    """Digests of everything a process feeds the engine, by what a mismatch message should call it."""
    parts = {"sweep table": repr(sweep.to_json()),
             "algorithm and engine settings": repr((trainer.algo.name, trainer.spec, trainer.config, trainer.levels)),
             "hyperparameters": distributed.digest(arrays.hp),
             "evaluation levels": distributed.digest(trainer.eval_params),
             "real data": distributed.digest(real)}
    sources = [] if imag is None else [imag] if isinstance(imag, Transitions) else list(imag)
    names = sweep.data_names or ("imag",)
    parts.update({f"imaginary data {names[i] if i < len(names) else i}": distributed.digest(buffer)
                  for i, buffer in enumerate(sources)})
    return parts
