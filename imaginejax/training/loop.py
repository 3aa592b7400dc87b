"""The host loop of the engine: plans chunks of runs, runs the compiled intervals, hands each to callbacks.

``make_train(algo, spec, config, eval_levels)`` returns a :class:`Trainer` (the compiled
:class:`~imaginejax.training.kernel.Kernel` plus this loop). :meth:`Trainer.plan` builds (no I/O) the compiled
functions and each chunk's padded, placed inputs; :meth:`Trainer.run_chunk` loops over intervals and hands
each to callbacks — :class:`Messages` (log lines, non-finite runs), :class:`MetricsFile` (the metrics log),
:class:`Checkpoints` — which :meth:`Trainer.train` wires up (ARCHITECTURE.md, "Training engine").

* **Chunking.** ``runs_per_chunk`` splits the run axis into chunks trained one after another (each for
  all intervals); results are concatenated in run order. :mod:`imaginejax.training.sweep` picks it from a
  memory estimate (:meth:`Trainer.memory_estimate`).
* **Resume.** With ``checkpoint_dir`` the whole state of the chunk being trained (run states with keys
  and optimiser states, interval index, history so far) is saved every ``checkpoint_every`` intervals
  and after the last one (:mod:`imaginejax.core.checkpoint`: atomic, checksummed, last N kept). With
  ``resume=True`` training continues from the newest checkpoint of each chunk; the continuation is the
  same compiled computation on the same state, so results are identical to an uninterrupted sweep.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from imaginejax.algos import checkpoint_name
from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import DataStats
from imaginejax.core.checkpoint import (CheckpointError, Interrupted, flatten_named, list_checkpoints, load_checkpoint,
                                        save_checkpoint, unflatten_named)
from imaginejax.core.runlog import MetricsLog
from imaginejax.data.transitions import placeholder_like
from imaginejax.data.types import Transitions
from imaginejax.training.evaluation import EvalResult
from imaginejax.training.kernel import (RUNS, EngineConfig, Kernel, RunState, TrainResult, default_mesh, place,
                                        stack_sources, take_runs, to_host)

PyTree = Any


@dataclasses.dataclass(frozen=True)
class IntervalEvent:
    """One interval of one chunk of runs, for monitors (``on_interval`` of :meth:`Trainer.train`).

    Attributes:
      chunk: index of the chunk of the run axis (0 when the sweep is not chunked).
      runs: the chunk's global run indices (R_c,).
      interval: intervals of this chunk now done (1-based count).
      num_intervals: N, intervals per run.
      step: gradient updates per run done (``interval * updates_per_interval``).
      seconds: wall clock of this interval (training + evaluation; the first includes compilation);
        0 for a restored interval.
      resumed: True for the one event sent after restoring a checkpoint (``interval`` intervals were done
        by an earlier process, nothing was trained now).
      message: the human-readable line the engine would otherwise send to ``log``.
    """

    chunk: int
    runs: tuple[int, ...]
    interval: int
    num_intervals: int
    step: int
    seconds: float
    resumed: bool
    message: str


class Trainer(Kernel):
    """Compiled training of R runs at once, with the host loop around it; see :func:`make_train`."""

    # -- the builder: a plan of compiled calls and placed inputs, no I/O ----------------------
    def plan(self, keys: jax.Array, hp: PyTree, real: Transitions,
             imag: Transitions | Sequence[Transitions] | None = None, ratio: jax.Array | float = 0.0, *,
             source: np.ndarray | None = None, mesh: Mesh | None | Literal["auto"] = "auto",
             runs_per_chunk: int | None = None) -> Plan:
        """Checks the inputs and prepares every chunk of runs for the compiled functions: the run axis
        split into chunks, each padded (copies of its last run) to a multiple of devices × ``run_block``,
        placed on the mesh and fingerprinted. Arguments as :meth:`train`."""
        keys = np.asarray(keys)
        if keys.ndim != 2 or keys.dtype != np.uint32:
            raise ValueError(f"keys must be (R, 2) uint32 raw PRNG keys (jax.random.split(PRNGKey(s), R)), "
                             f"got {keys.dtype}{list(keys.shape)}")
        num_runs = int(keys.shape[0])
        ratio = np.broadcast_to(np.asarray(ratio, np.float32), (num_runs,))
        if imag is None:
            if bool(np.any(ratio > 0)):
                raise ValueError("ratio > 0 needs imaginary data: pass imag=... or set ratio=0")
            # Never sampled at ratio 0 (sample_mixed draws round(0·B) = 0 rows from it); a one-row
            # placeholder rather than the real buffer again, so algorithms that read the datasets
            # themselves (``Datasets``) do not see the real data twice.
            imag = placeholder_like(real)
        imag, bounds = stack_sources(imag)
        source = np.zeros(num_runs, np.int64) if source is None else np.asarray(source)
        if source.shape != (num_runs,) or not np.issubdtype(source.dtype, np.integer) or (
                num_runs and (source.min() < 0 or source.max() >= len(bounds))):
            raise ValueError(f"source must be (R,) = ({num_runs},) integers in [0, {len(bounds)}) (one imaginary "
                             f"source per run), got {source.dtype}{list(source.shape)}")
        imag_rows = bounds[source]
        mesh = default_mesh() if mesh == "auto" else mesh
        num_devices = 1 if mesh is None else int(mesh.devices.size)
        size = num_runs if runs_per_chunk is None else int(runs_per_chunk)
        if size < 1:
            raise ValueError(f"runs_per_chunk must be >= 1, got {runs_per_chunk}")
        hp = jax.tree.map(np.asarray, hp)
        shared = place((real, imag, self.eval_params), None if mesh is None else NamedSharding(mesh, P()))
        stats = DataStats.from_transitions(shared[0])
        run_sharding = None if mesh is None else NamedSharding(mesh, P(RUNS))
        multiple = num_devices * (self.config.run_block or 1)
        chunks = []
        for c, start in enumerate(range(0, num_runs, size)):
            runs = np.arange(start, min(start + size, num_runs))
            padded = -(-len(runs) // multiple) * multiple
            index = np.concatenate([runs, np.full(padded - len(runs), runs[-1])])
            inputs = (keys[index], take_runs(hp, index), ratio[index], imag_rows[index])
            fingerprint = self._fingerprint(inputs[0], (inputs[1], stats), inputs[2], inputs[3], shared)
            chunks.append(Chunk(c, runs, padded, *place(inputs, run_sharding), fingerprint))
        init, interval = self._functions(mesh)
        return Plan(tuple(chunks), num_runs, shared, stats, run_sharding, init, interval)

    def _fingerprint(self, keys: np.ndarray, hp: PyTree, ratio: np.ndarray, imag_rows: np.ndarray,
                     shared: PyTree) -> str:
        """Hash of everything that determines a chunk's computation (to refuse a foreign checkpoint)."""
        digest = hashlib.sha256()
        digest.update(repr((checkpoint_name(self.algo), self.spec, self.config, self.levels)).encode())
        for leaf in [keys, ratio, imag_rows] + jax.tree.leaves(hp):
            digest.update(np.ascontiguousarray(leaf).tobytes())
        digest.update(repr([(x.shape, str(x.dtype)) for x in jax.tree.leaves(shared)]).encode())
        return digest.hexdigest()

    # -- the runner: intervals in a loop, everything else in callbacks -------------------------
    def run_chunk(self, plan: Plan, chunk: Chunk, callbacks: Sequence[Callback] = (),
                  restored: tuple[RunState, History] | None = None) -> TrainResult:
        """Trains one chunk from its start (or from ``restored``) to the last interval; after each
        interval every callback gets ``(chunk, state, history)``.

        Returns:
          The chunk's :class:`TrainResult` (padding removed).
        """
        cfg = self.config
        state, history = restored or (plan.init(chunk.keys, chunk.hp, plan.stats), History.empty(chunk.padded))
        for i in range(len(history.steps), cfg.num_intervals):
            start = time.perf_counter()
            state, metrics, results = plan.interval(state, chunk.hp, chunk.ratio, chunk.rows, *plan.shared)
            metrics, results, finite = to_host((metrics, results, state.finite))
            history.record((i + 1) * cfg.updates_per_interval, time.perf_counter() - start, metrics,
                           {lv: results[lv] for lv in self.levels}, finite)
            for callback in callbacks:
                callback.interval(chunk, state, history)
        return history.result(state, self.levels, len(chunk.runs))

    def restore(self, plan: Plan, chunk: Chunk, directory: Path) -> tuple[RunState, History, Path] | None:
        """The newest checkpoint of ``chunk`` in ``directory``: (state, history, its path), or None.

        Raises:
          CheckpointError: the checkpoint belongs to another sweep, or is damaged.
        """
        latest = list_checkpoints(directory)
        if not latest:
            return None
        path = latest[-1][1]
        manifest, arrays = load_checkpoint(path)
        if manifest["meta"].get("fingerprint") != chunk.fingerprint:
            raise CheckpointError(f"checkpoint {path} belongs to a different sweep (keys, hyperparameters, "
                                  "ratios, engine settings or data shapes differ): resume with the same "
                                  "sweep, or use a new checkpoint_dir")
        target = jax.eval_shape(plan.init, chunk.keys, chunk.hp, plan.stats)
        state = place(unflatten_named(arrays, target, "state", path), plan.run_sharding)
        return state, History.from_arrays(arrays, manifest["meta"], int(manifest["interval"])), path

    def train(self, keys: jax.Array, hp: PyTree, real: Transitions,
              imag: Transitions | Sequence[Transitions] | None = None, ratio: jax.Array | float = 0.0,
              log: Callable[[str], None] | None = lambda s: print(s, file=sys.stderr, flush=True),
              *, mesh: Mesh | None | Literal["auto"] = "auto", runs_per_chunk: int | None = None,
              checkpoint_dir: str | os.PathLike[str] | None = None, checkpoint_every: int = 1,
              keep_checkpoints: int = 2, resume: bool = False,
              run_dir: str | os.PathLike[str] | None = None,
              on_interval: Callable[[IntervalEvent], None] | None = None,
              source: np.ndarray | None = None) -> TrainResult:
        """Trains R runs for ``config.num_intervals`` intervals, evaluating after each.

        Args:
          keys: (R, 2) uint32 PRNG keys, one per run.
          hp: hyperparameter pytree with leading axis R (see :func:`broadcast_runs`).
          real: the real transitions (shared by all runs).
          imag: the imaginary transitions, or a sequence of C imaginary sources (each run mixes in the one
            ``source`` names); None means real data only (``ratio`` must then be 0).
          ratio: (R,) or scalar fraction of each batch drawn from ``imag``.
          log: progress sink (None silences).
          mesh: "auto" lays the run axis on every device when there are several (:func:`default_mesh`);
            None trains on the default device only; or an explicit 1-D mesh with axis ``'runs'``.
          runs_per_chunk: train the run axis in chunks of this many runs, one after another (None: one
            chunk). Chosen from a memory budget by :func:`imaginejax.training.sweep.run_sweep`.
          checkpoint_dir: where to checkpoint (one sub-directory per chunk); None: no checkpoints.
          checkpoint_every: K, checkpoint after every K-th interval (and after the last).
          keep_checkpoints: N most recent checkpoints kept per chunk.
          resume: continue from the newest checkpoints in ``checkpoint_dir``. Without it a non-empty
            ``checkpoint_dir`` is refused, so a finished sweep is never silently overwritten.
          run_dir: where ``metrics.jsonl`` / ``metrics.csv`` go (:mod:`imaginejax.core.runlog`); None: nowhere.
          on_interval: receives an :class:`IntervalEvent` after every interval of every chunk (and one
            with ``resumed=True`` per restored chunk). When given, the per-interval line goes to it
            (``event.message``) instead of ``log``, so a monitor that renders intervals itself (e.g.
            :class:`imaginejax.training.progress.IntervalProgress`) is not sent them twice; other lines (resume,
            non-finite runs) still go to ``log``.
          source: (R,) int, each run's imaginary source in ``imag`` (None: source 0 for every run).

        Returns:
          A :class:`TrainResult` over the R runs in their order.
        """
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        if checkpoint_dir is not None and not resume and any(Path(checkpoint_dir).glob("chunk-*/step-*")):
            raise CheckpointError(f"checkpoint_dir {checkpoint_dir} already holds checkpoints: pass resume=True "
                                  "to continue that sweep, or choose an empty directory")
        plan = self.plan(keys, hp, real, imag, ratio, source=source, mesh=mesh, runs_per_chunk=runs_per_chunk)
        callbacks: list[Callback] = [Messages(self.config, self.levels, plan.num_runs, log, on_interval)]
        if run_dir is not None:
            callbacks.append(MetricsFile(MetricsLog(run_dir), fresh=not resume))
        if checkpoint_dir is not None:
            callbacks.append(Checkpoints(Path(checkpoint_dir), checkpoint_every, keep_checkpoints,
                                         self.config.num_intervals, self.levels))
        outputs = []
        for chunk in plan.chunks:
            found = None
            if resume and checkpoint_dir is not None:
                found = self.restore(plan, chunk, Path(checkpoint_dir) / f"chunk-{chunk.index:03d}")
            state, history, path = found or (None, None, None)
            for callback in callbacks:
                callback.start(chunk, history, path)
            try:
                outputs.append(self.run_chunk(plan, chunk, callbacks, None if found is None else (state, history)))
            except KeyboardInterrupt:
                raise Interrupted(self._interrupted(chunk, len(plan.chunks), checkpoint_dir)) from None
        return _concatenate(outputs)

    def _interrupted(self, chunk: Chunk, num_chunks: int, checkpoint_dir: str | os.PathLike[str] | None) -> str:
        """Where an interrupted :meth:`train` stopped: the chunk's last checkpointed interval."""
        where = f" of chunk {chunk.index + 1}/{num_chunks}" if num_chunks > 1 else ""
        if checkpoint_dir is None:
            return f"interrupted{where} (no checkpoint_dir: nothing was saved)"
        saved = list_checkpoints(Path(checkpoint_dir) / f"chunk-{chunk.index:03d}")
        return f"interrupted after interval {saved[-1][0] if saved else 0}/{self.config.num_intervals}{where}"


# ---------------------------------------------------------------------------------------------------
# What the builder prepares and the runner carries
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Chunk:
    """One chunk of the run axis, ready for the compiled functions.

    Attributes:
      index: its position among the chunks.
      runs: (n,) the global run indices it trains.
      padded: P >= n, runs on the device(s) (copies of the last run fill a multiple of devices × run_block).
      keys, hp, ratio, rows: the P runs' inputs, placed on the mesh.
      fingerprint: hash of everything that determines its computation (a checkpoint must carry it).
    """

    index: int
    runs: np.ndarray
    padded: int
    keys: jax.Array
    hp: PyTree
    ratio: jax.Array
    rows: jax.Array
    fingerprint: str


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every chunk of a training call, the shared inputs (real, imag, level params) placed on the mesh,
    the real data's statistics, and the compiled ``init`` / ``interval`` for the mesh."""

    chunks: tuple[Chunk, ...]
    num_runs: int
    shared: tuple[Transitions, Transitions, Mapping[str, Any]]
    stats: DataStats
    run_sharding: NamedSharding | None
    init: Callable
    interval: Callable


@dataclasses.dataclass
class History:
    """A chunk's evaluations so far, host NumPy over its P padded runs: per interval the step, seconds,
    metrics (name -> (P,)), success and returns (level -> (P,)); each run's 1-based interval of going
    non-finite (0: never), and per-task success at the last evaluation (level -> (P, K))."""

    steps: list[int]
    seconds: list[float]
    metrics: list[dict[str, np.ndarray]]
    success: list[dict[str, np.ndarray]]
    returns: list[dict[str, np.ndarray]]
    frozen_at: np.ndarray
    task_success: dict[str, np.ndarray]

    @classmethod
    def empty(cls, padded: int) -> "History":
        return cls([], [], [], [], [], np.zeros(padded, np.int64), {})

    def record(self, step: int, seconds: float, metrics: Mapping[str, np.ndarray],
               results: Mapping[str, EvalResult], finite: np.ndarray) -> None:
        """Appends one interval's outputs; a run newly not ``finite`` is marked frozen in it."""
        self.frozen_at[(~np.asarray(finite)) & (self.frozen_at == 0)] = len(self.steps) + 1
        self.steps.append(step)
        self.seconds.append(seconds)
        self.metrics.append({k: np.asarray(v) for k, v in metrics.items()})
        self.success.append({lv: np.asarray(r.success_rate) for lv, r in results.items()})
        self.returns.append({lv: np.asarray(r.mean_return) for lv, r in results.items()})
        self.task_success = {lv: np.asarray(r.task_success) for lv, r in results.items()}

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The history as named stacked arrays, for a checkpoint."""
        out = {"history/steps": np.asarray(self.steps, np.int64),
               "history/seconds": np.asarray(self.seconds, np.float64),
               "history/frozen_at": self.frozen_at}
        for group in ("metrics", "success", "returns"):
            series = getattr(self, group)
            for name in series[0]:
                out[f"history/{group}/{name}"] = np.stack([h[name] for h in series])
        for level, value in self.task_success.items():
            out[f"history/task_success/{level}"] = value
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], done: int) -> "History":
        """Inverse of :meth:`to_arrays` for the first ``done`` intervals.

        Raises:
          CheckpointError: the history holds fewer than ``done`` intervals or misses a named series.
        """
        names = {"metrics": meta["metrics"], "success": meta["levels"], "returns": meta["levels"]}
        per_interval = ["history/steps", "history/seconds"] + [f"history/{g}/{k}" for g, keys in names.items() for k in keys]
        once = ["history/frozen_at"] + [f"history/task_success/{lv}" for lv in meta["levels"]]
        bad = [k for k in per_interval if k not in arrays or len(arrays[k]) < done] + [k for k in once if k not in arrays]
        if bad:
            raise CheckpointError(f"a checkpoint of interval {done} lacks history for it ({', '.join(bad[:3])}): it "
                                  "was altered; resume from the previous checkpoint or start a new checkpoint_dir")
        series = {group: [{k: arrays[f"history/{group}/{k}"][i] for k in keys} for i in range(done)]
                  for group, keys in names.items()}
        return cls(steps=arrays["history/steps"].tolist()[:done], seconds=arrays["history/seconds"].tolist()[:done],
                   frozen_at=arrays["history/frozen_at"].copy(),
                   task_success={lv: arrays[f"history/task_success/{lv}"] for lv in meta["levels"]}, **series)

    def result(self, state: RunState, levels: Sequence[str], n: int) -> TrainResult:
        """The :class:`TrainResult` of the first ``n`` runs (the padding dropped)."""
        finite = np.asarray(to_host(state.finite))[:n]
        return TrainResult(
            state=jax.tree.map(lambda x: x[:n], state) if n < self.frozen_at.shape[0] else state,
            steps=np.asarray(self.steps),
            metrics={k: np.stack([h[k] for h in self.metrics])[:, :n] for k in self.metrics[0]},
            success={lv: np.stack([h[lv] for h in self.success])[:, :n] for lv in levels},
            returns={lv: np.stack([h[lv] for h in self.returns])[:, :n] for lv in levels},
            task_success={lv: v[:n] for lv, v in self.task_success.items()},
            seconds=np.asarray(self.seconds),
            finite=finite,
            frozen_at=self.frozen_at[:n],
        )


# ---------------------------------------------------------------------------------------------------
# Callbacks of the runner: messages, the metrics log, checkpoints
# ---------------------------------------------------------------------------------------------------
class Callback(Protocol):
    """Receives a chunk's start (``history``/``path``: a restored checkpoint, or None) and each interval."""

    def start(self, chunk: Chunk, history: History | None, path: Path | None) -> None: ...

    def interval(self, chunk: Chunk, state: RunState, history: History) -> None: ...


@dataclasses.dataclass
class Messages:
    """The per-interval line (to ``on_interval`` as an :class:`IntervalEvent` when given, else to
    ``log``), the resume line and one line per run that went non-finite."""

    config: EngineConfig
    levels: tuple[str, ...]
    num_runs: int
    log: Callable[[str], None] | None
    on_interval: Callable[[IntervalEvent], None] | None

    def start(self, chunk: Chunk, history: History | None, path: Path | None) -> None:
        if history is None:
            return
        done, cfg = len(history.steps), self.config
        message = f"resumed chunk {chunk.index} from {path} ({done}/{cfg.num_intervals} intervals done)"
        if self.log is not None:
            self.log(message)
        if self.on_interval is not None:
            self.on_interval(IntervalEvent(chunk.index, tuple(int(r) for r in chunk.runs), done, cfg.num_intervals,
                                           done * cfg.updates_per_interval, 0.0, True, message))

    def interval(self, chunk: Chunk, state: RunState, history: History) -> None:
        cfg, n, i = self.config, len(chunk.runs), len(history.steps)
        if self.log is not None or self.on_interval is not None:
            seconds = history.seconds[-1]
            succ = "  ".join(f"{lv} {100 * np.mean(history.success[-1][lv][:n]):5.1f}%" for lv in self.levels)
            metrics = history.metrics[-1]
            loss = np.nanmean(metrics["loss"][:n]) if "loss" in metrics else float("nan")
            prefix = f"chunk {chunk.index} " if chunk.index or n < self.num_runs else ""
            message = (f"{prefix}[{i}/{cfg.num_intervals}] step {history.steps[-1]:>7}  loss {loss:.4f}  "
                       f"success {succ}  ({seconds:.1f}s, {n * cfg.updates_per_interval / seconds:,.0f} updates/s "
                       f"over {n} runs)")
            if self.on_interval is not None:
                self.on_interval(IntervalEvent(chunk.index, tuple(int(r) for r in chunk.runs), i, cfg.num_intervals,
                                               history.steps[-1], seconds, False, message))
            elif self.log is not None:
                self.log(message)
        if self.log is not None:
            for j in np.flatnonzero(history.frozen_at[:n] == i):
                self.log(f"run {chunk.runs[j]} went non-finite in interval {i}: frozen at its state after "
                         f"interval {i - 1} (other runs unaffected)")


@dataclasses.dataclass
class MetricsFile:
    """Each interval's records in the sweep's :class:`~imaginejax.core.runlog.MetricsLog`; a chunk starts by
    dropping records beyond its restored interval, a fresh sweep by dropping every record."""

    log: MetricsLog
    fresh: bool

    def start(self, chunk: Chunk, history: History | None, path: Path | None) -> None:
        if self.fresh and chunk.index == 0:
            self.log.truncate(-1, 0)
        self.log.truncate(chunk.index, 0 if history is None else len(history.steps))

    def interval(self, chunk: Chunk, state: RunState, history: History) -> None:
        n = len(chunk.runs)
        cut = lambda d: {k: v[:n] for k, v in d.items()}
        self.log.write_interval(chunk.index, len(history.steps), history.steps[-1], history.seconds[-1], chunk.runs,
                                history.frozen_at[:n] == 0, cut(history.metrics[-1]), cut(history.success[-1]),
                                cut(history.returns[-1]))


@dataclasses.dataclass
class Checkpoints:
    """The chunk's whole state and history saved after every ``every``-th interval and the last one
    (:mod:`imaginejax.core.checkpoint`, the newest ``keep`` kept)."""

    directory: Path
    every: int
    keep: int
    num_intervals: int
    levels: tuple[str, ...]

    def start(self, chunk: Chunk, history: History | None, path: Path | None) -> None:
        pass

    def interval(self, chunk: Chunk, state: RunState, history: History) -> None:
        i = len(history.steps)
        if i % self.every and i != self.num_intervals:
            return
        arrays = flatten_named(to_host(state), "state")
        arrays.update(history.to_arrays())
        meta = {"fingerprint": chunk.fingerprint, "runs": chunk.runs.tolist(), "padded": chunk.padded,
                "levels": list(self.levels), "metrics": list(history.metrics[0])}
        save_checkpoint(self.directory / f"chunk-{chunk.index:03d}", i, arrays, meta, keep=self.keep)


def _concatenate(parts: list[TrainResult]) -> TrainResult:
    """Chunks trained one after another -> one result over all runs, in run order."""
    if len(parts) == 1:
        return parts[0]
    along = lambda dicts, axis: {k: np.concatenate([d[k] for d in dicts], axis) for k in dicts[0]}
    return TrainResult(
        state=jax.tree.map(lambda *xs: jnp.concatenate([jnp.asarray(to_host(x)) for x in xs]),
                           *[p.state for p in parts]),
        steps=parts[0].steps,
        metrics=along([p.metrics for p in parts], 1),
        success=along([p.success for p in parts], 1),
        returns=along([p.returns for p in parts], 1),
        task_success=along([p.task_success for p in parts], 0),
        seconds=np.sum([p.seconds for p in parts], axis=0),
        finite=np.concatenate([p.finite for p in parts]),
        frozen_at=np.concatenate([p.frozen_at for p in parts]),
    )


def make_train(algo: Algorithm, spec: Spec, config: EngineConfig,
               eval_levels: Mapping[str, tuple[Any, Any]]) -> Trainer:
    """Builds the engine for ``algo`` on an environment interface ``spec``.

    Args:
      algo: the algorithm record (see :mod:`imaginejax.algos.base`).
      spec: static environment interface (state / embedding / action sizes).
      config: static engine settings.
      eval_levels: level name -> (env, params) to evaluate on after every interval.

    Returns:
      A :class:`Trainer`; ``trainer.train(keys, hp, real, imag, ratio)`` runs everything.
    """
    return Trainer(algo, spec, config, eval_levels)
