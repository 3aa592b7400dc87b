"""LIBERO-style tabletop as a batched, functional environment (Panda, three objects, a basket; BENCHMARK
§2.4): state (44,), action (7,) in [-1, 1] (tcp displacement, rotation, gripper; :func:`.model.delta_pose_control`),
obs (44+E,), 500 steps. Backends ``"mujoco"`` (MuJoCo C on host threads through ``pure_callback``, the state
as float32 ``hi + lo`` of the float64 FULLPHYSICS vector), ``"mjx"`` (:mod:`.mjx_backend`, float32,
``lo = 0``) and ``"auto"``. Reset: home posture plus noise, basket and objects at random (centres >= 0.13
apart; :func:`sample_layout`), one settling step. Reward :func:`.tasks.reward`, success
:func:`.tasks.success`. The reset distribution: docs/envs.md, "LIBERO".
"""

from __future__ import annotations

import threading
from typing import Final

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from imaginejax.envs.base import Encoder, EnvParams, EpisodeState, TaskEnv, make_level_params
from imaginejax.envs.libero import instructions as instr
from imaginejax.envs.libero import model as M
from imaginejax.envs.libero import tasks
from imaginejax.envs.libero.mjx_backend import MjxPhysics, physics_layout
from imaginejax.envs.mujoco_host import BACKENDS, HostStepper, host_step, resolve_backend

__all__ = ["EnvState", "Libero", "get_stepper", "make_params"]

ENV_NAME: Final[str] = "libero"
RESET_TRIES: Final[int] = 256  # one candidate layout keeps the 0.13 gaps with p ≈ 0.12 (measured)
ARM_NOISE: Final[float] = 0.03
BASKET_LOW: Final[np.ndarray] = np.array([0.50, 0.20, -0.25])
BASKET_HIGH: Final[np.ndarray] = np.array([0.62, 0.30, 0.25])
OBJECT_LOW: Final[np.ndarray] = np.array([0.38, -0.30, -np.pi / 3])
OBJECT_HIGH: Final[np.ndarray] = np.array([0.62, -0.02, np.pi / 3])  # clear of the turned basket
MIN_GAP: Final[float] = 0.13
SETTLE_STEPS: Final[int] = 1


@struct.dataclass
class EnvState(EpisodeState):
    """Environment state: the episode fields of :class:`~imaginejax.envs.base.EpisodeState` and the world
    below; every leaf gets a leading (B,) axis in the batched kernels.

    Attributes:
      hi, lo: (S,) float32 MuJoCo FULLPHYSICS state (S = 71: time, qpos, qvel) as ``hi + lo``
        (:func:`mujoco_host.split64`); with backend "mjx" ``hi`` is MJX's float32 state and ``lo`` is 0.
      ctrl: (9,) float32 servo targets in force (7 joints, 2 fingers).
      vec: (44,) float32 the state vector.
      progress: :class:`tasks.Progress` (first state, stage).
    """

    hi: jax.Array
    lo: jax.Array
    ctrl: jax.Array
    vec: jax.Array
    progress: tasks.Progress


def make_params(level: str, *, embed: Encoder | None = None) -> EnvParams:
    """:class:`EnvParams` of a LIBERO level (goal rows ``[task id, kind, a, b, layout]``; cap 500 steps)."""
    return make_level_params(level, tasks.level_goals(level), instr.level_instruction_table(level),
                             tasks.MAX_STEPS, embed=embed, reset_tries=RESET_TRIES)


_STEPPERS: dict[int | None, HostStepper] = {}
_STEPPERS_LOCK = threading.Lock()


def get_stepper(nthread: int | None = None) -> HostStepper:
    """The process-wide :class:`HostStepper` of the scene (``FRAME_SKIP`` steps, ctrl as control)."""
    with _STEPPERS_LOCK:
        if nthread not in _STEPPERS:
            _STEPPERS[nthread] = HostStepper(M.load_model(), M.FRAME_SKIP, nthread=nthread)
        return _STEPPERS[nthread]


def _yaw_quat(yaw: jax.Array) -> jax.Array:
    zero = jnp.zeros_like(yaw)
    return jnp.stack([jnp.cos(0.5 * yaw), zero, zero, jnp.sin(0.5 * yaw)], -1)


def sample_layout(key: jax.Array, goal: jax.Array, tries: int) -> tuple[jax.Array, jax.Array]:
    """Initial ``qpos`` (37,) and ``ctrl`` (9,) of one episode.

    Args:
      key: PRNG key.
      goal: (GOAL_DIM,) int32 the task's goal row (its layout and object a are read).
      tries: candidate object layouts drawn; the first with all gaps >= ``MIN_GAP`` is used (else the last).
    """
    k_arm, k_basket, k_obj = jax.random.split(key, 3)
    q = jnp.asarray(M.HOME_QPOS, jnp.float32) + jax.random.uniform(k_arm, (7,), minval=-ARM_NOISE, maxval=ARM_NOISE)
    basket = jax.random.uniform(k_basket, (3,), minval=jnp.asarray(BASKET_LOW, jnp.float32),
                                maxval=jnp.asarray(BASKET_HIGH, jnp.float32))
    cand = jax.random.uniform(k_obj, (tries, 3, 3), minval=jnp.asarray(OBJECT_LOW, jnp.float32),
                              maxval=jnp.asarray(OBJECT_HIGH, jnp.float32))
    gaps = jnp.linalg.norm(cand[:, :, None, :2] - cand[:, None, :, :2], axis=-1) + jnp.eye(3) * 10.0
    ok = jnp.all(gaps >= MIN_GAP, axis=(1, 2))
    choice = jnp.where(jnp.any(ok), jnp.argmax(ok), tries - 1)
    xy_yaw = cand[choice]  # (3, 3)
    rest = jnp.asarray(tasks.REST_Z, jnp.float32)
    pos = jnp.concatenate([xy_yaw[:, :2], rest[:, None]], -1)
    quat = _yaw_quat(xy_yaw[:, 2])
    fingers = jnp.full((2,), M.GRIPPER_OPEN, jnp.float32)
    finger_ctrl = fingers
    layout, a = goal[4], jnp.maximum(goal[2], 0)
    onehot = (jnp.arange(3) == a)[:, None]
    # HELD: object a centred on the fingertips, turned with the hand, fingers closed on its width.
    tcp, hand_quat, _, _ = M.fk(q)
    hand_yaw = M.yaw_of(hand_quat)
    held = layout == tasks.HELD
    grasp_dz = jnp.asarray(M.GRASP_DZ, jnp.float32)[a]
    pos = jnp.where(held & onehot, (tcp - jnp.stack([0.0, 0.0, grasp_dz]))[None, :], pos)
    quat = jnp.where(held & onehot, _yaw_quat(hand_yaw)[None, :], quat)
    width = jnp.asarray(M.OBJECT_HALF[:, 1], jnp.float32)[a]
    fingers = jnp.where(held, jnp.full((2,), width - 0.0005), fingers)
    finger_ctrl = jnp.where(held, jnp.zeros((2,)), finger_ctrl)
    # IN_BASKET: object a in the middle of the basket, turned with it.
    in_basket = layout == tasks.IN_BASKET
    inside = jnp.concatenate([basket[:2], rest[a][None] + 2 * M.BASKET_WALL])
    pos = jnp.where(in_basket & onehot, inside[None, :], pos)
    quat = jnp.where(in_basket & onehot, _yaw_quat(basket[2])[None, :], quat)
    objects = jnp.concatenate([pos, quat], -1).reshape(-1)
    basket_pose = jnp.concatenate([basket[:2], jnp.zeros((1,)), _yaw_quat(basket[2])])
    qpos = jnp.concatenate([q, fingers, objects, basket_pose]).astype(jnp.float32)
    ctrl = jnp.concatenate([q, finger_ctrl]).astype(jnp.float32)
    return qpos, ctrl


class Libero(TaskEnv, tasks=tasks, instructions=instr.__name__, make_params=make_params):
    """LIBERO-style tabletop on MuJoCo C or MJX. Stateless; the level lives in the params; the predicates,
    metadata and state vector (``vec``) come from :mod:`.tasks` (:class:`~imaginejax.envs.base.TaskEnv`).

    Args:
      backend: "auto" (MJX on a GPU/TPU, MuJoCo C on a CPU), "mujoco" (MuJoCo C on the host) or "mjx".
      nthread: MuJoCo C threads (default: all usable CPUs; unused by MJX).
    Raises:
      ValueError: an unknown backend (the valid ones are named) or ``nthread < 1``.
    """

    task_salt = 0x11B3

    name: Final[str] = ENV_NAME
    action_dim: Final[int] = M.ACTION_DIM
    num_actions: Final[int] = M.ACTION_DIM
    discrete: Final[bool] = False

    update_progress = staticmethod(tasks.update_progress)

    def __init__(self, backend: str = "auto", nthread: int | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown physics backend {backend!r} for LIBERO; valid backends: {', '.join(BACKENDS)}")
        if nthread is not None and nthread < 1:
            raise ValueError(f"nthread must be >= 1 or None, got {nthread}")
        self.backend = resolve_backend(backend)
        self.nthread = nthread
        self._mjx: MjxPhysics | None = None

    def __repr__(self) -> str:
        return f"Libero(backend={self.backend!r}, nthread={self.nthread})"

    @property
    def stepper(self) -> HostStepper:
        """The process-wide MuJoCo C stepper (built on first use)."""
        return get_stepper(self.nthread)

    @property
    def mjx(self) -> MjxPhysics:
        """The scene on MJX (backend "mjx"; built on first use)."""
        if self.backend != "mjx":
            raise ValueError(f"this environment uses backend {self.backend!r}; Libero(backend='mjx') has MJX")
        if self._mjx is None:
            self._mjx = MjxPhysics()
        return self._mjx

    # ------------------------------------------------------------------ physics
    @staticmethod
    def _qpos(hi: jax.Array) -> jax.Array:
        return hi[..., physics_layout()[0]["qpos"]]

    @staticmethod
    def physics_from_qpos(qpos: jax.Array) -> tuple[jax.Array, jax.Array]:
        """FULLPHYSICS (hi, lo) (B, S) of qpos (B, 37) with zero velocities and time (both backends' layout)."""
        layout, width = physics_layout()
        hi = jnp.zeros(qpos.shape[:-1] + (width,), jnp.float32).at[..., layout["qpos"]].set(qpos)
        return hi, jnp.zeros_like(hi)

    def _advance(self, hi: jax.Array, lo: jax.Array, ctrl: jax.Array, active: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
        """One environment step of the active rows (inactive rows are not simulated on the host and stay
        unchanged; MJX computes them under ``vmap`` and keeps the old values)."""
        if self.backend == "mjx":
            return self.mjx.step(hi + lo, ctrl, active), jnp.zeros_like(lo)
        control = jnp.where(active[:, None], ctrl, jnp.nan)
        new_hi, new_lo, _ = host_step(self.stepper, hi, lo, control)
        keep = active[:, None]
        return jnp.where(keep, new_hi, hi), jnp.where(keep, new_lo, lo)

    # ------------------------------------------------------------------ batched kernels
    def reset_to_task_batch(self, keys: jax.Array, params: EnvParams, task: jax.Array,
                            phrasing: jax.Array | None = None) -> tuple[jax.Array, EnvState]:
        """Resets B environments to given tasks (:meth:`TaskEnv.reset_to_task_batch`): obs (B, 44+E), state."""
        batch = keys.shape[0]
        split = jax.vmap(lambda k: jax.random.split(k, 2))(keys)
        k_phr, k_layout = split[:, 0], split[:, 1]
        task, instruction = self.task_instruction(k_phr, params, task, phrasing)
        goal = params.goals[task]
        qpos, ctrl = jax.vmap(lambda k, g: sample_layout(k, g, params.reset_tries))(k_layout, goal)
        hi, lo = self.physics_from_qpos(qpos)
        active = jnp.ones((batch,), bool)
        for _ in range(SETTLE_STEPS):
            hi, lo = self._advance(hi, lo, ctrl, active)
        vec = tasks.state_from_qpos(self._qpos(hi))
        state = EnvState(hi=hi, lo=lo, ctrl=ctrl, vec=vec, progress=tasks.Progress.initial(vec),
                         **self.episode_start(task, instruction))
        return self.observation_batch(state, params), state

    def step_batch(self, keys: jax.Array, state: EnvState, action: jax.Array, params: EnvParams
                   ) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict[str, jax.Array]]:
        """Steps B environments (MuJoCo C: one host call for the batch; MJX: pure JAX).

        Args:
          keys: (B,) PRNG keys (unused: deterministic physics; kept for the gymnax signature).
          state: batched :class:`EnvState`.
          action: (B, 7) float in [-1, 1] (clipped).
          params: the level's :class:`EnvParams`.
        Returns: obs (B, 44+E), next state, reward (B,) float32, done (B,), info {"success", "truncated"}.
        """
        del keys
        batch = state.t.shape[0]
        action = jnp.asarray(action, jnp.float32)
        if action.shape != (batch, M.ACTION_DIM):
            raise ValueError(f"action must have shape ({batch}, {M.ACTION_DIM}) for a batch of {batch} states, "
                             f"got {action.shape}")
        active = ~state.done
        ctrl = M.delta_pose_control(state.vec[:, 0:7], state.ctrl[:, 0:7], action)
        hi, lo = self._advance(state.hi, state.lo, ctrl, active)
        vec = jnp.where(active[:, None], tasks.state_from_qpos(self._qpos(hi)), state.vec)
        goal = params.goals[state.task]
        progress = tasks.update_progress(state.progress, vec, goal)
        succeeded = tasks.success(vec, goal, progress) & active
        reward = jnp.where(active, tasks.reward(state.vec, vec, goal, state.progress, progress), 0.0)
        t = state.t + active.astype(jnp.int32)
        done, success, info = self.episode_flags(state, succeeded, t, params)
        next_state = state.replace(hi=hi, lo=lo, ctrl=jnp.where(active[:, None], ctrl, state.ctrl), vec=vec,
                                   progress=progress, t=t, done=done, success=success)
        return self.observation_batch(next_state, params), next_state, reward.astype(jnp.float32), done, info
