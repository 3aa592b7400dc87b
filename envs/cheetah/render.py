"""HalfCheetah rendered by MuJoCo: the camera follows the torso from the side."""

from __future__ import annotations

from typing import Any

import numpy as np

from imaginejax.envs.cheetah import model as cheetah_model
from imaginejax.envs.registry import Renderer, Scene


def scene(env: Any, params: Any, task: int) -> Scene:
    """The model with qpos/qvel (hi + lo) of ``state.physics``; the same scene for every task."""
    del env, params, task

    def load(data: Any, state: Any) -> None:
        physics = state.physics
        data.qpos[:] = np.asarray(physics.qpos, np.float64) + np.asarray(physics.qpos_lo, np.float64)
        data.qvel[:] = np.asarray(physics.qvel, np.float64) + np.asarray(physics.qvel_lo, np.float64)

    model = cheetah_model.load_model()
    return Scene(model, load, distance=4.0, azimuth=90.0, elevation=-15.0, track="torso",
                 seconds_per_step=float(model.opt.timestep) * cheetah_model.FRAME_SKIP)


def renderer() -> Renderer:
    return Renderer(scene=scene)
