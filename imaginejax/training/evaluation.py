"""Policy evaluation inside the compiled training call.

Episodes run in the batched JAX environment (``env.reset_to_task_batch`` / ``env.step_batch``) for the
level's step cap, with the environment's own success predicate. Every task of the level is evaluated the
same number of times: a requested episode count is rounded up to a multiple of the level's K tasks
(:func:`episodes_per_level`) and episode i runs task ``i mod K``, so the level's success rate is the mean
of its per-task rates. Pure and jit/vmap-able: the engine vmaps it over runs.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct

PolicyFn = Callable[[jax.Array, jax.Array], jax.Array]  # (obs (B, S+E), key) -> actions (B, ...)


@struct.dataclass
class EvalResult:
    """Outcome of evaluating one policy on one level.

    Attributes:
      success_rate: () fraction of episodes whose success predicate held (= the mean over tasks: every
        task runs equally often).
      mean_return: () mean undiscounted return.
      mean_length: () mean episode length (steps until done or the cap).
      task_success: (K,) success rate per task of the level.
    """

    success_rate: jax.Array
    mean_return: jax.Array
    mean_length: jax.Array
    task_success: jax.Array


def episodes_per_level(num_episodes: int, num_tasks: int) -> int:
    """``num_episodes`` rounded up to a multiple of ``num_tasks``: E·K episodes, E = ceil(n / K) >= 1 per task."""
    if num_episodes < 1 or num_tasks < 1:
        raise ValueError(f"need num_episodes >= 1 and num_tasks >= 1, got {num_episodes} and {num_tasks}")
    return -(-num_episodes // num_tasks) * num_tasks


def evaluate(policy: PolicyFn, env: Any, params: Any, key: jax.Array, num_episodes: int) -> EvalResult:
    """Runs at least ``num_episodes`` episodes of ``policy`` on the level described by ``params``: the same
    number of each of its K tasks (:func:`episodes_per_level`).

    Args:
      policy: maps a batch of observations (B, S+E) and a key to actions (B,) / (B, A).
      env: an environment with ``reset_to_task_batch(keys, params, tasks)`` and
        ``step_batch(keys, states, actions, params)`` (see ``imaginejax.envs``).
      params: the level's environment parameters (task table, embeddings, step cap).
      key: PRNG key.
      num_episodes: requested episodes (static), rounded up to B = E·K; episode i runs task ``i mod K``.

    Returns:
      An :class:`EvalResult`.
    """
    num_tasks = params.goals.shape[0]
    num_episodes = episodes_per_level(num_episodes, num_tasks)
    tasks = jnp.arange(num_episodes, dtype=jnp.int32) % num_tasks
    reset_key, run_key = jax.random.split(key)
    obs, state = env.reset_to_task_batch(jax.random.split(reset_key, num_episodes), params, tasks)

    def body(carry, step_key):
        obs, state, ret, success, done, length = carry
        act_key, env_key = jax.random.split(step_key)
        action = policy(obs, act_key)
        obs, state, reward, step_done, info = env.step_batch(
            jax.random.split(env_key, num_episodes), state, action, params
        )
        live = ~done
        ret = ret + jnp.where(live, reward, 0.0)
        success = success | (live & info["success"])
        length = length + live.astype(jnp.int32)
        return (obs, state, ret, success, done | step_done, length), None

    zeros_f = jnp.zeros((num_episodes,), jnp.float32)
    zeros_b = jnp.zeros((num_episodes,), bool)
    init = (obs, state, zeros_f, zeros_b, zeros_b, jnp.zeros((num_episodes,), jnp.int32))
    (_, _, ret, success, _, length), _ = jax.lax.scan(
        body, init, jax.random.split(run_key, params.max_steps)
    )
    per_task = jax.ops.segment_sum(success.astype(jnp.float32), tasks, num_tasks) * (num_tasks / num_episodes)
    return EvalResult(
        success_rate=success.mean(),
        mean_return=ret.mean(),
        mean_length=length.astype(jnp.float32).mean(),
        task_success=per_task,
    )
