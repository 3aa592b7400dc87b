"""Discrete PRDC: PRDC (Ran et al. 2023) on discrete TD3+BC, our extension to discrete actions.

The joint space uses the one-hot action e_a and the policy's probability vector p = π_φ(·|o), whose
distance ‖p − e_b‖² = ‖p‖² − 2 p_b + 1 ranks dataset actions as the expected distance of a sampled action;
the regulariser is the cross-entropy to the neighbour's action:

    (ô, â) = argmin_{(o_j, a_j) ∈ D}  β² ‖o − o_j‖² + ‖π_φ(·|o) − e_{a_j}‖²                    (no gradient)
    L(φ) = −λ E[Σ_a π_φ(a|o) Q_θ1(o, a)] + E[−log π_φ(â|o)],   λ = α / E|Σ_a π_φ(a|o) Q_θ1(o, a)|

Critics, targets and schedule are discrete TD3+BC's (:mod:`imaginejax.algos.td3bc_discrete`); the search
set as in :mod:`imaginejax.algos.prdc`. Derivation: docs/algorithms/prdc.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import (DataStats, Datasets, adam, adam_step, masked_step, periodic_polyak_update,
                                     take_action_values, td_target, twin_critic_loss)
from imaginejax.algos.neighbors import DEFAULT_CHUNK, batch_neighbor, check_search_options
from imaginejax.algos.networks import EncodedMLP, NetConfig, TwinDiscreteCritic, first_critic_apply
from imaginejax.algos.td3bc import TD3BCState
from imaginejax.algos.td3bc_discrete import discrete_actor_loss, expected_next_value
from imaginejax.data.types import Batch


@struct.dataclass
class DiscretePRDCHyperparams:
    """Discrete TD3+BC's traced hyperparameters and β of the search."""

    actor_lr: jax.Array
    critic_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array
    policy_freq: jax.Array
    alpha: jax.Array
    beta: jax.Array


def make_discrete_prdc(spec: Spec, net: NetConfig = NetConfig(), chunk: int = DEFAULT_CHUNK,
                       subset: int | None = None) -> Algorithm:
    """Discrete PRDC for a discrete ``spec`` on discrete TD3+BC's networks ``net``; chunk, subset as
    :func:`~imaginejax.algos.prdc.make_prdc`."""
    if not spec.discrete:
        raise ValueError("make_discrete_prdc needs a discrete action space; for continuous actions use make_prdc")
    check_search_options(chunk, subset)
    actor = EncodedMLP(net, out=spec.action_dim)
    critic = TwinDiscreteCritic(net, spec.action_dim)
    num_actions = spec.action_dim

    def default_hp(spec_: Spec) -> DiscretePRDCHyperparams:
        f = jnp.float32
        return DiscretePRDCHyperparams(actor_lr=f(3e-4), critic_lr=f(3e-4), gamma=f(0.99), tau=f(0.005),
                                       policy_freq=jnp.int32(2), alpha=f(2.5), beta=f(2.0))

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: DiscretePRDCHyperparams) -> TD3BCState:
        actor_key, critic_key = jax.random.split(key)
        obs = jnp.zeros((1, spec_.obs_dim), jnp.float32)
        actor_params, critic_params = actor.init(actor_key, obs), critic.init(critic_key, obs)
        return TD3BCState(actor_params=actor_params, critic_params=critic_params, actor_target=actor_params,
                          critic_target=critic_params, actor_opt=adam(hp.actor_lr).init(actor_params),
                          critic_opt=adam(hp.critic_lr).init(critic_params), step=jnp.zeros((), jnp.int32),
                          stats=stats)

    def update(state: TD3BCState, batch: Batch, key: jax.Array, hp: DiscretePRDCHyperparams,
               data: Datasets) -> tuple[TD3BCState, dict[str, jax.Array]]:
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
            fixed = jax.lax.stop_gradient(logits)
            nn = batch_neighbor(batch, jax.nn.softmax(fixed, axis=-1), data, state.stats, hp.beta, chunk=chunk,
                                num_actions=num_actions, subset=subset, key=key)
            data_ce = -take_action_values(jax.nn.log_softmax(fixed, axis=-1), batch.action).mean()
            loss, metrics = discrete_actor_loss(logits, q1, nn.action, hp.alpha)
            return loss, {**metrics, "data_cross_entropy": data_ce, "nn_distance": nn.distance.mean(),
                          "nn_imaginary": nn.imaginary.astype(jnp.float32).mean()}

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

    def act(state: TD3BCState, obs: jax.Array, key: jax.Array, hp: DiscretePRDCHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) raw -> (B,) int32: argmax_a π(a|o), or a ~ π(·|o)."""
        logits = actor.apply(state.actor_params, state.stats.observation(obs))
        if deterministic:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(key, logits).astype(jnp.int32)

    return Algorithm(name="prdc_discrete", init=init, update=update, act=act, default_hp=default_hp)
