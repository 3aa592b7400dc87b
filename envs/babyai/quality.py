"""What the quality report of generated BabyAI rollouts checks: legality by cause, the field-wise projection
and the grid stepped from a generated state vector."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai import tasks as T
from imaginejax.envs.babyai.env import BabyAI
from imaginejax.envs.registry import QualityRules


def project_babyai(states: jax.Array) -> jax.Array:
    """The nearest legal BabyAI state, field by field: (..., 17) -> (..., 17) with no cause of
    :func:`imaginejax.envs.babyai.tasks.violations`.

    1. Round every field and clip it to its range (colours, door state, carried type; the agent into the
       interior, the door to x = DOOR_X).
    2. The carried type decides what is held: the carried object moves to (0, 0) and the carried colour
       becomes its colour (0 when nothing is held).
    3. Every other object is clipped into the interior; an object on the cell of an earlier one (ball,
       box, key order) moves to the nearest free interior cell (Manhattan distance; ties: lowest y, then
       lowest x).

    A legal state is returned unchanged. The projection uses the grid's rules only, never a transition.
    """
    colour = (0, G.NUM_COLOURS - 1)
    position = (0, G.ROOM_MAX)  # objects: interior, or (0, 0) when carried
    bounds = [colour, position, position] * 3 + [
        colour, (G.DOOR_X, G.DOOR_X), (G.ROOM_MIN, G.ROOM_MAX), (G.OPEN, G.LOCKED),
        (G.ROOM_MIN, G.ROOM_MAX), (G.ROOM_MIN, G.ROOM_MAX), (G.NOTHING, G.KEY), colour]
    low = jnp.asarray([b[0] for b in bounds], states.dtype)
    high = jnp.asarray([b[1] for b in bounds], states.dtype)
    g = G.from_vector(jnp.clip(jnp.round(states), low, high))
    held = [g.carried == obj for obj in G.OBJECTS]
    cells = jnp.arange(G.ROOM_MIN, G.ROOM_MAX + 1)
    cell_x, cell_y = jnp.tile(cells, G.ROOM_SIZE), jnp.repeat(cells, G.ROOM_SIZE)  # (36,), y-major
    xs = [jnp.clip(x, G.ROOM_MIN, G.ROOM_MAX) for x in g.x]
    ys = [jnp.clip(y, G.ROOM_MIN, G.ROOM_MAX) for y in g.y]
    for i in range(G.NUM_OBJECTS):
        others = [j for j in range(G.NUM_OBJECTS) if j != i]
        occupied = functools.reduce(jnp.logical_or, [
            ~held[j][..., None] & (xs[j][..., None] == cell_x) & (ys[j][..., None] == cell_y) for j in others])
        clash = functools.reduce(jnp.logical_or, [
            ~held[j] & (xs[j] == xs[i]) & (ys[j] == ys[i]) for j in range(i)], jnp.zeros_like(held[i]))
        distance = jnp.abs(cell_x - xs[i][..., None]) + jnp.abs(cell_y - ys[i][..., None])
        free = jnp.argmin(jnp.where(occupied, 1 << 20, distance), axis=-1)
        xs[i] = jnp.where(clash & ~held[i], cell_x[free], xs[i])
        ys[i] = jnp.where(clash & ~held[i], cell_y[free], ys[i])
    carried_colour = functools.reduce(lambda acc, i: jnp.where(held[i], g.colour[i], acc), range(G.NUM_OBJECTS),
                                      jnp.zeros_like(g.carried_colour))
    projected = g.replace(x=tuple(jnp.where(held[i], 0, xs[i]) for i in range(G.NUM_OBJECTS)),
                          y=tuple(jnp.where(held[i], 0, ys[i]) for i in range(G.NUM_OBJECTS)),
                          carried_colour=carried_colour)
    return G.to_vector(projected, states.dtype)


def _babyai_simulate(states: jax.Array, actions: jax.Array) -> jax.Array:
    return G.step_vector(states, actions.astype(jnp.int32))


def quality_rules() -> QualityRules:
    """BabyAI's :class:`~imaginejax.envs.registry.QualityRules` (its registry entry's ``quality``)."""
    return QualityRules(
        name="babyai", state_dim=G.STATE_DIM, success=BabyAI.success, legal=BabyAI.legal,
        simulate=_babyai_simulate, entity_size=1, error_scale=1.0,
        error_unit="grid cells / category indices", threshold=0.5, violations=T.violations,
        project=project_babyai,
        project_name="round + clip each field to its range, the carried object to (0, 0) with its colour, "
                     "other objects into the interior, one per cell")
