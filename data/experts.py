"""Expert trajectories of one level: collected by the environment's expert (:func:`imaginejax.envs.expert_policy`)
and cached under a directory named after the collection parameters, so every command reuses them."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax

from imaginejax import envs
from imaginejax.core.runlog import Log, log_stderr
from imaginejax.data import TrajectoryDataset, load_dataset, read_manifest, save_dataset
from imaginejax.data.collect import Policy, collect
from imaginejax.lang import encode_instructions


def expert_policy(env_name: str, epsilon: float) -> Policy:
    """The expert of environment ``env_name`` as a collection policy (:func:`imaginejax.envs.expert_policy`;
    ``epsilon`` is its noise: a random-action probability, or an action-noise std for continuous actions).

    Raises:
      ValueError: the environment ships no expert, or ``epsilon`` < 0.
    """
    try:
        return envs.expert_policy(env_name, epsilon)
    except ValueError as error:
        raise ValueError(f"{error}; or pass real data with --real") from None


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
