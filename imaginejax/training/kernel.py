"""The compiled kernel of the engine: R runs (seeds × hyperparameters × mixing ratios) in one call.

Its unit is one *interval*: ``lax.scan`` over ``config.updates_per_interval`` updates, each on a batch drawn
by :func:`~imaginejax.data.sampling.sample_mixed` with the run's real/imaginary ratio from the run's own
imaginary source (several sources share one buffer, each run drawing from its rows ``[start, start +
count)``), followed by an evaluation of the run's policy in the JAX environment on every requested level.
The interval is ``vmap``-ped over the run axis and ``jit``-ted once (:class:`Kernel`); datasets are
arguments of the compiled call, never closure constants, so one compilation serves any dataset of the same
shapes. The host loop around it (chunks, callbacks, checkpoints) is :mod:`imaginejax.training.loop`.

Scale-out:

* **Devices.** With several devices the run axis R is laid on a ``jax.sharding.Mesh`` named ``runs``
  (``NamedSharding(mesh, P('runs'))`` on run-leading arrays, datasets replicated) and the interval runs
  under ``shard_map``: each device trains its own slice of runs, no communication. R is padded up to a
  multiple of the device count (copies of the last run) and the padding is dropped from the results.
  Multi-host: call :func:`imaginejax.core.distributed.initialize` first; the mesh then spans every host's
  devices (arrays are built from each process's identical host copy and gathered for logging).
* **Bitwise reproducibility.** XLA's CPU code for a vmapped reduction depends on the vmapped size, so
  a run's numbers depend (at float round-off) on how many runs share a call. ``EngineConfig.run_block
  = b`` fixes that size: the runs are ``lax.map``-ped in blocks of b vmapped runs, and then a sweep gives
  bitwise the same numbers whatever its chunking (any number of blocks per call) and whatever the
  device count: one device, a 2-device mesh and an 8-device mesh give identical states, metrics and
  evaluations on CPU (tests/test_sweep_sharding.py). That needs one compiler setting,
  :data:`COMPILER_OPTIONS`: a partitioned compile (``num_partitions > 1``) runs XLA's SPMD clean-up
  pipeline, whose common-subexpression elimination merges duplicates *before* the main simplification
  pipeline; merged values have more users, so the algebraic simplifier reassociates differently (e.g.
  Adam's ``(m / c1) / (sqrt(v / c2) + eps)`` into ``m / (c1 * (sqrt(v / c2) + eps))`` for some leaves
  only), and the main pipeline's own CSE then still changes a few reductions. With ``run_block`` set,
  every engine compile on CPU (one device or a mesh) therefore disables XLA's ``cse`` pass, and its ``simplify-while-loops``
  pass (which removes a ``lax.map`` of a single block, so a device holding exactly ``run_block`` runs
  would be optimised differently); the per-device program of a mesh then computes exactly what the
  one-device program computes (checked for BC, discrete CQL and discrete TD3+BC on the toy
  environment). Other backends keep XLA's defaults (no bitwise promise
  there). ``None`` (default) vmaps all of a device's runs at once (fastest; then
  results depend on the runs per device at round-off).
* **NaN isolation.** After each interval a run whose algorithm state or interval metrics are not all
  finite is rolled back to its state at the start of that interval and frozen there (``jnp.where`` on a
  per-run flag inside the compiled call): its later intervals do not change it, its training metrics read
  NaN from then on, it is still evaluated (with its last finite parameters), and the other runs are
  untouched. ``TrainResult.finite`` / ``frozen_at`` report it and a log line names it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import Datasets, DataStats
from imaginejax.data.sampling import sample_mixed
from imaginejax.data.transitions import concat_transitions, placeholder_like
from imaginejax.data.types import Transitions
from imaginejax.training.evaluation import EvalResult, episodes_per_level, evaluate

PyTree = Any
RUNS = "runs"  # the mesh axis name of the run axis
# XLA options of every engine compile. A partitioned compile (>= 2 devices) runs the SPMD partitioner's
# clean-up pipeline, whose common-subexpression elimination runs *before* the main simplification
# pipeline; the one-device compile has no such early CSE. Merged duplicates (e.g. the per-leaf broadcasts
# of Adam's bias corrections) then have several users, so the algebraic simplifier rewrites them
# differently ((m / c1) / (sqrt(v / c2) + eps) -> m / (c1 * (sqrt(v / c2) + eps)) for some leaves,
# m * (1 / c1) / (...) for others), and the later CSE of the main pipeline differs too: sharded and
# one-device runs would differ at float round-off. Without CSE anywhere, the per-device program of a mesh
# computes what the one-device program computes (module docstring, "Bitwise reproducibility"). Also off:
# the while-loop simplifier, which removes a ``lax.map`` of one block (a device holding run_block runs)
# and so optimises its body in another context than a loop of several blocks. Applied on CPU and only with
# EngineConfig.run_block set (the bitwise mode; the default path keeps XLA's full optimisation);
# None: XLA's defaults.
COMPILER_OPTIONS: dict[str, str] | None = {"xla_disable_hlo_passes": "cse,simplify-while-loops"}


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Static engine settings (changing them recompiles).

    Attributes:
      batch_size: B, transitions per gradient update.
      updates_per_interval: gradient updates between two evaluations (one compiled call).
      num_intervals: intervals in a full training run.
      eval_episodes: episodes per level per evaluation, rounded up per level to a multiple of its task
        count (:func:`~imaginejax.training.evaluation.episodes_per_level`: every task equally often).
      run_block: None vmaps all runs of a device at once; b >= 1 runs them in ``lax.map``-ped blocks of
        b vmapped runs, which makes results bitwise independent of chunking and of the number of
        devices on CPU (module docstring, :data:`COMPILER_OPTIONS`).
    """

    batch_size: int = 256
    updates_per_interval: int = 1000
    num_intervals: int = 10
    eval_episodes: int = 100
    run_block: int | None = None


@struct.dataclass
class RunState:
    """Per-run state carried between intervals.

    Attributes:
      algo: the algorithm's state.
      key: the run's PRNG key, (2,) uint32.
      finite: () bool, False once the run went non-finite and was frozen.
    """

    algo: PyTree
    key: jax.Array
    finite: jax.Array


@dataclasses.dataclass
class TrainResult:
    """What a training call returns (host-side NumPy, leading axis R = runs, padding removed).

    Attributes:
      state: the final :class:`RunState` (device arrays, leading run axis).
      steps: (I,) gradient updates done at each evaluation.
      metrics: name -> (I, R) interval-mean training metrics (NaN once a run is frozen).
      success: level -> (I, R) success rate at each evaluation.
      returns: level -> (I, R) mean evaluation return.
      task_success: level -> (R, K) per-task success at the last evaluation.
      seconds: wall-clock seconds per interval, (I,) (the first includes compilation; summed over chunks).
      finite: (R,) bool, False for runs frozen after going non-finite.
      frozen_at: (R,) int, the 1-based interval in which a run went non-finite (its state is the one
        after interval ``frozen_at - 1``), 0 for runs that stayed finite.
    """

    state: RunState
    steps: np.ndarray
    metrics: dict[str, np.ndarray]
    success: dict[str, np.ndarray]
    returns: dict[str, np.ndarray]
    task_success: dict[str, np.ndarray]
    seconds: np.ndarray
    finite: np.ndarray
    frozen_at: np.ndarray


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes needed to train runs on one device: ``shared + per_run × runs_on_the_device``.

    Attributes:
      per_run: bytes per run (state, its copies during the update, batch, activations, evaluation).
      shared: bytes shared by all runs of a device (the replicated datasets and level parameters).
    """

    per_run: int
    shared: int

    def total(self, runs_per_device: int) -> int:
        """Estimated peak bytes on a device holding ``runs_per_device`` runs."""
        return self.shared + self.per_run * runs_per_device


def broadcast_runs(tree: PyTree, num_runs: int) -> PyTree:
    """Repeats every leaf of ``tree`` along a new leading run axis: leaf (...) -> (R, ...)."""
    return jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x), (num_runs,) + jnp.shape(x)), tree)


def default_mesh() -> Mesh | None:
    """A 1-D mesh ``('runs',)`` over every device (all hosts), or None when there is only one device."""
    devices = jax.devices()
    return Mesh(np.asarray(devices), (RUNS,)) if len(devices) > 1 else None


def _nbytes(tree: PyTree) -> int:
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _all_finite(tree: PyTree) -> jax.Array:
    """() bool: every inexact leaf of ``tree`` is finite everywhere."""
    checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(checks)) if checks else jnp.asarray(True)


def take_runs(tree: PyTree, index: np.ndarray) -> PyTree:
    """Rows ``index`` of every run-leading leaf (host gather, keeps dtypes)."""
    return jax.tree.map(lambda x: np.asarray(x)[index], tree)


def to_host(tree: PyTree) -> PyTree:
    """Device -> host NumPy; gathers across processes on multi-host meshes."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))
    return jax.device_get(tree)


def place(tree: PyTree, sharding: NamedSharding | None) -> PyTree:
    """Host/device arrays -> device arrays with ``sharding`` (every process passes the same values)."""
    if sharding is None:
        return jax.tree.map(jnp.asarray, tree)
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)
    return jax.tree.map(lambda x: jax.make_array_from_callback(np.shape(x), sharding,
                                                               lambda idx, x=np.asarray(x): x[idx]), tree)


class Kernel:
    """The compiled functions of R runs at once: init and one interval (updates, then evaluation)."""

    def __init__(self, algo: Algorithm, spec: Spec, config: EngineConfig,
                 eval_levels: Mapping[str, tuple[Any, Any]]):
        if config.run_block is not None and config.run_block < 1:
            raise ValueError(f"EngineConfig.run_block must be None or >= 1, got {config.run_block}")
        self.algo, self.spec, self.config = algo, spec, config
        self.levels = tuple(eval_levels)
        self._envs = {level: env for level, (env, _) in eval_levels.items()}
        self.eval_params = {level: params for level, (_, params) in eval_levels.items()}
        self._compiled: dict[tuple[str, int], tuple[Callable, Callable]] = {}

    # -- one run (vmapped over the run axis by the compiled wrappers) -------------------------
    def _init_one(self, key: jax.Array, hp: PyTree, stats: DataStats) -> RunState:
        init_key, run_key = jax.random.split(key)
        return RunState(algo=self.algo.init(init_key, self.spec, stats, hp), key=run_key,
                        finite=jnp.asarray(True))

    def _interval_one(self, run: RunState, hp: PyTree, ratio: jax.Array, imag_rows: jax.Array,
                      real: Transitions, imag: Transitions, eval_params: Mapping[str, Any]):
        cfg = self.config
        data = Datasets.of(real, imag, imag_rows)

        def update(carry, _):
            algo_state, key = carry
            key, batch_key, update_key = jax.random.split(key, 3)
            batch = sample_mixed(batch_key, real, imag, cfg.batch_size, ratio, imag_rows)
            algo_state, metrics = self.algo.update(algo_state, batch, update_key, hp, data)
            return (algo_state, key), metrics

        (algo_state, key), metrics = jax.lax.scan(
            update, (run.algo, run.key), None, length=cfg.updates_per_interval
        )
        metrics = jax.tree.map(lambda m: m.mean(0), metrics)
        # NaN isolation: keep the interval only if the run was finite and still is; otherwise roll back.
        ok = run.finite & _all_finite(algo_state) & _all_finite(metrics)
        algo_state = jax.tree.map(lambda new, old: jnp.where(ok, new, old), algo_state, run.algo)
        key = jnp.where(ok, key, run.key)  # a frozen run's evaluation key does not depend on the bad interval
        metrics = jax.tree.map(lambda m: jnp.where(ok, m, jnp.nan) if jnp.issubdtype(m.dtype, jnp.inexact)
                               else m, metrics)
        key, eval_key = jax.random.split(key)
        # A frozen run must stay frozen bit for bit: its key does not advance either.
        key = jnp.where(ok, key, run.key)

        def policy(obs: jax.Array, act_key: jax.Array) -> jax.Array:
            return self.algo.act(algo_state, obs, act_key, hp, True)

        results = {
            level: evaluate(policy, self._envs[level], eval_params[level], k, cfg.eval_episodes)
            for level, k in zip(self.levels, jax.random.split(eval_key, len(self.levels)))
        }
        return RunState(algo=algo_state, key=key, finite=ok), metrics, results

    # -- compiled wrappers --------------------------------------------------------------------
    def _blocked(self, fn: Callable, num_run_args: int) -> Callable:
        """vmap ``fn`` over the leading axis of its first ``num_run_args`` arguments (the rest shared);
        with ``run_block = b``, as a ``lax.map`` over blocks of b vmapped runs."""
        in_axes = (0,) * num_run_args + (None,) * 8
        block = self.config.run_block

        def run(*args):
            run_args, shared = args[:num_run_args], args[num_run_args:]
            vmapped = jax.vmap(fn, in_axes=in_axes[:len(args)])
            if block is None:
                return vmapped(*args)
            n = jax.tree.leaves(run_args)[0].shape[0]
            if n % block:
                raise ValueError(f"{n} runs are not a multiple of EngineConfig.run_block={block} "
                                 "(Trainer.train pads automatically; direct init/interval calls must not)")
            blocks = jax.tree.map(lambda x: x.reshape((n // block, block) + x.shape[1:]), run_args)
            out = jax.lax.map(lambda xs: vmapped(*xs, *shared), blocks)
            return jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]), out)

        return run

    def _functions(self, mesh: Mesh | None) -> tuple[Callable, Callable]:
        """(init, interval) compiled for ``mesh`` (None: one device, no sharding); cached."""
        tag = (repr(mesh), self.config.run_block or 0)
        if tag not in self._compiled:
            init = self._blocked(self._init_one, 2)
            interval = self._blocked(self._interval_one, 4)
            platform = jax.default_backend() if mesh is None else mesh.devices.flat[0].platform
            # Only where bitwise equality is promised (run_block set): the passes it disables may cost speed.
            options = COMPILER_OPTIONS if platform == "cpu" and self.config.run_block is not None else None
            if mesh is not None:
                init = jax.shard_map(init, mesh=mesh, in_specs=(P(RUNS), P(RUNS), P()), out_specs=P(RUNS),
                                     check_vma=False)
                interval = jax.shard_map(interval, mesh=mesh, in_specs=(P(RUNS),) * 4 + (P(),) * 3,
                                         out_specs=P(RUNS), check_vma=False)
            self._compiled[tag] = (jax.jit(init, compiler_options=options),
                                   jax.jit(interval, donate_argnums=(0,), compiler_options=options))
        return self._compiled[tag]

    # -- public API ---------------------------------------------------------------------------
    def init(self, keys: jax.Array, hp: PyTree, real: Transitions) -> RunState:
        """keys (R, 2) uint32; hp with leading axis R; the real transitions (their DataStats go into every
        run's state) -> RunState with leading axis R (one device)."""
        return self._functions(None)[0](keys, hp, DataStats.from_transitions(real))

    def interval(self, run: RunState, hp: PyTree, ratio: jax.Array, real: Transitions, imag: Transitions,
                 imag_rows: jax.Array | None = None
                 ) -> tuple[RunState, dict[str, jax.Array], dict[str, EvalResult]]:
        """One compiled interval for all R runs on one device (``run`` is donated). ratio: (R,);
        imag_rows: (R, 2) int32 (start, count) of each run's imaginary rows (None: the whole buffer)."""
        if imag_rows is None:
            imag_rows = np.tile(np.asarray([0, imag.state.shape[0]], np.int32), (np.shape(ratio)[0], 1))
        return self._functions(None)[1](run, hp, ratio, jnp.asarray(imag_rows, jnp.int32), real, imag,
                                        self.eval_params)

    def state_shape(self, hp: PyTree, real: Transitions) -> RunState:
        """One run's :class:`RunState` as ``jax.ShapeDtypeStruct`` leaves (``hp`` of one run; nothing computed)."""
        return jax.eval_shape(self._init_one, jax.ShapeDtypeStruct((2,), jnp.uint32), hp,
                              jax.eval_shape(DataStats.from_transitions, real))

    def memory_estimate(self, hp: PyTree, real: Transitions, imag: Transitions | None = None) -> MemoryEstimate:
        """Estimates device memory from shapes alone (``jax.eval_shape``, nothing is compiled).

        per_run = 6 × state (state in, state out, gradients, optimiser temporaries)
                  + 8 × batch (gathers from both buffers, the select, activations of the same order)
                  + Σ_levels 4 × evaluation batch (observations and environment state of all episodes)
                  + interval outputs (metrics, evaluation results);
        shared = the datasets and level parameters.
        The factors are deliberately generous; :meth:`compiled_memory` gives XLA's exact figure for one
        shape, at the cost of a compilation.

        Args:
          hp: the hyperparameters of ONE run (no leading run axis).
          real, imag: the datasets (``imag`` None: real only).
        """
        imag = placeholder_like(real) if imag is None else stack_sources(imag)[0]
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        ratio = jax.ShapeDtypeStruct((), jnp.float32)
        rows = jax.ShapeDtypeStruct((2,), jnp.int32)
        state = self.state_shape(hp, real)
        outputs = jax.eval_shape(self._interval_one, state, hp, ratio, rows, real, imag, self.eval_params)[1:]
        batch = jax.eval_shape(lambda k, r: sample_mixed(k, real, imag, self.config.batch_size, r), key, ratio)
        evaluation = 0
        for level, params in self.eval_params.items():
            env = self._envs[level]
            episodes = episodes_per_level(self.config.eval_episodes, int(params.goals.shape[0]))
            tasks = jax.ShapeDtypeStruct((episodes,), jnp.int32)
            keys = jax.ShapeDtypeStruct((episodes, 2), jnp.uint32)
            evaluation += 4 * _nbytes(jax.eval_shape(lambda k, t, env=env, params=params:
                                                     env.reset_to_task_batch(k, params, t), keys, tasks))
        shared = _nbytes(real) + _nbytes(imag) + _nbytes(self.eval_params)
        per_run = 6 * _nbytes(state) + 8 * _nbytes(batch) + evaluation + _nbytes(outputs)
        return MemoryEstimate(per_run=int(per_run), shared=int(shared))

    def compiled_memory(self, keys: jax.Array, hp: PyTree, real: Transitions,
                        imag: Transitions | None = None) -> int:
        """XLA's own peak estimate (arguments + outputs + temporaries − aliased) for one interval of
        ``keys.shape[0]`` runs on one device; compiles that shape (seconds to minutes)."""
        imag = placeholder_like(real) if imag is None else stack_sources(imag)[0]
        init, interval = self._functions(None)
        state = jax.eval_shape(init, keys, hp, jax.eval_shape(DataStats.from_transitions, real))
        ratio = jax.ShapeDtypeStruct((keys.shape[0],), jnp.float32)
        rows = jax.ShapeDtypeStruct((keys.shape[0], 2), jnp.int32)
        stats = interval.lower(state, hp, ratio, rows, real, imag, self.eval_params).compile().memory_analysis()
        return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
                   - stats.alias_size_in_bytes)


def stack_sources(imag: Transitions | Sequence[Transitions]) -> tuple[Transitions, np.ndarray]:
    """One buffer holding every imaginary source in order, and (C, 2) int32 (start, count) of each."""
    parts = [imag] if isinstance(imag, Transitions) else list(imag)
    if not parts:
        raise ValueError("imag is an empty sequence: pass None for real data only")
    counts = np.asarray([int(p.state.shape[0]) for p in parts])
    bounds = np.stack([np.concatenate([[0], np.cumsum(counts)[:-1]]), counts], -1).astype(np.int32)
    return (parts[0] if len(parts) == 1 else concat_transitions(parts)), bounds
