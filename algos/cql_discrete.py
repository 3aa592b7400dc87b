"""Discrete conservative Q-learning, CQL(H) (Kumar et al. 2020) on a double DQN, language-conditioned.

With o = s ⊕ e(ℓ), a Q-network Q_θ(o, ·) ∈ R^n and its target copy θ', one update minimises

    L(θ) = E[h(Q_θ(o, a) − y)] + α E[log Σ_b exp Q_θ(o, b) − Q_θ(o, a)]          h: Huber, δ = 1
    y = r + γ (1 − d) Q_θ'(o', argmax_b Q_θ(o', b))                 (``double_q=False``: max_b Q_θ'(o', b))

with the logsumexp over all n actions, then θ' ← (1 − τ) θ' + τ θ every N-th update (reference: hard copy
every 8000). Acting: argmax_a Q_θ(o, a), or a ~ softmax(Q_θ(o, ·)). Reference choices (d3rlpy's
DiscreteCQL, BENCHMARK.md §4): docs/algorithms/cql.md.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import (DataStats, Datasets, RowWeights, adam, adam_step, huber, periodic_polyak_update,
                                     take_action_values, td_target)
from imaginejax.algos.networks import EncodedMLP, NetConfig
from imaginejax.data.types import Batch


@struct.dataclass
class CQLHyperparams:
    """Traced hyperparameters: lr 6.25e-5, α = 10, γ = 0.99, target every N = 8000 updates (int32), τ = 1."""

    learning_rate: jax.Array
    alpha: jax.Array
    gamma: jax.Array
    target_update_interval: jax.Array
    target_tau: jax.Array


@struct.dataclass
class CQLState:
    """Q-network θ, target θ', Adam state, updates done."""

    params: dict
    target_params: dict
    opt_state: optax.OptState
    step: jax.Array


def next_state_value(q_next_online: jax.Array, q_next_target: jax.Array, double_q: bool) -> jax.Array:
    """Q_θ'(o', argmax Q_θ(o', ·)) if ``double_q`` else max Q_θ'(o', ·): (B, n) each -> (B,)."""
    if double_q:
        return take_action_values(q_next_target, jnp.argmax(q_next_online, axis=-1))
    return jnp.max(q_next_target, axis=-1)


def cql_loss(q: jax.Array, action: jax.Array, target: jax.Array, alpha: jax.Array | float,
             weights: RowWeights | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Σ w_td h(Q(o, a) − y) + α (Σ w_down logsumexp_b Q(o, b) − Σ w_up Q(o, a)); uniform weights if None.

    q (B, n), action (B,) int, target (B,) -> (loss, metrics loss, td_loss, conservative_loss, q_data,
    logsumexp).
    """
    chex.assert_rank(q, 2)
    chex.assert_shape([action, target], (q.shape[0],))
    w = RowWeights.uniform(q.shape[0]) if weights is None else weights
    q_data = take_action_values(q, action)
    td = jnp.sum(w.td * huber(q_data - target))
    push_down = jnp.sum(w.push_down * jax.nn.logsumexp(q, axis=-1))
    push_up = jnp.sum(w.push_up * q_data)
    conservative = push_down - push_up
    loss = td + alpha * conservative
    return loss, {"loss": loss, "td_loss": td, "conservative_loss": conservative, "q_data": push_up,
                  "logsumexp": push_down}


def init_discrete_q(model: EncodedMLP, key: jax.Array, spec: Spec, learning_rate: jax.Array) -> CQLState:
    """Fresh Q-network, target = online, Adam with ``learning_rate``."""
    params = model.init(key, jnp.zeros((1, spec.obs_dim), jnp.float32))
    return CQLState(params=params, target_params=params, opt_state=adam(learning_rate).init(params),
                    step=jnp.zeros((), jnp.int32))


def discrete_cql_step(model: EncodedMLP, state: CQLState, batch: Batch, weights: RowWeights, hp: CQLHyperparams,
                      conservative_weight: jax.Array, double_q: bool = True) -> tuple[CQLState, dict[str, jax.Array]]:
    """One update on N weighted rows (module docstring), conservative weight α (CQL) or β (COMBO)."""
    q_next_target = model.apply(state.target_params, batch.next_observation)
    q_next_online = model.apply(state.params, batch.next_observation) if double_q else q_next_target
    next_value = jax.lax.stop_gradient(next_state_value(q_next_online, q_next_target, double_q))
    target = td_target(batch.reward, batch.terminal, next_value, hp.gamma)

    grads, metrics = jax.grad(
        lambda params: cql_loss(model.apply(params, batch.observation), batch.action, target, conservative_weight,
                                weights), has_aux=True)(state.params)
    params, opt_state = adam_step(state.params, grads, state.opt_state)
    count = state.step + 1
    target_params = periodic_polyak_update(state.target_params, params, count, hp.target_update_interval,
                                           hp.target_tau)
    metrics["target_q"] = jnp.sum(weights.td * target)
    return CQLState(params=params, target_params=target_params, opt_state=opt_state, step=count), metrics


def act_discrete_q(model: EncodedMLP, params: dict, obs: jax.Array, key: jax.Array, deterministic: bool) -> jax.Array:
    """obs (B, S+E) -> (B,) int32: argmax_a Q(o, a), or a ~ softmax(Q(o, ·))."""
    q = model.apply(params, obs)
    if deterministic:
        return jnp.argmax(q, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, q).astype(jnp.int32)


def make_cql_discrete(spec: Spec, net: NetConfig = NetConfig(), double_q: bool = True) -> Algorithm:
    """Discrete CQL for a discrete ``spec`` (n = spec.action_dim) with a Q-network of shapes ``net``."""
    if not spec.discrete:
        raise ValueError("make_cql_discrete is discrete CQL: spec.discrete must be True (for continuous actions "
                         "use imaginejax.algos.cql.make_cql)")
    model = EncodedMLP(net, out=spec.action_dim)

    def default_hp(spec_: Spec) -> CQLHyperparams:
        f = jnp.float32
        return CQLHyperparams(learning_rate=f(6.25e-5), alpha=f(10.0), gamma=f(0.99),
                              target_update_interval=jnp.int32(8000), target_tau=f(1.0))

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: CQLHyperparams) -> CQLState:
        return init_discrete_q(model, key, spec_, hp.learning_rate)

    def update(state: CQLState, batch: Batch, key: jax.Array, hp: CQLHyperparams,
               data: Datasets) -> tuple[CQLState, dict[str, jax.Array]]:
        return discrete_cql_step(model, state, batch, RowWeights.uniform(batch.reward.shape[0]), hp, hp.alpha,
                                 double_q)

    def act(state: CQLState, obs: jax.Array, key: jax.Array, hp: CQLHyperparams,
            deterministic: bool = True) -> jax.Array:
        return act_discrete_q(model, state.params, obs, key, deterministic)

    return Algorithm(name="cql_discrete", init=init, update=update, act=act, default_hp=default_hp)
