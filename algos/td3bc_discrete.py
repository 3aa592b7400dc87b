"""Discrete TD3+BC: TD3+BC (Fujimoto & Gu 2021) with a categorical actor, language-conditioned.

Not in the reference (ImagineBench ran TD3+BC only on continuous tasks); this is our extension to the
discrete environments. Derivation from the continuous actor objective

    max_φ  E_D[ λ · Q(s, π_φ(s))  −  (π_φ(s) − a)² ]:

A deterministic choice among n actions is not differentiable, so the actor is categorical,
π_φ(·|o) = softmax(z_φ(o)) over o = s̃ ⊕ e(ℓ) (normalised state ⊕ instruction embedding), and

1. **Q term → expected Q.** Q(s, π(s)) becomes V^π(o) = Σ_a π_φ(a|o) Q_θ1(o, a): an exact finite sum,
   differentiable in φ with no reparameterisation or score-function estimator,
   ∂V^π/∂z_b = π_b (Q_b − V^π) (an advantage-weighted logit gradient). For a one-hot π it is Q(s, π(s)).
2. **MSE → cross-entropy.** With the data action one-hot e_a, ‖π(·|o) − e_a‖² (the literal MSE) and
   −log π(a|o) are both proper scoring rules minimised by the behaviour distribution; the
   cross-entropy is the log-likelihood counterpart (and discrete BC's loss here), and its gradient
   π_b − 1[b = a] does not vanish when π is confidently wrong, while the squared error's does.
3. **λ unchanged**: λ = α / E_B|V^π(o)| with no gradient through the denominator (α = 2.5), so the Q
   term has scale α whatever the reward scale.

    L(φ) = −λ · E_B[ Σ_a π_φ(a|o) Q_θ1(o, a) ]  +  E_B[ −log π_φ(a_data|o) ]

Per state, with p(·|s) the data's action distribution, setting ∂L/∂z_b = −λ π_b (Q_b − V^π) + π_b − p_b
to zero gives

    π(b|s) = p(b|s) / (1 − λ (Q(s, b) − V^π(s))):

the behaviour policy re-weighted by advantage (a positive denominator needs λ(Q − V^π) < 1 on the
data's actions). Actions absent from the data (p = 0) get π = 0 at the stationary point: the support
constraint that BCQ's filter imposes, here obtained softly; λ → 0 recovers BC.

Critic. Twin Q-networks Q_θi(o, ·) ∈ R^n (independent, each with its own language encoder). TD3's
target-policy smoothing adds noise to the deterministic target action; a categorical target policy is
already smooth, so the target takes the expectation under it (expected-SARSA style):

    y = r + γ · (1 − d) · Σ_a' π_φ'(a'|o') · min_i Q_θi'(o', a'),     L(θ) = Σ_i E[(Q_θi(o, a) − y)²]

with d = 1 only on true terminations and γ from ``hp``. As in TD3+BC: critic every update, actor and
Polyak targets (τ = 0.005) every ``policy_freq``-th update (traced, masked with ``jnp.where`` so
skipped updates leave the actor and its Adam state unchanged), Adam 3e-4, states normalised with the
real buffer's statistics carried in ``hp.normalizer``. Acting: argmax_a π_φ(a|o), or a ~ π_φ(·|o).

The update is :func:`discrete_td3bc_step`, whose ``bc_target`` hook (as in continuous TD3+BC) gives the
cross-entropy's target action: the batch's own here, the nearest neighbour's in discrete PRDC.
"""

from __future__ import annotations

from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import Datasets, TwinDiscreteCritic, first_critic_apply, td_target
from imaginejax.algos.cql import take_action_values
from imaginejax.algos.networks import EncodedMLP, NetConfig
from imaginejax.algos.td3bc import BCTarget, TD3BCState, critic_then_actor_step, dataset_action, td3bc_init
from imaginejax.data.types import Batch


@struct.dataclass
class DiscreteTD3BCHyperparams:
    """Traced hyperparameters.

    Attributes:
      actor_lr, critic_lr: () Adam step sizes (3e-4).
      gamma: () discount γ (0.99).
      tau: () Polyak rate of both target networks (0.005).
      policy_freq: () int32, actor and targets are updated every ``policy_freq``-th update (2).
      alpha: () α of λ = α / mean|V^π| (2.5).
    """

    actor_lr: jax.Array
    critic_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array
    policy_freq: jax.Array
    alpha: jax.Array


def expected_next_value(target_logits: jax.Array, q_next: jax.Array) -> jax.Array:
    """V'(o') = Σ_a' π_φ'(a'|o') min_i Q_θi'(o', a'): logits (B, n), q_next (2, B, n) -> (B,)."""
    chex.assert_shape(q_next, (2,) + target_logits.shape)
    return jnp.sum(jax.nn.softmax(target_logits, axis=-1) * jnp.min(q_next, axis=0), axis=-1)


def discrete_actor_loss(logits: jax.Array, q1: jax.Array, action: jax.Array,
                        alpha: jax.Array | float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """−λ · mean Σ_a π(a|o) Q1(o, a) + mean(−log π(a_data|o)), λ = α / mean|Σ_a π Q1|.

    Args:
      logits: (B, n) actor logits z_φ(o) (differentiable).
      q1: (B, n) Q_θ1(o, ·) (treated as constants by the actor step).
      action: (B,) int dataset actions.
      alpha: () α.

    Returns:
      (loss, metrics); the denominator of λ carries no gradient (floored at 1e-6). metrics:
      actor_loss, lambda, cross_entropy, expected_q, policy_accuracy.
    """
    chex.assert_equal_shape([logits, q1])
    chex.assert_shape(action, (logits.shape[0],))
    expected_q = jnp.sum(jax.nn.softmax(logits, axis=-1) * q1, axis=-1)
    lam = alpha / jnp.maximum(jax.lax.stop_gradient(jnp.abs(expected_q).mean()), 1e-6)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, action).mean()
    loss = -lam * expected_q.mean() + ce
    return loss, {"actor_loss": loss, "lambda": lam, "cross_entropy": ce,
                  "expected_q": expected_q.mean(),
                  "policy_accuracy": (jnp.argmax(logits, -1) == action).mean()}


def discrete_td3bc_step(actor: EncodedMLP, critic: TwinDiscreteCritic, state: TD3BCState, batch: Batch, hp: Any,
                        bc_target: BCTarget = dataset_action) -> tuple[TD3BCState, dict[str, jax.Array]]:
    """One discrete TD3+BC update (module docstring) with the cross-entropy target given by ``bc_target``.

    Args:
      actor: the logits network, obs (B, S+E) -> (B, n).
      critic: the twin Q-networks, obs (B, S+E) -> (2, B, n).
      state: the state before the update.
      batch: B rows with raw (un-normalised) states and int actions (B,).
      hp: has ``normalizer``, ``gamma``, ``alpha``, ``critic_lr``, ``actor_lr``, ``policy_freq``, ``tau``.
      bc_target: the cross-entropy's target action (B,) int from the actor's logits (no gradient) and the
        batch; :func:`~imaginejax.algos.td3bc.dataset_action` is discrete TD3+BC, PRDC passes its search.

    Returns:
      The new state and pre-update metrics: loss (= critic_loss), critic_loss, the actor metrics of
      :func:`discrete_actor_loss` (evaluated every step, applied only on actor steps), bc_target's own
      metrics, q1_data, target_q, actor_updated.
    """
    obs = state.stats.observation(batch.observation)
    next_obs = state.stats.observation(batch.next_observation)
    next_value = expected_next_value(actor.apply(state.actor_target, next_obs),
                                     critic.apply(state.critic_target, next_obs))
    target = jax.lax.stop_gradient(td_target(batch.reward, batch.terminal, next_value, hp.gamma))

    def data_q(params: dict) -> jax.Array:
        return jax.vmap(take_action_values, in_axes=(0, None))(critic.apply(params, obs), batch.action)

    def objective(critic_params: dict) -> Callable[[jax.Array, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]:
        q1 = jax.lax.stop_gradient(first_critic_apply(critic, critic_params, obs))  # once, outside the gradient
        return lambda logits, bc_action: discrete_actor_loss(logits, q1, bc_action, hp.alpha)

    return critic_then_actor_step(actor, state, batch, obs, target, hp, data_q, objective, bc_target)


def categorical_act(actor: EncodedMLP) -> Callable[..., jax.Array]:
    """The ``act(state, obs, key, hp, deterministic=True)`` of discrete TD3+BC and PRDC: obs (B, S+E) raw
    -> (B,) int32: argmax_a π(a|o), or a ~ π(·|o) (states normalised with ``hp``)."""

    def act(state: TD3BCState, obs: jax.Array, key: jax.Array, hp: Any, deterministic: bool = True) -> jax.Array:
        logits = actor.apply(state.actor_params, state.stats.observation(obs))
        if deterministic:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(key, logits).astype(jnp.int32)

    return act


def make_discrete_td3bc(spec: Spec, net: NetConfig = NetConfig()) -> Algorithm:
    """Builds discrete TD3+BC for ``spec`` (must be discrete) with static shapes ``net``.

    The state is a :class:`~imaginejax.algos.td3bc.TD3BCState` (actor logits network φ, twin critics θ
    stacked on a leading axis of 2, targets, Adam states, update count).
    """
    if not spec.discrete:
        raise ValueError("make_discrete_td3bc needs a discrete action space; for continuous actions use "
                         "imaginejax.algos.td3bc.make_td3bc")
    actor = EncodedMLP(net, out=spec.action_dim)
    critic = TwinDiscreteCritic(net, spec.action_dim)

    def default_hp(spec_: Spec) -> DiscreteTD3BCHyperparams:
        return DiscreteTD3BCHyperparams(
            actor_lr=jnp.float32(3e-4), critic_lr=jnp.float32(3e-4), gamma=jnp.float32(0.99),
            tau=jnp.float32(0.005), policy_freq=jnp.int32(2), alpha=jnp.float32(2.5))

    def update(state: TD3BCState, batch: Batch, key: jax.Array, hp: DiscreteTD3BCHyperparams,
               data: Datasets) -> tuple[TD3BCState, dict[str, jax.Array]]:
        """One critic step and, every ``policy_freq``-th call, one actor step and target update.

        Metrics (pre-update batch means): loss (= critic_loss), critic_loss, the actor metrics
        (evaluated every step, applied only on actor steps), q1_data, target_q, actor_updated.
        """
        del key, data
        return discrete_td3bc_step(actor, critic, state, batch, hp)

    return Algorithm(name="td3bc_discrete", init=td3bc_init(actor, critic), update=update,
                     act=categorical_act(actor), default_hp=default_hp)
