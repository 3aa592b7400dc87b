"""PRDC: policy regularisation with dataset constraint (Ran et al. 2023), language-conditioned, for
continuous and discrete actions.

Continuous PRDC is TD3+BC (:mod:`imaginejax.algos.td3bc`: the same critics, target smoothing, delayed
actor and Polyak targets, λ = α / mean|Q|) with the behaviour-cloning term's target replaced by the
action of the dataset point nearest to the policy's own (state, action):

    (ŝ, â) = argmin_{(s_j, a_j) ∈ D}  ‖β·o − β·o_j‖² + ‖π_φ(o) − a_j‖²,        o = s̃ ⊕ e(ℓ)
    L(φ) = −λ · E_B[ Q_θ1(o, π_φ(o)) ]  +  E_B,A[ (π_φ(o) − â)² ]             β = 2, α = 2.5 (40 HalfCheetah)

The search has no gradient (â is a dataset action); the Q term and λ are TD3+BC's. k = 1 neighbour.
In code, PRDC's update *is* TD3+BC's (:func:`~imaginejax.algos.td3bc.td3bc_step`,
:func:`~imaginejax.algos.td3bc_discrete.discrete_td3bc_step`) with the search passed as its
``bc_target`` hook: one implementation of the TD3 step for both algorithms.
A large β makes the state part dominate, so â is the action at the nearest dataset state (TD3+BC's BC
term when the query state is itself a dataset state); a small β lets the policy choose any dataset action
near its own output: the constraint keeps π(s) close to *some* action the data took at a nearby state,
instead of the one logged at s.

What "state" means in the search. The policy input o = s̃ ⊕ e(ℓ): the state normalised as TD3+BC
normalises it (s̃ = (s − μ)/σ with the real buffer's statistics in ``hp.normalizer``) concatenated with
the raw instruction embedding, the whole scaled by β. This is the space the actor and critics see, and
the reference's PRDC builds its KD-tree on its ``observations``, which already hold the embedding. The
embedding part β²‖e − e_j‖² is zero between points of the same instruction and makes points of other
instructions far (with MiniLM embeddings, 2β²(1 − cos) ≥ ≈ 1–3 for distinct instructions), so the
neighbour is normally an action taken for the same task.

Which dataset. The search set is the support of the run's batch distribution: the real buffer when the
batch has real rows, the imaginary buffer when it has imaginary rows (decided per update from
``batch.imaginary``, i.e. exactly by the run's mixing ratio: ratio 0 searches only real data, 1 only
imaginary, anything between their union). Both are searched with the exact chunked brute force of
:mod:`imaginejax.algos.neighbors`, inside the compiled update.

Discrete PRDC (on discrete TD3+BC, :mod:`imaginejax.algos.td3bc_discrete`: categorical actor
π_φ(·|o) = softmax(z_φ(o)), expected-Q actor term, expected-SARSA critic target). Derivation:

1. **The joint space uses the one-hot action** e_a ∈ {0, 1}^n, the natural embedding of a categorical
   action in R^n (two different actions are at distance √2, all alike).
2. **The query action is the probability vector** p = π_φ(·|o) = E_{a∼π}[e_a], the policy's point in the
   same simplex. Its distance to a one-hot e_b ranks dataset actions exactly as the *expected* squared
   distance of a sampled action does:

       ‖p − e_b‖² = ‖p‖² − 2 p_b + 1,     E_{a∼π} ‖e_a − e_b‖² = 2 (1 − p_b),

   which differ by 1 − ‖p‖², a constant in b. So (ŝ, â) = argmin_j β²‖o − o_j‖² + ‖p − e_{a_j}‖² is the
   dataset point nearest in expectation to the policy's (state, sampled action); among dataset points at
   the same state it picks the action the policy already finds most probable (the action term differs
   by 2(p_b − p_c) ∈ [−2, 2] between two of them, the analogue of the continuous ‖π − a‖² ∈ [0, 4A]).
3. **The regulariser is the cross-entropy** to the neighbour's action, −log π_φ(â|o), the log-likelihood
   counterpart of the MSE as in discrete TD3+BC (its gradient p − e_â does not vanish when π is
   confidently wrong, the squared error's does):

       L(φ) = −λ · E_B[ Σ_a π_φ(a|o) Q_θ1(o, a) ]  +  E_B[ −log π_φ(â|o) ],    λ = α / E_B|V^π(o)|.

   With â fixed, discrete TD3+BC's stationary point applies with the data's conditional action
   distribution replaced by that of the neighbours' actions.

Datasets as arguments. ``init(key, spec, hp)`` and ``update(state, batch, key, hp)`` do not see the
datasets, and copying them into every run's ``hp`` or state would store R copies. The datasets are
bound into ``hp.search`` (a :class:`~imaginejax.algos.neighbors.ConstraintData`) *inside* the compiled
interval, from the engine's own ``real`` / ``imag`` arguments: :func:`bind_datasets`. Under the engine's
``vmap`` over runs the bound buffers are unbatched, so all runs share one copy. The algorithm record
carries :func:`bind_datasets` as its ``bind_data`` hook, which the engine calls first in every compiled
interval; ``update`` with an unbound ``hp`` (outside the engine) raises an error that says what to do.

Cost. The exact search costs O(K·B·(S + A')) per update (K dataset rows) and is done on every update:
TD3+BC evaluates its actor loss every update and applies it every ``policy_freq``-th; with a traced
``policy_freq`` under ``vmap`` a ``lax.cond`` would compute both branches anyway. ``subset = m`` (off by
default) searches, per update, m random rows of each buffer plus the batch's own rows (every batch row is
a dataset row of the searched set) instead of all K: approximate, never farther than the query's own
row. Measured costs and recall: ``experiments/benchmarks/prdc_nn_search.py``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import Datasets, TwinCritic, TwinDiscreteCritic
from imaginejax.algos.cql import take_action_values
from imaginejax.algos.neighbors import Neighbor, nearest_neighbor, rows_as_buffer
from imaginejax.algos.networks import EncodedMLP, NetConfig
from imaginejax.algos.td3bc import TD3BCState, td3bc_act, td3bc_init, td3bc_step
from imaginejax.algos.td3bc_discrete import categorical_act, discrete_td3bc_step
from imaginejax.data.types import Batch

__all__ = ["DiscretePRDCHyperparams", "PRDCHyperparams", "make_discrete_prdc", "make_prdc"]

# Dataset rows per step of the chunked search (rounded down to whole blocks of neighbors.BLOCK rows).
DEFAULT_CHUNK = 4096


@struct.dataclass
class PRDCHyperparams:
    """Traced hyperparameters of continuous PRDC: those of :class:`~imaginejax.algos.td3bc.TD3BCHyperparams`
    (same meanings and defaults; the reference uses α = 40 on HalfCheetah), plus β and the bound datasets.
    The fields are spelled out, not inherited, to keep ``beta`` before ``normalizer`` (the pytree order).

    Attributes:
      beta: () β, weight of the state in the joint (β·o, a) search space (2).
      search: the datasets searched, bound inside the compiled call (:func:`bind_datasets`); None until then.
    """

    actor_lr: jax.Array
    critic_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array
    policy_noise: jax.Array
    noise_clip: jax.Array
    policy_freq: jax.Array
    alpha: jax.Array
    beta: jax.Array


@struct.dataclass
class DiscretePRDCHyperparams:
    """Traced hyperparameters of discrete PRDC: those of
    :class:`~imaginejax.algos.td3bc_discrete.DiscreteTD3BCHyperparams` (same meanings and defaults), plus β
    and the bound datasets (spelled out as in :class:`PRDCHyperparams`).

    Attributes:
      beta: () β, weight of the state in the joint (β·o, one-hot a) search space (2).
      search: the datasets searched, bound inside the compiled call (:func:`bind_datasets`); None until then.
    """

    actor_lr: jax.Array
    critic_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array
    policy_freq: jax.Array
    alpha: jax.Array
    beta: jax.Array


def _neighbor_metrics(nn: Neighbor) -> dict[str, jax.Array]:
    return {"nn_distance": nn.distance.mean(), "nn_imaginary": nn.imaginary.astype(jnp.float32).mean()}


def _check_search(chunk: int, subset: int | None) -> None:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a static int >= 1 (dataset rows per search step), got {chunk!r}")
    if subset is not None and (isinstance(subset, bool) or not isinstance(subset, int) or subset < 1):
        raise ValueError(f"subset must be None (exact search, the default) or a static int >= 1 (rows drawn "
                         f"per buffer and update), got {subset!r}")


def _approximate(subset: int | None, key: jax.Array | None, batch: Batch) -> dict[str, Any]:
    """Search options: exact (nothing) or ``subset`` random rows per buffer plus the batch's own rows."""
    if subset is None:
        return {}
    return {"subset": subset, "key": key,
            "candidates": (rows_as_buffer(batch.state, batch.embedding, batch.action), batch.imaginary)}


def make_prdc(spec: Spec, net: NetConfig = NetConfig(), chunk: int = DEFAULT_CHUNK,
              subset: int | None = None) -> Algorithm:
    """Builds continuous PRDC for ``spec`` (must be continuous) with TD3+BC's networks of shapes ``net``.

    Args:
      spec: environment interface.
      net: static shapes of the actor and each critic (TD3+BC's 256×256 heads by default).
      chunk: static, dataset rows per step of the nearest-neighbour search (memory O(B · chunk)).
      subset: static; None (default) is the exact search. m searches, per update, m random rows of each
        buffer plus the batch's own rows instead (approximate; see :mod:`imaginejax.algos.neighbors`).

    The state is a :class:`~imaginejax.algos.td3bc.TD3BCState`; the update is TD3+BC's
    (:func:`~imaginejax.algos.td3bc.td3bc_step`) with the neighbour's action as the BC target.
    """
    if spec.discrete:
        raise ValueError("make_prdc needs a continuous action space (spec.discrete=False); for discrete "
                         "actions use make_discrete_prdc")
    _check_search(chunk, subset)
    actor = EncodedMLP(net, out=spec.action_dim, squash=True)
    critic = TwinCritic(net)

    def default_hp(spec_: Spec) -> PRDCHyperparams:
        f = jnp.float32
        return PRDCHyperparams(actor_lr=f(3e-4), critic_lr=f(3e-4), gamma=f(0.99), tau=f(0.005),
                               policy_noise=f(0.2), noise_clip=f(0.5), policy_freq=jnp.int32(2), alpha=f(2.5),
                               beta=f(2.0))

    def update(state: TD3BCState, batch: Batch, key: jax.Array, hp: PRDCHyperparams,
               data: Datasets) -> tuple[TD3BCState, dict[str, jax.Array]]:
        """TD3+BC's critic step every update; the actor step (towards the nearest neighbour's action) and
        the targets every ``policy_freq``-th update.

        Metrics (pre-update batch means): loss (= critic_loss), critic_loss, actor_loss, lambda, bc_mse
        (the MSE to the neighbours' actions), data_mse (to the batch's own actions, for comparison),
        nn_distance, nn_imaginary (fraction of neighbours from the imaginary buffer), q1_data, target_q,
        actor_updated.
        """
        search_key = None
        if subset is not None:
            key, search_key = jax.random.split(key)

        def neighbour_action(pi: jax.Array, rows: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
            nn = nearest_neighbor(rows.state, rows.embedding, pi, data, state.stats, hp.beta, chunk=chunk,
                                  use_real=~jnp.all(rows.imaginary), use_imag=jnp.any(rows.imaginary),
                                  **_approximate(subset, search_key, rows))
            return nn.action, {"data_mse": jnp.square(pi - rows.action).mean(), **_neighbor_metrics(nn)}

        return td3bc_step(actor, critic, state, batch, key, hp, bc_target=neighbour_action)

    # Acting and the initial state are TD3+BC's.
    return Algorithm(name="prdc", init=td3bc_init(actor, critic), update=update, act=td3bc_act(actor),
                     default_hp=default_hp)


def make_discrete_prdc(spec: Spec, net: NetConfig = NetConfig(), chunk: int = DEFAULT_CHUNK,
                       subset: int | None = None) -> Algorithm:
    """Builds discrete PRDC for ``spec`` (must be discrete) on discrete TD3+BC's networks of shapes ``net``.

    Args:
      spec: environment interface; ``spec.action_dim`` is the number of actions n.
      net: static shapes of the actor and each critic.
      chunk: static, dataset rows per step of the nearest-neighbour search.
      subset: static; None (default) is the exact search; m searches m random rows per buffer and update,
        plus the batch's own rows.

    The update is discrete TD3+BC's (:func:`~imaginejax.algos.td3bc_discrete.discrete_td3bc_step`) with
    the neighbour's action as the cross-entropy's target.
    """
    if not spec.discrete:
        raise ValueError("make_discrete_prdc needs a discrete action space; for continuous actions use make_prdc")
    _check_search(chunk, subset)
    actor = EncodedMLP(net, out=spec.action_dim)
    critic = TwinDiscreteCritic(net, spec.action_dim)
    num_actions = spec.action_dim

    def default_hp(spec_: Spec) -> DiscretePRDCHyperparams:
        f = jnp.float32
        return DiscretePRDCHyperparams(actor_lr=f(3e-4), critic_lr=f(3e-4), gamma=f(0.99), tau=f(0.005),
                                       policy_freq=jnp.int32(2), alpha=f(2.5), beta=f(2.0))

    def update(state: TD3BCState, batch: Batch, key: jax.Array, hp: DiscretePRDCHyperparams,
               data: Datasets) -> tuple[TD3BCState, dict[str, jax.Array]]:
        """Discrete TD3+BC's critic step every update; the actor step (cross-entropy to the nearest
        neighbour's action) and the targets every ``policy_freq``-th update.

        Metrics (pre-update batch means): loss (= critic_loss), critic_loss, actor_loss, lambda,
        cross_entropy (to the neighbours' actions), expected_q, policy_accuracy (argmax π = neighbour's
        action), data_cross_entropy (to the batch's own actions), nn_distance, nn_imaginary, q1_data,
        target_q, actor_updated.
        """

        def neighbour_action(logits: jax.Array, rows: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
            probs = jax.nn.softmax(logits, axis=-1)
            nn = nearest_neighbor(rows.state, rows.embedding, probs, data, state.stats, hp.beta,
                                  chunk=chunk, num_actions=num_actions, use_real=~jnp.all(rows.imaginary),
                                  use_imag=jnp.any(rows.imaginary), **_approximate(subset, key, rows))
            log_probs = jax.nn.log_softmax(logits, axis=-1)
            return nn.action, {"data_cross_entropy": -take_action_values(log_probs, rows.action).mean(),
                               **_neighbor_metrics(nn)}

        return discrete_td3bc_step(actor, critic, state, batch, hp, bc_target=neighbour_action)

    # Acting and the initial state are discrete TD3+BC's.
    return Algorithm(name="prdc_discrete", init=td3bc_init(actor, critic), update=update,
                     act=categorical_act(actor), default_hp=default_hp)
