"""HalfCheetah environment API: shapes, episode ends, frozen finished episodes, rewards against
Gymnasium, single-env views, and vmapped collection into the dataset format."""

from __future__ import annotations

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.data.collect import collect
from imaginejax.envs.cheetah import backends, tasks
from imaginejax.envs.cheetah.env import EnvParams, HalfCheetah, make_params

BATCH = 6


@pytest.fixture(scope="module")
def env():
    return HalfCheetah("mujoco")


@pytest.fixture(scope="module")
def train():
    return make_params("train", embed=False)


@pytest.fixture(scope="module")
def step_jit(env):
    return jax.jit(env.step_batch)


def keys(n: int, seed: int = 0) -> jax.Array:
    return jax.random.split(jax.random.PRNGKey(seed), n)


def with_embeddings(params: EnvParams, width: int = 5) -> EnvParams:
    m = params.instruction_embeddings.shape[0]
    table = jnp.arange(m * width, dtype=jnp.float32).reshape(m, width) / (m * width)
    return params.replace(instruction_embeddings=table)


def random_actions(n: int, seed: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).uniform(-1, 1, (n, 6)), jnp.float32)


@pytest.mark.parametrize("level,num_tasks", [("train", 4), ("rephrase", 4), ("easy", 2), ("hard", 3)])
def test_levels_and_shapes(env, level, num_tasks):
    params = with_embeddings(make_params(level, embed=False))
    assert params.num_tasks == num_tasks and params.max_steps == 200 and params.level == level
    assert len(env.instructions(level)) == params.instruction_embeddings.shape[0]
    obs, state = env.reset_to_task_batch(keys(BATCH), params, jnp.arange(BATCH) % num_tasks)
    assert obs.shape == (BATCH, 18 + 5) and obs.dtype == jnp.float32
    assert env.obs_dim(params) == 23
    # observation = state ⊕ the embedding of the episode's own instruction
    np.testing.assert_array_equal(np.asarray(obs[:, :18]), np.asarray(env.state_vector(state)))
    np.testing.assert_array_equal(np.asarray(obs[:, 18:]),
                                  np.asarray(params.instruction_embeddings[state.instruction]))
    ids = np.asarray(params.phrasing_ids)[np.asarray(state.task)]
    assert all(int(i) in row for i, row in zip(np.asarray(state.instruction), ids))
    obs2, state2, reward, done, info = env.step_batch(keys(BATCH, 1), state, random_actions(BATCH, 0), params)
    assert obs2.shape == obs.shape and reward.shape == (BATCH,) and reward.dtype == jnp.float32
    assert done.shape == info["success"].shape == info["truncated"].shape == (BATCH,)
    np.testing.assert_array_equal(np.asarray(state2.t), 1)


def test_bad_action_shape_names_the_field(env, train):
    _, state = env.reset_batch(keys(BATCH), train)
    with pytest.raises(ValueError, match=r"action must have shape \(6, 6\)"):
        env.step_batch(keys(BATCH), state, jnp.zeros((BATCH,)), train)


def test_success_ends_the_episode(env, train, step_jit):
    _, state = env.reset_to_task_batch(keys(BATCH), train, jnp.zeros(BATCH, jnp.int32))  # run forward
    # one step before the check (t = 98 → 99) with Σ far beyond 7 in rows 0-2, far below in rows 3-5
    sigma = jnp.asarray([20.0, 20.0, 20.0, -20.0, -20.0, -20.0])
    state = state.replace(t=jnp.full(BATCH, 98, jnp.int32), progress=state.progress.replace(sigma=sigma))
    _, after, _, done, info = step_jit(keys(BATCH), state, random_actions(BATCH, 1), train)
    assert np.asarray(info["success"]).tolist() == [True] * 3 + [False] * 3
    assert np.asarray(done).tolist() == [True] * 3 + [False] * 3
    assert np.asarray(after.success).tolist() == [True] * 3 + [False] * 3
    assert not np.asarray(info["truncated"]).any()


def test_time_limit_truncates_and_finished_episodes_stay_frozen(env, train, step_jit):
    _, state = env.reset_to_task_batch(keys(BATCH), train, jnp.ones(BATCH, jnp.int32))  # run backward
    state = state.replace(t=jnp.full(BATCH, 199, jnp.int32))  # Σ = 0: no success possible
    _, last, reward, done, info = step_jit(keys(BATCH), state, random_actions(BATCH, 2), train)
    assert np.asarray(info["truncated"]).all() and np.asarray(done).all()
    assert not np.asarray(info["success"]).any() and not np.asarray(last.success).any()
    assert np.asarray(last.t).tolist() == [200] * BATCH
    runner = backends.get_runner()
    rows = runner.rows
    _, frozen, reward, done, info = step_jit(keys(BATCH), last, random_actions(BATCH, 3), train)
    jax.block_until_ready(frozen)
    assert runner.rows == rows  # finished episodes are not simulated
    assert np.asarray(done).all() and not np.asarray(reward).any()
    assert not np.asarray(info["truncated"]).any() and not np.asarray(info["success"]).any()
    for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(last)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_run_forward_reward_is_gymnasium_reward(env, train, step_jit):
    """Task 'run forward' pays exactly Gymnasium's HalfCheetah-v5 reward (x velocity − 0.1·|a|²)."""
    _, state = env.reset_to_task_batch(keys(1, 4), train, jnp.zeros(1, jnp.int32))
    gym = gymnasium.make("HalfCheetah-v5").unwrapped
    gym.reset(seed=0)
    gym.set_state(*(x[0] for x in state.physics.as_float64()))
    actions = np.random.default_rng(4).uniform(-1.2, 1.2, (30, 1, 6)).astype(np.float32)
    for t in range(30):
        _, state, reward, _, _ = step_jit(keys(1, t), state, jnp.asarray(actions[t]), train)
        _, gym_reward, *_ = gym.step(actions[t, 0].astype(np.float64))
        assert float(reward[0]) == pytest.approx(gym_reward, rel=1e-5, abs=1e-5)


def test_single_env_views_match_the_batch(env, train):
    obs, state = env.reset(jax.random.PRNGKey(5), train)
    obs_b, state_b = env.reset_batch(jax.random.PRNGKey(5)[None], train)
    np.testing.assert_array_equal(np.asarray(obs), np.asarray(obs_b[0]))
    action = random_actions(1, 5)
    obs1, state1, reward, done, info = env.step(jax.random.PRNGKey(6), state, action[0], train)
    obs1_b, _, reward_b, _, _ = env.step_batch(jax.random.PRNGKey(6)[None], state_b, action, train)
    assert obs1.shape == (18,) and reward.shape == () and done.shape == ()
    np.testing.assert_array_equal(np.asarray(obs1), np.asarray(obs1_b[0]))
    assert float(reward) == float(reward_b[0])
    _, fixed = env.reset_to_task(jax.random.PRNGKey(7), train, 2, phrasing=4)
    assert int(fixed.task) == 2 and int(fixed.instruction) == int(train.phrasing_ids[2, 4])
    assert env.instructions("train")[int(fixed.instruction)] == "Hop forward."  # task 2 is jump forward


def uniform_policy(key, obs, state, params):
    del state, params
    return jax.random.uniform(key, (obs.shape[0], 6), minval=-1.0, maxval=1.0)


def test_collect_and_pure_functions_agree_with_the_env(env):
    params = make_params("train", embed=False)
    n = 12
    ds = collect(env, params, uniform_policy, jax.random.PRNGKey(8), n, task_indices=np.arange(n) % 4,
                 chunk_size=n, policy_name="uniform", progress=False)
    assert ds.states.shape == (n, 201, 18) and ds.actions.shape == (n, 200, 6) and not ds.discrete
    assert ds.env == "cheetah" and ds.goals.shape == (n, 2)
    lengths = ds.mask.sum(1)
    # run tasks cannot succeed under a random policy within 200 steps; jump tasks end at t >= 5
    assert (lengths[ds.goals[:, 0] == tasks.KIND_RUN] == 200).all()
    jump = ds.goals[:, 0] == tasks.KIND_JUMP
    assert (lengths[jump] >= 5).all()
    # the pure trajectory functions recompute the env's rewards and success steps from the data alone
    ok, rew = tasks.trajectory_success_and_reward(jnp.asarray(ds.states), jnp.asarray(ds.actions),
                                                  jnp.asarray(ds.goals))
    ok, rew = np.asarray(ok), np.asarray(rew)
    np.testing.assert_allclose(np.where(ds.mask, rew, 0.0), ds.rewards, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(ok & ds.mask, ds.terminals)
    for i in range(n):
        valid = ds.states[i, : lengths[i] + 1]
        assert bool(tasks.legal(jnp.asarray(valid)).all())
        if ds.terminals[i].any():  # Σ at the end of a successful jump has the jump's sign
            sigma = ds.states[i, 1 : lengths[i] + 1, 0].sum()
            assert np.sign(sigma) == ds.goals[i, 1]


@pytest.mark.slow
def test_mjx_env_matches_mujoco_env(train):
    """The same episode in both backends (MJX compiles for ~20 s on a CPU)."""
    steps = 8
    actions = jnp.asarray(np.random.default_rng(9).uniform(-1, 1, (steps, 2, 6)), jnp.float32)

    def run(env):
        _, state = env.reset_to_task_batch(keys(2, 9), train, jnp.asarray([0, 1]))

        def body(s, a):
            _, s, r, _, _ = env.step_batch(keys(2), s, a, train)
            return s, (env.state_vector(s), r)

        return jax.jit(lambda s, a: jax.lax.scan(body, s, a)[1])(state, actions)

    states_c, rewards_c = run(HalfCheetah("mujoco"))
    states_m, rewards_m = run(HalfCheetah("mjx"))
    np.testing.assert_allclose(np.asarray(states_m), np.asarray(states_c), atol=5e-2)
    np.testing.assert_allclose(np.asarray(rewards_m), np.asarray(rewards_c), atol=0.5)
