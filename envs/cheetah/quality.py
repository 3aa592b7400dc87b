"""What the quality report of generated HalfCheetah rollouts checks: legality by cause, the simulator
set to a generated 18-d state, and the episode rules with running quantities (Σ dx, leg counts)."""

from __future__ import annotations

import functools
from typing import Any, Final

import jax
import jax.numpy as jnp

from imaginejax.envs.cheetah import backends
from imaginejax.envs.cheetah import model as M
from imaginejax.envs.cheetah import tasks as ct
from imaginejax.envs.registry import EpisodeRules, QualityRules


CHEETAH_ERROR_SCALE: Final[tuple[float, ...]] = (0.01,) * 9 + (0.1,) * 9
"""Unit of HalfCheetah's transition error per state dimension: 0.01 (m or rad) for dx, the torso's
height and pitch and the six leg angles, 0.1 (m/s or rad/s) for the nine velocities (why these units:
docs/quality_rules.md)."""


def cheetah_simulate(states: jax.Array, actions: jax.Array) -> jax.Array:
    """HalfCheetah's simulator set to each 18-d state and stepped once: (K, 18), (K, 6) -> (K, 18).

    The state fixes everything but the root's x, on which the dynamics do not depend, so ``qpos[0] = 0``;
    the result's dx is the step's displacement. Default backend, float64 from the float32 states; rows with
    a non-finite state or action come back NaN.
    """
    dtype = jnp.result_type(float)
    s = states.astype(dtype)
    qpos = jnp.concatenate([jnp.zeros_like(s[..., :1]), s[..., ct.ROOTZ:ct.LEG_ANGLES.stop]], axis=-1)
    qvel = s[..., ct.VX:]
    physics, dx = backends.physics_step(backends.Physics.from_qpos_qvel(qpos, qvel),
                                        actions.astype(dtype), "auto")
    return ct.state_vector(dx, physics.qpos, physics.qvel).astype(states.dtype)


def cheetah_violations(states: jax.Array) -> dict[str, jax.Array]:
    """Why HalfCheetah states are illegal: (..., 18) -> {category: (...) bool}.

    The rules and constants of :func:`imaginejax.envs.cheetah.tasks.legal`, split by cause:
    ``non-finite``; ``displacement`` (|dx| > 1.5 m per step); ``torso height`` (rootz outside
    [-0.7, 2.5] m); ``joint limits`` (a leg angle beyond its limits widened by 0.5 rad);
    ``speed`` (|vx| or |vz| > 30 m/s, |pitch rate| > 60 rad/s, a joint speed > 100 rad/s). A
    non-finite state is only counted as non-finite; a state may fall in several other categories.
    """
    finite = jnp.all(jnp.isfinite(states), axis=-1)
    s = jnp.where(jnp.isfinite(states), states, 0.0)
    low = jnp.asarray(M.LEG_JOINT_RANGE[:, 0]) - ct.LEG_ANGLE_MARGIN
    high = jnp.asarray(M.LEG_JOINT_RANGE[:, 1]) + ct.LEG_ANGLE_MARGIN
    legs = s[..., ct.LEG_ANGLES]
    speed = ((jnp.abs(s[..., ct.VX]) > ct.MAX_ABS_ROOT_SPEED)
             | (jnp.abs(s[..., ct.VZ]) > ct.MAX_ABS_ROOT_SPEED)
             | (jnp.abs(s[..., ct.PITCH_RATE]) > ct.MAX_ABS_PITCH_RATE)
             | jnp.any(jnp.abs(s[..., ct.LEG_VELOCITIES]) > ct.MAX_ABS_JOINT_SPEED, axis=-1))
    return {
        "non-finite": ~finite,
        "displacement": finite & (jnp.abs(s[..., ct.DX]) > ct.MAX_ABS_DX),
        "torso height": finite & ((s[..., ct.ROOTZ] < ct.MIN_ROOTZ) | (s[..., ct.ROOTZ] > ct.MAX_ROOTZ)),
        "joint limits": finite & jnp.any((legs < low) | (legs > high), axis=-1),
        "speed": finite & speed,
    }


def _cheetah_init(s0: jax.Array, goal: jax.Array) -> Any:
    del goal
    return ct.Progress.zeros(s0.shape[:-1], jnp.float32)


def _cheetah_step(progress: Any, prev: jax.Array, action: jax.Array, following: jax.Array,
                  goal: jax.Array, t: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
    after = ct.update_progress(progress, following, t)
    return (after, ct.success(after, t, goal),
            ct.reward(prev, action, following, goal, progress))


@functools.lru_cache(maxsize=None)
def cheetah_rules(max_steps: int) -> EpisodeRules:
    """HalfCheetah's :class:`EpisodeRules`, as the environment's ``step_batch``: the carry is
    :class:`~imaginejax.envs.cheetah.tasks.Progress`, updated from each new state's dx; success on it,
    reward with the progress before the step. ``max_steps`` does not enter."""
    del max_steps
    return EpisodeRules(_cheetah_init, _cheetah_step)


def quality_rules() -> QualityRules:
    """HalfCheetah's :class:`~imaginejax.envs.registry.QualityRules` (its registry entry's ``quality``)."""
    return QualityRules(
        name="cheetah", state_dim=ct.STATE_DIM, success=None, legal=ct.legal,
        simulate=cheetah_simulate, entity_size=1, error_scale=CHEETAH_ERROR_SCALE,
        error_unit="0.01 m or rad (positions, angles), 0.1 m/s or rad/s (velocities)",
        threshold=1.0, violations=cheetah_violations, episode=cheetah_rules)
