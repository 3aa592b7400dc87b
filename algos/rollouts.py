"""Model rollouts for model-based offline RL (COMBO): a circular buffer of model rows, h-step rollouts of
the current policy in a learned model, the row weights that mix dataset and model rows, and a
termination predicate built from an environment's success test.

    d_f = f · D + (1 − f) · d_M^π:   w_td = (f / B on dataset rows, (1 − f) v / Σv on valid model rows)
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from imaginejax.algos.base import Spec
from imaginejax.algos.common import RowWeights
from imaginejax.data.types import Batch

# (state (n, S), action (n,) | (n, A), next_state (n, S), embedding (n, E)) -> (n,) bool, raw states.
TerminalFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]
PolicyFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]  # (state, embedding, key) -> action
ModelStepFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


@struct.dataclass
class ModelBuffer:
    """A circular buffer of C model rows: ``valid`` (C,) 1 for usable rows, write position ``ptr``, ``filled``."""

    rows: Batch
    valid: jax.Array
    ptr: jax.Array
    filled: jax.Array


def init_model_buffer(spec: Spec, capacity: int) -> ModelBuffer:
    """An empty buffer of ``capacity`` rows for ``spec``'s shapes."""
    action = (jnp.zeros((capacity,), jnp.int32) if spec.discrete
              else jnp.zeros((capacity, spec.action_dim), jnp.float32))
    rows = Batch(state=jnp.zeros((capacity, spec.state_dim), jnp.float32),
                 embedding=jnp.zeros((capacity, spec.embed_dim), jnp.float32), action=action,
                 reward=jnp.zeros((capacity,), jnp.float32),
                 next_state=jnp.zeros((capacity, spec.state_dim), jnp.float32),
                 terminal=jnp.zeros((capacity,), jnp.float32), imaginary=jnp.zeros((capacity,), bool))
    return ModelBuffer(rows=rows, valid=jnp.zeros((capacity,), jnp.float32), ptr=jnp.zeros((), jnp.int32),
                       filled=jnp.zeros((), jnp.int32))


def write_model_rows(buffer: ModelBuffer, rows: Batch, valid: jax.Array) -> ModelBuffer:
    """Writes W rows at ``ptr`` and advances it; W must divide the capacity (a write never wraps)."""
    capacity, w = buffer.valid.shape[0], valid.shape[0]
    if capacity % w:
        raise ValueError(f"model buffer capacity {capacity} is not a multiple of the {w} rows written per update")
    put = lambda old, new: jax.lax.dynamic_update_slice_in_dim(old, new.astype(old.dtype), buffer.ptr, axis=0)
    return ModelBuffer(rows=jax.tree.map(put, buffer.rows, rows), valid=put(buffer.valid, valid),
                       ptr=(buffer.ptr + w) % capacity, filled=jnp.minimum(buffer.filled + w, capacity))


def sample_model_rows(buffer: ModelBuffer, key: jax.Array, num_rows: int) -> tuple[Batch, jax.Array]:
    """``num_rows`` rows drawn uniformly (with replacement) from the filled part, and their (n,) validity."""
    idx = jax.random.randint(key, (num_rows,), 0, jnp.maximum(buffer.filled, 1))
    rows = jax.tree.map(lambda x: x[idx], buffer.rows)
    return rows, buffer.valid[idx] * (buffer.filled > 0)


def model_rollout(key: jax.Array, state: jax.Array, embedding: jax.Array, policy: PolicyFn,
                  model_step: ModelStepFn, terminal_fn: TerminalFn | None, horizon: int) -> tuple[Batch, jax.Array]:
    """h model steps from n raw start states (n, S) with their embeddings (n, E) kept along the rollout.

    Returns h·n rows, step-major, and their validity (h·n,): False after a termination or once a prediction
    was non-finite (such rows keep next_state = state and reward 0). Without ``terminal_fn`` nothing
    terminates: a rollout's last step is a truncation.
    """
    n = state.shape[0]

    def body(carry, step_key):
        s, alive = carry
        k_pi, k_model = jax.random.split(step_key)
        action = policy(s, embedding, k_pi)
        next_s, reward = model_step(s, embedding, action, k_model)
        finite = jnp.all(jnp.isfinite(next_s), axis=-1) & jnp.isfinite(reward)
        valid = alive & finite
        next_s = jnp.where(valid[:, None], next_s, s)
        reward = jnp.where(valid, reward, 0.0)
        done = (jnp.zeros((n,), bool) if terminal_fn is None
                else jnp.asarray(terminal_fn(s, action, next_s, embedding), bool))
        row = Batch(state=s, embedding=embedding, action=action, reward=reward, next_state=next_s,
                    terminal=(done & valid).astype(jnp.float32), imaginary=jnp.zeros((n,), bool))
        return (next_s, valid & ~done), (row, valid)

    _, (rows, valid) = jax.lax.scan(body, (state, jnp.ones((n,), bool)), jax.random.split(key, horizon))
    flat = lambda x: x.reshape((horizon * n,) + x.shape[2:])
    return jax.tree.map(flat, rows), flat(valid)


def combo_weights(num_data: int, model_valid: jax.Array, real_fraction: jax.Array | float,
                  rho_data_weight: jax.Array | float) -> RowWeights:
    """Row weights of B dataset rows followed by B_m model rows of validity (B_m,).

    td = actor = (f/B, (1 − f) v/Σv), push_down = (ρ_D/B, (1 − ρ_D) v/Σv), push_up = (1/B, 0); without a
    valid model row f = ρ_D = 1 (plain CQL on the dataset).
    """
    valid = model_valid.astype(jnp.float32)
    n_valid = jnp.sum(valid)
    has_model = n_valid > 0
    f = jnp.where(has_model, real_fraction, 1.0)
    rho = jnp.where(has_model, rho_data_weight, 1.0)
    data = jnp.full((num_data,), 1.0 / num_data, jnp.float32)
    model = valid / jnp.maximum(n_valid, 1.0)
    td = jnp.concatenate([f * data, (1.0 - f) * model])
    return RowWeights(td=td, push_down=jnp.concatenate([rho * data, (1.0 - rho) * model]),
                      push_up=jnp.concatenate([data, jnp.zeros_like(model)]), actor=td)


def concat_rows(a: Batch, b: Batch) -> Batch:
    """Rows of ``a`` followed by rows of ``b``."""
    return jax.tree.map(lambda x, y: jnp.concatenate([x, y.astype(x.dtype)], axis=0), a, b)


def instruction_goals(params: Any) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings (M, E), goals (M, G)) of one level's instruction table (``EnvParams``-like ``params``)."""
    embeddings = np.asarray(params.instruction_embeddings, np.float32)
    goals_k, ids, counts = (np.asarray(params.goals), np.asarray(params.phrasing_ids),
                            np.asarray(params.phrasing_counts))
    goals = np.zeros((embeddings.shape[0], goals_k.shape[1]), goals_k.dtype)
    assigned = np.zeros(embeddings.shape[0], bool)
    for k in range(goals_k.shape[0]):
        for m in ids[k, : counts[k]]:
            if assigned[m] and not np.array_equal(goals[m], goals_k[k]):
                raise ValueError(f"instruction {m} of level {getattr(params, 'level', '?')!r} belongs to two tasks "
                                 "with different goals: its embedding cannot identify a goal")
            goals[m], assigned[m] = goals_k[k], True
    return embeddings[assigned], goals[assigned]


def success_terminal_fn(success: Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array],
                        *levels: Any) -> TerminalFn:
    """A ``terminal_fn`` from ``success(prev_state, action, next_state, goal)`` and the levels whose
    instructions occur in the data: each embedding is matched to the nearest instruction's goal.

    Raises ValueError without levels, without embedded instructions (E = 0), or when equal embeddings have
    different goals.
    """
    if not levels:
        raise ValueError("success_terminal_fn needs the EnvParams of at least one level")
    tables = [instruction_goals(p) for p in levels]
    embeddings = np.concatenate([t[0] for t in tables])
    goals = np.concatenate([t[1] for t in tables])
    if embeddings.shape[1] == 0:
        raise ValueError("success_terminal_fn: the levels' instructions are not embedded (E = 0); build the "
                         "params with embed=True so that an embedding identifies its instruction's goal")
    _, first, inverse = np.unique(embeddings, axis=0, return_index=True, return_inverse=True)
    clash = ~np.all(goals == goals[first][inverse.reshape(-1)], axis=1)
    if clash.any():
        raise ValueError(f"success_terminal_fn: instruction embeddings {np.flatnonzero(clash).tolist()} equal "
                         "others with a different goal; the embedding cannot identify the goal")
    table, table_goals = jnp.asarray(embeddings), jnp.asarray(goals)
    table_sq = jnp.sum(jnp.square(table), axis=-1)

    def terminal_fn(state: jax.Array, action: jax.Array, next_state: jax.Array, embedding: jax.Array) -> jax.Array:
        distance = table_sq[None] - 2.0 * embedding @ table.T  # + |e|², constant per row
        goal = table_goals[jnp.argmin(distance, axis=-1)]
        return jnp.asarray(success(state, action, next_state, goal), bool)

    return terminal_fn
