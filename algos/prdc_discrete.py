"""Discrete PRDC: PRDC (Ran et al. 2023) on discrete TD3+BC, our extension to discrete actions.

The joint space uses the one-hot action e_a and the policy's probability vector p = π_φ(·|o), whose
distance ‖p − e_b‖² = ‖p‖² − 2 p_b + 1 ranks dataset actions as the expected distance of a sampled action;
the regulariser is the cross-entropy to the neighbour's action:

    (ô, â) = argmin_{(o_j, a_j) ∈ D}  β² ‖o − o_j‖² + ‖π_φ(·|o) − e_{a_j}‖²                    (no gradient)
    L(φ) = −λ E[Σ_a π_φ(a|o) Q_θ1(o, a)] + E[−log π_φ(â|o)],   λ = α / E|Σ_a π_φ(a|o) Q_θ1(o, a)|

The rest is discrete TD3+BC's update (:mod:`imaginejax.algos.td3bc_discrete`); the search set as in
:mod:`imaginejax.algos.prdc`. Derivation: docs/algorithms/prdc.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import Datasets, take_action_values
from imaginejax.algos.neighbors import DEFAULT_CHUNK, batch_neighbor, check_search_options
from imaginejax.algos.networks import NetConfig
from imaginejax.algos.td3bc import TD3BCState
from imaginejax.algos.td3bc_discrete import DiscreteTD3BCHyperparams, make_td3bc_discrete
from imaginejax.data.types import Batch


@struct.dataclass
class DiscretePRDCHyperparams(DiscreteTD3BCHyperparams):
    """Discrete TD3+BC's traced hyperparameters and β of the search."""

    beta: jax.Array


def make_prdc_discrete(spec: Spec, net: NetConfig = NetConfig(), chunk: int = DEFAULT_CHUNK,
                       subset: int | None = None) -> Algorithm:
    """Discrete PRDC for a discrete ``spec`` on discrete TD3+BC's networks ``net``; chunk, subset as
    :func:`~imaginejax.algos.prdc.make_prdc`."""
    if not spec.discrete:
        raise ValueError("make_prdc_discrete needs a discrete action space; for continuous actions use make_prdc")
    check_search_options(chunk, subset)
    td3bc = make_td3bc_discrete(spec, net)

    def default_hp(spec_: Spec) -> DiscretePRDCHyperparams:
        return DiscretePRDCHyperparams(**vars(td3bc.default_hp(spec_)), beta=jnp.float32(2.0))

    def update(state: TD3BCState, batch: Batch, key: jax.Array, hp: DiscretePRDCHyperparams,
               data: Datasets) -> tuple[TD3BCState, dict[str, jax.Array]]:
        def nearest_action(batch: Batch, logits: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
            """â of the search for (o, π(·|o)): batch, logits (B, n) -> (â (B,) int32, metrics)."""
            nn = batch_neighbor(batch, jax.nn.softmax(logits, axis=-1), data, state.stats, hp.beta, chunk=chunk,
                                num_actions=spec.action_dim, subset=subset, key=key)
            data_ce = -take_action_values(jax.nn.log_softmax(logits, axis=-1), batch.action).mean()
            return nn.action, {"data_cross_entropy": data_ce, "nn_distance": nn.distance.mean(),
                               "nn_imaginary": nn.imaginary.astype(jnp.float32).mean()}

        return td3bc.update(state, batch, key, hp, data, bc_target=nearest_action)

    return td3bc._replace(name="prdc_discrete", update=update, default_hp=default_hp)
