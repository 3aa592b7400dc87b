"""Meta-World tasks: the task table, the 91-d entity-slot state, and Meta-World's success predicates and
dense rewards as pure JAX functions broadcasting over leading dims.

State (:data:`STATE_DIM` = 91)::

    [0:3]  hand position (Meta-World's ``body("hand").xpos``, clipped to its hand space)
    [3]    gripper opening: |right claw - left claw| / 0.1 clipped to [0, 1]
    [4:7]  target location
    [7 + 7k : 14 + 7k]  entity slot k = position (3) + quaternion (w, x, y, z) for k in :data:`ENTITIES`

Only the task's slots and one distractor slot are filled, the rest is 0. Goal (GOAL_DIM = 2) int32:
``[task id, position in its level]``. The dense rewards also need :class:`Extras` (tcp, pads, joint,
per-episode constants), exact in the simulator and approximated from the state by
:func:`extras_from_state` for generated data (docs/envs.md, "Meta-World").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from imaginejax.envs.metaworld.scenes import SceneSpec, Sensor, sensor_slices

__all__ = [
    "CONST_DIM", "ENTITIES", "Extras", "GOAL_DIM", "HAND_HIGH", "HAND_LOW", "LEVELS", "LEVEL_TASKS", "MAX_STEPS",
    "STATE_DIM", "TASKS", "TASK_INDEX", "TaskSpec", "dense_reward", "extras_from_state", "legal", "reward",
    "state_from_sensors", "success", "success_from",
]

ENTITIES: Final[tuple[str, ...]] = ("target_object", "button", "lock", "handle", "window", "faucet", "wall",
                                    "coffee", "coffee_button", "hammer", "nail", "soccer")
NUM_SLOTS: Final[int] = len(ENTITIES)
SLOT_DIM: Final[int] = 7
SLOT_START: Final[int] = 7
STATE_DIM: Final[int] = SLOT_START + SLOT_DIM * NUM_SLOTS  # 91
GOAL_DIM: Final[int] = 2
CONST_DIM: Final[int] = 18
MAX_STEPS: Final[int] = 100
LEVELS: Final[tuple[str, ...]] = ("train", "rephrase", "easy", "hard")
# Meta-World's observation bounds for the hand (SawyerXYZEnv._HAND_SPACE); the obs is clipped to them.
HAND_LOW: Final[np.ndarray] = np.array([-0.525, 0.348, -0.0525])
HAND_HIGH: Final[np.ndarray] = np.array([0.525, 1.025, 0.7])
# Legality bounds of generated states (a generous workspace around the table).
WORKSPACE_LOW: Final[np.ndarray] = np.array([-0.8, 0.2, -0.2])
WORKSPACE_HIGH: Final[np.ndarray] = np.array([0.8, 1.3, 1.0])
# Mean tcp - hand offset over Meta-World resets (used only to rebuild extras from a bare 91-d state).
TCP_OFFSET: Final[np.ndarray] = np.array([0.0, 0.0, -0.045])


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One Meta-World task.

    Attributes:
      name: our name (Meta-World's ``<name>-v3`` where it exists).
      level: "train" (also rephrase), "easy" or "hard".
      scene: how the model is built (:class:`SceneSpec`).
      hand_init: hand position the reset drives the mocap to.
      hand_low / hand_high: mocap bounds of the action.
      rand_low / rand_high: Meta-World's ``_random_reset_space``.
      min_xy_gap: rejection rule of the reset (``|rand[0:2] - rand[3:5]| >= min_xy_gap``; 0: none).
      slots: (entity, which sensor position/quaternion fills it): "obj" or "obj2".
      metaworld: the metaworld package's environment name (None for our composed tasks).
    """

    name: str
    level: str
    scene: SceneSpec
    hand_init: tuple[float, float, float]
    hand_low: tuple[float, float, float]
    hand_high: tuple[float, float, float]
    rand_low: tuple[float, ...]
    rand_high: tuple[float, ...]
    min_xy_gap: float = 0.0
    slots: tuple[tuple[str, str], ...] = ()
    metaworld: str | None = None


_OBJ = Sensor("xbody", "obj")
_OBJ_GEOM = Sensor("geom", "objGeom")
_LOW = (-0.5, 0.40, 0.05)
_HIGH = (0.5, 1.0, 0.5)

TASKS: tuple[TaskSpec, ...] = (
    TaskSpec("reach", "train", SceneSpec("sawyer_reach_v3.xml", obj_pos=_OBJ, obj_quat=_OBJ_GEOM),
             (0.0, 0.6, 0.2), _LOW, _HIGH, (-0.1, 0.6, 0.02, -0.1, 0.8, 0.05), (0.1, 0.7, 0.02, 0.1, 0.9, 0.3),
             0.15, (("target_object", "obj"),), "reach-v3"),
    TaskSpec("push", "train", SceneSpec("sawyer_push_v3.xml", obj_pos=_OBJ, obj_quat=_OBJ_GEOM),
             (0.0, 0.6, 0.2), _LOW, _HIGH, (-0.1, 0.6, 0.02, -0.1, 0.8, 0.01), (0.1, 0.7, 0.02, 0.1, 0.9, 0.02),
             0.15, (("target_object", "obj"),), "push-v3"),
    TaskSpec("pick-place", "train", SceneSpec("sawyer_pick_place_v3.xml", obj_pos=_OBJ, obj_quat=_OBJ_GEOM),
             (0.0, 0.6, 0.2), _LOW, _HIGH, (-0.1, 0.6, 0.02, -0.1, 0.8, 0.05), (0.1, 0.7, 0.02, 0.1, 0.9, 0.3),
             0.15, (("target_object", "obj"),), "pick-place-v3"),
    TaskSpec("button-press", "train",
             SceneSpec("sawyer_button_press.xml", ("box",), Sensor("xbody", "button"), Sensor("xbody", "button"),
                       extra_pos=Sensor("site", "hole")),
             (0.0, 0.4, 0.2), _LOW, _HIGH, (-0.1, 0.85, 0.115), (0.1, 0.9, 0.115), 0.0, (("button", "obj"),),
             "button-press-v3"),
    TaskSpec("door-unlock", "train",
             SceneSpec("sawyer_door_lock.xml", ("door",), Sensor("site", "lockStartUnlock"),
                       Sensor("xbody", "door_link"), extra_pos=Sensor("xbody", "lock_link")),
             (0.0, 0.6, 0.2), (-0.5, 0.40, -0.15), _HIGH, (-0.1, 0.8, 0.15), (0.1, 0.85, 0.15), 0.0,
             (("lock", "obj"),), "door-unlock-v3"),
    TaskSpec("door-open", "train",
             SceneSpec("sawyer_door_pull.xml", ("door",), Sensor("geom", "handle"), Sensor("geom", "handle"),
                       joint=Sensor("joint", "doorjoint")),
             (0.0, 0.6, 0.2), _LOW, _HIGH, (0.0, 0.85, 0.15), (0.1, 0.95, 0.15), 0.0, (("handle", "obj"),),
             "door-open-v3"),
    TaskSpec("window-open", "train",
             SceneSpec("sawyer_window_horizontal.xml", ("window",), Sensor("site", "handleOpenStart"),
                       Sensor("xbody", "window")),
             (0.0, 0.4, 0.2), _LOW, _HIGH, (-0.1, 0.7, 0.16), (0.1, 0.9, 0.16), 0.0, (("window", "obj"),),
             "window-open-v3"),
    TaskSpec("faucet-open", "train",
             SceneSpec("sawyer_faucet.xml", ("faucetBase",), Sensor("site", "handleStartOpen"),
                       Sensor("xbody", "faucetBase")),
             (0.0, 0.4, 0.2), (-0.5, 0.40, -0.15), _HIGH, (-0.05, 0.8, 0.0), (0.05, 0.85, 0.0), 0.0,
             (("faucet", "obj"),), "faucet-open-v3"),
    TaskSpec("coffee-push", "train",
             SceneSpec("sawyer_coffee.xml", ("coffee_machine",), _OBJ, Sensor("geom", "mug")),
             (0.0, 0.4, 0.2), _LOW, _HIGH, (-0.1, 0.55, -0.001, -0.05, 0.7, -0.001),
             (0.1, 0.65, 0.001, 0.05, 0.75, 0.001), 0.15, (("coffee", "obj"),), "coffee-push-v3"),
    TaskSpec("coffee-button", "train",
             SceneSpec("sawyer_coffee.xml", ("coffee_machine",), Sensor("site", "buttonStart"),
                       Sensor("xbody", "coffee_machine")),
             (0.0, 0.4, 0.2), (-0.5, 0.4, 0.05), (0.5, 1.0, 0.5), (-0.1, 0.8, -0.001), (0.1, 0.9, 0.001), 0.0,
             (("coffee_button", "obj"),), "coffee-button-v3"),
)
_WALL = Sensor("xbody", "wall")
_GEOM_OBJ = Sensor("geom", "objGeom")
TASKS = TASKS + (
    TaskSpec("reach-wall", "easy", SceneSpec("sawyer_reach_wall_v3.xml", (), _OBJ, _OBJ_GEOM, _WALL, _WALL),
             (0.0, 0.6, 0.2), _LOW, _HIGH, (-0.05, 0.6, 0.015, -0.05, 0.85, 0.05), (0.05, 0.65, 0.015, 0.05, 0.9, 0.3),
             0.15, (("target_object", "obj"), ("wall", "obj2")), "reach-wall-v3"),
    TaskSpec("push-wall", "easy", SceneSpec("sawyer_push_wall_v3.xml", (), _GEOM_OBJ, _OBJ_GEOM, _WALL, _WALL),
             (0.0, 0.6, 0.2), _LOW, _HIGH, (-0.05, 0.6, 0.015, -0.05, 0.85, 0.01), (0.05, 0.65, 0.015, 0.05, 0.9, 0.02),
             0.15, (("target_object", "obj"), ("wall", "obj2")), "push-wall-v3"),
    TaskSpec("pick-place-wall", "easy", SceneSpec("sawyer_pick_place_wall_v3.xml", (), _GEOM_OBJ, _OBJ_GEOM, _WALL, _WALL),
             (0.0, 0.6, 0.2), _LOW, _HIGH, (-0.05, 0.6, 0.015, -0.05, 0.85, 0.05), (0.05, 0.65, 0.015, 0.05, 0.9, 0.3),
             0.15, (("target_object", "obj"), ("wall", "obj2")), "pick-place-wall-v3"),
    TaskSpec("button-press-wall", "easy",
             SceneSpec("sawyer_button_press_wall.xml", ("box",), Sensor("xbody", "button"), Sensor("xbody", "button"),
                       _WALL, _WALL, extra_pos=Sensor("site", "hole")),
             (0.0, 0.4, 0.2), _LOW, _HIGH, (-0.05, 0.85, 0.1149), (0.05, 0.9, 0.1151), 0.0,
             (("button", "obj"), ("wall", "obj2")), "button-press-wall-v3"),
    TaskSpec("door-lock", "easy",
             SceneSpec("sawyer_door_lock.xml", ("door",), Sensor("site", "lockStartLock"), Sensor("xbody", "door_link"),
                       extra_pos=Sensor("xbody", "lock_link")),
             (0.0, 0.6, 0.2), (-0.5, 0.40, -0.15), _HIGH, (-0.1, 0.8, 0.15), (0.1, 0.85, 0.15), 0.0,
             (("lock", "obj"),), "door-lock-v3"),
    TaskSpec("door-close", "easy",
             SceneSpec("sawyer_door_pull.xml", ("door",), Sensor("geom", "handle"), Sensor("geom", "handle"),
                       joint=Sensor("joint", "doorjoint")),
             (-0.5, 0.6, 0.2), _LOW, _HIGH, (0.0, 0.85, 0.15), (0.1, 0.95, 0.15), 0.0, (("handle", "obj"),),
             "door-close-v3"),
    TaskSpec("window-close", "easy",
             SceneSpec("sawyer_window_horizontal.xml", ("window",), Sensor("site", "handleCloseStart"),
                       Sensor("xbody", "window")),
             (0.0, 0.4, 0.2), _LOW, _HIGH, (0.0, 0.75, 0.2), (0.0, 0.9, 0.2), 0.0, (("window", "obj"),),
             "window-close-v3"),
    TaskSpec("faucet-close", "easy",
             SceneSpec("sawyer_faucet.xml", ("faucetBase",), Sensor("site", "handleStartClose"),
                       Sensor("xbody", "faucetBase")),
             (0.0, 0.4, 0.2), (-0.5, 0.40, -0.15), _HIGH, (-0.1, 0.8, 0.0), (0.1, 0.85, 0.0), 0.0,
             (("faucet", "obj"),), "faucet-close-v3"),
)
TASKS = TASKS + (
    # make-coffee (ours, composed): push the mug under the nozzle, then press the coffee button. The random
    # vector is coffee-push's (mug start, mug goal); the machine stands 0.22 behind the mug goal.
    TaskSpec("make-coffee", "hard",
             SceneSpec("sawyer_coffee.xml", ("coffee_machine",), _OBJ, Sensor("geom", "mug"),
                       Sensor("site", "buttonStart"), Sensor("xbody", "coffee_machine")),
             (0.0, 0.4, 0.2), _LOW, _HIGH, (-0.1, 0.55, -0.001, -0.05, 0.7, -0.001),
             (0.1, 0.65, 0.001, 0.05, 0.75, 0.001), 0.15, (("coffee", "obj"), ("coffee_button", "obj2")), None),
    TaskSpec("hammer", "hard",
             SceneSpec("sawyer_hammer.xml", (), Sensor("xbody", "hammer"), Sensor("xbody", "hammer"),
                       Sensor("xbody", "nail_link"), Sensor("xbody", "nail_link"), Sensor("joint", "NailSlideJoint"),
                       Sensor("site", "goal")),
             (0.0, 0.4, 0.2), _LOW, _HIGH, (-0.1, 0.4, 0.0), (0.1, 0.5, 0.0), 0.0,
             (("hammer", "obj"), ("nail", "obj2")), "hammer-v3"),
    TaskSpec("soccer", "hard",
             SceneSpec("sawyer_soccer.xml", ("goal_whole",), Sensor("xbody", "soccer_ball"), Sensor("xbody", "soccer_ball")),
             (0.0, 0.6, 0.2), _LOW, _HIGH, (-0.1, 0.6, 0.03, -0.1, 0.8, 0.0), (0.1, 0.7, 0.03, 0.1, 0.9, 0.0), 0.15,
             (("soccer", "obj"),), "soccer-v3"),
)
TASKS = TASKS + (
    # locked-door-open (ours, composed): Meta-World's lockable door given the hinge of its openable door;
    # the door is latched until the lock is turned open (scenes.LOCK_RELEASE_ANGLE). Random vector and hand
    # as door-unlock; targets: door-open's (door + (-0.3, -0.45, 0)) for the handle, door-unlock's for the lock.
    TaskSpec("locked-door-open", "hard",
             SceneSpec("sawyer_door_lock.xml", ("door",), Sensor("site", "door_handle"), Sensor("xbody", "door_link"),
                       Sensor("site", "lockStartUnlock"), Sensor("xbody", "lock_link"), Sensor("joint", "doorjoint"),
                       Sensor("xbody", "lock_link"), edit="locked_door"),
             (0.0, 0.6, 0.2), (-0.5, 0.40, -0.15), _HIGH, (-0.1, 0.8, 0.15), (0.1, 0.85, 0.15), 0.0,
             (("handle", "obj"), ("lock", "obj2")), None),
)
TASK_INDEX: Final[dict[str, int]] = {t.name: i for i, t in enumerate(TASKS)}
LOCKED_DOOR_UNLOCK_OFFSET: Final[np.ndarray] = np.array([0.1, -0.04, 0.0])  # door-unlock: target - lock_link
LOCKED_DOOR_LOCK_FROM_TARGET: Final[float] = 0.3  # lock_link x - handle target x (door at rest)
LOCKED_DOOR_HANDLE_CLOSED_DX: Final[float] = 0.3 + 0.19072163  # closed handle x - handle target x
# Geometry of the composed and hard tasks.
COFFEE_BUTTON_OFFSET: Final[np.ndarray] = np.array([0.0, 0.03, 0.3])  # button target - mug goal (coffee-button)
MAKE_COFFEE_MUG_RADIUS: Final[float] = 0.07
MAKE_COFFEE_BUTTON_RADIUS: Final[float] = 0.02
NAIL_REST_Y: Final[float] = 0.64  # nail_link y at NailSlideJoint = 0 (the box does not move)
HAMMER_SUCCESS_DEPTH: Final[float] = 0.09
LEVEL_TASKS: Final[dict[str, tuple[str, ...]]] = {
    "train": tuple(t.name for t in TASKS if t.level == "train"),
    "rephrase": tuple(t.name for t in TASKS if t.level == "train"),
    "easy": tuple(t.name for t in TASKS if t.level == "easy"),
    "hard": ("make-coffee", "locked-door-open", "hammer", "soccer"),  # BENCHMARK §2.2 order
}
RAND_DIM: Final[int] = max(len(t.rand_low) for t in TASKS)
NUM_TASKS: Final[int] = len(TASKS)

# Per-task arrays used by the jitted code (rows = task ids).
_SLOT_FILL = np.zeros((NUM_TASKS, NUM_SLOTS, 2), np.float32)  # [task, slot, (uses obj, uses obj2)]
for _i, _t in enumerate(TASKS):
    for _entity, _which in _t.slots:
        _SLOT_FILL[_i, ENTITIES.index(_entity), 0 if _which == "obj" else 1] = 1.0
SLOT_USED: Final[np.ndarray] = _SLOT_FILL.max(-1) > 0  # (K, 12) bool
HAND_INIT: Final[np.ndarray] = np.array([t.hand_init for t in TASKS], np.float32)
MOCAP_LOW: Final[np.ndarray] = np.array([t.hand_low for t in TASKS], np.float32)
MOCAP_HIGH: Final[np.ndarray] = np.array([t.hand_high for t in TASKS], np.float32)
RAND_LOW: Final[np.ndarray] = np.array([list(t.rand_low) + [0.0] * (RAND_DIM - len(t.rand_low)) for t in TASKS], np.float32)
RAND_HIGH: Final[np.ndarray] = np.array([list(t.rand_high) + [0.0] * (RAND_DIM - len(t.rand_high)) for t in TASKS], np.float32)
MIN_XY_GAP: Final[np.ndarray] = np.array([t.min_xy_gap for t in TASKS], np.float32)
# Offsets Meta-World adds to the observed object position of some tasks (button: centre of the cap;
# faucet: below the handle start site).
OBJ_OFFSET: Final[np.ndarray] = np.zeros((NUM_TASKS, 3), np.float32)
OBJ_OFFSET[TASK_INDEX["button-press"]] = (0.0, -0.193, 0.0)
OBJ_OFFSET[TASK_INDEX["button-press-wall"]] = (0.0, -0.193, 0.0)
OBJ_OFFSET[TASK_INDEX["faucet-open"]] = (0.0, 0.0, -0.01)
OBJ_OFFSET[TASK_INDEX["faucet-close"]] = (0.0, 0.0, -0.01)
for _a in (HAND_INIT, MOCAP_LOW, MOCAP_HIGH, RAND_LOW, RAND_HIGH, MIN_XY_GAP, OBJ_OFFSET, SLOT_USED):
    _a.setflags(write=False)


def level_goals(level: str) -> np.ndarray:
    """(K, GOAL_DIM) int32 goal table of a level: ``[task id, position within the level]``."""
    if level not in LEVELS:
        raise ValueError(f"unknown Meta-World level {level!r}; valid levels: {', '.join(LEVELS)}")
    names = LEVEL_TASKS[level]
    if not names:
        raise NotImplementedError(f"Meta-World level {level!r} has no implemented tasks yet")
    return np.array([[TASK_INDEX[n], k] for k, n in enumerate(names)], np.int32)


# ---------------------------------------------------------------------------------------------------
# Extras: what the rewards read beyond the 91-d state
# ---------------------------------------------------------------------------------------------------
@struct.dataclass
class Extras:
    """Per-step quantities the dense rewards need besides the 91-d state (each (..., ·) float32).

    Attributes:
      tcp: (..., 3) tool-centre point (mean of the finger sites).
      lpad / rpad: (..., 3) finger pads' centres of mass.
      joint: (..., 1) the task's joint position (door hinge angle; 0 where unused).
      consts: (..., CONST_DIM) per-episode constants: target [0:3], object's initial position [3:6],
        tcp at reset [6:9], left pad [9:12] and right pad [12:15] at reset, task-specific [15:18]
        (button / coffee button: initial object-to-target distance in [15]; window: handle at reset).
    """

    tcp: jax.Array
    lpad: jax.Array
    rpad: jax.Array
    joint: jax.Array
    consts: jax.Array


def _clip_hand(hand: jax.Array) -> jax.Array:
    return jnp.clip(hand, jnp.asarray(HAND_LOW, hand.dtype), jnp.asarray(HAND_HIGH, hand.dtype))


def state_from_sensors(sensors: jax.Array, task: jax.Array, target: jax.Array) -> jax.Array:
    """The 91-d state of sensor readings (without distractor).

    Args:
      sensors: (..., SENSOR_DIM) readings (:mod:`scenes` layout).
      task: (...) int32 task ids.
      target: (..., 3) target location.
    Returns: (..., 91) float32.
    """
    sl = sensor_slices()
    hand = _clip_hand(sensors[..., sl["hand"]])
    opening = jnp.clip(jnp.linalg.norm(sensors[..., sl["rclaw"]] - sensors[..., sl["lclaw"]], axis=-1) / 0.1, 0.0, 1.0)
    obj = sensors[..., sl["obj"]] + jnp.asarray(OBJ_OFFSET)[task]
    obj_pose = jnp.concatenate([obj, sensors[..., sl["obj_quat"]]], -1)
    obj2_pose = jnp.concatenate([sensors[..., sl["obj2"]], sensors[..., sl["obj2_quat"]]], -1)
    fill = jnp.asarray(_SLOT_FILL)[task]  # (..., 12, 2)
    slots = fill[..., 0:1] * obj_pose[..., None, :] + fill[..., 1:2] * obj2_pose[..., None, :]
    head = jnp.concatenate([hand, opening[..., None], target], -1)
    return jnp.concatenate([head, slots.reshape(slots.shape[:-2] + (NUM_SLOTS * SLOT_DIM,))], -1).astype(jnp.float32)


def extras_from_sensors(sensors: jax.Array, consts: jax.Array) -> Extras:
    """:class:`Extras` of sensor readings (..., SENSOR_DIM) and the episode's constants (..., CONST_DIM)."""
    sl = sensor_slices()
    tcp = 0.5 * (sensors[..., sl["ree"]] + sensors[..., sl["lee"]])
    return Extras(tcp=tcp, lpad=sensors[..., sl["lpad"]], rpad=sensors[..., sl["rpad"]],
                  joint=sensors[..., sl["joint"]], consts=consts)


def slot_of(state: jax.Array, entity: str) -> jax.Array:
    """(..., 7) pose of an entity slot of 91-d states."""
    k = ENTITIES.index(entity)
    return state[..., SLOT_START + SLOT_DIM * k: SLOT_START + SLOT_DIM * (k + 1)]


def main_object(state: jax.Array, task: jax.Array) -> jax.Array:
    """(..., 3) position of the task's main object (the slot its sensor ``obj`` fills)."""
    fill = jnp.asarray(_SLOT_FILL)[task][..., 0]  # (..., 12)
    slots = state[..., SLOT_START:].reshape(state.shape[:-1] + (NUM_SLOTS, SLOT_DIM))
    return (fill[..., None] * slots[..., :3]).sum(-2)


# ---------------------------------------------------------------------------------------------------
# Reward building blocks (dm_control's tolerance as Meta-World uses it)
# ---------------------------------------------------------------------------------------------------
_LONG_TAIL_SCALE: Final[float] = math.sqrt(1.0 / 0.1 - 1.0)
_GAUSSIAN_SCALE: Final[float] = math.sqrt(-2.0 * math.log(0.1))


def tolerance(x: jax.Array, lower: float | jax.Array, upper: float | jax.Array, margin: jax.Array | float,
              sigmoid: str = "long_tail") -> jax.Array:
    """1 inside [lower, upper]; outside, a sigmoid of (distance to the bound) / margin that is 0.1 at one
    margin ("long_tail": 1 / (1 + (3 d)²); "gaussian": exp(-½ (d·√(2 ln 10))²)); 0 outside if margin = 0."""
    x = jnp.asarray(x)
    margin = jnp.asarray(margin, x.dtype)
    inside = (lower <= x) & (x <= upper)
    d = jnp.where(x < lower, lower - x, x - upper) / jnp.where(margin > 0, margin, 1.0)
    if sigmoid == "long_tail":
        value = 1.0 / ((d * _LONG_TAIL_SCALE) ** 2 + 1.0)
    elif sigmoid == "gaussian":
        value = jnp.exp(-0.5 * (d * _GAUSSIAN_SCALE) ** 2)
    else:
        raise ValueError(f"unknown sigmoid {sigmoid!r}; valid: long_tail, gaussian")
    return jnp.where(inside, 1.0, jnp.where(margin > 0, value, 0.0))


def hamacher(a: jax.Array, b: jax.Array) -> jax.Array:
    """Hamacher product a·b / (a + b - a·b) (0 when both are 0)."""
    den = a + b - a * b
    return jnp.where(den > 0, a * b / jnp.where(den > 0, den, 1.0), 0.0)


def _norm(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(x * x, axis=-1))


def _xz(x: jax.Array) -> jax.Array:
    return x.at[..., 1].set(0.0)


def _caging(action: jax.Array, obj: jax.Array, ex: Extras, *, obj_radius: float, pad_thresh: float,
            reach_radius: float, xz_thresh: float, effort: float = 1.0, density: str = "high") -> jax.Array:
    """Meta-World's generic gripper-caging reward (SawyerXYZEnv._gripper_caging_reward)."""
    obj_init, init_tcp = ex.consts[..., 3:6], ex.consts[..., 6:9]
    pad_y = jnp.stack([ex.lpad[..., 1], ex.rpad[..., 1]], -1)
    pad_to_obj = jnp.abs(pad_y - obj[..., 1:2])
    pad_to_init = jnp.abs(pad_y - obj_init[..., 1:2])
    lr = tolerance(pad_to_obj, obj_radius, pad_thresh, jnp.abs(pad_to_init - pad_thresh))
    caging_y = hamacher(lr[..., 0], lr[..., 1])
    xz_margin = _norm(_xz(obj_init) - _xz(init_tcp)) - xz_thresh
    caging_xz = tolerance(_norm(_xz(ex.tcp) - _xz(obj)), 0.0, xz_thresh, xz_margin)
    closed = jnp.minimum(jnp.maximum(0.0, action[..., 3]), effort) / effort
    caging = hamacher(caging_y, caging_xz)
    gripping = jnp.where(caging > 0.97, closed, 0.0)
    out = hamacher(caging, gripping)
    if density == "none":
        return out
    if density == "high":
        return (out + caging) / 2
    reach = tolerance(_norm(obj - ex.tcp), 0.0, reach_radius, jnp.abs(_norm(obj_init - init_tcp) - reach_radius))
    return (out + reach) / 2


def _pick_place_caging(action: jax.Array, obj: jax.Array, ex: Extras) -> jax.Array:
    """Pick-place's own caging reward (SawyerPickPlaceEnvV3._gripper_caging_reward), with the *current*
    pads as its "initial" ones (Meta-World keeps live views of ``xpos``)."""
    obj_init, init_tcp = ex.consts[..., 3:6], ex.consts[..., 6:9]
    init_l, init_r = ex.lpad, ex.rpad
    right = tolerance(obj[..., 1] - ex.rpad[..., 1], 0.015, 0.05, jnp.abs(jnp.abs(obj[..., 1] - init_r[..., 1]) - 0.05))
    left = tolerance(ex.lpad[..., 1] - obj[..., 1], 0.015, 0.05, jnp.abs(jnp.abs(obj[..., 1] - init_l[..., 1]) - 0.05))
    y_caging = hamacher(left, right)
    xz = tolerance(_norm(_xz(ex.tcp) - _xz(obj)), 0.0, 0.005, _norm(_xz(obj_init) - _xz(init_tcp)) - 0.005)
    closed = jnp.minimum(jnp.maximum(0.0, action[..., 3]), 1.0)
    caging = hamacher(y_caging, xz)
    gripping = jnp.where(caging > 0.97, closed, 0.0)
    return (hamacher(caging, gripping) + caging) / 2


# ---------------------------------------------------------------------------------------------------
# Per-task dense rewards and success predicates (Meta-World v3, reward_function_version "v2")
# ---------------------------------------------------------------------------------------------------
def _parts(state: jax.Array, task: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    hand, opening, target = state[..., 0:3], state[..., 3], state[..., 4:7]
    return hand, opening, target, main_object(state, task)


def _r_reach(state, task, action, ex):
    _, _, target, _ = _parts(state, task)
    margin = _norm(jnp.asarray(HAND_INIT)[task] - target)
    return 10.0 * tolerance(_norm(ex.tcp - target), 0.0, 0.05, margin)


def _r_push(state, task, action, ex):
    _, opening, target, obj = _parts(state, task)
    to_target = _norm(obj - target)
    in_place = tolerance(to_target, 0.0, 0.05, _norm(ex.consts[..., 3:6] - target))
    grasped = _caging(action, obj, ex, obj_radius=0.015, pad_thresh=0.05, reach_radius=0.01, xz_thresh=0.005)
    r = 2.0 * grasped
    r = jnp.where((_norm(obj - ex.tcp) < 0.02) & (opening > 0), 2.0 * r + 1.0 + 5.0 * in_place, r)
    return jnp.where(to_target < 0.05, 10.0, r)


def _r_pick_place(state, task, action, ex):
    _, opening, target, obj = _parts(state, task)
    to_target = _norm(obj - target)
    in_place = tolerance(to_target, 0.0, 0.05, _norm(ex.consts[..., 3:6] - target))
    grasped = _pick_place_caging(action, obj, ex)
    r = hamacher(grasped, in_place)
    lifted = obj[..., 2] - 0.01 > ex.consts[..., 5]
    r = jnp.where((_norm(obj - ex.tcp) < 0.02) & (opening > 0) & lifted, r + 1.0 + 5.0 * in_place, r)
    return jnp.where(to_target < 0.05, 10.0, r)


def _r_button(state, task, action, ex, margin_pressed):
    _, opening, target, obj = _parts(state, task)
    tcp_to_obj = _norm(obj - ex.tcp)
    near = tolerance(tcp_to_obj, 0.0, 0.05, _norm(obj - ex.consts[..., 6:9]))
    pressed = tolerance(jnp.abs(target[..., 1] - obj[..., 1]), 0.0, 0.005, margin_pressed)
    r = 2.0 * hamacher(jnp.maximum(opening, 0.0), near)
    return jnp.where(tcp_to_obj <= 0.05, r + 8.0 * pressed, r)


def _r_button_press(state, task, action, ex):
    return _r_button(state, task, action, ex, ex.consts[..., 15])


def _r_coffee_button(state, task, action, ex):
    return _r_button(state, task, action, ex, 0.03)


def _r_door_unlock(state, task, action, ex):
    hand, _, target, lock = _parts(state, task)
    offset, scale = jnp.array([0.0, 0.055, 0.07]), jnp.array([0.25, 1.0, 0.5])
    shoulder = (hand + offset - lock) * scale
    shoulder_init = (ex.consts[..., 6:9] + offset - ex.consts[..., 3:6]) * scale
    ready = tolerance(_norm(shoulder), 0.0, 0.02, _norm(shoulder_init))
    pushed = tolerance(jnp.abs(target[..., 0] - lock[..., 0]), 0.0, 0.005, 0.1)
    return 2.0 * ready + 8.0 * pushed


def _r_door_open(state, task, action, ex):
    hand, _, target, handle = _parts(state, task)
    theta = ex.joint[..., 0]
    door = handle + jnp.array([-0.05, 0.0, 0.0])
    radius = _norm(hand[..., :2] - door[..., :2])
    floor = jnp.where(radius <= 0.12, 0.0, 0.04 * jnp.log(jnp.maximum(radius - 0.12, 1e-30)) + 0.4)
    above = jnp.where(hand[..., 2] >= floor, 1.0, tolerance(floor - hand[..., 2], 0.0, 0.01, floor / 2.0))
    in_place = tolerance(_norm(hand - door - jnp.array([0.05, 0.03, -0.01])), 0.0, 0.06, 0.5)
    ready = hamacher(above, in_place)
    opened = 0.2 * (theta < -math.pi / 90.0) + 0.8 * tolerance(math.pi / 2.0 + math.pi / 6 + theta, 0.0, 0.5, math.pi / 3.0)
    grab = (jnp.clip(action[..., 3], -1.0, 1.0) + 1.0) / 2.0
    r = 2.0 * hamacher(ready, grab) + 8.0 * opened
    return jnp.where(jnp.abs(handle[..., 0] - target[..., 0]) <= 0.08, 10.0, r)


def _r_window_open(state, task, action, ex):
    _, _, target, obj = _parts(state, task)
    to_target = jnp.abs(obj[..., 0] - target[..., 0])
    init = jnp.abs(ex.consts[..., 3] - target[..., 0])
    in_place = tolerance(to_target, 0.0, 0.05, jnp.abs(init - 0.05))
    tcp_init = _norm(ex.consts[..., 15:18] - ex.consts[..., 6:9])
    reach = tolerance(_norm(obj - ex.tcp), 0.0, 0.02, jnp.abs(tcp_init - 0.02))
    return 10.0 * hamacher(reach, in_place)


def _r_faucet_open(state, task, action, ex):
    _, _, target, obj = _parts(state, task)
    obj = obj + jnp.array([-0.04, 0.0, 0.03])
    to_target = _norm(obj - target)
    in_place = tolerance(to_target, 0.0, 0.07, jnp.abs(_norm(ex.consts[..., 3:6] - target) - 0.07))
    tcp_init = _norm(ex.consts[..., 3:6] - ex.consts[..., 6:9])
    reach = tolerance(_norm(obj - ex.tcp), 0.0, 0.01, jnp.abs(tcp_init - 0.01), "gaussian")
    return jnp.where(to_target <= 0.07, 10.0, 2.0 * (2.0 * reach + 3.0 * in_place))


def _r_coffee_push(state, task, action, ex):
    _, opening, target, obj = _parts(state, task)
    scale = jnp.array([2.0, 2.0, 1.0])
    to_target = _norm((obj - target) * scale)
    in_place = tolerance(to_target, 0.0, 0.05, _norm((ex.consts[..., 3:6] - target) * scale))
    grasped = _caging(action, obj, ex, obj_radius=0.02, pad_thresh=0.05, reach_radius=0.04, xz_thresh=0.05,
                      effort=0.7, density="medium")
    r = hamacher(grasped, in_place)
    r = jnp.where((_norm(obj - ex.tcp) < 0.04) & (opening > 0), r + 1.0 + 5.0 * in_place, r)
    return jnp.where(to_target < 0.05, 10.0, r)


def _r_push_wall(state, task, action, ex):
    _, opening, target, obj = _parts(state, task)
    midpoint = jnp.stack([jnp.full_like(obj[..., 0], -0.05), jnp.full_like(obj[..., 0], 0.77), obj[..., 2]], -1)
    scaling = jnp.array([3.0, 1.0, 1.0])
    to_mid = tolerance(_norm((obj - midpoint) * scaling), 0.0, 0.05, _norm((ex.consts[..., 3:6] - midpoint) * scaling))
    to_target = _norm(obj - target)
    in_target = tolerance(to_target, 0.0, 0.05, _norm(ex.consts[..., 3:6] - target))
    grasped = _caging(action, obj, ex, obj_radius=0.015, pad_thresh=0.05, reach_radius=0.01, xz_thresh=0.005)
    r = 2.0 * grasped
    near = (_norm(obj - ex.tcp) < 0.02) & (opening > 0)
    r = jnp.where(near, jnp.where(obj[..., 1] > 0.75, 2.0 * grasped + 5.0 + 3.0 * in_target,
                                  2.0 * grasped + 1.0 + 4.0 * to_mid), r)
    return jnp.where(to_target < 0.05, 10.0, r)


def _r_pick_place_wall(state, task, action, ex):
    _, opening, target, obj = _parts(state, task)
    midpoint = jnp.stack([target[..., 0], jnp.full_like(target[..., 0], 0.77), jnp.full_like(target[..., 0], 0.25)], -1)
    scaling = jnp.array([1.0, 1.0, 3.0])
    to_mid = tolerance(_norm((obj - midpoint) * scaling), 0.0, 0.05, _norm((ex.consts[..., 3:6] - midpoint) * scaling))
    to_target = _norm(obj - target)
    in_target = tolerance(to_target, 0.0, 0.05, _norm(ex.consts[..., 3:6] - target))
    grasped = _caging(action, obj, ex, obj_radius=0.015, pad_thresh=0.05, reach_radius=0.01, xz_thresh=0.005,
                      density="none")
    both = hamacher(grasped, to_mid)
    lifted = (_norm(obj - ex.tcp) < 0.02) & (opening > 0) & (obj[..., 2] - 0.015 > ex.consts[..., 5])
    r = jnp.where(lifted, jnp.where(obj[..., 1] > 0.75, both + 5.0 + 3.0 * in_target, both + 1.0 + 4.0 * to_mid), both)
    return jnp.where(to_target < 0.05, 10.0, r)


def _r_button_press_wall(state, task, action, ex):
    _, opening, target, obj = _parts(state, task)
    tcp_to_obj = _norm(obj - ex.tcp)
    near = tolerance(tcp_to_obj, 0.0, 0.01, _norm(obj - ex.consts[..., 6:9]))
    pressed = tolerance(jnp.abs(target[..., 1] - obj[..., 1]), 0.0, 0.005, ex.consts[..., 15])
    far = 2.0 * hamacher((1.0 - opening) / 2.0, near)
    return jnp.where(tcp_to_obj > 0.07, far, 2.0 + 2.0 * (1.0 + opening) + 4.0 * pressed ** 2)


def _r_door_lock(state, task, action, ex):
    _, opening, target, obj = _parts(state, task)
    scale = jnp.array([0.25, 1.0, 0.5])
    # Meta-World's "tcp" here is the left pad, and its initial left pad is a live view of it
    tcp_to_obj = _norm((obj - ex.lpad) * scale)
    near = tolerance(tcp_to_obj, 0.0, 0.01, tcp_to_obj)
    pressed = tolerance(jnp.abs(target[..., 2] - obj[..., 2]), 0.0, 0.005, 0.1)
    return 2.0 * hamacher(jnp.maximum(opening, 0.0), near) + 8.0 * pressed


def _r_door_close(state, task, action, ex):
    _, _, target, obj = _parts(state, task)
    to_target = _norm(obj - target)
    in_place = tolerance(to_target, 0.0, 0.05, _norm(ex.consts[..., 3:6] - target), "gaussian")
    hand_margin = _norm(jnp.asarray(HAND_INIT[TASK_INDEX["door-close"]]) - obj) + 0.1
    hand_in_place = tolerance(_norm(ex.tcp - target), 0.0, 0.0125, hand_margin, "gaussian")
    return jnp.where(to_target < 0.05, 10.0, 3.0 * hand_in_place + 6.0 * in_place)


def _r_window_close(state, task, action, ex):
    _, _, target, obj = _parts(state, task)
    handle_init = ex.consts[..., 15:18]
    in_place = tolerance(jnp.abs(obj[..., 0] - target[..., 0]), 0.0, 0.05,
                         jnp.abs(jnp.abs(handle_init[..., 0] - target[..., 0]) - 0.05))
    reach = tolerance(_norm(obj - ex.tcp), 0.0, 0.02, jnp.abs(_norm(handle_init - ex.consts[..., 6:9]) - 0.02), "gaussian")
    return 10.0 * hamacher(reach, in_place)


def _r_faucet_close(state, task, action, ex):
    _, _, target, obj = _parts(state, task)
    to_target = _norm(obj - target)
    in_place = tolerance(to_target, 0.0, 0.07, jnp.abs(_norm(ex.consts[..., 3:6] - target) - 0.07))
    reach = tolerance(_norm(obj - ex.tcp), 0.0, 0.01, jnp.abs(_norm(ex.consts[..., 3:6] - ex.consts[..., 6:9]) - 0.01),
                      "gaussian")
    return jnp.where(to_target <= 0.07, 10.0, 2.0 * (2.0 * reach + 3.0 * in_place))


def _r_hammer(state, task, action, ex):
    hand, _, target, hammer = _parts(state, task)
    quat = slot_of(state, "hammer")[..., 3:7]
    reward_quat = jnp.maximum(1.0 - _norm(quat - jnp.array([1.0, 0.0, 0.0, 0.0])) / 0.4, 0.0)
    near = jnp.abs(hammer[..., 0] - hand[..., 0]) < 0.07  # half the handle's length
    threshed = hammer.at[..., 0].set(jnp.where(near, hand[..., 0], hammer[..., 0]))
    grab = _caging(action, threshed, ex, obj_radius=0.015, pad_thresh=0.02, reach_radius=0.01, xz_thresh=0.01)
    head = hammer + jnp.array([0.16, 0.06, 0.0])
    in_place = 0.1 * (head[..., 2] > 0.02) + 0.9 * tolerance(_norm(target - head), 0.0, 0.02, 0.2)
    r = (2.0 * grab + 6.0 * in_place) * reward_quat
    return jnp.where((ex.joint[..., 0] > HAMMER_SUCCESS_DEPTH) & (r > 5.0), 10.0, r)


def _r_soccer(state, task, action, ex):
    _, _, target, obj = _parts(state, task)
    scale = jnp.array([3.0, 1.0, 1.0])
    to_target = _norm((obj - target) * scale)
    in_place = tolerance(to_target, 0.0, 0.07, _norm((obj - ex.consts[..., 3:6]) * scale))
    goal_line = target[..., 1] - 0.1
    off = (obj[..., 1] > goal_line) & (jnp.abs(obj[..., 0] - target[..., 0]) > 0.10)
    in_place = jnp.where(off, jnp.clip(in_place - 2.0 * ((obj[..., 1] - goal_line) / (1.0 - goal_line)), 0.0, 1.0), in_place)
    # soccer's own caging; its "initial" pads are live views of the current pads (as in pick-place)
    radius, obj_init, init_tcp = 0.013, ex.consts[..., 3:6], ex.consts[..., 6:9]
    d_left, d_right = ex.lpad[..., 1] - obj[..., 1], obj[..., 1] - ex.rpad[..., 1]
    m_right = jnp.abs(jnp.abs(obj[..., 1] - ex.rpad[..., 1]) - 0.05)
    m_left = jnp.abs(jnp.abs(obj[..., 1] - ex.lpad[..., 1]) - 0.05)
    y_caging = hamacher(tolerance(d_right, radius, 0.05, m_right), tolerance(d_left, radius, 0.05, m_left))
    y_gripping = hamacher(tolerance(d_right, radius, radius + 0.01, m_right), tolerance(d_left, radius, radius + 0.01, m_left))
    xz = tolerance(_norm(_xz(ex.tcp) - _xz(obj)), 0.0, 0.005, _norm(_xz(obj_init) - _xz(init_tcp)) - 0.005)
    caging = hamacher(y_caging, xz)
    grasped = (caging + jnp.where(caging > 0.95, y_gripping, 0.0)) / 2
    return jnp.where(to_target < 0.07, 10.0, 3.0 * grasped + 6.5 * in_place)


def _make_coffee_stages(state: jax.Array, task: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(mug under the nozzle within 0.07, coffee button pressed within 0.02) of make-coffee states."""
    target = state[..., 4:7]
    mug = slot_of(state, "coffee")[..., 0:3]
    button = slot_of(state, "coffee_button")[..., 0:3]
    button_target = target + jnp.asarray(COFFEE_BUTTON_OFFSET, state.dtype)
    return (_norm(mug - target) <= MAKE_COFFEE_MUG_RADIUS,
            jnp.abs(button[..., 1] - button_target[..., 1]) <= MAKE_COFFEE_BUTTON_RADIUS)


def _r_make_coffee(state, task, action, ex):
    """Ours: the mean of coffee-push's dense reward and, once the mug is in place, coffee-button's (both with
    the stage's own target), so it rises through the stages and is 10 only when both hold."""
    target = state[..., 4:7]
    mug_stage = _r_coffee_push(state, task, action, ex)
    button_target = target + jnp.asarray(COFFEE_BUTTON_OFFSET, state.dtype)
    button_state = state.at[..., 4:7].set(button_target)
    button_vec = slot_of(state, "coffee_button")
    button_state = button_state.at[..., SLOT_START:SLOT_START + SLOT_DIM].set(button_vec)  # read as main object
    button_stage = _r_button(button_state, jnp.full_like(task, TASK_INDEX["push"]), action, ex, 0.03)
    placed, _ = _make_coffee_stages(state, task)
    return 0.5 * mug_stage + 0.5 * jnp.where(placed, button_stage, 0.0)


def _locked_door_unlocked(state: jax.Array, ex: Extras | None) -> jax.Array:
    """Whether the lock has been opened: the lock within 0.02 of door-unlock's target (in x), or the door
    already swung (hinge below -0.02 rad from ``extras``; on bare vectors: the handle moved > 0.02 in x)."""
    target = state[..., 4:7]
    lock = slot_of(state, "lock")[..., 0:3]
    unlock_x = target[..., 0] + LOCKED_DOOR_LOCK_FROM_TARGET + LOCKED_DOOR_UNLOCK_OFFSET[0]
    at_target = jnp.abs(lock[..., 0] - unlock_x) <= 0.02
    if ex is not None:
        return at_target | (ex.joint[..., 0] < -0.02)
    handle = slot_of(state, "handle")[..., 0:3]
    return at_target | (jnp.abs(handle[..., 0] - (target[..., 0] + LOCKED_DOOR_HANDLE_CLOSED_DX)) > 0.02)


def _r_locked_door_open(state, task, action, ex):
    """Ours: the mean of door-unlock's dense reward (10 once unlocked) and, once unlocked, door-open's."""
    lock_init = ex.consts[..., 15:18]
    unlock_state = state.at[..., 4:7].set(lock_init + jnp.asarray(LOCKED_DOOR_UNLOCK_OFFSET, state.dtype))
    unlock_ex = ex.replace(consts=ex.consts.at[..., 3:6].set(lock_init))
    unlock = _r_door_unlock(unlock_state, jnp.full_like(task, TASK_INDEX["door-unlock"]), action, unlock_ex)
    opened = _r_door_open(state, jnp.full_like(task, TASK_INDEX["door-open"]), action, ex)
    unlocked = _locked_door_unlocked(state, ex)
    return 0.5 * jnp.where(unlocked, 10.0, unlock) + 0.5 * jnp.where(unlocked, opened, 0.0)


_REWARDS = {"reach": _r_reach, "push": _r_push, "pick-place": _r_pick_place, "button-press": _r_button_press,
            "door-unlock": _r_door_unlock, "door-open": _r_door_open, "window-open": _r_window_open,
            "faucet-open": _r_faucet_open, "coffee-push": _r_coffee_push, "coffee-button": _r_coffee_button,
            "reach-wall": _r_reach, "push-wall": _r_push_wall, "pick-place-wall": _r_pick_place_wall,
            "button-press-wall": _r_button_press_wall, "door-lock": _r_door_lock, "door-close": _r_door_close,
            "window-close": _r_window_close, "faucet-close": _r_faucet_close,
            "make-coffee": _r_make_coffee, "hammer": _r_hammer, "soccer": _r_soccer,
            "locked-door-open": _r_locked_door_open}


def success_from(state: jax.Array, task: jax.Array, extras: Extras | None = None) -> jax.Array:
    """Meta-World's success predicate of each task on 91-d states: (..., 91), (...) → (...) bool.

    reach, reach-wall: |tcp - target| <= 0.05 (tcp from ``extras``, else hand + :data:`TCP_OFFSET`); push:
    |obj - target| <= 0.05; pick-place, coffee-push, push-wall, pick-place-wall, faucet-close: <= 0.07;
    door-close: <= 0.08; button-press and coffee-button: |Δy| <= 0.02, button-press-wall: <= 0.03;
    door-unlock: |Δx| <= 0.02; door-lock: |Δz| <= 0.02; door-open: |Δx| <= 0.08; window-open/close:
    |Δx| <= 0.05; faucet-open: |obj + (-0.04, 0, 0.03) - target| <= 0.07; soccer: |ball - target| <= 0.07;
    hammer: the nail driven in more than 0.09 (its slide joint from ``extras``, else the nail slot's y minus
    :data:`NAIL_REST_Y`); make-coffee (ours): the mug within 0.07 of the spot under the nozzle (the target
    location) and the coffee button pressed to within 0.02 of its stop, both at once; locked-door-open (ours):
    the door open as in door-open (|Δx| <= 0.08 of the handle), which the latch allows only after the lock
    was turned to within 0.02 of door-unlock's target.
    """
    chex.assert_axis_dimension(state, -1, STATE_DIM)
    task = jnp.asarray(task)
    hand, _, target, obj = _parts(state, task)
    tcp = extras.tcp if extras is not None else hand + jnp.asarray(TCP_OFFSET, state.dtype)
    d3 = _norm(obj - target)
    dx = jnp.abs(obj[..., 0] - target[..., 0])
    dy = jnp.abs(obj[..., 1] - target[..., 1])
    faucet = _norm(obj + jnp.array([-0.04, 0.0, 0.03]) - target)
    table = {
        "reach": _norm(tcp - target) <= 0.05, "push": d3 <= 0.05, "pick-place": d3 <= 0.07,
        "button-press": dy <= 0.02, "door-unlock": dx <= 0.02, "door-open": dx <= 0.08, "window-open": dx <= 0.05,
        "faucet-open": faucet <= 0.07, "coffee-push": d3 <= 0.07, "coffee-button": dy <= 0.02,
        "reach-wall": _norm(tcp - target) <= 0.05, "push-wall": d3 <= 0.07, "pick-place-wall": d3 <= 0.07,
        "button-press-wall": dy <= 0.03, "door-lock": jnp.abs(obj[..., 2] - target[..., 2]) <= 0.02,
        "door-close": d3 <= 0.08, "window-close": dx <= 0.05, "faucet-close": d3 <= 0.07,
        "soccer": d3 <= 0.07, "locked-door-open": dx <= 0.08,
    }
    placed, pressed = _make_coffee_stages(state, task)
    table["make-coffee"] = placed & pressed
    if extras is not None:
        table["hammer"] = extras.joint[..., 0] > HAMMER_SUCCESS_DEPTH
    else:
        table["hammer"] = slot_of(state, "nail")[..., 1] - NAIL_REST_Y > HAMMER_SUCCESS_DEPTH
    out = jnp.zeros(state.shape[:-1], bool)
    for name, value in table.items():
        out = jnp.where(task == TASK_INDEX[name], value, out)
    return out


def dense_reward(state: jax.Array, task: jax.Array, action: jax.Array, extras: Extras) -> jax.Array:
    """Meta-World's dense reward (in [0, 10]) of each task: state (..., 91), task (...), action (..., 4),
    extras (..., ·) → (...) float32. It scores the state reached by ``action`` (Meta-World evaluates the
    reward after the step with the action just taken)."""
    chex.assert_axis_dimension(state, -1, STATE_DIM)
    task = jnp.asarray(task)
    out = jnp.zeros(state.shape[:-1], jnp.float32)
    for name, fn in _REWARDS.items():
        out = jnp.where(task == TASK_INDEX[name], fn(state, task, action, extras), out)
    return out.astype(jnp.float32)


def extras_from_state(state: jax.Array, first_state: jax.Array) -> Extras:
    """Approximate :class:`Extras` from 91-d states alone (for imagined data): tcp = hand +
    :data:`TCP_OFFSET`, pads at ±(0.002 + 0.045·opening) in y around the hand, joint 0, constants from the
    episode's first state (target, the first filled slot's position, the first tcp and pads)."""
    def pads(s):
        hand = s[..., 0:3]
        half = 0.002 + 0.045 * s[..., 3:4]  # measured: ±0.047 in y around the hand when fully open
        off = jnp.concatenate([jnp.zeros_like(half), half, jnp.zeros_like(half)], -1)
        return hand + jnp.asarray(TCP_OFFSET, s.dtype), hand + off, hand - off
    tcp, lpad, rpad = pads(state)
    tcp0, lpad0, rpad0 = pads(first_state)
    # the first state's filled slot (any): the main object's initial position is its first filled slot
    slots = first_state[..., SLOT_START:].reshape(first_state.shape[:-1] + (NUM_SLOTS, SLOT_DIM))
    filled = jnp.any(slots != 0, axis=-1)
    first = jnp.argmax(filled, axis=-1)
    obj0 = jnp.take_along_axis(slots[..., :3], first[..., None, None], axis=-2)[..., 0, :]
    consts = jnp.concatenate([first_state[..., 4:7], obj0, tcp0, lpad0, rpad0, obj0], -1)
    return Extras(tcp=tcp, lpad=lpad, rpad=rpad, joint=jnp.zeros(state.shape[:-1] + (1,), state.dtype), consts=consts)


SUCCESS_REWARD: Final[float] = 10.0


def step_reward(prev_dense: jax.Array, next_dense: jax.Array, succeeded: jax.Array) -> jax.Array:
    """The benchmark's per-step reward: 10 on the step that succeeds, otherwise the change of the dense
    reward ``next_dense - prev_dense`` (BENCHMARK §2.2)."""
    return jnp.where(succeeded, SUCCESS_REWARD, next_dense - prev_dense).astype(jnp.float32)


def success(state: jax.Array, goal: jax.Array) -> jax.Array:
    """Public predicate on 91-d states: state (..., 91), goal (..., GOAL_DIM) int32 → (...) bool."""
    return success_from(state, goal[..., 0])


def reward(prev_state: jax.Array, action: jax.Array, next_state: jax.Array, goal: jax.Array,
           first_state: jax.Array | None = None) -> jax.Array:
    """Public reward on 91-d states (for generated data): :func:`step_reward` of the dense rewards with
    :func:`extras_from_state` (``first_state`` defaults to ``prev_state``). In the simulator the exact
    extras are used instead (see the env)."""
    first = prev_state if first_state is None else first_state
    task = goal[..., 0]
    dense_prev = dense_reward(prev_state, task, action, extras_from_state(prev_state, first))
    dense_next = dense_reward(next_state, task, action, extras_from_state(next_state, first))
    return step_reward(dense_prev, dense_next, success(next_state, goal))


def legal(state: jax.Array) -> jax.Array:
    """Plausibility of 91-d states: finite, hand and filled slots inside a generous workspace, gripper
    opening in [0, 1], filled quaternions of unit norm (±0.05). (..., 91) → (...) bool."""
    finite = jnp.all(jnp.isfinite(state), axis=-1)
    low, high = jnp.asarray(WORKSPACE_LOW, state.dtype), jnp.asarray(WORKSPACE_HIGH, state.dtype)
    hand_ok = jnp.all((state[..., 0:3] >= low) & (state[..., 0:3] <= high), axis=-1)
    grip_ok = (state[..., 3] >= 0.0) & (state[..., 3] <= 1.0)
    slots = state[..., SLOT_START:].reshape(state.shape[:-1] + (NUM_SLOTS, SLOT_DIM))
    filled = jnp.any(slots != 0, axis=-1)
    pos_ok = jnp.all((slots[..., :3] >= low) & (slots[..., :3] <= high), axis=-1)
    quat_norm = jnp.linalg.norm(slots[..., 3:], axis=-1)
    quat_ok = (jnp.abs(quat_norm - 1.0) <= 0.05) | (quat_norm == 0.0)
    return finite & hand_ok & grip_ok & jnp.all(~filled | (pos_ok & quat_ok), axis=-1)
