"""The MuJoCo environments (HalfCheetah, Meta-World, LIBERO) as brax environments on the MJX backend::

    from brax.envs.wrappers import training
    from imaginejax.interop import as_brax
    env = training.wrap(as_brax("cheetah", "train"), episode_length=200)   # vmap, episode length, auto-reset
    state = jax.jit(env.reset)(jax.random.split(key, B))                    # state.obs (B, S+E)
    state = jax.jit(env.step)(state, actions)                               # actions (B, A) in [-1, 1]

A brax ``Env`` is one environment that brax's ``VmapWrapper`` vectorises, so its reset and step must be
pure JAX: the physics is MJX (``backend="mjx"``; MuJoCo C steps through a host callback). ``reset(rng)``
draws a task uniformly from the level and one of its phrasings; ``State`` holds our environment state as
``pipeline_state``, the observation (state ⊕ instruction embedding), the reward, ``done`` (the task
succeeded or the environment's own step cap was reached, as float), ``metrics["success"]`` (1.0 on the
step that succeeded) and ``info["rng"]``, the key chain of the following steps. brax's ``AutoResetWrapper``
restarts an ended episode from its first state (same task and phrasing), brax's convention.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from brax.envs.base import Env, State

from imaginejax import envs as registry
from imaginejax.envs.base import Encoder, EnvParams
from imaginejax.lang import encode_instructions

__all__ = ["BraxEnv", "MUJOCO_ENVS", "as_brax"]

MUJOCO_ENVS: tuple[str, ...] = ("cheetah", "metaworld", "libero")


class BraxEnv(Env):
    """A continuous environment of the registry and one level's task table behind brax's ``Env``.

    Args:
      env: the environment object of :func:`imaginejax.envs.make` (pure-JAX physics, e.g. ``backend="mjx"``).
      params: the level's :class:`~imaginejax.envs.base.EnvParams`.
    """

    def __init__(self, env: Any, params: EnvParams) -> None:
        if env.discrete:
            raise ValueError(f"brax environments have continuous actions; {env.name!r} is discrete "
                             "(use imaginejax.interop.as_gymnax)")
        self.env = env
        self.params = params

    def reset(self, rng: jax.Array) -> State:
        """rng → the first state of an episode (obs (S+E,), reward 0, done 0)."""
        rng, key = jax.random.split(rng)
        obs, state = self.env.reset(key, self.params)
        zero = jnp.zeros((), jnp.float32)
        return State(pipeline_state=state, obs=obs, reward=zero, done=zero, metrics={"success": zero},
                     info={"rng": rng})

    def step(self, state: State, action: jax.Array) -> State:
        """One step of the environment: action (A,) in [action_low, action_high]."""
        rng, key = jax.random.split(state.info["rng"])
        obs, env_state, reward, done, info = self.env.step(key, state.pipeline_state, action, self.params)
        # Wrappers keep their own entries in metrics and info (brax's EvalWrapper adds metrics["reward"]).
        metrics = {**state.metrics, "success": info["success"].astype(jnp.float32)}
        return state.replace(pipeline_state=env_state, obs=obs, reward=reward.astype(jnp.float32),
                             done=done.astype(jnp.float32), metrics=metrics, info={**state.info, "rng": rng})

    @property
    def observation_size(self) -> int:
        return int(self.env.obs_dim(self.params))

    @property
    def action_size(self) -> int:
        return int(self.env.action_dim)

    @property
    def backend(self) -> str:
        return str(getattr(self.env, "backend", "mjx"))


def as_brax(name: str, level: str = "train", *, embed: Encoder | None = encode_instructions, backend: str = "mjx",
            **options: Any) -> BraxEnv:
    """A MuJoCo environment of the registry and level as a brax ``Env``.

    Args:
      name: one of :data:`MUJOCO_ENVS`.
      level, options: as :func:`imaginejax.envs.make`.
      embed: the instruction encoder, M strings -> (M, E); default all-MiniLM-L6-v2 (E = 384), the
        observation our datasets and policies use: obs (S+384,). ``None``: the bare state, obs (S,).
      backend: the physics backend, "mjx" (pure JAX; what brax's vmapping needs).
    Raises: ValueError for a name outside :data:`MUJOCO_ENVS`.
    """
    if name not in MUJOCO_ENVS:
        raise ValueError(f"as_brax takes the MuJoCo environments {', '.join(MUJOCO_ENVS)}, got {name!r} "
                         "(the others: imaginejax.interop.as_gymnax)")
    env, params = registry.make(name, level, embed=embed, backend=backend, **options)
    return BraxEnv(env, params)
