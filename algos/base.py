"""The algorithm contract shared by every offline-RL method.

An algorithm is a record of pure functions (ARCHITECTURE.md, "Algorithm"):

* ``init(key, spec, hp) -> state`` — a pytree (parameters, optimiser states, step counter);
* ``update(state, batch, key, hp) -> (state, metrics)`` — one gradient step on a :class:`Batch`;
* ``act(state, obs, key, hp, deterministic) -> action`` — batched action selection, obs (B, S+E);
* optionally ``bind_data(hp, real, imag, imag_rows) -> hp`` — for algorithms whose update reads the whole
  training data (PRDC's nearest-neighbour search; ``imag_rows`` (2,) = (start, count) of the run's own rows
  of ``imag``): the engine calls it inside every compiled interval with the
  interval's own dataset arguments, so datasets stay arguments of the compiled call (never closure
  constants) and all vmapped runs share one copy.

``hp`` is a pytree of numbers (learning rates, weights): it is traced, so hyperparameters are vmapped
like seeds. Everything that changes compiled shapes (layer widths, depths) is static configuration
captured when the record is built (``make_*`` factories).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax

from imaginejax.data.types import Batch

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Spec:
    """Static description of an environment's interface as seen by an algorithm.

    Attributes:
      state_dim: S, width of the environment state vector.
      embed_dim: E, width of the instruction embedding (0 when instructions are not embedded).
      discrete: True for Discrete(n) action spaces.
      action_dim: number of actions n (discrete) or action width A (continuous, actions in [-1, 1]).
    """

    state_dim: int
    embed_dim: int
    discrete: bool
    action_dim: int

    @property
    def obs_dim(self) -> int:
        """S + E: the policy input is state ⊕ instruction embedding."""
        return self.state_dim + self.embed_dim


class Algorithm(NamedTuple):
    """A record of pure functions; see the module docstring for the signatures."""

    name: str
    init: Callable[[jax.Array, Spec, PyTree], PyTree]
    update: Callable[[PyTree, Batch, jax.Array, PyTree], tuple[PyTree, dict[str, jax.Array]]]
    act: Callable[[PyTree, jax.Array, jax.Array, PyTree, bool], jax.Array]
    default_hp: Callable[[Spec], PyTree]
    bind_data: Callable[[PyTree, Any, Any, Any], PyTree] | None = None
