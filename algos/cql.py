"""Conservative Q-learning (Kumar et al. 2020), language-conditioned: discrete (DQN) and continuous (SAC).

Both variants minimise a TD loss plus a conservative term that pushes Q down on actions the policy or
a proposal could pick and up on the dataset's actions. Every expectation over the batch is a weighted
sum over rows with :class:`RowWeights` (uniform 1/B here; COMBO mixes dataset and model rows with the
same code, see :mod:`imaginejax.algos.combo`).

Discrete CQL(H) on a DQN
------------------------
With o = s ⊕ e(ℓ) the observation (state ⊕ instruction embedding), a Q-network Q_θ(o, ·) ∈ R^n and a
target copy θ', one update on a batch (o, a, r, o', d) minimises

    L(θ) = E[ h(Q_θ(o, a) − y) ]  +  α · E[ log Σ_{b=1..n} exp Q_θ(o, b)  −  Q_θ(o, a) ]
           └── TD (Huber, δ = 1) ──┘      └──── conservative term: full logsumexp over all n actions ───┘

    y = r + γ · (1 − d) · Q_θ'(o', a*),   a* = argmax_b Q_θ(o', b)        (double DQN, default)
                                      or  y = r + γ · (1 − d) · max_b Q_θ'(o', b)   (``double_q=False``)

where d = 1 only on true terminations (a time-limit truncation bootstraps) and γ comes from ``hp``.
The logsumexp runs over every one of the n actions of each state (the reference's reshape that shrank
it to 3 values per state is not reproduced). Optimiser: Adam with a traced learning rate. The target
network follows the periodic Polyak rule of :mod:`imaginejax.algos.common` (reference: hard copy every
8000 updates, i.e. N = 8000, τ = 1). Acting: a = argmax_b Q_θ(o, b) (sampled from softmax(Q) when not
deterministic).

Choices, with the reference they follow:

* **Huber TD loss**: d3rlpy's ``DiscreteCQL`` (the reference implementation used by ImagineBench) is a
  DoubleDQN whose discrete Q-function error is the Huber loss with δ = 1; so is DQN's.
* **Double-DQN target**: the same d3rlpy class subclasses DoubleDQN (the paper's Atari experiments
  used a QR-DQN/DQN backbone). Selecting a* with the online network and evaluating it with the target
  network reduces the max-operator's over-estimation, which matters most on the unseen actions an
  offline learner must not trust; it costs one extra forward pass. ``double_q=False`` gives the plain
  max for comparison.
* Reference hyperparameters (BENCHMARK.md §4): lr 6.25e-5, batch 32 (an engine setting), α = 10,
  target update every 8000 updates, γ = 0.99.

Continuous CQL(H) on SAC
------------------------
Backbone: :mod:`imaginejax.algos.sac` (tanh-Gaussian actor π_φ, automatic entropy temperature α_ent,
target entropy −A) with twin critics Q_θ1, Q_θ2 (:class:`~imaginejax.algos.common.TwinCritic`: each
its own language encoder, 3×256 ReLU heads by default) and Polyak targets θ' (τ = 0.005). States are
normalised with the real buffer's statistics (``hp.normalizer``; identity by default). Per update, for
each critic i:

    y    = r + γ (1 − d) [ min_i Q_θi'(o', a') − b · α_ent log π(a'|o') ],   a' ~ π_φ(·|o')
           (b = ``backup_entropy``, 0 by default: the CQL code's deterministic backup)
    L(θi) = E[(Q_θi(o, a) − y)²] + α · ( E_o[ LSE_i(o) ] − E_(o,a)~D[ Q_θi(o, a) ] )

    LSE_i(o) = log Σ_{k=1..3K} exp( Q_θi(o, a_k) − log μ_k(a_k) ),   K = 10 samples from each of
        a_k ~ U[−1, 1]^A            log μ_k = log 0.5^A = −A log 2
        a_k ~ π_φ(·|o)              log μ_k = log π_φ(a_k|o)
        a_k ~ π_φ(·|o')             log μ_k = log π_φ(a_k|o')

i.e. an importance-sampled estimate of log ∫ exp Q(o, a) da (the CQL code's ``min_q_version = 3``;
like it, without the constant −log 3K, which changes the value and not the gradient). The logsumexp
runs over all 3K samples of each state and critic. **π(s') samples are scored at s**: Q(o, a') with
a' ~ π(·|o'), weighted by log π(a'|o'), exactly as the original CQL code (``q1_next_actions =
Q(obs, new_curr_actions)``); it widens the proposal with actions the policy takes one step later
rather than estimating anything at o'. Both halves of the regulariser are functions of θ: no
stop-gradient on either (the sampled actions and their log-densities are constants, as in the
reference, since only the critic is optimised by this loss).

Cost: the critics score the 1 + 3K actions of each row (its own and the proposals) in one pass that
encodes each observation once (:class:`~imaginejax.algos.common.TwinCritic` with a (N, 1 + 3K, A) action
tensor; its first head layer's state part is also computed once per row), and the actor's forward pass
at o serves both its loss and the π(·|o) proposals.

Actor and temperature: L(φ) = E[α_ent log π(ã|o) − min_i Q_θi(o, ã)], L(log α_ent) = −log α_ent ·
E[log π + H̄]. Learning rates: actor 1e-4, critics 3e-4, temperature 1e-4 (the actor's, as the CQL
code). The three losses are evaluated at the pre-update parameters and stepped together.

Lagrangian variant (off by default, ``with_lagrange = 1`` turns it on): the conservative term of
critic i becomes α'·(α·R_i − τ_gap) with α' = clip(exp(log α'), 0, 10⁶) and log α' trained to maximise
it (L(log α') = −α' · mean_i(α·R_i − τ_gap), R_i fixed), lr 3e-4, τ_gap = 10. Off, α' ≡ 1 and τ_gap ≡ 0
and log α' is never stepped.

Hyperparameters live in ``hp`` (traced, vmappable): α ∈ [5, 10] (default 5), γ = 0.99, τ = 0.005.
The number of action samples K and the network shapes are static (factory arguments).
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
from imaginejax.algos.common import (DataStats, Datasets, TwinCritic, adam, adam_step, huber, masked_step,
                                     periodic_polyak_update, polyak_update, td_target)
from imaginejax.algos.networks import EncodedMLP, NetConfig
from imaginejax.algos.sac import (SAC_NET, TanhGaussianActor, sac_actor_loss, sample_tanh_gaussian,
                                  temperature_loss)
from imaginejax.data.types import Batch

ALPHA_PRIME_MAX = 1e6


# ---------------------------------------------------------------------------------------------------
# Row weights: one batch, several expectations
# ---------------------------------------------------------------------------------------------------
@struct.dataclass
class RowWeights:
    """Per-row weights of the expectations in a CQL-style loss; each (N,) and summing to 1 (or all 0).

    Attributes:
      td: weights of the TD loss E[(Q(o, a) − y)²] (rows of every source).
      push_down: weights of E_o[logsumexp Q(o, ·)] (states whose Q is pushed down).
      push_up: weights of E_(o,a)~D[Q(o, a)] (dataset rows whose Q is pushed up).
      actor: weights of the actor and temperature losses (continuous only).
    """

    td: jax.Array
    push_down: jax.Array
    push_up: jax.Array
    actor: jax.Array

    @classmethod
    def uniform(cls, num_rows: int) -> "RowWeights":
        """1/N on every row for every expectation: a plain minibatch mean."""
        w = jnp.full((num_rows,), 1.0 / num_rows, jnp.float32)
        return cls(td=w, push_down=w, push_up=w, actor=w)


# ---------------------------------------------------------------------------------------------------
# Discrete CQL
# ---------------------------------------------------------------------------------------------------
@struct.dataclass
class CQLHyperparams:
    """Traced hyperparameters (all () arrays).

    Attributes:
      learning_rate: Adam step size (reference 6.25e-5).
      alpha: weight α of the conservative term (reference 10).
      gamma: discount γ (0.99).
      target_update_interval: N, target update every N updates (reference 8000), int32.
      target_tau: τ of the periodic Polyak update (1.0 = hard copy).
    """

    learning_rate: jax.Array
    alpha: jax.Array
    gamma: jax.Array
    target_update_interval: jax.Array
    target_tau: jax.Array


@struct.dataclass
class CQLState:
    """params / target_params: Q-network θ and θ'; opt_state: Adam; step: () int32 updates done."""

    params: dict
    target_params: dict
    opt_state: optax.OptState
    step: jax.Array


def take_action_values(q: jax.Array, action: jax.Array) -> jax.Array:
    """Q(o, a) from all action values: q (B, n), action (B,) int -> (B,)."""
    return jnp.take_along_axis(q, action[:, None].astype(jnp.int32), axis=-1)[:, 0]


def next_state_value(q_next_online: jax.Array, q_next_target: jax.Array, double_q: bool) -> jax.Array:
    """Bootstrap value V(o') from the next-state action values.

    Args:
      q_next_online: (B, n) Q_θ(o', ·) (used only when ``double_q``).
      q_next_target: (B, n) Q_θ'(o', ·).
      double_q: static; True → Q_θ'(o', argmax Q_θ(o', ·)), False → max Q_θ'(o', ·).

    Returns:
      (B,) values (the caller stops gradients).
    """
    if double_q:
        return take_action_values(q_next_target, jnp.argmax(q_next_online, axis=-1))
    return jnp.max(q_next_target, axis=-1)


def cql_loss(q: jax.Array, action: jax.Array, target: jax.Array, alpha: jax.Array | float,
             weights: RowWeights | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The discrete CQL loss on given action values.

    Args:
      q: (B, n) Q_θ(o, ·) for every action.
      action: (B,) int dataset actions a.
      target: (B,) TD targets y (no gradient flows into them).
      alpha: () conservative weight α.
      weights: per-row weights of the three expectations; None = uniform 1/B (plain batch means).

    Returns:
      (loss, metrics): loss = Σ w_td h(Q(o,a) − y) + α · (Σ w_down logsumexp_b Q(o,b) − Σ w_up Q(o,a)),
      with the logsumexp over all n actions; metrics td_loss, conservative_loss, q_data (= Σ w_up Q(o,a)),
      logsumexp (= Σ w_down logsumexp).
    """
    chex.assert_rank(q, 2)
    chex.assert_shape([action, target], (q.shape[0],))
    w = RowWeights.uniform(q.shape[0]) if weights is None else weights
    q_data = take_action_values(q, action)
    td = jnp.sum(w.td * huber(q_data - target))
    logsumexp = jax.nn.logsumexp(q, axis=-1)  # (B,): over the full action axis
    push_down = jnp.sum(w.push_down * logsumexp)
    push_up = jnp.sum(w.push_up * q_data)
    conservative = push_down - push_up
    loss = td + alpha * conservative
    return loss, {"loss": loss, "td_loss": td, "conservative_loss": conservative,
                  "q_data": push_up, "logsumexp": push_down}


def discrete_cql_step(model: EncodedMLP, state: CQLState, batch: Batch, weights: RowWeights, hp: Any,
                      conservative_weight: jax.Array, double_q: bool = True
                      ) -> tuple[CQLState, dict[str, jax.Array]]:
    """One gradient step of discrete CQL on the rows of ``batch`` weighted by ``weights``.

    Args:
      model: the Q-network module (obs (N, S+E) -> (N, n)).
      state: parameters, target, Adam state and update count.
      batch: N rows (dataset rows, and model rows in COMBO).
      weights: per-row weights (:meth:`RowWeights.uniform` for plain discrete CQL).
      hp: has ``learning_rate``, ``gamma``, ``target_update_interval`` and ``target_tau``.
      conservative_weight: () α (CQL) or β (COMBO).
      double_q: static; double-DQN target or plain max.

    Returns:
      The new state and the pre-update metrics of :func:`cql_loss` plus ``target_q`` (Σ w_td y).
    """
    next_obs = batch.next_observation
    q_next_target = model.apply(state.target_params, next_obs)
    q_next_online = model.apply(state.params, next_obs) if double_q else q_next_target
    next_value = jax.lax.stop_gradient(next_state_value(q_next_online, q_next_target, double_q))
    target = td_target(batch.reward, batch.terminal, next_value, hp.gamma)

    def loss_fn(params):
        return cql_loss(model.apply(params, batch.observation), batch.action, target, conservative_weight,
                        weights)

    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
    params, opt_state = adam_step(state.params, grads, state.opt_state)
    count = state.step + 1
    target_params = periodic_polyak_update(state.target_params, params, count,
                                           hp.target_update_interval, hp.target_tau)
    metrics["target_q"] = jnp.sum(weights.td * target)
    return CQLState(params=params, target_params=target_params, opt_state=opt_state, step=count), metrics


def init_discrete_q(model: EncodedMLP, key: jax.Array, spec: Spec, learning_rate: jax.Array) -> CQLState:
    """A fresh :class:`CQLState` for ``model`` (target = online parameters, zero Adam moments)."""
    params = model.init(key, jnp.zeros((1, spec.obs_dim), jnp.float32))
    return CQLState(params=params, target_params=params, opt_state=adam(learning_rate).init(params),
                    step=jnp.zeros((), jnp.int32))


def act_discrete_q(model: EncodedMLP, params: dict, obs: jax.Array, key: jax.Array,
                   deterministic: bool) -> jax.Array:
    """obs (B, S+E) -> (B,) int32: argmax_a Q(o, a), or a ~ softmax(Q(o, ·))."""
    q = model.apply(params, obs)
    if deterministic:
        return jnp.argmax(q, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, q).astype(jnp.int32)


def make_cql(spec: Spec, net: NetConfig = NetConfig(), double_q: bool = True) -> Algorithm:
    """Builds discrete CQL for ``spec`` (must be discrete) with static network shapes ``net``.

    Args:
      spec: environment interface; ``spec.action_dim`` is the number of actions n.
      net: static network shapes of the Q-network (language encoder + ReLU head, n outputs).
      double_q: static; double-DQN target (default, as the d3rlpy reference) or plain max.
    """
    if not spec.discrete:
        raise ValueError("make_cql is discrete CQL: spec.discrete must be True (for continuous actions use "
                         "imaginejax.algos.cql.make_continuous_cql)")
    model = EncodedMLP(net, out=spec.action_dim)

    def default_hp(spec_: Spec) -> CQLHyperparams:
        del spec_
        return CQLHyperparams(learning_rate=jnp.float32(6.25e-5), alpha=jnp.float32(10.0),
                              gamma=jnp.float32(0.99), target_update_interval=jnp.int32(8000),
                              target_tau=jnp.float32(1.0))

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: CQLHyperparams) -> CQLState:
        del stats
        return init_discrete_q(model, key, spec_, hp.learning_rate)

    def update(state: CQLState, batch: Batch, key: jax.Array, hp: CQLHyperparams,
               data: Datasets) -> tuple[CQLState, dict[str, jax.Array]]:
        """One gradient step on a batch of B transitions; metrics are pre-update batch means."""
        del key, data
        return discrete_cql_step(model, state, batch, RowWeights.uniform(batch.reward.shape[0]), hp,
                                 hp.alpha, double_q)

    def act(state: CQLState, obs: jax.Array, key: jax.Array, hp: CQLHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) -> (B,) int32: argmax_a Q(o, a), or a ~ softmax(Q(o, ·))."""
        del hp
        return act_discrete_q(model, state.params, obs, key, deterministic)

    return Algorithm(name="cql", init=init, update=update, act=act, default_hp=default_hp)


# ---------------------------------------------------------------------------------------------------
# Continuous CQL (SAC backbone)
# ---------------------------------------------------------------------------------------------------
@struct.dataclass
class ContinuousCQLHyperparams:
    """Traced hyperparameters of continuous CQL (all () arrays but the normaliser).

    Attributes:
      actor_lr: Adam step of the actor (1e-4).
      critic_lr: Adam step of the twin critics (3e-4).
      temperature_lr: Adam step of log α_ent (1e-4, the actor's as in the CQL code).
      gamma: discount γ (0.99).
      tau: Polyak rate of the target critics (0.005).
      alpha: conservative weight α (5; the reference uses 5–10).
      init_temperature: α_ent at initialisation (1.0, i.e. log α_ent = 0).
      target_entropy: H̄ (−A).
      backup_entropy: b ∈ {0, 1}, subtract α_ent log π(a'|o') in the target (0: deterministic backup).
      with_lagrange: 0.0 (off, default) or 1.0 (α' tuned by dual gradient descent).
      target_action_gap: τ_gap of the Lagrangian variant (10).
      alpha_prime_lr: Adam step of log α' (3e-4).
    """

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
    """The reference hyperparameters of continuous CQL (BENCHMARK.md §4) for ``spec``."""
    return ContinuousCQLHyperparams(
        actor_lr=jnp.float32(1e-4), critic_lr=jnp.float32(3e-4), temperature_lr=jnp.float32(1e-4),
        gamma=jnp.float32(0.99), tau=jnp.float32(0.005), alpha=jnp.float32(5.0),
        init_temperature=jnp.float32(1.0), target_entropy=jnp.float32(-spec.action_dim),
        backup_entropy=jnp.float32(0.0), with_lagrange=jnp.float32(0.0),
        target_action_gap=jnp.float32(10.0), alpha_prime_lr=jnp.float32(3e-4))


@struct.dataclass
class ContinuousCQLState:
    """SAC parameters with CQL's Lagrange multiplier.

    Attributes:
      actor_params: φ of the tanh-Gaussian actor.
      critic_params: θ of the twin critics (stacked, leading axis 2); critic_target: θ'.
      log_temperature: () log α_ent.
      log_alpha_prime: () log α' (Lagrangian variant; unchanged when it is off).
      actor_opt, critic_opt, temperature_opt, alpha_prime_opt: Adam states.
      step: () int32 updates done.
      stats: the real data's state statistics.
    """

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


def init_continuous_cql(actor: TanhGaussianActor, critic: TwinCritic, key: jax.Array, spec: Spec,
                        stats: DataStats, hp: Any) -> ContinuousCQLState:
    """Fresh actor, critics (target = online), log α_ent = log ``hp.init_temperature``, log α' = 0."""
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


def cql_action_samples(key: jax.Array, mean: jax.Array, log_std: jax.Array, next_mean: jax.Array,
                       next_log_std: jax.Array, num_samples: int) -> tuple[jax.Array, jax.Array]:
    """The 3K proposal actions of the conservative term and their log-densities, per row.

    Args:
      key: PRNG key.
      mean, log_std: (N, A) π(·|o) at the rows' observations.
      next_mean, next_log_std: (N, A) π(·|o') at the rows' next observations.
      num_samples: K per source.

    Returns:
      actions (N, 3K, A): K uniform on [−1, 1]^A, then K from π(·|o), then K from π(·|o');
      log_density (N, 3K): −A log 2, log π(a|o), log π(a'|o') respectively. Both carry no gradient.
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
    """R_i = Σ_o w_down(o) LSE_i(o) − Σ_(o,a) w_up Q_i(o, a) for each critic i.

    Args:
      q_samples: (C, N, M) Q_i(o_n, a_{n,m}) at the M = 3K proposal actions of each row.
      log_density: (N, M) log μ(a_{n,m}) of each proposal.
      q_data: (C, N) Q_i(o_n, a_n) at the rows' own actions.
      push_down_weights, push_up_weights: (N,) row weights.

    Returns:
      R (C,) and metrics: ``logsumexp`` (C, N) LSE_i(o_n) = logsumexp_m(Q − log μ) over all M samples
      of the row, ``push_down`` (C,), ``push_up`` (C,).
    """
    chex.assert_rank(q_samples, 3)
    c, n, m = q_samples.shape
    chex.assert_shape(log_density, (n, m))
    chex.assert_shape(q_data, (c, n))
    chex.assert_shape([push_down_weights, push_up_weights], (n,))
    logsumexp = jax.nn.logsumexp(q_samples - log_density[None], axis=-1)  # (C, N): all M samples per row
    push_down = logsumexp @ push_down_weights
    push_up = q_data @ push_up_weights
    return push_down - push_up, {"logsumexp": logsumexp, "push_down": push_down, "push_up": push_up}


def continuous_cql_critic_objective(
        critic_apply: Callable[[dict, jax.Array, jax.Array], jax.Array], params: dict, obs: jax.Array,
        action: jax.Array, target: jax.Array, sample_actions: jax.Array, log_density: jax.Array,
        weights: RowWeights, conservative_weight: jax.Array | float, alpha_prime: jax.Array | float = 1.0,
        action_gap: jax.Array | float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The continuous CQL critic loss as a function of the critic parameters (what the update differentiates).

        L(θ) = Σ_i Σ_n w_td (Q_i(o_n, a_n) − y_n)²  +  Σ_i α' (w · R_i(θ) − τ_gap)

    Args:
      critic_apply: (params, obs (N, S+E), actions (N, K, A)) -> (C, N, K), K actions scored per
        observation, e.g. ``TwinCritic(...).apply`` (which encodes each observation once).
      params: critic parameters θ (differentiated).
      obs: (N, S+E) normalised observations; action: (N, A) the rows' actions; target: (N,) y.
      sample_actions: (N, M, A) proposals scored at ``obs``; log_density: (N, M) their log μ.
      weights: row weights (td, push_down, push_up).
      conservative_weight: () w = α (CQL) or β (COMBO).
      alpha_prime: () α' (1 without the Lagrangian); action_gap: () τ_gap (0 without it).

    Returns:
      (loss, metrics): td_loss, conservative_loss (mean_i R_i), conservative_per_critic (C,) w·R_i,
      push_down, push_up, logsumexp (means over critics and weighted rows).
    """
    n, m, a_dim = sample_actions.shape
    chex.assert_shape(action, (n, a_dim))
    # One forward pass over the 1 + M actions of each row (its own action first); each observation is
    # encoded once, not tiled M + 1 times.
    q_all = critic_apply(params, obs, jnp.concatenate([action[:, None, :], sample_actions], axis=1))
    chex.assert_shape(q_all, (None, n, 1 + m))
    q_data, q_samples = q_all[..., 0], q_all[..., 1:]  # (C, N), (C, N, M)
    td = jnp.sum(jnp.square(q_data - target[None]) @ weights.td)
    reg, parts = continuous_cql_regularizer(q_samples, log_density, q_data, weights.push_down, weights.push_up)
    weighted_reg = conservative_weight * reg
    loss = td + jnp.sum(alpha_prime * (weighted_reg - action_gap))
    return loss, {"td_loss": td, "conservative_loss": reg.mean(), "conservative_per_critic": weighted_reg,
                  "push_down": parts["push_down"].mean(), "push_up": parts["push_up"].mean(),
                  "logsumexp": (parts["logsumexp"] @ weights.push_down).mean()}


def continuous_cql_step(actor: TanhGaussianActor, critic: TwinCritic, state: ContinuousCQLState, batch: Batch,
                        weights: RowWeights, key: jax.Array, hp: Any, conservative_weight: jax.Array,
                        num_samples: int) -> tuple[ContinuousCQLState, dict[str, jax.Array]]:
    """One update of continuous CQL (critics, actor, temperature, optional α') on weighted rows.

    Args:
      actor, critic: the modules.
      state: the state before the update.
      batch: N rows with raw (un-normalised) states.
      weights: row weights (:meth:`RowWeights.uniform` for plain CQL).
      key: PRNG key for the target action, the proposals and the actor's reparameterised sample.
      hp: a :class:`ContinuousCQLHyperparams` or any record with the same fields.
      conservative_weight: () α (CQL) or β (COMBO).
      num_samples: static K per proposal source.

    Returns:
      The new state and pre-update metrics: loss (= critic loss), critic_loss, td_loss, conservative_loss,
      push_down, push_up, logsumexp, actor_loss, temperature_loss, temperature, entropy, alpha_prime,
      target_q.
    """
    obs = state.stats.observation(batch.observation)
    next_obs = state.stats.observation(batch.next_observation)
    k_target, k_samples, k_actor = jax.random.split(key, 3)
    temperature = jnp.exp(state.log_temperature)

    # The actor's loss first: its forward pass at o also gives π(·|o) for the proposals (computed once).
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
    sample_actions, log_density = cql_action_samples(k_samples, mean, log_std, next_mean, next_log_std,
                                                     num_samples)

    lagrange = hp.with_lagrange > 0
    alpha_prime = jnp.clip(jnp.exp(state.log_alpha_prime), 0.0, ALPHA_PRIME_MAX)
    objective = functools.partial(continuous_cql_critic_objective, critic.apply)
    (c_loss, c_metrics), c_grads = jax.value_and_grad(objective, has_aux=True)(
        state.critic_params, obs, batch.action, target, sample_actions, log_density, weights,
        conservative_weight, jnp.where(lagrange, alpha_prime, 1.0),
        jnp.where(lagrange, hp.target_action_gap, 0.0))

    t_loss, t_grad = jax.value_and_grad(temperature_loss)(state.log_temperature, log_prob, hp.target_entropy,
                                                         weights.actor)
    gaps = jax.lax.stop_gradient(c_metrics.pop("conservative_per_critic"))

    def alpha_prime_loss_fn(log_alpha_prime):
        return -jnp.clip(jnp.exp(log_alpha_prime), 0.0, ALPHA_PRIME_MAX) * jnp.mean(gaps - hp.target_action_gap)

    ap_loss, ap_grad = jax.value_and_grad(alpha_prime_loss_fn)(state.log_alpha_prime)

    critic_params, critic_opt = adam_step(state.critic_params, c_grads, state.critic_opt)
    actor_params, actor_opt = adam_step(state.actor_params, a_grads, state.actor_opt)
    log_temperature, temperature_opt = adam_step(state.log_temperature, t_grad, state.temperature_opt)
    stepped_ap = adam_step(state.log_alpha_prime, ap_grad, state.alpha_prime_opt)
    log_alpha_prime, alpha_prime_opt = masked_step(lagrange, stepped_ap,
                                                   (state.log_alpha_prime, state.alpha_prime_opt))
    new_state = ContinuousCQLState(
        actor_params=actor_params, critic_params=critic_params,
        critic_target=polyak_update(state.critic_target, critic_params, hp.tau),
        log_temperature=log_temperature, log_alpha_prime=log_alpha_prime, actor_opt=actor_opt,
        critic_opt=critic_opt, temperature_opt=temperature_opt, alpha_prime_opt=alpha_prime_opt,
        step=state.step + 1, stats=state.stats)
    metrics = {"loss": c_loss, "critic_loss": c_loss, **c_metrics, "actor_loss": a_loss,
               "temperature_loss": t_loss, "temperature": temperature,
               "entropy": -jnp.sum(weights.actor * log_prob), "alpha_prime": jnp.where(lagrange, alpha_prime, 1.0),
               "alpha_prime_loss": ap_loss, "target_q": jnp.sum(weights.td * target)}
    return new_state, metrics


def act_tanh_gaussian(actor: TanhGaussianActor, actor_params: dict, obs: jax.Array, key: jax.Array,
                      deterministic: bool) -> jax.Array:
    """obs (B, S+E) already normalised -> (B, A): tanh(μ(o)), or a sample of π(·|o)."""
    mean, log_std = actor.apply(actor_params, obs)
    if deterministic:
        return jnp.tanh(mean)
    return sample_tanh_gaussian(key, mean, log_std)[0]


def make_continuous_cql(spec: Spec, net: NetConfig = SAC_NET, num_action_samples: int = 10) -> Algorithm:
    """Builds continuous CQL (SAC backbone) for ``spec`` (must be continuous).

    Args:
      spec: environment interface; actions in [−1, 1]^A with A = ``spec.action_dim``.
      net: static shapes of the actor and of each critic (default 3×256 heads after the encoder).
      num_action_samples: K, proposal actions per source (uniform, π(o), π(o')) in the conservative term.
    """
    if spec.discrete:
        raise ValueError("make_continuous_cql needs a continuous action space (spec.discrete=False); for "
                         "discrete actions use imaginejax.algos.cql.make_cql")
    if num_action_samples < 1:
        raise ValueError(f"num_action_samples must be >= 1, got {num_action_samples}")
    actor = TanhGaussianActor(net, spec.action_dim)
    critic = TwinCritic(net)

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: ContinuousCQLHyperparams) -> ContinuousCQLState:
        return init_continuous_cql(actor, critic, key, spec_, stats, hp)

    def update(state: ContinuousCQLState, batch: Batch, key: jax.Array, hp: ContinuousCQLHyperparams,
               data: Datasets) -> tuple[ContinuousCQLState, dict[str, jax.Array]]:
        """One update on a batch of B transitions (uniform weights); metrics are pre-update."""
        del data
        return continuous_cql_step(actor, critic, state, batch, RowWeights.uniform(batch.reward.shape[0]), key,
                                   hp, hp.alpha, num_action_samples)

    def act(state: ContinuousCQLState, obs: jax.Array, key: jax.Array, hp: ContinuousCQLHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) raw -> (B, A) float32 in [−1, 1]: tanh(μ), or a sample of π."""
        return act_tanh_gaussian(actor, state.actor_params, state.stats.observation(obs), key, deterministic)

    return Algorithm(name="cql_continuous", init=init, update=update, act=act,
                     default_hp=continuous_cql_default_hp)
