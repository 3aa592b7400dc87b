"""LIBERO-style tasks: the task table of every level, the 44-d state, success predicates, shaped rewards and
legality, as pure JAX functions that broadcast over leading batch dimensions ``...``.

**State vector** (:data:`STATE_DIM` = 44, BENCHMARK §2.4)::

    [0:7]   arm joint positions            [7:10]  end-effector (fingertip centre) position
    [10:14] end-effector quaternion (w, x, y, z), w >= 0      [14:16] finger slides (0 closed … 0.04 open)
    [16:23] soup can pos + quat   [23:30] cream cheese pos + quat   [30:37] salad dressing pos + quat
    [37:44] basket pos + quat (the basket's origin is the centre of its bottom, on the floor)

**Goal vector** (int32, :data:`GOAL_DIM` = 5): ``[task id, kind, object a, object b, initial layout]``
(kinds :data:`KINDS`; layouts ``FLOOR``, ``HELD``, ``IN_BASKET``; objects 0 can, 1 cheese, 2 dressing).
**Progress** (:class:`Progress`): the episode's first state and a stage counter, by :func:`update_progress`.
**Predicates** (docs/envs.md, "LIBERO"): reach |a - eef| < 0.05; pick: also lifted > :data:`LIFT`; in
the basket: xy < 0.14, z < 0.155 (bottle 0.22); on b: xy < 0.10, z < 0.22, a's bottom >= b's top - 0.02,
released; aside: xy moved > 0.07; out of the basket: xy > :data:`OUT_DISTANCE`; a then b: a entered
while b was out, then both in; all three in the basket.
**Reward** (:func:`reward`): ``20·(d(prev) - d(next))`` for the current sub-goal's distance d (both for
the sub-goal of ``prev``), ``+1`` when its object becomes grasped, ``+1`` when its placement holds,
``+1`` on success.
"""

from __future__ import annotations

import dataclasses
from typing import Final

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from imaginejax.envs.libero import model as M

__all__ = [
    "ALL_BASKET", "ASIDE", "FLOOR", "GOAL_DIM", "HELD", "IN_BASKET", "KINDS", "LEVELS", "LEVEL_TASKS", "MAX_STEPS",
    "OBJECT_NAMES", "OUT_OF_BASKET", "PICK", "PLACE_BASKET", "PLACE_ON", "Progress", "REACH", "SEQ_BASKET",
    "STATE_DIM", "TASKS", "TASK_INDEX", "TaskSpec", "grasped", "in_basket", "legal", "level_goals", "object_pos",
    "basket_slot", "reward", "stage_distance", "state_from_qpos", "success", "update_progress",
]

STATE_DIM: Final[int] = 44
GOAL_DIM: Final[int] = 5
MAX_STEPS: Final[int] = 500
LEVELS: Final[tuple[str, ...]] = ("train", "rephrase", "easy", "hard")
OBJECT_NAMES: Final[tuple[str, ...]] = ("soup can", "cream cheese", "salad dressing")
OBJ_START: Final[int] = 16
BASKET_START: Final[int] = 37
# Kinds of task.
PICK, PLACE_BASKET, REACH, PLACE_ON, ASIDE, SEQ_BASKET, ALL_BASKET, OUT_OF_BASKET = range(8)
KINDS: Final[tuple[str, ...]] = ("pick", "place in basket", "reach", "place on", "aside", "a then b in basket",
                                 "all in basket", "out of basket")
# Initial layouts.
FLOOR, HELD, IN_BASKET = range(3)
# Predicate thresholds (BENCHMARK §2.4 unless noted).
NEAR: Final[float] = 0.05
LIFT: Final[float] = 0.03        # ours: how far above its resting height a picked object must be
BASKET_XY: Final[float] = 0.14
BASKET_Z: Final[np.ndarray] = np.array([0.155, 0.155, 0.22])
ON_XY: Final[float] = 0.10
ON_Z: Final[float] = 0.22
ON_OVERLAP: Final[float] = 0.02  # ours: how far a's bottom may sink below b's top
ASIDE_DISTANCE: Final[float] = 0.07
OUT_DISTANCE: Final[float] = 0.35
REST_Z: Final[np.ndarray] = M.REST_Z  # resting height of each object's origin
GRASP_OPEN_BELOW: Final[float] = 2 * M.GRIPPER_OPEN - 0.008  # finger sum below this: closed on something
GRASP_CLOSED_ABOVE: Final[float] = 0.01                      # ... and above this: not closed on nothing
REWARD_SCALE: Final[float] = 20.0
# Where each object goes in the basket, along the basket's long axis (ours): the three footprints (0.066, 0.11 with
# the cheese's long axis along the basket's, 0.056) fill the 0.29 inner length with ~1.5 cm gaps, and the fingers,
# closing across the basket, stay clear of the neighbours.
BASKET_SLOTS: Final[np.ndarray] = np.array([0.0975, -0.0755, 0.022])  # can (far end), cheese (near end), bottle
# Shaping targets (ours).
LIFT_GOAL: Final[float] = 0.06
ASIDE_GOAL: Final[float] = 0.10
OUT_GOAL: Final[float] = 0.40
# Legality bounds of generated states.
WORKSPACE_LOW: Final[np.ndarray] = np.array([-0.6, -1.0, -0.05])
WORKSPACE_HIGH: Final[np.ndarray] = np.array([1.2, 1.0, 1.3])
FK_TOLERANCE: Final[float] = 0.02
for _a in (BASKET_Z, BASKET_SLOTS, WORKSPACE_LOW, WORKSPACE_HIGH):
    _a.setflags(write=False)

_SHORT = ("soup_can", "cream_cheese", "salad_dressing")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task: ``name``, ``level`` ("train" (also rephrase), "easy", "hard"), ``kind``, objects ``a``, ``b``
    (-1: none) and the initial ``layout``."""

    name: str
    level: str
    kind: int
    a: int = -1
    b: int = -1
    layout: int = FLOOR


def _task_table() -> tuple[TaskSpec, ...]:
    out: list[TaskSpec] = []
    for a in range(3):
        out.append(TaskSpec(f"pick-{_SHORT[a]}", "train", PICK, a))
    for a in range(3):
        out.append(TaskSpec(f"place-{_SHORT[a]}-in-basket", "train", PLACE_BASKET, a, layout=HELD))
    for a in range(3):
        out.append(TaskSpec(f"pick-place-{_SHORT[a]}-in-basket", "easy", PLACE_BASKET, a))
    for a in range(3):
        for b in range(3):
            if a != b:
                out.append(TaskSpec(f"place-{_SHORT[a]}-on-{_SHORT[b]}", "easy", PLACE_ON, a, b))
    for a in range(3):
        out.append(TaskSpec(f"reach-{_SHORT[a]}", "easy", REACH, a))
    for a in range(3):
        for b in range(3):
            if a != b:
                out.append(TaskSpec(f"basket-{_SHORT[a]}-then-{_SHORT[b]}", "hard", SEQ_BASKET, a, b))
    for a in range(3):
        out.append(TaskSpec(f"move-{_SHORT[a]}-aside", "hard", ASIDE, a))
    out.append(TaskSpec("all-in-basket", "hard", ALL_BASKET))
    for a in range(3):
        out.append(TaskSpec(f"fire-take-{_SHORT[a]}-out", "hard", OUT_OF_BASKET, a, layout=IN_BASKET))
    return tuple(out)


TASKS: Final[tuple[TaskSpec, ...]] = _task_table()
TASK_INDEX: Final[dict[str, int]] = {t.name: i for i, t in enumerate(TASKS)}
LEVEL_TASKS: Final[dict[str, tuple[str, ...]]] = {
    "train": tuple(t.name for t in TASKS if t.level == "train"),
    "rephrase": tuple(t.name for t in TASKS if t.level == "train"),
    "easy": tuple(t.name for t in TASKS if t.level == "easy"),
    "hard": tuple(t.name for t in TASKS if t.level == "hard"),
}


def level_goals(level: str) -> np.ndarray:
    """(K, GOAL_DIM) int32 goal table of a level: ``[task id, kind, a, b, layout]`` per task."""
    if level not in LEVELS:
        raise ValueError(f"unknown LIBERO level {level!r}; valid levels: {', '.join(LEVELS)}")
    return np.array([[TASK_INDEX[n], TASKS[TASK_INDEX[n]].kind, TASKS[TASK_INDEX[n]].a, TASKS[TASK_INDEX[n]].b,
                      TASKS[TASK_INDEX[n]].layout] for n in LEVEL_TASKS[level]], np.int32)


# ------------------------------------------------------------------------------------------ state
def _canonical(q: jax.Array) -> jax.Array:
    return q * jnp.where(q[..., :1] < 0, -1.0, 1.0)


def state_from_qpos(qpos: jax.Array) -> jax.Array:
    """The 44-d state of MuJoCo ``qpos`` vectors (..., 37): the end-effector pose from :func:`model.fk`
    (the same kinematics as the MJCF), quaternions with w >= 0. Returns (..., 44) float32."""
    chex.assert_axis_dimension(qpos, -1, M.NQ)
    q = qpos[..., 0:7]
    tcp, quat, _, _ = M.fk(q)
    objects = qpos[..., 9:37].reshape(qpos.shape[:-1] + (4, 7))
    objects = jnp.concatenate([objects[..., :3], _canonical(objects[..., 3:])], -1)
    return jnp.concatenate([q, tcp, _canonical(quat), qpos[..., 7:9], objects.reshape(qpos.shape[:-1] + (28,))],
                           -1).astype(jnp.float32)


def object_pos(state: jax.Array, k: jax.Array | int) -> jax.Array:
    """(..., 3) position of object ``k`` (0..2, or 3 = basket; broadcast over ``...``)."""
    poses = state[..., OBJ_START:].reshape(state.shape[:-1] + (4, 7))
    k = jnp.broadcast_to(jnp.asarray(k, jnp.int32), state.shape[:-1])
    return jnp.take_along_axis(poses, k[..., None, None], axis=-2)[..., 0, :3]


def object_quat(state: jax.Array, k: jax.Array | int) -> jax.Array:
    """(..., 4) quaternion of object ``k``."""
    poses = state[..., OBJ_START:].reshape(state.shape[:-1] + (4, 7))
    k = jnp.broadcast_to(jnp.asarray(k, jnp.int32), state.shape[:-1])
    return jnp.take_along_axis(poses, k[..., None, None], axis=-2)[..., 0, 3:]


def _norm(x: jax.Array) -> jax.Array:
    return jnp.linalg.norm(x, axis=-1)


def near(state: jax.Array, k: jax.Array | int) -> jax.Array:
    """|object k - eef| < 0.05: (...) bool."""
    return _norm(object_pos(state, k) - state[..., 7:10]) < NEAR


def lifted(state: jax.Array, k: jax.Array | int) -> jax.Array:
    """Object k more than :data:`LIFT` above its resting height: (...) bool."""
    k = jnp.asarray(k, jnp.int32)
    return object_pos(state, k)[..., 2] - jnp.asarray(REST_Z, state.dtype)[jnp.clip(k, 0, 2)] > LIFT


def grasped(state: jax.Array, k: jax.Array | int) -> jax.Array:
    """Object k near the fingertips with the fingers closed on something: (...) bool."""
    fingers = state[..., 14] + state[..., 15]
    return near(state, k) & (fingers < GRASP_OPEN_BELOW) & (fingers > GRASP_CLOSED_ABOVE)


def in_basket(state: jax.Array, k: jax.Array | int) -> jax.Array:
    """Object k inside the basket (xy < 0.14, z < 0.155, 0.22 for the bottle): (...) bool."""
    k = jnp.asarray(k, jnp.int32)
    d = object_pos(state, k) - state[..., BASKET_START:BASKET_START + 3]
    return (_norm(d[..., :2]) < BASKET_XY) & (jnp.abs(d[..., 2]) < jnp.asarray(BASKET_Z, state.dtype)[jnp.clip(k, 0, 2)])


def on(state: jax.Array, a: jax.Array | int, b: jax.Array | int) -> jax.Array:
    """Object a on object b: xy < 0.10 and z distance < 0.22 (BENCHMARK), and a's bottom no lower than 0.02
    below b's top (ours, read for upright objects: bottom = z - REST_Z, top = z + TOP_DZ): (...) bool."""
    a, b = jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32)
    pa, pb = object_pos(state, a), object_pos(state, b)
    d = pa - pb
    bottom_a = pa[..., 2] - jnp.asarray(REST_Z, state.dtype)[jnp.clip(a, 0, 2)]
    top_b = pb[..., 2] + jnp.asarray(M.TOP_DZ, state.dtype)[jnp.clip(b, 0, 2)]
    return (_norm(d[..., :2]) < ON_XY) & (jnp.abs(d[..., 2]) < ON_Z) & (bottom_a > top_b - ON_OVERLAP)


def out_of_basket(state: jax.Array, k: jax.Array | int) -> jax.Array:
    """Object k farther than 0.35 (xy) from the basket: (...) bool."""
    return _norm(object_pos(state, k)[..., :2] - state[..., BASKET_START:BASKET_START + 2]) > OUT_DISTANCE


def aside(state: jax.Array, start: jax.Array, k: jax.Array | int) -> jax.Array:
    """Object k moved more than 0.07 (xy) from the episode's first state ``start``: (...) bool."""
    return _norm(object_pos(state, k)[..., :2] - object_pos(start, k)[..., :2]) > ASIDE_DISTANCE


# ------------------------------------------------------------------------------------------ progress
@struct.dataclass
class Progress:
    """What an episode remembers: ``start`` (..., 44) its first state, ``stage`` (...) int32 sub-goals done."""

    start: jax.Array
    stage: jax.Array

    @classmethod
    def initial(cls, state: jax.Array) -> "Progress":
        """The progress of an episode whose first state is ``state`` (..., 44)."""
        return cls(start=state, stage=jnp.zeros(state.shape[:-1], jnp.int32))


def update_progress(progress: Progress, state: jax.Array, goal: jax.Array) -> Progress:
    """Progress after reaching ``state`` (..., 44) under ``goal`` (..., GOAL_DIM): the "a then b" stage
    advances to 1 once a is in the basket while b is not; for "all in basket" the stage counts the objects
    in the basket (shaping only)."""
    kind, a, b = goal[..., 1], goal[..., 2], goal[..., 3]
    first = in_basket(state, jnp.maximum(a, 0)) & ~in_basket(state, jnp.maximum(b, 0))
    count = sum(in_basket(state, k).astype(jnp.int32) for k in range(3))
    stage = jnp.where(kind == SEQ_BASKET, jnp.maximum(progress.stage, first.astype(jnp.int32)),
                      jnp.where(kind == ALL_BASKET, count, progress.stage))
    return progress.replace(stage=stage.astype(jnp.int32))


def success(state: jax.Array, goal: jax.Array, progress: Progress | None = None) -> jax.Array:
    """Success predicate: state (..., 44), goal (..., GOAL_DIM) int32, progress (after ``state``; needed by
    "aside" (its start) and "a then b" (its stage); without it, "aside" is False and "a then b" reduces to
    both in the basket) → (...) bool."""
    chex.assert_axis_dimension(state, -1, STATE_DIM)
    kind, a, b = goal[..., 1], jnp.maximum(goal[..., 2], 0), jnp.maximum(goal[..., 3], 0)
    both = in_basket(state, a) & in_basket(state, b)
    if progress is None:
        is_aside = jnp.zeros(state.shape[:-1], bool)
        seq = both
    else:
        is_aside = aside(state, progress.start, a)
        seq = both & (progress.stage >= 1)
    all_in = in_basket(state, 0) & in_basket(state, 1) & in_basket(state, 2)
    table = (near(state, a) & lifted(state, a), in_basket(state, a), near(state, a), on(state, a, b) & ~grasped(state, a),
             is_aside, seq,
             all_in, out_of_basket(state, a))
    out = jnp.zeros(state.shape[:-1], bool)
    for k, value in enumerate(table):
        out = jnp.where(kind == k, value, out)
    return out


def basket_slot(state: jax.Array, k: jax.Array) -> jax.Array:
    """(..., 3) where object k (...) rests in the basket: its slot along the basket's long axis
    (:data:`BASKET_SLOTS`, turned with the basket) at the object's resting height on the basket's bottom."""
    rest = jnp.asarray(REST_Z, state.dtype)[k]
    base = state[..., BASKET_START:BASKET_START + 3]
    yaw = M.yaw_of(state[..., BASKET_START + 3:BASKET_START + 7])
    along = jnp.asarray(BASKET_SLOTS, state.dtype)[k]
    return base + jnp.stack([along * jnp.cos(yaw), along * jnp.sin(yaw), rest + 2 * M.BASKET_WALL], -1)


def current_subgoal(state: jax.Array, goal: jax.Array, progress: Progress) -> tuple[jax.Array, jax.Array]:
    """The object (...) int32 and placement kind (...) int32 of the sub-goal being worked on: the task's own
    except for "a then b" (a until stage 1, then b) and "all in basket" (the first object, in name order, not
    in the basket, placed with kind ``PLACE_BASKET``)."""
    kind, a, b = goal[..., 1], jnp.maximum(goal[..., 2], 0), jnp.maximum(goal[..., 3], 0)
    first_out = jnp.argmax(jnp.stack([~in_basket(state, k) for k in range(3)], -1), axis=-1).astype(jnp.int32)
    obj = jnp.where(kind == SEQ_BASKET, jnp.where(progress.stage >= 1, b, a), jnp.where(kind == ALL_BASKET, first_out, a))
    sub = jnp.where((kind == SEQ_BASKET) | (kind == ALL_BASKET), PLACE_BASKET, kind)
    return obj.astype(jnp.int32), sub.astype(jnp.int32)


def stage_distance(state: jax.Array, obj: jax.Array, sub: jax.Array, b: jax.Array, start: jax.Array) -> jax.Array:
    """Distance d (...) of the sub-goal (object ``obj``, kind ``sub``, second object ``b``) on ``state``:
    |eef - obj| plus the remaining distance of the placement (lift to :data:`LIFT_GOAL`, to the basket's
    centre, onto b, :data:`ASIDE_GOAL` from the start, :data:`OUT_GOAL` from the basket)."""
    pos = object_pos(state, obj)
    reach = _norm(pos - state[..., 7:10])
    rest = jnp.asarray(REST_Z, state.dtype)[obj]
    lift = jnp.maximum(LIFT_GOAL - (pos[..., 2] - rest), 0.0)
    basket = _norm(pos - basket_slot(state, obj))
    top = jnp.asarray(M.TOP_DZ, state.dtype)
    onto = _norm(pos - (object_pos(state, b) + jnp.stack(
        [jnp.zeros_like(rest), jnp.zeros_like(rest), top[b] + rest], -1)))
    moved = jnp.maximum(ASIDE_GOAL - _norm(pos[..., :2] - object_pos(start, obj)[..., :2]), 0.0)
    away = jnp.maximum(OUT_GOAL - _norm(pos[..., :2] - state[..., BASKET_START:BASKET_START + 2]), 0.0)
    place = jnp.stack([lift, basket, jnp.zeros_like(lift), onto, moved, basket, basket, away], -1)
    return reach + jnp.take_along_axis(place, sub[..., None], axis=-1)[..., 0]


def _placed(state: jax.Array, obj: jax.Array, sub: jax.Array, b: jax.Array, start: jax.Array) -> jax.Array:
    table = jnp.stack([lifted(state, obj), in_basket(state, obj), near(state, obj),
                       on(state, obj, b) & ~grasped(state, obj), aside(state, start, obj), in_basket(state, obj), in_basket(state, obj),
                       out_of_basket(state, obj)], -1)
    return jnp.take_along_axis(table, sub[..., None], axis=-1)[..., 0]


def reward(prev: jax.Array, next_: jax.Array, goal: jax.Array, progress: Progress | None = None,
           next_progress: Progress | None = None) -> jax.Array:
    """Shaped reward of a transition (the module docstring's formula).

    Args:
      prev, next_: (..., 44) states before and after the step.
      goal: (..., GOAL_DIM) int32.
      progress: the episode's progress at ``prev`` (default ``Progress.initial(prev)``: the episode starts at
        ``prev``); ``next_progress`` after ``next_`` (default: updated here).
    Returns: (...) float32.
    """
    if progress is None:
        progress = Progress.initial(prev)
    if next_progress is None:
        next_progress = update_progress(progress, next_, goal)
    obj, sub = current_subgoal(prev, goal, progress)
    b = jnp.maximum(goal[..., 3], 0)
    d_prev = stage_distance(prev, obj, sub, b, progress.start)
    d_next = stage_distance(next_, obj, sub, b, progress.start)
    grasp_event = grasped(next_, obj) & ~grasped(prev, obj)
    place_event = _placed(next_, obj, sub, b, progress.start) & ~_placed(prev, obj, sub, b, progress.start)
    done = success(next_, goal, next_progress)
    return (REWARD_SCALE * (d_prev - d_next) + grasp_event + place_event + done).astype(jnp.float32)


def legal(state: jax.Array) -> jax.Array:
    """Plausibility of 44-d states: finite; joints within their limits (±0.05 rad); the end-effector pose
    within 0.02 m / matching the forward kinematics of the joints; fingers in [-0.005, 0.045]; every
    position inside a generous workspace; unit quaternions (±0.05). (..., 44) → (...) bool."""
    chex.assert_axis_dimension(state, -1, STATE_DIM)
    finite = jnp.all(jnp.isfinite(state), axis=-1)
    safe = jnp.where(jnp.isfinite(state), state, 0.0)
    q = safe[..., 0:7]
    joints = jnp.all((q >= M.JOINT_LOW - 0.05) & (q <= M.JOINT_HIGH + 0.05), axis=-1)
    tcp, quat, _, _ = M.fk(q)
    eef = (_norm(tcp - safe[..., 7:10]) < FK_TOLERANCE) & (jnp.abs(jnp.sum(quat * safe[..., 10:14], -1)) > 0.99)
    fingers = jnp.all((safe[..., 14:16] >= -0.005) & (safe[..., 14:16] <= 0.045), axis=-1)
    poses = safe[..., OBJ_START:].reshape(state.shape[:-1] + (4, 7))
    positions = jnp.concatenate([safe[..., None, 7:10], poses[..., :3]], -2)
    inside = jnp.all((positions >= WORKSPACE_LOW) & (positions <= WORKSPACE_HIGH), axis=(-2, -1))
    quats = jnp.concatenate([safe[..., None, 10:14], poses[..., 3:]], -2)
    unit = jnp.all(jnp.abs(_norm(quats) - 1.0) <= 0.05, axis=-1)
    return finite & joints & eef & fingers & inside & unit
