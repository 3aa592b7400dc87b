"""Core data types shared by every layer.

Two views of the same data:

* :class:`TrajectoryDataset` — host-side (NumPy), trajectory-major, with metadata. This is what is
  written to and read from disk (see :mod:`imaginejax.data.io`) and what collection / the imaginer produce.
* :class:`Transitions` — a device-side pytree of flat transitions (valid steps only), the input of the
  training engine; :class:`Batch` — one minibatch drawn from it (see :mod:`imaginejax.data.sampling`).

Conventions (all layers): ``N`` trajectories, ``T`` padded steps, ``S`` state width, ``A`` continuous
action width, ``G`` goal-vector width, ``M`` instructions in the table, ``E`` embedding width, ``K`` valid
transitions, ``B`` batch size.

Terminals are *true* terminations only (e.g. the task's success predicate held). A time limit or the end
of a generated rollout is a *truncation*: the value of the next state is still bootstrapped.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np
from flax import struct
import jax

SOURCES = ("real", "imaginary")
LEVELS = ("train", "rephrase", "easy", "hard")


@dataclasses.dataclass(frozen=True)
class TrajectoryDataset:
    """Padded trajectories of one environment, one level, one source.

    Attributes:
      states: (N, T+1, S) float32. ``states[i, t]`` is s_t; ``states[i, t+1]`` the state after step t.
        Entries past a trajectory's end are padding (zeros).
      actions: (N, T) int32 for discrete action spaces, (N, T, A) float32 for continuous ones.
      rewards: (N, T) float32.
      mask: (N, T) bool, True on valid steps. Valid steps form a prefix of each row.
      terminals: (N, T) bool, True where the episode truly terminated after step t (never a time limit).
      truncations: (N, T) bool, True where the episode was cut after step t without terminating
        (time limit, end of a generated rollout). A row's last valid step is terminal or truncated.
      instruction_ids: (N,) int32 index into ``instructions``.
      goals: (N, G) goal vectors in the environment's encoding (int32 or float32).
      instructions: the instruction table, M strings.
      instruction_embeddings: (M, E) float32, row m embeds ``instructions[m]`` (E may be 0).
      env: environment name (registry key), e.g. ``"clevr"``.
      level: one of :data:`LEVELS`.
      source: one of :data:`SOURCES`.
      discrete: True when actions are integer indices.
      provenance: free-form JSON-serialisable metadata (collector, seed, model, checkpoint hash, ...).
    """

    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    mask: np.ndarray
    terminals: np.ndarray
    truncations: np.ndarray
    instruction_ids: np.ndarray
    goals: np.ndarray
    instructions: tuple[str, ...]
    instruction_embeddings: np.ndarray
    env: str
    level: str
    source: Literal["real", "imaginary"]
    discrete: bool
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def num_trajectories(self) -> int:
        return int(self.states.shape[0])

    def __repr__(self) -> str:
        """Sizes, widths and dtypes instead of the arrays (equality still compares every field)."""
        states, actions = np.asarray(self.states), np.asarray(self.actions)
        action = f"{actions.dtype} (discrete)" if self.discrete else f"{actions.shape[-1]} {actions.dtype}"
        goals, embeddings = np.asarray(self.goals), np.asarray(self.instruction_embeddings)
        return (f"TrajectoryDataset(env={self.env!r}, level={self.level!r}, source={self.source!r}, "
                f"{self.num_trajectories} trajectories × {self.horizon} steps ({self.num_transitions:,} valid), "
                f"state {states.shape[-1]} {states.dtype}, action {action}, goal {goals.shape[-1]} {goals.dtype}, "
                f"{len(self.instructions)} instructions, embedding {embeddings.shape[-1]} {embeddings.dtype})")

    @property
    def horizon(self) -> int:
        return int(self.mask.shape[1])

    @property
    def num_transitions(self) -> int:
        return int(self.mask.sum())


ROW_FIELDS = ("states", "actions", "rewards", "mask", "terminals", "truncations", "instruction_ids", "goals")


def take_trajectories(ds: TrajectoryDataset, rows: np.ndarray) -> TrajectoryDataset:
    """The trajectories ``rows`` (index array) of ``ds``, in that order; tables and provenance unchanged."""
    return dataclasses.replace(ds, **{field: getattr(ds, field)[rows] for field in ROW_FIELDS})


@struct.dataclass
class Transitions:
    """Flat valid transitions on device (a pytree; vmappable and shardable).

    Attributes:
      state: (K, S) float32.
      action: (K,) int32 or (K, A) float32.
      reward: (K,) float32.
      next_state: (K, S) float32.
      terminal: (K,) float32, 1.0 on true terminations (the bootstrap is cut), 0.0 otherwise —
        including time-limit truncations.
      instruction: (K,) int32 index into ``embeddings``.
      goal: (K, G) goal vector of the transition's task.
      embeddings: (M, E) float32 instruction-embedding table of this buffer.
    """

    state: jax.Array
    action: jax.Array
    reward: jax.Array
    next_state: jax.Array
    terminal: jax.Array
    instruction: jax.Array
    goal: jax.Array
    embeddings: jax.Array

    @property
    def size(self) -> int:
        return int(self.state.shape[-2])


@struct.dataclass
class Batch:
    """One training minibatch (see :func:`imaginejax.data.sampling.sample_mixed`).

    Attributes:
      state: (B, S) float32.
      embedding: (B, E) float32 instruction embedding of each transition.
      action: (B,) int32 or (B, A) float32.
      reward: (B,) float32.
      next_state: (B, S) float32.
      terminal: (B,) float32, 1.0 on true terminations only.
      imaginary: (B,) bool, True for transitions drawn from the imaginary buffer.
    """

    state: jax.Array
    embedding: jax.Array
    action: jax.Array
    reward: jax.Array
    next_state: jax.Array
    terminal: jax.Array
    imaginary: jax.Array

    @property
    def observation(self) -> jax.Array:
        """(B, S+E) policy input: state ⊕ instruction embedding."""
        return jax.numpy.concatenate([self.state, self.embedding], axis=-1)

    @property
    def next_observation(self) -> jax.Array:
        """(B, S+E) policy input at the next state: next_state ⊕ the same instruction embedding."""
        return jax.numpy.concatenate([self.next_state, self.embedding], axis=-1)
