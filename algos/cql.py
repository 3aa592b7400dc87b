"""Conservative Q-learning (Kumar et al. 2020) on SAC, language-conditioned, continuous actions in [-1, 1]^A.

Tanh-Gaussian actor π_φ, twin critics Q_θ1, Q_θ2, Polyak targets θ', temperature α_ent; on o = s̃ ⊕ e(ℓ):

    y = r + γ (1 − d) [min_i Q_θi'(o', a') − b α_ent log π(a'|o')],    a' ~ π_φ(·|o')     (b = 0 by default)
    L(θ_i) = E[(Q_θi(o, a) − y)²] + α (E_o[LSE_i(o)] − E_D[Q_θi(o, a)])
    LSE_i(o) = log Σ_{k=1..3K} exp(Q_θi(o, a_k) − log μ(a_k)),   K samples each of U[−1, 1]^A, π(·|o), π(·|o')
    L(φ) = E[α_ent log π(ã|o) − min_i Q_θi(o, ã)],    L(log α_ent) = −log α_ent E[log π(ã|o) + H̄]

All samples are scored at o; the three losses are taken at the pre-update parameters and stepped
together, then θ' ← (1 − τ) θ' + τ θ. Lagrangian variant (``with_lagrange``): the conservative term of
critic i becomes α' (α R_i − τ_gap), log α' trained to maximise it. Every expectation is a weighted sum
(:class:`~imaginejax.algos.common.RowWeights`; uniform here, COMBO mixes model rows). Notes:
docs/algorithms/cql.md.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import (DataStats, Datasets, RowWeights, adam, adam_step, masked_step, polyak_update,
                                     td_target)
from imaginejax.algos.networks import SAC_NET, NetConfig, TanhGaussianActor, TwinCritic, sample_tanh_gaussian
from imaginejax.data.types import Batch

ALPHA_PRIME_MAX = 1e6


@struct.dataclass
class ContinuousCQLHyperparams:
    """Traced hyperparameters (defaults in :func:`continuous_cql_default_hp`); with_lagrange is 0 or 1."""

    actor_lr: jax.Array
    critic_lr: jax.Array
    temperature_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array
    alpha: jax.Array
    init_temperature: jax.Array
    target_entropy: jax.Array
    backup_entropy: jax.Array
    with_lagrange: jax.Array
    target_action_gap: jax.Array
    alpha_prime_lr: jax.Array


def continuous_cql_default_hp(spec: Spec) -> ContinuousCQLHyperparams:
    """The reference's values (BENCHMARK.md §4): lr 1e-4 actor and temperature, 3e-4 critics, α = 5, H̄ = −A."""
    f = jnp.float32
    return ContinuousCQLHyperparams(
        actor_lr=f(1e-4), critic_lr=f(3e-4), temperature_lr=f(1e-4), gamma=f(0.99), tau=f(0.005), alpha=f(5.0),
        init_temperature=f(1.0), target_entropy=f(-spec.action_dim), backup_entropy=f(0.0), with_lagrange=f(0.0),
        target_action_gap=f(10.0), alpha_prime_lr=f(3e-4))


@struct.dataclass
class ContinuousCQLState:
    """Actor φ, twin critics θ (stacked) and θ', log α_ent, log α', their Adam states, updates, data statistics."""

    actor_params: dict
    critic_params: dict
    critic_target: dict
    log_temperature: jax.Array
    log_alpha_prime: jax.Array
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    temperature_opt: optax.OptState
    alpha_prime_opt: optax.OptState
    step: jax.Array
    stats: DataStats


def weighted_mean(x: jax.Array, weights: jax.Array | None) -> jax.Array:
    """Σ_b w_b x_b (weights summing to 1), or the plain mean when ``weights`` is None: (B,) -> ()."""
    if weights is None:
        return x.mean()
    chex.assert_equal_shape([x, weights])
    return jnp.sum(weights * x)


def sac_actor_loss(q_pi: jax.Array, log_prob: jax.Array, temperature: jax.Array | float,
                   weights: jax.Array | None = None) -> jax.Array:
    """E_w[α log π(ã|o) − Q(o, ã)]: q_pi (B,) = min_i Q_i(o, ã), log_prob (B,) -> ()."""
    chex.assert_equal_shape([q_pi, log_prob])
    return weighted_mean(temperature * log_prob - q_pi, weights)


def temperature_loss(log_temperature: jax.Array, log_prob: jax.Array, target_entropy: jax.Array | float,
                     weights: jax.Array | None = None) -> jax.Array:
    """−log α E_w[log π + H̄], no gradient through log π: log_prob (B,) -> ()."""
    return -log_temperature * weighted_mean(jax.lax.stop_gradient(log_prob) + target_entropy, weights)


def cql_action_samples(key: jax.Array, mean: jax.Array, log_std: jax.Array, next_mean: jax.Array,
                       next_log_std: jax.Array, num_samples: int) -> tuple[jax.Array, jax.Array]:
    """The 3K proposals per row, (N, 3K, A), and their log μ, (N, 3K), without gradient.

    K uniform (log μ = −A log 2), K from π(·|o) and K from π(·|o') (their log-densities); mean, log_std
    of π(·|o) and next_mean, next_log_std of π(·|o') are (N, A).
    """
    chex.assert_equal_shape([mean, log_std, next_mean, next_log_std])
    n, a_dim = mean.shape
    k_uniform, k_pi, k_next = jax.random.split(key, 3)
    uniform = jax.random.uniform(k_uniform, (n, num_samples, a_dim), jnp.float32, -1.0, 1.0)
    pi_actions, pi_log_prob = sample_tanh_gaussian(k_pi, mean, log_std, num_samples)
    next_actions, next_log_prob = sample_tanh_gaussian(k_next, next_mean, next_log_std, num_samples)
    uniform_log_density = jnp.full((n, num_samples), -a_dim * math.log(2.0), jnp.float32)
    actions = jnp.concatenate([uniform, pi_actions, next_actions], axis=1)
    log_density = jnp.concatenate([uniform_log_density, pi_log_prob, next_log_prob], axis=1)
    return jax.lax.stop_gradient(actions), jax.lax.stop_gradient(log_density)


def continuous_cql_regularizer(q_samples: jax.Array, log_density: jax.Array, q_data: jax.Array,
                               push_down_weights: jax.Array, push_up_weights: jax.Array
                               ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """R_i = Σ_o w_down LSE_i(o) − Σ w_up Q_i(o, a): q_samples (C, N, M), log_density (N, M), q_data (C, N),
    weights (N,) -> R (C,) and metrics logsumexp (C, N), push_down (C,), push_up (C,)."""
    chex.assert_rank(q_samples, 3)
    c, n, m = q_samples.shape
    chex.assert_shape(log_density, (n, m))
    chex.assert_shape(q_data, (c, n))
    chex.assert_shape([push_down_weights, push_up_weights], (n,))
    logsumexp = jax.nn.logsumexp(q_samples - log_density[None], axis=-1)
    push_down = logsumexp @ push_down_weights
    push_up = q_data @ push_up_weights
    return push_down - push_up, {"logsumexp": logsumexp, "push_down": push_down, "push_up": push_up}


def continuous_cql_critic_objective(
        critic_apply: Callable[[dict, jax.Array, jax.Array], jax.Array], params: dict, obs: jax.Array,
        action: jax.Array, target: jax.Array, sample_actions: jax.Array, log_density: jax.Array,
        weights: RowWeights, conservative_weight: jax.Array | float, alpha_prime: jax.Array | float = 1.0,
        action_gap: jax.Array | float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """L(θ) = Σ_i Σ_n w_td (Q_i(o_n, a_n) − y_n)² + Σ_i α' (w R_i(θ) − τ_gap).

    The critics score each row's own action and its M proposals (N, M, A) in one pass, each observation
    encoded once. Returns (loss, metrics td_loss, conservative_loss, conservative_per_critic (C,),
    push_down, push_up, logsumexp).
    """
    n, m, a_dim = sample_actions.shape
    chex.assert_shape(action, (n, a_dim))
    q_all = critic_apply(params, obs, jnp.concatenate([action[:, None, :], sample_actions], axis=1))
    chex.assert_shape(q_all, (None, n, 1 + m))
    q_data, q_samples = q_all[..., 0], q_all[..., 1:]
    td = jnp.sum(jnp.square(q_data - target[None]) @ weights.td)
    reg, parts = continuous_cql_regularizer(q_samples, log_density, q_data, weights.push_down, weights.push_up)
    weighted_reg = conservative_weight * reg
    loss = td + jnp.sum(alpha_prime * (weighted_reg - action_gap))
    return loss, {"td_loss": td, "conservative_loss": reg.mean(), "conservative_per_critic": weighted_reg,
                  "push_down": parts["push_down"].mean(), "push_up": parts["push_up"].mean(),
                  "logsumexp": (parts["logsumexp"] @ weights.push_down).mean()}


def init_continuous_cql(actor: TanhGaussianActor, critic: TwinCritic, key: jax.Array, spec: Spec,
                        stats: DataStats, hp: Any) -> ContinuousCQLState:
    """Fresh actor and critics (target = online), log α_ent = log ``hp.init_temperature``, log α' = 0."""
    actor_key, critic_key = jax.random.split(key)
    obs = jnp.zeros((1, spec.obs_dim), jnp.float32)
    actor_params = actor.init(actor_key, obs)
    critic_params = critic.init(critic_key, obs, jnp.zeros((1, spec.action_dim), jnp.float32))
    log_temperature = jnp.log(jnp.asarray(hp.init_temperature, jnp.float32))
    log_alpha_prime = jnp.zeros((), jnp.float32)
    return ContinuousCQLState(
        actor_params=actor_params, critic_params=critic_params, critic_target=critic_params,
        log_temperature=log_temperature, log_alpha_prime=log_alpha_prime,
        actor_opt=adam(hp.actor_lr).init(actor_params), critic_opt=adam(hp.critic_lr).init(critic_params),
        temperature_opt=adam(hp.temperature_lr).init(log_temperature),
        alpha_prime_opt=adam(hp.alpha_prime_lr).init(log_alpha_prime), step=jnp.zeros((), jnp.int32), stats=stats)


def continuous_cql_step(actor: TanhGaussianActor, critic: TwinCritic, state: ContinuousCQLState, batch: Batch,
                        weights: RowWeights, key: jax.Array, hp: Any, conservative_weight: jax.Array,
                        num_samples: int) -> tuple[ContinuousCQLState, dict[str, jax.Array]]:
    """One CQL update on N weighted rows (module docstring), conservative weight α (CQL) or β (COMBO)."""
    obs = state.stats.observation(batch.observation)
    next_obs = state.stats.observation(batch.next_observation)
    k_target, k_samples, k_actor = jax.random.split(key, 3)
    temperature = jnp.exp(state.log_temperature)

    # The actor's forward pass at o also gives π(·|o) for the proposals.
    def actor_loss_fn(params):
        m, ls = actor.apply(params, obs)
        pi, log_prob = sample_tanh_gaussian(k_actor, m, ls)
        q_pi = jnp.min(critic.apply(state.critic_params, obs, pi), axis=0)
        return sac_actor_loss(q_pi, log_prob, temperature, weights.actor), (log_prob, m, ls)

    (a_loss, (log_prob, mean, log_std)), a_grads = jax.value_and_grad(actor_loss_fn, has_aux=True)(
        state.actor_params)

    next_mean, next_log_std = actor.apply(state.actor_params, next_obs)
    next_action, next_log_prob = sample_tanh_gaussian(k_target, next_mean, next_log_std)
    q_next = critic.apply(state.critic_target, next_obs, next_action)  # (2, N)
    next_value = jnp.min(q_next, axis=0) - hp.backup_entropy * temperature * next_log_prob
    target = jax.lax.stop_gradient(td_target(batch.reward, batch.terminal, next_value, hp.gamma))

    sample_actions, log_density = cql_action_samples(k_samples, mean, log_std, next_mean, next_log_std, num_samples)
    lagrange = hp.with_lagrange > 0
    alpha_prime = jnp.clip(jnp.exp(state.log_alpha_prime), 0.0, ALPHA_PRIME_MAX)
    objective = functools.partial(continuous_cql_critic_objective, critic.apply)
    (c_loss, c_metrics), c_grads = jax.value_and_grad(objective, has_aux=True)(
        state.critic_params, obs, batch.action, target, sample_actions, log_density, weights, conservative_weight,
        jnp.where(lagrange, alpha_prime, 1.0), jnp.where(lagrange, hp.target_action_gap, 0.0))

    t_loss, t_grad = jax.value_and_grad(temperature_loss)(state.log_temperature, log_prob, hp.target_entropy,
                                                         weights.actor)
    gaps = jax.lax.stop_gradient(c_metrics.pop("conservative_per_critic"))
    ap_loss, ap_grad = jax.value_and_grad(
        lambda log_ap: -jnp.clip(jnp.exp(log_ap), 0.0, ALPHA_PRIME_MAX) * jnp.mean(gaps - hp.target_action_gap))(
        state.log_alpha_prime)

    critic_params, critic_opt = adam_step(state.critic_params, c_grads, state.critic_opt)
    actor_params, actor_opt = adam_step(state.actor_params, a_grads, state.actor_opt)
    log_temperature, temperature_opt = adam_step(state.log_temperature, t_grad, state.temperature_opt)
    log_alpha_prime, alpha_prime_opt = masked_step(
        lagrange, adam_step(state.log_alpha_prime, ap_grad, state.alpha_prime_opt),
        (state.log_alpha_prime, state.alpha_prime_opt))
    new_state = ContinuousCQLState(
        actor_params=actor_params, critic_params=critic_params,
        critic_target=polyak_update(state.critic_target, critic_params, hp.tau), log_temperature=log_temperature,
        log_alpha_prime=log_alpha_prime, actor_opt=actor_opt, critic_opt=critic_opt, temperature_opt=temperature_opt,
        alpha_prime_opt=alpha_prime_opt, step=state.step + 1, stats=state.stats)
    metrics = {"loss": c_loss, "critic_loss": c_loss, **c_metrics, "actor_loss": a_loss, "temperature_loss": t_loss,
               "temperature": temperature, "entropy": -jnp.sum(weights.actor * log_prob),
               "alpha_prime": jnp.where(lagrange, alpha_prime, 1.0), "alpha_prime_loss": ap_loss,
               "target_q": jnp.sum(weights.td * target)}
    return new_state, metrics


def act_tanh_gaussian(actor: TanhGaussianActor, actor_params: dict, obs: jax.Array, key: jax.Array,
                      deterministic: bool) -> jax.Array:
    """obs (B, S+E) normalised -> (B, A): tanh(μ(o)), or a sample of π(·|o)."""
    mean, log_std = actor.apply(actor_params, obs)
    if deterministic:
        return jnp.tanh(mean)
    return sample_tanh_gaussian(key, mean, log_std)[0]


def make_cql(spec: Spec, net: NetConfig = SAC_NET, num_action_samples: int = 10) -> Algorithm:
    """Continuous CQL for a continuous ``spec``: actor and critic heads ``net`` (3×256), K proposals per source."""
    if spec.discrete:
        raise ValueError("make_cql needs a continuous action space (spec.discrete=False); for "
                         "discrete actions use imaginejax.algos.cql_discrete.make_cql_discrete")
    if num_action_samples < 1:
        raise ValueError(f"num_action_samples must be >= 1, got {num_action_samples}")
    actor = TanhGaussianActor(net, spec.action_dim)
    critic = TwinCritic(net)

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: ContinuousCQLHyperparams) -> ContinuousCQLState:
        return init_continuous_cql(actor, critic, key, spec_, stats, hp)

    def update(state: ContinuousCQLState, batch: Batch, key: jax.Array, hp: ContinuousCQLHyperparams,
               data: Datasets) -> tuple[ContinuousCQLState, dict[str, jax.Array]]:
        del data
        return continuous_cql_step(actor, critic, state, batch, RowWeights.uniform(batch.reward.shape[0]), key, hp,
                                   hp.alpha, num_action_samples)

    def act(state: ContinuousCQLState, obs: jax.Array, key: jax.Array, hp: ContinuousCQLHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) raw -> (B, A): tanh(μ), or a sample of π."""
        return act_tanh_gaussian(actor, state.actor_params, state.stats.observation(obs), key, deterministic)

    return Algorithm(name="cql", init=init, update=update, act=act, default_hp=continuous_cql_default_hp)
