"""The registry's environments as gymnax environments (imaginejax.interop.gymnax_env): gymnax's base class,
spaces, auto-reset and wrappers on our kernels, and a purejaxrl-style PPO loop through them
(experiments/experts/ppo_gymnax.py)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import environment, spaces
from gymnax.wrappers import FlattenObservationWrapper, LogWrapper

from imaginejax import envs
from imaginejax.interop import as_gymnax

PPO_FILE = Path(__file__).resolve().parents[1] / "experiments" / "experts" / "ppo_gymnax.py"


@functools.lru_cache(maxsize=None)
def _ppo():
    spec = importlib.util.spec_from_file_location("ppo_gymnax", PPO_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # flax dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _one_hot(strings: list[str]) -> np.ndarray:
    return np.eye(len(strings), dtype=np.float32)


@pytest.mark.parametrize("name", ["clevr", "babyai"])
def test_a_gymnax_environment_with_gymnax_spaces(name: str) -> None:
    env, params = as_gymnax(name, "train", embed=_one_hot)
    ours, table = envs.make(name, "train", embed=_one_hot)
    assert isinstance(env, environment.Environment)
    assert isinstance(params, environment.EnvParams) and params.max_steps_in_episode == table.max_steps
    action_space, obs_space = env.action_space(params), env.observation_space(params)
    assert isinstance(action_space, spaces.Discrete) and action_space.n == ours.num_actions == env.num_actions
    assert isinstance(obs_space, spaces.Box) and obs_space.shape == (ours.state_dim + table.embed_dim,)
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    assert obs_space.contains(obs)
    # The embedding part of the observation is the one-hot row of the state's instruction.
    np.testing.assert_array_equal(obs[ours.state_dim:], np.eye(table.embed_dim)[int(state.instruction)])


def test_step_is_the_environments_step_until_an_episode_ends_then_a_fresh_one() -> None:
    """On BabyAI (the auto-reset is the same code for every environment; CLEVR's episodes are checked
    through LogWrapper below)."""
    name = "babyai"
    env, params = as_gymnax(name, "train")
    ours, table = envs.make(name, "train")
    reset, step = jax.jit(ours.reset), jax.jit(ours.step)
    key = jax.random.PRNGKey(3)
    obs, state = env.reset(key, params)
    np.testing.assert_array_equal(obs, reset(key, table)[0])
    # gymnax splits the step key into (step, reset) keys; the step is ours with the first.
    step_key, reset_key = jax.random.split(jax.random.PRNGKey(4))
    want_obs, want_state, want_reward, _, _ = step(step_key, state, 1, table)
    got_obs, got_state, reward, terminated, truncated, info = env.step(jax.random.PRNGKey(4), state, 1, params)
    np.testing.assert_array_equal(got_obs, want_obs)
    assert float(reward) == float(want_reward) and int(got_state.t) == 1
    assert not bool(terminated) and not bool(truncated)
    # One step before the cap: the step truncates, the episode is replaced by reset_env(reset key) and the
    # observation that ended it is info["final_observation"].
    last = state.replace(t=jnp.asarray(table.max_steps - 1, jnp.int32))
    final_obs, final_state, _, _, _ = step(step_key, last, 1, table)
    got_obs, got_state, _, terminated, truncated, info = env.step(jax.random.PRNGKey(4), last, 1, params)
    succeeded = bool(final_state.success)
    assert bool(truncated) == (not succeeded) and bool(terminated) == succeeded
    np.testing.assert_array_equal(info["final_observation"], final_obs)
    np.testing.assert_array_equal(got_obs, reset(reset_key, table)[0])
    assert int(got_state.t) == 0 and not bool(got_state.done)


def test_continuous_cheetah_under_vmap_is_the_batched_kernel() -> None:
    """A continuous environment on MuJoCo C (a host callback, vmappable): gymnax's Box action space, and
    the vmapped reset and step equal the environment's batched kernels on the same keys."""
    env, params = as_gymnax("cheetah", "train", backend="mujoco")
    ours, table = envs.make("cheetah", "train", backend="mujoco")
    space = env.action_space(params)
    assert isinstance(space, spaces.Box) and space.shape == (6,) and (space.low, space.high) == (-1.0, 1.0)
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    obs, state = jax.vmap(env.reset, (0, None))(keys, params)
    want_obs, want_state = ours.reset_batch(keys, table)
    np.testing.assert_array_equal(obs, want_obs)
    action = jnp.full((2, 6), 0.3)
    obs, state, reward, _, _, _ = jax.jit(jax.vmap(env.step, (0, 0, 0, None)))(keys, state, action, params)
    step_keys = jax.vmap(lambda k: jax.random.split(k)[0])(keys)
    want_obs, _, want_reward, _, _ = ours.step_batch(step_keys, want_state, action, table)
    np.testing.assert_allclose(obs, want_obs, atol=1e-6)
    np.testing.assert_allclose(reward, want_reward, atol=1e-6)


def test_gymnax_wrappers_and_vmap_log_the_episodes_rewards() -> None:
    """LogWrapper's episode returns equal the rewards summed by hand between the episode ends."""
    env, params = as_gymnax("clevr", "train")
    wrapped = LogWrapper(FlattenObservationWrapper(env))
    batch, steps = 4, 120
    _, state = jax.vmap(wrapped.reset, (0, None))(jax.random.split(jax.random.PRNGKey(0), batch), params)

    def body(state, key):
        act_key, step_key = jax.random.split(key)
        action = jax.random.randint(act_key, (batch,), 0, env.num_actions)
        _, state, reward, terminated, truncated, info = jax.vmap(wrapped.step, (0, 0, 0, None))(
            jax.random.split(step_key, batch), state, action, params)
        return state, (reward, terminated | truncated, info["returned_episode"], info["returned_episode_returns"])

    _, (reward, done, ended, returned) = jax.lax.scan(body, state, jax.random.split(jax.random.PRNGKey(1), steps))
    reward, done, ended, returned = map(np.asarray, (reward, done, ended, returned))
    np.testing.assert_array_equal(done, ended)
    assert done.sum() >= batch  # 120 steps hold at least two 50-step episodes per row
    for row in range(batch):
        start = 0
        for t in np.flatnonzero(done[:, row]):
            np.testing.assert_allclose(returned[t, row], reward[start:t + 1, row].sum(), rtol=1e-5, atol=1e-5)
            start = t + 1


def test_gae_matches_a_hand_computed_case() -> None:
    ppo = _ppo()
    # Two steps, one row: r = (1, 2), V = (0.5, 1.0), bootstrap V = 3, no episode end; γ = 0.5, λ = 0.5:
    # δ1 = 2 + 1.5 - 1 = 2.5, Â1 = 2.5; δ0 = 1 + 0.5 - 0.5 = 1, Â0 = 1 + 0.25 · 2.5 = 1.625.
    traj = ppo.Transition(done=jnp.zeros((2, 1)), action=jnp.zeros((2, 1), jnp.int32),
                          value=jnp.array([[0.5], [1.0]]), reward=jnp.array([[1.0], [2.0]]),
                          log_prob=jnp.zeros((2, 1)), obs=jnp.zeros((2, 1, 1)), info={})
    advantages, targets = ppo.gae(traj, jnp.array([3.0]), 0.5, 0.5)
    np.testing.assert_allclose(advantages[:, 0], [1.625, 2.5])
    np.testing.assert_allclose(targets[:, 0], [2.125, 3.5])
    # An episode end at step 0 cuts the bootstrap: Â0 = δ0 = 1 - 0.5.
    advantages, _ = ppo.gae(traj._replace(done=jnp.array([[1.0], [0.0]])), jnp.array([3.0]), 0.5, 0.5)
    np.testing.assert_allclose(advantages[:, 0], [0.5, 2.5])


@pytest.mark.parametrize("name", ["clevr", "babyai"])
def test_ppo_loop_through_gymnax_runs_and_updates(name: str) -> None:
    ppo = _ppo()
    config = {**ppo.CONFIG, "ENV": name, "EMBED": None, "NUM_ENVS": 8, "NUM_STEPS": 64, "NUM_UPDATES": 2,
              "UPDATE_EPOCHS": 1, "NUM_MINIBATCHES": 2, "HIDDEN": 32}
    train, env, params = ppo.make_train(config)
    out = jax.jit(train)(jax.random.PRNGKey(0))
    metrics = jax.tree.map(np.asarray, out["metrics"])
    assert metrics["success"].shape == metrics["loss"].shape == (2,)
    assert np.isfinite(metrics["loss"]).all() and ((metrics["success"] >= 0) & (metrics["success"] <= 1)).all()
    # CLEVR's 50-step and BabyAI's 128-step caps: 2 × 64 steps of 8 rows end at least 8 episodes.
    assert metrics["episodes"].sum() >= 8
    trained = out["runner_state"][0]  # updates × epochs × minibatches gradient steps
    assert int(trained.step) == 2 * 1 * 2 and env.observation_space(params).shape == (env.env.state_dim,)


def test_ppo_learns_clevr_train_level_above_the_random_policy() -> None:
    """The learning run of docs/figures/ppo_gymnax_clevr.png, shortened: 60 updates of 64 × 64 steps."""
    ppo = _ppo()
    config = {**ppo.CONFIG, "NUM_UPDATES": 60}
    train, _, _ = ppo.make_train(config)
    out = jax.jit(train)(jax.random.PRNGKey(0))
    trained, random = ppo.success_rates(config, out["runner_state"][0].params, jax.random.PRNGKey(1), 800)
    assert trained > random + 0.1, (trained, random)
