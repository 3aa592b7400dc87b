"""Offline-RL algorithms as records of pure functions (see :mod:`imaginejax.algos.base`).

``make(name, spec, net)`` builds one by name; discrete and continuous action spaces are told apart by
``spec.discrete``.
"""

from __future__ import annotations

from typing import Callable

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.bc import make_bc
from imaginejax.algos.bcq import make_bcq, make_continuous_bcq
from imaginejax.algos.combo import make_combo, make_discrete_combo
from imaginejax.algos.cql import make_continuous_cql, make_cql
from imaginejax.algos.networks import NetConfig
from imaginejax.algos.prdc import make_discrete_prdc, make_prdc
from imaginejax.algos.td3bc import make_td3bc
from imaginejax.algos.td3bc_discrete import make_discrete_td3bc

# name -> {discrete: factory}; one name per algorithm, the action space picks the variant
# (``spec.discrete``). New algorithms register both variants here.
_REGISTRY: dict[str, dict[bool, Callable[[Spec, NetConfig], Algorithm]]] = {
    "bc": {True: make_bc, False: make_bc},
    "cql": {True: make_cql, False: make_continuous_cql},
    "combo": {True: make_discrete_combo, False: make_combo},
    "bcq": {True: make_bcq, False: make_continuous_bcq},
    "prdc": {True: make_discrete_prdc, False: make_prdc},
    "td3bc": {True: make_discrete_td3bc, False: make_td3bc},
}


def registered(discrete: bool | None = None) -> tuple[str, ...]:
    """Names accepted by :func:`make`; with ``discrete`` given, only those with that action space."""
    return tuple(sorted(n for n, v in _REGISTRY.items() if discrete is None or discrete in v))


def make(name: str, spec: Spec, net: NetConfig | None = None) -> Algorithm:
    """Builds the algorithm ``name`` for an environment interface ``spec`` with static shapes ``net``.

    The variant (discrete or continuous actions) follows ``spec.discrete``. With ``net=None`` each
    algorithm uses its reference network (e.g. 3×256 heads for continuous CQL, 2×256 for TD3+BC).

    Raises:
      ValueError: an unknown name (the message lists the valid ones) or an action space the algorithm
        does not support (the message lists those that do).
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; valid names: {', '.join(registered())}")
    variants = _REGISTRY[name]
    if spec.discrete not in variants:
        kind = "discrete" if spec.discrete else "continuous"
        raise ValueError(f"algorithm {name!r} has no {kind}-action version; for {kind} actions use: "
                         f"{', '.join(registered(spec.discrete))}")
    factory = variants[spec.discrete]
    return factory(spec) if net is None else factory(spec, net)


__all__ = ["Algorithm", "NetConfig", "Spec", "make", "registered"]
