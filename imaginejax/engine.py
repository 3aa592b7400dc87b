"""The training engine: many runs (seeds × hyperparameters × mixing ratios) in one compiled call.

``make_train(algo, spec, config, eval_levels)`` returns a :class:`Trainer`. Its compiled unit is one
*interval*: ``lax.scan`` over ``config.updates_per_interval`` updates, each on a batch drawn by
:func:`~imaginejax.data.sampling.sample_mixed` with the run's real/imaginary ratio, followed by an
evaluation of the run's policy in the JAX environment on every requested level. The interval is
``vmap``-ped over the run axis and ``jit``-ted once; a Python loop over intervals only logs and shows
progress (ARCHITECTURE.md, "Training engine"). Datasets are arguments of the compiled call, never
closure constants, so one compilation serves any dataset of the same shapes.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.data.sampling import sample_mixed
from imaginejax.data.types import Transitions
from imaginejax.evaluation import EvalResult, evaluate

PyTree = Any


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Static engine settings (changing them recompiles).

    Attributes:
      batch_size: B, transitions per gradient update.
      updates_per_interval: gradient updates between two evaluations (one compiled call).
      num_intervals: intervals in a full training run.
      eval_episodes: episodes per level per evaluation (tasks round-robin).
    """

    batch_size: int = 256
    updates_per_interval: int = 1000
    num_intervals: int = 10
    eval_episodes: int = 100


@struct.dataclass
class RunState:
    """Per-run state carried between intervals. algo: the algorithm's state; key: the run's PRNG key."""

    algo: PyTree
    key: jax.Array


@dataclasses.dataclass
class TrainResult:
    """What a training call returns (host-side NumPy, leading axis R = runs).

    Attributes:
      state: the final :class:`RunState` (device arrays, leading run axis).
      steps: (I,) gradient updates done at each evaluation.
      metrics: name -> (I, R) interval-mean training metrics.
      success: level -> (I, R) success rate at each evaluation.
      returns: level -> (I, R) mean evaluation return.
      task_success: level -> (R, K) per-task success at the last evaluation.
      seconds: wall-clock seconds per interval, (I,) (the first includes compilation).
    """

    state: RunState
    steps: np.ndarray
    metrics: dict[str, np.ndarray]
    success: dict[str, np.ndarray]
    returns: dict[str, np.ndarray]
    task_success: dict[str, np.ndarray]
    seconds: np.ndarray


def broadcast_runs(tree: PyTree, num_runs: int) -> PyTree:
    """Repeats every leaf of ``tree`` along a new leading run axis: leaf (...) -> (R, ...)."""
    return jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x), (num_runs,) + jnp.shape(x)), tree)


class Trainer:
    """Compiled training of R runs at once; see :func:`make_train`."""

    def __init__(self, algo: Algorithm, spec: Spec, config: EngineConfig,
                 eval_levels: Mapping[str, tuple[Any, Any]]):
        self.algo, self.spec, self.config = algo, spec, config
        self.levels = tuple(eval_levels)
        self._envs = {level: env for level, (env, _) in eval_levels.items()}
        self.eval_params = {level: params for level, (_, params) in eval_levels.items()}
        self._init = jax.jit(jax.vmap(self._init_one, in_axes=(0, 0)))
        self._interval = jax.jit(
            jax.vmap(self._interval_one, in_axes=(0, 0, 0, None, None, None)), donate_argnums=(0,)
        )

    # -- one run (vmapped over the run axis by the jitted wrappers) ---------------------------
    def _init_one(self, key: jax.Array, hp: PyTree) -> RunState:
        init_key, run_key = jax.random.split(key)
        return RunState(algo=self.algo.init(init_key, self.spec, hp), key=run_key)

    def _interval_one(self, run: RunState, hp: PyTree, ratio: jax.Array, real: Transitions,
                      imag: Transitions, eval_params: Mapping[str, Any]):
        cfg = self.config

        def update(carry, _):
            algo_state, key = carry
            key, batch_key, update_key = jax.random.split(key, 3)
            batch = sample_mixed(batch_key, real, imag, cfg.batch_size, ratio)
            algo_state, metrics = self.algo.update(algo_state, batch, update_key, hp)
            return (algo_state, key), metrics

        (algo_state, key), metrics = jax.lax.scan(
            update, (run.algo, run.key), None, length=cfg.updates_per_interval
        )
        key, eval_key = jax.random.split(key)

        def policy(obs: jax.Array, act_key: jax.Array) -> jax.Array:
            return self.algo.act(algo_state, obs, act_key, hp, True)

        results = {
            level: evaluate(policy, self._envs[level], eval_params[level], k, cfg.eval_episodes)
            for level, k in zip(self.levels, jax.random.split(eval_key, len(self.levels)))
        }
        metrics = jax.tree.map(lambda m: m.mean(0), metrics)
        return RunState(algo=algo_state, key=key), metrics, results

    # -- public API ---------------------------------------------------------------------------
    def init(self, keys: jax.Array, hp: PyTree) -> RunState:
        """keys (R, 2) or (R,) typed keys; hp with leading axis R -> RunState with leading axis R."""
        return self._init(keys, hp)

    def interval(self, run: RunState, hp: PyTree, ratio: jax.Array, real: Transitions,
                 imag: Transitions) -> tuple[RunState, dict[str, jax.Array], dict[str, EvalResult]]:
        """One compiled interval for all R runs (``run`` is donated). ratio: (R,) imaginary fraction."""
        return self._interval(run, hp, ratio, real, imag, self.eval_params)

    def train(self, keys: jax.Array, hp: PyTree, real: Transitions, imag: Transitions | None = None,
              ratio: jax.Array | float = 0.0,
              log: Callable[[str], None] | None = lambda s: print(s, file=sys.stderr, flush=True)
              ) -> TrainResult:
        """Trains R runs for ``config.num_intervals`` intervals, evaluating after each.

        Args:
          keys: (R, 2) uint32 PRNG keys, one per run.
          hp: hyperparameter pytree with leading axis R (see :func:`broadcast_runs`).
          real: the real transitions (shared by all runs).
          imag: the imaginary transitions; None means real data only (``ratio`` must then be 0).
          ratio: (R,) or scalar fraction of each batch drawn from ``imag``.
          log: progress sink (None silences).

        Returns:
          A :class:`TrainResult`.
        """
        num_runs = int(keys.shape[0])
        ratio = jnp.broadcast_to(jnp.asarray(ratio, jnp.float32), (num_runs,))
        if imag is None:
            if bool(jnp.any(ratio > 0)):
                raise ValueError("ratio > 0 needs imaginary data: pass imag=... or set ratio=0")
            imag = real  # never read at ratio 0 (sample_mixed draws round(0·B) = 0 rows from it)
        run = self.init(keys, hp)
        steps, seconds, history, evals = [], [], [], []
        for i in range(self.config.num_intervals):
            start = time.perf_counter()
            run, metrics, results = self.interval(run, hp, ratio, real, imag)
            metrics, results = jax.device_get((metrics, results))
            seconds.append(time.perf_counter() - start)
            steps.append((i + 1) * self.config.updates_per_interval)
            history.append(metrics)
            evals.append(results)
            if log is not None:
                ups = num_runs * self.config.updates_per_interval / seconds[-1]
                succ = "  ".join(f"{lv} {100 * np.mean(r.success_rate):5.1f}%" for lv, r in results.items())
                loss = np.mean(metrics["loss"]) if "loss" in metrics else float("nan")
                log(f"[{i + 1}/{self.config.num_intervals}] step {steps[-1]:>7}  loss {loss:.4f}  "
                    f"success {succ}  ({seconds[-1]:.1f}s, {ups:,.0f} updates/s over {num_runs} runs)")
        return TrainResult(
            state=run,
            steps=np.asarray(steps),
            metrics={k: np.stack([np.asarray(h[k]) for h in history]) for k in history[0]},
            success={lv: np.stack([np.asarray(e[lv].success_rate) for e in evals]) for lv in self.levels},
            returns={lv: np.stack([np.asarray(e[lv].mean_return) for e in evals]) for lv in self.levels},
            task_success={lv: np.asarray(evals[-1][lv].task_success) for lv in self.levels},
            seconds=np.asarray(seconds),
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
