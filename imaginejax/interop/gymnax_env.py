"""Every registered environment as a gymnax environment, for purejaxrl-style training code::

    from imaginejax.interop import as_gymnax
    env, params = as_gymnax("clevr", "train")                  # a gymnax.environments.environment.Environment
    env = LogWrapper(env)                                      # gymnax.wrappers accept it
    obs, state = jax.vmap(env.reset, (0, None))(keys, params)  # obs (B, S+E), E = 384
    obs, state, reward, terminated, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(keys, state, a, params)

``step_env`` / ``reset_env`` are the environment's single-environment views (a batch of one of its
batched kernels); gymnax's base class adds the auto-reset ``step``: an episode that ends (``terminated``:
the task succeeded, ``truncated``: the step cap without success) is replaced in the same call by a fresh
one whose task is drawn uniformly from the level's tasks, and ``info["final_observation"]`` holds the
observation that ended it. The observation is ours, state ⊕ instruction embedding: by default the
MiniLM embedding our datasets and policies use (E = 384), the bare state with ``embed=None`` (E = 0); the
reward is the environment's own.

gymnax is not a dependency that pip can resolve: its metadata caps jax below the one we run on (its code
runs on it), so it installs with ``--no-deps`` after the ``gymnax`` extra (:data:`INSTALL_GYMNAX`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from imaginejax import envs as registry
from imaginejax.envs.base import Encoder, EnvParams
from imaginejax.lang import encode_instructions
from imaginejax.training.progress import MissingDependency

__all__ = ["GYMNAX_VERSION", "INSTALL_GYMNAX", "GymnaxEnv", "GymnaxParams", "as_gymnax"]

# The tested gymnax; the Makefile installs the same pin.
GYMNAX_VERSION = "1.0.1"
INSTALL_GYMNAX = f'pip install "imaginejax[gymnax]" && pip install --no-deps gymnax=={GYMNAX_VERSION}'

try:
    from gymnax.environments import environment, spaces
except ModuleNotFoundError as error:
    raise MissingDependency(
        f"imaginejax.interop.as_gymnax needs gymnax {GYMNAX_VERSION} and the packages it imports (missing: "
        f"{error.name!r}); install them with: {INSTALL_GYMNAX}   (--no-deps because gymnax {GYMNAX_VERSION}'s "
        "metadata caps jax below 0.12 and gymnasium below 1.4, so a plain `pip install gymnax` would downgrade "
        "both, although its code runs on them; the gymnax extra brings what it imports)") from None


@struct.dataclass
class GymnaxParams(environment.EnvParams):
    """gymnax's params around a level's task table.

    Attributes:
      max_steps_in_episode: the table's step cap (gymnax's field, kept equal to ``table.max_steps``; the
        environment's own cap is the one that ends episodes).
      table: the level's :class:`~imaginejax.envs.base.EnvParams` (goals, phrasings, embeddings).
    """

    table: EnvParams | None = None


class GymnaxEnv(environment.Environment):
    """A registered environment behind gymnax's ``Environment`` (stateless, like the environment it wraps).

    Args:
      env: the environment object of :func:`imaginejax.envs.make`.
      params: one level's task table, the default params.
    """

    def __init__(self, env: Any, params: EnvParams) -> None:
        self.env = env
        self._params = GymnaxParams(max_steps_in_episode=params.max_steps, table=params)

    @property
    def default_params(self) -> GymnaxParams:
        return self._params

    @property
    def name(self) -> str:
        return f"imaginejax/{self.env.name}-{self._params.table.level}"

    @property
    def num_actions(self) -> int:
        return int(self.env.num_actions if self.env.discrete else self.env.action_dim)

    def reset_env(self, key: jax.Array, params: GymnaxParams) -> tuple[jax.Array, Any]:
        """key → obs (S+E,), state; a task drawn uniformly, one of its phrasings drawn uniformly."""
        return self.env.reset(key, params.table)

    def step_env(self, key: jax.Array, state: Any, action: jax.Array, params: GymnaxParams
                 ) -> tuple[jax.Array, Any, jax.Array, jax.Array, dict[str, jax.Array]]:
        """One step without reset: obs (S+E,), state, reward (), terminated () = the task's success, info."""
        obs, state, reward, _, info = self.env.step(key, state, action, params.table)
        return obs, state, reward, info["success"], {"success": info["success"]}

    def is_truncated(self, state: Any, params: GymnaxParams) -> jax.Array:
        """The episode ended at the step cap without success (the environment's own flags, after the step)."""
        return state.done & ~state.success

    def is_terminated(self, state: Any, params: GymnaxParams) -> jax.Array:
        return state.success

    def action_space(self, params: GymnaxParams | None = None) -> spaces.Discrete | spaces.Box:
        """``Discrete(num_actions)`` or ``Box(action_low, action_high, (A,))``."""
        if self.env.discrete:
            return spaces.Discrete(int(self.env.num_actions))
        dim = int(self.env.action_dim)
        return spaces.Box(self.env.action_low, self.env.action_high, (dim,), jnp.float32)

    def observation_space(self, params: GymnaxParams | None = None) -> spaces.Box:
        """``Box((S+E,))``: the state unbounded, each embedding column within its table's range."""
        table = (params or self._params).table
        state = jnp.full((int(self.env.state_dim),), jnp.inf, jnp.float32)
        emb = table.instruction_embeddings
        low = jnp.concatenate([-state, emb.min(axis=0)])
        high = jnp.concatenate([state, emb.max(axis=0)])
        return spaces.Box(low, high, low.shape, jnp.float32)


def as_gymnax(name: str, level: str = "train", *, embed: Encoder | None = encode_instructions, **options: Any
              ) -> tuple[GymnaxEnv, GymnaxParams]:
    """A registered environment and level as ``(gymnax environment, its params)``.

    Args:
      name, level, options: as :func:`imaginejax.envs.make` (e.g. ``backend="mjx"`` for a MuJoCo
        environment under ``jax.vmap``).
      embed: the instruction encoder, M strings -> (M, E). Default
        :func:`imaginejax.lang.encode_instructions` (all-MiniLM-L6-v2, E = 384; weights from
        ``imaginejax setup-weights``), the observation our datasets and policies are trained on:
        obs (S+384,) = state ⊕ the embedding of the episode's instruction. ``None``: E = 0, obs (S,) is
        the bare state.
    Returns: ``(GymnaxEnv, GymnaxParams)``; ``env.observation_space(params).shape == (S+E,)``.
    """
    env, params = registry.make(name, level, embed=embed, **options)
    wrapped = GymnaxEnv(env, params)
    return wrapped, wrapped.default_params
