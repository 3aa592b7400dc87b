"""Offline-RL algorithms as records of pure functions (see :mod:`imaginejax.algos.base`).

``make(name, spec, net)`` builds one by name; discrete and continuous action spaces are told apart by
``spec.discrete``.
"""

from __future__ import annotations

from typing import Callable

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.bc import make_bc
from imaginejax.algos.bcq import make_bcq
from imaginejax.algos.cql import make_cql
from imaginejax.algos.networks import NetConfig
from imaginejax.algos.td3bc import make_td3bc
from imaginejax.algos.td3bc_discrete import make_discrete_td3bc

# name -> (factory, action spaces it supports)
_REGISTRY: dict[str, tuple[Callable[..., Algorithm], tuple[bool, ...]]] = {
    "bc": (make_bc, (True, False)),
    "cql": (make_cql, (True,)),
    "bcq": (make_bcq, (True,)),
    "td3bc": (make_td3bc, (False,)),
    "td3bc_discrete": (make_discrete_td3bc, (True,)),
}


def registered() -> tuple[str, ...]:
    """Names accepted by :func:`make`."""
    return tuple(sorted(_REGISTRY))


def make(name: str, spec: Spec, net: NetConfig = NetConfig()) -> Algorithm:
    """Builds the algorithm ``name`` for an environment interface ``spec`` with static shapes ``net``.

    Raises:
      ValueError: an unknown name (the message lists the valid ones) or an action space the algorithm
        does not support yet.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; valid names: {', '.join(registered())}")
    factory, spaces = _REGISTRY[name]
    if spec.discrete not in spaces:
        kind = "discrete" if spec.discrete else "continuous"
        supported = [n for n, (_, s) in sorted(_REGISTRY.items()) if spec.discrete in s]
        raise ValueError(f"algorithm {name!r} has no {kind}-action version yet; for {kind} actions use: "
                         f"{', '.join(supported)}")
    return factory(spec, net)


__all__ = ["Algorithm", "NetConfig", "Spec", "make", "registered"]
