"""The MJX physics of Meta-World: one environment step of a batch in pure JAX (``jit``/``vmap``/``scan``).

The models are the MJX-friendly ones (:mod:`.mjx_model`), the same the MuJoCo C host compiles with
``mjx_friendly=True`` (:func:`.host.get_host`), so state and control vectors have the host's layouts
(:func:`imaginejax.envs.mujoco_host.state_layout`), here in float32: a row's state is its padded
``mjSTATE_FULLPHYSICS`` vector (time, qpos, qvel) and its control vector is
``[ctrl | eq_active | mocap_pos | mocap_quat]``, padded.

One step of a row (what :meth:`.host.MetaWorldHost.step64` does on MuJoCo C):

1. Meta-World's control of the action (:func:`controls`): the hand's mocap target moves by
   ``clip(a[:3], -1, 1) · 0.01`` inside the task's bounds, the mocap quaternion is (1, 0, 1, 0), the
   fingers get ``(a[3], -a[3])``, and the locked door's latch is released for good once the lock has turned;
2. ``FRAME_SKIP`` ``mjx.step`` calls from a zero solver warm start (as the host's ``mujoco.rollout``);
3. the :data:`.scenes.SENSOR_DIM` observables on the final state (``mjx.kinematics`` + ``mjx.sensor_pos``,
   position sensors only).

Rows of different tasks. Each task has its own model; a batch may mix tasks, so a row selects its model
with ``lax.switch`` — which, under ``vmap``, evaluates *every* model on every row and keeps the row's own.
The cost of a step therefore grows with the number of models compiled in, which is why
:class:`MjxPhysics` takes the tasks it serves (one task: no switch at all); a row of any other task comes
back as NaN (flagged by ``tasks.legal``).
"""

from __future__ import annotations

from typing import Final, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.envs.metaworld import scenes
from imaginejax.envs.metaworld.host import FRAME_SKIP, HAND_QUAT, MetaWorldHost
from imaginejax.envs.metaworld.tasks import MOCAP_HIGH, MOCAP_LOW, TASK_INDEX, TASKS

__all__ = ["MjxPhysics", "controls", "task_names"]

_NO_LATCH: Final[int] = -1


def task_names(tasks: Sequence[str] | None) -> tuple[str, ...]:
    """The validated task names (None: all :data:`.tasks.TASKS`).

    Raises: ValueError naming the unknown tasks and the valid names (also for an empty selection).
    """
    names = tuple(t.name for t in TASKS) if tasks is None else tuple(tasks)
    unknown = [n for n in names if n not in TASK_INDEX]
    if unknown or not names:
        raise ValueError(f"tasks must name Meta-World tasks, got {unknown or names}; valid: {', '.join(TASK_INDEX)}")
    return names


class MjxPhysics:
    """MJX models of some tasks and their batched step (see the module docstring).

    Args:
      host: the :class:`.host.MetaWorldHost` on the MJX-friendly models (``get_host(mjx_friendly=True)``):
        its models, padded widths and control columns are used.
      tasks: names of the tasks whose models this step compiles in (default: all).
    Raises:
      ValueError: a host on Meta-World's original models, or an unknown task name (the valid names are listed).
    """

    def __init__(self, host: MetaWorldHost, tasks: Sequence[str] | None = None) -> None:
        from mujoco import mjx  # imported lazily: heavy, and only this backend needs it

        if not host.mjx_friendly:
            raise ValueError("MjxPhysics needs the host of the MJX-friendly models: get_host(mjx_friendly=True)")
        names = task_names(tasks)
        self.tasks = names
        self.task_ids = tuple(TASK_INDEX[n] for n in names)
        self.state_width, self.control_width = host.state_width, host.control_width
        self.models = tuple(host.models[k] for k in self.task_ids)
        with jax.ensure_compile_time_eval():
            self.mjx_models = tuple(mjx.put_model(m) for m in self.models)
        branch = np.full(len(TASKS), -1, np.int32)
        branch[list(self.task_ids)] = np.arange(len(names))
        self.branch_of_task = branch
        self.state_layouts = tuple(host.state_layouts[k] for k in self.task_ids)
        self.control_layouts = tuple(host.control_layouts[k] for k in self.task_ids)
        # Per-task control columns (all tasks, the host's): hand mocap position and quaternion, latch.
        self.hand_pos_cols = host.hand_mocap_columns()    # (K, 3)
        self.hand_quat_cols = host.hand_quat_columns()    # (K, 4)
        self.latch_cols = np.full(len(TASKS), _NO_LATCH, np.int32)  # (K,) eq_active column of the latch
        self.latch_qpos = np.zeros(len(TASKS), np.int32)            # (K,) state index of the lock's angle
        for k, col, qpos in host._latches:
            self.latch_cols[k], self.latch_qpos[k] = col, qpos

    # ------------------------------------------------------------------ one row, one model
    def _step_one(self, branch: int, phys: jax.Array, ctrl: jax.Array) -> tuple[jax.Array, jax.Array]:
        """FRAME_SKIP MJX steps of one row with model ``branch``: phys (S,), ctrl (C,) → phys' (S,), sensors (39,)."""
        from mujoco import mjx

        m, mx = self.models[branch], self.mjx_models[branch]
        sl, cl = self.state_layouts[branch], self.control_layouts[branch]
        data = mjx.make_data(mx).replace(
            time=phys[0], qpos=phys[sl["qpos"]], qvel=phys[sl["qvel"]], ctrl=ctrl[cl["ctrl"]],
            eq_active=ctrl[cl["eq_active"]] > 0.5,
            mocap_pos=ctrl[cl["mocap_pos"]].reshape(m.nmocap, 3),
            mocap_quat=ctrl[cl["mocap_quat"]].reshape(m.nmocap, 4))
        data = jax.lax.fori_loop(0, FRAME_SKIP, lambda _, d: mjx.step(mx, d), data)
        data = mjx.sensor_pos(mx, mjx.kinematics(mx, data))
        size = sl["qvel"].stop
        new = jnp.concatenate([data.time[None], data.qpos, data.qvel]).astype(phys.dtype)
        new = jnp.concatenate([new, phys[size:]])  # padding (and empty act/history) unchanged
        return new, data.sensordata[: scenes.SENSOR_DIM].astype(jnp.float32)

    def _step_row(self, phys: jax.Array, ctrl: jax.Array, task: jax.Array) -> tuple[jax.Array, jax.Array]:
        branch = jnp.asarray(self.branch_of_task)[task]
        nan = (jnp.full_like(phys, jnp.nan), jnp.full((scenes.SENSOR_DIM,), jnp.nan, jnp.float32))
        if len(self.models) == 1:
            new = self._step_one(0, phys, ctrl)
        else:
            fns = [lambda p, c, b=b: self._step_one(b, p, c) for b in range(len(self.models))]
            new = jax.lax.switch(jnp.maximum(branch, 0), fns, phys, ctrl)
        return jax.tree.map(lambda a, b: jnp.where(branch >= 0, a, b), new, nan)

    # ------------------------------------------------------------------ batch
    def step(self, phys: jax.Array, ctrl: jax.Array, action: jax.Array, task: jax.Array, active: jax.Array
             ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One environment step of the ``active`` rows.

        Args:
          phys: (B, S) float32 state vectors; ctrl: (B, C) float32 control vectors (host layouts).
          action: (B, 4) actions; task: (B,) int task ids (:data:`.tasks.TASKS` order); active: (B,) bool.
        Returns: phys' (B, S), ctrl' (B, C), sensors (B, 39); inactive rows unchanged (sensors 0).
        """
        new_ctrl = controls(self, ctrl, action, task, phys)
        new_phys, sensors = jax.vmap(self._step_row)(phys, new_ctrl, task)
        keep = active[:, None]
        return (jnp.where(keep, new_phys, phys), jnp.where(keep, new_ctrl, ctrl),
                jnp.where(keep, sensors, 0.0))


def controls(physics: MjxPhysics, ctrl: jax.Array, action: jax.Array, task: jax.Array, phys: jax.Array
             ) -> jax.Array:
    """Meta-World's control of an action in JAX (:meth:`.host.MetaWorldHost.controls64` in float32).

    Args:
      physics: the column tables of :class:`MjxPhysics`.
      ctrl: (B, C) control vectors; action: (B, 4); task: (B,) task ids; phys: (B, S) states (the latch).
    Returns: (B, C) new control vectors.
    """
    action = jnp.asarray(action, jnp.float32)
    rows = jnp.arange(ctrl.shape[0])[:, None]
    cols = jnp.asarray(physics.hand_pos_cols)[task]                     # (B, 3)
    low, high = jnp.asarray(MOCAP_LOW)[task], jnp.asarray(MOCAP_HIGH)[task]
    delta = jnp.clip(action[:, :3], -1.0, 1.0) * jnp.float32(0.01)
    ctrl = ctrl.at[rows, cols].set(jnp.clip(ctrl[rows, cols] + delta, low, high))
    ctrl = ctrl.at[rows, jnp.asarray(physics.hand_quat_cols)[task]].set(jnp.asarray(HAND_QUAT, ctrl.dtype))
    ctrl = ctrl.at[:, 0].set(action[:, 3]).at[:, 1].set(-action[:, 3])
    latch = jnp.asarray(physics.latch_cols)[task]                         # (B,)
    lock = jnp.take_along_axis(phys, jnp.asarray(physics.latch_qpos)[task][:, None], 1)[:, 0]
    held = (jnp.take_along_axis(ctrl, jnp.maximum(latch, 0)[:, None], 1)[:, 0] > 0) & (
        lock > scenes.LOCK_RELEASE_ANGLE)
    latched = ctrl.at[jnp.arange(ctrl.shape[0]), jnp.maximum(latch, 0)].set(held.astype(ctrl.dtype))
    return jnp.where((latch >= 0)[:, None], latched, ctrl)
