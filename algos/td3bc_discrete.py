"""Discrete TD3+BC: TD3+BC (Fujimoto & Gu 2021) with a categorical actor, our extension to discrete actions.

Actor π_φ(·|o) = softmax(z_φ(o)); the Q term becomes the exact expected value, the MSE the cross-entropy,
and the target the expectation under the (already smooth) categorical target policy:

    y = r + γ (1 − d) Σ_a' π_φ'(a'|o') min_i Q_θi'(o', a'),     L(θ) = Σ_i E[(Q_θi(o, a) − y)²]
    L(φ) = −λ E[Σ_a π_φ(a|o) Q_θ1(o, a)] + E[−log π_φ(a|o)],    λ = α / E|Σ_a π_φ(a|o) Q_θ1(o, a)|

Its stationary actor is π(b|s) = p(b|s) / (1 − λ (Q(s, b) − V^π(s))), p the data's action distribution.
Schedule, targets and normalisation as TD3+BC; ``update``'s ``bc_target`` replaces the cross-entropy's
target a as in TD3+BC. Derivation: docs/algorithms/td3bc_discrete.md.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import (DataStats, Datasets, adam, adam_step, masked_step, periodic_polyak_update,
                                     take_action_values, td_target, twin_critic_loss)
from imaginejax.algos.networks import EncodedMLP, NetConfig, TwinDiscreteCritic, first_critic_apply
from imaginejax.algos.td3bc import BCTarget, TD3BCState, dataset_action
from imaginejax.data.types import Batch


@struct.dataclass
class DiscreteTD3BCHyperparams:
    """Traced hyperparameters (as TD3+BC's, without the target-smoothing noise)."""

    actor_lr: jax.Array
    critic_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array
    policy_freq: jax.Array
    alpha: jax.Array


def expected_next_value(target_logits: jax.Array, q_next: jax.Array) -> jax.Array:
    """Σ_a' π'(a'|o') min_i Q_i'(o', a'): logits (B, n), q_next (2, B, n) -> (B,)."""
    chex.assert_shape(q_next, (2,) + target_logits.shape)
    return jnp.sum(jax.nn.softmax(target_logits, axis=-1) * jnp.min(q_next, axis=0), axis=-1)


def discrete_actor_loss(logits: jax.Array, q1: jax.Array, action: jax.Array,
                        alpha: jax.Array | float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """−λ mean Σ_a π(a|o) Q1(o, a) + mean(−log π(a|o)), λ = α / mean|Σ_a π Q1| (floored at 1e-6, no gradient).

    logits, q1 (B, n), action (B,) -> (loss, metrics actor_loss, lambda, cross_entropy, expected_q,
    policy_accuracy).
    """
    chex.assert_equal_shape([logits, q1])
    chex.assert_shape(action, (logits.shape[0],))
    expected_q = jnp.sum(jax.nn.softmax(logits, axis=-1) * q1, axis=-1)
    lam = alpha / jnp.maximum(jax.lax.stop_gradient(jnp.abs(expected_q).mean()), 1e-6)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, action).mean()
    loss = -lam * expected_q.mean() + ce
    return loss, {"actor_loss": loss, "lambda": lam, "cross_entropy": ce, "expected_q": expected_q.mean(),
                  "policy_accuracy": (jnp.argmax(logits, -1) == action).mean()}


def make_td3bc_discrete(spec: Spec, net: NetConfig = NetConfig()) -> Algorithm:
    """Discrete TD3+BC for a discrete ``spec``; the state is a :class:`~imaginejax.algos.td3bc.TD3BCState`."""
    if not spec.discrete:
        raise ValueError("make_td3bc_discrete needs a discrete action space; for continuous actions use "
                         "imaginejax.algos.td3bc.make_td3bc")
    actor = EncodedMLP(net, out=spec.action_dim)
    critic = TwinDiscreteCritic(net, spec.action_dim)

    def default_hp(spec_: Spec) -> DiscreteTD3BCHyperparams:
        f = jnp.float32
        return DiscreteTD3BCHyperparams(actor_lr=f(3e-4), critic_lr=f(3e-4), gamma=f(0.99), tau=f(0.005),
                                        policy_freq=jnp.int32(2), alpha=f(2.5))

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: DiscreteTD3BCHyperparams) -> TD3BCState:
        actor_key, critic_key = jax.random.split(key)
        obs = jnp.zeros((1, spec_.obs_dim), jnp.float32)
        actor_params, critic_params = actor.init(actor_key, obs), critic.init(critic_key, obs)
        return TD3BCState(actor_params=actor_params, critic_params=critic_params, actor_target=actor_params,
                          critic_target=critic_params, actor_opt=adam(hp.actor_lr).init(actor_params),
                          critic_opt=adam(hp.critic_lr).init(critic_params), step=jnp.zeros((), jnp.int32),
                          stats=stats)

    def update(state: TD3BCState, batch: Batch, key: jax.Array, hp: DiscreteTD3BCHyperparams, data: Datasets,
               bc_target: BCTarget = dataset_action) -> tuple[TD3BCState, dict[str, jax.Array]]:
        """One step; ``bc_target(batch, logits z(o))`` (no gradient) gives the cross-entropy's target action."""
        del key, data
        obs = state.stats.observation(batch.observation)
        next_obs = state.stats.observation(batch.next_observation)

        next_value = expected_next_value(actor.apply(state.actor_target, next_obs),
                                         critic.apply(state.critic_target, next_obs))
        target = jax.lax.stop_gradient(td_target(batch.reward, batch.terminal, next_value, hp.gamma))

        def critic_loss_fn(params):
            q = jax.vmap(take_action_values, in_axes=(0, None))(critic.apply(params, obs), batch.action)  # (2, B)
            return twin_critic_loss(q, target), q

        (c_loss, q_data), c_grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(state.critic_params)
        critic_params, critic_opt = adam_step(state.critic_params, c_grads, state.critic_opt)

        q1 = jax.lax.stop_gradient(first_critic_apply(critic, critic_params, obs))  # (B, n), once

        def actor_loss_fn(params):
            logits = actor.apply(params, obs)
            target_action, target_metrics = bc_target(batch, jax.lax.stop_gradient(logits))
            loss, metrics = discrete_actor_loss(logits, q1, target_action, hp.alpha)
            return loss, {**metrics, **target_metrics}

        a_grads, a_metrics = jax.grad(actor_loss_fn, has_aux=True)(state.actor_params)

        count = state.step + 1
        due = (count % jnp.maximum(hp.policy_freq, 1)) == 0
        actor_params, actor_opt = masked_step(due, adam_step(state.actor_params, a_grads, state.actor_opt),
                                              (state.actor_params, state.actor_opt))
        new_state = TD3BCState(
            actor_params=actor_params, critic_params=critic_params,
            actor_target=periodic_polyak_update(state.actor_target, actor_params, count, hp.policy_freq, hp.tau),
            critic_target=periodic_polyak_update(state.critic_target, critic_params, count, hp.policy_freq, hp.tau),
            actor_opt=actor_opt, critic_opt=critic_opt, step=count, stats=state.stats)
        metrics = {"loss": c_loss, "critic_loss": c_loss, **a_metrics, "q1_data": q_data[0].mean(),
                   "target_q": target.mean(), "actor_updated": due.astype(jnp.float32)}
        return new_state, metrics

    def act(state: TD3BCState, obs: jax.Array, key: jax.Array, hp: DiscreteTD3BCHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) raw -> (B,) int32: argmax_a π(a|o), or a ~ π(·|o)."""
        logits = actor.apply(state.actor_params, state.stats.observation(obs))
        if deterministic:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(key, logits).astype(jnp.int32)

    return Algorithm(name="td3bc_discrete", init=init, update=update, act=act, default_hp=default_hp)
