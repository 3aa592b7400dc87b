"""HalfCheetah with language-conditioned locomotion tasks as a pure, gymnax-style JAX environment: state
(18,), actions Box(-1, 1, (6,)), obs (18+E,), 200 steps. One ``step_batch`` is one physics call for the
batch (:func:`backends.physics_step`); reset adds Gymnasium v5's noise (qpos ~ U[-0.1, 0.1], qvel ~
0.1·N(0, 1)) to the zero pose. Reward :func:`tasks.reward`, success :func:`tasks.success` on the
episode's running quantities ``state.progress``.
"""

from __future__ import annotations

from typing import Final

import chex
import jax
import jax.numpy as jnp
from flax import struct

from imaginejax.envs.base import Encoder, EnvParams, EpisodeState, TaskEnv, make_level_params

from imaginejax.envs.cheetah import backends
from imaginejax.envs.cheetah import instructions as instr
from imaginejax.envs.cheetah import model as M
from imaginejax.envs.cheetah import tasks
from imaginejax.envs.cheetah.backends import Physics
from imaginejax.envs.cheetah.tasks import Progress

ENV_NAME: Final[str] = "cheetah"
RESET_NOISE_SCALE: Final[float] = 0.1  # Gymnasium v5's reset_noise_scale


@struct.dataclass
class EnvState(EpisodeState):
    """Environment state: the episode fields of :class:`~imaginejax.envs.base.EpisodeState` and the world
    below; every leaf gets a leading (B,) axis in the batched kernels.

    Attributes:
      physics: :class:`backends.Physics`, qpos / qvel (9,) each with their float64 remainders.
      dx: () x displacement of the last step (0 after a reset).
      progress: :class:`tasks.Progress`, the episode's running quantities (Σ, leg counts and sums, ...).
    """

    physics: Physics
    dx: jax.Array
    progress: Progress


def make_params(level: str, *, embed: Encoder | None = None) -> EnvParams:
    """The :class:`EnvParams` of a level (:data:`tasks.LEVELS`); ``embed`` as in
    :func:`~imaginejax.envs.base.make_level_params` (``reset_tries`` = 1: the reset draws no candidates)."""
    return make_level_params(level, tasks.level_goals(level), instr.level_instruction_table(level),
                             tasks.level_max_steps(level), embed=embed, reset_tries=1)


class HalfCheetah(TaskEnv, tasks=tasks, instructions=instr.__name__, make_params=make_params):
    """HalfCheetah, Box(-1, 1, (6,)) actions, nine language-conditioned locomotion tasks. Stateless; the
    predicates and metadata come from :mod:`.tasks` (:class:`~imaginejax.envs.base.TaskEnv`).

    Args:
      backend: "auto" (MJX on an accelerator, MuJoCo C on a CPU), "mujoco" or "mjx"; resolved once, here.
      nthread: MuJoCo C threads (default: all usable CPUs).
    """

    name: Final[str] = ENV_NAME
    action_dim: Final[int] = tasks.ACTION_DIM
    num_actions: Final[int] = tasks.ACTION_DIM  # the action width A (continuous), as the imaginer expects
    discrete: Final[bool] = False

    # Success and the hard tasks' rewards need the running quantities of the episode, not just one transition.
    update_progress = staticmethod(tasks.update_progress)
    trajectory_success_and_reward = staticmethod(tasks.trajectory_success_and_reward)

    def __init__(self, backend: backends.Backend = "auto", nthread: int | None = None) -> None:
        self.backend = backends.resolve_backend(backend)
        if nthread is not None and nthread < 1:
            raise ValueError(f"nthread must be >= 1 or None, got {nthread}")
        self.nthread = nthread

    def __repr__(self) -> str:
        return f"HalfCheetah(backend={self.backend!r}, nthread={self.nthread})"

    # ------------------------------------------------------------------ views
    @staticmethod
    def state_vector(state: EnvState) -> jax.Array:
        """(...) state → (..., 18) state vector [dx, qpos[1:], qvel]."""
        return tasks.state_vector(state.dx, state.physics.qpos, state.physics.qvel)

    # ------------------------------------------------------------------ batched kernels
    def reset_to_task_batch(self, keys: jax.Array, params: EnvParams, task: jax.Array,
                            phrasing: jax.Array | None = None) -> tuple[jax.Array, EnvState]:
        """Resets B environments to given tasks (:meth:`TaskEnv.reset_to_task_batch`): obs (B, 18+E), state."""
        batch = keys.shape[0]
        split = jax.vmap(lambda k: jax.random.split(k, 3))(keys)
        key_phrasing, key_qpos, key_qvel = split[:, 0], split[:, 1], split[:, 2]
        task, instruction = self.task_instruction(key_phrasing, params, task, phrasing)
        dtype = jnp.result_type(float)
        qpos = jax.vmap(lambda k: jax.random.uniform(k, (M.NQ,), dtype, -RESET_NOISE_SCALE, RESET_NOISE_SCALE))(key_qpos)
        qvel = RESET_NOISE_SCALE * jax.vmap(lambda k: jax.random.normal(k, (M.NV,), dtype))(key_qvel)
        state = EnvState(
            physics=Physics.from_qpos_qvel(qpos, qvel),
            dx=jnp.zeros((batch,), dtype),
            progress=Progress.zeros((batch,), dtype),
            **self.episode_start(task, instruction),
        )
        return self.observation_batch(state, params), state

    def step_batch(self, keys: jax.Array, state: EnvState, action: jax.Array, params: EnvParams
                   ) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict[str, jax.Array]]:
        """Steps B environments with one physics call: action (B, 6) (charged in full by the control cost
        even where MuJoCo clamps it); obs (B, 18+E)."""
        del keys
        batch = state.t.shape[0]
        action = jnp.asarray(action)
        if action.shape != (batch, tasks.ACTION_DIM):
            raise ValueError(f"action must have shape ({batch}, {tasks.ACTION_DIM}) for a batch of {batch} "
                             f"states, got {action.shape}")
        active = ~state.done
        physics, dx = backends.physics_step(state.physics, action, self.backend, active=active,
                                            nthread=self.nthread)
        dx = jnp.where(active, dx, state.dx)
        chex.assert_shape(dx, (batch,))
        t = state.t + active.astype(jnp.int32)
        prev_vec = self.state_vector(state)
        next_vec = tasks.state_vector(dx, physics.qpos, physics.qvel)
        progress = tasks.update_progress(state.progress, next_vec, t)
        progress = jax.tree.map(lambda new, old: jnp.where(active, new, old), progress, state.progress)
        goal = params.goals[state.task]
        succeeded = tasks.success(progress, t, goal) & active
        reward = jnp.where(active, tasks.reward(prev_vec, action, next_vec, goal, state.progress), 0.0)
        done, success, info = self.episode_flags(state, succeeded, t, params)
        next_state = state.replace(physics=physics, dx=dx, progress=progress, t=t, done=done, success=success)
        return self.observation_batch(next_state, params), next_state, reward.astype(jnp.float32), done, info
