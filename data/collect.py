"""Collection of trajectory datasets by running a policy in a batched JAX environment.

:func:`collect` is environment-agnostic. It needs an environment object with the batched kernels of the
environment contract and a few views::

    env.reset_batch(keys (B,), params) -> (obs (B, D), state)
    env.reset_to_task_batch(keys (B,), params, tasks (B,)) -> (obs, state)       # only with task_indices
    env.step_batch(keys (B,), state, actions, params) -> (obs, state, reward (B,), done (B,),
                                                           {"success": (B,), "truncated": (B,)})
    env.state_vector(state) -> (B, S);  env.goal_of(state, params) -> (B, G);  state.instruction (B,)
    env.instructions(level) -> tuple[str, ...];  env.name;  env.discrete
    params.max_steps (int), params.level (str), params.instruction_embeddings (M, E)

and a policy ``policy(key, obs (B, D), state, params) -> actions`` ((B,) int32 or (B, A) float32).

Each chunk of ``chunk_size`` trajectories is one compiled call: reset, then a ``lax.while_loop`` of at
most ``params.max_steps`` steps that stops once every episode of the chunk has ended. The environment
does not auto-reset, so a finished episode stays frozen and its remaining steps are masked out. Output arrays follow :class:`~imaginejax.data.types.TrajectoryDataset`
exactly: ``states[i, t]`` for ``t <= L_i`` (``L_i`` valid steps), zeros after; ``terminals`` on the step
where the task succeeded, ``truncations`` on the step where the time limit cut the episode.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from imaginejax.data.types import TrajectoryDataset

Policy = Callable[[jax.Array, jax.Array, Any, Any], jax.Array]

__all__ = ["Policy", "collect", "random_policy"]


def random_policy(num_actions: int) -> Policy:
    """A uniformly random discrete policy: ``policy(key, obs, state, params) -> (B,) int32``."""

    def policy(key: jax.Array, obs: jax.Array, state: Any, params: Any) -> jax.Array:
        del state, params
        return jax.random.randint(key, obs.shape[:1], 0, num_actions, jnp.int32)

    return policy


def _key_data(key: jax.Array) -> list[int]:
    """JSON-friendly contents of a PRNG key (raw or typed)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return [int(v) for v in np.asarray(key).ravel()]


_ROLLOUT_CACHE: dict[tuple[Any, ...], Callable] = {}
_ROLLOUT_CACHE_SIZE = 8


def _make_rollout(env: Any, policy: Policy, chunk: int, with_tasks: bool) -> Callable:
    """The jitted chunk rollout ``(key, params, tasks (C,)) → dict of (C, ...) arrays``, cached per
    (env, policy, chunk, with_tasks) so repeated collections with the same policy compile once."""
    cache_key = (env, policy, chunk, with_tasks)
    if cache_key not in _ROLLOUT_CACHE:
        if len(_ROLLOUT_CACHE) >= _ROLLOUT_CACHE_SIZE:
            _ROLLOUT_CACHE.pop(next(iter(_ROLLOUT_CACHE)))
        _ROLLOUT_CACHE[cache_key] = _build_rollout(env, policy, chunk, with_tasks)
    return _ROLLOUT_CACHE[cache_key]


def _build_rollout(env: Any, policy: Policy, chunk: int, with_tasks: bool) -> Callable:
    """Compiles one chunk: (key, params, tasks (C,)) → dict of (C, ...) arrays."""

    def rollout(key: jax.Array, params: Any, task: jax.Array) -> dict[str, jax.Array]:
        key_reset, key_scan = jax.random.split(key)
        reset_keys = jax.random.split(key_reset, chunk)
        if with_tasks:
            obs, state = env.reset_to_task_batch(reset_keys, params, task)
        else:
            obs, state = env.reset_batch(reset_keys, params)
        goal = env.goal_of(state, params)
        instruction = state.instruction

        def one_step(obs: jax.Array, state: Any, key_t: jax.Array) -> tuple[jax.Array, Any, dict[str, jax.Array]]:
            key_policy, key_env = jax.random.split(key_t)
            valid = ~state.done
            state_vec = env.state_vector(state)
            action = policy(key_policy, obs, state, params)
            obs, state, reward, _, info = env.step_batch(jax.random.split(key_env, chunk), state, action, params)
            out = {
                "state": state_vec,
                "action": action,
                "reward": reward,
                "valid": valid,
                "terminal": info["success"] & valid,
                "truncated": info["truncated"] & valid,
            }
            return obs, state, out

        # Time-major buffers, filled by a while loop that stops as soon as every episode has ended
        # (steps never run stay zero / invalid, exactly like the frozen steps of a full scan).
        horizon = params.max_steps
        out_shapes = jax.eval_shape(one_step, obs, state, key_scan)[2]
        buffers = jax.tree.map(lambda x: jnp.zeros((horizon,) + x.shape, x.dtype), out_shapes)

        def cond(carry) -> jax.Array:
            t, _, state, _ = carry
            return (t < horizon) & jnp.any(~state.done)

        def body(carry):
            t, obs, state, buffers = carry
            obs, state, out = one_step(obs, state, jax.random.fold_in(key_scan, t))
            buffers = jax.tree.map(lambda b, o: b.at[t].set(o), buffers, out)
            return t + 1, obs, state, buffers

        _, _, final, ys = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), obs, state, buffers))
        ys = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), ys)  # (C, T, ...)
        mask = ys["valid"]
        # s_0 .. s_{L-1} come from the buffers, s_L (after the last valid step) is the final state:
        # the loop may have stopped before recording it.
        lengths = mask.sum(axis=1)
        steps = jnp.arange(horizon + 1)[None, :, None]
        padded = jnp.concatenate([ys["state"], jnp.zeros_like(ys["state"][:, :1])], axis=1)  # (C, T+1, S)
        states = jnp.where(steps < lengths[:, None, None], padded, env.state_vector(final)[:, None, :])
        state_valid = jnp.concatenate([mask, jnp.zeros_like(mask[:, :1])], axis=1)
        state_valid = state_valid | jnp.concatenate([jnp.zeros_like(mask[:, :1]), mask], axis=1)
        action = ys["action"]
        action_mask = mask.reshape(mask.shape + (1,) * (action.ndim - 2))
        return {
            "states": jnp.where(state_valid[..., None], states, 0.0).astype(jnp.float32),
            "actions": jnp.where(action_mask, action, jnp.zeros_like(action)),
            "rewards": jnp.where(mask, ys["reward"], 0.0).astype(jnp.float32),
            "mask": mask,
            "terminals": ys["terminal"],
            "truncations": ys["truncated"],
            "instruction_ids": instruction.astype(jnp.int32),
            "goals": goal,
        }

    return jax.jit(rollout)


def collect(
    env: Any,
    params: Any,
    policy: Policy,
    key: jax.Array,
    num_trajectories: int,
    *,
    source: Literal["real", "imaginary"] = "real",
    task_indices: np.ndarray | None = None,
    chunk_size: int = 256,
    policy_name: str = "unnamed",
    provenance: dict[str, Any] | None = None,
    progress: bool = True,
    validate: bool = True,
) -> TrajectoryDataset:
    """Runs ``policy`` in the batched environment and returns padded trajectories.

    Args:
      env: environment object (see the module docstring for what it must provide).
      params: the level's environment parameters (pytree; ``max_steps`` and ``level`` static).
      policy: ``policy(key, obs, state, params) -> actions`` on a batch.
      key: PRNG key; chunk c uses ``fold_in(key, c)``.
      num_trajectories: N >= 1.
      source: "real" or "imaginary" (recorded in the dataset).
      task_indices: optional (N,) int task rows (e.g. ``np.arange(N) % K`` to cover every task evenly);
        None samples tasks uniformly at reset.
      chunk_size: trajectories per compiled call (the last chunk is padded and cut).
      policy_name: recorded in the provenance.
      provenance: extra JSON-serialisable metadata merged into the provenance.
      progress: print a progress line per chunk to stderr.
      validate: run :func:`imaginejax.data.validate.validate_dataset` on the result.
    Returns:
      A :class:`TrajectoryDataset` with T = ``params.max_steps``.
    """
    if num_trajectories < 1:
        raise ValueError(f"num_trajectories must be >= 1, got {num_trajectories}")
    if task_indices is not None:
        task_indices = np.asarray(task_indices, np.int32)
        if task_indices.shape != (num_trajectories,):
            raise ValueError(f"task_indices must have shape ({num_trajectories},), got {task_indices.shape}")
    chunk = int(min(chunk_size, num_trajectories))
    rollout = _make_rollout(env, policy, chunk, task_indices is not None)
    n_chunks = -(-num_trajectories // chunk)
    parts: list[dict[str, np.ndarray]] = []
    start = time.perf_counter()
    bar = tqdm(total=num_trajectories, desc=f"collect {env.name}/{params.level} ({source})", unit="traj",
               file=sys.stderr, disable=not progress)
    for c in range(n_chunks):
        lo, hi = c * chunk, min((c + 1) * chunk, num_trajectories)
        if task_indices is not None:
            task = np.resize(task_indices[lo:hi], chunk)  # pad by repetition; padding is cut below
        else:
            task = np.zeros(chunk, np.int32)
        out = jax.device_get(rollout(jax.random.fold_in(key, c), params, jnp.asarray(task)))
        parts.append({k: np.asarray(v)[: hi - lo] for k, v in out.items()})
        if progress:
            steps = sum(int(p["mask"].sum()) for p in parts)
            bar.set_postfix_str(f"{steps:,} steps, {steps / max(time.perf_counter() - start, 1e-9):,.0f} "
                                "valid steps/s", refresh=False)
            bar.update(hi - lo)
    bar.close()
    arrays = {k: np.concatenate([p[k] for p in parts], axis=0) for k in parts[0]}
    elapsed = time.perf_counter() - start
    discrete = bool(env.discrete)
    actions = arrays["actions"].astype(np.int32 if discrete else np.float32)
    goals = arrays["goals"]
    goals = goals.astype(np.int32) if np.issubdtype(goals.dtype, np.integer) else goals.astype(np.float32)
    success_rate = float(arrays["terminals"].any(axis=1).mean())
    meta: dict[str, Any] = {
        "collector": "imaginejax.data.collect",
        "policy": policy_name,
        "key": _key_data(key),
        "num_trajectories": int(num_trajectories),
        "chunk_size": chunk,
        "max_steps": int(params.max_steps),
        "task_indices": "given" if task_indices is not None else "uniform",
        "success_rate": success_rate,
        "seconds": round(elapsed, 3),
        "jax_version": jax.__version__,
    }
    meta.update(provenance or {})
    ds = TrajectoryDataset(
        states=arrays["states"].astype(np.float32),
        actions=actions,
        rewards=arrays["rewards"].astype(np.float32),
        mask=arrays["mask"].astype(bool),
        terminals=arrays["terminals"].astype(bool),
        truncations=arrays["truncations"].astype(bool),
        instruction_ids=arrays["instruction_ids"].astype(np.int32),
        goals=goals,
        instructions=tuple(env.instructions(params.level)),
        instruction_embeddings=np.asarray(params.instruction_embeddings, np.float32),
        env=str(env.name),
        level=str(params.level),
        source=source,
        discrete=discrete,
        provenance=meta,
    )
    if validate:
        from imaginejax.data.validate import validate_dataset

        validate_dataset(ds, num_actions=getattr(env, "num_actions", None) if discrete else None)
    return ds
