"""PRDC: policy regularisation with dataset constraint (Ran et al. 2023), language-conditioned, continuous.

TD3+BC's update (:mod:`imaginejax.algos.td3bc`: the same critics, smoothing, delayed actor and targets)
with the BC term's target replaced by the action of the dataset point nearest to the policy's own (o, π_φ(o)):

    (ô, â) = argmin_{(o_j, a_j) ∈ D}  ‖β o − β o_j‖² + ‖π_φ(o) − a_j‖²         o = s̃ ⊕ e(ℓ), no gradient
    L(φ) = −λ E[Q_θ1(o, π_φ(o))] + E[(π_φ(o) − â)²],   λ = α / E|Q_θ1(o, π_φ(o))|     β = 2, α = 2.5

D is the support of the run's batches: the real buffer when the batch has real rows, the run's own
imaginary rows when it has imaginary ones (``update``'s ``data``). Exact search by default
(:mod:`imaginejax.algos.neighbors`); ``subset = m`` searches m random rows per buffer plus the batch.
Notes: docs/algorithms/prdc.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import Datasets
from imaginejax.algos.neighbors import DEFAULT_CHUNK, batch_neighbor, check_search_options
from imaginejax.algos.networks import NetConfig
from imaginejax.algos.td3bc import TD3BCHyperparams, TD3BCState, make_td3bc
from imaginejax.data.types import Batch


@struct.dataclass
class PRDCHyperparams(TD3BCHyperparams):
    """TD3+BC's traced hyperparameters (the reference uses α = 40 on HalfCheetah) and β of the search."""

    beta: jax.Array


def make_prdc(spec: Spec, net: NetConfig = NetConfig(), chunk: int = DEFAULT_CHUNK,
              subset: int | None = None) -> Algorithm:
    """PRDC for a continuous ``spec`` on TD3+BC's networks ``net``.

    chunk: dataset rows per step of the search (memory O(B · chunk)); subset: None (exact) or m rows drawn
    per buffer and update (approximate).
    """
    if spec.discrete:
        raise ValueError("make_prdc needs a continuous action space (spec.discrete=False); for discrete "
                         "actions use make_prdc_discrete")
    check_search_options(chunk, subset)
    td3bc = make_td3bc(spec, net)

    def default_hp(spec_: Spec) -> PRDCHyperparams:
        return PRDCHyperparams(**vars(td3bc.default_hp(spec_)), beta=jnp.float32(2.0))

    def update(state: TD3BCState, batch: Batch, key: jax.Array, hp: PRDCHyperparams,
               data: Datasets) -> tuple[TD3BCState, dict[str, jax.Array]]:
        search_key = None
        if subset is not None:
            key, search_key = jax.random.split(key)

        def nearest_action(batch: Batch, pi: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
            """â of the search for (o, π(o)): batch, π(o) (B, A) -> (â (B, A), metrics)."""
            nn = batch_neighbor(batch, pi, data, state.stats, hp.beta, chunk=chunk, subset=subset, key=search_key)
            return nn.action, {"data_mse": jnp.square(pi - batch.action).mean(), "nn_distance": nn.distance.mean(),
                               "nn_imaginary": nn.imaginary.astype(jnp.float32).mean()}

        return td3bc.update(state, batch, key, hp, data, bc_target=nearest_action)

    return td3bc._replace(name="prdc", update=update, default_hp=default_hp)
