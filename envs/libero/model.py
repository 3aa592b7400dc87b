"""The LIBERO-style tabletop scene: our own MJCF of a Franka Panda on a floor with a soup can, a cream-cheese
box, a salad-dressing bottle and a basket, and the arm's kinematics and delta-pose controller in JAX.

The arm is built from Franka's published kinematics and link masses with primitive collision geoms only
(every pair MJX implements; no asset files) and gravity compensation; position servos on the seven
joints and the two fingers (70 N); ``TIMESTEP`` 2.5 ms, implicit-fast, pyramidal cones (``impratio`` 10),
``FRAME_SKIP`` 20 steps per action (20 Hz). Why not robosuite's meshes, the object sizes and the measured
effect of these choices: docs/envs.md, "LIBERO".

Layout of the compiled model (checked by :func:`check_layout`): qpos (37) = 7 arm joints, 2 finger
slides, then the free joints of can, cream cheese, bottle, basket (pos 3 + quat 4 each); qvel (33); ctrl (9)
= 7 joint targets + 2 finger targets.
"""

from __future__ import annotations

import functools
import math
from typing import Final

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

__all__ = [
    "ACTION_DIM", "CTRL_DIM", "DT", "FRAME_SKIP", "GRIPPER_OPEN", "HOME_QPOS", "JOINT_HIGH", "JOINT_LOW", "NQ",
    "NV", "OBJECTS", "OBJECT_HALF", "ROT_SCALE", "POS_SCALE", "TCP_OFFSET", "TIMESTEP", "check_layout",
    "delta_pose_control", "fk", "jacobian", "load_model", "quat_conj", "quat_mul", "quat_rotate",
    "quat_to_axis_angle", "quat_from_axis_angle", "scene_xml", "yaw_of",
]

TIMESTEP: Final[float] = 0.0025
FRAME_SKIP: Final[int] = 20
DT: Final[float] = TIMESTEP * FRAME_SKIP  # 0.05 s: 20 Hz
ACTION_DIM: Final[int] = 7
CTRL_DIM: Final[int] = 9
NQ: Final[int] = 7 + 2 + 4 * 7
NV: Final[int] = 7 + 2 + 4 * 6
POS_SCALE: Final[float] = 0.05   # m per unit action per step
ROT_SCALE: Final[float] = 0.3    # rad per unit action per step
DAMPING: Final[float] = 0.05     # damped least squares λ
NULL_GAIN: Final[float] = 0.05   # null-space pull towards HOME_QPOS per step
TARGET_LEASH: Final[float] = 0.4  # |joint target - joint| bound (rad); above one step's largest Δq
GRIPPER_OPEN: Final[float] = 0.04  # finger slide at full opening (m); the opening is twice this

# Panda kinematics (body frames of each link relative to its parent; joint axis = local z).
_S = math.sqrt(0.5)
LINK_POS: Final[np.ndarray] = np.array([
    [0.0, 0.0, 0.333], [0.0, 0.0, 0.0], [0.0, -0.316, 0.0], [0.0825, 0.0, 0.0], [-0.0825, 0.384, 0.0],
    [0.0, 0.0, 0.0], [0.088, 0.0, 0.0]])
LINK_QUAT: Final[np.ndarray] = np.array([
    [1.0, 0.0, 0.0, 0.0], [_S, -_S, 0.0, 0.0], [_S, _S, 0.0, 0.0], [_S, _S, 0.0, 0.0], [_S, -_S, 0.0, 0.0],
    [_S, _S, 0.0, 0.0], [_S, _S, 0.0, 0.0]])
HAND_POS: Final[np.ndarray] = np.array([0.0, 0.0, 0.107])
HAND_QUAT: Final[np.ndarray] = np.array([math.cos(-math.pi / 8), 0.0, 0.0, math.sin(-math.pi / 8)])
TCP_OFFSET: Final[float] = 0.1034  # fingertip centre along the hand's z axis
FINGER_BASE: Final[float] = 0.0584
JOINT_LOW: Final[np.ndarray] = np.array([-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973])
JOINT_HIGH: Final[np.ndarray] = np.array([2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973])
HOME_QPOS: Final[np.ndarray] = np.array([0.0, -0.3, 0.0, -2.3, 0.0, 2.0, math.pi / 4])
LINK_MASS: Final[tuple[float, ...]] = (4.970684, 0.646926, 3.228604, 3.587895, 1.225946, 1.666555, 0.735522)
HAND_MASS: Final[float] = 0.73
# The published finger mass is 0.015 kg; 0.1 kg (finger plus reflected drive inertia) keeps the pads from
# sinking into a grasped box at this time step (measured: 2.7 mm instead of 12 mm of penetration).
FINGER_MASS: Final[float] = 0.1
KP: Final[tuple[float, ...]] = (20000.0, 20000.0, 15000.0, 15000.0, 8000.0, 6000.0, 3000.0)
# Critical damping at the home posture: kv = 2·sqrt(kp · M_ii(HOME_QPOS)) (joint-space inertia incl. armature).
KV: Final[tuple[float, ...]] = (273.0, 369.0, 265.0, 248.0, 61.0, 57.0, 35.0)
FINGER_KP: Final[float] = 3000.0
FINGER_FORCE: Final[float] = 70.0  # N per finger: the Panda gripper's continuous force

OBJECTS: Final[tuple[str, ...]] = ("soup_can", "cream_cheese", "salad_dressing", "basket")
# Collision half-sizes (x, y, z) of the three graspable objects (body origin at the centre).
OBJECT_HALF: Final[np.ndarray] = np.array([[0.033, 0.033, 0.05], [0.055, 0.028, 0.018], [0.028, 0.028, 0.08]])
OBJECT_MASS: Final[tuple[float, ...]] = (0.35, 0.227, 0.40)
# Body origin above the geometric centre: the bottle's frame sits at its shoulder (0.04 above its centre),
# where it is held, so that its position is the point a grasp holds (BENCHMARK's |obj - eef| < 0.05).
ORIGIN_DZ: Final[np.ndarray] = np.array([0.0, 0.0, 0.04])
REST_Z: Final[np.ndarray] = OBJECT_HALF[:, 2] + ORIGIN_DZ   # origin height when resting upright on the floor
TOP_DZ: Final[np.ndarray] = OBJECT_HALF[:, 2] - ORIGIN_DZ   # top of the object above its origin
# Palm clearance: the palm's underside is 0.047 above the fingertip centre, so an object is grasped with the
# tcp at max(origin, top - 0.042): GRASP_DZ = tcp height above the object's origin at the grasp.
GRASP_DZ: Final[np.ndarray] = np.maximum(0.0, TOP_DZ - 0.042)
BASKET_HALF: Final[tuple[float, float]] = (0.155, 0.115)  # outer half extents (x, y)
BASKET_WALL: Final[float] = 0.005  # half thickness
BASKET_HEIGHT: Final[float] = 0.085
BASKET_MASS: Final[float] = 0.8
for _a in (LINK_POS, LINK_QUAT, HAND_POS, HAND_QUAT, JOINT_LOW, JOINT_HIGH, HOME_QPOS, OBJECT_HALF, GRASP_DZ, ORIGIN_DZ,
           REST_Z, TOP_DZ):
    _a.setflags(write=False)


def _fmt(v) -> str:
    return " ".join(f"{float(x):.9g}" for x in np.ravel(v))


def _link_geoms(i: int) -> str:
    """Primitive geoms of link ``i`` (1-based): capsules; links 1-4 are visual only (they cannot reach the
    objects or the floor from the workspace), links 5-7 collide."""
    m = LINK_MASS[i - 1]
    seg = {1: ("0 0 -0.19", "0 0 0", 0.06), 2: ("0 0 0", "0 -0.3 0", 0.06), 3: ("0 0 -0.15", "0 0 0", 0.055),
           4: ("0 0 0", "-0.0825 0.3 0", 0.055), 5: ("0 0 -0.26", "0 0 -0.02", 0.05),
           6: ("0 0 -0.03", "0.088 0 0", 0.045), 7: ("0 0 -0.02", "0 0 0.08", 0.04)}[i]
    collide = i >= 5
    flags = 'contype="2" conaffinity="1"' if collide else 'contype="0" conaffinity="0"'
    return f'<geom type="capsule" fromto="{seg[0]} {seg[1]}" size="{seg[2]}" mass="{m}" {flags} rgba=".9 .9 .92 1"/>'


def _object_body(k: int, name: str) -> str:
    hx, hy, hz = OBJECT_HALF[k]
    dz = -ORIGIN_DZ[k]
    rgba = ("0.8 0.2 0.15 1", "0.95 0.95 0.85 1", "0.9 0.75 0.3 1")[k]
    visual = ""
    if name in ("soup_can", "salad_dressing"):
        visual = (f'<geom type="cylinder" pos="0 0 {dz:.4f}" size="{hx:.4f} {hz:.4f}" contype="0" conaffinity="0" '
                  f'group="1" mass="0" rgba="{rgba}"/>')
    return (f'<body name="{name}" pos="0 0 {REST_Z[k]:.4f}"><freejoint name="{name}_joint"/>'
            f'<geom name="{name}_geom" type="box" pos="0 0 {dz:.4f}" size="{_fmt((hx, hy, hz))}" '
            f'mass="{OBJECT_MASS[k]}" friction="1 0.01 0.001" group="{3 if visual else 0}" rgba="{rgba}"/>'
            f'{visual}</body>')


def _basket_body() -> str:
    hx, hy = BASKET_HALF
    w, h = BASKET_WALL, BASKET_HEIGHT / 2
    parts = [("bottom", (0, 0, w), (hx, hy, w)), ("wall_front", (hx - w, 0, h), (w, hy, h)),
             ("wall_back", (-hx + w, 0, h), (w, hy, h)), ("wall_left", (0, hy - w, h), (hx, w, h)),
             ("wall_right", (0, -hy + w, h), (hx, w, h))]
    vols = [8 * s[0] * s[1] * s[2] for _, _, s in parts]
    geoms = "".join(
        f'<geom name="basket_{n}" type="box" pos="{_fmt(p)}" size="{_fmt(s)}" mass="{BASKET_MASS * v / sum(vols):.6f}" '
        f'rgba="0.55 0.4 0.25 1"/>' for (n, p, s), v in zip(parts, vols))
    return f'<body name="basket" pos="0 0 0"><freejoint name="basket_joint"/>{geoms}</body>'


def scene_xml() -> str:
    """The MJCF text of the scene (deterministic)."""
    bodies = []
    for i in range(7):
        kp = KP[i]
        bodies.append((i, f'<body name="link{i + 1}" pos="{_fmt(LINK_POS[i])}" quat="{_fmt(LINK_QUAT[i])}" gravcomp="1">'
                          f'<joint name="joint{i + 1}" axis="0 0 1" range="{JOINT_LOW[i]} {JOINT_HIGH[i]}" '
                          f'armature="0.1" damping="1"/>{_link_geoms(i + 1)}', kp))
    fingers = ""
    for side, sign in (("left", 1.0), ("right", -1.0)):
        fingers += (f'<body name="{side}_finger" pos="0 0 {FINGER_BASE}" gravcomp="1">'
                    f'<joint name="{side}_finger_joint" type="slide" axis="0 {sign:g} 0" range="0 {GRIPPER_OPEN}" '
                    f'armature="0.01" damping="5"/>'
                    f'<geom name="{side}_pad" type="box" pos="0 {sign * 0.006:g} 0.032" size="0.011 0.006 0.022" '
                    f'mass="{FINGER_MASS}" friction="2 0.02 0.001" condim="4" contype="2" conaffinity="1" '
                    f'rgba=".2 .2 .2 1"/></body>')
    hand = (f'<body name="hand" pos="{_fmt(HAND_POS)}" quat="{_fmt(HAND_QUAT)}" gravcomp="1">'
            f'<geom name="palm" type="box" pos="0 0 0.03" size="0.03 0.095 0.026" mass="{HAND_MASS}" contype="2" '
            f'conaffinity="1" rgba=".95 .95 .95 1"/>'
            f'<site name="tcp" pos="0 0 {TCP_OFFSET}" size="0.005" rgba="1 0 0 1"/>{fingers}</body>')
    chain = hand
    for i, text, _ in reversed(bodies):
        chain = text + chain + "</body>"
    actuators = "".join(
        f'<position name="act{i + 1}" joint="joint{i + 1}" kp="{KP[i]}" kv="{KV[i]}" '
        f'ctrlrange="{JOINT_LOW[i]} {JOINT_HIGH[i]}"/>' for i in range(7))
    actuators += "".join(
        f'<position name="{s}_finger_act" joint="{s}_finger_joint" kp="{FINGER_KP}" dampratio="1" '
        f'ctrlrange="0 {GRIPPER_OPEN}" forcerange="-{FINGER_FORCE} {FINGER_FORCE}"/>' for s in ("left", "right"))
    objects = "".join(_object_body(k, n) for k, n in enumerate(OBJECTS[:3])) + _basket_body()
    return f"""<mujoco model="imaginejax_libero_tabletop">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="{TIMESTEP}" integrator="implicitfast" cone="pyramidal" impratio="10"/>
  <default><geom solref="0.01 1" solimp="0.95 0.99 0.001"/></default>
  <worldbody>
    <light pos="0 0 2" dir="0 0 -1"/>
    <geom name="floor" type="plane" size="2 2 0.05" rgba=".6 .6 .55 1"/>
    <body name="link0" pos="0 0 0"><geom type="cylinder" size="0.06 0.07" pos="0 0 0.07" contype="0" conaffinity="0"
      rgba=".9 .9 .92 1"/>{chain}</body>
    {objects}
  </worldbody>
  <actuator>{actuators}</actuator>
</mujoco>"""


@functools.lru_cache(maxsize=1)
def _compiled_xml() -> str:
    return scene_xml()


def load_model() -> mujoco.MjModel:
    """A freshly compiled ``MjModel`` of the scene (each call returns a new object); layout checked."""
    model = mujoco.MjModel.from_xml_string(_compiled_xml())
    check_layout(model)
    return model


def check_layout(model: mujoco.MjModel) -> None:
    """Raises ValueError naming the first fact of ``model`` that differs from this module's constants."""
    checks = {"nq": (model.nq, NQ), "nv": (model.nv, NV), "nu": (model.nu, CTRL_DIM),
              "timestep": (float(model.opt.timestep), TIMESTEP)}
    for field, (got, want) in checks.items():
        if got != want:
            raise ValueError(f"LIBERO scene: {field} is {got}, expected {want}")


# ------------------------------------------------------------------------------------------ quaternions
def quat_mul(a: jax.Array, b: jax.Array) -> jax.Array:
    """Hamilton product of (..., 4) quaternions in MuJoCo's (w, x, y, z) order."""
    aw, ax, ay, az = jnp.moveaxis(a, -1, 0)
    bw, bx, by, bz = jnp.moveaxis(b, -1, 0)
    return jnp.stack([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                      aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw], -1)


def quat_conj(q: jax.Array) -> jax.Array:
    """Conjugate (inverse of a unit quaternion): (..., 4)."""
    return q * jnp.asarray([1.0, -1.0, -1.0, -1.0], q.dtype)


def quat_rotate(q: jax.Array, v: jax.Array) -> jax.Array:
    """Rotates vectors (..., 3) by unit quaternions (..., 4)."""
    w, u = q[..., :1], q[..., 1:]
    t = 2.0 * jnp.cross(u, v)
    return v + w * t + jnp.cross(u, t)


def quat_from_axis_angle(rotvec: jax.Array) -> jax.Array:
    """Rotation vectors (..., 3) (axis · angle) → unit quaternions (..., 4)."""
    angle = jnp.linalg.norm(rotvec, axis=-1, keepdims=True)
    half = 0.5 * angle
    scale = jnp.where(angle > 1e-8, jnp.sin(half) / jnp.maximum(angle, 1e-8), 0.5)
    return jnp.concatenate([jnp.cos(half), rotvec * scale], -1)


def quat_to_axis_angle(q: jax.Array) -> jax.Array:
    """Unit quaternions (..., 4) → rotation vectors (..., 3) with angle in [0, π] (shortest rotation)."""
    q = q * jnp.where(q[..., :1] < 0, -1.0, 1.0)
    s = jnp.linalg.norm(q[..., 1:], axis=-1, keepdims=True)
    angle = 2.0 * jnp.arctan2(s, q[..., :1])
    scale = jnp.where(s > 1e-8, angle / jnp.maximum(s, 1e-8), 2.0)
    return q[..., 1:] * scale


def yaw_of(q: jax.Array) -> jax.Array:
    """Heading (rotation about world z of the body's x axis) of quaternions (..., 4) → (...)."""
    x_axis = quat_rotate(q, jnp.broadcast_to(jnp.asarray([1.0, 0.0, 0.0], q.dtype), q.shape[:-1] + (3,)))
    return jnp.arctan2(x_axis[..., 1], x_axis[..., 0])


def _quat_z(angle: jax.Array) -> jax.Array:
    half = 0.5 * angle
    zero = jnp.zeros_like(half)
    return jnp.stack([jnp.cos(half), zero, zero, jnp.sin(half)], -1)


# ------------------------------------------------------------------------------------------ kinematics
def fk(q: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Forward kinematics of the arm (base at the world origin).

    Args:
      q: (..., 7) joint angles.
    Returns:
      tcp position (..., 3), tcp quaternion (..., 4) (the hand's frame: z = approach, y = finger axis),
      joint origins (..., 7, 3) and joint axes (..., 7, 3) in the world frame.
    """
    q = jnp.asarray(q)
    dtype = q.dtype
    pos = jnp.zeros(q.shape[:-1] + (3,), dtype)
    quat = jnp.broadcast_to(jnp.asarray([1.0, 0.0, 0.0, 0.0], dtype), q.shape[:-1] + (4,))
    origins, axes = [], []
    for i in range(7):
        pos = pos + quat_rotate(quat, jnp.broadcast_to(jnp.asarray(LINK_POS[i], dtype), pos.shape))
        quat = quat_mul(quat, jnp.broadcast_to(jnp.asarray(LINK_QUAT[i], dtype), quat.shape))
        origins.append(pos)
        axes.append(quat_rotate(quat, jnp.broadcast_to(jnp.asarray([0.0, 0.0, 1.0], dtype), pos.shape)))
        quat = quat_mul(quat, _quat_z(q[..., i]))
    pos = pos + quat_rotate(quat, jnp.broadcast_to(jnp.asarray(HAND_POS, dtype), pos.shape))
    quat = quat_mul(quat, jnp.broadcast_to(jnp.asarray(HAND_QUAT, dtype), quat.shape))
    tcp = pos + quat_rotate(quat, jnp.broadcast_to(jnp.asarray([0.0, 0.0, TCP_OFFSET], dtype), pos.shape))
    return tcp, quat, jnp.stack(origins, -2), jnp.stack(axes, -2)


def jacobian(q: jax.Array) -> jax.Array:
    """Geometric Jacobian of the tcp: (..., 7) → (..., 6, 7), rows = (linear velocity, angular velocity)."""
    tcp, _, origins, axes = fk(q)
    lin = jnp.cross(axes, tcp[..., None, :] - origins)  # (..., 7, 3)
    return jnp.concatenate([jnp.swapaxes(lin, -1, -2), jnp.swapaxes(axes, -1, -2)], -2)


def delta_pose_control(q: jax.Array, target: jax.Array, action: jax.Array) -> jax.Array:
    """The delta end-effector pose controller: servo targets of one step.

    Args:
      q: (..., 7) measured joint angles.
      target: (..., 7) current joint servo targets (the previous step's output, or ``q`` after a reset).
      action: (..., 7) in [-1, 1] (clipped): tcp displacement ``POS_SCALE·a[0:3]`` (world frame), rotation
        ``ROT_SCALE·a[3:6]`` (axis-angle, world frame), gripper ``a[6]`` (-1 open … +1 closed).
    Returns:
      (..., 9) control vector: joint targets (7) = clip(target + Δq, q ± TARGET_LEASH, joint limits) with
      Δq = Jᵀ(JJᵀ + λ²I)⁻¹·[Δp; Δθ] + (I - J⁺J)·NULL_GAIN·(HOME - q), then both finger targets
      ``GRIPPER_OPEN·(1 - a[6]) / 2``.
    """
    action = jnp.clip(action, -1.0, 1.0)
    jac = jacobian(q)  # (..., 6, 7)
    twist = jnp.concatenate([POS_SCALE * action[..., 0:3], ROT_SCALE * action[..., 3:6]], -1)
    jjt = jac @ jnp.swapaxes(jac, -1, -2) + (DAMPING ** 2) * jnp.eye(6, dtype=q.dtype)
    pinv = jnp.swapaxes(jac, -1, -2) @ jnp.linalg.inv(jjt)  # (..., 7, 6)
    dq = (pinv @ twist[..., None])[..., 0]
    null = jnp.eye(7, dtype=q.dtype) - pinv @ jac
    dq = dq + (null @ (NULL_GAIN * (jnp.asarray(HOME_QPOS, q.dtype) - q))[..., None])[..., 0]
    joint = jnp.clip(target + dq, q - TARGET_LEASH, q + TARGET_LEASH)
    joint = jnp.clip(joint, jnp.asarray(JOINT_LOW, q.dtype), jnp.asarray(JOINT_HIGH, q.dtype))
    finger = GRIPPER_OPEN * 0.5 * (1.0 - action[..., 6:7])
    return jnp.concatenate([joint, finger, finger], -1)
