"""Offline-RL algorithms as records of pure functions (see :mod:`imaginejax.algos.base`).

``make(name, spec, net)`` builds one by name; discrete and continuous action spaces are told apart by
``spec.discrete``.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.bc import make_bc
from imaginejax.algos.bcq import make_continuous_bcq
from imaginejax.algos.bcq_discrete import make_bcq
from imaginejax.algos.combo import make_combo
from imaginejax.algos.combo_discrete import make_discrete_combo
from imaginejax.algos.cql import make_continuous_cql
from imaginejax.algos.cql_discrete import make_cql
from imaginejax.algos.networks import NetConfig
from imaginejax.algos.prdc import make_prdc
from imaginejax.algos.prdc_discrete import make_discrete_prdc
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


def _static_option(factory: Callable, name: str, key: str, value: Any) -> Any:
    """``value`` for the factory's keyword ``key``; a table for a dataclass-valued keyword (e.g. COMBO's
    ``config``) replaces the named fields of its default, recursively."""
    default = inspect.signature(factory).parameters[key].default
    if not (dataclasses.is_dataclass(default) and isinstance(value, Mapping)):
        return value
    fields = {f.name for f in dataclasses.fields(default)}
    updates = {}
    for field, sub in value.items():
        if field not in fields:
            raise ValueError(f"algorithm {name!r}: option {key}.{field} does not exist; valid fields of "
                             f"{type(default).__name__}: {', '.join(sorted(fields))}")
        current = getattr(default, field)
        if dataclasses.is_dataclass(current) and isinstance(sub, Mapping):
            sub = dataclasses.replace(current, **sub)
        updates[field] = sub
    return dataclasses.replace(default, **updates)


def static_options(name: str, discrete: bool | None = None) -> tuple[str, ...]:
    """The static keyword options :func:`make` accepts for ``name`` in that action space (None: in any
    of its variants). They fix compiled shapes, unlike the traced hyperparameters of ``default_hp``."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; valid names: {', '.join(registered())}")
    factories = [f for d, f in _REGISTRY[name].items() if discrete is None or d == discrete]
    names = [k for f in factories for k in list(inspect.signature(f).parameters)[2:]]
    return tuple(dict.fromkeys(names))


def make(name: str, spec: Spec, net: NetConfig | None = None, **options: Any) -> Algorithm:
    """The algorithm ``name`` for ``spec`` (its variant by ``spec.discrete``) with shapes ``net`` (None: the
    algorithm's reference network) and static ``options`` of its factory, e.g. ``config={"rollout_batch":
    5000}`` for COMBO (a mapping replaces fields of a dataclass default). Unknown names, action spaces or
    options are a ValueError that lists the valid ones."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; valid names: {', '.join(registered())}")
    variants = _REGISTRY[name]
    if spec.discrete not in variants:
        kind = "discrete" if spec.discrete else "continuous"
        raise ValueError(f"algorithm {name!r} has no {kind}-action version; for {kind} actions use: "
                         f"{', '.join(registered(spec.discrete))}")
    factory = variants[spec.discrete]
    valid = static_options(name, spec.discrete)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"algorithm {name!r} ({'discrete' if spec.discrete else 'continuous'}) has no option "
                         f"{', '.join(unknown)}; valid options: {', '.join(valid) or 'none'}")
    kwargs = {k: _static_option(factory, name, k, v) for k, v in options.items()}
    if net is not None:
        kwargs["net"] = net
    return factory(spec, **kwargs)


__all__ = ["Algorithm", "NetConfig", "Spec", "make", "registered", "static_options"]
