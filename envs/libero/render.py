"""LIBERO rendered by MuJoCo: one tabletop scene for every task."""

from __future__ import annotations

from typing import Any

import mujoco

from imaginejax.envs.libero import model as libero_model
from imaginejax.envs.mujoco_host import FULLPHYSICS, join64
from imaginejax.envs.registry import Renderer, Scene


def scene(env: Any, params: Any, task: int) -> Scene:
    """The scene with the FULLPHYSICS state ``hi + lo``; the same scene for every task."""
    del env, params, task
    model = libero_model.load_model()

    def load(data: Any, state: Any) -> None:
        mujoco.mj_setState(model, data, join64(state.hi, state.lo), FULLPHYSICS)

    return Scene(model, load, lookat=(0.4, 0.0, 0.3), distance=1.7, azimuth=180.0, elevation=-30.0,
                 seconds_per_step=float(model.opt.timestep) * libero_model.FRAME_SKIP)


def renderer() -> Renderer:
    return Renderer(scene=scene)
