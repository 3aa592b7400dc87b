"""Scripted grasp-and-place experts for every LIBERO-style task, in JAX, from the 44-d state and the episode's
progress: one memoryless controller moves the current sub-goal's object (:func:`tasks.current_subgoal`)
to its target, its phase (approach, close, carry) read off the state. ``expert_action`` broadcasts over a
batch of mixed tasks. The grasps, targets and heights: docs/envs.md, "LIBERO".
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.envs.libero import model as M
from imaginejax.envs.libero import tasks
from imaginejax.envs.libero.tasks import Progress, object_pos, object_quat

__all__ = ["expert_action", "expert_policy", "success_rates"]

OPEN, CLOSE = -1.0, 1.0
POS_GAIN = 0.9   # fraction of the remaining error commanded per step
ROT_GAIN = 0.8
HOVER = 0.08     # tcp above the top of the object while hovering
XY_TOL = 0.004   # xy alignment before descending
HOLD_TOL = 0.04  # centred grasp point within this of the tcp (and fingers closed on it): holding ...
YAW_TOL = 0.08
Q7_SAFE = 2.4   # |last joint| a turn of the hand may lead to (its limits are ±2.90)
PALM_HALF = (0.03, 0.095)  # the palm's half footprint (hand x, hand y = the fingers' axis)
PALM_DZ = 0.047            # the palm's underside above the fingertip centre
PALM_GAP = 0.008           # clearance the palm keeps from neighbours at a grasp
GRASP_SHIFT = 0.03         # off-centre grasp of the cheese box along its long axis
# grasp candidates: hand yaw relative to the object's, shift along its x axis; which apply to which object
_GRASP_YAW = (0.0, np.pi / 2, 0.0, 0.0)
_GRASP_SHIFT = (0.0, 0.0, -GRASP_SHIFT, GRASP_SHIFT)
_GRASP_VALID = np.array([[True, True, False, False], [True, False, True, True], [True, True, False, False]])
# ... plus the largest shift of the object's grasps
_HOLD_TOL = np.array([HOLD_TOL + GRASP_SHIFT * np.any(_GRASP_VALID[k] & (np.asarray(_GRASP_SHIFT) != 0))
                      for k in range(3)], np.float32)
CARRY_CLEARANCE = 0.24  # bottom of a carried object above the floor while travelling
TRANSIT_Z = 0.24        # the empty hand travels at least this high (clears the bottle and the basket)
CARRY_SPEED = 0.5       # action bound while holding (0.025 m per step): faster lifts let the object slip
_DOWN = jnp.asarray([0.0, 1.0, 0.0, 0.0], jnp.float32)  # rotation by π about x: hand z pointing down
_SYMMETRY = jnp.asarray([np.pi / 2, np.pi, np.pi / 2], jnp.float32)
_ASIDE_DIRS = jnp.asarray([[np.cos(a), np.sin(a)] for a in np.linspace(0, 2 * np.pi, 8, endpoint=False)], jnp.float32)
_OUT_DIRS = jnp.asarray([[np.cos(a), np.sin(a)] for a in np.linspace(-0.75 * np.pi, -0.25 * np.pi, 5)], jnp.float32)
REACH_LOW = jnp.asarray([0.30, -0.40], jnp.float32)
REACH_HIGH = jnp.asarray([0.72, 0.40], jnp.float32)


def _wrap(x: jax.Array) -> jax.Array:
    return (x + np.pi) % (2 * np.pi) - np.pi


def _target_yaw(hand_yaw: jax.Array, obj_yaw: jax.Array, period: jax.Array, q7: jax.Array) -> jax.Array:
    """The object's yaw plus the multiple of ``period`` closest to the hand's yaw whose turn keeps the last
    joint ``q7`` within :data:`Q7_SAFE` (the hand's yaw falls as ``q7`` rises, one for one). All (...)."""
    k = jnp.round((hand_yaw - obj_yaw) / period)[..., None] + jnp.asarray([0.0, -1.0, 1.0, -2.0, 2.0])
    cand = obj_yaw[..., None] + k * period[..., None]
    turn = cand - hand_yaw[..., None]
    cost = jnp.abs(turn) + 10.0 * (jnp.abs(q7[..., None] - turn) > Q7_SAFE)
    return jnp.take_along_axis(cand, jnp.argmin(cost, axis=-1)[..., None], axis=-1)[..., 0]


def _rect_gap(c1: jax.Array, h1: jax.Array, a1: jax.Array, c2: jax.Array, h2: jax.Array, a2: jax.Array
              ) -> jax.Array:
    """Signed gap between two rectangles in the plane (separating-axis test; < 0: they overlap): centres
    (..., 2), half sizes (..., 2), yaws (...) → (...)."""
    def frame(a):
        return jnp.stack([jnp.cos(a), jnp.sin(a)], -1), jnp.stack([-jnp.sin(a), jnp.cos(a)], -1)

    a1, a2 = jnp.broadcast_arrays(a1, a2)
    u1, v1 = frame(a1)
    u2, v2 = frame(a2)
    axes = jnp.stack([u1, v1, u2, v2], -2)  # (..., 4, 2)

    def radius(h, u, v):
        return h[..., None, 0] * jnp.abs(jnp.sum(u[..., None, :] * axes, -1)) + h[..., None, 1] * jnp.abs(
            jnp.sum(v[..., None, :] * axes, -1))

    dist = jnp.abs(jnp.sum((c2 - c1)[..., None, :] * axes, -1))
    return jnp.max(dist - radius(h1, u1, v1) - radius(h2, u2, v2), axis=-1)


def _grasp_choice(state: jax.Array, obj: jax.Array, hand_yaw: jax.Array, q7: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
    """The grasp of object ``obj`` (...): hand yaw (...) and grasp point (..., 3): the candidate (square to the
    can's and bottle's faces, across the cheese box centred or shifted by :data:`GRASP_SHIFT`) whose palm clears
    every taller neighbour by :data:`PALM_GAP` with the smallest joint-safe turn, centred first; else the widest
    gap."""
    center = object_pos(state, obj)
    obj_yaw = M.yaw_of(object_quat(state, obj))
    yaw_off = jnp.asarray(_GRASP_YAW, jnp.float32)      # (C,)
    shift = jnp.asarray(_GRASP_SHIFT, jnp.float32)      # (C,)
    valid = jnp.asarray(_GRASP_VALID)[obj]               # (..., C)
    yaws = _target_yaw(hand_yaw[..., None], obj_yaw[..., None] + yaw_off, jnp.full_like(yaw_off, np.pi),
                       q7[..., None])                  # (..., C)
    axis = jnp.stack([jnp.cos(obj_yaw), jnp.sin(obj_yaw)], -1)
    xy = center[..., None, :2] + shift[:, None] * axis[..., None, :]  # (..., C, 2)
    grasp_z = center[..., 2] + jnp.asarray(M.GRASP_DZ, jnp.float32)[obj]
    palm_bottom = grasp_z + PALM_DZ
    # obstacles: the three objects and the basket (a rectangle of its outer footprint)
    poses = state[..., tasks.OBJ_START:].reshape(state.shape[:-1] + (4, 7))
    obs_xy = poses[..., :2]                                                   # (..., 4, 2)
    obs_yaw = M.yaw_of(poses[..., 3:])                                        # (..., 4)
    obs_half = jnp.asarray(np.concatenate([M.OBJECT_HALF[:, :2], [M.BASKET_HALF]]), jnp.float32)  # (4, 2)
    obs_top = jnp.concatenate([poses[..., :3, 2] + jnp.asarray(M.TOP_DZ, jnp.float32),
                               poses[..., 3:, 2] + M.BASKET_HEIGHT], -1)      # (..., 4)
    active = (jnp.arange(4) != obj[..., None]) & (obs_top > palm_bottom[..., None])
    active = active.at[..., 3].set(active[..., 3] & ~tasks.in_basket(state, obj))
    gap = _rect_gap(xy[..., :, None, :], jnp.asarray(PALM_HALF, jnp.float32), yaws[..., :, None],
                    obs_xy[..., None, :, :], obs_half, obs_yaw[..., None, :])  # (..., C, 4)
    gap = jnp.min(jnp.where(active[..., None, :], gap, 1.0), axis=-1)          # (..., C)
    turn = jnp.abs(_wrap(yaws - hand_yaw[..., None]))
    blocked = gap < PALM_GAP
    cost = (turn + 10.0 * (jnp.abs(q7[..., None] - (yaws - hand_yaw[..., None])) > Q7_SAFE)
            + 2.0 * (shift != 0) + 20.0 * blocked - 10.0 * jnp.minimum(gap, PALM_GAP) + 100.0 * ~valid)
    best = jnp.argmin(cost, axis=-1)[..., None]
    yaw = jnp.take_along_axis(yaws, best, axis=-1)[..., 0]
    point = jnp.take_along_axis(xy, best[..., None], axis=-2)[..., 0, :]
    return yaw, jnp.concatenate([point, grasp_z[..., None]], -1)


def _orientation_action(quat: jax.Array, yaw: jax.Array) -> jax.Array:
    desired = M.quat_mul(M._quat_z(yaw), jnp.broadcast_to(_DOWN, quat.shape))
    err = M.quat_to_axis_angle(M.quat_mul(desired, M.quat_conj(quat)))
    return jnp.clip(ROT_GAIN * err / M.ROT_SCALE, -1.0, 1.0)


def _clearest(candidates: jax.Array, obstacles: jax.Array) -> jax.Array:
    """Of candidate points (..., C, 2) inside the reachable box, the one farthest from the obstacles (..., O, 2)."""
    gap = jnp.min(jnp.linalg.norm(candidates[..., :, None, :] - obstacles[..., None, :, :], axis=-1), axis=-1)
    inside = jnp.all((candidates >= REACH_LOW) & (candidates <= REACH_HIGH), axis=-1)
    score = jnp.where(inside, gap, gap - 10.0)
    best = jnp.argmax(score, axis=-1)
    return jnp.take_along_axis(candidates, best[..., None, None], axis=-2)[..., 0, :]


def _placement(state: jax.Array, goal: jax.Array, progress: Progress, obj: jax.Array, sub: jax.Array
               ) -> jax.Array:
    """(..., 3) where the sub-goal's object centre should end up."""
    top = jnp.asarray(M.TOP_DZ, jnp.float32)
    rest = jnp.asarray(M.REST_Z, jnp.float32)[obj]
    start = progress.start
    b = jnp.maximum(goal[..., 3], 0)
    pos = object_pos(state, obj)
    z = jnp.zeros_like(rest)
    pick = jnp.concatenate([pos[..., :2], (rest + 0.1)[..., None]], -1)
    in_basket = tasks.basket_slot(state, obj) + jnp.stack([z, z, z + 0.03], -1)
    b_pos = object_pos(state, b)
    onto = b_pos + jnp.stack([z, z, top[b] + rest + 0.015], -1)
    others = jnp.stack([object_pos(start, (obj + 1) % 3)[..., :2], object_pos(start, (obj + 2) % 3)[..., :2],
                        start[..., tasks.BASKET_START:tasks.BASKET_START + 2]], -2)
    origin = object_pos(start, obj)[..., :2]
    aside_xy = _clearest(origin[..., None, :] + 0.15 * _ASIDE_DIRS, others)
    basket0 = start[..., tasks.BASKET_START:tasks.BASKET_START + 2]
    out_xy = _clearest(basket0[..., None, :] + 0.42 * _OUT_DIRS, others[..., :2, :])
    floor = (rest + 0.01)[..., None]
    table = jnp.stack([pick, in_basket, pos, onto, jnp.concatenate([aside_xy, floor], -1), in_basket, in_basket,
                       jnp.concatenate([out_xy, floor], -1)], -2)
    return jnp.take_along_axis(table, sub[..., None, None], axis=-2)[..., 0, :]


def expert_action(state: jax.Array, goal: jax.Array, progress: Progress) -> jax.Array:
    """Expert actions: state (..., 44), goal (..., GOAL_DIM) int32, the episode's progress → (..., 7) in [-1, 1]."""
    obj, sub = tasks.current_subgoal(state, goal, progress)
    eef, quat = state[..., 7:10], state[..., 10:14]
    fingers = state[..., 14] + state[..., 15]
    center = object_pos(state, obj)
    half = jnp.asarray(M.OBJECT_HALF, jnp.float32)[obj]  # (..., 3)
    hand_yaw = M.yaw_of(quat)
    q7 = state[..., 6]
    grasp_yaw, pos = _grasp_choice(state, obj, hand_yaw, q7)  # pos: the grasp point
    target = _placement(state, goal, progress, obj, sub)

    # approach / close
    xy_err = jnp.linalg.norm(eef[..., :2] - pos[..., :2], axis=-1)
    yaw_err = jnp.abs(_wrap(hand_yaw - grasp_yaw))
    top = jnp.asarray(M.TOP_DZ, jnp.float32)[obj]
    hover_z = jnp.maximum(center[..., 2] + top + HOVER, TRANSIT_Z)
    hover = jnp.concatenate([pos[..., :2], hover_z[..., None]], -1)
    low = eef[..., 2] < hover_z - 0.03
    rise = jnp.concatenate([eef[..., :2], hover[..., 2:]], -1)
    aligned = (xy_err < XY_TOL) & (yaw_err < YAW_TOL)
    descending = (eef[..., 2] < hover[..., 2] - 0.01) & (xy_err < 0.012) & (yaw_err < 0.15)
    at_grasp = (xy_err < 0.012) & (eef[..., 2] - pos[..., 2] < 0.008)
    approach_way = jnp.where((descending | aligned)[..., None], pos,
                             jnp.where((low & (xy_err > 0.02))[..., None], rise, hover))
    approach_grip = jnp.where(at_grasp, CLOSE, OPEN)

    # carry
    gp_all = jnp.stack([object_pos(state, k) + jnp.asarray([0.0, 0.0, float(M.GRASP_DZ[k])], jnp.float32)
                        for k in range(3)], -2)  # (..., 3, 3) centred grasp points
    grip_gap = jnp.linalg.norm(gp_all - eef[..., None, :], axis=-1) < jnp.asarray(_HOLD_TOL)  # (..., 3)
    holding = (jnp.take_along_axis(grip_gap, obj[..., None], axis=-1)[..., 0] & (fingers < 2 * half[..., 1] + 0.01)
               & (fingers > 0.01))
    offset = eef - center
    carry_z = jnp.maximum(CARRY_CLEARANCE + jnp.asarray(M.REST_Z, jnp.float32)[obj], target[..., 2])
    obj_xy_err = jnp.linalg.norm(target[..., :2] - center[..., :2], axis=-1)
    travelling = obj_xy_err > 0.015
    high_enough = center[..., 2] > carry_z - 0.04
    lift_way = jnp.concatenate([center[..., :2], carry_z[..., None]], -1)
    over_way = jnp.concatenate([target[..., :2], carry_z[..., None]], -1)
    carry_obj = jnp.where(travelling[..., None], jnp.where(high_enough[..., None], over_way, lift_way), target)
    carry_obj = jnp.where((sub == tasks.PICK)[..., None], target, carry_obj)
    carry_way = carry_obj + offset
    release = ~travelling & (center[..., 2] - target[..., 2] < 0.01) & (sub != tasks.PICK)
    carry_grip = jnp.where(release, OPEN, CLOSE)

    reach = sub == tasks.REACH
    way = jnp.where((holding & ~reach)[..., None], carry_way, approach_way)
    grip = jnp.where(holding & ~reach, carry_grip, jnp.where(reach, OPEN, approach_grip))
    # Still holding an object of a finished sub-goal: stand still and open the gripper first.
    close_to = grip_gap & (jnp.arange(3) != obj[..., None])
    other = jnp.any(close_to, axis=-1) & (fingers < 2 * M.GRIPPER_OPEN - 0.006)
    held = jnp.argmax(close_to, axis=-1).astype(jnp.int32)
    held_pos = object_pos(state, held)
    slot = tasks.basket_slot(state, held)
    # ... but a basket sub-goal's object finished high in the basket region is first lowered onto its slot
    lower = other & tasks.in_basket(state, held) & (held_pos[..., 2] - slot[..., 2] > 0.015)
    way = jnp.where(other[..., None], jnp.where(lower[..., None], eef + slot - held_pos, eef), way)
    grip = jnp.where(other, jnp.where(lower, CLOSE, OPEN), grip)
    # straddling an object just released (not the sub-goal's): the fingers may rest on one of its faces (the
    # two fingers are not coupled, a held object drifts to one of them), so centre them on it, then rise
    centres = jnp.stack([object_pos(state, k) for k in range(3)], -2)  # (..., 3, 3)
    tops = centres[..., 2] + jnp.asarray(M.TOP_DZ, jnp.float32)
    gap_xy = jnp.linalg.norm(centres[..., :2] - eef[..., None, :2], axis=-1)
    near_k = (gap_xy < 0.04) & (eef[..., None, 2] < tops + 0.02) & (jnp.arange(3) != obj[..., None])
    straddle = jnp.any(near_k, axis=-1) & ~holding & ~other & (fingers > 2 * M.GRIPPER_OPEN - 0.006)
    k_near = jnp.argmax(near_k, axis=-1)
    c_near = jnp.take_along_axis(centres, k_near[..., None, None], axis=-2)[..., 0, :]
    centred = jnp.take_along_axis(gap_xy, k_near[..., None], axis=-1)[..., 0] < 0.003
    lift = jnp.where(centred, 0.03, 0.0)
    way = jnp.where(straddle[..., None], jnp.concatenate([c_near[..., :2], (eef[..., 2] + lift)[..., None]], -1), way)
    # carrying to the basket: turn the object's long axis (the hand's x) along the basket's, so the fingers
    # close across the basket, clear of the neighbouring slots
    basket_yaw = M.yaw_of(state[..., tasks.BASKET_START + 3:tasks.BASKET_START + 7])
    across = _target_yaw(hand_yaw, basket_yaw, _SYMMETRY[obj], q7)
    to_basket = (sub == tasks.PLACE_BASKET) & travelling
    # rising from low off the object (e.g. just released one between the fingers): keep the yaw, turning the
    # open fingers around a square-section object would knock it over
    rising = (~holding & ~other & low & (xy_err > 0.02)) | straddle
    yaw = jnp.where(holding | other | rising, jnp.where(to_basket & ~other & holding, across, hand_yaw), grasp_yaw)
    speed = jnp.where((holding & ~reach) | other | straddle, CARRY_SPEED, 1.0)[..., None]
    move = jnp.clip(POS_GAIN * (way - eef) / M.POS_SCALE, -speed, speed)
    turn = _orientation_action(quat, yaw)
    return jnp.concatenate([move, turn, grip[..., None]], -1).astype(jnp.float32)


def expert_policy(noise: float = 0.0) -> Callable[[jax.Array, jax.Array, Any, Any], jax.Array]:
    """``policy(key, obs, state, params) -> (B, 7)`` for :func:`imaginejax.data.collect.collect`, with optional
    Gaussian action noise of standard deviation ``noise`` (clipped to [-1, 1])."""

    def policy(key: jax.Array, obs: jax.Array, state: Any, params: Any) -> jax.Array:
        del obs
        action = expert_action(state.vec, params.goals[state.task], state.progress)
        if noise > 0.0:
            action = jnp.clip(action + noise * jax.random.normal(key, action.shape), -1.0, 1.0)
        return action

    return policy


def success_rates(episodes: int, key: jax.Array, names: tuple[str, ...] | None = None,
                  nthread: int | None = None) -> dict[str, float]:
    """Expert success rate of each task within the 500-step cap: ``episodes`` episodes per task, all tasks mixed
    in one batch, one compiled rollout that stops once every episode has ended.

    Args:
      episodes: episodes per task (>= 1).
      key: PRNG key of the resets.
      names: task names (default: all 31).
      nthread: MuJoCo C threads (default: all usable CPUs).
    Returns: task name → fraction of successful episodes.
    """
    from imaginejax.envs.base import instruction_table, make_level_params
    from imaginejax.envs.libero.env import RESET_TRIES, Libero

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    names = tuple(t.name for t in tasks.TASKS) if names is None else tuple(names)
    unknown = [n for n in names if n not in tasks.TASK_INDEX]
    if unknown:
        raise ValueError(f"unknown LIBERO tasks {unknown}; valid tasks: {', '.join(tasks.TASK_INDEX)}")
    specs = [tasks.TASKS[tasks.TASK_INDEX[n]] for n in names]
    goals = np.array([[tasks.TASK_INDEX[n], t.kind, t.a, t.b, t.layout] for n, t in zip(names, specs)], np.int32)
    params = make_level_params("train", goals, instruction_table([(n,) for n in names]), tasks.MAX_STEPS,
                               embed=False, reset_tries=RESET_TRIES)
    env = Libero(backend="mujoco", nthread=nthread)
    batch = len(names) * episodes
    rows = jnp.repeat(jnp.arange(len(names)), episodes)

    @jax.jit
    def run(key: jax.Array) -> jax.Array:
        keys = jax.random.split(key, batch)
        _, state = env.reset_to_task_batch(keys, params, rows)

        def body(state):
            action = expert_action(state.vec, params.goals[state.task], state.progress)
            return env.step_batch(keys, state, action, params)[1]

        return jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state).success

    success = np.asarray(run(key)).reshape(len(names), episodes)
    return {n: float(success[i].mean()) for i, n in enumerate(names)}


if __name__ == "__main__":  # python -m imaginejax.envs.libero.expert [episodes] [seed]
    import sys
    import time

    _episodes = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    _seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    _start = time.perf_counter()
    _rates = success_rates(_episodes, jax.random.key(_seed))
    print(f"expert success over {_episodes} episodes per task (seed {_seed}, {time.perf_counter() - _start:.0f} s):")
    for _name, _rate in _rates.items():
        print(f"  {_name:42s} {_rate:.2f}")
