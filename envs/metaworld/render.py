"""Meta-World rendered by MuJoCo: each task in its own scene."""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from imaginejax.envs.metaworld.host import CONTROL_SPEC, FRAME_SKIP
from imaginejax.envs.mujoco_host import FULLPHYSICS, unpack64
from imaginejax.envs.registry import Renderer, Scene


def scene(env: Any, params: Any, task: int) -> Scene:
    """The task's scene with the FULLPHYSICS state and the control vector (the hand's mocap target) of the
    state (float64 bit patterns, or MJX's float32 vectors)."""
    model = env.host.models[int(np.asarray(params.goals)[task, 0])]
    sizes = mujoco.mj_stateSize(model, FULLPHYSICS), mujoco.mj_stateSize(model, CONTROL_SPEC)
    as64 = lambda x: unpack64(x) if np.asarray(x).dtype == np.uint32 else np.asarray(x, np.float64)

    def load(data: Any, state: Any) -> None:
        mujoco.mj_setState(model, data, as64(state.phys)[: sizes[0]], FULLPHYSICS)
        mujoco.mj_setState(model, data, as64(state.ctrl)[: sizes[1]], CONTROL_SPEC)

    return Scene(model, load, lookat=(0.0, 0.7, 0.1), distance=1.25, azimuth=135.0, elevation=-30.0,
                 seconds_per_step=float(model.opt.timestep) * FRAME_SKIP)


def renderer() -> Renderer:
    return Renderer(scene=scene)
