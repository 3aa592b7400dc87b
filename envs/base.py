"""What every instruction-following environment shares: the level's task table and the thin views.

An environment module supplies its world (state pytree, batched dynamics, goals and predicates); this
module supplies, once:

* :class:`EnvParams` — a level's task table (goal vectors, phrasing ids per task, instruction
  embeddings, step cap), built by :func:`make_level_params`;
* :func:`instruction_table` — the level's unique instruction strings and each task's ids into them;
* :class:`TaskEnv` — observation = state ⊕ instruction embedding, the goal of a state, the episode
  bookkeeping of a step (:meth:`TaskEnv.episode_flags`), and the single-environment ``reset`` /
  ``reset_to_task`` / ``step`` as batch-of-one views of the batched kernels ``reset_batch`` /
  ``reset_to_task_batch`` / ``step_batch`` that a subclass implements.
"""

from __future__ import annotations

from typing import Any, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class EnvParams:
    """A level's task table (a pytree; the int/str fields are static).

    Attributes:
      goals: (K, G) int32 goal vectors in the environment's encoding.
      phrasing_ids: (K, P) int32 ids into the level's instruction table; row k's first
        ``phrasing_counts[k]`` entries are valid, the rest are -1.
      phrasing_counts: (K,) int32.
      instruction_embeddings: (M, E) float32, row m embeds instruction m (E may be 0).
      max_steps: episode cap (static).
      level: level name (static).
      reset_tries: candidate initial states drawn at reset (static; see the environment).
    """

    goals: jax.Array
    phrasing_ids: jax.Array
    phrasing_counts: jax.Array
    instruction_embeddings: jax.Array
    max_steps: int = struct.field(pytree_node=False, default=50)
    level: str = struct.field(pytree_node=False, default="train")
    reset_tries: int = struct.field(pytree_node=False, default=16)

    @property
    def num_tasks(self) -> int:
        return int(self.goals.shape[0])

    @property
    def embed_dim(self) -> int:
        return int(self.instruction_embeddings.shape[1])


def instruction_table(per_task: Sequence[Sequence[str]]) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """Deduplicates the tasks' phrasings into one table.

    Args:
      per_task: K lists of phrasings, one per task, in task order.

    Returns:
      table: M unique strings, task-major then phrasing order.
      phrasing_ids: (K, P) int32 read-only, row k holds task k's ids into ``table``, padded with -1.
      phrasing_counts: (K,) int32 read-only, number of valid ids per row.
    """
    table: list[str] = []
    index: dict[str, int] = {}
    for phrasings in per_task:
        for text in phrasings:
            if text not in index:
                index[text] = len(table)
                table.append(text)
    width = max(len(p) for p in per_task)
    ids = np.full((len(per_task), width), -1, np.int32)
    counts = np.zeros(len(per_task), np.int32)
    for k, phrasings in enumerate(per_task):
        ids[k, : len(phrasings)] = [index[t] for t in phrasings]
        counts[k] = len(phrasings)
    ids.setflags(write=False)
    counts.setflags(write=False)
    return tuple(table), ids, counts


def make_level_params(level: str, goals: np.ndarray,
                      table: tuple[tuple[str, ...], np.ndarray, np.ndarray], max_steps: int, *,
                      embed: bool, reset_tries: int) -> EnvParams:
    """Builds :class:`EnvParams` from a level's goals (K, G) and its :func:`instruction_table`.

    With ``embed`` the strings are embedded by :func:`imaginejax.lang.encode_instructions` (384-d,
    cached); otherwise the embeddings are (M, 0) and observations are the bare state.
    """
    strings, phrasing_ids, counts = table
    if embed:
        from imaginejax.lang import encode_instructions  # lazy: loads the sentence encoder

        embeddings = np.asarray(encode_instructions(list(strings)), np.float32)
    else:
        embeddings = np.zeros((len(strings), 0), np.float32)
    chex.assert_shape(embeddings, (len(strings), None))
    return EnvParams(
        goals=jnp.asarray(goals, jnp.int32),
        phrasing_ids=jnp.asarray(phrasing_ids, jnp.int32),
        phrasing_counts=jnp.asarray(counts, jnp.int32),
        instruction_embeddings=jnp.asarray(embeddings, jnp.float32),
        max_steps=max_steps,
        level=level,
        reset_tries=reset_tries,
    )


def _take_first(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[0], tree)


def _add_batch(tree: Any) -> Any:
    return jax.tree.map(lambda x: jnp.asarray(x)[None], tree)


class TaskEnv:
    """Base of the instruction-following environments (stateless; the level lives in the params).

    A subclass sets ``state_dim`` and implements ``state_vector(state)`` and the batched kernels
    ``reset_to_task_batch(keys, params, task, phrasing=None)`` and ``step_batch(keys, state, action,
    params)`` (``reset_batch`` draws tasks uniformly, salted by ``task_salt``); its state pytree has
    fields ``t``, ``task``, ``instruction``, ``done`` and ``success``.
    """

    state_dim: int
    # Folded into each reset key to draw the task in :meth:`reset_batch` (each environment keeps its stream).
    task_salt: int = 0x7A5C

    def reset_batch(self, keys: jax.Array, params: EnvParams) -> tuple[jax.Array, Any]:
        """Resets B environments with uniformly drawn tasks: keys (B,) → obs (B, S + E), state."""
        key_task = jax.vmap(lambda k: jax.random.fold_in(k, self.task_salt))(keys)
        task = jax.vmap(lambda k: jax.random.randint(k, (), 0, params.num_tasks))(key_task)
        return self.reset_to_task_batch(keys, params, task)

    @classmethod
    def obs_dim(cls, params: EnvParams) -> int:
        """Observation width S + E."""
        return cls.state_dim + params.embed_dim

    @staticmethod
    def goal_of(state: Any, params: EnvParams) -> jax.Array:
        """Goal vector(s) of the state's task: (..., G) int32."""
        return params.goals[state.task]

    def observation_batch(self, state: Any, params: EnvParams) -> jax.Array:
        """(B,) states → (B, S + E) float32 observations (state ⊕ instruction embedding)."""
        emb = params.instruction_embeddings[state.instruction]
        return jnp.concatenate([self.state_vector(state), emb], axis=-1).astype(jnp.float32)

    @staticmethod
    def episode_flags(state: Any, succeeded: jax.Array, t: jax.Array, params: EnvParams
                      ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """Episode bookkeeping of one batched step (no auto-reset).

        Args:
          state: the batched state before the step (``done`` (B,) marks finished episodes).
          succeeded: (B,) bool, the success predicate held on this step (already masked by ``~done``).
          t: (B,) int32 step count after the step.
          params: the level's params (``max_steps``).

        Returns:
          done (B,) bool (sticky), success (B,) bool (sticky), and the step's info: ``success`` and
          ``truncated`` (time limit reached without success), each True only on the step that ended
          the episode.
        """
        truncated = ~state.done & ~succeeded & (t >= params.max_steps)
        done = state.done | succeeded | truncated
        return done, state.success | succeeded, {"success": succeeded, "truncated": truncated}

    # ------------------------------------------------------------------ single-environment views
    def reset(self, key: jax.Array, params: EnvParams) -> tuple[jax.Array, Any]:
        """One environment: key → obs (S+E,), state. Equals ``reset_batch(key[None])[i=0]``."""
        return _take_first(self.reset_batch(jnp.asarray(key)[None], params))

    def reset_to_task(self, key: jax.Array, params: EnvParams, task: jax.Array | int,
                      phrasing: jax.Array | int | None = None) -> tuple[jax.Array, Any]:
        """One environment reset to a given task (and optionally phrasing position)."""
        phr = None if phrasing is None else jnp.asarray(phrasing, jnp.int32)[None]
        return _take_first(
            self.reset_to_task_batch(jnp.asarray(key)[None], params, jnp.asarray(task, jnp.int32)[None], phr)
        )

    def step(self, key: jax.Array, state: Any, action: jax.Array | int, params: EnvParams
             ) -> tuple[jax.Array, Any, jax.Array, jax.Array, dict[str, jax.Array]]:
        """One environment step: obs (S+E,), state, reward (), done (), info. No auto-reset."""
        out = self.step_batch(jnp.asarray(key)[None], _add_batch(state),
                              jnp.asarray(action)[None], params)
        return _take_first(out)
