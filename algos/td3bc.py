"""TD3+BC (Fujimoto & Gu 2021), language-conditioned, continuous actions in [-1, 1]^A.

On o = s̃ ⊕ e(ℓ) (state normalised with the real data's statistics, instruction embedding), with actor
π_φ, twin critics Q_θ1, Q_θ2 and target copies φ', θ'; update k = 1, 2, …, d = 1 on true terminations:

    ã = clip(π_φ'(o') + clip(σ_n ε, −c, c), −1, 1),       y = r + γ (1 − d) min_i Q_θi'(o', ã)
    L(θ) = Σ_i E[(Q_θi(o, a) − y)²]                                              (every update)
    L(φ) = −λ E[Q_θ1(o, π_φ(o))] + E[(π_φ(o) − a)²],   λ = α / E|Q_θ1(o, π_φ(o))|  (no gradient in λ)
    φ' ← (1 − τ) φ' + τ φ,   θ' ← (1 − τ) θ' + τ θ            (actor and targets when k mod policy_freq = 0)

The actor loss is taken at the just-updated critic; ``update``'s ``bc_target`` replaces the BC target a
(PRDC: the nearest dataset neighbour's action). Notes: docs/algorithms/td3bc.md.
"""

from __future__ import annotations

from typing import Callable

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import (DataStats, Datasets, adam, adam_step, masked_step, periodic_polyak_update,
                                     td_target, twin_critic_loss)
from imaginejax.algos.networks import EncodedMLP, NetConfig, TwinCritic, first_critic_apply
from imaginejax.data.types import Batch


@struct.dataclass
class TD3BCHyperparams:
    """Traced hyperparameters; σ_n = policy_noise, c = noise_clip, policy_freq an int32."""

    actor_lr: jax.Array
    critic_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array
    policy_noise: jax.Array
    noise_clip: jax.Array
    policy_freq: jax.Array
    alpha: jax.Array


@struct.dataclass
class TD3BCState:
    """Actor φ, twin critics θ (stacked, leading axis 2), targets, Adam states, updates done, data statistics."""

    actor_params: dict
    critic_params: dict
    actor_target: dict
    critic_target: dict
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    step: jax.Array
    stats: DataStats


def smoothed_target_action(target_action: jax.Array, noise: jax.Array, policy_noise: jax.Array | float,
                           noise_clip: jax.Array | float) -> jax.Array:
    """ã = clip(π'(o') + clip(σ_n ε, −c, c), −1, 1): target_action, noise (B, A) -> (B, A)."""
    chex.assert_equal_shape([target_action, noise])
    return jnp.clip(target_action + jnp.clip(policy_noise * noise, -noise_clip, noise_clip), -1.0, 1.0)


def actor_loss(q1_pi: jax.Array, pi: jax.Array, action: jax.Array,
               alpha: jax.Array | float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """−λ mean Q1(o, π(o)) + mean (π(o) − a)², λ = α / mean|Q1| (floored at 1e-6, no gradient).

    q1_pi (B,), pi and action (B, A) -> (loss, metrics actor_loss, lambda, bc_mse).
    """
    chex.assert_equal_shape([pi, action])
    chex.assert_shape(q1_pi, (pi.shape[0],))
    lam = alpha / jnp.maximum(jax.lax.stop_gradient(jnp.abs(q1_pi).mean()), 1e-6)
    bc = jnp.square(pi - action).mean()
    loss = -lam * q1_pi.mean() + bc
    return loss, {"actor_loss": loss, "lambda": lam, "bc_mse": bc}


BCTarget = Callable[[Batch, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]


def dataset_action(batch: Batch, pi: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """TD3+BC's BC target, the batch's own action: batch, π(o) (B, A) or logits (B, n) -> (a, no metrics)."""
    return batch.action, {}


def make_td3bc(spec: Spec, net: NetConfig = NetConfig()) -> Algorithm:
    """TD3+BC for a continuous ``spec``; actor and each critic have heads ``net`` (the reference's 256×256)."""
    if spec.discrete:
        raise ValueError("make_td3bc needs a continuous action space (spec.discrete=False); for discrete "
                         "actions use algos.make(\"td3bc\", spec) (imaginejax.algos.td3bc_discrete)")
    actor = EncodedMLP(net, out=spec.action_dim, squash=True)
    critic = TwinCritic(net)

    def default_hp(spec_: Spec) -> TD3BCHyperparams:
        f = jnp.float32
        return TD3BCHyperparams(actor_lr=f(3e-4), critic_lr=f(3e-4), gamma=f(0.99), tau=f(0.005),
                                policy_noise=f(0.2), noise_clip=f(0.5), policy_freq=jnp.int32(2), alpha=f(2.5))

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: TD3BCHyperparams) -> TD3BCState:
        actor_key, critic_key = jax.random.split(key)
        obs = jnp.zeros((1, spec_.obs_dim), jnp.float32)
        actor_params = actor.init(actor_key, obs)
        critic_params = critic.init(critic_key, obs, jnp.zeros((1, spec_.action_dim), jnp.float32))
        return TD3BCState(actor_params=actor_params, critic_params=critic_params, actor_target=actor_params,
                          critic_target=critic_params, actor_opt=adam(hp.actor_lr).init(actor_params),
                          critic_opt=adam(hp.critic_lr).init(critic_params), step=jnp.zeros((), jnp.int32),
                          stats=stats)

    def update(state: TD3BCState, batch: Batch, key: jax.Array, hp: TD3BCHyperparams, data: Datasets,
               bc_target: BCTarget = dataset_action) -> tuple[TD3BCState, dict[str, jax.Array]]:
        """One step; ``bc_target(batch, π(o))`` (no gradient) gives the BC term's target and its metrics."""
        del data
        obs = state.stats.observation(batch.observation)
        next_obs = state.stats.observation(batch.next_observation)

        noise = jax.random.normal(key, batch.action.shape, jnp.float32)
        next_action = smoothed_target_action(actor.apply(state.actor_target, next_obs), noise, hp.policy_noise,
                                             hp.noise_clip)
        q_next = critic.apply(state.critic_target, next_obs, next_action)  # (2, B)
        target = jax.lax.stop_gradient(td_target(batch.reward, batch.terminal, jnp.min(q_next, axis=0), hp.gamma))

        def critic_loss_fn(params):
            q = critic.apply(params, obs, batch.action)  # (2, B)
            return twin_critic_loss(q, target), q

        (c_loss, q_data), c_grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(state.critic_params)
        critic_params, critic_opt = adam_step(state.critic_params, c_grads, state.critic_opt)

        def actor_loss_fn(params):
            pi = actor.apply(params, obs)
            target_action, target_metrics = bc_target(batch, jax.lax.stop_gradient(pi))
            loss, metrics = actor_loss(first_critic_apply(critic, critic_params, obs, pi), pi, target_action, hp.alpha)
            return loss, {**metrics, **target_metrics}

        a_grads, a_metrics = jax.grad(actor_loss_fn, has_aux=True)(state.actor_params)

        # The actor (with its Adam state) and the targets move only on every policy_freq-th update.
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

    def act(state: TD3BCState, obs: jax.Array, key: jax.Array, hp: TD3BCHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) raw -> (B, A): π(o), plus the clipped smoothing noise when not deterministic."""
        action = actor.apply(state.actor_params, state.stats.observation(obs))
        if deterministic:
            return action
        noise = jax.random.normal(key, action.shape, jnp.float32)
        return smoothed_target_action(action, noise, hp.policy_noise, hp.noise_clip)

    return Algorithm(name="td3bc", init=init, update=update, act=act, default_hp=default_hp)
