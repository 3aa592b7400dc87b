"""Meta-World scenes: the Sawyer MJCF files of the installed ``metaworld`` package, compiled per task (the
benchmark's own models; nothing is copied), with two edits through ``mujoco.MjSpec``: the fixtures
Meta-World moves at reset become mocap bodies (their pose per-row control, so one model serves a batch;
dynamics unchanged), and sensors for every observable. Why: docs/envs.md, "Meta-World".

Sensor layout (:data:`SENSOR_DIM` = 39 values per row, the same for every task; unused entries read the
hand's frame)::

    0:3 hand (body "hand" frame)      3:6 right claw     6:9 left claw          (bodies' frames)
    9:12 right end-effector site      12:15 left end-effector site              (tcp = their mean)
    15:18 left pad frame             18:21 right pad frame   (get_body_com, which reads xpos)
    21:24 object position            24:28 object quaternion (w, x, y, z)
    28:31 second object position     31:35 second object quaternion
    35 joint position (door angle, nail slide, ...)       36:39 a third position (task-specific)
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Final

import mujoco
import numpy as np

from imaginejax.core import weights

__all__ = ["SENSOR_DIM", "Sensor", "SceneSpec", "assets_dir", "build_model", "sensor_slices"]

SENSOR_DIM: Final[int] = 39

# Sensor object kinds: (sensor object type, sensor type) for a position or a quaternion.
_POS_TYPES: Final[dict[str, int]] = {
    "xbody": int(mujoco.mjtObj.mjOBJ_XBODY),  # body frame (data.xpos; also Gymnasium's get_body_com)
    "body": int(mujoco.mjtObj.mjOBJ_BODY),    # body inertial frame (data.xipos)
    "site": int(mujoco.mjtObj.mjOBJ_SITE),
    "geom": int(mujoco.mjtObj.mjOBJ_GEOM),
}


@dataclasses.dataclass(frozen=True)
class Sensor:
    """One observable: ``kind`` in {"xbody", "body", "site", "geom", "joint"} and the object's name."""

    kind: str
    name: str


@dataclasses.dataclass(frozen=True)
class SceneSpec:
    """How a task's model is built.

    Attributes:
      xml: scene file relative to ``metaworld/assets/sawyer_xyz``.
      fixtures: bodies that Meta-World moves at reset (made mocap, in this order after the hand's mocap).
      obj_pos, obj_quat, obj2_pos, obj2_quat, joint, extra_pos: the task-specific observables (None: unused).
      edit: a named programmatic change of the scene for our composed tasks (see :data:`EDITS`).
    """

    xml: str
    fixtures: tuple[str, ...] = ()
    obj_pos: Sensor | None = None
    obj_quat: Sensor | None = None
    obj2_pos: Sensor | None = None
    obj2_quat: Sensor | None = None
    joint: Sensor | None = None
    extra_pos: Sensor | None = None
    edit: str | None = None


def sensor_slices() -> dict[str, slice]:
    """Named slices of the :data:`SENSOR_DIM` sensor vector (the module docstring's layout)."""
    return {"hand": slice(0, 3), "rclaw": slice(3, 6), "lclaw": slice(6, 9), "ree": slice(9, 12),
            "lee": slice(12, 15), "lpad": slice(15, 18), "rpad": slice(18, 21), "obj": slice(21, 24),
            "obj_quat": slice(24, 28), "obj2": slice(28, 31), "obj2_quat": slice(31, 35), "joint": slice(35, 36),
            "extra": slice(36, 39)}


def assets_dir() -> Path:
    """``metaworld/assets`` of the installed package.

    Raises:
      MissingWeights: metaworld is not installed at its pinned version (the message names
        ``imaginejax setup-weights``).
    """
    path = weights.locate("metaworld")
    if not (path / "sawyer_xyz").is_dir():
        raise weights.MissingWeights(f"metaworld at {path.parent} has no assets/sawyer_xyz; "
                                     f"run `{weights.SETUP_COMMAND}`")
    return path


def _add_pos(spec: mujoco.MjSpec, name: str, sensor: Sensor) -> None:
    if sensor.kind == "joint":
        spec.add_sensor(name=name, type=mujoco.mjtSensor.mjSENS_JOINTPOS, objtype=mujoco.mjtObj.mjOBJ_JOINT,
                        objname=sensor.name)
        return
    spec.add_sensor(name=name, type=mujoco.mjtSensor.mjSENS_FRAMEPOS, objtype=_POS_TYPES[sensor.kind],
                    objname=sensor.name)


def _add_quat(spec: mujoco.MjSpec, name: str, sensor: Sensor) -> None:
    spec.add_sensor(name=name, type=mujoco.mjtSensor.mjSENS_FRAMEQUAT, objtype=_POS_TYPES[sensor.kind],
                    objname=sensor.name)


def _joint_name_of(spec: mujoco.MjSpec, name: str) -> str:
    """Meta-World leaves some joints unnamed (the lock's hinge): ``"@body"`` names the first joint of a body,
    which is then named so that a sensor can refer to it."""
    if not name.startswith("@"):
        return name
    body = spec.body(name[1:])
    joint = body.first_joint()
    if joint is None:
        raise ValueError(f"body {name[1:]!r} has no joint")
    if not joint.name:
        joint.name = f"{name[1:]}_joint"
    return joint.name


# The locked door (our locked-door-open task): Meta-World's lockable door (doorlockA, whose door does not
# move) gets the hinge of its openable door (doorlockB: axis z at the door's edge, range [-2, 0], the same
# joint defaults), a site at the handle, and a joint equality "door_hold" that pins the hinge at 0. The
# environment releases the hold (eq_active = 0) once the lock has been turned open, and keeps it released
# for the rest of the episode (see host.py): a latch rule instead of latch geometry.
LOCKED_DOOR_HOLD: Final[str] = "door_hold"
LOCK_RELEASE_ANGLE: Final[float] = 0.4  # lock angle (rad) below which the door is unlatched; locked = 1.5708
LATCH_SOLREF: Final[tuple[float, float]] = (0.005, 1.0)


def _edit_locked_door(spec: mujoco.MjSpec) -> None:
    door_link = spec.body("door_link")
    if door_link is None or door_link.first_joint() is not None:
        raise ValueError("the locked-door edit expects doorlockA's fixed door_link")
    joint = door_link.add_joint()
    joint.name = "doorjoint"
    joint.type = mujoco.mjtJoint.mjJNT_HINGE
    joint.axis = [0.0, 0.0, 1.0]
    joint.range = [-2.0, 0.0]
    joint.limited = mujoco.mjtLimited.mjLIMITED_TRUE
    joint.armature = 0.001
    joint.damping = [2.0, 0.0, 0.0]  # (MuJoCo 4 stores a damping polynomial; doorlockB: damping="2")
    # doorlockA's panel box (0.184 x 0.01 x 0.124, made for a door that never moves) reaches 4 mm closer to
    # the hinge than doorlockB's and meets the safe's side wall at ~0.62 rad; with doorlockB's panel the door
    # swings as far as door-open's (past the ~1.38 rad locked-door-open's predicate needs)
    panels = [g for g in door_link.geoms
              if g.type == mujoco.mjtGeom.mjGEOM_BOX and np.allclose(g.size, [0.184, 0.01, 0.124])]
    if len(panels) != 1:
        raise ValueError(f"the locked-door edit expects one panel box on door_link, found {len(panels)}")
    panels[0].size = [0.18, 0.01, 0.123]
    site = door_link.add_site()
    site.name = "door_handle"  # the handle mesh's centre, where door-open observes its handle geom
    site.pos = [0.37572163, -0.1071399, -0.05]
    site.size = [0.01, 0.01, 0.01]
    eq = spec.add_equality()
    eq.name = LOCKED_DOOR_HOLD
    eq.type = mujoco.mjtEq.mjEQ_JOINT
    eq.name1 = "doorjoint"
    eq.objtype = mujoco.mjtObj.mjOBJ_JOINT
    # a stiff latch: the fastest time constant the 2.5 ms step allows, hard impedance
    eq.solref = [LATCH_SOLREF[0], LATCH_SOLREF[1]]
    eq.solimp = [0.99, 0.999, 0.001, 0.5, 2.0]


EDITS: Final[dict] = {"locked_door": _edit_locked_door}


def _skipped_pairs(model: mujoco.MjModel) -> np.ndarray:
    """(nbody, nbody) bool: body pairs whose geoms MuJoCo never collides by its weld and parent rules
    (same weld body; or, with parent filtering on, a weld body and its parent's weld body, neither being
    the world)."""
    weld = model.body_weldid
    parent_weld = weld[model.body_parentid[weld]]
    same = weld[:, None] == weld[None, :]
    if model.opt.disableflags & int(mujoco.mjtDisableBit.mjDSBL_FILTERPARENT):
        return same
    nonworld = (weld[:, None] != 0) & (weld[None, :] != 0)
    parent = (weld[:, None] == parent_weld[None, :]) | (parent_weld[:, None] == weld[None, :])
    return same | (nonworld & parent)


def _keep_contact_filter(spec: mujoco.MjSpec, original: mujoco.MjModel) -> None:
    """Makes the mocap-fixture model collide exactly the body pairs the original model collides: as its own
    weld body a fixture would collide with the world's static geoms, and parent filtering would hide its
    jointed children's contacts; so parent filtering is off and every pair the original filtered implicitly
    becomes an explicit ``<exclude>`` (no pair added, contact order kept).
    """
    was = _skipped_pairs(original)
    spec.option.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_FILTERPARENT)
    probe = spec.compile()
    now = _skipped_pairs(probe)
    has_geom = np.zeros(original.nbody, bool)
    collides = (original.geom_contype != 0) | (original.geom_conaffinity != 0)
    has_geom[np.unique(original.geom_bodyid[collides])] = True
    names = [original.body(i).name for i in range(original.nbody)]
    for a in range(original.nbody):
        for b in range(a + 1, original.nbody):
            if was[a, b] and not now[a, b] and has_geom[a] and has_geom[b]:
                spec.add_exclude(bodyname1=names[a], bodyname2=names[b])


@functools.lru_cache(maxsize=None)
def _scene_text_check(xml: str) -> Path:
    path = assets_dir() / "sawyer_xyz" / xml
    if not path.is_file():
        raise weights.MissingWeights(f"metaworld scene {path} not found; run `{weights.SETUP_COMMAND}`")
    return path


def build_model(scene: SceneSpec, *, with_sensors: bool = True, fixtures_as_mocap: bool = True,
                mjx_friendly: bool = False) -> mujoco.MjModel:
    """Compiles a task's model (a new object per call).

    Args:
      scene: the task's :class:`SceneSpec`.
      with_sensors: add the :data:`SENSOR_DIM` observables (the module docstring's layout).
      fixtures_as_mocap: turn ``scene.fixtures`` into mocap bodies (False gives Meta-World's own model,
        used by the tests to check that the edit leaves the dynamics unchanged).
      mjx_friendly: apply :func:`.mjx_model.mjx_friendly` (the substitutions MJX needs) before compiling;
        the state and control layouts stay those of the original model.
    """
    spec = mujoco.MjSpec.from_file(str(_scene_text_check(scene.xml)))
    if scene.edit is not None:
        if scene.edit not in EDITS:
            raise ValueError(f"unknown scene edit {scene.edit!r}; valid: {', '.join(EDITS)}")
        EDITS[scene.edit](spec)
    if fixtures_as_mocap and scene.fixtures:
        original = spec.compile()
        for body in scene.fixtures:
            b = spec.body(body)
            if b is None:
                raise ValueError(f"scene {scene.xml} has no body {body!r}")
            if b.first_joint() is not None or b.parent.name != "world":
                raise ValueError(f"body {body!r} of {scene.xml} is not a fixed child of the world")
            b.mocap = True
        _keep_contact_filter(spec, original)
    if with_sensors:
        hand = Sensor("xbody", "hand")
        core = [("hand", hand), ("rclaw", Sensor("xbody", "rightclaw")), ("lclaw", Sensor("xbody", "leftclaw")),
                ("ree", Sensor("site", "rightEndEffector")), ("lee", Sensor("site", "leftEndEffector")),
                ("lpad", Sensor("xbody", "leftpad")), ("rpad", Sensor("xbody", "rightpad"))]
        for name, sensor in core:
            _add_pos(spec, f"ij_{name}", sensor)
        _add_pos(spec, "ij_obj", scene.obj_pos or hand)
        _add_quat(spec, "ij_obj_quat", scene.obj_quat or hand)
        _add_pos(spec, "ij_obj2", scene.obj2_pos or hand)
        _add_quat(spec, "ij_obj2_quat", scene.obj2_quat or hand)
        if scene.joint is not None:
            _add_pos(spec, "ij_joint", Sensor("joint", _joint_name_of(spec, scene.joint.name)))
        else:  # a one-value stand-in: the first arm joint
            _add_pos(spec, "ij_joint", Sensor("joint", "right_j0"))
        _add_pos(spec, "ij_extra", scene.extra_pos or hand)
    if mjx_friendly:
        from imaginejax.envs.metaworld.mjx_model import mjx_friendly as _transform

        model, _ = _transform(spec)
    else:
        model = spec.compile()
    reset_mocap_welds(model)
    if with_sensors and model.nsensordata != SENSOR_DIM:
        raise AssertionError(f"sensor layout of {scene.xml} has {model.nsensordata} values, expected {SENSOR_DIM}")
    return model


# Meta-World's SawyerMocapBase.reset_mocap_welds: every weld gets anchor 0, relative position 0, relative
# orientation (-1, 0, 0, 0) and torque scale 5 (the first 11 entries of ``eq_data``).
WELD_DATA: Final[np.ndarray] = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 5.0])


def reset_mocap_welds(model: mujoco.MjModel) -> None:
    """Writes Meta-World's mocap-weld parameters into ``model`` in place (as Meta-World does after loading)."""
    if model.nmocap > 0:
        for i in range(model.neq):
            if model.eq_type[i] == mujoco.mjtEq.mjEQ_WELD:
                model.eq_data[i, : WELD_DATA.size] = WELD_DATA


def mocap_ids(model: mujoco.MjModel, scene: SceneSpec) -> tuple[int, tuple[int, ...]]:
    """(hand mocap index, fixture mocap indices in ``scene.fixtures`` order) of a compiled model."""
    hand = int(model.body_mocapid[model.body("mocap").id])
    fixtures = tuple(int(model.body_mocapid[model.body(b).id]) for b in scene.fixtures)
    return hand, fixtures
