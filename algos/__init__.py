"""Offline-RL algorithms as records of pure functions (see :mod:`imaginejax.algos.base`).

``make(name, spec, net)`` builds one by name; discrete and continuous action spaces are told apart by
``spec.discrete``.

Names: ``<algo>.py`` holds the continuous algorithm, factory ``make_<algo>``, ``Algorithm.name``
``"<algo>"``; ``<algo>_discrete.py`` the discrete one, ``make_<algo>_discrete``, ``"<algo>_discrete"``
(``bc.py`` serves both as ``"bc"``). Users type the registry name ``"<algo>"``; :func:`make` (and so the
loaders of saved records) also takes a variant name, ``"<algo>_discrete"`` or ``"<algo>_continuous"``, which
must then match ``spec.discrete``.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.bc import make_bc
from imaginejax.algos.bcq import make_bcq
from imaginejax.algos.bcq_discrete import make_bcq_discrete
from imaginejax.algos.combo import make_combo
from imaginejax.algos.combo_discrete import make_combo_discrete
from imaginejax.algos.cql import make_cql
from imaginejax.algos.cql_discrete import make_cql_discrete
from imaginejax.algos.networks import NetConfig
from imaginejax.algos.prdc import make_prdc
from imaginejax.algos.prdc_discrete import make_prdc_discrete
from imaginejax.algos.td3bc import make_td3bc
from imaginejax.algos.td3bc_discrete import make_td3bc_discrete

# name -> {discrete: factory}; one name per algorithm, the action space picks the variant
# (``spec.discrete``). New algorithms register both variants here.
_REGISTRY: dict[str, dict[bool, Callable[[Spec, NetConfig], Algorithm]]] = {
    "bc": {True: make_bc, False: make_bc},
    "cql": {True: make_cql_discrete, False: make_cql},
    "combo": {True: make_combo_discrete, False: make_combo},
    "bcq": {True: make_bcq_discrete, False: make_bcq},
    "prdc": {True: make_prdc_discrete, False: make_prdc},
    "td3bc": {True: make_td3bc_discrete, False: make_td3bc},
}


# Algorithm.name of the cql and bcq variants before the names above; the engine hashes the name into a
# checkpoint's fingerprint, so these keep checkpoints written under them resumable.
_CHECKPOINT_NAMES = {"cql": "cql_continuous", "cql_discrete": "cql", "bcq": "bcq_continuous", "bcq_discrete": "bcq"}


def registered(discrete: bool | None = None) -> tuple[str, ...]:
    """Names accepted by :func:`make`; with ``discrete`` given, only those with that action space."""
    return tuple(sorted(n for n, v in _REGISTRY.items() if discrete is None or discrete in v))


def variant(name: str) -> tuple[str, bool | None]:
    """(registry name, action space the name fixes): "cql_discrete" -> ("cql", True), "cql_continuous" ->
    ("cql", False), "cql" -> ("cql", None); an unknown name is returned as it is, with None."""
    for suffix, discrete in (("_discrete", True), ("_continuous", False)):
        base = name.removesuffix(suffix)
        if base != name and discrete in _REGISTRY.get(base, {}):
            return base, discrete
    return name, None


def checkpoint_name(algo: Algorithm) -> str:
    """The name of ``algo`` that checkpoint fingerprints hash (its ``name``, or the one it had before)."""
    return _CHECKPOINT_NAMES.get(algo.name, algo.name)


def factory(name: str, discrete: bool) -> Callable[..., Algorithm]:
    """The ``make_*`` function of ``name`` (registry or variant name) for that action space; a ValueError
    lists the valid names when there is none."""
    base, fixed = variant(name)
    if base not in _REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; valid names: {', '.join(registered())}")
    kind = "discrete" if discrete else "continuous"
    if fixed is not None and fixed != discrete:
        raise ValueError(f"algorithm {name!r} is {base} for {'discrete' if fixed else 'continuous'} actions; for "
                         f"{kind} actions use {base!r}")
    if discrete not in _REGISTRY[base]:
        raise ValueError(f"algorithm {name!r} has no {kind}-action version; for {kind} actions use: "
                         f"{', '.join(registered(discrete))}")
    return _REGISTRY[base][discrete]


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
    base, fixed = variant(name)
    if base not in _REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; valid names: {', '.join(registered())}")
    discrete = fixed if discrete is None else discrete
    spaces = list(_REGISTRY[base]) if discrete is None else [discrete]
    names = [k for d in spaces for k in list(inspect.signature(factory(name, d)).parameters)[2:]]
    return tuple(dict.fromkeys(names))


def make(name: str, spec: Spec, net: NetConfig | None = None, **options: Any) -> Algorithm:
    """The algorithm ``name`` for ``spec`` (its variant by ``spec.discrete``) with shapes ``net`` (None: the
    algorithm's reference network) and static ``options`` of its factory, e.g. ``config={"rollout_batch":
    5000}`` for COMBO (a mapping replaces fields of a dataclass default). Unknown names, action spaces or
    options are a ValueError that lists the valid ones."""
    make_variant = factory(name, spec.discrete)
    valid = static_options(name, spec.discrete)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"algorithm {name!r} ({'discrete' if spec.discrete else 'continuous'}) has no option "
                         f"{', '.join(unknown)}; valid options: {', '.join(valid) or 'none'}")
    kwargs = {k: _static_option(make_variant, name, k, v) for k, v in options.items()}
    if net is not None:
        kwargs["net"] = net
    return make_variant(spec, **kwargs)


__all__ = ["Algorithm", "NetConfig", "Spec", "checkpoint_name", "factory", "make", "registered", "static_options",
           "variant"]
