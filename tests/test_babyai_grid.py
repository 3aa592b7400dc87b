"""BabyAI action semantics on hand-built worlds (envs/babyai/grid.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai import tasks

RED, GREEN, BLUE, PURPLE, YELLOW, GREY = range(6)
W, E, N, S = G.WEST, G.EAST, G.NORTH, G.SOUTH

step = jax.jit(G.step)


def world(**overrides) -> G.Grid:
    """A default world (ball red at (2, 2), box green at (5, 5), key blue at (2, 5), closed yellow door at
    row 3, agent at (3, 3), empty hands) with keyword overrides passed to :func:`grid.make_grid`."""
    spec = dict(ball=(RED, 2, 2), box=(GREEN, 5, 5), key=(BLUE, 2, 5), door=(YELLOW, 3, G.CLOSED), agent=(3, 3))
    spec.update(overrides)
    return G.make_grid(**spec)


def vec(g: G.Grid) -> np.ndarray:
    return np.asarray(G.to_vector(g), np.int64)


def agent(g: G.Grid) -> tuple[int, int]:
    return int(g.agent_x), int(g.agent_y)


def test_state_vector_layout_and_roundtrip():
    g = world(carried=(G.NOTHING, 0))
    v = vec(g)
    assert v.shape == (17,)
    assert list(v) == [RED, 2, 2, GREEN, 5, 5, BLUE, 2, 5, YELLOW, 7, 3, G.CLOSED, 3, 3, 0, 0]
    back = G.from_vector(G.to_vector(g))
    np.testing.assert_array_equal(vec(back), v)
    assert len(G.FIELD_NAMES) == G.STATE_DIM == 17


@pytest.mark.parametrize(
    "start, action, expected",
    [
        ((3, 3), W, (2, 3)),
        ((3, 3), E, (4, 3)),
        ((3, 3), N, (3, 2)),
        ((3, 3), S, (3, 4)),
        ((1, 3), W, (1, 3)),  # west wall
        ((4, 1), N, (4, 1)),  # north wall
        ((4, 6), S, (4, 6)),  # south wall
        ((6, 1), E, (6, 1)),  # east wall (no door on this row)
        ((1, 1), N, (1, 1)),  # corner
        ((6, 6), S, (6, 6)),
    ],
)
def test_moves_and_walls(start, action, expected):
    assert agent(step(world(agent=start), action)) == expected


@pytest.mark.parametrize("door_state", [G.OPEN, G.CLOSED, G.LOCKED])
def test_door_blocks_in_every_state(door_state):
    g = world(agent=(6, 3), door=(YELLOW, 3, door_state))
    nxt = step(g, E)
    assert agent(nxt) == (6, 3)
    assert int(nxt.door_state) == door_state  # walking into it does not toggle it


def test_walk_over_objects():
    g = world(agent=(1, 2))  # the red ball is at (2, 2)
    on_ball = step(g, E)
    assert agent(on_ball) == (2, 2)
    assert (int(on_ball.x[0]), int(on_ball.y[0])) == (2, 2)  # the ball stays put
    past = step(on_ball, E)
    assert agent(past) == (3, 2)
    assert (int(past.x[0]), int(past.y[0])) == (2, 2)


def test_pickup_from_own_cell_and_carried_reads_origin():
    g = world(agent=(5, 5))  # on the green box
    nxt = step(g, G.PICKUP)
    v = vec(nxt)
    assert v[G.CARRIED_TYPE] == G.BOX and v[G.CARRIED_COLOUR] == GREEN
    assert (v[G.BOX_X], v[G.BOX_Y]) == (0, 0)
    assert v[G.BOX_COLOUR] == GREEN  # the colour slot keeps the colour
    # The carried object travels with the agent but keeps reading (0, 0).
    moved = step(step(nxt, W), N)
    assert agent(moved) == (4, 4)
    assert (int(moved.x[1]), int(moved.y[1])) == (0, 0)
    assert bool(tasks.legal(G.to_vector(moved)))


def test_pickup_rules():
    # Nothing on the own cell (an object next to the agent does not count).
    g = world(agent=(3, 2))
    assert vec(step(g, G.PICKUP)).tolist() == vec(g).tolist()
    # Hands full: picking up another object is refused.
    full = world(agent=(5, 5), key=(BLUE, 0, 0), carried=(G.KEY, BLUE))
    assert vec(step(full, G.PICKUP)).tolist() == vec(full).tolist()


def test_drop_rules():
    carrying = world(agent=(4, 4), ball=(RED, 0, 0), carried=(G.BALL, RED))
    dropped = step(carrying, G.DROP)
    v = vec(dropped)
    assert (v[G.BALL_X], v[G.BALL_Y]) == (4, 4)
    assert v[G.CARRIED_TYPE] == 0 and v[G.CARRIED_COLOUR] == 0
    # Onto a cell holding another object: refused.
    on_box = world(agent=(5, 5), ball=(RED, 0, 0), carried=(G.BALL, RED))
    assert vec(step(on_box, G.DROP)).tolist() == vec(on_box).tolist()
    # Empty hands: nothing happens.
    empty = world(agent=(4, 4))
    assert vec(step(empty, G.DROP)).tolist() == vec(empty).tolist()
    # Drop then pick up again restores the carried state.
    again = step(dropped, G.PICKUP)
    assert vec(again).tolist() == vec(carrying).tolist()


@pytest.mark.parametrize("start, expected", [(G.CLOSED, G.OPEN), (G.OPEN, G.CLOSED)])
def test_toggle_opens_and_closes(start, expected):
    g = world(agent=(6, 3), door=(YELLOW, 3, start))
    assert int(step(g, G.TOGGLE).door_state) == expected
    assert int(step(step(g, G.TOGGLE), G.TOGGLE).door_state) == start


@pytest.mark.parametrize("position", [(5, 3), (6, 2), (6, 4), (6, 5), (1, 3), (3, 3)])
def test_toggle_needs_the_door_in_the_4_neighbourhood(position):
    g = world(agent=position, door=(YELLOW, 3, G.CLOSED))
    assert int(step(g, G.TOGGLE).door_state) == G.CLOSED


def test_locked_door_needs_the_key_of_its_colour():
    locked = dict(agent=(6, 3), door=(YELLOW, 3, G.LOCKED))
    # Empty hands.
    assert int(step(world(**locked), G.TOGGLE).door_state) == G.LOCKED
    # A key of another colour.
    wrong_key = world(**locked, key=(BLUE, 0, 0), carried=(G.KEY, BLUE))
    assert int(step(wrong_key, G.TOGGLE).door_state) == G.LOCKED
    # A ball of the door's colour is not a key.
    ball = world(**locked, ball=(YELLOW, 0, 0), carried=(G.BALL, YELLOW))
    assert int(step(ball, G.TOGGLE).door_state) == G.LOCKED
    # The key of the door's colour unlocks and opens; toggling again closes (not locks).
    right_key = world(**locked, key=(YELLOW, 0, 0), carried=(G.KEY, YELLOW))
    opened = step(right_key, G.TOGGLE)
    assert int(opened.door_state) == G.OPEN
    assert int(opened.carried) == G.KEY  # the key is kept
    assert int(step(opened, G.TOGGLE).door_state) == G.CLOSED
    # From one cell too far, even with the key: nothing.
    far = world(agent=(5, 3), door=(YELLOW, 3, G.LOCKED), key=(YELLOW, 0, 0), carried=(G.KEY, YELLOW))
    assert int(step(far, G.TOGGLE).door_state) == G.LOCKED


@pytest.mark.parametrize("action", [G.PICKUP, G.DROP, G.TOGGLE, 7, -1, 100])
def test_non_moves_keep_the_agent_in_place(action):
    g = world(agent=(4, 2))
    assert agent(step(g, action)) == (4, 2)
    if action not in (G.PICKUP, G.DROP, G.TOGGLE):
        assert vec(step(g, action)).tolist() == vec(g).tolist()


def random_legal_states(key: jax.Array, n: int) -> jax.Array:
    """(n, 17) legal states: random worlds advanced by random actions."""
    from imaginejax.envs.babyai import env as E

    goals = jnp.asarray(tasks.level_goals("train"))[jnp.arange(n) % 78]
    grids = jax.vmap(E.sample_grid)(jax.random.split(key, n), goals)
    actions = jax.random.randint(jax.random.fold_in(key, 1), (40, n), 0, G.NUM_ACTIONS)
    grids, _ = jax.lax.scan(lambda g, a: (G.step(g, a), None), grids, actions)
    return G.to_vector(grids)


def test_batched_step_equals_single_steps_and_keeps_states_legal():
    states = jax.jit(random_legal_states, static_argnums=1)(jax.random.PRNGKey(3), 256)
    assert bool(tasks.legal(states).all())
    actions = jax.random.randint(jax.random.PRNGKey(4), (256,), 0, G.NUM_ACTIONS)
    batched = jax.jit(G.step_vector)(states, actions)
    single = jax.jit(jax.vmap(lambda s, a: G.step_vector(s[None], a[None])[0]))(states, actions)
    np.testing.assert_array_equal(np.asarray(batched), np.asarray(single))
    assert bool(tasks.legal(batched).all())
    # Every action from every state keeps the state legal.
    every = jax.jit(jax.vmap(lambda a: G.step_vector(states, jnp.full((256,), a))))(jnp.arange(G.NUM_ACTIONS))
    assert bool(tasks.legal(every).all())
    # Some carried states occurred, and then exactly the carried object read (0, 0).
    carried = np.asarray(states[:, G.CARRIED_TYPE]).astype(int)
    assert (carried > 0).any()
    for s, obj in enumerate(G.OBJECTS):
        held = carried == obj
        xy = np.asarray(states[:, [3 * s + 1, 3 * s + 2]])
        assert (xy[held] == 0).all() and (xy[~held] >= 1).all()
