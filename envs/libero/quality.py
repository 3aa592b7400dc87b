"""What the quality report of generated LIBERO rollouts checks: legality by cause, projection towards
the legal set, and the episode rules with the sub-goal stage; no simulator."""

from __future__ import annotations

import functools
from typing import Any, Final

import jax
import jax.numpy as jnp

from imaginejax.envs.libero import model as lm
from imaginejax.envs.libero import tasks as lt
from imaginejax.envs.registry import EpisodeRules, QualityRules


LIBERO_NO_SIMULATOR: Final[str] = (
    "the 44-d LIBERO state holds every joint position (arm, fingers, objects, basket) but no velocities "
    "and not the joint servos' targets, which the delta-pose controller integrates from step to step; a "
    "simulator set from it (at rest, targets at the joints) would score a different transition than the "
    "one generated")


def libero_violations(states: jax.Array) -> dict[str, jax.Array]:
    """Why LIBERO states are illegal: (..., 44) -> {category: (...) bool}.

    The rules and constants of :func:`imaginejax.envs.libero.tasks.legal`, split by cause:
    ``non-finite``; ``joint limits`` (an arm joint more than 0.05 rad outside its range);
    ``end-effector off the arm`` (the end-effector position more than ``FK_TOLERANCE`` from the
    forward kinematics of the joints, or its orientation off by more than |q·q'| = 0.99);
    ``gripper opening`` (a finger slide outside [-0.005, 0.045]); ``out of workspace`` (the
    end-effector, an object or the basket outside ``[WORKSPACE_LOW, WORKSPACE_HIGH]``, the paper's
    "out of workbench"); ``implausible pose`` (a quaternion's norm off 1 by more than 0.05). A
    non-finite state is only counted as non-finite.
    """
    finite = jnp.all(jnp.isfinite(states), axis=-1)
    s = jnp.where(jnp.isfinite(states), states, 0.0)
    q = s[..., 0:7]
    joints = jnp.all((q >= lm.JOINT_LOW - 0.05) & (q <= lm.JOINT_HIGH + 0.05), axis=-1)
    tcp, quat, _, _ = lm.fk(q)
    eef = ((jnp.linalg.norm(tcp - s[..., 7:10], axis=-1) < lt.FK_TOLERANCE)
           & (jnp.abs(jnp.sum(quat * s[..., 10:14], -1)) > 0.99))
    fingers = jnp.all((s[..., 14:16] >= -0.005) & (s[..., 14:16] <= 0.045), axis=-1)
    poses = s[..., lt.OBJ_START:].reshape(s.shape[:-1] + (4, 7))
    positions = jnp.concatenate([s[..., None, 7:10], poses[..., :3]], -2)
    inside = jnp.all((positions >= lt.WORKSPACE_LOW) & (positions <= lt.WORKSPACE_HIGH), axis=(-2, -1))
    quats = jnp.concatenate([s[..., None, 10:14], poses[..., 3:]], -2)
    unit = jnp.all(jnp.abs(jnp.linalg.norm(quats, axis=-1) - 1.0) <= 0.05, axis=-1)
    return {
        "non-finite": ~finite,
        "joint limits": finite & ~joints,
        "end-effector off the arm": finite & ~eef,
        "gripper opening": finite & ~fingers,
        "out of workspace": finite & ~inside,
        "implausible pose": finite & ~unit,
    }


def project_libero(states: jax.Array) -> jax.Array:
    """Projection of LIBERO states (..., 44) towards the legal set of :func:`~imaginejax.envs.libero.tasks.legal`,
    field by field: arm joints clipped; the end-effector pose set to the forward kinematics of those joints
    (not clipped: the result can stay illegal); finger slides clipped to [0, ``GRIPPER_OPEN``]; object and
    basket positions clipped to the workspace; quaternions normalised with w >= 0 (zero → identity). Legal
    states come back unchanged (to round-off); non-finite entries stay non-finite."""
    dtype = states.dtype
    q = jnp.clip(states[..., 0:7], jnp.asarray(lm.JOINT_LOW, dtype), jnp.asarray(lm.JOINT_HIGH, dtype))
    fingers = jnp.clip(states[..., 14:16], 0.0, lm.GRIPPER_OPEN)
    poses = states[..., lt.OBJ_START:].reshape(states.shape[:-1] + (4, 7))
    pos = jnp.clip(poses[..., :3], jnp.asarray(lt.WORKSPACE_LOW, dtype), jnp.asarray(lt.WORKSPACE_HIGH, dtype))
    rot = poses[..., 3:]
    norm = jnp.linalg.norm(rot, axis=-1, keepdims=True)
    identity = jnp.broadcast_to(jnp.asarray([1.0, 0.0, 0.0, 0.0], dtype), rot.shape)
    rot = jnp.where(norm <= 1e-6, identity, rot / jnp.where(norm <= 1e-6, 1.0, norm))  # NaN stays NaN
    objects = jnp.concatenate([pos, rot], -1).reshape(states.shape[:-1] + (28,))
    # The environment's own state of these joint positions: end-effector by FK, quaternions with w >= 0.
    return lt.state_from_qpos(jnp.concatenate([q, fingers, objects], -1)).astype(dtype)


def _libero_init(s0: jax.Array, goal: jax.Array) -> Any:
    del goal
    return lt.Progress.initial(s0)


def _libero_step(progress: Any, prev: jax.Array, action: jax.Array, following: jax.Array,
                 goal: jax.Array, t: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
    del action, t
    after = lt.update_progress(progress, following, goal)
    return (after, lt.success(following, goal, after),
            lt.reward(prev, following, goal, progress, after))


@functools.lru_cache(maxsize=None)
def libero_rules(max_steps: int) -> EpisodeRules:
    """LIBERO's :class:`EpisodeRules`, as the environment's ``step_batch``: the carry is
    :class:`~imaginejax.envs.libero.tasks.Progress` (first state, stage), updated from each new state;
    success with the updated progress, reward with the progress before and after. ``max_steps`` does not
    enter."""
    del max_steps
    return EpisodeRules(_libero_init, _libero_step)


def quality_rules() -> QualityRules:
    """LIBERO's :class:`~imaginejax.envs.registry.QualityRules` (its registry entry's ``quality``)."""
    return QualityRules(
        name="libero", state_dim=lt.STATE_DIM, success=None, legal=lt.legal, simulate=None,
        entity_size=1, error_scale=1.0, error_unit="m or rad", threshold=1.0,
        violations=libero_violations, project=project_libero,
        project_name="joints clipped to their ranges, end-effector = forward kinematics of the joints, "
                     "fingers clipped, positions clipped to the workspace, unit quaternions",
        no_simulator_reason=LIBERO_NO_SIMULATOR, episode=libero_rules)
