"""The algorithm contract shared by every offline-RL method.

An algorithm is a record of pure functions (ARCHITECTURE.md, "Algorithm"):

* ``init(key, spec, stats, hp) -> state``: parameters, optimiser states (learning rates from ``hp``
  written into them), step counter, and whatever the algorithm needs of ``stats``, the
  :class:`~imaginejax.algos.common.DataStats` of the real dataset (e.g. the state normaliser);
* ``update(state, batch, key, hp, data) -> (state, metrics)``: one gradient step on a :class:`Batch`;
  ``data`` (:class:`~imaginejax.algos.common.Datasets`) is the interval's datasets, arguments of the
  engine's compiled call shared by all vmapped runs, for updates that read more than the batch (PRDC);
* ``act(state, obs, key, hp, deterministic) -> action``: batched action selection, obs (B, S+E) raw.

``hp`` is a pytree of numbers only (learning rates, weights): traced, so hyperparameters vmap like
seeds. What changes compiled shapes (layer widths, depths) is static, fixed by the ``make_*`` factory.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax

from imaginejax.data.types import Batch

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Spec:
    """An environment's interface as an algorithm sees it: state width S, embedding width E (0: none),
    discrete or not, and the number of actions n (discrete) or action width A (continuous, in [-1, 1])."""

    state_dim: int
    embed_dim: int
    discrete: bool
    action_dim: int

    @property
    def obs_dim(self) -> int:
        """S + E: the policy input is state ⊕ instruction embedding."""
        return self.state_dim + self.embed_dim


class Algorithm(NamedTuple):
    """A record of pure functions (module docstring)."""

    name: str
    init: Callable[[jax.Array, Spec, Any, PyTree], PyTree]
    update: Callable[[PyTree, Batch, jax.Array, PyTree, Any], tuple[PyTree, dict[str, jax.Array]]]
    act: Callable[[PyTree, jax.Array, jax.Array, PyTree, bool], jax.Array]
    default_hp: Callable[[Spec], PyTree]
