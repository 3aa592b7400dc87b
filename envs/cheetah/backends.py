"""Two physics backends behind one functional API: MuJoCo C on the host, and MJX inside ``jit``.

    physics = Physics.from_qpos_qvel(qpos (..., 9), qvel (..., 9))
    physics, dx = physics_step(physics, action (..., 6), backend="auto")

One call advances every row by ``FRAME_SKIP`` MuJoCo steps with ``ctrl = action`` held and returns
``dx = x_after - x_before``. ``"mujoco"``: MuJoCo C in float64, all rows in one ``mujoco.rollout`` call
through one ``jax.pure_callback`` (also under ``vmap``); ``"mjx"``: ``mujoco.mjx``; ``"auto"``: MJX on an
accelerator. The state travels as float32 pairs ``hi + lo`` (HalfCheetah is chaotic: float32 rounding
alone leaves Gymnasium's trajectory within tens of steps); each step starts the solver cold; non-finite
rows come back NaN. Measurements: docs/envs.md, "HalfCheetah".
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Final

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from flax import struct

from imaginejax.envs.cheetah import model as cheetah_model
from imaginejax.envs.cheetah.model import FRAME_SKIP, NQ, NU, NV
from imaginejax.envs.mujoco_host import BACKENDS, Backend, default_threads, resolve_backend

PACKED_IN: Final[int] = 2 * NQ + 2 * NV + NU + 1  # callback input per row (see MujocoRunner.__call__)
PACKED_OUT: Final[int] = 2 * NQ + 2 * NV + 1
SERIAL_BELOW: Final[int] = 32  # batches smaller than this run in the calling thread (pool hand-off costs more)

__all__ = ["BACKENDS", "Backend", "MujocoRunner", "Physics", "default_threads", "get_runner",
           "physics_step", "resolve_backend"]


@struct.dataclass
class Physics:
    """MuJoCo physics state shared by both backends (every field (..., 9), same float dtype).

    Attributes:
      qpos: joint positions (rootx, rootz, rooty, six leg hinges), float32 rounding of the true value.
      qvel: joint velocities, same order.
      qpos_lo: remainder ``qpos_true - qpos`` rounded to the same dtype (0 after MJX or a reset).
      qvel_lo: remainder of ``qvel``.
    """

    qpos: jax.Array
    qvel: jax.Array
    qpos_lo: jax.Array
    qvel_lo: jax.Array

    @classmethod
    def from_qpos_qvel(cls, qpos: jax.Array, qvel: jax.Array) -> "Physics":
        """A state with zero remainders: qpos (..., 9), qvel (..., 9) (cast to JAX's default float)."""
        qpos = jnp.asarray(qpos, dtype=jnp.result_type(float))
        qvel = jnp.asarray(qvel, dtype=qpos.dtype)
        if qpos.shape[-1:] != (NQ,) or qvel.shape != qpos.shape[:-1] + (NV,):
            raise ValueError(f"qpos must be (..., {NQ}) and qvel (..., {NV}) with the same leading shape; "
                             f"got qpos {qpos.shape}, qvel {qvel.shape}")
        return cls(qpos=qpos, qvel=qvel, qpos_lo=jnp.zeros_like(qpos), qvel_lo=jnp.zeros_like(qvel))

    @classmethod
    def from_float64(cls, qpos: np.ndarray, qvel: np.ndarray) -> "Physics":
        """Host-side: float64 qpos (..., 9), qvel (..., 9) (e.g. a Gymnasium ``MjData``) → a state that
        keeps them to 2^-48 relative (exactly with x64 enabled)."""
        dtype = np.dtype(jnp.result_type(float))
        qpos_hi, qpos_lo = _split(np.asarray(qpos, np.float64), dtype)
        qvel_hi, qvel_lo = _split(np.asarray(qvel, np.float64), dtype)
        if qpos_hi.shape[-1:] != (NQ,) or qvel_hi.shape != qpos_hi.shape[:-1] + (NV,):
            raise ValueError(f"qpos must be (..., {NQ}) and qvel (..., {NV}) with the same leading shape; "
                             f"got qpos {qpos_hi.shape}, qvel {qvel_hi.shape}")
        return cls(qpos=jnp.asarray(qpos_hi), qvel=jnp.asarray(qvel_hi), qpos_lo=jnp.asarray(qpos_lo),
                   qvel_lo=jnp.asarray(qvel_lo))

    def as_float64(self) -> tuple[np.ndarray, np.ndarray]:
        """Host-side float64 ``(qpos, qvel)`` = hi + lo, each (..., 9) (concrete arrays only)."""
        qpos = np.asarray(self.qpos, np.float64) + np.asarray(self.qpos_lo, np.float64)
        qvel = np.asarray(self.qvel, np.float64) + np.asarray(self.qvel_lo, np.float64)
        return qpos, qvel


def _split(x: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """float64 x → (hi, lo) in ``dtype`` with hi + lo ≈ x to 2^-48 relative (lo = 0 for float64)."""
    hi = x.astype(dtype)
    lo = (x - hi.astype(np.float64)).astype(dtype)
    return hi, lo


class MujocoRunner:
    """Host side of the ``"mujoco"`` backend: batched environment steps with ``mujoco.rollout``.

    Holds one compiled model, one ``MjData`` per thread and a persistent C thread pool (batches of
    fewer than ``SERIAL_BELOW`` rows run in the calling thread instead); a lock
    serialises concurrent calls (JAX may run callbacks from several threads). ``calls`` and ``rows``
    count host calls and simulated rows (for tests and benchmarks).
    """

    def __init__(self, nthread: int) -> None:
        from mujoco import rollout  # imported lazily: only this backend needs it

        if nthread < 1:
            raise ValueError(f"nthread must be >= 1, got {nthread}")
        self.nthread = int(nthread)
        self.model = cheetah_model.load_model()
        self.datas = [mujoco.MjData(self.model) for _ in range(self.nthread)]
        self._rollout = rollout.Rollout(nthread=self.nthread)
        self._serial = rollout.Rollout(nthread=0)  # runs in the calling thread: no pool hand-off
        self._state_size = mujoco.mj_stateSize(self.model, mujoco.mjtState.mjSTATE_FULLPHYSICS)
        # FULLPHYSICS = [time, qpos, qvel] for this model (no activations, mocap or plugins).
        if self._state_size != 1 + NQ + NV:
            raise ValueError(f"unexpected MuJoCo full-physics state size {self._state_size}")
        self._lock = threading.Lock()
        self.calls = 0
        self.rows = 0

    def close(self) -> None:
        """Releases the thread pool (the runner is unusable afterwards)."""
        self._rollout.close()
        self._serial.close()

    def step64(self, qpos: np.ndarray, qvel: np.ndarray, action: np.ndarray,
               active: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """float64 environment steps: qpos (N, 9), qvel (N, 9), action (N, 6) → qpos', qvel' (N, 9).

        Only rows with ``active`` (N,) True (default: all) and finite inputs are simulated; inactive
        rows come back unchanged, active rows with a non-finite input as NaN.
        """
        n = qpos.shape[0]
        active = np.ones(n, bool) if active is None else np.asarray(active, bool)
        finite = (np.isfinite(qpos).all(-1) & np.isfinite(qvel).all(-1) & np.isfinite(action).all(-1))
        rows = np.flatnonzero(active & finite)
        q1 = np.where(active[:, None], np.nan, qpos)
        v1 = np.where(active[:, None], np.nan, qvel)
        if rows.size:
            state0 = np.zeros((rows.size, self._state_size))
            state0[:, 1:1 + NQ] = qpos[rows]
            state0[:, 1 + NQ:] = qvel[rows]
            ctrl = np.repeat(action[rows][:, None, :], FRAME_SKIP, axis=1)
            warmstart = np.zeros((rows.size, NV))
            pooled = rows.size >= SERIAL_BELOW and self.nthread > 1
            with self._lock:
                states, _ = (self._rollout if pooled else self._serial).rollout(
                    self.model, self.datas if pooled else self.datas[:1], state0, ctrl, nstep=FRAME_SKIP,
                    initial_warmstart=warmstart)
                self.calls += 1
                self.rows += rows.size
            q1[rows] = states[:, -1, 1:1 + NQ]
            v1[rows] = states[:, -1, 1 + NQ:]
        return q1, v1

    def __call__(self, packed: np.ndarray) -> np.ndarray:
        """The ``pure_callback`` body, one array in and one out (each extra callback argument costs about
        as much as a small batch's physics).

        Args:
          packed: (..., 43) float, per row [qpos (9), qpos_lo (9), qvel (9), qvel_lo (9), action (6),
            active (1, 0 or 1)].
        Returns:
          (..., 37) in the same dtype: [qpos (9), qpos_lo (9), qvel (9), qvel_lo (9), dx (1)] after the
          step (inactive rows unchanged, dx = 0).
        """
        packed = np.asarray(packed)
        dtype = packed.dtype
        lead = packed.shape[:-1]
        flat = packed.reshape(math.prod(lead), PACKED_IN).astype(np.float64)
        q0 = flat[:, 0:NQ] + flat[:, NQ:2 * NQ]
        v0 = flat[:, 2 * NQ:2 * NQ + NV] + flat[:, 2 * NQ + NV:2 * NQ + 2 * NV]
        a = flat[:, 2 * NQ + 2 * NV:2 * NQ + 2 * NV + NU]
        q1, v1 = self.step64(q0, v0, a, flat[:, -1] > 0.5)
        q_hi, q_lo = _split(q1, dtype)
        v_hi, v_lo = _split(v1, dtype)
        dx = (q1[:, :1] - q0[:, :1]).astype(dtype)
        return np.concatenate([q_hi, q_lo, v_hi, v_lo, dx], axis=-1).reshape(lead + (PACKED_OUT,))


_RUNNERS: dict[int, MujocoRunner] = {}
_RUNNERS_LOCK = threading.Lock()


def get_runner(nthread: int | None = None) -> MujocoRunner:
    """The process-wide :class:`MujocoRunner` with ``nthread`` threads (default: all usable CPUs)."""
    nthread = default_threads() if nthread is None else int(nthread)
    with _RUNNERS_LOCK:
        if nthread not in _RUNNERS:
            _RUNNERS[nthread] = MujocoRunner(nthread)
        return _RUNNERS[nthread]


def _mujoco_step(physics: Physics, action: jax.Array, active: jax.Array, nthread: int | None
                 ) -> tuple[Physics, jax.Array]:
    runner = get_runner(nthread)
    dtype = physics.qpos.dtype
    lead = physics.qpos.shape[:-1]
    packed = jnp.concatenate([physics.qpos, physics.qpos_lo, physics.qvel, physics.qvel_lo, action.astype(dtype),
                              active.astype(dtype)[..., None]], axis=-1)
    out = jax.pure_callback(runner, jax.ShapeDtypeStruct(lead + (PACKED_OUT,), dtype), packed,
                            vmap_method="broadcast_all")
    fields = jnp.split(out, [NQ, 2 * NQ, 2 * NQ + NV, 2 * NQ + 2 * NV], axis=-1)
    return Physics(qpos=fields[0], qpos_lo=fields[1], qvel=fields[2], qvel_lo=fields[3]), fields[4][..., 0]


@functools.lru_cache(maxsize=1)
def mjx_model():
    """The MJX (device) copy of the model, built once per process."""
    from mujoco import mjx  # imported lazily: heavy, and only this backend needs it

    with jax.ensure_compile_time_eval():  # the first call may come from inside a trace: build concrete arrays
        return mjx.put_model(cheetah_model.load_model())


def _mjx_step(physics: Physics, action: jax.Array, active: jax.Array) -> tuple[Physics, jax.Array]:
    from mujoco import mjx

    mx = mjx_model()
    dtype = physics.qpos.dtype
    lead = physics.qpos.shape[:-1]
    qpos0 = (physics.qpos + physics.qpos_lo).reshape(-1, NQ)
    qvel0 = (physics.qvel + physics.qvel_lo).reshape(-1, NV)
    ctrl = action.astype(dtype).reshape(-1, NU)
    active = active.reshape(-1)
    finite = (jnp.isfinite(qpos0).all(-1) & jnp.isfinite(qvel0).all(-1) & jnp.isfinite(ctrl).all(-1))
    run = (finite & active)[:, None]

    def one(qpos: jax.Array, qvel: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array]:
        data = mjx.make_data(mx).replace(qpos=qpos, qvel=qvel, ctrl=u)  # qacc_warmstart = 0
        data = jax.lax.fori_loop(0, FRAME_SKIP, lambda _, d: mjx.step(mx, d), data)
        return data.qpos, data.qvel

    qpos1, qvel1 = jax.vmap(one)(jnp.where(run, qpos0, 0.0), jnp.where(run, qvel0, 0.0), jnp.where(run, ctrl, 0.0))
    qpos1 = jnp.where(run, qpos1.astype(dtype), jnp.nan)
    qvel1 = jnp.where(run, qvel1.astype(dtype), jnp.nan)
    dx = jnp.where(active, qpos1[:, 0] - qpos0[:, 0], 0.0).reshape(lead)
    stepped = Physics(qpos=qpos1.reshape(lead + (NQ,)), qvel=qvel1.reshape(lead + (NV,)),
                      qpos_lo=jnp.zeros(lead + (NQ,), dtype), qvel_lo=jnp.zeros(lead + (NV,), dtype))
    keep = active.reshape(lead + (1,))
    return jax.tree.map(lambda new, old: jnp.where(keep, new, old), stepped, physics), dx


def physics_step(physics: Physics, action: jax.Array, backend: Backend = "auto", *,
                 active: jax.Array | None = None, nthread: int | None = None) -> tuple[Physics, jax.Array]:
    """One environment step (5 MuJoCo steps, ``ctrl = action``) of every row.

    Args:
      physics: :class:`Physics` with fields (..., 9).
      action: (..., 6) controls (MuJoCo clamps them to [-1, 1]).
      backend: "mujoco", "mjx" or "auto"; static.
      active: optional (...) bool; inactive rows come back unchanged with dx = 0. Default: all active.
      nthread: MuJoCo C threads (default: all usable CPUs); ignored by MJX.
    Returns:
      The next :class:`Physics` and dx (...); active rows with a non-finite input come back as NaN.
    Raises:
      ValueError: unknown backend, or shapes that do not match.
    """
    backend_ = resolve_backend(backend)
    action = jnp.asarray(action)
    lead = physics.qpos.shape[:-1]
    if action.shape != lead + (NU,):
        raise ValueError(f"action must have shape {lead + (NU,)} (the state's leading shape + ({NU},)), "
                         f"got {action.shape}")
    active = jnp.ones(lead, bool) if active is None else jnp.broadcast_to(jnp.asarray(active, bool), lead)
    if backend_ == "mujoco":
        return _mujoco_step(physics, action, active, nthread)
    return _mjx_step(physics, action, active)
