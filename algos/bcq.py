"""Discrete batch-constrained Q-learning (Fujimoto et al. 2019, "Benchmarking batch deep RL"),
language-conditioned.

Two heads over the observation o = s ⊕ e(ℓ): action values Q_θ(o, ·) ∈ R^n and behaviour logits
z_θ(o, ·) ∈ R^n of the imitation model π_b(a|o) = softmax(z_θ(o))_a. The *action filter* keeps the
actions the data makes plausible,

    A_τ(o) = { a : π_b(a|o) / max_b π_b(b|o) > τ } = { a : z(o, a) − max_b z(o, b) > log τ },   τ = 0.3,

and the batch-constrained greedy policy is π(o) = argmax_{a ∈ A_τ(o)} Q_θ(o, a). It is used both to act
and inside the target (action chosen by the online networks, valued by the target network θ'):

    y = r + γ · (1 − d) · Q_θ'(o', π(o'))            d = 1 only on true terminations; γ from ``hp``

One Adam step on

    L(θ) = E[ h(Q_θ(o, a) − y) ]  +  E[ −log π_b(a|o) ]  +  β · E_{o,b}[ z_θ(o, b)² ]     (β = 1e-2)

with h the Huber loss (δ = 1). The logit penalty is the mean of z² over the batch and the n actions.
The target network follows the periodic Polyak rule of :mod:`imaginejax.algos.common`; default the hard
copy every 8000 updates of the d3rlpy reference.

Choices:

* **Shared language encoder, separate heads** (``share_encoder=True``, default): one encoder
  enc(s ⊕ e) feeds a Q head and an imitation head, each a ReLU MLP of widths ``net.hidden``. The d3rlpy
  reference shares its encoder between the Q-function and the imitator (``share_encoder=True``) and
  Fujimoto's Atari network shares its convolutional torso: the dense, supervised imitation signal then
  also shapes the instruction features the Q head reads. The heads stay separate, as in Fujimoto's
  fully-connected network, so neither output is a linear read-out of the other's features.
  ``share_encoder=False`` gives each head its own encoder.
* **Filter in the target as in the paper**: d3rlpy's ``DiscreteBCQ`` uses the unfiltered double-DQN
  argmax in its target and the filter only when acting; we filter both, as Fujimoto et al. do — an
  unfiltered argmax would bootstrap from exactly the out-of-data actions BCQ exists to avoid.
* Defaults as the reference: lr 6.25e-5, batch 32 (an engine setting), τ = 0.3, β = 1e-2, γ = 0.99.
"""

from __future__ import annotations

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import adam_init, adam_step, huber, periodic_polyak_update, td_target
from imaginejax.algos.cql import take_action_values
from imaginejax.algos.networks import LanguageEncoder, MLP, NetConfig
from imaginejax.data.types import Batch


class QImitationNet(nn.Module):
    """obs (..., S+E) -> (q (..., n), logits (..., n)): a Q head and a behaviour-policy head.

    Attributes:
      config: static shapes (encoder width/depth, head hidden widths).
      num_actions: n.
      share_encoder: one language encoder for both heads (True) or one each (False).
    """

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
    """Traced hyperparameters (all () arrays).

    Attributes:
      learning_rate: Adam step size (6.25e-5).
      threshold: τ of the action filter, in [0, 1) (0.3).
      logit_l2: β, weight of the mean squared imitation logits (1e-2).
      gamma: discount γ (0.99).
      target_update_interval: N, target update every N updates (8000), int32.
      target_tau: τ of the periodic Polyak update (1.0 = hard copy).
    """

    learning_rate: jax.Array
    threshold: jax.Array
    logit_l2: jax.Array
    gamma: jax.Array
    target_update_interval: jax.Array
    target_tau: jax.Array


@struct.dataclass
class BCQState:
    """params / target_params: both heads θ and θ'; opt_state: Adam; step: () int32 updates done."""

    params: dict
    target_params: dict
    opt_state: optax.OptState
    step: jax.Array


def action_filter(logits: jax.Array, threshold: jax.Array | float) -> jax.Array:
    """Allowed actions A_τ: π_b(a|o) / max_b π_b(b|o) > τ, computed in log space.

    Args:
      logits: (B, n) imitation logits z (the softmax normaliser cancels in the ratio).
      threshold: () τ in [0, 1); τ = 0 allows every action.

    Returns:
      (B, n) bool mask; the most likely action always passes when τ < 1.
    """
    log_ratio = logits - jnp.max(logits, axis=-1, keepdims=True)
    return log_ratio > jnp.log(threshold)


def filtered_argmax(q: jax.Array, logits: jax.Array, threshold: jax.Array | float) -> jax.Array:
    """argmax_{a ∈ A_τ(o)} Q(o, a): q, logits (B, n) -> (B,) int32."""
    allowed = action_filter(logits, threshold)
    return jnp.argmax(jnp.where(allowed, q, -jnp.inf), axis=-1).astype(jnp.int32)


def bcq_loss(q: jax.Array, logits: jax.Array, action: jax.Array, target: jax.Array,
             logit_l2: jax.Array | float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The discrete BCQ loss on given head outputs.

    Args:
      q: (B, n) Q_θ(o, ·).
      logits: (B, n) imitation logits z_θ(o, ·).
      action: (B,) int dataset actions.
      target: (B,) TD targets y.
      logit_l2: () β.

    Returns:
      (loss, metrics): loss = mean h(Q(o,a) − y) + mean(−log softmax(z)_a) + β · mean(z²);
      metrics td_loss, imitation_loss, logit_penalty, q_data, imitation_accuracy.
    """
    chex.assert_equal_shape([q, logits])
    chex.assert_shape([action, target], (q.shape[0],))
    q_data = take_action_values(q, action)
    td = huber(q_data - target).mean()
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, action).mean()
    penalty = jnp.square(logits).mean()
    loss = td + nll + logit_l2 * penalty
    return loss, {"loss": loss, "td_loss": td, "imitation_loss": nll, "logit_penalty": penalty,
                  "q_data": q_data.mean(),
                  "imitation_accuracy": (jnp.argmax(logits, -1) == action).mean()}


def make_bcq(spec: Spec, net: NetConfig = NetConfig(), share_encoder: bool = True) -> Algorithm:
    """Builds discrete BCQ for ``spec`` (must be discrete) with static network shapes ``net``.

    Args:
      spec: environment interface; ``spec.action_dim`` is the number of actions n.
      net: static shapes of the encoder and of each head.
      share_encoder: static; one language encoder for the Q and imitation heads (default) or two.
    """
    if not spec.discrete:
        raise ValueError("make_bcq is discrete BCQ: spec.discrete must be True (continuous BCQ, with its "
                         "VAE and perturbation network, is a separate algorithm)")
    model = QImitationNet(net, spec.action_dim, share_encoder)

    def default_hp(spec_: Spec) -> BCQHyperparams:
        del spec_
        return BCQHyperparams(learning_rate=jnp.float32(6.25e-5), threshold=jnp.float32(0.3),
                              logit_l2=jnp.float32(1e-2), gamma=jnp.float32(0.99),
                              target_update_interval=jnp.int32(8000), target_tau=jnp.float32(1.0))

    def init(key: jax.Array, spec_: Spec, hp: BCQHyperparams) -> BCQState:
        del hp
        params = model.init(key, jnp.zeros((1, spec_.obs_dim), jnp.float32))
        return BCQState(params=params, target_params=params, opt_state=adam_init(params),
                        step=jnp.zeros((), jnp.int32))

    def update(state: BCQState, batch: Batch, key: jax.Array,
               hp: BCQHyperparams) -> tuple[BCQState, dict[str, jax.Array]]:
        """One gradient step on a batch of B transitions; metrics are pre-update batch means."""
        del key
        next_obs = batch.next_observation
        q_next, logits_next = model.apply(state.params, next_obs)
        q_next_target, _ = model.apply(state.target_params, next_obs)
        next_action = filtered_argmax(q_next, logits_next, hp.threshold)
        next_value = jax.lax.stop_gradient(take_action_values(q_next_target, next_action))
        target = td_target(batch.reward, batch.terminal, next_value, hp.gamma)

        def loss_fn(params):
            q, logits = model.apply(params, batch.observation)
            return bcq_loss(q, logits, batch.action, target, hp.logit_l2)

        grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
        params, opt_state = adam_step(state.params, grads, state.opt_state, hp.learning_rate)
        count = state.step + 1
        target_params = periodic_polyak_update(state.target_params, params, count,
                                               hp.target_update_interval, hp.target_tau)
        metrics["target_q"] = target.mean()
        metrics["allowed_actions"] = action_filter(logits_next, hp.threshold).sum(-1).mean()
        return BCQState(params=params, target_params=target_params, opt_state=opt_state,
                        step=count), metrics

    def act(state: BCQState, obs: jax.Array, key: jax.Array, hp: BCQHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) -> (B,) int32: filtered argmax, or a ~ softmax(Q) restricted to A_τ(o)."""
        q, logits = model.apply(state.params, obs)
        if deterministic:
            return filtered_argmax(q, logits, hp.threshold)
        allowed = action_filter(logits, hp.threshold)
        return jax.random.categorical(key, jnp.where(allowed, q, -jnp.inf)).astype(jnp.int32)

    return Algorithm(name="bcq", init=init, update=update, act=act, default_hp=default_hp)
