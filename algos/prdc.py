"""PRDC: policy regularisation with dataset constraint (Ran et al. 2023), language-conditioned, continuous.

TD3+BC (:mod:`imaginejax.algos.td3bc`: the same critics, smoothing, delayed actor and targets) with the
BC term's target replaced by the action of the dataset point nearest to the policy's own (o, π_φ(o)):

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
from imaginejax.algos.common import (DataStats, Datasets, adam, adam_step, masked_step, periodic_polyak_update,
                                     td_target, twin_critic_loss)
from imaginejax.algos.neighbors import DEFAULT_CHUNK, batch_neighbor, check_search_options
from imaginejax.algos.networks import EncodedMLP, NetConfig, TwinCritic, first_critic_apply
from imaginejax.algos.td3bc import TD3BCState, actor_loss, smoothed_target_action
from imaginejax.data.types import Batch


@struct.dataclass
class PRDCHyperparams:
    """TD3+BC's traced hyperparameters (the reference uses α = 40 on HalfCheetah) and β of the search."""

    actor_lr: jax.Array
    critic_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array
    policy_noise: jax.Array
    noise_clip: jax.Array
    policy_freq: jax.Array
    alpha: jax.Array
    beta: jax.Array


def make_prdc(spec: Spec, net: NetConfig = NetConfig(), chunk: int = DEFAULT_CHUNK,
              subset: int | None = None) -> Algorithm:
    """PRDC for a continuous ``spec`` on TD3+BC's networks ``net``.

    chunk: dataset rows per step of the search (memory O(B · chunk)); subset: None (exact) or m rows drawn
    per buffer and update (approximate).
    """
    if spec.discrete:
        raise ValueError("make_prdc needs a continuous action space (spec.discrete=False); for discrete "
                         "actions use make_discrete_prdc")
    check_search_options(chunk, subset)
    actor = EncodedMLP(net, out=spec.action_dim, squash=True)
    critic = TwinCritic(net)

    def default_hp(spec_: Spec) -> PRDCHyperparams:
        f = jnp.float32
        return PRDCHyperparams(actor_lr=f(3e-4), critic_lr=f(3e-4), gamma=f(0.99), tau=f(0.005), policy_noise=f(0.2),
                               noise_clip=f(0.5), policy_freq=jnp.int32(2), alpha=f(2.5), beta=f(2.0))

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: PRDCHyperparams) -> TD3BCState:
        actor_key, critic_key = jax.random.split(key)
        obs = jnp.zeros((1, spec_.obs_dim), jnp.float32)
        actor_params = actor.init(actor_key, obs)
        critic_params = critic.init(critic_key, obs, jnp.zeros((1, spec_.action_dim), jnp.float32))
        return TD3BCState(actor_params=actor_params, critic_params=critic_params, actor_target=actor_params,
                          critic_target=critic_params, actor_opt=adam(hp.actor_lr).init(actor_params),
                          critic_opt=adam(hp.critic_lr).init(critic_params), step=jnp.zeros((), jnp.int32),
                          stats=stats)

    def update(state: TD3BCState, batch: Batch, key: jax.Array, hp: PRDCHyperparams,
               data: Datasets) -> tuple[TD3BCState, dict[str, jax.Array]]:
        search_key = None
        if subset is not None:
            key, search_key = jax.random.split(key)
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
            nn = batch_neighbor(batch, jax.lax.stop_gradient(pi), data, state.stats, hp.beta, chunk=chunk,
                                subset=subset, key=search_key)
            loss, metrics = actor_loss(first_critic_apply(critic, critic_params, obs, pi), pi, nn.action, hp.alpha)
            return loss, {**metrics, "data_mse": jnp.square(jax.lax.stop_gradient(pi) - batch.action).mean(),
                          "nn_distance": nn.distance.mean(), "nn_imaginary": nn.imaginary.astype(jnp.float32).mean()}

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

    def act(state: TD3BCState, obs: jax.Array, key: jax.Array, hp: PRDCHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) raw -> (B, A): π(o), plus the clipped smoothing noise when not deterministic."""
        action = actor.apply(state.actor_params, state.stats.observation(obs))
        if deterministic:
            return action
        noise = jax.random.normal(key, action.shape, jnp.float32)
        return smoothed_target_action(action, noise, hp.policy_noise, hp.noise_clip)

    return Algorithm(name="prdc", init=init, update=update, act=act, default_hp=default_hp)
