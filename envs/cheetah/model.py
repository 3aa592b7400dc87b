"""The HalfCheetah model: Gymnasium's HalfCheetah-v5 MJCF, compiled from the installed ``gymnasium`` (the
benchmark's model, parameter for parameter; why not a copy: docs/envs.md). qpos (9) = rootx, rootz,
rooty, bthigh, bshin, bfoot, fthigh, fshin, ffoot, qvel (9) the same; ctrl (6) in [-1, 1], torque
``gear · ctrl``; one environment step = ``FRAME_SKIP`` steps of ``TIMESTEP``.
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
