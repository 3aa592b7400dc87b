"""What the quality report of generated BabyAI rollouts checks: legality by cause, the field-wise projection
and the grid stepped from a generated state vector."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai import tasks as T
from imaginejax.envs.babyai.env import BabyAI
from imaginejax.envs.registry import QualityRules


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
        error_unit="grid cells / category indices", threshold=0.5, violations=T.violations,
        project=project_babyai, project_name="round + clip each field to its range")
