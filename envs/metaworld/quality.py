"""What the quality report of generated Meta-World rollouts checks: legality by cause, projection onto
the legal set, and the episode rules (the first state fixes the dense rewards' constants); no simulator."""

from __future__ import annotations

import functools
from typing import Final

import jax
import jax.numpy as jnp

from imaginejax.envs.metaworld import tasks as mt
from imaginejax.envs.registry import EpisodeRules, QualityRules


METAWORLD_NO_SIMULATOR: Final[str] = (
    "the 91-d Meta-World state does not determine the simulator's state: it holds no velocities "
    "(arm, fingers, objects, fixture joints), not the hand's mocap target (the hand lags it), the "
    "finger joints only through the gripper opening, and fixture joints (door hinge, lock, window "
    "slide, faucet, buttons, nail) only through the poses of their handles; a simulator set from it "
    "would score a different transition than the one generated")


def metaworld_violations(states: jax.Array) -> dict[str, jax.Array]:
    """Why Meta-World states are illegal: (..., 91) -> {category: (...) bool}.

    The rules and constants of :func:`imaginejax.envs.metaworld.tasks.legal`, split by cause:
    ``non-finite``; ``out of workspace`` (the hand or a filled entity slot's position outside
    ``[WORKSPACE_LOW, WORKSPACE_HIGH]``, the paper's "out of workbench"); ``gripper opening``
    (outside [0, 1]); ``implausible pose`` (a filled slot's quaternion norm off 1 by more than
    0.05). A slot is filled when any of its 7 entries is non-zero. A non-finite state is only
    counted as non-finite.
    """
    finite = jnp.all(jnp.isfinite(states), axis=-1)
    s = jnp.where(jnp.isfinite(states), states, 0.0)
    low, high = jnp.asarray(mt.WORKSPACE_LOW, s.dtype), jnp.asarray(mt.WORKSPACE_HIGH, s.dtype)
    hand_out = ~jnp.all((s[..., 0:3] >= low) & (s[..., 0:3] <= high), axis=-1)
    slots = s[..., mt.SLOT_START:].reshape(s.shape[:-1] + (mt.NUM_SLOTS, mt.SLOT_DIM))
    filled = jnp.any(slots != 0, axis=-1)
    slot_out = filled & ~jnp.all((slots[..., :3] >= low) & (slots[..., :3] <= high), axis=-1)
    norm = jnp.linalg.norm(slots[..., 3:], axis=-1)
    bad_quat = filled & ~((jnp.abs(norm - 1.0) <= 0.05) | (norm == 0.0))
    return {
        "non-finite": ~finite,
        "out of workspace": finite & (hand_out | jnp.any(slot_out, axis=-1)),
        "gripper opening": finite & ((s[..., 3] < 0.0) | (s[..., 3] > 1.0)),
        "implausible pose": finite & jnp.any(bad_quat, axis=-1),
    }


def project_metaworld(states: jax.Array) -> jax.Array:
    """Projection of Meta-World states (..., 91) onto the legal set of :func:`~imaginejax.envs.metaworld.
    tasks.legal`: the hand clipped to the workspace and the gripper opening to [0, 1]; an entity slot whose
    quaternion has norm below 0.5 is empty and set to zeros; a filled slot's position clipped to the
    workspace and its quaternion normalised; the goal (4:7) kept. Legal states come back unchanged (to
    round-off); non-finite entries stay non-finite."""
    dtype = states.dtype
    low, high = jnp.asarray(mt.WORKSPACE_LOW, dtype), jnp.asarray(mt.WORKSPACE_HIGH, dtype)
    hand = jnp.clip(states[..., 0:3], low, high)
    grip = jnp.clip(states[..., 3:4], 0.0, 1.0)
    slots = states[..., mt.SLOT_START:].reshape(states.shape[:-1] + (mt.NUM_SLOTS, mt.SLOT_DIM))
    norm = jnp.linalg.norm(slots[..., 3:], axis=-1, keepdims=True)
    empty = norm < 0.5  # False for NaN: a non-finite slot stays non-finite
    filled = jnp.concatenate([jnp.clip(slots[..., :3], low, high), slots[..., 3:] / jnp.where(empty, 1.0, norm)], -1)
    slots = jnp.where(empty, 0.0, filled).reshape(states.shape[:-1] + (mt.NUM_SLOTS * mt.SLOT_DIM,))
    return jnp.concatenate([hand, grip, states[..., 4:mt.SLOT_START], slots], -1)


def _metaworld_success(prev: jax.Array, action: jax.Array, following: jax.Array,
                       goal: jax.Array) -> jax.Array:
    del prev, action
    return mt.success(following, goal)


def _metaworld_init(s0: jax.Array, goal: jax.Array) -> jax.Array:
    del goal
    return s0


def _metaworld_step(first: jax.Array, prev: jax.Array, action: jax.Array, following: jax.Array,
                    goal: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    del t
    return (first, mt.success(following, goal),
            mt.reward(prev, action, following, goal, first_state=first))


@functools.lru_cache(maxsize=None)
def metaworld_rules(max_steps: int) -> EpisodeRules:
    """Meta-World's :class:`EpisodeRules`: the carry is the episode's first state ``s0`` (the dense rewards'
    constants are rebuilt from it); success :func:`~imaginejax.envs.metaworld.tasks.success` on the new
    state, reward :func:`~imaginejax.envs.metaworld.tasks.reward`. ``max_steps`` does not enter."""
    del max_steps
    return EpisodeRules(_metaworld_init, _metaworld_step)


def quality_rules() -> QualityRules:
    """Meta-World's :class:`~imaginejax.envs.registry.QualityRules` (its registry entry's ``quality``)."""
    return QualityRules(
        name="metaworld", state_dim=mt.STATE_DIM, success=_metaworld_success, legal=mt.legal,
        simulate=None, entity_size=1, error_scale=1.0, error_unit="m", threshold=1.0,
        violations=metaworld_violations, no_simulator_reason=METAWORLD_NO_SIMULATOR,
        episode=metaworld_rules, project=project_metaworld,
        project_name="hand and filled slots clipped to the workspace, gripper to [0, 1], slots with a "
                     "quaternion norm below 0.5 emptied, quaternions normalised")
