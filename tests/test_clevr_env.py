"""CLEVR-Robot environment API: registry, shapes, observations, episode ends, batching, jit/vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax import envs
from imaginejax.envs.clevr import physics
from imaginejax.envs.clevr import tasks
from imaginejax.envs.clevr.env import CLEVRRobot, EnvParams


BATCH = 16  # one batch size for the stepping tests: the compiled step is shared


@pytest.fixture(scope="module")
def train():
    return envs.make("clevr", "train", embed=False)


@pytest.fixture(scope="module")
def step_jit(train):
    env, _ = train
    return jax.jit(env.step_batch)


@pytest.fixture(scope="module")
def step_single(train):
    env, _ = train
    return jax.jit(env.step)


def with_embeddings(params: EnvParams, width: int = 7) -> EnvParams:
    m = params.instruction_embeddings.shape[0]
    table = jnp.arange(m * width, dtype=jnp.float32).reshape(m, width) / (m * width)
    return params.replace(instruction_embeddings=table)


def test_registry_errors_list_valid_choices():
    with pytest.raises(ValueError, match=r"valid names: (\w+, )*clevr"):
        envs.make("clevr-robot", "train")
    with pytest.raises(ValueError, match="valid levels: train, rephrase, easy, hard"):
        envs.make("clevr", "real")
    assert "clevr" in envs.registered()


def test_params_and_metadata(train):
    env, params = train
    assert isinstance(env, CLEVRRobot)
    assert env.state_dim == 10 and env.num_actions == 40 and env.goal_dim == tasks.GOAL_DIM
    assert params.goals.shape == (80, tasks.GOAL_DIM) and params.goals.dtype == jnp.int32
    assert params.phrasing_ids.shape == (80, 18) and params.phrasing_counts.shape == (80,)
    assert params.instruction_embeddings.shape == (80 * 18, 0)
    assert params.max_steps == 50 and params.level == "train"
    assert len(env.instructions("train")) == 80 * 18
    assert env.obs_dim(params) == 10
    _, easy = envs.make("clevr", "easy", embed=False)
    assert easy.max_steps == 1 and easy.goals.shape[0] == 20
    _, hard = envs.make("clevr", "hard", embed=False)
    assert hard.goals.shape[0] == 82 and len(env.instructions("hard")) == hard.instruction_embeddings.shape[0]
    # params is a pytree whose leaves are the tables (max_steps and level are static).
    assert len(jax.tree.leaves(params)) == 4


def test_reset_shapes_observation_and_sampling(train):
    env, params = train
    params = with_embeddings(params)
    n = 512
    obs, state = jax.jit(env.reset_batch)(jax.random.split(jax.random.PRNGKey(0), n), params)
    assert obs.shape == (n, 17) and obs.dtype == jnp.float32
    assert state.balls.shape == (n, 5, 2) and state.t.shape == (n,)
    np.testing.assert_array_equal(np.asarray(obs[:, :10]), np.asarray(state.balls.reshape(n, 10)))
    np.testing.assert_array_equal(np.asarray(obs[:, 10:]), np.asarray(params.instruction_embeddings[state.instruction]))
    assert not bool(state.done.any()) and not bool(state.success.any()) and int(state.t.sum()) == 0
    # The instruction is one of the task's phrasings; tasks and phrasings are spread over their ranges.
    ids = np.asarray(params.phrasing_ids)[np.asarray(state.task)]
    assert (ids == np.asarray(state.instruction)[:, None]).any(axis=1).all()
    assert len(set(np.asarray(state.task).tolist())) > 70
    position = (ids == np.asarray(state.instruction)[:, None]).argmax(axis=1)
    assert len(set(position.tolist())) == 18
    # No goal is satisfied at t = 0 and every layout is legal.
    vec = state.balls.reshape(n, 10)
    assert not bool(tasks.state_satisfied(vec, params.goals[state.task]).any())
    assert bool(tasks.legal(vec).all())


def test_reset_rejects_satisfied_layouts():
    env = CLEVRRobot()
    _, params = envs.make("clevr", "hard", embed=False)
    n = 256
    keys = jax.random.split(jax.random.PRNGKey(1), n)
    _, state = env.reset_to_task_batch(keys, params, jnp.full((n,), 0, jnp.int32))
    assert not bool(tasks.state_satisfied(state.balls.reshape(n, 10), params.goals[state.task]).any())
    # A relational goal that random layouts satisfy often (red anywhere near blue's right) is rejected too.
    _, train_params = envs.make("clevr", "train", embed=False)
    _, state = env.reset_to_task_batch(keys, train_params, jnp.full((n,), 7, jnp.int32))
    assert not bool(tasks.state_satisfied(state.balls.reshape(n, 10), train_params.goals[state.task]).any())


def test_single_env_views_match_batched(train, step_jit, step_single):
    env, params = train
    keys = jax.random.split(jax.random.PRNGKey(2), BATCH)
    obs_b, state_b = env.reset_batch(keys, params)
    for i in range(2):
        obs, state = env.reset(keys[i], params)
        np.testing.assert_array_equal(np.asarray(obs), np.asarray(obs_b[i]))
        assert int(state.task) == int(state_b.task[i]) and int(state.instruction) == int(state_b.instruction[i])
    obs_v, state_v = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    np.testing.assert_array_equal(np.asarray(obs_v), np.asarray(obs_b))
    actions = jnp.arange(BATCH) * 7 % 40
    out_b = step_jit(keys, state_b, actions, params)
    out_1 = step_single(keys[3], jax.tree.map(lambda x: x[3], state_b), actions[3], params)
    for a, b in zip(jax.tree.leaves(out_1), jax.tree.leaves(jax.tree.map(lambda x: x[3], out_b))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    out_v = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))(keys, state_b, actions, params)
    for a, b in zip(jax.tree.leaves(out_v), jax.tree.leaves(out_b)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_reset_to_task_and_phrasing(train):
    env, params = train
    obs, state = env.reset_to_task(jax.random.PRNGKey(3), params, 42, phrasing=5)
    assert int(state.task) == 42 and int(state.instruction) == int(params.phrasing_ids[42, 5])
    keys = jax.random.split(jax.random.PRNGKey(4), 80)
    _, states = env.reset_to_task_batch(keys, params, jnp.arange(80), jnp.arange(80))
    np.testing.assert_array_equal(np.asarray(states.task), np.arange(80))
    np.testing.assert_array_equal(np.asarray(states.instruction), np.asarray(params.phrasing_ids)[np.arange(80), np.arange(80) % 18])


def test_step_dynamics_reward_and_success_follow_predicates(train, step_jit):
    env, params = train
    n = BATCH
    keys = jax.random.split(jax.random.PRNGKey(5), n)
    _, state = env.reset_batch(keys, params)
    actions = jax.random.randint(jax.random.PRNGKey(6), (n,), 0, 40)
    _, nxt, reward, done, info = step_jit(keys, state, actions, params)
    ball, direction = physics.decode_action(actions)
    np.testing.assert_allclose(np.asarray(nxt.balls), np.asarray(physics.push(state.balls, ball, direction)), atol=1e-5)
    prev_vec, next_vec = state.balls.reshape(n, 10), nxt.balls.reshape(n, 10)
    goal = params.goals[state.task]
    np.testing.assert_allclose(np.asarray(reward), np.asarray(tasks.reward(prev_vec, actions, next_vec, goal)), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(info["success"]), np.asarray(tasks.success(prev_vec, actions, next_vec, goal)))
    np.testing.assert_array_equal(np.asarray(done), np.asarray(info["success"]))
    assert not bool(info["truncated"].any()) and (np.asarray(nxt.t) == 1).all()


def test_done_on_success_then_frozen(train, step_single):
    env, params = train
    # red right of blue: blue at the origin, red below-right outside the sector; pushing red up succeeds.
    task = int(np.flatnonzero((np.asarray(params.goals)[:, 2:5] == [0, 1, tasks.RIGHT]).all(1))[0])
    balls = jnp.asarray([[0.30, -0.36], [0.0, 0.0], [-0.5, 0.4], [0.5, 0.5], [-0.5, -0.3]], jnp.float32)
    goal = params.goals[task]
    assert not bool(tasks.state_satisfied(balls.reshape(10), goal))
    _, state = env.reset_to_task(jax.random.PRNGKey(7), params, task)
    state = state.replace(balls=balls)
    up = jnp.asarray(0 * 8 + 1)
    _, state, reward, done, info = step_single(jax.random.PRNGKey(8), state, up, params)
    assert bool(info["success"]) and bool(done) and not bool(info["truncated"])
    assert bool(state.success) and int(state.t) == 1 and float(reward) > 0
    frozen = state
    for action in (0, 17, 39):
        obs, state, reward, done, info = step_single(jax.random.PRNGKey(9), state, jnp.asarray(action), params)
        np.testing.assert_array_equal(np.asarray(state.balls), np.asarray(frozen.balls))
        assert float(reward) == 0.0 and bool(done)
        assert not bool(info["success"]) and not bool(info["truncated"])
        assert int(state.t) == 1 and bool(state.success)
        np.testing.assert_array_equal(np.asarray(obs), np.asarray(frozen.balls.reshape(10)))


def test_time_limit_truncates_at_the_cap(train, step_jit):
    env, params = train
    n = BATCH
    keys = jax.random.split(jax.random.PRNGKey(10), n)
    _, state = env.reset_batch(keys, params)
    # Pushing an uninvolved ball back and forth never solves a single-clause goal.
    goal = np.asarray(params.goals)[np.asarray(state.task)]
    bystander = np.array([next(i for i in range(5) if i not in (g[2], g[3])) for g in goal])
    ended_at = np.full(n, -1)
    truncated_at = np.full(n, -1)
    for t in range(params.max_steps + 3):
        direction = np.where(t % 2 == 0, 1, 3)  # up, down
        actions = jnp.asarray(bystander * 8 + direction)
        _, state, reward, done, info = step_jit(keys, state, actions, params)
        done, trunc, succ = np.asarray(done), np.asarray(info["truncated"]), np.asarray(info["success"])
        ended_at[(ended_at < 0) & done] = t
        truncated_at[trunc] = t
        assert not (trunc & succ).any()
    solved = np.asarray(state.success)
    assert (ended_at[~solved] == params.max_steps - 1).all()
    assert (truncated_at[~solved] == params.max_steps - 1).all()
    assert (np.asarray(state.t) <= params.max_steps).all()
    assert (~solved).sum() >= n - 2


def test_easy_level_is_one_step():
    env, params = envs.make("clevr", "easy", embed=False)
    n = 40
    keys = jax.random.split(jax.random.PRNGKey(11), n)
    _, state = env.reset_to_task_batch(keys, params, jnp.arange(n) % 20)
    actions = jnp.arange(n) % 40
    _, state, reward, done, info = env.step_batch(keys, state, actions, params)
    assert bool(done.all())
    np.testing.assert_array_equal(np.asarray(info["success"]), ~np.asarray(info["truncated"]))
    np.testing.assert_array_equal(np.asarray(reward), np.asarray(info["success"], np.float32))
    goal = np.asarray(params.goals)[np.arange(n) % 20]
    expected = [(a // 8 == g[2]) and bool(tasks.PUSH_COMPATIBLE[g[4], a % 8]) for a, g in zip(range(n), goal)]
    np.testing.assert_array_equal(np.asarray(info["success"]), expected)


@pytest.mark.slow
def test_embedded_observations_use_the_sentence_encoder():
    lang = pytest.importorskip("imaginejax.lang")
    try:
        env, params = envs.make("clevr", "easy", embed=lang.encode_instructions)
    except lang.ModelFilesNotFoundError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"sentence-encoder files not installed: {err}")
    assert params.instruction_embeddings.shape == (len(env.instructions("easy")), lang.EMBED_DIM)
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    assert obs.shape == (10 + lang.EMBED_DIM,)
    np.testing.assert_allclose(np.asarray(obs[10:]), np.asarray(params.instruction_embeddings[state.instruction]))
