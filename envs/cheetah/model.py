"""The HalfCheetah model: Gymnasium's HalfCheetah-v5 MJCF, loaded from the installed ``gymnasium``.

Why load it from Gymnasium at run time instead of shipping an MJCF of our own: the benchmark is defined
on *the* standard HalfCheetah (BENCHMARK §2.5), and the only way to be sure every parameter (masses from
``settotalmass``, joint stiffness/damping/armature, contact softness, gears, limits) is identical is to
compile the very file Gymnasium compiles. A hand-written copy would be a transcription of that file
that can drift silently; loading it costs one small pure-Python dependency (``gymnasium``, which the
parity tests need anyway). Nothing of the file is copied into this repository.

Constants below are facts of that model (checked against the compiled ``MjModel`` by the tests):

* ``qpos`` (9): rootx, rootz, rooty, bthigh, bshin, bfoot, fthigh, fshin, ffoot; ``qvel`` (9) the same
  joints' velocities. rootz is the torso's height relative to its initial 0.7 m; rooty its pitch.
* ``ctrl`` (6): one motor per leg joint with ``ctrlrange = [-1, 1]`` (MuJoCo clamps), torque =
  ``gear · ctrl`` with gears (120, 90, 60, 120, 60, 30): the action *is* the control, the gear scales
  it inside MuJoCo, exactly as Gymnasium does.
* ``timestep = 0.01`` s, Euler integrator, Newton solver; one environment step = ``FRAME_SKIP = 5``
  physics steps, ``DT = 0.05`` s.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Final

import mujoco
import numpy as np

NQ: Final[int] = 9
NV: Final[int] = 9
NU: Final[int] = 6
FRAME_SKIP: Final[int] = 5
TIMESTEP: Final[float] = 0.01
DT: Final[float] = FRAME_SKIP * TIMESTEP
GEAR: Final[tuple[float, ...]] = (120.0, 90.0, 60.0, 120.0, 60.0, 30.0)
JOINT_NAMES: Final[tuple[str, ...]] = ("rootx", "rootz", "rooty", "bthigh", "bshin", "bfoot", "fthigh",
                                      "fshin", "ffoot")
# Hinge limits of the six leg joints (rad), in qpos order 3..8. The limits are soft: MuJoCo lets a joint
# pass them by a fraction of a radian under load.
LEG_JOINT_RANGE: Final[np.ndarray] = np.array(
    [[-0.52, 1.05], [-0.785, 0.785], [-0.4, 0.785], [-1.0, 0.7], [-1.2, 0.87], [-0.5, 0.5]], np.float32)
LEG_JOINT_RANGE.setflags(write=False)
TORSO_START_HEIGHT: Final[float] = 0.7  # body "torso" pos z; rootz = 0 there
TORSO_RADIUS: Final[float] = 0.046
GYMNASIUM_XML: Final[str] = "envs/mujoco/assets/half_cheetah.xml"

__all__ = ["DT", "FRAME_SKIP", "GEAR", "JOINT_NAMES", "LEG_JOINT_RANGE", "NQ", "NU", "NV", "TIMESTEP",
           "load_model", "xml_path"]


def xml_path() -> Path:
    """Path of Gymnasium's ``half_cheetah.xml`` (the HalfCheetah-v4/v5 model).

    Raises:
      ImportError: gymnasium is not installed (with the command that installs it).
      FileNotFoundError: the installed gymnasium has no such asset.
    """
    spec = importlib.util.find_spec("gymnasium")
    if spec is None or spec.origin is None:
        raise ImportError(
            "the HalfCheetah environment loads its model from the gymnasium package, which is not "
            "installed; install it with `pip install \"gymnasium[mujoco]<1.4\"`")
    path = Path(spec.origin).parent / GYMNASIUM_XML
    if not path.is_file():
        raise FileNotFoundError(f"gymnasium at {path.parent.parent.parent} has no {GYMNASIUM_XML}; "
                                "install a gymnasium release with the MuJoCo v5 environments (>= 1.0)")
    return path


@functools.lru_cache(maxsize=1)
def _xml_text() -> str:
    return xml_path().read_text(encoding="utf-8")


def load_model() -> mujoco.MjModel:
    """A freshly compiled ``MjModel`` of HalfCheetah (each call returns a new object).

    Raises:
      ValueError: the compiled model does not have the layout this package relies on (a gymnasium
        release with a different HalfCheetah).
    """
    model = mujoco.MjModel.from_xml_string(_xml_text())
    _check_layout(model)
    return model


def _check_layout(model: mujoco.MjModel) -> None:
    """Raises ValueError naming the first model fact that differs from the constants above."""
    names = tuple(mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in range(model.njnt))
    checks = {
        "nq": (model.nq, NQ), "nv": (model.nv, NV), "nu": (model.nu, NU),
        "opt.timestep": (float(model.opt.timestep), TIMESTEP), "joint names": (names, JOINT_NAMES),
        "actuator gears": (tuple(float(g) for g in model.actuator_gear[:, 0]), GEAR),
    }
    for field, (got, want) in checks.items():
        if got != want:
            raise ValueError(f"HalfCheetah model from {xml_path()}: {field} is {got}, expected {want}; "
                             "install gymnasium's HalfCheetah-v5 assets (`pip install \"gymnasium<1.4\"`)")
    if not np.allclose(model.jnt_range[3:], LEG_JOINT_RANGE, atol=1e-6):
        raise ValueError(f"HalfCheetah model from {xml_path()}: leg joint ranges {model.jnt_range[3:]} "
                         f"differ from {LEG_JOINT_RANGE}")
