"""What the quality report of generated BabyAI rollouts checks: legality by cause, the field-wise projection
and the grid stepped from a generated state vector."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai.env import BabyAI
from imaginejax.envs.registry import QualityRules


def babyai_violations(states: jax.Array) -> dict[str, jax.Array]:
    """Why BabyAI states are illegal: (..., 17) -> {category: (...) bool}.

    The rules of :func:`imaginejax.envs.babyai.tasks.legal`, split by cause: ``non-finite or
    non-integer``; ``colour, carried type or door state out of range``; ``carried object not at (0, 0)``;
    ``carried colour not the carried object's``; ``floor object outside the interior`` (an object not
    carried off the cells [ROOM_MIN, ROOM_MAX]²); ``two floor objects on one cell``; ``nothing carried,
    colour not 0``; ``agent or door off its cells`` (agent outside the interior, door not at x = DOOR_X
    with y in [ROOM_MIN, ROOM_MAX]). The relational causes are judged on the rounded fields, as ``legal``
    does; a non-finite state is only counted as non-finite.
    """
    states = jnp.asarray(states)
    if jnp.issubdtype(states.dtype, jnp.floating):
        finite = jnp.all(jnp.isfinite(states), axis=-1)
        integral = jnp.all(jnp.abs(states - jnp.round(states)) < 1e-4, axis=-1)
        states = jnp.where(jnp.isfinite(states), states, 0.0)
    else:
        finite = integral = jnp.ones(states.shape[:-1], bool)
    g = G.from_vector(jnp.clip(states, -1e6, 1e6))
    any_of = lambda masks: functools.reduce(jnp.logical_or, masks)  # noqa: E731
    colour_off = lambda c: (c < 0) | (c >= G.NUM_COLOURS)  # noqa: E731
    held = [g.carried == obj for obj in G.OBJECTS]
    pairs = [(i, j) for i in range(G.NUM_OBJECTS) for j in range(i + 1, G.NUM_OBJECTS)]
    causes = {
        "colour, carried type or door state out of range": any_of(
            [colour_off(c) for c in (g.door_colour, *g.colour)]
            + [(g.carried < G.NOTHING) | (g.carried > G.KEY), (g.door_state < G.OPEN) | (g.door_state > G.LOCKED)]),
        "carried object not at (0, 0)": any_of(
            [h & ((x != 0) | (y != 0)) for h, x, y in zip(held, g.x, g.y)]),
        "carried colour not the carried object's": any_of(
            [h & (g.carried_colour != c) for h, c in zip(held, g.colour)]),
        "floor object outside the interior": any_of(
            [~h & ~G.in_room(x, y) for h, x, y in zip(held, g.x, g.y)]),
        "two floor objects on one cell": any_of(
            [~held[i] & ~held[j] & (g.x[i] == g.x[j]) & (g.y[i] == g.y[j]) for i, j in pairs]),
        "nothing carried, colour not 0": (g.carried == G.NOTHING) & (g.carried_colour != 0),
        "agent or door off its cells": (
            ~G.in_room(g.agent_x, g.agent_y) | (g.door_x != G.DOOR_X)
            | (g.door_y < G.ROOM_MIN) | (g.door_y > G.ROOM_MAX)),
    }
    return {"non-finite or non-integer": ~(finite & integral)} | {
        name: finite & mask for name, mask in causes.items()}


def project_babyai(states: jax.Array) -> jax.Array:
    """Rounds BabyAI states to integers and clips every field to its range: (..., 17) -> (..., 17).

    This makes each field well-formed (colours, positions, door, carried type) but does not enforce
    the relational rules of :func:`imaginejax.envs.babyai.tasks.legal` (a carried object at (0, 0),
    distinct object cells), so a projected state can still be illegal.
    """
    colour = (0, G.NUM_COLOURS - 1)
    position = (0, G.ROOM_MAX)  # objects: interior, or (0, 0) when carried
    bounds = [colour, position, position] * 3 + [
        colour, (G.DOOR_X, G.DOOR_X), (G.ROOM_MIN, G.ROOM_MAX), (G.OPEN, G.LOCKED),
        (G.ROOM_MIN, G.ROOM_MAX), (G.ROOM_MIN, G.ROOM_MAX), (G.NOTHING, G.KEY), colour]
    low = jnp.asarray([b[0] for b in bounds], states.dtype)
    high = jnp.asarray([b[1] for b in bounds], states.dtype)
    return jnp.clip(jnp.round(states), low, high)


def _babyai_simulate(states: jax.Array, actions: jax.Array) -> jax.Array:
    return G.step_vector(states, actions.astype(jnp.int32))


def quality_rules() -> QualityRules:
    """BabyAI's :class:`~imaginejax.envs.registry.QualityRules` (its registry entry's ``quality``)."""
    return QualityRules(
        name="babyai", state_dim=G.STATE_DIM, success=BabyAI.success, legal=BabyAI.legal,
        simulate=_babyai_simulate, entity_size=1, error_scale=1.0,
        error_unit="grid cells / category indices", threshold=0.5, violations=babyai_violations,
        project=project_babyai, project_name="round + clip each field to its range")
