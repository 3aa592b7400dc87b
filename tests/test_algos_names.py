"""One naming convention for the two action spaces: ``make_<algo>`` / ``"<algo>"`` continuous,
``make_<algo>_discrete`` / ``"<algo>_discrete"`` discrete, the registry name ``"<algo>"`` for both; the
variant names, including the ones ``Algorithm.name`` had before, build the same algorithm."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from imaginejax import algos
from imaginejax.algos.base import Spec
from imaginejax.algos.networks import NetConfig

NET = NetConfig(encoder_width=8, hidden=(8,))
SPECS = {True: Spec(3, 2, True, 4), False: Spec(3, 2, False, 2)}
# Algorithm.name of each variant before the names followed one convention; checkpoints hash these.
FORMER = {("bc", True): "bc", ("bc", False): "bc", ("bcq", True): "bcq", ("bcq", False): "bcq_continuous",
          ("combo", True): "combo_discrete", ("combo", False): "combo", ("cql", True): "cql",
          ("cql", False): "cql_continuous", ("prdc", True): "prdc_discrete", ("prdc", False): "prdc",
          ("td3bc", True): "td3bc_discrete", ("td3bc", False): "td3bc"}


@pytest.mark.parametrize("name, discrete", sorted(FORMER))
def test_factory_and_algorithm_names_follow_the_file_names(name, discrete):
    made = algos.factory(name, discrete)
    algo = made(SPECS[discrete], NET)
    suffix = "_discrete" if discrete and name != "bc" else ""
    assert made.__name__ == f"make_{name}{suffix}" and made.__module__ == f"imaginejax.algos.{name}{suffix}"
    assert algo.name == name + suffix
    assert algos.checkpoint_name(algo) == FORMER[name, discrete]


@pytest.mark.parametrize("alias, name, discrete", [
    ("cql_continuous", "cql", False), ("bcq_continuous", "bcq", False), ("combo_discrete", "combo", True),
    ("prdc_discrete", "prdc", True), ("td3bc_discrete", "td3bc", True), ("cql_discrete", "cql", True),
    ("bcq_discrete", "bcq", True), ("td3bc_continuous", "td3bc", False), ("bc_discrete", "bc", True)])
def test_a_variant_name_builds_the_same_algorithm(alias, name, discrete):
    spec = SPECS[discrete]
    assert algos.variant(alias) == (name, discrete) and alias not in algos.registered()
    assert algos.factory(alias, discrete) is algos.factory(name, discrete)
    assert algos.static_options(alias) == algos.static_options(alias, discrete) == algos.static_options(name, discrete)
    a, b = algos.make(alias, spec, NET), algos.make(name, spec, NET)
    assert a.name == b.name
    for x, y in zip(jax.tree.leaves(a.default_hp(spec)), jax.tree.leaves(b.default_hp(spec))):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match=f"is {name} for {'discrete' if discrete else 'continuous'} actions; for "
                                         f"{'continuous' if discrete else 'discrete'} actions use '{name}'"):
        algos.make(alias, SPECS[not discrete], NET)


def test_unknown_names_list_the_registry_names():
    assert algos.variant("sac_discrete") == ("sac_discrete", None)
    for call in (lambda: algos.make("sac_discrete", SPECS[True], NET), lambda: algos.static_options("cql_offline"),
                 lambda: algos.factory("discrete", True)):
        with pytest.raises(ValueError, match="unknown algorithm .*; valid names: bc, bcq, combo, cql, prdc, td3bc"):
            call()
