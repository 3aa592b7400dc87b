"""The scripted BabyAI expert: BFS distances, and success >= 95 % on every task of every level."""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.envs.babyai import expert as X
from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai import tasks as T
from imaginejax.envs.babyai.env import BabyAI, make_params

ENV = BabyAI()
EPISODES_PER_TASK = 20
MIN_EPISODES = 120


def python_bfs(target: np.ndarray, passable: np.ndarray) -> np.ndarray:
    """Reference breadth-first search on a (6, 6) grid (rows y, columns x)."""
    dist = np.full(target.shape, X.UNREACHABLE, np.int64)
    queue = collections.deque()
    for cell in zip(*np.nonzero(target)):
        dist[cell] = 0
        queue.append(cell)
    while queue:
        i, j = queue.popleft()
        for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            a, b = i + di, j + dj
            if 0 <= a < 6 and 0 <= b < 6 and passable[a, b] and dist[a, b] > dist[i, j] + 1:
                dist[a, b] = dist[i, j] + 1
                queue.append((a, b))
    return dist


def test_bfs_matches_a_reference_search_with_obstacles():
    rng = np.random.default_rng(0)
    batch = 64
    target = rng.random((6, 6, batch)) < 0.05
    passable = rng.random((6, 6, batch)) < 0.75
    target[0, 0] |= ~target.any(axis=(0, 1))  # at least one target each
    got = np.asarray(jax.jit(X.bfs_distances)(jnp.asarray(target), jnp.asarray(passable)))
    for b in range(batch):
        np.testing.assert_array_equal(got[:, :, b], python_bfs(target[:, :, b], passable[:, :, b] | target[:, :, b]))
    # Without obstacles the room's shortest paths are Manhattan distances.
    free = np.asarray(jax.jit(X.bfs_distances)(jnp.asarray(target)))
    ys, xs = np.mgrid[0:6, 0:6]
    for b in range(4):
        ty, tx = np.nonzero(target[:, :, b])
        manhattan = np.min(np.abs(ys[..., None] - ty) + np.abs(xs[..., None] - tx), axis=-1)
        np.testing.assert_array_equal(free[:, :, b], manhattan)


@functools.lru_cache(maxsize=None)
def _runner(level: str, batch: int, epsilon: float):
    params = make_params(level, embed=False)
    policy = X.make_policy(X.ExpertConfig(epsilon=epsilon))

    @jax.jit
    def run(key: jax.Array, task: jax.Array):
        key_reset, key_run = jax.random.split(key)
        obs, state = ENV.reset_to_task_batch(jax.random.split(key_reset, batch), params, task)

        def cond(carry):
            _, state, i = carry
            return (i < params.max_steps) & ~jnp.all(state.done)

        def body(carry):
            obs, state, i = carry
            k = jax.random.fold_in(key_run, i)
            action = policy(k, obs, state, params)
            obs, state, _, _, _ = ENV.step_batch(jax.random.split(k, batch), state, action, params)
            return obs, state, i + 1

        _, state, _ = jax.lax.while_loop(cond, body, (obs, state, jnp.int32(0)))
        return state.success, state.t

    return params, run


def expert_success(level: str, epsilon: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-task success rate (K,), mean episode length (K,), and the level's goal table."""
    goals = T.level_goals(level)
    k = len(goals)
    batch = max(EPISODES_PER_TASK * k, MIN_EPISODES - MIN_EPISODES % k)
    _, run = _runner(level, batch, epsilon)
    task = np.arange(batch) % k
    success, length = jax.device_get(run(jax.random.PRNGKey(seed), jnp.asarray(task)))
    per_task = np.bincount(task, weights=success, minlength=k) / np.bincount(task, minlength=k)
    mean_len = np.bincount(task, weights=length, minlength=k) / np.bincount(task, minlength=k)
    return per_task, mean_len, goals


@pytest.mark.parametrize("level", ["train", "rephrase", "easy", "hard"])
def test_expert_solves_every_task(level):
    per_task, mean_len, goals = expert_success(level)
    lines = [f"{T.describe_goal(g):55s} success {s:.3f}  mean length {n:5.1f}" for g, s, n in zip(goals, per_task, mean_len)]
    print(f"\n[{level}] expert success per task (epsilon 0, {EPISODES_PER_TASK}+ episodes per task)\n" + "\n".join(lines))
    bad = [line for line, s in zip(lines, per_task) if s < 0.95]
    assert not bad, "expert below 95 %:\n" + "\n".join(bad)


@pytest.mark.parametrize("level", ["train", "hard"])
def test_expert_with_exploration_noise_still_succeeds(level):
    """The collection setting (epsilon 0.1: one random action in ten) still solves >= 95 % per task."""
    per_task, _, goals = expert_success(level, epsilon=0.1, seed=1)
    print(f"\n[{level}] epsilon 0.1: min success per task {per_task.min():.3f}, mean {per_task.mean():.3f}")
    assert (per_task >= 0.95).all(), {T.describe_goal(g): float(s) for g, s in zip(goals, per_task) if s < 0.95}


def test_expert_is_vmappable_over_runs():
    params = make_params("hard", embed=False)
    keys = jax.random.split(jax.random.PRNGKey(2), 6)
    _, state = ENV.reset_to_task_batch(keys, params, jnp.arange(6) % 3)
    grids = jax.tree.map(lambda v: v.reshape(2, 3), state.grid)
    goals = params.goals[state.task].reshape(2, 3, T.GOAL_DIM)
    run_keys = jax.random.split(jax.random.PRNGKey(3), 2)
    vmapped = jax.jit(jax.vmap(X.expert_actions))(run_keys, grids, goals)
    single = jax.jit(X.expert_actions)
    direct = jnp.stack([single(run_keys[r], jax.tree.map(lambda v: v[r], grids), goals[r]) for r in range(2)])
    np.testing.assert_array_equal(np.asarray(vmapped), np.asarray(direct))
    assert vmapped.shape == (2, 3) and bool(((vmapped >= 0) & (vmapped < G.NUM_ACTIONS)).all())
