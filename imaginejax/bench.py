"""The protocol behind ``imaginejax collect / imagine / train / bench``: data → imaginary data → sweeps → report.

One :class:`~imaginejax.config.Config` drives every step; each step is resumable, so re-running a command
continues where it stopped:

1. **real data** — expert trajectories of the training level, collected with the environment's scripted
   expert (``imaginejax.envs.<env>.expert.make_policy``) and cached under ``data.dir`` by their collection
   parameters (:func:`cached_expert_data`);
2. **imaginary data** for the novel levels (``imagine.source``): a KALM imaginer fine-tuned on the real
   data writes rollouts (:mod:`imaginejax.imaginer.finetune`, :mod:`imaginejax.imaginer.imagine`; the
   fine-tuning resumes from its checkpoints, finished datasets are reused), or *oracle* expert rollouts
   of the novel tasks (the paper's upper bound), or none;
3. **training** — for each algorithm, one sweep of seeds × hyperparameters × data conditions × ratios
   (:class:`~imaginejax.sweep.Sweep`) in one compiled call per chunk, evaluated on every level (every task
   equally often) after every interval (:mod:`imaginejax.engine`), with metrics, per-task success and
   checkpoints in ``<out>/runs/<algorithm>/``; a re-run resumes from the checkpoints (the engine refuses
   a checkpoint of a different sweep). The data conditions (``train.conditions``) follow the reference
   protocol: *real* runs train on real data only; for each novel level L, *imaginary* runs mix the
   real data with L's imaginary rollouts and *oracle* runs with real expert rollouts of L's tasks
   (``train.protocol = "pooled"`` mixes one buffer of every novel level's data instead);
4. **report** — the three-way table per algorithm and level (real only / real + imaginary / real +
   oracle; IQM and bootstrap 95 % intervals over seeds of each run's success averaged over its last
   ``report.last`` evaluations, with the imaginary data's quality beside it), the per-configuration
   table and figures (:mod:`imaginejax.figures`).

A workspace directory (``--out``) holds::

    workspace.json        the configuration that determines results + fingerprints of the data used
    imaginary/imaginer/   the imaginer's fine-tuning run (imagine.source = "imaginer")
    imaginary/<env>-<level>-imaginary/   imaginary datasets
    runs/<algorithm>/     sweep.json, metrics.jsonl, metrics.csv, train.log, checkpoints/
    random.json           the random policy's success per level (the floor on the bar chart)
    figures/              curves.png, curves.csv, bars.png, bars.csv, results.md (IQM)
    results.md            the results table (IQM; ``report --statistic mean``: results-mean.md, figures-mean/)

Re-running with a configuration that would change results (data, imagine or train sections, except the
list of algorithms) in an existing workspace is refused with the differing fields named.

Under several processes (:mod:`imaginejax.distributed`) every process runs the same command: process 0
opens the workspace and prepares the data first (the others then read what it wrote), process 0 alone
logs and writes, and every process returns the same results.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax import algos as algo_registry
from imaginejax import distributed
from imaginejax import envs
from imaginejax.algos.base import Spec
from imaginejax.algos.common import DataStats
from imaginejax.algos.networks import NetConfig
from imaginejax.checkpoint import Interrupted
from imaginejax.config import Config, ConfigError, data_conditions, imagined_levels, level_episodes
from imaginejax.data import (EnvFacts, TrajectoryDataset, concat_transitions, load_dataset, read_manifest,
                             save_dataset, to_transitions, validate_for_env)
from imaginejax.data.errors import DatasetError
from imaginejax.data.collect import Policy, collect
from imaginejax.data.types import Transitions
from imaginejax.engine import EngineConfig, make_train
from imaginejax.files import fields_of, read_json, write_json, write_text
from imaginejax.lang import EMBED_DIM, encode_instructions
from imaginejax.paths import absolute, cache_root
from imaginejax.progress import IntervalProgress, MetricSinks, count, format_seconds
from imaginejax.report import table
from imaginejax.results import SOURCES_FILE, Results, TrainedRuns, from_sweep, save_task_success, task_names
from imaginejax.sweep import Sweep, check_host_memory, host_bytes_per_run, run_sweep

Log = Callable[[str], None]


def log_stderr(message: str) -> None:
    """The default message sink: one line on stderr."""
    print(message, file=sys.stderr, flush=True)


def _quiet(message: str) -> None:
    """The message sink of every process but the writer."""


# ---------------------------------------------------------------------------------------------------
# Real (expert) data
# ---------------------------------------------------------------------------------------------------
def expert_policy(env_name: str, epsilon: float) -> Policy:
    """The expert of environment ``env_name`` as a collection policy (:func:`imaginejax.envs.expert_policy`;
    ``epsilon`` is its noise: a random-action probability, or an action-noise std for continuous actions).

    Raises:
      ConfigError: the environment ships no expert.
    """
    try:
        return envs.expert_policy(env_name, epsilon)
    except ValueError as error:
        raise ConfigError(f"{error}; or pass real data with --real") from None


def _collection_record(env_name: str, level: str, episodes: int, seed: int, epsilon: float,
                       embed: bool) -> dict[str, Any]:
    return {"expert_env": env_name, "expert_level": level, "expert_episodes": int(episodes),
            "expert_seed": int(seed), "expert_epsilon": float(epsilon), "expert_embed": bool(embed)}


def expert_dataset(env_name: str, level: str, episodes: int, seed: int, epsilon: float, path: str | Path, *,
                   embed: bool = True, overwrite: bool = False, log: Log = log_stderr) -> TrajectoryDataset:
    """Expert trajectories of one level at ``path``: read if ``path`` holds this very collection, else
    collected (``collect`` with ``PRNGKey(seed)``, tasks drawn uniformly) and saved atomically.

    Args:
      env_name, level: environment registry name and level.
      episodes: N trajectories.
      seed: collection seed.
      epsilon: the expert's random-action probability.
      path: dataset directory.
      embed: embed instructions (E = 384) or not (E = 0).
      overwrite: replace a *different* dataset found at ``path`` (otherwise refused).
      log: message sink.

    Raises:
      FileExistsError: ``path`` holds a different dataset and ``overwrite`` is False.
    """
    path = Path(path)
    wanted = _collection_record(env_name, level, episodes, seed, epsilon, embed)
    if (path / "manifest.json").exists():
        provenance = read_manifest(path).get("provenance", {})
        found = {k: provenance.get(k) for k in wanted}
        if found == wanted:
            log(f"  {env_name}/{level}: reading {episodes} expert trajectories from {path}")
            return load_dataset(path)
        if not overwrite:
            raise FileExistsError(f"{path} holds a different dataset ({found}); choose another --out or pass "
                                  "--overwrite")
    env, params = envs.make(env_name, level, embed=encode_instructions if embed else None)
    start = time.perf_counter()
    ds = collect(env, params, expert_policy(env_name, epsilon), jax.random.PRNGKey(seed), episodes,
                 source="real", policy_name=f"{env_name} expert (epsilon {epsilon:g})", provenance=wanted,
                 progress=sys.stderr.isatty())
    log(f"  {env_name}/{level}: collected {episodes} expert trajectories ({ds.num_transitions} steps, "
        f"{ds.terminals.any(1).mean():.0%} successful) in {time.perf_counter() - start:.0f}s -> {path}")
    save_dataset(ds, path, overwrite=True)
    return ds


def cached_expert_path(env_name: str, level: str, episodes: int, seed: int, epsilon: float, root: str | Path, *,
                       embed: bool = True) -> Path:
    """Where :func:`cached_expert_data` keeps this collection: ``root``, a directory named after its parameters."""
    record = _collection_record(env_name, level, episodes, seed, epsilon, embed)
    tag = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]
    return Path(root) / f"{env_name}-{level}-real-{episodes}-{tag}"


def cached_expert_data(env_name: str, level: str, episodes: int, seed: int, epsilon: float, root: str | Path, *,
                       embed: bool = True, log: Log = log_stderr) -> TrajectoryDataset:
    """:func:`expert_dataset` under ``root``, in a directory named after the collection parameters."""
    path = cached_expert_path(env_name, level, episodes, seed, epsilon, root, embed=embed)
    return expert_dataset(env_name, level, episodes, seed, epsilon, path, embed=embed, log=log)


def data_root(config: Config) -> Path:
    """``data.dir``, or ``$IMAGINEJAX_HOME/data``."""
    return absolute(config.data.dir) if config.data.dir else cache_root() / "data"


def real_data(config: Config, log: Log = log_stderr) -> list[TrajectoryDataset]:
    """The configuration's real data: expert trajectories of the training level (cached)."""
    d = config.data
    return [cached_expert_data(d.env, "train", d.episodes, d.seed, d.epsilon, data_root(config), embed=d.embed,
                               log=log)]


def first_trajectories(datasets: Sequence[TrajectoryDataset], count: int) -> list[TrajectoryDataset]:
    """The first ``count`` trajectories of ``datasets`` in order (datasets cut or dropped as needed)."""
    out, left = [], count
    for ds in datasets:
        if left <= 0:
            break
        n = min(left, ds.num_trajectories)
        rows = {f: getattr(ds, f)[:n] for f in ("states", "actions", "rewards", "mask", "terminals", "truncations",
                                                "instruction_ids", "goals")}
        out.append(dataclasses.replace(ds, **rows))
        left -= n
    return out


def oracle_data(config: Config, log: Log = log_stderr) -> list[TrajectoryDataset]:
    """Expert rollouts of every imagined level's tasks (cached): the oracle condition's data."""
    im, d = config.imagine, config.data
    return [cached_expert_data(d.env, level, level_episodes(config, level), im.seed + i, d.epsilon,
                               data_root(config), embed=d.embed, log=log)
            for i, level in enumerate(imagined_levels(config))]


def filter_imaginary(config: Config, datasets: Sequence[TrajectoryDataset],
                     log: Log = log_stderr) -> list[TrajectoryDataset]:
    """``imagine.filter`` applied to imaginer rollouts (:func:`~imaginejax.imaginer.quality.filter_dataset`;
    the filter and its counts are recorded in each dataset's provenance)."""
    if config.imagine.filter == "none":
        return list(datasets)
    from imaginejax.imaginer.quality import filter_dataset, score_dataset

    out = []
    for ds in datasets:
        kept = filter_dataset(ds, score_dataset(ds), require_legal=True,
                              require_goal=config.imagine.filter == "consistent-legal")
        log(f"  {ds.env}/{ds.level}: filter {config.imagine.filter!r} kept {kept.num_trajectories} of "
            f"{ds.num_trajectories} imaginary rollouts")
        out.append(kept)
    return out


def check_oracle_given(config: Config, oracle_paths: Sequence[str | Path]) -> None:
    """Refuses oracle datasets for a sweep that trains no oracle condition (ConfigError naming the fix)."""
    if oracle_paths and "oracle" not in data_conditions(config):
        raise ConfigError(f"--oracle data is given but the oracle condition is not trained (train.conditions = "
                          f"{list(config.train.conditions)}, ratios {list(config.train.ratios)}): add 'oracle' to "
                          "train.conditions and a ratio > 0 to train.ratios")


def mixed_sources(config: Config, real: Sequence[TrajectoryDataset], out_dir: str | Path, *,
                  imaginary_paths: Sequence[str | Path] = (), oracle_paths: Sequence[str | Path] = (),
                  log: Log = log_stderr) -> dict[str, list[TrajectoryDataset]]:
    """The data mixed into the real data, by source name: ``"<condition>/<level>"`` (per-level protocol)
    or ``"<condition>/pooled"``, for the conditions 'imaginary' and 'oracle' of :func:`data_conditions`.
    ``oracle_paths``: real rollouts of novel levels to use as the oracle's data instead of collecting them
    (:func:`train` has refused them already when no oracle condition is trained: :func:`check_oracle_given`).

    Raises:
      ConfigError: a given imaginary or oracle dataset is of a level that is not a novel level of the
        environment.
    """
    conditions = data_conditions(config)
    env_name = config.data.env
    novel = [lv for lv in envs.ENV_LEVELS[env_name] if lv != "train"]
    per_condition: dict[str, list[TrajectoryDataset]] = {}
    if imaginary_paths or "imaginary" in conditions:
        if imaginary_paths:
            datasets = load_datasets(imaginary_paths, "imaginary", env_name, log)
        else:
            datasets = imaginary_data(config, real, Path(out_dir) / "imaginary", log)
        per_condition["imaginary"] = filter_imaginary(config, datasets, log)
    if "oracle" in conditions:
        per_condition["oracle"] = (load_datasets(oracle_paths, "real", env_name, log) if oracle_paths
                                   else oracle_data(config, log))
    sources: dict[str, list[TrajectoryDataset]] = {}
    for condition, datasets in per_condition.items():
        for ds in datasets:
            if ds.level not in novel:
                raise ConfigError(f"{condition} data of level {ds.level!r} cannot be mixed into a novel level of "
                                  f"{env_name} ({', '.join(novel)}): {condition} data is made for (and "
                                  "mixed into) the level of its instructions")
        if config.train.protocol == "pooled":
            sources[f"{condition}/pooled"] = list(datasets)
            continue
        for level in novel:
            parts = [ds for ds in datasets if ds.level == level]
            if parts:
                sources[f"{condition}/{level}"] = parts
    return sources


def load_datasets(paths: Sequence[str | Path], source: str, env_name: str,
                  log: Log = _quiet) -> list[TrajectoryDataset]:
    """Datasets from directories, checked to be of ``env_name`` and ``source``.

    Raises:
      ConfigError: a dataset of another environment or source (the message names the directory).
    """
    out = []
    for path in paths:
        ds = load_dataset(path)
        if ds.env != env_name:
            raise ConfigError(f"{path} holds {ds.env} data but data.env is {env_name!r}: pass --set data.env={ds.env} "
                              "or data of the configured environment")
        if ds.source != source:
            raise ConfigError(f"{path} holds {ds.source} data, expected {source} here: pass it with "
                              f"--{'real' if ds.source == 'real' else 'imaginary'}")
        log(f"  {ds.env}/{ds.level}: {ds.num_trajectories} {source} trajectories from {path}")
        out.append(ds)
    return out


# ---------------------------------------------------------------------------------------------------
# Imaginary data
# ---------------------------------------------------------------------------------------------------
def _level_key(seed: int, index: int) -> jax.Array:
    """The generation key of the index-th imagined level."""
    return jax.random.fold_in(jax.random.PRNGKey(seed), index)


def imagine_datasets(config: Config, real: Sequence[TrajectoryDataset], out_dir: str | Path,
                     log: Log = log_stderr) -> list[TrajectoryDataset]:
    """Fine-tunes the imaginer preset on ``real`` and writes one imaginary dataset per level to ``out_dir``.

    The fine-tuning run lives in ``out_dir/imaginer`` and resumes from its checkpoints; a level's dataset
    already written by the same weights with the same count and key is read back, not generated again.

    Returns:
      The imaginary datasets, in the order of :func:`~imaginejax.config.imagined_levels`.
    """
    from imaginejax.imaginer.finetune import finetune
    from imaginejax.imaginer.imagine import write_imaginary_datasets

    im, env_name = config.imagine, config.data.env
    out_dir = Path(out_dir)
    start = time.perf_counter()
    if im.preset == "shipped":
        from imaginejax.imaginer.shipped import ShippedImaginerError, load_shipped

        try:
            imaginer = load_shipped(env_name)
        except ShippedImaginerError as error:
            raise ConfigError(f"imagine.preset 'shipped': {error}") from None
        log(f"imaginer: the package's trained {env_name} imaginer ({imaginer.model_name}, {imaginer.step} "
            f"fine-tuning steps; no fine-tuning now) loaded in {time.perf_counter() - start:.0f}s")
    else:
        log(f"imaginer: fine-tuning preset {im.preset!r} {dict(im.finetune) or ''} on "
            f"{sum(ds.num_trajectories for ds in real)} real trajectories in {out_dir / 'imaginer'} (skip it with "
            "imagine.preset='shipped' where a trained imaginer ships, or pass --imaginary)")
        try:
            imaginer = finetune(im.preset, list(real), out_dir / "imaginer", resume=True, progress=True,
                                **dict(im.finetune)).imaginer
        except TypeError as error:  # a preset field the imaginer does not know
            raise ConfigError(f"imagine.finetune: {error}") from None
        log(f"imaginer: {imaginer.step} fine-tuning steps done ({time.perf_counter() - start:.0f}s)")
    datasets = []
    for index, level in enumerate(imagined_levels(config)):
        path, count, key = out_dir / f"{env_name}-{level}-imaginary", level_episodes(config, level), _level_key(im.seed, index)
        # write_imaginary_datasets generates its i-th level with fold_in(key, i); here i = 0.
        key_data = [int(v) for v in np.asarray(jax.random.fold_in(key, 0)).ravel()]
        provenance = read_manifest(path).get("provenance", {}) if (path / "manifest.json").exists() else {}
        if (provenance.get("checkpoint_hash") == imaginer.checkpoint_hash
                and provenance.get("num_requested") == count and provenance.get("key") == key_data):
            log(f"  {env_name}/{level}: reading imaginary rollouts written by these weights from {path}")
        else:
            start = time.perf_counter()
            write_imaginary_datasets(imaginer, env_name, out_dir, count, key, levels=(level,),
                                     embed=config.data.embed, overwrite=True, chunk_size=im.chunk_size,
                                     progress=sys.stderr.isatty())
            log(f"  {env_name}/{level}: generated {count} imaginary rollouts in {time.perf_counter() - start:.0f}s")
        ds = load_dataset(path)
        p = ds.provenance
        log(f"  {env_name}/{level}: {ds.num_trajectories} imaginary rollouts, {ds.num_transitions} steps, "
            f"{p.get('success_rate', float('nan')):.0%} reach their goal, {p.get('num_dropped_nonfinite', 0)} dropped")
        datasets.append(ds)
    return datasets


def imaginary_data(config: Config, real: Sequence[TrajectoryDataset], out_dir: str | Path,
                   log: Log = log_stderr) -> list[TrajectoryDataset]:
    """The configuration's imaginary data (``imagine.source``): imaginer rollouts, oracle expert
    rollouts of the novel levels, or nothing."""
    if config.imagine.source == "none":
        return []
    if config.imagine.source == "oracle":
        return oracle_data(config, log)
    return imagine_datasets(config, real, out_dir, log)


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------
def fingerprint(datasets: Sequence[TrajectoryDataset]) -> str:
    """SHA-256 over the arrays (and level, source) of ``datasets``: identifies the data a sweep used."""
    digest = hashlib.sha256()
    for ds in datasets:
        digest.update(f"{ds.env}/{ds.level}/{ds.source}".encode())
        for field in ("states", "actions", "rewards", "mask", "terminals", "truncations", "instruction_ids",
                      "goals", "instruction_embeddings"):
            digest.update(np.ascontiguousarray(getattr(ds, field)).tobytes())
    return digest.hexdigest()


def evaluation_levels(config: Config) -> dict[str, tuple[Any, Any]]:
    """The evaluated levels (``train.eval_levels``, default every level of the environment): level -> (env, params)."""
    return {level: envs.make(config.data.env, level,
                             embed=encode_instructions if config.data.embed else None)
            for level in config.train.eval_levels or envs.ENV_LEVELS[config.data.env]}


def env_interface(config: Config) -> Spec:
    """The algorithms' view of the configured environment, from the environment alone (no data, no
    sentence encoder: E is the encoder's width when ``data.embed``, else 0)."""
    facts = EnvFacts.of(envs.make(config.data.env, "train")[0], legality=False)
    return Spec(state_dim=facts.state_dim, embed_dim=EMBED_DIM if config.data.embed else 0,
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


def algorithm_names(config: Config, spec: Spec) -> tuple[str, ...]:
    """``train.algos``, or every registered algorithm for the action space."""
    return tuple(config.train.algos) or algo_registry.registered(spec.discrete)


def eval_episodes(config: Config, eval_levels: dict[str, tuple[Any, Any]]) -> dict[str, int]:
    """Episodes per evaluation of each level: ``train.eval_episodes`` rounded up to a multiple of the
    level's task count (:func:`~imaginejax.evaluation.episodes_per_level`)."""
    from imaginejax.evaluation import episodes_per_level

    return {level: episodes_per_level(config.train.eval_episodes, int(params.goals.shape[0]))
            for level, (_, params) in eval_levels.items()}


def eval_steps_per_run(config: Config, eval_levels: dict[str, tuple[Any, Any]]) -> int:
    """Environment steps of one evaluation of one run: Σ_levels episodes × max_steps."""
    episodes = eval_episodes(config, eval_levels)
    return sum(episodes[level] * int(params.max_steps) for level, (_, params) in eval_levels.items())


def train_algorithm(config: Config, name: str, spec: Spec, eval_levels: dict[str, tuple[Any, Any]],
                    real: Transitions, imag: Mapping[str, Transitions], run_dir: str | Path,
                    log: Log = log_stderr) -> Results:
    """One algorithm's sweep (seeds × hyperparameters × data conditions × ratios), resumed from
    ``run_dir`` when possible.

    Args:
      config: the configuration (``train`` section; ``logging`` for the display and metric sinks).
      name: registry name of the algorithm.
      spec: the environment interface.
      eval_levels: level -> (env, params) evaluated after every interval.
      real: the real transitions.
      imag: source name -> transitions mixed into the real data (:func:`mixed_sources`); runs on real data
        only are part of the sweep when ``train.conditions`` holds 'real'.
      run_dir: the sweep's directory (metrics, ``task_success.json``, ``train.log``, ``checkpoints/``).
      log: message sink.

    Returns:
      The sweep's :class:`~imaginejax.results.Results`.
    """
    t = config.train
    settings = t.algo.get(name)
    data = ([""] if "real" in data_conditions(config) else []) + list(imag)
    if not data:
        raise ConfigError(f"train.conditions {list(t.conditions)} leave nothing to train: no imaginary or oracle data "
                          "was produced (check imagine.source, train.ratios and the datasets given)")
    algo, base_hp, sweep = algorithm_sweep(config, name, spec, data)
    batch_size = settings.batch_size if settings is not None and settings.batch_size else t.batch_size
    engine = EngineConfig(batch_size=batch_size, updates_per_interval=t.updates // t.intervals,
                          num_intervals=t.intervals, eval_episodes=t.eval_episodes, run_block=t.run_block or None)
    trainer = make_train(algo, spec, engine, eval_levels)
    net, options = algorithm_shapes(config, name)
    run_dir, writer = Path(run_dir), distributed.is_writer()
    if writer:
        run_dir.mkdir(parents=True, exist_ok=True)
    sinks = MetricSinks(run_dir, name, tensorboard=writer and config.logging.tensorboard,
                        wandb=writer and config.logging.wandb, wandb_project=config.logging.wandb_project,
                        wandb_mode=config.logging.wandb_mode, config=config.to_json())
    progress = IntervalProgress(name, sweep.num_runs, t.intervals, engine.updates_per_interval,
                                eval_steps_per_run(config, eval_levels),
                                mode=config.logging.progress if writer else "off",
                                log_file=run_dir / "train.log" if writer else None, on_interval=sinks.sync)
    episodes = eval_episodes(config, eval_levels)
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
    trained = TrainedRuns(env=config.data.env, spec=spec, net=net, options=options, states=result.result.state.algo,
                          runs=tuple(range(sweep.num_runs)))
    return dataclasses.replace(results, trained={name: trained})


def algorithm_sweep(config: Config, name: str, spec: Spec, data: Sequence[str]) -> tuple[Any, Any, Sweep]:
    """Algorithm ``name`` built as configured (``train.algo.<name>.options``), its hp for one run, and the
    sweep of ``train.seeds`` × its ``hp`` / ``sweep`` grid × ``data`` × ``train.ratios``, checked by building it.

    Raises:
      ConfigError: an unknown option or hyperparameter, or a value of the wrong kind, named with the fix.
      SweepMemoryError: the runs' final states, rows and results would not fit in the host's available
        memory (checked by counting, before the table is built).
    """
    t = config.train
    settings = t.algo.get(name)
    net, options = algorithm_shapes(config, name)
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
    levels = len(t.eval_levels or envs.ENV_LEVELS[config.data.env])
    check_host_memory(runs, host_bytes_per_run(state, t.intervals, levels),
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
    spec = env_interface(config)
    for name in dict.fromkeys((*algorithm_names(config, spec), *config.train.algo)):
        algorithm_sweep(config, name, spec, [""])


def algorithm_shapes(config: Config, name: str) -> tuple[NetConfig | None, dict[str, Any]]:
    """The network (``train.encoder_width`` and ``train.hidden``; None: the algorithm's reference) and the
    static options (``train.algo.<name>.options``) algorithm ``name`` is built with."""
    t = config.train
    settings = t.algo.get(name)
    net = NetConfig(encoder_width=t.encoder_width, hidden=tuple(t.hidden)) if t.encoder_width else None
    return net, dict(settings.options) if settings is not None else {}


# ---------------------------------------------------------------------------------------------------
# Workspace
# ---------------------------------------------------------------------------------------------------
WORKSPACE_FILE = "workspace.json"
RANDOM_FILE = "random.json"
WORKSPACE_FIX = "it records the workspace's configuration; restore it, or train into a new --out"
RANDOM_FIX = "delete it: the next imaginejax train / bench in this workspace measures the random policy again"


def random_policy_success(eval_levels: dict[str, tuple[Any, Any]], spec: Spec, episodes: Mapping[str, int],
                          key: jax.Array | None = None) -> dict[str, float]:
    """Success rate of the uniformly random policy per level (discrete actions), evaluated as every run is
    (``episodes[level]`` episodes, every task equally often): the floor drawn on the bar chart. Empty for
    continuous actions."""
    from imaginejax.evaluation import evaluate

    if not spec.discrete:
        return {}
    key = jax.random.PRNGKey(0) if key is None else key

    def policy(obs: jax.Array, key: jax.Array) -> jax.Array:
        return jax.random.randint(key, obs.shape[:1], 0, spec.action_dim)

    def success(env: Any, params: Any, episodes: int) -> float:
        return float(jax.jit(lambda key: evaluate(policy, env, params, key, episodes).success_rate)(key))

    return {level: success(env, params, episodes[level]) for level, (env, params) in eval_levels.items()}


def _results_key(config: Config) -> dict[str, Any]:
    key = config.results_key()
    # An empty train.eval_levels (every level) stays out of the key, so it equals a key without that field.
    key["train"] = {k: v for k, v in key["train"].items() if k != "algos" and (k != "eval_levels" or v)}
    return key


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _differences(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: {json.dumps(old)} -> {json.dumps(new)}"]


def open_workspace(out: str | Path, config: Config) -> Path:
    """Creates ``out`` or checks that its recorded configuration matches ``config`` (resume).

    Raises:
      ConfigError: ``out`` was created with a configuration that changes results (fields named).
    """
    out = Path(out).expanduser()
    record_path = out / WORKSPACE_FILE
    key = _results_key(config)
    if record_path.exists():
        old = read_json(record_path, WORKSPACE_FIX)
        with fields_of(record_path, WORKSPACE_FIX):
            diff = _differences(old["key"], key)
            recorded_report = old["config"].get("report")
        if diff:
            raise ConfigError(f"{out} was created with another configuration ({'; '.join(diff)}): re-run with the "
                              "same preset and --set values to resume it, or choose a new --out")
        report_section = config.to_json()["report"]
        if recorded_report != report_section and distributed.is_writer():
            # The report settings change no result: the latest ones are what `imaginejax report` reuses.
            old["config"]["report"] = report_section
            write_json(record_path, old)
    else:
        out.mkdir(parents=True, exist_ok=True)
        write_json(record_path, {"key": key, "config": config.to_json(), "data": {}})
    return out


def check_data(out: Path, real: Sequence[TrajectoryDataset], imag: Sequence[TrajectoryDataset]) -> None:
    """Records the data fingerprints in the workspace, or checks them against the recorded ones.

    Raises:
      ConfigError: the workspace's sweeps were trained on other data.
    """
    record_path = out / WORKSPACE_FILE
    record = read_json(record_path, WORKSPACE_FIX)
    now = {"real": fingerprint(real), "imaginary": fingerprint(imag)}
    if record.get("data"):
        with fields_of(record_path, WORKSPACE_FIX):
            changed = [k for k in now if record["data"].get(k) != now[k]]
        if changed:
            raise ConfigError(f"{out} was trained on other {' and '.join(changed)} data: pass the same datasets "
                              "to resume it, or choose a new --out")
        return
    record["data"] = now
    write_json(record_path, record)


def source_summary(datasets: Sequence[TrajectoryDataset]) -> dict[str, Any]:
    """What a data source holds: trajectories, transitions, the quality summary of imaginary data (the
    first dataset's, None for expert data) and the filters applied to it."""
    provenance = datasets[0].provenance
    return {"trajectories": int(sum(ds.num_trajectories for ds in datasets)),
            "transitions": int(sum(ds.num_transitions for ds in datasets)),
            "source": datasets[0].source, "quality": provenance.get("quality"),
            "filters": provenance.get("filters", [])}


# Seconds per unit of work on a 2-core CPU, for the plan's rough estimate (measured: docs/estimates.md).
ROUGH_SECONDS = {"compile": 20.0, "sample": 1.5e-5, "eval_step": 2e-5, "rollout": 0.2, "collect": 10.0,
                 "finetune_step": 1.5, "finetune_step_tiny": 0.5}


def plan(config: Config, out: str | Path, *, imaginary_paths: Sequence[str | Path] = (), real_given: bool = False,
         oracle_paths: Sequence[str | Path] = ()) -> str:
    """What :func:`train` is about to do, before it does it: data, imaginer (fine-tuned or loaded, and how
    to skip fine-tuning), algorithms, runs, levels, evaluation episodes, updates, and a rough time
    estimate from these sizes (``ROUGH_SECONDS`` per unit of work; compilation dominates small runs)."""
    from imaginejax.imaginer.finetune import PRESETS

    d, im, t = config.data, config.imagine, config.train
    levels = tuple(t.eval_levels or envs.ENV_LEVELS[d.env])
    bare_levels = {lv: envs.make(d.env, lv) for lv in levels}
    spec = env_interface(config)
    algos = algorithm_names(config, spec)
    conditions = data_conditions(config)
    imaginary_given = bool(imaginary_paths)
    given_levels = {"imaginary": sorted({read_manifest(path)["level"] for path in imaginary_paths}),
                    "oracle": sorted({read_manifest(path)["level"] for path in oracle_paths})}
    sources = [""] if "real" in conditions else []
    for condition in ("imaginary", "oracle"):
        if condition in conditions or (condition == "imaginary" and imaginary_given):
            given = imaginary_given if condition == "imaginary" else bool(oracle_paths)
            levels_of = given_levels[condition] if given else imagined_levels(config)
            sources += [f"{condition}/pooled"] if t.protocol == "pooled" else [f"{condition}/{lv}" for lv in levels_of]
    runs = {name: algorithm_sweep(config, name, spec, sources)[2].num_runs for name in algos}  # as trained
    configs = Sweep.grid(seeds=1, ratios=t.ratios, data=sources).num_runs  # data configurations per seed
    eval_steps = eval_steps_per_run(config, bare_levels)
    seconds = sum(ROUGH_SECONDS["compile"] + n * t.updates * t.batch_size * ROUGH_SECONDS["sample"]
                  + n * t.intervals * eval_steps * ROUGH_SECONDS["eval_step"] for n in runs.values())
    lines = [f"plan ({d.env}, preset {config.name or 'custom'}) -> {out}:",
             "  real data: " + ("the given --real datasets" if real_given else
                                f"{d.episodes} expert trajectories of train (cached in {data_root(config)})")]
    imagined = imagined_levels(config)
    collections = ([] if real_given else [("train", d.episodes, d.seed)]) + (
        [(lv, level_episodes(config, lv), im.seed + i) for i, lv in enumerate(imagined)]
        if ("oracle" in conditions and not oracle_paths)
        or ("imaginary" in conditions and im.source == "oracle" and not imaginary_given) else [])
    seconds += ROUGH_SECONDS["collect"] * sum(  # datasets not cached yet
        not (cached_expert_path(d.env, lv, n, seed, d.epsilon, data_root(config), embed=d.embed) / "manifest.json").exists()
        for lv, n, seed in collections)
    if imaginary_given:
        lines.append("  imaginary data: the given --imaginary datasets (no imaginer)")
    elif "imaginary" in conditions and im.source == "imaginer":
        rollouts = sum(level_episodes(config, lv) for lv in imagined)
        seconds += rollouts * ROUGH_SECONDS["rollout"]
        if im.preset == "shipped":
            lines.append(f"  imaginary data: the package's trained {d.env} imaginer, loaded (no fine-tuning)")
        else:
            steps = int(dict(im.finetune).get("num_steps", PRESETS[im.preset].num_steps))
            seconds += steps * ROUGH_SECONDS["finetune_step_tiny" if im.preset == "tiny" else "finetune_step"]
            lines.append(f"  imaginary data: FINE-TUNES imaginer preset {im.preset!r} for {steps} steps on the real "
                         f"data first (resumable, in {Path(out) / 'imaginary' / 'imaginer'}); skip it with --set "
                         "imagine.preset=shipped (a trained imaginer, where one ships), --set imagine.source=oracle "
                         "or none, or --imaginary DIR")
        lines.append(f"    then {rollouts} imaginary rollouts for {', '.join(imagined)}")
    elif "imaginary" in conditions and im.source == "oracle":
        lines.append(f"  imaginary data: oracle expert rollouts of {', '.join(imagined)} (no imaginer)")
    else:
        lines.append("  imaginary data: none")
    if "oracle" in conditions:
        lines.append("  oracle data: " + (f"the given --oracle datasets ({', '.join(given_levels['oracle'])})" if oracle_paths
                                          else f"expert rollouts of {', '.join(imagined)} (cached)"))
    lines += [f"  algorithms: {', '.join(algos)}" + ("" if t.algos else " (every registered one; choose with --algo "
                                                     "or train.algos)"),
              "  runs: " + ", ".join(f"{name} {n}" for name, n in runs.items())
              + f" ({count(t.seeds, 'seed')} × {count(configs, 'data configuration')}"
              + "".join(f" × {name}'s {count(n // (t.seeds * configs), 'hyperparameter setting')}"
                        for name, n in runs.items() if n != t.seeds * configs)
              + f"), {t.updates} updates each (batch {t.batch_size})",
              f"  evaluation: {'once' if t.intervals == 1 else f'{t.intervals} times'}, episodes per level: "
              + ", ".join(f"{lv} {n}" for lv, n in eval_episodes(config, bare_levels).items()),
              f"  estimate: roughly {format_seconds(seconds)} on a 2-core CPU (from these sizes, measured within 10-30 % "
              "on such a machine; more cores are faster, a loaded machine slower)" if jax.default_backend() == "cpu"
              else f"  estimate: none for a {jax.default_backend().upper()} yet (the progress line's ETA follows from "
                   "the second interval)"]
    return "\n".join(lines)


@dataclasses.dataclass
class TrainOutcome:
    """What :func:`train` did: every algorithm's runs, the workspace, seconds per algorithm."""

    workspace: Path
    results: Results
    seconds: dict[str, float]


def train(config: Config, out: str | Path, *, real_paths: Sequence[str | Path] = (),
          imaginary_paths: Sequence[str | Path] = (), oracle_paths: Sequence[str | Path] = (),
          log: Log = log_stderr) -> TrainOutcome:
    """Data (given or from the pipeline), then every configured algorithm's sweep, in workspace ``out``.

    Args:
      config: the configuration.
      out: workspace directory (created, or resumed).
      real_paths: real dataset directories (default: the configuration's expert data).
      imaginary_paths: imaginary dataset directories (default: ``imagine.source``'s data).
      oracle_paths: real rollouts of the novel levels for the oracle condition (default: collected by the
        environment's expert, cached).
      log: message sink.
    """
    log = log if distributed.is_writer() else _quiet
    # Across processes: the settings first, then the data, before any check that can fail on one process.
    distributed.agree({**config.to_json(), "--out": str(out), "--real": [str(p) for p in real_paths],
                       "--imaginary": [str(p) for p in imaginary_paths], "--oracle": [str(p) for p in oracle_paths]})
    check_algorithms(config)
    check_oracle_given(config, oracle_paths)
    out = distributed.writer_first(lambda: open_workspace(out, config))
    log(plan(config, out, imaginary_paths=imaginary_paths, real_given=bool(real_paths), oracle_paths=oracle_paths))
    env_name = config.data.env
    log(f"data ({env_name}):")
    real = load_datasets(real_paths, "real", env_name, log) if real_paths else distributed.writer_first(
        lambda: real_data(config, log))
    sources = distributed.writer_first(lambda: mixed_sources(config, real, out, imaginary_paths=imaginary_paths,
                                                             oracle_paths=oracle_paths, log=log))
    imag = [ds for datasets in sources.values() for ds in datasets]
    if jax.process_count() > 1:
        distributed.check_same({"real data": fingerprint(real),
                                **{f"imaginary data {name}": fingerprint(ds) for name, ds in sources.items()}})
    distributed.writer_first(lambda: check_data(out, real, imag))
    eval_levels = evaluation_levels(config)
    spec = interface(real[0], eval_levels)
    facts = EnvFacts.of(next(iter(eval_levels.values()))[0])
    for ds in list(real) + imag:  # before anything compiles: actions, states, widths against the environment
        try:
            validate_for_env(ds, facts, embed_dim=spec.embed_dim)
        except DatasetError as error:
            raise ConfigError(f"{ds.source} data of {ds.env}/{ds.level}: {error}") from None
    for ds in imag:
        if ds.instruction_embeddings.shape[1] != spec.embed_dim or ds.states.shape[-1] != spec.state_dim:
            raise ConfigError(f"imaginary data of level {ds.level} has {ds.states.shape[-1]}-d states and "
                              f"{ds.instruction_embeddings.shape[1]}-d embeddings, the real data "
                              f"{spec.state_dim}-d and {spec.embed_dim}-d: generate both with the same data.embed")
    if config.data.rl_episodes and not real_paths:
        real = first_trajectories(real, config.data.rl_episodes)
        log(f"  RL trains on the first {config.data.rl_episodes} real trajectories (data.rl_episodes)")
    real_t = concat_transitions([to_transitions(ds, validate=False) for ds in real])
    imag_t = {name: concat_transitions([to_transitions(ds, validate=False) for ds in datasets])
              for name, datasets in sources.items()}
    summaries = {name: source_summary(datasets) for name, datasets in sources.items()}
    if distributed.is_writer():
        write_json(out / SOURCES_FILE, summaries)
    if distributed.is_writer() and not (out / RANDOM_FILE).exists():
        write_json(out / RANDOM_FILE, {"policy": "uniformly random actions",
                                       "success": random_policy_success(eval_levels, spec,
                                                                  eval_episodes(config, eval_levels))})
    results, seconds = Results(runs=(), levels=(), sources=json.loads(json.dumps(summaries))), {}
    for name in algorithm_names(config, spec):
        start = time.perf_counter()
        try:
            trained = train_algorithm(config, name, spec, eval_levels, real_t, imag_t, out / "runs" / name, log)
        except Interrupted as stop:
            raise Interrupted(f"{name} {stop}") from None
        results = results.merge(trained)
        seconds[name] = time.perf_counter() - start
        log(f"{name}: done in {seconds[name]:.0f}s")
    return TrainOutcome(workspace=out, results=results, seconds=seconds)


def report_paths(out: str | Path, statistic: str) -> tuple[Path, Path]:
    """Where a statistic's table and figures go: ``results.md`` and ``figures/`` for the default IQM,
    ``results-<statistic>.md`` and ``figures-<statistic>/`` otherwise, so no statistic overwrites another's."""
    suffix = "" if statistic == "iqm" else f"-{statistic}"
    return Path(out) / f"results{suffix}.md", Path(out) / f"figures{suffix}"


def _workspace_of(out: Path) -> Path | None:
    """The workspace holding ``out`` (itself, or the workspace of a ``runs/<algo>`` directory)."""
    return next((d for d in (out, out.parent.parent) if (d / WORKSPACE_FILE).exists()), None)


def workspace_config(out: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """(workspace, its recorded configuration as JSON) of the workspace holding ``out``
    (:func:`_workspace_of`), or None.

    Raises:
      DamagedFile: the workspace's record is not readable JSON or lacks its fields (the file is named).
    """
    workspace = _workspace_of(Path(out))
    if workspace is None:
        return None
    record = workspace / WORKSPACE_FILE
    with fields_of(record, WORKSPACE_FIX):
        config = read_json(record, WORKSPACE_FIX)["config"]
        if not isinstance(config["data"]["env"], str) or not isinstance(config.get("report", {}), dict):
            raise TypeError("config.data.env is not a string or config.report not a table")
    return workspace, config


def workspace_env(out: str | Path) -> tuple[Path, str] | None:
    """(workspace, its ``data.env``) of the workspace holding ``out`` (:func:`_workspace_of`), or None."""
    found = workspace_config(out)
    return None if found is None else (found[0], found[1]["data"]["env"])


def report(results: Results, out: str | Path, config: Config, *, figures: bool | None = None,
           log: Log = log_stderr) -> str:
    """The results tables (:func:`imaginejax.report.table`) and the figures (``report.figures``, or
    ``figures`` when given) written to :func:`report_paths` (by the writer process); returns the tables.

    Args:
      results: in memory from :func:`train`, or :func:`imaginejax.results.load_sweep` of a directory.
      out: the workspace or sweep directory.
      config: its ``report`` section is used.
      figures: override ``report.figures``.
    """
    r = config.report
    text = table(results, r.statistic, r.reps, r.seed, r.last)
    if not distributed.is_writer():
        return text
    table_path, figures_dir = report_paths(out, r.statistic)
    write_text(table_path, text + "\n")
    if r.figures if figures is None else figures:
        from imaginejax.figures import write_figures

        found = workspace_env(out)
        env = floor = None
        if found is not None:
            workspace, env = found
            if (workspace / RANDOM_FILE).exists():
                with fields_of(workspace / RANDOM_FILE, RANDOM_FIX):
                    floor = {str(k): float(v) for k, v in read_json(workspace / RANDOM_FILE, RANDOM_FIX)["success"].items()}
        written = write_figures(results, figures_dir, statistic=r.statistic, reps=r.reps, seed=r.seed,
                                last=r.last, env=env, floor=floor)
        log(f"figures: {', '.join(sorted(p.name for p in written.values()))} in {figures_dir}")
    return text


def bench(config: Config, out: str | Path, log: Log = log_stderr) -> str:
    """The whole protocol (see the module docstring); returns the results table."""
    start = time.perf_counter()
    outcome = train(config, out, log=log)
    text = report(outcome.results, outcome.workspace, config, log=log)
    total = time.perf_counter() - start
    timing = ", ".join(f"{k} {v:.0f}s" for k, v in outcome.seconds.items())
    log(f"bench: {total:.0f}s in total (training: {timing})")
    return text
