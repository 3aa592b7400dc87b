"""The data of a sweep: real data (cached expert trajectories, or given datasets), imaginary data (the
imaginer's rollouts, filtered as ``imagine.filter`` says) and oracle data (expert rollouts of the novel
levels), grouped into the sources mixed into the real data (``"<condition>/<level>"``)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from imaginejax.bench.config import ConfigError, Resolved, TrainConfig
from imaginejax.core.runlog import Log, log_stderr, quiet
from imaginejax.data import TrajectoryDataset, load_dataset, read_manifest
from imaginejax.data.experts import cached_expert_data
from imaginejax.data.types import take_trajectories

DataArg = str | os.PathLike[str] | TrajectoryDataset  # a dataset directory, or a dataset in memory


def origin(item: DataArg) -> str:
    """Where a given dataset comes from, for messages and the settings exchange of several processes."""
    if isinstance(item, TrajectoryDataset):
        return f"memory ({item.env}/{item.level} {item.source} data, {item.num_trajectories} trajectories)"
    return str(item)


def real_data(run: Resolved, log: Log = log_stderr) -> list[TrajectoryDataset]:
    """The configuration's real data: expert trajectories of the training level (cached)."""
    d = run.data
    return [cached_expert_data(d.env, "train", d.episodes, d.seed, d.epsilon, run.data_root, embed=d.embed, log=log)]


def first_trajectories(datasets: Sequence[TrajectoryDataset], count: int) -> list[TrajectoryDataset]:
    """The first ``count`` trajectories of ``datasets`` in order (datasets cut or dropped as needed)."""
    out, left = [], count
    for ds in datasets:
        if left <= 0:
            break
        n = min(left, ds.num_trajectories)
        out.append(take_trajectories(ds, np.arange(n)))
        left -= n
    return out


def oracle_data(run: Resolved, log: Log = log_stderr) -> list[TrajectoryDataset]:
    """Expert rollouts of every imagined level's tasks (cached): the oracle condition's data."""
    d = run.data
    return [cached_expert_data(d.env, level, run.episodes[level], run.imagine.seed + i, d.epsilon, run.data_root,
                               embed=d.embed, log=log)
            for i, level in enumerate(run.imagined)]


def filter_imaginary(run: Resolved, datasets: Sequence[TrajectoryDataset],
                     log: Log = log_stderr) -> list[TrajectoryDataset]:
    """``imagine.filter`` applied to imaginer rollouts (:func:`~imaginejax.imaginer.quality.filter_dataset`;
    the filter and its counts are recorded in each dataset's provenance). With ``imagine.oversample`` the
    filter sees the kept rollouts only: under 'consistent-legal' that is the same as filtering all generated
    rollouts and keeping the best that pass (the ranking puts every rollout that passes first, per task);
    under 'legal' a task can lose legal rollouts that missed their goal to goal-reaching illegal ones the
    filter then drops."""
    if run.imagine.filter == "none":
        return list(datasets)
    from imaginejax.imaginer.quality import QualityError, filter_dataset, score_dataset

    out = []
    for ds in datasets:
        try:
            kept = filter_dataset(ds, score_dataset(ds), require_legal=True,
                                  require_goal=run.imagine.filter == "consistent-legal")
        except QualityError as error:
            others = json.dumps([level for level in run.imagined if level != ds.level])
            raise QualityError(
                f"imagine.filter = {run.imagine.filter!r} keeps no rollout of {ds.env}/{ds.level} (0 of "
                f"{ds.num_trajectories}): train it unfiltered (imagine.filter = 'none'), generate more "
                f"candidates (a larger imagine.oversample), or leave the level out "
                f"(--set 'imagine.levels={others}')") from error
        log(f"  {ds.env}/{ds.level}: filter {run.imagine.filter!r} kept {kept.num_trajectories} of "
            f"{ds.num_trajectories} imaginary rollouts{_of_generated(ds, kept.num_trajectories)}")
        out.append(kept)
    return out


def _of_generated(ds: TrajectoryDataset, kept: int) -> str:
    """``", 12 of 512 generated (imagine.oversample = 4)"`` for an oversampled dataset, else ``""``."""
    record = ds.provenance.get("oversample")
    if not isinstance(record, dict):
        return ""
    return f", {kept} of {record.get('generated')} generated (imagine.oversample = {record.get('k')})"


def reusable(provenance: Mapping[str, Any], checkpoint_hash: str, count: int, key: list[int],
             oversample: int) -> bool:
    """Whether a written imaginary dataset (its ``provenance``) is what generating ``count`` rollouts with
    these weights, key and ``imagine.oversample`` would write (a dataset recording no oversampling: 1)."""
    recorded = provenance.get("oversample", {"k": 1})
    k = recorded.get("k") if isinstance(recorded, dict) else None
    return (provenance.get("checkpoint_hash") == checkpoint_hash and provenance.get("num_requested") == count
            and provenance.get("key") == key and k == oversample)


def check_oracle_given(run: Resolved, train: TrainConfig, oracle: Sequence[DataArg]) -> None:
    """Refuses oracle datasets for a sweep that trains no oracle condition (ConfigError naming the fix)."""
    if oracle and "oracle" not in run.conditions:
        raise ConfigError(f"--oracle data is given but the oracle condition is not trained (train.conditions = "
                          f"{list(train.conditions)}, ratios {list(train.ratios)}): add 'oracle' to "
                          "train.conditions and a ratio > 0 to train.ratios")


def mixed_sources(run: Resolved, real: Sequence[TrajectoryDataset], out_dir: str | Path, *,
                  imaginary: Sequence[DataArg] = (), oracle: Sequence[DataArg] = (),
                  log: Log = log_stderr) -> dict[str, list[TrajectoryDataset]]:
    """The data mixed into the real data, by source name: ``"<condition>/<level>"`` (per-level protocol)
    or ``"<condition>/pooled"``, for the conditions 'imaginary' and 'oracle' trained (``run.conditions``).
    ``imaginary`` / ``oracle``: given datasets (directories or in memory) instead of the pipeline's; ``oracle``
    holds real rollouts of novel levels to use as the oracle's data instead of collecting them
    (:func:`train` has refused them already when no oracle condition is trained: :func:`check_oracle_given`).

    Raises:
      ConfigError: a given imaginary or oracle dataset is of a level that is not a novel level of the
        environment.
    """
    conditions, env_name, novel = run.conditions, run.env, run.novel
    per_condition: dict[str, list[TrajectoryDataset]] = {}
    if imaginary or "imaginary" in conditions:
        if imaginary:
            datasets = load_datasets(imaginary, "imaginary", env_name, log)
        else:
            datasets = imaginary_data(run, real, Path(out_dir) / "imaginary", log)
        per_condition["imaginary"] = filter_imaginary(run, datasets, log)
    if "oracle" in conditions:
        per_condition["oracle"] = (load_datasets(oracle, "real", env_name, log) if oracle
                                   else oracle_data(run, log))
    sources: dict[str, list[TrajectoryDataset]] = {}
    for condition, datasets in per_condition.items():
        for ds in datasets:
            if ds.level not in novel:
                raise ConfigError(f"{condition} data of level {ds.level!r} cannot be mixed into a novel level of "
                                  f"{env_name} ({', '.join(novel)}): {condition} data is made for (and "
                                  "mixed into) the level of its instructions")
        if run.protocol == "pooled":
            sources[f"{condition}/pooled"] = list(datasets)
            continue
        for level in novel:
            parts = [ds for ds in datasets if ds.level == level]
            if parts:
                sources[f"{condition}/{level}"] = parts
    return sources


def load_datasets(items: Sequence[DataArg], source: str, env_name: str,
                  log: Log = quiet) -> list[TrajectoryDataset]:
    """Datasets read from directories or given in memory, checked to be of ``env_name`` and ``source``.

    Raises:
      ConfigError: a dataset of another environment or source (the message names the directory).
    """
    out = []
    for item in items:
        ds = item if isinstance(item, TrajectoryDataset) else load_dataset(item)
        path = origin(item)
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


def imagine_datasets(run: Resolved, real: Sequence[TrajectoryDataset], out_dir: str | Path,
                     log: Log = log_stderr) -> list[TrajectoryDataset]:
    """Fine-tunes the imaginer preset on ``real`` and writes one imaginary dataset per level to ``out_dir``.

    The fine-tuning run lives in ``out_dir/imaginer`` and resumes from its checkpoints; with validation on
    (``imagine.finetune.validation``) its best checkpoint writes the rollouts, and their provenance says
    so (``training_step``, ``checkpoint_selection``). A level's dataset already written by the same weights
    with the same count, key and ``imagine.oversample`` (:func:`reusable`) is read back, not generated again.

    Returns:
      The imaginary datasets, in the order of ``run.imagined``.
    """
    from imaginejax.imaginer.finetune import finetune, load_imaginer
    from imaginejax.imaginer.imagine import write_imaginary_datasets

    im, env_name = run.imagine, run.env
    out_dir = Path(out_dir)
    start = time.perf_counter()
    if im.preset == "shipped":
        from imaginejax.imaginer.shipped import ShippedImaginerError, load_shipped

        try:
            imaginer = load_shipped(env_name, compute_dtype=dict(im.finetune).get("compute_dtype"))
        except ShippedImaginerError as error:
            raise ConfigError(f"imagine.preset 'shipped': {error}") from None
        log(f"imaginer: the package's trained {env_name} imaginer ({imaginer.model_name}, {imaginer.step} "
            f"fine-tuning steps; no fine-tuning now) loaded in {time.perf_counter() - start:.0f}s")
    else:
        log(f"imaginer: fine-tuning preset {im.preset!r} {dict(im.finetune) or ''} on "
            f"{sum(ds.num_trajectories for ds in real)} real trajectories in {out_dir / 'imaginer'} (skip it with "
            "imagine.preset='shipped' where a trained imaginer ships, or pass --imaginary)")
        try:
            result = finetune(im.preset, list(real), out_dir / "imaginer", resume=True, progress=True,
                              **dict(im.finetune))
        except TypeError as error:  # a preset field the imaginer does not know
            raise ConfigError(f"imagine.finetune: {error}") from None
        imaginer = result.imaginer
        log(f"imaginer: {imaginer.step} fine-tuning steps done ({time.perf_counter() - start:.0f}s)")
        if result.best_step is not None:
            imaginer = load_imaginer(result.run_dir, "best", model_path=dict(im.finetune).get("model_path"),
                                     compute_dtype=dict(im.finetune).get("compute_dtype"))
            log(f"imaginer: the best checkpoint by validation writes the rollouts: step {imaginer.step} "
                f"(score {imaginer.selection['score']:.3f}; the last step is {result.imaginer.step})")
    datasets = []
    for index, level in enumerate(run.imagined):
        path, count, key = out_dir / f"{env_name}-{level}-imaginary", run.episodes[level], _level_key(im.seed, index)
        # write_imaginary_datasets generates its i-th level with fold_in(key, i); here i = 0.
        key_data = [int(v) for v in np.asarray(jax.random.fold_in(key, 0)).ravel()]
        provenance = read_manifest(path).get("provenance", {}) if (path / "manifest.json").exists() else {}
        if reusable(provenance, imaginer.checkpoint_hash, count, key_data, im.oversample):
            log(f"  {env_name}/{level}: reading imaginary rollouts written by these weights from {path}")
        else:
            start = time.perf_counter()
            write_imaginary_datasets(imaginer, env_name, out_dir, count, key, levels=(level,),
                                     embed=run.data.embed, overwrite=True, chunk_size=im.chunk_size,
                                     oversample=im.oversample, progress=sys.stderr.isatty())
            made = f"{im.oversample} × {count} imaginary rollouts" if im.oversample > 1 else f"{count} imaginary rollouts"
            log(f"  {env_name}/{level}: generated {made} in {time.perf_counter() - start:.0f}s")
        ds = load_dataset(path)
        p = ds.provenance
        log(f"  {env_name}/{level}: {ds.num_trajectories} imaginary rollouts{_of_generated(ds, ds.num_trajectories)}, "
            f"{ds.num_transitions} steps, {p.get('success_rate', float('nan')):.0%} reach their goal, "
            f"{p.get('num_dropped_nonfinite', 0)} dropped")
        datasets.append(ds)
    return datasets


def imaginary_data(run: Resolved, real: Sequence[TrajectoryDataset], out_dir: str | Path,
                   log: Log = log_stderr) -> list[TrajectoryDataset]:
    """The configuration's imaginary data (``imagine.source``): imaginer rollouts, oracle expert
    rollouts of the novel levels, or nothing."""
    if run.imagine.source == "none":
        return []
    if run.imagine.source == "oracle":
        return oracle_data(run, log)
    return imagine_datasets(run, real, out_dir, log)
