"""BabyAI environment API: shapes, reset distribution, termination, truncation, frozen episodes,
single-environment views, registry."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai import tasks as T
from imaginejax.envs.babyai.env import BabyAI, make_params

ENV = BabyAI()
RED, GREEN, BLUE, PURPLE, YELLOW, GREY = range(6)


@functools.lru_cache(maxsize=None)
def params(level: str):
    return make_params(level, embed=False)


@functools.lru_cache(maxsize=None)
def jitted(level: str):
    """Compiled batched reset-to-task and step of a level."""
    p = params(level)
    reset = jax.jit(lambda keys, task: ENV.reset_to_task_batch(keys, p, task))
    step = jax.jit(lambda state, action: ENV.step_batch(jax.random.split(jax.random.PRNGKey(0), action.shape[0]),
                                                        state, action, p))
    return reset, step


def with_grid(state, grid: G.Grid):
    """The batched state with its world replaced by a batch of one hand-built grid (broadcast)."""
    batch = state.t.shape[0]
    return state.replace(grid=jax.tree.map(lambda v: jnp.broadcast_to(v, (batch,)), grid))


def task_of(level: str, kind: int) -> int:
    return int(np.flatnonzero(T.level_goals(level)[:, 0] == kind)[0])


def test_shapes_and_dtypes():
    p = params("train")
    assert p.goals.shape == (78, T.GOAL_DIM) and p.max_steps == 128 and ENV.obs_dim(p) == 17
    reset, step = jitted("train")
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    obs, state = reset(keys, jnp.arange(5))
    assert obs.shape == (5, 17) and obs.dtype == jnp.float32
    assert state.grid.agent_x.shape == (5,) and state.t.shape == (5,)
    obs2, state2, reward, done, info = step(state, jnp.zeros(5, jnp.int32))
    assert obs2.shape == (5, 17) and reward.shape == (5,) and reward.dtype == jnp.float32
    assert done.shape == (5,) and done.dtype == jnp.bool_
    assert set(info) == {"success", "truncated"}
    assert ENV.goal_of(state, p).shape == (5, T.GOAL_DIM)
    np.testing.assert_array_equal(np.asarray(ENV.state_vector(state2)), np.asarray(obs2))
    # With an embedding table the observation is state ⊕ embedding.
    emb = p.replace(instruction_embeddings=jnp.ones((p.instruction_embeddings.shape[0], 3)))
    obs_e, state_e = jax.jit(ENV.reset_to_task_batch)(keys, emb, jnp.arange(5))
    assert obs_e.shape == (5, 20) and bool((obs_e[:, 17:] == 1).all())


@pytest.mark.parametrize("level", ["train", "easy", "hard"])
def test_reset_distribution(level):
    p = params(level)
    goals = T.level_goals(level)
    n = 20 * len(goals) if len(goals) > 10 else 300
    task = np.arange(n) % len(goals)
    reset, _ = jitted(level)
    obs, state = reset(jax.random.split(jax.random.PRNGKey(1), n), jnp.asarray(task))
    s = np.asarray(obs).astype(int)
    g = goals[task]
    assert bool(T.legal(obs).all())
    assert not bool(T.state_satisfied(obs, jnp.asarray(g)).any())  # never starts solved
    assert (s[:, G.CARRIED_TYPE] == 0).all() and (np.asarray(state.t) == 0).all()
    # The agent starts on an object-free cell.
    for slot in range(3):
        assert not ((s[:, 3 * slot + 1] == s[:, G.AGENT_X]) & (s[:, 3 * slot + 2] == s[:, G.AGENT_Y])).any()
    # Named colours are honoured.
    kind = g[:, 0]
    named_a = np.isin(kind, T.KINDS_WITH_OBJECT_A)
    colour_of = lambda obj: s[np.arange(n), 3 * (obj - 1)]  # noqa: E731
    assert (colour_of(np.maximum(g[:, 1], 1))[named_a] == g[named_a, 2]).all()
    named_b = kind == T.KIND_PUT_NEXT
    assert (colour_of(np.maximum(g[:, 3], 1))[named_b] == g[named_b, 4]).all()
    named_door = np.isin(kind, T.KINDS_WITH_DOOR) & (g[:, 5] != T.ANY_COLOUR)
    assert (s[named_door, G.DOOR_COLOUR] == g[named_door, 5]).all()
    # Door states per kind.
    door = s[:, G.DOOR_STATE]
    unlock = kind == T.KIND_UNLOCK
    assert (door[unlock] == G.LOCKED).all() and (s[unlock, G.KEY_COLOUR] == s[unlock, G.DOOR_COLOUR]).all()
    opening = np.isin(kind, (T.KIND_OPEN, T.KIND_OPEN_GO_TO, T.KIND_OPEN_PICK_UP))
    assert (door[opening] == G.CLOSED).all()
    others = ~unlock & ~opening
    if others.any():
        assert set(door[others]) == {G.OPEN, G.CLOSED}
    assert (s[:, G.DOOR_X_INDEX] == 7).all() and set(s[:, G.DOOR_Y]) == set(range(1, 7))
    # Instructions are phrasings of the task.
    ids = np.asarray(state.instruction)
    assert all(ids[i] in np.asarray(p.phrasing_ids)[task[i]] for i in range(n))


def test_success_terminates_and_the_episode_stays_frozen():
    reset, step = jitted("train")
    task = task_of("train", T.KIND_GO_TO)
    goal = T.level_goals("train")[task]  # go to X
    _, state = reset(jax.random.split(jax.random.PRNGKey(2), 1), jnp.array([task]))
    obj, colour = int(goal[1]), int(goal[2])
    spots = {G.BALL: (2, 2), G.BOX: (5, 5), G.KEY: (2, 5)}
    cols = {o: (colour if o == obj else GREY) for o in G.OBJECTS}
    x, y = spots[obj]
    grid = G.make_grid(ball=(cols[G.BALL], *spots[G.BALL]), box=(cols[G.BOX], *spots[G.BOX]),
                       key=(cols[G.KEY], *spots[G.KEY]), door=(RED, 3, G.CLOSED), agent=(x + 2, y))
    state = with_grid(state, grid).replace(t=jnp.array([9]))
    obs, state, reward, done, info = step(state, jnp.array([G.WEST]))
    assert bool(done[0]) and bool(info["success"][0]) and not bool(info["truncated"][0])
    assert bool(state.success[0]) and int(state.t[0]) == 10
    assert float(reward[0]) == pytest.approx(1 - 0.9 * 10 / 128)
    frozen_obs = np.asarray(obs)
    for action in (G.EAST, G.PICKUP, G.SOUTH):
        obs, state2, reward, done, info = step(state, jnp.array([action]))
        np.testing.assert_array_equal(np.asarray(obs), frozen_obs)
        assert float(reward[0]) == 0.0 and bool(done[0])
        assert not bool(info["success"][0]) and not bool(info["truncated"][0])
        assert int(state2.t[0]) == 10 and bool(state2.success[0])


def test_time_limit_truncates_at_128_steps():
    p = params("train")
    reset, _ = jitted("train")
    _, state = reset(jax.random.split(jax.random.PRNGKey(3), 4), jnp.arange(4))

    @jax.jit
    def run(state):
        def body(state, _):
            # DROP with empty hands changes nothing: the episode can only end by the cap.
            _, state, reward, done, info = ENV.step_batch(jnp.zeros((4, 2), jnp.uint32), state,
                                                          jnp.full((4,), G.DROP), p)
            return state, (reward, done, info["truncated"], info["success"])
        return jax.lax.scan(body, state, None, length=130)

    final, (reward, done, truncated, success) = run(state)
    truncated, done = np.asarray(truncated), np.asarray(done)
    assert (np.flatnonzero(truncated.any(1)) == [127]).all() and truncated[127].all()
    assert not done[:127].any() and done[127:].all()
    assert not np.asarray(success).any() and (np.asarray(reward) == 0).all()
    assert (np.asarray(final.t) == 128).all() and not np.asarray(final.success).any()


def test_single_environment_views_match_the_batch():
    p = params("hard")
    key = jax.random.PRNGKey(4)
    obs, state = jax.jit(ENV.reset)(key, p)
    obs_b, state_b = jax.jit(ENV.reset_batch)(key[None], p)
    assert obs.shape == (17,)
    np.testing.assert_array_equal(np.asarray(obs), np.asarray(obs_b[0]))
    obs1, state1, reward, done, info = jax.jit(ENV.step)(key, state, G.NORTH, p)
    obs1_b, _, reward_b, done_b, _ = jax.jit(ENV.step_batch)(key[None], state_b, jnp.array([G.NORTH]), p)
    np.testing.assert_array_equal(np.asarray(obs1), np.asarray(obs1_b[0]))
    assert reward.shape == () and done.shape == () and info["success"].shape == ()
    assert float(reward) == float(reward_b[0]) and bool(done) == bool(done_b[0])
    obs_t, state_t = jax.jit(ENV.reset_to_task)(key, p, 2, 3)
    assert int(state_t.task) == 2 and int(state_t.instruction) == int(p.phrasing_ids[2, 3])


@pytest.mark.parametrize("order", ["open first", "pick up first"])
def test_open_then_pick_up_can_succeed(order):
    """The reference's "open the door, then pick up X" check was inverted and could never succeed."""
    task = task_of("easy", T.KIND_OPEN_PICK_UP)
    goal = T.level_goals("easy")[task]
    obj, colour = int(goal[1]), int(goal[2])
    cols = {o: (colour if o == obj else GREY) for o in G.OBJECTS}
    spots = {o: ((6, 4) if o == obj else s) for o, s in ((G.BALL, (1, 1)), (G.BOX, (2, 2)), (G.KEY, (3, 3)))}
    grid = G.make_grid(ball=(cols[G.BALL], *spots[G.BALL]), box=(cols[G.BOX], *spots[G.BOX]),
                       key=(cols[G.KEY], *spots[G.KEY]), door=(BLUE, 3, G.CLOSED), agent=(6, 3))
    reset, step = jitted("easy")
    _, state = reset(jax.random.split(jax.random.PRNGKey(5), 1), jnp.array([task]))
    state = with_grid(state, grid)
    actions = [G.TOGGLE, G.SOUTH, G.PICKUP] if order == "open first" else [G.SOUTH, G.PICKUP, G.NORTH, G.TOGGLE]
    for i, a in enumerate(actions):
        _, state, reward, done, info = step(state, jnp.array([a]))
        assert bool(info["success"][0]) == (i == len(actions) - 1)
    assert bool(state.success[0])
    assert float(reward[0]) == pytest.approx(1 - 0.9 * len(actions) / 128)


def test_registry_entry():
    from imaginejax import envs

    if "babyai" not in envs.registered():
        pytest.skip("babyai is not registered in envs/__init__.py yet")
    env, p = envs.make("babyai", "hard", embed=False)
    assert isinstance(env, BabyAI) and p.level == "hard" and p.goals.shape == (3, T.GOAL_DIM)
