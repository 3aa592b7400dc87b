"""Shared fixtures' makers and checks of the dataset interop tests (Minari, reference files, hostile input)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from imaginejax import envs
from imaginejax.data import TrajectoryDataset
from imaginejax.data.collect import collect, random_policy

# The array fields of a TrajectoryDataset that every interop format carries.
ARRAY_FIELDS = ("states", "actions", "rewards", "mask", "terminals", "truncations", "instruction_ids", "goals",
                "instruction_embeddings")


def random_babyai_dataset(num: int, key_seed: int, embed_dim: int, table_seed: int) -> TrajectoryDataset:
    """``num`` random-policy BabyAI "train" trajectories collected from ``PRNGKey(key_seed)`` in one chunk,
    with an (M, embed_dim) float32 N(0, 1) embedding table drawn from ``default_rng(table_seed)``."""
    env, params = envs.make("babyai", "train", embed=False)
    ds = collect(env, params, random_policy(env.num_actions), jax.random.PRNGKey(key_seed), num, chunk_size=num,
                 progress=False)
    table = np.random.default_rng(table_seed).normal(size=(len(ds.instructions), embed_dim)).astype(np.float32)
    return dataclasses.replace(ds, instruction_embeddings=table)


def assert_bit_exact(a: TrajectoryDataset, b: TrajectoryDataset, metadata: Sequence[str] = ()) -> None:
    """Every array of :data:`ARRAY_FIELDS` has the same dtype, shape and bytes in ``a`` and ``b``, and each
    named ``metadata`` field (e.g. "env", "provenance") is equal."""
    for name in ARRAY_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
    for name in metadata:
        assert getattr(a, name) == getattr(b, name), name
