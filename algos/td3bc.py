"""TD3+BC (Fujimoto & Gu 2021), language-conditioned, continuous actions in [-1, 1]^A.

Observations are o = s̃ ⊕ e(ℓ), where s̃ = (s − μ) / σ normalises the state with the *real* buffer's
statistics (carried in ``hp.normalizer``) and e(ℓ) is the instruction embedding. Networks: a
deterministic actor π_φ(o) = tanh(f_φ(o)) and twin critics Q_{θ1}, Q_{θ2} (independent networks, each
language encoder → ReLU 256×256 with the action joining after the encoder), with target copies φ', θ'.

Critic, every update (ε ~ N(0, I), d = 1 only on true terminations, γ from ``hp``):

    ã  = clip( π_φ'(o') + clip(σ_n · ε, −c, c), −1, 1 )                 σ_n = 0.2, c = 0.5
    y  = r + γ · (1 − d) · min_i Q_θi'(o', ã)
    L(θ) = E[(Q_θ1(o, a) − y)²] + E[(Q_θ2(o, a) − y)²]

Actor and both targets, every ``policy_freq``-th update only (k = 1, 2, … counts updates; k mod 2 = 0),
with the critic just updated:

    λ    = α / E_B[ |Q_θ1(o, π_φ(o))| ]                 (no gradient through the denominator; α = 2.5)
    L(φ) = −λ · E_B[ Q_θ1(o, π_φ(o)) ]  +  E_B,A[ (π_φ(o) − a)² ]      (mean over batch and action dims)
    φ' ← (1 − τ) φ' + τ φ,   θ' ← (1 − τ) θ' + τ θ                    τ = 0.005

The skip is a ``jnp.where`` on the traced step counter (:func:`~imaginejax.algos.common.masked_step`):
on a skipped update the actor's parameters *and* its Adam state are left bit-for-bit unchanged, and
``policy_freq`` itself is a traced hyperparameter. Adam, lr 3e-4 for both; batch 256 (an engine setting).
Acting: a = π_φ(o); when not deterministic, the target-smoothing noise clip(σ_n ε, −c, c) is added.

The update is :func:`td3bc_step`; its ``bc_target`` hook gives the BC term's target from π_φ(o) (no
gradient) and the batch: the batch's own action here (:func:`dataset_action`), the nearest dataset
neighbour's in PRDC (:mod:`imaginejax.algos.prdc`), which is otherwise this very update. The actor's
Q term needs Q_θ1 only, so only the first critic is evaluated there
(:func:`~imaginejax.algos.common.first_critic_apply`).
"""

from __future__ import annotations

from typing import Any, Callable

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import (DataStats, Datasets, TwinCritic, adam, adam_step, first_critic_apply,
                                     masked_step, periodic_polyak_update, td_target, twin_critic_loss)
from imaginejax.algos.networks import EncodedMLP, NetConfig
from imaginejax.data.types import Batch


@struct.dataclass
class TD3BCHyperparams:
    """Traced hyperparameters.

    Attributes:
      actor_lr, critic_lr: () Adam step sizes (3e-4).
      gamma: () discount γ (0.99).
      tau: () Polyak rate of both target networks (0.005).
      policy_noise: () σ_n, std of the target-smoothing noise (0.2).
      noise_clip: () c, clip of that noise (0.5).
      policy_freq: () int32, actor and targets are updated every ``policy_freq``-th update (2).
      alpha: () α of λ = α / mean|Q| (2.5).
    """

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
    """Actor φ, twin critics θ (stacked, leading axis 2), their targets, Adam states, update count and the
    real data's state statistics."""

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
    """ã = clip(π'(o') + clip(σ_n · ε, −c, c), −1, 1).

    Args:
      target_action: (B, A) π_φ'(o').
      noise: (B, A) standard normal ε.
      policy_noise: () σ_n.
      noise_clip: () c.

    Returns:
      (B, A) smoothed actions in [-1, 1].
    """
    chex.assert_equal_shape([target_action, noise])
    return jnp.clip(target_action + jnp.clip(policy_noise * noise, -noise_clip, noise_clip), -1.0, 1.0)


def actor_loss(q1_pi: jax.Array, pi: jax.Array, action: jax.Array,
               alpha: jax.Array | float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """TD3+BC actor loss −λ · mean Q1(o, π(o)) + mean (π(o) − a)², λ = α / mean|Q1(o, π(o))|.

    Args:
      q1_pi: (B,) Q_θ1(o, π_φ(o)) (differentiable in φ through π).
      pi: (B, A) π_φ(o).
      action: (B, A) dataset actions.
      alpha: () α.

    Returns:
      (loss, metrics); the denominator of λ carries no gradient (floored at 1e-6 so an all-zero critic
      cannot divide by zero). metrics: actor_loss, lambda, bc_mse.
    """
    chex.assert_equal_shape([pi, action])
    chex.assert_shape(q1_pi, (pi.shape[0],))
    lam = alpha / jnp.maximum(jax.lax.stop_gradient(jnp.abs(q1_pi).mean()), 1e-6)
    bc = jnp.square(pi - action).mean()
    loss = -lam * q1_pi.mean() + bc
    return loss, {"actor_loss": loss, "lambda": lam, "bc_mse": bc}


def delayed_policy_step(state: TD3BCState, actor_grads: dict, critic_params: dict, critic_opt: optax.OptState,
                        hp: Any) -> tuple[TD3BCState, jax.Array]:
    """TD3's delayed policy update, shared by the continuous and the discrete TD3+BC.

    Update k = state.step + 1 applies the Adam step on the actor (``hp.actor_lr``) and Polyak-averages
    both target networks (``hp.tau``) only when k mod ``hp.policy_freq`` = 0; on other updates the actor,
    its Adam state and the targets stay bit-identical (a ``jnp.where`` mask, so it vmaps over runs).

    Args:
      state: the state before the update.
      actor_grads: gradients of the actor loss at ``state.actor_params``.
      critic_params, critic_opt: the critics after this update's step.
      hp: hyperparameters with ``actor_lr``, ``policy_freq`` and ``tau``.

    Returns:
      The new state (step k) and () bool, whether the actor was updated.
    """
    new_actor, new_actor_opt = adam_step(state.actor_params, actor_grads, state.actor_opt)
    count = state.step + 1
    actor_due = (count % jnp.maximum(hp.policy_freq, 1)) == 0
    actor_params, actor_opt = masked_step(actor_due, (new_actor, new_actor_opt),
                                          (state.actor_params, state.actor_opt))
    actor_target = periodic_polyak_update(state.actor_target, actor_params, count, hp.policy_freq, hp.tau)
    critic_target = periodic_polyak_update(state.critic_target, critic_params, count, hp.policy_freq, hp.tau)
    return TD3BCState(actor_params=actor_params, critic_params=critic_params, actor_target=actor_target,
                      critic_target=critic_target, actor_opt=actor_opt, critic_opt=critic_opt,
                      step=count, stats=state.stats), actor_due


# The behaviour-cloning target of the actor loss: (policy output without gradient, batch) -> (target,
# extra metrics). Continuous: policy output π_φ(o) (B, A) -> target actions (B, A); discrete: logits
# z_φ(o) (B, n) -> target action indices (B,). TD3+BC's is the batch's own action (:func:`dataset_action`);
# PRDC's is the nearest dataset neighbour's (:mod:`imaginejax.algos.prdc`).
BCTarget = Callable[[jax.Array, Batch], tuple[jax.Array, dict[str, jax.Array]]]


def dataset_action(policy_output: jax.Array, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """TD3+BC's behaviour-cloning target: the batch's own actions (B, A) or (B,), no extra metrics."""
    del policy_output
    return batch.action, {}


# The actor's objective at the critics just updated: critic params θ -> ((actor output with gradient, BC
# target) -> (loss, metrics)). Whatever it computes from θ alone runs once, outside the actor's gradient.
ActorObjective = Callable[[dict], Callable[[jax.Array, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]]


def critic_then_actor_step(actor: nn.Module, state: TD3BCState, batch: Batch, obs: jax.Array, target: jax.Array,
                           hp: Any, data_q: Callable[[dict], jax.Array], actor_objective: ActorObjective,
                           bc_target: BCTarget) -> tuple[TD3BCState, dict[str, jax.Array]]:
    """The TD3 update after its TD target, shared by the continuous and the discrete TD3+BC (and so PRDC).

    1. Critic: L(θ) = Σ_i E_B[(Q_θi(o, a) − y)²] (:func:`~imaginejax.algos.common.twin_critic_loss`), one
       Adam step with ``hp.critic_lr``.
    2. Actor loss at the updated critics θ⁺: out = actor(φ, o), its BC target ``bc_target(out without
       gradient, batch)``, the loss ``actor_objective(θ⁺)(out, BC target)`` and its gradient in φ.
    3. :func:`delayed_policy_step` (actor Adam step and Polyak targets every ``hp.policy_freq``-th update).

    Args:
      actor: the actor network, obs (B, S+E) -> actions (B, A) or logits (B, n).
      state: the state before the update.
      batch: the B rows (raw states; passed to ``bc_target``).
      obs: (B, S+E) normalised observations o.
      target: (B,) TD targets y (no gradient).
      hp: has ``critic_lr``, ``actor_lr``, ``policy_freq`` and ``tau``.
      data_q: critic params -> (2, B) Q_θi(o, a) at the batch's actions.
      actor_objective: see :data:`ActorObjective`.
      bc_target: see :data:`BCTarget`.

    Returns:
      The new state and pre-update metrics: loss (= critic_loss), critic_loss, the actor objective's and
      ``bc_target``'s metrics (evaluated every step, applied only on actor steps), q1_data, target_q,
      actor_updated.
    """

    def critic_loss_fn(params):
        q = data_q(params)
        return twin_critic_loss(q, target), q

    (c_loss, q_data), c_grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(state.critic_params)
    critic_params, critic_opt = adam_step(state.critic_params, c_grads, state.critic_opt)
    objective = actor_objective(critic_params)

    def actor_loss_fn(params):
        out = actor.apply(params, obs)
        bc, extra = bc_target(jax.lax.stop_gradient(out), batch)
        loss, metrics = objective(out, bc)
        return loss, {**metrics, **extra}

    a_grads, a_metrics = jax.grad(actor_loss_fn, has_aux=True)(state.actor_params)
    new_state, actor_due = delayed_policy_step(state, a_grads, critic_params, critic_opt, hp)
    metrics = {"loss": c_loss, "critic_loss": c_loss, **a_metrics, "q1_data": q_data[0].mean(),
               "target_q": target.mean(), "actor_updated": actor_due.astype(jnp.float32)}
    return new_state, metrics


def td3bc_init(actor: nn.Module, critic: nn.Module) -> Callable[[jax.Array, Spec, Any], TD3BCState]:
    """The ``init(key, spec, hp)`` of every algorithm on :class:`TD3BCState` (TD3+BC, PRDC; continuous or
    discrete): a fresh state, targets = online parameters, zero Adam moments (``hp`` is unused).

    Args:
      actor: obs (1, S+E) -> actions or logits.
      critic: the twin critics: ``critic(obs, action)`` for continuous ``spec``, ``critic(obs)`` for discrete.

    The returned ``init`` splits ``key`` into the actor's and the critics' initialisation keys.
    """

    def init(key: jax.Array, spec: Spec, stats: DataStats, hp: Any) -> TD3BCState:
        actor_key, critic_key = jax.random.split(key)
        obs = jnp.zeros((1, spec.obs_dim), jnp.float32)
        actor_params = actor.init(actor_key, obs)
        critic_inputs = (obs,) if spec.discrete else (obs, jnp.zeros((1, spec.action_dim), jnp.float32))
        critic_params = critic.init(critic_key, *critic_inputs)
        return TD3BCState(actor_params=actor_params, critic_params=critic_params,
                          actor_target=actor_params, critic_target=critic_params,
                          actor_opt=adam(hp.actor_lr).init(actor_params),
                          critic_opt=adam(hp.critic_lr).init(critic_params), step=jnp.zeros((), jnp.int32),
                          stats=stats)

    return init


def td3bc_step(actor: EncodedMLP, critic: TwinCritic, state: TD3BCState, batch: Batch, key: jax.Array, hp: Any,
               bc_target: BCTarget = dataset_action) -> tuple[TD3BCState, dict[str, jax.Array]]:
    """One TD3+BC update (module docstring) with the behaviour-cloning target given by ``bc_target``.

    Args:
      actor: the deterministic squashed actor, obs (B, S+E) -> (B, A).
      critic: the twin critics, (obs (B, S+E), action (B, A)) -> (2, B).
      state: the state before the update.
      batch: B rows with raw (un-normalised) states.
      key: PRNG key of the target-smoothing noise.
      hp: has ``normalizer``, ``gamma``, ``policy_noise``, ``noise_clip``, ``alpha``, ``critic_lr``,
        ``actor_lr``, ``policy_freq`` and ``tau``.
      bc_target: the BC term's target from π_φ(o) (no gradient) and the batch; :func:`dataset_action` is
        TD3+BC, PRDC passes its nearest-neighbour search.

    Returns:
      The new state and pre-update metrics: loss (= critic_loss), critic_loss, actor_loss (evaluated every
      step, applied only on actor steps), lambda, bc_mse (to the BC target), bc_target's own metrics,
      q1_data, target_q, actor_updated.
    """
    obs = state.stats.observation(batch.observation)
    next_obs = state.stats.observation(batch.next_observation)

    noise = jax.random.normal(key, batch.action.shape, jnp.float32)
    next_action = smoothed_target_action(actor.apply(state.actor_target, next_obs), noise,
                                         hp.policy_noise, hp.noise_clip)
    q_next = critic.apply(state.critic_target, next_obs, next_action)  # (2, B)
    target = jax.lax.stop_gradient(td_target(batch.reward, batch.terminal, jnp.min(q_next, axis=0), hp.gamma))

    def objective(critic_params: dict) -> Callable[[jax.Array, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]:
        return lambda pi, bc_action: actor_loss(first_critic_apply(critic, critic_params, obs, pi), pi, bc_action,
                                                hp.alpha)

    return critic_then_actor_step(actor, state, batch, obs, target, hp,
                                  lambda params: critic.apply(params, obs, batch.action), objective, bc_target)


def td3bc_act(actor: EncodedMLP) -> Callable[..., jax.Array]:
    """The ``act(state, obs, key, hp, deterministic=True)`` of continuous TD3+BC and PRDC: obs (B, S+E) raw
    (un-normalised) -> (B, A) float32 actions in [-1, 1]: π(o), plus the clipped target-smoothing noise
    clip(σ_n ε, −c, c) when not deterministic."""

    def act(state: TD3BCState, obs: jax.Array, key: jax.Array, hp: Any, deterministic: bool = True) -> jax.Array:
        action = actor.apply(state.actor_params, state.stats.observation(obs))
        if deterministic:
            return action
        noise = jax.random.normal(key, action.shape, jnp.float32)
        return smoothed_target_action(action, noise, hp.policy_noise, hp.noise_clip)

    return act


def make_td3bc(spec: Spec, net: NetConfig = NetConfig()) -> Algorithm:
    """Builds TD3+BC for ``spec`` (must be continuous) with static shapes ``net`` for actor and critics.

    The reference uses 256×256 heads after the encoder for the actor and each critic: the default
    ``NetConfig()``.
    """
    if spec.discrete:
        raise ValueError("make_td3bc needs a continuous action space (spec.discrete=False); for discrete "
                         "actions use algos.make(\"td3bc\", spec) (imaginejax.algos.td3bc_discrete)")
    actor = EncodedMLP(net, out=spec.action_dim, squash=True)
    critic = TwinCritic(net)

    def default_hp(spec_: Spec) -> TD3BCHyperparams:
        return TD3BCHyperparams(
            actor_lr=jnp.float32(3e-4), critic_lr=jnp.float32(3e-4), gamma=jnp.float32(0.99),
            tau=jnp.float32(0.005), policy_noise=jnp.float32(0.2), noise_clip=jnp.float32(0.5),
            policy_freq=jnp.int32(2), alpha=jnp.float32(2.5))

    def update(state: TD3BCState, batch: Batch, key: jax.Array, hp: TD3BCHyperparams,
               data: Datasets) -> tuple[TD3BCState, dict[str, jax.Array]]:
        """One critic step and, every ``policy_freq``-th call, one actor step and target update.

        Metrics (pre-update batch means): loss (= critic_loss), critic_loss, actor_loss (evaluated
        every step, applied only on actor steps), lambda, bc_mse, q1_data, target_q, actor_updated.
        """
        del data
        return td3bc_step(actor, critic, state, batch, key, hp)

    return Algorithm(name="td3bc", init=td3bc_init(actor, critic), update=update, act=td3bc_act(actor),
                     default_hp=default_hp)
