"""CLEVR-Robot pushes stepped by MuJoCo C on ``scene.xml`` (host-side NumPy): the reference
:mod:`envs.clevr.physics` is checked against, with the semantics of :func:`envs.clevr.physics.push`.
:func:`push_mujoco` loops over ``mj_step``; :func:`push_rollout` uses ``mujoco.rollout`` on threads.
"""

from __future__ import annotations

import mujoco
import numpy as np

from imaginejax.envs.clevr.physics import DIRECTIONS, N_BALLS, PUSH_OFFSET, SUBSTEPS, scene_xml_path

__all__ = ["load_model", "initial_qpos", "push_mujoco", "push_rollout", "PushRollout"]


def load_model() -> mujoco.MjModel:
    """Compile ``scene.xml`` into a fresh ``MjModel``."""
    return mujoco.MjModel.from_xml_path(str(scene_xml_path()))


def initial_qpos(balls: np.ndarray, ball: np.ndarray, direction: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Start state and control of a batch of pushes.

    Args:
        balls: (B, 5, 2) ball positions; ball: (B,) ball index; direction: (B,) direction index.
    Returns:
        ``qpos`` (B, 12) float64 (balls' x, y in index order, then the pusher's x, y) and
        ``ctrl`` (B, 2) float64 (the push direction).
    """
    balls = np.asarray(balls, np.float64)
    ball = np.asarray(ball, np.int64)
    dirs = DIRECTIONS.astype(np.float64)[np.asarray(direction, np.int64)]  # (B, 2)
    target = balls[np.arange(balls.shape[0]), ball]  # (B, 2), the current position of the pushed ball
    qpos = np.concatenate([balls.reshape(-1, 2 * N_BALLS), target - PUSH_OFFSET * dirs], axis=1)
    return qpos, dirs


def push_mujoco(balls: np.ndarray, ball: np.ndarray, direction: np.ndarray,
                model: mujoco.MjModel | None = None, data: mujoco.MjData | None = None) -> np.ndarray:
    """A batch of pushes, one after another, with ``mj_step`` in a Python loop.

    Args:
        balls: (B, 5, 2) ball positions; ball: (B,) ints in [0, 5); direction: (B,) ints in [0, 8).
        model, data: optional pre-built ``MjModel`` / ``MjData`` (re-used to avoid allocation).
    Returns:
        (B, 5, 2) float64 ball positions after each push.
    """
    model = load_model() if model is None else model
    data = mujoco.MjData(model) if data is None else data
    qpos0, ctrl = initial_qpos(balls, ball, direction)
    out = np.empty((qpos0.shape[0], 2 * N_BALLS))
    for n in range(qpos0.shape[0]):
        mujoco.mj_resetData(model, data)
        data.qpos[:] = qpos0[n]
        data.ctrl[:] = ctrl[n]
        for _ in range(SUBSTEPS):
            mujoco.mj_step(model, data)
        out[n] = data.qpos[: 2 * N_BALLS]
    return out.reshape(-1, N_BALLS, 2)


class PushRollout:
    """Batched pushes with ``mujoco.rollout`` (C threads; re-usable, holds one ``MjData`` per thread)."""

    def __init__(self, nthread: int = 2, model: mujoco.MjModel | None = None) -> None:
        from mujoco import rollout  # imported lazily: optional fast path

        self.model = load_model() if model is None else model
        self.nthread = max(1, int(nthread))
        self.datas = [mujoco.MjData(self.model) for _ in range(self.nthread)]
        self._rollout = rollout.Rollout(nthread=self.nthread)
        spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
        assert mujoco.mj_stateSize(self.model, mujoco.mjtState.mjSTATE_TIME) == 1
        self._template = np.empty(mujoco.mj_stateSize(self.model, spec))
        reset = mujoco.MjData(self.model)
        mujoco.mj_getState(self.model, reset, self._template, spec)

    def close(self) -> None:
        """Release the thread pool."""
        self._rollout.close()

    def __call__(self, balls: np.ndarray, ball: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """Same contract as :func:`push_mujoco`: (B, 5, 2), (B,), (B,) -> (B, 5, 2) float64."""
        model = self.model
        qpos0, ctrl = initial_qpos(balls, ball, direction)
        # Full physics state of a reset MjData (time 0, qvel 0, ...) with qpos replaced; the state
        # vector concatenates the components in mjtState bit order, so qpos follows the time.
        state0 = np.tile(self._template, (qpos0.shape[0], 1))
        state0[:, 1:1 + model.nq] = qpos0
        controls = np.repeat(ctrl[:, None, :], SUBSTEPS, axis=1)  # (B, SUBSTEPS, nu)
        state, _ = self._rollout.rollout(model, self.datas, state0, controls,
                                         control_spec=int(mujoco.mjtState.mjSTATE_CTRL), nstep=SUBSTEPS)
        return state[:, -1, 1:1 + 2 * N_BALLS].reshape(-1, N_BALLS, 2)


def push_rollout(balls: np.ndarray, ball: np.ndarray, direction: np.ndarray, nthread: int = 2
                 ) -> np.ndarray:
    """One-shot :class:`PushRollout` call: (B, 5, 2), (B,), (B,) -> (B, 5, 2) float64."""
    runner = PushRollout(nthread)
    try:
        return runner(balls, ball, direction)
    finally:
        runner.close()
