"""The MJX physics of the LIBERO-style tabletop: one env step of a batch in pure JAX (``jit``/``vmap``/``scan``)
on the host's MJCF (``mjx.put_model``): ``FRAME_SKIP`` ``mjx.step`` calls per row with the 9 servo targets
held, from a zero warm start, on the float32 FULLPHYSICS vector (the host's layout, so
:class:`.env.EnvState` is the same on both backends). Agreement with MuJoCo C and where it ends (the
grasp): docs/envs.md, "LIBERO".
"""

from __future__ import annotations

import functools
from typing import Final

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from imaginejax.envs.libero import model as M
from imaginejax.envs.mujoco_host import FULLPHYSICS, state_layout

__all__ = ["MjxPhysics", "physics_layout"]

_STATE_PARTS: Final[tuple[str, ...]] = ("time", "qpos", "qvel")


@functools.lru_cache(maxsize=1)
def physics_layout() -> tuple[dict[str, slice], int]:
    """Slices of the scene's FULLPHYSICS vector (:func:`state_layout`) and its width S (71)."""
    model = M.load_model()
    return state_layout(model), int(mujoco.mj_stateSize(model, FULLPHYSICS))


class MjxPhysics:
    """The scene on MJX and its batched environment step.

    Attributes:
      model: the compiled ``MjModel`` (the host's MJCF).
      mjx_model: ``mjx.put_model(model)`` (float32 on the default device).
      layout / state_width: the FULLPHYSICS slices and width S.
    Raises:
      ValueError: the model has state MJX's step would drop (act, history, plugin or plasticity state).
    """

    def __init__(self) -> None:
        from mujoco import mjx  # imported lazily: heavy, and only this backend needs it

        self.model = M.load_model()
        self.layout, self.state_width = physics_layout()
        extra = [k for k, s in self.layout.items() if k not in _STATE_PARTS and s.stop > s.start]
        if extra:
            raise ValueError(f"LIBERO scene: FULLPHYSICS components {extra} are not carried by the MJX step")
        with jax.ensure_compile_time_eval():
            self.mjx_model = mjx.put_model(self.model)
        # One jitted physics step shared by every caller: eager callers (reset, tests) compile it once per
        # batch size; inside an outer jit it is inlined.
        self._step = jax.jit(self._step_batch)

    def __repr__(self) -> str:
        return f"MjxPhysics(nq={self.model.nq}, nv={self.model.nv}, S={self.state_width})"

    def data(self, phys: jax.Array, ctrl: jax.Array):
        """``mjx.Data`` of one row: phys (S,) FULLPHYSICS vector, ctrl (9,) servo targets; zero warm start."""
        from mujoco import mjx

        sl = self.layout
        phys = jnp.asarray(phys, jnp.float32)
        return mjx.make_data(self.mjx_model).replace(
            time=phys[sl["time"]][0], qpos=phys[sl["qpos"]], qvel=phys[sl["qvel"]],
            ctrl=jnp.asarray(ctrl, jnp.float32))

    def step_row(self, phys: jax.Array, ctrl: jax.Array) -> jax.Array:
        """``FRAME_SKIP`` MJX steps of one row with the controls held.

        Args:
          phys: (S,) float32 FULLPHYSICS vector (time, qpos (37), qvel (33)).
          ctrl: (9,) float32 servo targets (7 joints, 2 fingers).
        Returns: (S,) float32 FULLPHYSICS vector after the step.
        """
        from mujoco import mjx

        data = jax.lax.fori_loop(0, M.FRAME_SKIP, lambda _, d: mjx.step(self.mjx_model, d), self.data(phys, ctrl))
        return jnp.concatenate([data.time[None], data.qpos, data.qvel]).astype(jnp.float32)

    def step(self, phys: jax.Array, ctrl: jax.Array, active: jax.Array) -> jax.Array:
        """One environment step of the ``active`` rows of a batch.

        Args:
          phys: (B, S) float32 FULLPHYSICS vectors.
          ctrl: (B, 9) float32 servo targets.
          active: (B,) bool; inactive rows are returned unchanged (under ``vmap`` they are still computed).
        Returns: (B, S) float32.
        """
        phys = jnp.asarray(phys, jnp.float32)
        if phys.ndim != 2 or phys.shape[1] != self.state_width:
            raise ValueError(f"phys must be (B, {self.state_width}) FULLPHYSICS vectors, got {phys.shape}")
        if jnp.shape(ctrl) != (phys.shape[0], M.CTRL_DIM):
            raise ValueError(f"ctrl must be ({phys.shape[0]}, {M.CTRL_DIM}) servo targets, got {jnp.shape(ctrl)}")
        return self._step(phys, jnp.asarray(ctrl, jnp.float32), jnp.asarray(active, bool))

    def _step_batch(self, phys: jax.Array, ctrl: jax.Array, active: jax.Array) -> jax.Array:
        new = jax.vmap(self.step_row)(phys, ctrl)
        return jnp.where(active[:, None], new, phys)

    def contact_stats(self, phys: np.ndarray, ctrl: np.ndarray) -> dict[str, int]:
        """Contact counts of one state (host-side diagnostics for the benchmark).

        Args:
          phys: (S,) FULLPHYSICS vector; ctrl: (9,) servo targets.
        Returns: ``candidate_pairs`` (geom pairs MJX checks every step), ``mjx_contacts`` (contact slots MJX
        allocates, a static size), ``active_mjx`` (slots with distance < 0 on this state), ``mujoco_ncon``
        (MuJoCo C's ``ncon`` on the same state).
        """
        from mujoco import mjx
        from mujoco.mjx._src.collision_driver import geom_pairs

        pairs = sum(1 for _ in geom_pairs(self.model))
        d = jax.jit(lambda p, c: mjx.forward(self.mjx_model, self.data(p, c)))(jnp.asarray(phys), jnp.asarray(ctrl))
        dist = np.asarray(d._impl.contact.dist)
        cd = mujoco.MjData(self.model)
        sl = self.layout
        cd.qpos[:] = np.asarray(phys, np.float64)[sl["qpos"]]
        cd.qvel[:] = np.asarray(phys, np.float64)[sl["qvel"]]
        cd.ctrl[:] = np.asarray(ctrl, np.float64)
        mujoco.mj_forward(self.model, cd)
        return {"candidate_pairs": int(pairs), "mjx_contacts": int(dist.size), "active_mjx": int((dist < 0).sum()),
                "mujoco_ncon": int(cd.ncon)}
