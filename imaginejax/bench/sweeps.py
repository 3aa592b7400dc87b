"""One algorithm's sweep as configured: the environment interface, the evaluated levels, the grid of runs
(seeds × hyperparameters × data conditions × ratios) checked before any data work, and its training
through the engine into :class:`~imaginejax.bench.results.Results`."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax import algos as algo_registry
from imaginejax import envs
from imaginejax.algos.base import Spec
from imaginejax.algos.common import DataStats
from imaginejax.algos.networks import NetConfig
from imaginejax.bench.config import Config, ConfigError, Resolved, TrainConfig, resolve
from imaginejax.bench.results import Results, TrainedRuns, from_sweep, save_task_success, task_names
from imaginejax.core import distributed
from imaginejax.core.runlog import Log, log_stderr
from imaginejax.data import EnvFacts, TrajectoryDataset
from imaginejax.data.types import Transitions
from imaginejax.lang import EMBED_DIM, encode_instructions
from imaginejax.training.kernel import EngineConfig
from imaginejax.training.loop import make_train
from imaginejax.training.progress import IntervalProgress, MetricSinks, count
from imaginejax.training.sweep import Sweep, check_host_memory, host_bytes_per_run, run_sweep


def evaluation_levels(run: Resolved) -> dict[str, tuple[Any, Any]]:
    """The evaluated levels (``run.levels``): level -> (env, params)."""
    return {level: envs.make(run.env, level, embed=encode_instructions if run.data.embed else None)
            for level in run.levels}


def env_interface(run: Resolved) -> Spec:
    """The algorithms' view of the configured environment, from the environment alone (no data, no
    sentence encoder: E is the encoder's width when ``data.embed``, else 0)."""
    facts = EnvFacts.of(envs.make(run.env, "train")[0], legality=False)
    return Spec(state_dim=facts.state_dim, embed_dim=EMBED_DIM if run.data.embed else 0,
                discrete=facts.discrete, action_dim=int(facts.num_actions if facts.discrete else facts.action_dim))


def interface(real: TrajectoryDataset, eval_levels: dict[str, tuple[Any, Any]]) -> Spec:
    """The algorithms' view of the environment, from the real data, checked against the evaluation levels.

    Raises:
      ConfigError: the data's state or embedding width differs from the environment's.
    """
    env, params = next(iter(eval_levels.values()))
    embed_dim = int(real.instruction_embeddings.shape[1])
    if embed_dim != int(params.instruction_embeddings.shape[1]):
        raise ConfigError(f"the real data has {embed_dim}-d instruction embeddings but the environment "
                          f"{int(params.instruction_embeddings.shape[1])}-d: collect the data with the same "
                          "data.embed setting as training")
    state_dim = int(real.states.shape[-1])
    if state_dim != int(env.state_dim):
        raise ConfigError(f"the real data has {state_dim}-d states but {real.env} has {env.state_dim}")
    action_dim = int(env.num_actions) if real.discrete else int(real.actions.shape[-1])
    return Spec(state_dim=state_dim, embed_dim=embed_dim, discrete=bool(real.discrete), action_dim=action_dim)


def algorithm_names(train: TrainConfig, spec: Spec) -> tuple[str, ...]:
    """``train.algos``, or every registered algorithm for the action space."""
    return tuple(train.algos) or algo_registry.registered(spec.discrete)


def eval_episodes(train: TrainConfig, eval_levels: dict[str, tuple[Any, Any]]) -> dict[str, int]:
    """Episodes per evaluation of each level: ``train.eval_episodes`` rounded up to a multiple of the
    level's task count (:func:`~imaginejax.training.evaluation.episodes_per_level`)."""
    from imaginejax.training.evaluation import episodes_per_level

    return {level: episodes_per_level(train.eval_episodes, int(params.goals.shape[0]))
            for level, (_, params) in eval_levels.items()}


def eval_steps_per_run(train: TrainConfig, eval_levels: dict[str, tuple[Any, Any]]) -> int:
    """Environment steps of one evaluation of one run: Σ_levels episodes × max_steps."""
    episodes = eval_episodes(train, eval_levels)
    return sum(episodes[level] * int(params.max_steps) for level, (_, params) in eval_levels.items())


def train_algorithm(config: Config, run: Resolved, name: str, spec: Spec, eval_levels: dict[str, tuple[Any, Any]],
                    real: Transitions, imag: Mapping[str, Transitions], run_dir: str | Path,
                    log: Log = log_stderr) -> Results:
    """One algorithm's sweep (seeds × hyperparameters × data conditions × ratios), resumed from
    ``run_dir`` when possible.

    Args:
      config: the configuration (``train`` section; ``logging`` for the display and metric sinks).
      run: its resolved facts (the data conditions trained, the evaluated levels).
      name: registry name of the algorithm.
      spec: the environment interface.
      eval_levels: level -> (env, params) evaluated after every interval.
      real: the real transitions.
      imag: source name -> transitions mixed into the real data (:func:`mixed_sources`); runs on real data
        only are part of the sweep when ``train.conditions`` holds 'real'.
      run_dir: the sweep's directory (metrics, ``task_success.json``, ``train.log``, ``checkpoints/``).
      log: message sink.

    Returns:
      The sweep's :class:`~imaginejax.bench.results.Results`.
    """
    t = config.train
    settings = t.algo.get(name)
    data = ([""] if "real" in run.conditions else []) + list(imag)
    if not data:
        raise ConfigError(f"train.conditions {list(t.conditions)} leave nothing to train: no imaginary or oracle data "
                          "was produced (check imagine.source, train.ratios and the datasets given)")
    algo, base_hp, sweep = algorithm_sweep(t, run, name, spec, data)
    batch_size = settings.batch_size if settings is not None and settings.batch_size else t.batch_size
    engine = EngineConfig(batch_size=batch_size, updates_per_interval=t.updates // t.intervals,
                          num_intervals=t.intervals, eval_episodes=t.eval_episodes, run_block=t.run_block or None)
    trainer = make_train(algo, spec, engine, eval_levels)
    net, options = algorithm_shapes(t, name)
    run_dir, writer = Path(run_dir), distributed.is_writer()
    if writer:
        run_dir.mkdir(parents=True, exist_ok=True)
    sinks = MetricSinks(run_dir, name, tensorboard=writer and config.logging.tensorboard,
                        wandb=writer and config.logging.wandb, wandb_project=config.logging.wandb_project,
                        wandb_mode=config.logging.wandb_mode, config=config.to_json())
    progress = IntervalProgress(name, sweep.num_runs, t.intervals, engine.updates_per_interval,
                                eval_steps_per_run(t, eval_levels),
                                mode=config.logging.progress if writer else "off",
                                log_file=run_dir / "train.log" if writer else None, on_interval=sinks.sync)
    episodes = eval_episodes(t, eval_levels)
    swept = {**(settings.hp if settings else {}), **(settings.sweep if settings else {})}
    grid = "".join(f" × {k} {', '.join(f'{v:g}' for v in np.atleast_1d(values))}" for k, values in swept.items()
                   if np.size(values) > 1)
    log(f"{name}: {count(sweep.num_runs, 'run')} ({count(t.seeds, 'seed')} × "
        f"{count(sweep.num_runs // t.seeds, 'configuration')}: "
        f"{', '.join(d or 'real only' for d in data)}{grid}), {t.updates} updates each, batch {batch_size}, "
        f"{count(t.intervals, 'evaluation')} of {', '.join(f'{lv} {n}' for lv, n in episodes.items())} episodes "
        f"(every task equally often) -> {run_dir}")
    progress.compiling()
    try:
        result = run_sweep(trainer, sweep, base_hp, real, dict(imag) or None,
                           memory_budget=(t.memory_budget_mb << 20) if t.memory_budget_mb else None,
                           run_dir=run_dir, log=progress, on_interval=progress.interval,
                           checkpoint_dir=run_dir / "checkpoints", checkpoint_every=t.checkpoint_every, keep_checkpoints=t.keep_checkpoints, resume=True)
    finally:
        progress.close()
        sinks.close()
    results = from_sweep(name, result, task_names(eval_levels))
    if writer:
        save_task_success(run_dir, results)
    trained = TrainedRuns(env=run.env, spec=spec, net=net, options=options, states=result.result.state.algo,
                          runs=tuple(range(sweep.num_runs)))
    return dataclasses.replace(results, trained={name: trained})


def algorithm_sweep(train: TrainConfig, run: Resolved, name: str, spec: Spec,
                    data: Sequence[str]) -> tuple[Any, Any, Sweep]:
    """Algorithm ``name`` built as configured (``train.algo.<name>.options``), its hp for one run, and the
    sweep of ``train.seeds`` × its ``hp`` / ``sweep`` grid × ``data`` × ``train.ratios``, checked by building it.

    Raises:
      ConfigError: an unknown option or hyperparameter, or a value of the wrong kind, named with the fix.
      SweepMemoryError: the runs' final states, rows and results would not fit in the host's available
        memory (checked by counting, before the table is built).
    """
    t = train
    settings = t.algo.get(name)
    net, options = algorithm_shapes(t, name)
    try:
        algo = algo_registry.make(name, spec, net, **options)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"train.algo.{name}.options: {error}") from None
    base_hp = algo.default_hp(spec)
    grid: dict[str, Sequence[float]] = {}
    if settings is not None:
        grid.update({k: [v] for k, v in settings.hp.items()})
        grid.update({k: list(v) for k, v in settings.sweep.items()})
    runs = Sweep.grid_size(seeds=t.seeds, ratios=t.ratios, hp=grid, data=list(data))
    state = _state_shape(name, spec, net, json.dumps(options, sort_keys=True))
    check_host_memory(runs, host_bytes_per_run(state, t.intervals, len(run.levels)),
                      f"{name} with train.seeds = {t.seeds} × {count(runs // t.seeds, 'configuration')}",
                      f"lower train.seeds{' or train.algo.' + name + '.sweep' if grid else ''}, or train fewer data "
                      "conditions per call (train.conditions, imagine.levels)")
    sweep = Sweep.grid(seeds=t.seeds, ratios=t.ratios, hp=grid, data=list(data))
    try:
        sweep.build(base_hp)
    except ValueError as error:
        raise ConfigError(f"train.algo.{name}: {error}") from None
    return algo, base_hp, sweep


@functools.lru_cache(maxsize=64)
def _state_shape(name: str, spec: Spec, net: NetConfig | None, options: str) -> Any:
    """One run's state of algorithm ``name`` (options as JSON) as ``jax.ShapeDtypeStruct`` leaves (traced once)."""
    algo = algo_registry.make(name, spec, net, **json.loads(options))
    return jax.eval_shape(lambda key, stats, hp: algo.init(key, spec, stats, hp), jax.ShapeDtypeStruct((2,), jnp.uint32),
                          DataStats.identity(spec.state_dim), algo.default_hp(spec))


def check_algorithms(config: Config) -> None:
    """Builds every algorithm to train and every one ``train.algo`` configures, with its hyperparameters,
    from the environment alone: a misspelled option or hyperparameter is refused before any data work.

    Raises:
      ConfigError: as :func:`algorithm_sweep`.
    """
    run = resolve(config)
    spec = env_interface(run)
    for name in dict.fromkeys((*algorithm_names(config.train, spec), *config.train.algo)):
        algorithm_sweep(config.train, run, name, spec, [""])


def algorithm_shapes(train: TrainConfig, name: str) -> tuple[NetConfig | None, dict[str, Any]]:
    """The network (``train.encoder_width`` and ``train.hidden``; None: the algorithm's reference) and the
    static options (``train.algo.<name>.options``) algorithm ``name`` is built with."""
    t = train
    settings = t.algo.get(name)
    net = NetConfig(encoder_width=t.encoder_width, hidden=tuple(t.hidden)) if t.encoder_width else None
    return net, dict(settings.options) if settings is not None else {}
