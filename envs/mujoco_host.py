"""Generic batched MuJoCo C stepping on host threads, reachable from inside ``jit`` (any MjModel)::

    stepper = HostStepper([model_a, model_b], frame_skip=5, control_spec=CTRL | MOCAP_POS)
    state64, sensors64 = stepper.step64(state64 (N, S), control64 (N, C), scene (N,))   # NumPy, float64
    hi, lo, sensors = host_step(stepper, hi, lo, control, scene)                      # JAX, jit/vmap/scan

A state is the row's scene's ``mjSTATE_FULLPHYSICS`` vector zero-padded to the widest scene, a control
the ``control_spec`` part (mocap poses are control); all rows of a call run in one ``mujoco.rollout`` per
scene, ``frame_skip`` steps with controls held, from a zero warm start. ``readout`` sensors are those of
the final state. JAX carries float64 as float32 ``hi + lo`` (:func:`split64`) or bit patterns
(:func:`pack64`); non-finite rows come back NaN. The reasons: docs/envs.md, "MuJoCo C on host threads".
"""

from __future__ import annotations

import math
import os
import threading
from typing import Final, Iterator, Literal, Sequence

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

__all__ = [
    "BACKENDS",
    "Backend",
    "FULLPHYSICS",
    "HostStepper",
    "default_threads",
    "host_sensors",
    "host_step",
    "join64",
    "pack64",
    "resolve_backend",
    "split64",
    "unpack64",
    "state_layout",
]

FULLPHYSICS: Final[int] = int(mujoco.mjtState.mjSTATE_FULLPHYSICS.value)
_CTRL: Final[int] = int(mujoco.mjtState.mjSTATE_CTRL.value)
_USER: Final[int] = int(mujoco.mjtState.mjSTATE_USER.value)
# Sensor stages that the readout can reproduce (evaluated before the extra step's controls matter).
_READOUT_STAGES: Final[tuple[int, ...]] = (int(mujoco.mjtStage.mjSTAGE_POS), int(mujoco.mjtStage.mjSTAGE_VEL),
                                           int(mujoco.mjtStage.mjSTAGE_NONE))


Backend = Literal["auto", "mujoco", "mjx"]
BACKENDS: Final[tuple[str, ...]] = ("auto", "mujoco", "mjx")


def resolve_backend(backend: str) -> Literal["mujoco", "mjx"]:
    """The physics backend of a MuJoCo environment: ``"auto"`` → ``"mjx"`` on an accelerator (GPU/TPU),
    ``"mujoco"`` (MuJoCo C on host threads) on a CPU; ``"mujoco"`` / ``"mjx"`` unchanged.

    Raises: ValueError naming the valid choices.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown physics backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if backend == "auto":
        return "mujoco" if jax.default_backend() == "cpu" else "mjx"
    return backend  # type: ignore[return-value]


def default_threads() -> int:
    """Number of CPUs this process may run on (size of the C thread pool)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def state_layout(model: mujoco.MjModel, spec: int = FULLPHYSICS) -> dict[str, slice]:
    """Slices of each component inside a ``spec`` state vector of ``model`` (``mj_getState`` order).

    Returns: component name (lower case, e.g. ``"qpos"``, ``"mocap_pos"``, ``"ctrl"``) → slice; components
    of size 0 are included with empty slices.
    """
    out: dict[str, slice] = {}
    start = 0
    bit = 1
    while bit <= spec:
        if spec & bit:
            member = mujoco.mjtState(bit)
            size = mujoco.mj_stateSize(model, bit)
            out[member.name.removeprefix("mjSTATE_").lower()] = slice(start, start + size)
            start += size
        bit <<= 1
    return out


def split64(x: np.ndarray, dtype: np.dtype | type = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``x`` → ``(hi, lo)`` in ``dtype`` with ``hi + lo`` ≈ x (relative error ≤ 2^-48 for float32;
    lo = 0 for float64). Any shape."""
    x = np.asarray(x, np.float64)
    hi = x.astype(dtype)
    lo = (x - hi.astype(np.float64)).astype(dtype)
    return hi, lo


def join64(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """``(hi, lo)`` → float64 ``hi + lo`` (inverse of :func:`split64`)."""
    return np.asarray(hi, np.float64) + np.asarray(lo, np.float64)


def pack64(x: np.ndarray) -> np.ndarray:
    """float64 (..., n) → uint32 (..., n, 2): the exact bit pattern, for JAX without x64.

    Use it for state that JAX only carries and never computes with (the host reads it back bit for bit
    with :func:`unpack64`); :func:`split64` is for values that JAX code also reads as numbers.
    """
    x = np.ascontiguousarray(x, np.float64)
    return x.view(np.uint32).reshape(x.shape + (2,))


def unpack64(bits: np.ndarray) -> np.ndarray:
    """uint32 (..., n, 2) → float64 (..., n) (inverse of :func:`pack64`)."""
    bits = np.ascontiguousarray(bits, np.uint32)
    if bits.shape[-1:] != (2,):
        raise ValueError(f"packed float64 arrays end in an axis of 2 uint32 words, got shape {bits.shape}")
    return bits.view(np.float64).reshape(bits.shape[:-1])


class HostStepper:
    """Batched ``frame_skip``-step MuJoCo C stepping of one or more scenes on a persistent thread pool.

    Attributes:
      models: the scenes' compiled models (row ``i`` of a call uses ``models[scene[i]]``).
      frame_skip: MuJoCo steps per call, controls held.
      control_spec: ``mjtState`` bits of a control vector (subset of ``mjSTATE_USER``).
      readout: also return ``sensordata`` on the final state (position and velocity sensors only).
      state_width / control_width / sensor_width: padded widths S, C, N_s (max over scenes).
      state_sizes / control_sizes / sensor_sizes: per-scene widths.
      calls / rows: host calls made and rows simulated so far (tests and benchmarks read them).
    """

    def __init__(self, models: mujoco.MjModel | Sequence[mujoco.MjModel], frame_skip: int, *,
                 control_spec: int = _CTRL, nthread: int | None = None, readout: bool = False) -> None:
        from mujoco import rollout  # imported lazily: only this backend needs it

        self.models: tuple[mujoco.MjModel, ...] = (models,) if isinstance(models, mujoco.MjModel) else tuple(models)
        if not self.models:
            raise ValueError("models must hold at least one MjModel")
        if frame_skip < 1:
            raise ValueError(f"frame_skip must be >= 1, got {frame_skip}")
        control_spec = int(control_spec)
        if control_spec & ~_USER:
            raise ValueError("control_spec may only contain mjSTATE_USER bits (ctrl, qfrc_applied, xfrc_applied, "
                             f"eq_active, mocap_pos, mocap_quat, userdata); got {control_spec:#x}")
        self.frame_skip = int(frame_skip)
        self.control_spec = control_spec
        self.readout = bool(readout)
        self.nthread = default_threads() if nthread is None else int(nthread)
        if self.nthread < 1:
            raise ValueError(f"nthread must be >= 1, got {self.nthread}")
        if self.readout:
            for g, m in enumerate(self.models):
                stages = set(int(s) for s in m.sensor_needstage)
                if not stages <= set(_READOUT_STAGES):
                    raise ValueError(f"scene {g}: readout supports position/velocity sensors only; the model has "
                                     "acceleration-stage sensors (drop them or use readout=False)")
        self.state_sizes = tuple(mujoco.mj_stateSize(m, FULLPHYSICS) for m in self.models)
        self.control_sizes = tuple(mujoco.mj_stateSize(m, control_spec) for m in self.models)
        self.sensor_sizes = tuple(int(m.nsensordata) if self.readout else 0 for m in self.models)
        self.state_width = max(self.state_sizes)
        self.control_width = max(self.control_sizes)
        self.sensor_width = max(self.sensor_sizes)
        self._datas = [[mujoco.MjData(m) for _ in range(self.nthread)] for m in self.models]
        self._rollout = rollout.Rollout(nthread=self.nthread)
        self._lock = threading.Lock()
        self.calls = 0
        self.rows = 0

    def close(self) -> None:
        """Releases the thread pool (the stepper is unusable afterwards)."""
        self._rollout.close()

    # ------------------------------------------------------------------ host (NumPy) interface
    def _batch(self, state: np.ndarray, control: np.ndarray, scene: np.ndarray | None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A host call's input checked against the stepper: state (N, S) and control (N, C) as contiguous
        float64, scene (N,) int64 (all 0 when None), and finite (N,) bool, the rows whose state and control
        are finite (the only ones simulated)."""
        state = np.ascontiguousarray(state, np.float64)
        control = np.ascontiguousarray(control, np.float64)
        n = state.shape[0]
        scene = np.zeros(n, np.int64) if scene is None else np.asarray(scene, np.int64).reshape(-1)
        if state.shape != (n, self.state_width):
            raise ValueError(f"state must be (N, {self.state_width}) (padded FULLPHYSICS vectors), got {state.shape}")
        if control.shape != (n, self.control_width):
            raise ValueError(f"control must be (N, {self.control_width}), got {control.shape}")
        if scene.shape != (n,):
            raise ValueError(f"scene must be (N,) = ({n},), got {scene.shape}")
        if n and (scene.min() < 0 or scene.max() >= len(self.models)):
            raise ValueError(f"scene indices must lie in [0, {len(self.models)}), got {scene.min()}..{scene.max()}")
        finite = np.isfinite(state).all(-1) & np.isfinite(control).all(-1)
        return state, control, scene, finite

    def _rollouts(self, state: np.ndarray, control: np.ndarray, scene: np.ndarray, finite: np.ndarray,
                  nstep: int) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """Each scene's finite rows rolled out for ``nstep`` MuJoCo steps, controls held, from a zero warm
        start (the caller holds the lock): (scene g, rows (R,), states (R, nstep, S_g) after each step,
        sensordata (R, nstep, N_g) at the start of each step), unpadded."""
        for g, model in enumerate(self.models):
            rows = np.flatnonzero((scene == g) & finite)
            if rows.size == 0:
                continue
            ctrl = np.repeat(control[rows, None, :self.control_sizes[g]], nstep, axis=1)
            states, sensors = self._rollout.rollout(
                model, self._datas[g], state[rows, :self.state_sizes[g]], ctrl, control_spec=self.control_spec,
                nstep=nstep, initial_warmstart=np.zeros((rows.size, model.nv)))
            yield g, rows, states, sensors

    def run64(self, state: np.ndarray, control: np.ndarray, scene: np.ndarray | None = None, *,
              nstep: int | None = None, sensors_before_last: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """float64 stepping: state (N, S), control (N, C) held for ``nstep`` (default ``frame_skip``) steps.

        Args:
          state: (N, S) padded FULLPHYSICS states.
          control: (N, C) padded control vectors.
          scene: (N,) int scene index per row (default all 0).
          nstep: MuJoCo steps (>= 1).
          sensors_before_last: return the sensors evaluated at the start of the last step (what
            ``MjData`` holds right after ``mj_step`` without a further ``mj_forward``) instead of on the
            final state; no extra step is run.
        Returns:
          state' (N, S) after the steps (padding zero) and sensordata (N, N_s) (zeros when ``readout`` is
          False). Rows with a non-finite input come back as NaN.
        """
        state, control, scene, finite = self._batch(state, control, scene)
        nstep = self.frame_skip if nstep is None else int(nstep)
        if nstep < 1:
            raise ValueError(f"nstep must be >= 1, got {nstep}")
        extra = 1 if self.readout and not sensors_before_last else 0
        out_state = np.zeros((state.shape[0], self.state_width))
        out_sensor = np.zeros((state.shape[0], self.sensor_width))
        with self._lock:
            for g, rows, states, sensors in self._rollouts(state, control, scene, finite, nstep + extra):
                out_state[rows, :self.state_sizes[g]] = states[:, nstep - 1]
                if self.readout:
                    out_sensor[rows, :self.sensor_sizes[g]] = sensors[:, nstep - 1 + extra]
            self.calls += 1
            self.rows += state.shape[0]
        out_state[~finite] = np.nan
        out_sensor[~finite] = np.nan
        return out_state, out_sensor

    def trajectory64(self, state: np.ndarray, control: np.ndarray, scene: np.ndarray | None = None, *,
                     nstep: int) -> tuple[np.ndarray, np.ndarray]:
        """Every intermediate MuJoCo step: states (N, nstep, S) after each step and sensordata (N, nstep, N_s)
        evaluated at the *start* of each step (MuJoCo's order: sensors of state k-1 are computed by step k).
        Controls are held; non-finite rows are NaN."""
        state, control, scene, finite = self._batch(state, control, scene)
        if nstep < 1:
            raise ValueError(f"nstep must be >= 1, got {nstep}")
        out_state = np.zeros((state.shape[0], nstep, self.state_width))
        out_sensor = np.zeros((state.shape[0], nstep, self.sensor_width))
        with self._lock:
            for g, rows, states, sensors in self._rollouts(state, control, scene, finite, nstep):
                out_state[rows, :, :self.state_sizes[g]] = states
                if self.readout:
                    out_sensor[rows, :, :self.sensor_sizes[g]] = sensors
            self.calls += 1
            self.rows += state.shape[0]
        out_state[~finite] = np.nan
        out_sensor[~finite] = np.nan
        return out_state, out_sensor

    def step64(self, state: np.ndarray, control: np.ndarray, scene: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """One environment step (``frame_skip`` MuJoCo steps) of every row; see :meth:`run64`."""
        return self.run64(state, control, scene)

    def sensors64(self, state: np.ndarray, control: np.ndarray, scene: np.ndarray | None = None) -> np.ndarray:
        """``sensordata`` (N, N_s) evaluated on the given states without stepping them (readout only).

        ``control`` (N, C) matters where sensors see mocap bodies (mocap poses are control, not state).
        """
        if not self.readout:
            raise ValueError("sensors64 needs a stepper built with readout=True")
        state, control, scene, finite = self._batch(state, control, scene)
        out = np.zeros((state.shape[0], self.sensor_width))
        with self._lock:
            for g, rows, _, sensors in self._rollouts(state, control, scene, finite, 1):
                out[rows, :self.sensor_sizes[g]] = sensors[:, 0]
        out[~finite] = np.nan
        return out

    def _step_callback(self, hi: np.ndarray, lo: np.ndarray, control: np.ndarray, control_lo: np.ndarray,
                       scene: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dtype = np.asarray(hi).dtype
        lead = np.shape(hi)[:-1]
        n = math.prod(lead)
        state = join64(np.reshape(hi, (n, self.state_width)), np.reshape(lo, (n, self.state_width)))
        control64 = join64(np.reshape(control, (n, self.control_width)), np.reshape(control_lo, (n, self.control_width)))
        new_state, sensors = self.step64(state, control64, np.asarray(scene).reshape(n))
        new_hi, new_lo = split64(new_state, dtype)
        return (new_hi.reshape(lead + (self.state_width,)), new_lo.reshape(lead + (self.state_width,)),
                sensors.astype(dtype).reshape(lead + (self.sensor_width,)))

    def _sensor_callback(self, hi: np.ndarray, lo: np.ndarray, control: np.ndarray, scene: np.ndarray) -> np.ndarray:
        dtype = np.asarray(hi).dtype
        lead = np.shape(hi)[:-1]
        n = math.prod(lead)
        state = join64(np.reshape(hi, (n, self.state_width)), np.reshape(lo, (n, self.state_width)))
        sensors = self.sensors64(state, np.asarray(control, np.float64).reshape(n, self.control_width),
                                 np.asarray(scene).reshape(n))
        return sensors.astype(dtype).reshape(lead + (self.sensor_width,))


def host_step(stepper: HostStepper, hi: jax.Array, lo: jax.Array, control: jax.Array,
              scene: jax.Array | int = 0, control_lo: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One environment step of every row on the host, usable under ``jit``, ``vmap`` (one host call for the
    whole batch) and ``lax.scan``; not differentiable.

    Args:
      stepper: the :class:`HostStepper` (static; its models define the widths).
      hi, lo: (..., S) float state as high and low parts (:func:`split64`; zero ``lo`` is fine).
      control: (..., C) controls (cast to ``hi``'s dtype).
      scene: (...) int scene index per row, or a scalar for all rows.
      control_lo: optional (..., C) low parts of the controls (float64 = control + control_lo on the host),
        for controls that carry float64 values such as accumulated mocap positions; default zeros.
    Returns:
      ``(hi', lo', sensordata)``: (..., S), (..., S), (..., N_s) in ``hi``'s dtype.
    """
    hi = jnp.asarray(hi)
    dtype = hi.dtype
    lead = hi.shape[:-1]
    if hi.shape[-1:] != (stepper.state_width,) or jnp.shape(lo) != hi.shape:
        raise ValueError(f"hi and lo must both be (..., {stepper.state_width}); got {hi.shape} and {jnp.shape(lo)}")
    control = jnp.asarray(control, dtype)
    if control.shape != lead + (stepper.control_width,):
        raise ValueError(f"control must be {lead + (stepper.control_width,)} (state's leading shape + "
                         f"({stepper.control_width},)), got {control.shape}")
    control_lo = jnp.zeros_like(control) if control_lo is None else jnp.asarray(control_lo, dtype)
    if control_lo.shape != control.shape:
        raise ValueError(f"control_lo must have the control's shape {control.shape}, got {control_lo.shape}")
    scene = jnp.broadcast_to(jnp.asarray(scene, jnp.int32), lead)
    out_types = (jax.ShapeDtypeStruct(lead + (stepper.state_width,), dtype),
                 jax.ShapeDtypeStruct(lead + (stepper.state_width,), dtype),
                 jax.ShapeDtypeStruct(lead + (stepper.sensor_width,), dtype))
    return jax.pure_callback(stepper._step_callback, out_types, hi, jnp.asarray(lo, dtype), control, control_lo,
                             scene, vmap_method="broadcast_all")


def host_sensors(stepper: HostStepper, hi: jax.Array, lo: jax.Array, control: jax.Array,
                 scene: jax.Array | int = 0) -> jax.Array:
    """``sensordata`` (..., N_s) of states (..., S) with controls (..., C) (mocap poses), without stepping.

    Needs a ``readout`` stepper; usable under ``jit`` / ``vmap`` / ``scan`` like :func:`host_step`.
    """
    hi = jnp.asarray(hi)
    lead = hi.shape[:-1]
    if hi.shape[-1:] != (stepper.state_width,) or jnp.shape(lo) != hi.shape:
        raise ValueError(f"hi and lo must both be (..., {stepper.state_width}); got {hi.shape} and {jnp.shape(lo)}")
    control = jnp.asarray(control, hi.dtype)
    if control.shape != lead + (stepper.control_width,):
        raise ValueError(f"control must be {lead + (stepper.control_width,)}, got {control.shape}")
    scene = jnp.broadcast_to(jnp.asarray(scene, jnp.int32), lead)
    out_type = jax.ShapeDtypeStruct(lead + (stepper.sensor_width,), hi.dtype)
    return jax.pure_callback(stepper._sensor_callback, out_type, hi, jnp.asarray(lo, hi.dtype), control, scene,
                             vmap_method="broadcast_all")
