"""Discrete batch-constrained Q-learning (Fujimoto et al. 2019, "Benchmarking batch deep RL"), language-conditioned.

A Q head Q_θ(o, ·) and an imitation head z_θ(o, ·) (π_b = softmax z) over o = s ⊕ e(ℓ); the action filter
keeps what the data makes plausible, and the constrained greedy policy acts and bootstraps:

    A_τ(o) = {a : z(o, a) − max_b z(o, b) > log τ},     π(o) = argmax_{a ∈ A_τ(o)} Q_θ(o, a)
    y = r + γ (1 − d) Q_θ'(o', π(o'))
    L(θ) = E[h(Q_θ(o, a) − y)] + E[−log π_b(a|o)] + β E_{o,b}[z_θ(o, b)²]           h: Huber, β = 1e-2

θ' follows the periodic Polyak rule (hard copy every 8000 updates). Choices (shared encoder, filter in
the target): docs/algorithms/bcq.md.
"""

from __future__ import annotations

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import (DataStats, Datasets, adam, adam_step, huber, periodic_polyak_update,
                                     take_action_values, td_target)
from imaginejax.algos.networks import LanguageEncoder, MLP, NetConfig
from imaginejax.data.types import Batch


class QImitationNet(nn.Module):
    """obs (..., S+E) -> (q, logits) (..., n): a Q head and an imitation head on one encoder (or two)."""

    config: NetConfig
    num_actions: int
    share_encoder: bool = True

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        width, layers = self.config.encoder_width, self.config.encoder_layers
        h_q = LanguageEncoder(width, layers, name="encoder")(obs)
        h_b = h_q if self.share_encoder else LanguageEncoder(width, layers, name="imitation_encoder")(obs)
        q = MLP(self.config.hidden, self.num_actions, name="q_head")(h_q)
        logits = MLP(self.config.hidden, self.num_actions, name="imitation_head")(h_b)
        return q, logits


@struct.dataclass
class BCQHyperparams:
    """Traced hyperparameters: lr 6.25e-5, τ = 0.3 (threshold), β = 1e-2 (logit_l2), γ, target every N (int32)."""

    learning_rate: jax.Array
    threshold: jax.Array
    logit_l2: jax.Array
    gamma: jax.Array
    target_update_interval: jax.Array
    target_tau: jax.Array


@struct.dataclass
class BCQState:
    """Both heads θ, target θ', Adam state, updates done."""

    params: dict
    target_params: dict
    opt_state: optax.OptState
    step: jax.Array


def action_filter(logits: jax.Array, threshold: jax.Array | float) -> jax.Array:
    """A_τ(o) as a (B, n) bool mask from logits (B, n); τ = 0 allows every action, the likeliest always passes."""
    log_ratio = logits - jnp.max(logits, axis=-1, keepdims=True)
    return log_ratio > jnp.log(threshold)


def filtered_argmax(q: jax.Array, logits: jax.Array, threshold: jax.Array | float) -> jax.Array:
    """argmax_{a ∈ A_τ(o)} Q(o, a): q, logits (B, n) -> (B,) int32."""
    allowed = action_filter(logits, threshold)
    return jnp.argmax(jnp.where(allowed, q, -jnp.inf), axis=-1).astype(jnp.int32)


def bcq_loss(q: jax.Array, logits: jax.Array, action: jax.Array, target: jax.Array,
             logit_l2: jax.Array | float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """mean h(Q(o, a) − y) + mean(−log softmax(z)_a) + β mean(z²): q, logits (B, n), action, target (B,).

    Returns (loss, metrics loss, td_loss, imitation_loss, logit_penalty, q_data, imitation_accuracy).
    """
    chex.assert_equal_shape([q, logits])
    chex.assert_shape([action, target], (q.shape[0],))
    q_data = take_action_values(q, action)
    td = huber(q_data - target).mean()
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, action).mean()
    penalty = jnp.square(logits).mean()
    loss = td + nll + logit_l2 * penalty
    return loss, {"loss": loss, "td_loss": td, "imitation_loss": nll, "logit_penalty": penalty,
                  "q_data": q_data.mean(), "imitation_accuracy": (jnp.argmax(logits, -1) == action).mean()}


def make_bcq_discrete(spec: Spec, net: NetConfig = NetConfig(), share_encoder: bool = True) -> Algorithm:
    """Discrete BCQ for a discrete ``spec``: encoder and heads of shapes ``net``, one encoder or two."""
    if not spec.discrete:
        raise ValueError("make_bcq_discrete is discrete BCQ: spec.discrete must be True (continuous BCQ, with "
                         "its VAE and perturbation network, is make_bcq)")
    model = QImitationNet(net, spec.action_dim, share_encoder)

    def default_hp(spec_: Spec) -> BCQHyperparams:
        f = jnp.float32
        return BCQHyperparams(learning_rate=f(6.25e-5), threshold=f(0.3), logit_l2=f(1e-2), gamma=f(0.99),
                              target_update_interval=jnp.int32(8000), target_tau=f(1.0))

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: BCQHyperparams) -> BCQState:
        params = model.init(key, jnp.zeros((1, spec_.obs_dim), jnp.float32))
        return BCQState(params=params, target_params=params, opt_state=adam(hp.learning_rate).init(params),
                        step=jnp.zeros((), jnp.int32))

    def update(state: BCQState, batch: Batch, key: jax.Array, hp: BCQHyperparams,
               data: Datasets) -> tuple[BCQState, dict[str, jax.Array]]:
        q_next, logits_next = model.apply(state.params, batch.next_observation)
        q_next_target, _ = model.apply(state.target_params, batch.next_observation)
        next_action = filtered_argmax(q_next, logits_next, hp.threshold)
        next_value = jax.lax.stop_gradient(take_action_values(q_next_target, next_action))
        target = td_target(batch.reward, batch.terminal, next_value, hp.gamma)

        grads, metrics = jax.grad(lambda params: bcq_loss(*model.apply(params, batch.observation), batch.action,
                                                          target, hp.logit_l2), has_aux=True)(state.params)
        params, opt_state = adam_step(state.params, grads, state.opt_state)
        count = state.step + 1
        target_params = periodic_polyak_update(state.target_params, params, count, hp.target_update_interval,
                                               hp.target_tau)
        metrics["target_q"] = target.mean()
        metrics["allowed_actions"] = action_filter(logits_next, hp.threshold).sum(-1).mean()
        return BCQState(params=params, target_params=target_params, opt_state=opt_state, step=count), metrics

    def act(state: BCQState, obs: jax.Array, key: jax.Array, hp: BCQHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) -> (B,) int32: the filtered argmax, or a ~ softmax(Q) restricted to A_τ(o)."""
        q, logits = model.apply(state.params, obs)
        if deterministic:
            return filtered_argmax(q, logits, hp.threshold)
        allowed = action_filter(logits, hp.threshold)
        return jax.random.categorical(key, jnp.where(allowed, q, -jnp.inf)).astype(jnp.int32)

    return Algorithm(name="bcq_discrete", init=init, update=update, act=act, default_hp=default_hp)
