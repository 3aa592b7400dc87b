"""CLEVR-Robot as a pure, gymnax-style JAX environment with batched kernels: state (10,), Discrete(40)
pushes, obs (10+E,). Reset draws a layout that does not already satisfy the goal (``params.reset_tries``
candidates, the first unsatisfied one kept); the step is one :func:`physics.push` of the batch.
"""

from __future__ import annotations

from typing import Final

import chex
import jax
import jax.numpy as jnp
from flax import struct

from imaginejax.envs.base import Encoder, EnvParams, EpisodeState, TaskEnv, make_level_params

from imaginejax.envs.clevr import instructions as instr
from imaginejax.envs.clevr import physics
from imaginejax.envs.clevr import tasks

ENV_NAME: Final[str] = "clevr"
DEFAULT_RESET_TRIES: Final[int] = 16


@struct.dataclass
class EnvState(EpisodeState):
    """Environment state: the episode fields of :class:`~imaginejax.envs.base.EpisodeState` and the world
    below; every leaf gets a leading (B,) axis in the batched kernels.

    Attributes:
      balls: (5, 2) float32 ball positions (x, y) in colour order.
    """

    balls: jax.Array


def make_params(level: str, *, embed: Encoder | None = None, reset_tries: int = DEFAULT_RESET_TRIES) -> EnvParams:
    """The :class:`EnvParams` of a level (:data:`tasks.LEVELS`); ``embed`` as in
    :func:`~imaginejax.envs.base.make_level_params`; ``reset_tries`` candidate layouts are drawn at reset."""
    return make_level_params(level, tasks.level_goals(level), instr.level_instruction_table(level),
                             tasks.level_max_steps(level), embed=embed, reset_tries=reset_tries)


class CLEVRRobot(TaskEnv, tasks=tasks, instructions=instr.__name__, make_params=make_params):
    """CLEVR-Robot: 5 balls, Discrete(40) pushes, language-conditioned goals. Stateless; the level lives
    in :class:`EnvParams`; the predicates and metadata come from :mod:`.tasks` (:class:`~imaginejax.envs.base.TaskEnv`)."""

    name: Final[str] = ENV_NAME
    num_actions: Final[int] = tasks.NUM_ACTIONS
    discrete: Final[bool] = True

    # ------------------------------------------------------------------ views
    @staticmethod
    def state_vector(state: EnvState) -> jax.Array:
        """(..., 5, 2) balls → (..., 10) state vector."""
        return state.balls.reshape(state.balls.shape[:-2] + (tasks.STATE_DIM,))

    # ------------------------------------------------------------------ batched kernels
    def reset_to_task_batch(
        self, keys: jax.Array, params: EnvParams, task: jax.Array, phrasing: jax.Array | None = None
    ) -> tuple[jax.Array, EnvState]:
        """Resets B environments to given tasks (:meth:`TaskEnv.reset_to_task_batch`): obs (B, 10+E), state."""
        batch = keys.shape[0]
        split = jax.vmap(lambda k: jax.random.split(k, 2))(keys)
        key_phrasing, key_layout = split[:, 0], split[:, 1]
        task, instruction = self.task_instruction(key_phrasing, params, task, phrasing)

        tries = params.reset_tries
        layouts = jax.vmap(lambda k: physics.sample_layout(k, tries))(key_layout)  # (B, R, 5, 2)
        chex.assert_shape(layouts, (batch, tries, tasks.N_BALLS, 2))
        goals = params.goals[task]
        satisfied = tasks.state_satisfied(layouts.reshape(batch, tries, tasks.STATE_DIM), goals[:, None, :])
        first_free = jnp.argmax(~satisfied, axis=1)  # all satisfied (vanishingly rare): take try 0
        balls = jnp.take_along_axis(layouts, first_free[:, None, None, None], axis=1)[:, 0]

        state = EnvState(balls=balls.astype(jnp.float32), **self.episode_start(task, instruction))
        return self.observation_batch(state, params), state

    def step_batch(
        self, keys: jax.Array, state: EnvState, action: jax.Array, params: EnvParams
    ) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict[str, jax.Array]]:
        """Steps B environments (:meth:`TaskEnv.step_batch`): action (B,) int32 in [0, 40); the keys are unused
        (deterministic physics); obs (B, 10+E)."""
        del keys
        batch = state.balls.shape[0]
        action = jnp.asarray(action, jnp.int32)
        chex.assert_shape(action, (batch,))
        ball, direction = physics.decode_action(action)
        pushed = physics.push(state.balls, ball, direction)
        chex.assert_shape(pushed, (batch, tasks.N_BALLS, 2))
        active = ~state.done
        balls = jnp.where(active[:, None, None], pushed, state.balls)

        goal = params.goals[state.task]
        prev_vec = self.state_vector(state)
        next_vec = balls.reshape(batch, tasks.STATE_DIM)
        succeeded = tasks.success(prev_vec, action, next_vec, goal) & active
        reward = jnp.where(active, tasks.reward(prev_vec, action, next_vec, goal), 0.0).astype(jnp.float32)
        t = state.t + active.astype(jnp.int32)
        done, success, info = self.episode_flags(state, succeeded, t, params)
        next_state = state.replace(balls=balls, t=t, done=done, success=success)
        return self.observation_batch(next_state, params), next_state, reward, done, info
