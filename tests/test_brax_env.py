"""The MuJoCo environments as brax environments (imaginejax.interop.brax_env), stepped through brax's
training wrappers (vmap, episode length, auto-reset)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from brax.envs.base import Env
from brax.envs.wrappers import training

from imaginejax import envs
from imaginejax.interop import as_brax
from imaginejax.interop.brax_env import BraxEnv


def test_cheetah_through_brax_wrap_follows_mujoco_c_and_ends_and_auto_resets_episodes() -> None:
    batch, length = 2, 4
    assert as_brax("cheetah", "train").observation_size == 18 + 384  # the state and its instruction's MiniLM embedding
    env = as_brax("cheetah", "train", embed=None)
    assert isinstance(env, Env) and env.backend == "mjx"
    assert (env.observation_size, env.action_size) == (18, 6)
    wrapped = training.wrap(env, episode_length=length)
    reset, step = jax.jit(wrapped.reset), jax.jit(wrapped.step)
    rngs = jax.random.split(jax.random.PRNGKey(0), batch)
    state = reset(rngs)
    first_obs = np.asarray(state.obs)

    # The reference: the same episodes on the MuJoCo C backend, reset with the keys BraxEnv.reset draws.
    ours, params = envs.make("cheetah", "train", backend="mujoco")
    keys = jax.vmap(lambda r: jax.random.split(r)[1])(rngs)
    obs, ref = ours.reset_batch(keys, params)
    np.testing.assert_allclose(first_obs, obs, atol=1e-6)
    actions = jax.random.uniform(jax.random.PRNGKey(1), (length, batch, 6), minval=-1.0, maxval=1.0)
    rewards = []
    for t in range(length):
        state = step(state, actions[t])
        obs, ref, reward, _, _ = ours.step_batch(keys, ref, actions[t], params)
        rewards.append(np.asarray(reward))
        if t < length - 1:
            np.testing.assert_allclose(state.obs, obs, atol=1e-3)  # MJX in float32 against MuJoCo C
            np.testing.assert_allclose(state.reward, reward, atol=1e-2)
            assert not np.asarray(state.done).any()
    # The episode length ends the episode: done and truncation on that step, the episode's summed
    # reward in brax's metrics, and the state replaced by the episode's first one.
    np.testing.assert_array_equal(state.done, np.ones(batch))
    np.testing.assert_array_equal(state.info["truncation"], np.ones(batch))
    np.testing.assert_allclose(state.info["episode_metrics"]["sum_reward"], np.sum(rewards, axis=0), atol=5e-2)
    np.testing.assert_array_equal(state.obs, first_obs)
    np.testing.assert_array_equal(state.pipeline_state.t, np.zeros(batch))
    state = step(state, actions[0])
    np.testing.assert_array_equal(state.info["steps"], np.ones(batch))
    assert not np.asarray(state.done).any()
    # The environment's own step cap ends an episode before brax's length: done, without brax's truncation.
    cap = jnp.full((batch,), params.max_steps - 1, jnp.int32)
    state = step(state.replace(pipeline_state=state.pipeline_state.replace(t=cap)), actions[1])
    assert state.done.dtype == jnp.float32
    np.testing.assert_array_equal(state.done, np.ones(batch))
    np.testing.assert_array_equal(state.info["truncation"], np.zeros(batch))
    assert set(np.asarray(state.metrics["success"]).tolist()) <= {0.0, 1.0}  # some tasks succeed at the cap


def test_only_the_mujoco_environments_are_brax_environments() -> None:
    with pytest.raises(ValueError, match="as_brax takes the MuJoCo environments"):
        as_brax("clevr")
    clevr, params = envs.make("clevr", "train")
    with pytest.raises(ValueError, match="use imaginejax.interop.as_gymnax"):
        BraxEnv(clevr, params)


def _first_task_only(params):
    """The level's table cut to its first task (Meta-World compiles only the tasks it is given into MJX)."""
    return params.replace(goals=params.goals[:1], phrasing_ids=params.phrasing_ids[:1],
                          phrasing_counts=params.phrasing_counts[:1])


@pytest.mark.parametrize("name", ["metaworld", "libero"])
def test_robot_arms_step_through_brax_wrap(name: str) -> None:
    """One row, two steps of Meta-World (its first training task) / LIBERO on MJX through brax's wrappers."""
    if name == "metaworld":
        from imaginejax.envs.metaworld import tasks

        params = _first_task_only(envs.entry(name).make_params("train", embed=None))
        task = tasks.TASKS[int(params.goals[0, 0])].name
        env = BraxEnv(envs.make(name, "train", backend="mjx", tasks=(task,))[0], params)
    else:
        env = as_brax(name, "train", embed=None)
    wrapped = training.wrap(env, episode_length=2)
    state = jax.jit(wrapped.reset)(jax.random.split(jax.random.PRNGKey(0), 1))
    first = np.asarray(state.obs)
    assert first.shape == (1, env.observation_size) and np.isfinite(first).all()
    step = jax.jit(wrapped.step)
    state = step(state, jnp.zeros((1, env.action_size)))
    assert np.isfinite(np.asarray(state.obs)).all()
    assert int(state.pipeline_state.t[0]) == 1
    state = step(state, jnp.zeros((1, env.action_size)))
    np.testing.assert_array_equal(state.done, [1.0])
    np.testing.assert_array_equal(state.obs, first)
