"""Meta-World (Sawyer, mocap hand) as a batched, functional environment: state (91,), action (4,) in
[-1, 1], obs (91+E,), 100 steps; backends ``"mujoco"`` (MuJoCo C on host threads through
``pure_callback``, Meta-World's own models), ``"mjx"`` (:mod:`.mjx_backend` on :mod:`.mjx_model`'s
models) and ``"auto"``.

The action moves the hand's mocap target by ``clip(Δ, -1, 1) / 100`` (within the task's bounds) and sets
the fingers to ``(g, -g)``, 5 MuJoCo steps of 2.5 ms; reset runs Meta-World's reset procedure from a random
vector drawn from the key (:mod:`.host`); one unused entity slot holds a distractor (a pose drawn at
reset plus ``DISTRACTOR_JITTER`` noise per step). Reward: 10 when success first holds, else the change of
Meta-World's dense reward. Details: docs/envs.md, "Meta-World".
"""

from __future__ import annotations

from typing import Final, Literal

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from imaginejax.envs.base import Encoder, EnvParams, EpisodeState, TaskEnv, make_level_params
from imaginejax.envs.mujoco_host import Backend, resolve_backend
from imaginejax.envs.metaworld import instructions as instr
from imaginejax.envs.metaworld import tasks
from imaginejax.envs.metaworld.host import get_host
from imaginejax.envs.metaworld.scenes import SENSOR_DIM

__all__ = ["DISTRACTOR_JITTER", "EnvState", "MetaWorld", "make_params"]

ENV_NAME: Final[str] = "metaworld"
RESET_CANDIDATES: Final[int] = 16  # random vectors drawn per reset for Meta-World's rejection rule
DISTRACTOR_LOW: Final[np.ndarray] = np.array([-0.3, 0.45, 0.0], np.float32)
DISTRACTOR_HIGH: Final[np.ndarray] = np.array([0.3, 0.9, 0.3], np.float32)
DISTRACTOR_JITTER: Final[float] = 0.005
CPU_MJX_CHUNK: Final[int] = 4  # rows per MJX chunk on a CPU (MetaWorld(mjx_chunk="auto"); mjx_backend.MjxPhysics)


@struct.dataclass
class EnvState(EpisodeState):
    """Environment state: the episode fields of :class:`~imaginejax.envs.base.EpisodeState` and the world
    below; every leaf gets a leading (B,) axis in the batched kernels.

    Attributes:
      phys: (S, 2) uint32 MuJoCo FULLPHYSICS state, the float64 bit pattern (exact; only the host reads it);
        with backend "mjx" (S,) float32 (the same layout, rounded).
      ctrl: (C, 2) uint32 control vector (actuators, mocap poses: the hand's target), float64 bits; with
        backend "mjx" (C,) float32.
      sensors: (39,) float32 observables of the current physics state (:mod:`.scenes` layout).
      consts: (18,) float32 episode constants (:class:`.tasks.Extras`).
      vec: (91,) float32 the current 91-d state, distractor included.
      dense: () float32 Meta-World's dense reward of the current state.
      distractor: () int32 the distractor's slot; distractor_pose (7,) its pose at reset.
      reset_vector: (RAND_DIM,) float32 Meta-World's random reset vector of the episode (provenance:
        Meta-World's own env reset with it starts from the same state).
    """

    phys: jax.Array
    ctrl: jax.Array
    sensors: jax.Array
    consts: jax.Array
    vec: jax.Array
    dense: jax.Array
    distractor: jax.Array
    distractor_pose: jax.Array
    reset_vector: jax.Array


def make_params(level: str, *, embed: Encoder | None = None) -> EnvParams:
    """:class:`EnvParams` of a Meta-World level (goal rows ``[task id, index]``; cap 100 steps)."""
    return make_level_params(level, tasks.level_goals(level), instr.level_instruction_table(level),
                             tasks.MAX_STEPS, embed=embed, reset_tries=RESET_CANDIDATES)


def _distractor_pose(key: jax.Array) -> jax.Array:
    k_pos, k_quat = jax.random.split(key)
    pos = jax.random.uniform(k_pos, (3,), minval=jnp.asarray(DISTRACTOR_LOW), maxval=jnp.asarray(DISTRACTOR_HIGH))
    quat = jax.random.normal(k_quat, (4,))
    quat = quat / jnp.linalg.norm(quat)
    return jnp.concatenate([pos, quat * jnp.sign(quat[0] + 1e-12)])


def _with_distractor(vec: jax.Array, slot: jax.Array, pose: jax.Array) -> jax.Array:
    """(B, 91) states with slot ``slot`` (B,) set to ``pose`` (B, 7)."""
    onehot = jnp.arange(tasks.NUM_SLOTS)[None, :] == slot[:, None]  # (B, 12)
    slots = vec[:, tasks.SLOT_START:].reshape(vec.shape[0], tasks.NUM_SLOTS, tasks.SLOT_DIM)
    slots = jnp.where(onehot[..., None], pose[:, None, :], slots)
    return jnp.concatenate([vec[:, :tasks.SLOT_START], slots.reshape(vec.shape[0], -1)], -1)


class MetaWorld(TaskEnv, tasks=tasks, instructions=instr.__name__, make_params=make_params):
    """Meta-World on MuJoCo C or MJX. Stateless; the level lives in the params; the predicates, metadata and
    state vector (``vec``) come from :mod:`.tasks` (:class:`~imaginejax.envs.base.TaskEnv`).

    Args:
      nthread: MuJoCo C threads (default: all usable CPUs).
      backend: "auto" (MJX on an accelerator, MuJoCo C on a CPU), "mujoco" or "mjx".
      tasks: MJX only: names of the tasks whose models the step compiles in (default: all 22).
      mjx_chunk: MJX only: rows the physics kernel simulates together (:class:`.mjx_backend.MjxPhysics`
        ``chunk``; None: the whole batch in one vmap). Default "auto": None on an accelerator, 4 on a CPU.
    Raises:
      ValueError: unknown backend or task name; ``tasks`` with the MuJoCo C backend.
    """

    task_salt = 0x3E7A

    name: Final[str] = ENV_NAME
    action_dim: Final[int] = 4
    discrete: Final[bool] = False

    def __init__(self, nthread: int | None = None, backend: Backend = "auto",
                 tasks: tuple[str, ...] | None = None, mjx_chunk: int | None | Literal["auto"] = "auto") -> None:
        self._nthread = nthread
        self.backend = resolve_backend(backend)
        if mjx_chunk not in (None, "auto") and self.backend != "mjx":
            raise ValueError("mjx_chunk sets how many rows the MJX kernel simulates together; the MuJoCo C backend "
                             "has none (drop mjx_chunk= or use backend='mjx')")
        if mjx_chunk == "auto":
            mjx_chunk = CPU_MJX_CHUNK if self.backend == "mjx" and jax.default_backend() == "cpu" else None
        self._mjx_chunk = mjx_chunk
        if tasks is not None and self.backend != "mjx":
            raise ValueError("tasks= selects the models compiled into the MJX step; the MuJoCo C backend serves "
                             "every task (drop tasks= or use backend='mjx')")
        if tasks is not None:
            from imaginejax.envs.metaworld.mjx_backend import task_names

            tasks = task_names(tasks)  # fails early, with the valid names
        self._mjx_tasks = tasks
        self._mjx = None

    def __repr__(self) -> str:
        return (f"MetaWorld(backend={self.backend!r}, nthread={self._nthread}, tasks={self._mjx_tasks}, "
                f"mjx_chunk={self._mjx_chunk})")

    @property
    def host(self):
        """The process-wide host side (models, stepper, reset); built on first use. With backend "mjx" its
        models are the MJX-friendly ones (the reset runs there)."""
        return get_host(self._nthread, mjx_friendly=self.backend == "mjx")

    @property
    def mjx(self):
        """The :class:`.mjx_backend.MjxPhysics` of backend "mjx" (built on first use)."""
        if self.backend != "mjx":
            raise ValueError(f"this environment uses backend {self.backend!r}; MetaWorld(backend='mjx') has MJX")
        if self._mjx is None:
            from imaginejax.envs.metaworld.mjx_backend import MjxPhysics

            self._mjx = MjxPhysics(self.host, self._mjx_tasks, chunk=self._mjx_chunk)
        return self._mjx

    @staticmethod
    def task_id(state: EnvState, params: EnvParams) -> jax.Array:
        """(...) index into :data:`tasks.TASKS` of each row's task."""
        return params.goals[state.task, 0]

    # ------------------------------------------------------------------ batched kernels
    def reset_to_task_batch(self, keys: jax.Array, params: EnvParams, task: jax.Array,
                            phrasing: jax.Array | None = None) -> tuple[jax.Array, EnvState]:
        """Resets B environments to given tasks (:meth:`TaskEnv.reset_to_task_batch`): obs (B, 91+E), state."""
        batch = keys.shape[0]
        split = jax.vmap(lambda k: jax.random.split(k, 4))(keys)
        k_phr, k_rand, k_slot, k_pose = split[:, 0], split[:, 1], split[:, 2], split[:, 3]
        task, instruction = self.task_instruction(k_phr, params, task, phrasing)
        tid = params.goals[task, 0]

        low, high = jnp.asarray(tasks.RAND_LOW)[tid], jnp.asarray(tasks.RAND_HIGH)[tid]  # (B, R)
        tries = params.reset_tries
        u = jax.vmap(lambda k: jax.random.uniform(k, (tries, tasks.RAND_DIM)))(k_rand)  # (B, T, R)
        cand = low[:, None, :] + u * (high - low)[:, None, :]
        gap = jnp.linalg.norm(cand[..., 0:2] - cand[..., 3:5], axis=-1)
        ok = gap >= jnp.asarray(tasks.MIN_XY_GAP)[tid][:, None]
        rand = jnp.take_along_axis(cand, jnp.argmax(ok, axis=1)[:, None, None], axis=1)[:, 0]

        if self.backend == "mjx":  # Meta-World's reset procedure in JAX (float32), the step's physics kernel
            phys, ctrl, consts, sensors = self.mjx.reset(tid, rand.astype(jnp.float32))
        else:  # on the host (float64, bit-exact state)
            host = self.host
            out_types = (jax.ShapeDtypeStruct((batch, host.state_width, 2), jnp.uint32),
                         jax.ShapeDtypeStruct((batch, host.control_width, 2), jnp.uint32),
                         jax.ShapeDtypeStruct((batch, tasks.CONST_DIM), jnp.float32),
                         jax.ShapeDtypeStruct((batch, SENSOR_DIM), jnp.float32))
            phys, ctrl, consts, sensors = jax.pure_callback(
                host._reset_callback, out_types, tid, rand.astype(jnp.float32),
                vmap_method="broadcast_all")

        free = ~jnp.asarray(tasks.SLOT_USED)[tid]  # (B, 12)
        slot = jax.vmap(lambda k, f: jax.random.choice(k, tasks.NUM_SLOTS, p=f / f.sum()))(k_slot, free.astype(jnp.float32))
        pose = jax.vmap(_distractor_pose)(k_pose)
        vec = _with_distractor(tasks.state_from_sensors(sensors, tid, consts[:, 0:3]), slot, pose)
        extras = tasks.extras_from_sensors(sensors, consts)
        dense = tasks.dense_reward(vec, tid, jnp.zeros((batch, 4)), extras)
        state = EnvState(phys=phys, ctrl=ctrl, sensors=sensors,
                         consts=consts, vec=vec, dense=dense, distractor=slot.astype(jnp.int32), distractor_pose=pose,
                         reset_vector=rand.astype(jnp.float32), **self.episode_start(task, instruction))
        return self.observation_batch(state, params), state

    def step_batch(self, keys: jax.Array, state: EnvState, action: jax.Array, params: EnvParams
                   ) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict[str, jax.Array]]:
        """Steps B environments.

        Args:
          keys: (B,) PRNG keys (the distractor's jitter).
          state: batched :class:`EnvState`.
          action: (B, 4) float.
          params: the level's :class:`EnvParams`.
        Returns: obs (B, 91+E), next state, reward (B,), done (B,), info {"success", "truncated"}.
        """
        batch = state.vec.shape[0]
        action = jnp.asarray(action, jnp.float32)
        chex.assert_shape(action, (batch, 4))
        tid = params.goals[state.task, 0]
        active = ~state.done

        if self.backend == "mjx":  # Meta-World's control and the physics in JAX (float32)
            phys, ctrl, sensors = self.mjx.step(state.phys, state.ctrl, action, tid, active)
        else:  # Meta-World's mocap and gripper control, and the physics, on the host (float64, bit-exact state)
            out_types = (jax.ShapeDtypeStruct(state.phys.shape, jnp.uint32),
                         jax.ShapeDtypeStruct(state.ctrl.shape, jnp.uint32),
                         jax.ShapeDtypeStruct((batch, SENSOR_DIM), jnp.float32))
            phys, ctrl, sensors = jax.pure_callback(self.host._step_callback, out_types, state.phys, state.ctrl,
                                                    action, tid, active, vmap_method="broadcast_all")
        keep = active[:, None]
        sensors = jnp.where(keep, sensors, state.sensors)

        jitter = jax.vmap(lambda k: jax.random.normal(k, (3,)))(keys) * DISTRACTOR_JITTER
        pose = state.distractor_pose.at[:, :3].add(jitter)
        vec = _with_distractor(tasks.state_from_sensors(sensors, tid, state.consts[:, 0:3]), state.distractor, pose)
        vec = jnp.where(keep, vec, state.vec)
        extras = tasks.extras_from_sensors(sensors, state.consts)
        dense = jnp.where(active, tasks.dense_reward(vec, tid, action, extras), state.dense)
        succeeded = tasks.success_from(vec, tid, extras) & active
        reward = jnp.where(active, tasks.step_reward(state.dense, dense, succeeded), 0.0).astype(jnp.float32)
        t = state.t + active.astype(jnp.int32)
        done, success, info = self.episode_flags(state, succeeded, t, params)
        next_state = state.replace(phys=phys, ctrl=ctrl, sensors=sensors,
                                   vec=vec, dense=dense, t=t, done=done, success=success)
        return self.observation_batch(next_state, params), next_state, reward, done, info

    def extras(self, state: EnvState) -> tasks.Extras:
        """The exact :class:`.tasks.Extras` of (batched) states."""
        return tasks.extras_from_sensors(state.sensors, state.consts)
