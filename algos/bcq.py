"""Batch-constrained Q-learning (Fujimoto et al.), language-conditioned: a discrete and a continuous variant.

* :func:`make_bcq` — **discrete BCQ** ("Benchmarking batch deep RL", Fujimoto et al. 2019b), below;
* :func:`make_continuous_bcq` — **continuous BCQ** ("Off-policy deep RL without exploration", Fujimoto
  et al. 2019a), described in the section "Continuous BCQ" further down.

Discrete BCQ
------------
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

Continuous BCQ
--------------
Four networks over o = s̃ ⊕ e(ℓ) (s̃ = (s − μ)/σ with ``hp.normalizer``; the identity by default, as the
reference does not normalise), each with its own language encoder (two tanh layers, widths from
``NetConfig``) followed by a ReLU head; an action or latent joins after the encoder, as in the critics
of :mod:`imaginejax.algos.common`:

* a conditional VAE of the behaviour policy, heads 750-750, latent width L = 2·A: the encoder
  E_ω(o, a) = (μ, log σ) with log σ clipped to [−4, 15], the decoder D_ω(o, z) = tanh(head(enc(o) ⊕ z));
* a perturbation network ξ_φ(o, a) = Φ · tanh(head(enc(o) ⊕ a)), heads 400-300, Φ = 0.05, applied as
  ã = clip(a + ξ_φ(o, a), −1, 1);
* twin critics Q_θ1, Q_θ2 with heads 400-300 (:class:`~imaginejax.algos.common.TwinCritic`);
* target copies φ', θ' of the perturbation network and of the critics (the VAE has none).

Sampling the generative model: â = D_ω(o, z) with z ~ clip(N(0, I), −c, c), c = 0.5.

One update on a batch (o, a, r, o', d), in the reference's order:

1. VAE, z = μ + σ ⊙ ε:  L(ω) = mean_{B,A} (D_ω(o, z) − a)²  +  κ · mean_{B,L} −½ (1 + log σ² − μ² − σ²),
   κ = 0.5 (the reconstruction averaged over batch and action dimensions, the KL term over batch and
   latent dimensions, as in the authors' implementation);
2. critics: N = 10 candidates per next state from the just-updated VAE, perturbed by ξ_φ', and the
   soft clipped double-Q target, maximised over the candidates,

       y = r + γ (1 − d) · max_k [ λ · min_i Q_θi'(o', ã'_k) + (1 − λ) · max_i Q_θi'(o', ã'_k) ],   λ = 0.75,

   with d = 1 only on true terminations and γ from ``hp``; L(θ) = Σ_i E[(Q_θi(o, a) − y)²];
3. perturbation network, against the just-updated critic: L(φ) = −E[ Q_θ1(o, clip(â + ξ_φ(o, â), −1, 1)) ]
   with â = D_ω(o, z) a fresh decoded sample (no gradient into ω);
4. targets, every update: θ' ← (1 − τ) θ' + τ θ, φ' ← (1 − τ) φ' + τ φ, τ = 0.005.

Adam with lr 1e-3 for all three (traced), batch 100 (an engine setting). Acting: 100 candidates per
state, each perturbed, and a = argmax_k Q_θ1(o, ã_k). The candidates are random in both modes (as the
reference's ``select_action``): ``deterministic`` has no effect, the key supplies the latent draws.

Choices:

* **One language encoder per network** (critic 1, critic 2, VAE encoder, VAE decoder, perturbation),
  each trained by its own network's loss. Every network of the reference sits behind the language
  encoder; the VAE's encoder and decoder are two networks there (d3rlpy builds an encoder for each).
* ``net`` (the registry's ``NetConfig``) gives the language encoder's width and depth; its ``hidden``
  widths are not used: BCQ has three kinds of head with their own reference widths, set through
  :class:`ContinuousBCQConfig` (which also holds the static sample counts 10 and 100 and L).
"""

from __future__ import annotations

import dataclasses

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import (DataStats, Datasets, TwinCritic, adam, adam_step, first_critic_apply, huber,
                                     periodic_polyak_update, polyak_update, td_target, twin_critic_loss)
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

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: BCQHyperparams) -> BCQState:
        del stats
        params = model.init(key, jnp.zeros((1, spec_.obs_dim), jnp.float32))
        return BCQState(params=params, target_params=params, opt_state=adam(hp.learning_rate).init(params),
                        step=jnp.zeros((), jnp.int32))

    def update(state: BCQState, batch: Batch, key: jax.Array, hp: BCQHyperparams,
               data: Datasets) -> tuple[BCQState, dict[str, jax.Array]]:
        """One gradient step on a batch of B transitions; metrics are pre-update batch means."""
        del key, data
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
        params, opt_state = adam_step(state.params, grads, state.opt_state)
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


# ===================================================================================================
# Continuous BCQ
# ===================================================================================================
@dataclasses.dataclass(frozen=True)
class ContinuousBCQConfig:
    """Static shapes of continuous BCQ (changing them recompiles); the defaults are the reference's.

    Attributes:
      vae_hidden: ReLU widths of the VAE encoder and decoder heads (750, 750).
      perturbation_hidden: ReLU widths of the perturbation head (400, 300).
      critic_hidden: ReLU widths of each critic head (400, 300).
      latent_dim: L, the VAE latent width; None means 2·A.
      target_samples: N, decoded candidates per next state in the target (10).
      act_samples: decoded candidates per state when acting (100).
    """

    vae_hidden: tuple[int, ...] = (750, 750)
    perturbation_hidden: tuple[int, ...] = (400, 300)
    critic_hidden: tuple[int, ...] = (400, 300)
    latent_dim: int | None = None
    target_samples: int = 10
    act_samples: int = 100


# log σ of the VAE encoder is clipped to this range (the authors' implementation).
LOG_STD_RANGE = (-4.0, 15.0)


class ConditionalVAE(nn.Module):
    """VAE of the behaviour policy, conditioned on o; its encoder and decoder each have a language encoder.

    Attributes:
      net: language-encoder width/depth (``hidden`` unused).
      hidden: ReLU widths of both heads.
      action_dim: A.
      latent_dim: L.
    """

    net: NetConfig
    hidden: tuple[int, ...]
    action_dim: int
    latent_dim: int

    def setup(self):
        width, layers = self.net.encoder_width, self.net.encoder_layers
        self.encoder_language = LanguageEncoder(width, layers)
        self.encoder_head = MLP(self.hidden, 2 * self.latent_dim)
        self.decoder_language = LanguageEncoder(width, layers)
        self.decoder_head = MLP(self.hidden, self.action_dim)

    def encode(self, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        """obs (B, S+E), action (B, A) -> (μ (B, L), log σ (B, L) clipped to [−4, 15])."""
        out = self.encoder_head(self.encoder_language(obs), action)
        mean, log_std = jnp.split(out, 2, axis=-1)
        return mean, jnp.clip(log_std, *LOG_STD_RANGE)

    def decode(self, obs: jax.Array, latent: jax.Array) -> jax.Array:
        """obs (B, S+E), latent (B, L) or (B, N, L) -> actions (B, A) or (B, N, A) in (−1, 1)."""
        return jnp.tanh(self.decoder_head(self.decoder_language(obs), latent))

    def __call__(self, obs: jax.Array, action: jax.Array,
                 noise: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Reconstruction through z = μ + σ ⊙ ε: noise ε (B, L) -> (reconstruction (B, A), μ, log σ)."""
        mean, log_std = self.encode(obs, action)
        return self.decode(obs, mean + jnp.exp(log_std) * noise), mean, log_std


class Perturbation(nn.Module):
    """ã = clip(a + Φ · tanh(head(enc(o) ⊕ a)), −1, 1): obs (B, S+E), action (B, A) or (B, N, A), Φ () ->
    perturbed actions of the action's shape.

    Attributes:
      net: language-encoder width/depth (``hidden`` unused).
      hidden: ReLU widths of the head.
    """

    net: NetConfig
    hidden: tuple[int, ...]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array, max_perturbation: jax.Array | float) -> jax.Array:
        h = LanguageEncoder(self.net.encoder_width, self.net.encoder_layers)(obs)
        xi = MLP(self.hidden, action.shape[-1])(h, action)
        return jnp.clip(action + max_perturbation * jnp.tanh(xi), -1.0, 1.0)


@struct.dataclass
class ContinuousBCQHyperparams:
    """Traced hyperparameters (all () arrays but the normaliser).

    Attributes:
      actor_lr, critic_lr, vae_lr: Adam step sizes of the perturbation network, critics and VAE (1e-3).
      gamma: discount γ (0.99).
      tau: Polyak rate of both target networks, applied every update (0.005).
      lmbda: λ of the soft clipped double-Q target (0.75; 1 is TD3's clipped minimum).
      max_perturbation: Φ, bound of the perturbation (0.05).
      kl_weight: κ, weight of the KL term in the VAE loss (0.5).
      latent_clip: c, prior samples are clipped to [−c, c] (0.5).
      normalizer: state statistics (S,), identity by default (``StateNormalizer.from_transitions``).
    """

    actor_lr: jax.Array
    critic_lr: jax.Array
    vae_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array
    lmbda: jax.Array
    max_perturbation: jax.Array
    kl_weight: jax.Array
    latent_clip: jax.Array


@struct.dataclass
class ContinuousBCQState:
    """VAE ω, perturbation φ and twin critics θ (stacked, leading axis 2), targets φ', θ', Adam states,
    and the number of updates done."""

    vae_params: dict
    actor_params: dict
    critic_params: dict
    actor_target: dict
    critic_target: dict
    vae_opt: optax.OptState
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    step: jax.Array
    stats: DataStats


def vae_loss(reconstruction: jax.Array, action: jax.Array, mean: jax.Array, log_std: jax.Array,
             kl_weight: jax.Array | float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """mean_{B,A} (â − a)² + κ · mean_{B,L} −½ (1 + 2 log σ − μ² − σ²).

    Args:
      reconstruction: (B, A) decoded actions D(o, μ + σ ε).
      action: (B, A) dataset actions.
      mean, log_std: (B, L) the encoder's μ and log σ.
      kl_weight: () κ.

    Returns:
      (loss, metrics vae_loss, reconstruction_loss, kl).
    """
    chex.assert_equal_shape([reconstruction, action])
    chex.assert_equal_shape([mean, log_std])
    reconstruction_loss = jnp.square(reconstruction - action).mean()
    kl = (-0.5 * (1.0 + 2.0 * log_std - jnp.square(mean) - jnp.exp(2.0 * log_std))).mean()
    loss = reconstruction_loss + kl_weight * kl
    return loss, {"vae_loss": loss, "reconstruction_loss": reconstruction_loss, "kl": kl}


def soft_clipped_double_q(q: jax.Array, lmbda: jax.Array | float) -> jax.Array:
    """max_k [λ · min_i Q_i + (1 − λ) · max_i Q_i]: q (2, B, N) twin values of N candidates -> (B,)."""
    chex.assert_rank(q, 3)
    chex.assert_axis_dimension(q, 0, 2)
    mixed = lmbda * jnp.min(q, axis=0) + (1.0 - lmbda) * jnp.max(q, axis=0)
    return jnp.max(mixed, axis=-1)


def sample_latent(key: jax.Array, shape: tuple[int, ...], latent_clip: jax.Array | float) -> jax.Array:
    """z ~ clip(N(0, I), −c, c) of ``shape`` (the generative model's prior samples)."""
    return jnp.clip(jax.random.normal(key, shape, jnp.float32), -latent_clip, latent_clip)


def select_by_q(candidates: jax.Array, q1: jax.Array) -> jax.Array:
    """The candidate with the largest Q_θ1: candidates (B, N, A), q1 (B, N) -> (B, A)."""
    chex.assert_shape(q1, candidates.shape[:2])
    return jnp.take_along_axis(candidates, jnp.argmax(q1, axis=1)[:, None, None], axis=1)[:, 0]


def make_continuous_bcq(spec: Spec, net: NetConfig = NetConfig(),
                        config: ContinuousBCQConfig = ContinuousBCQConfig()) -> Algorithm:
    """Builds continuous BCQ for ``spec`` (must be continuous, actions in [−1, 1]^A).

    Args:
      spec: environment interface; ``spec.action_dim`` is A.
      net: static language-encoder shapes (``encoder_width``, ``encoder_layers``) of every network;
        ``net.hidden`` is not used (the heads' widths are in ``config``).
      config: static head widths, latent width and candidate counts (reference values by default).
    """
    if spec.discrete:
        raise ValueError("make_continuous_bcq needs a continuous action space (spec.discrete=False); for "
                         "discrete actions use make_bcq (discrete BCQ, with its action filter)")
    for field in ("target_samples", "act_samples"):
        if getattr(config, field) < 1:
            raise ValueError(f"ContinuousBCQConfig.{field} must be >= 1, got {getattr(config, field)}")
    latent_dim = 2 * spec.action_dim if config.latent_dim is None else config.latent_dim
    if latent_dim < 1:
        raise ValueError(f"ContinuousBCQConfig.latent_dim must be >= 1 (or None for 2·A), got {latent_dim}")
    critic_net = dataclasses.replace(net, hidden=tuple(config.critic_hidden))
    vae = ConditionalVAE(net, tuple(config.vae_hidden), spec.action_dim, latent_dim)
    actor = Perturbation(net, tuple(config.perturbation_hidden))
    critic = TwinCritic(critic_net)
    def q1(critic_params: dict, obs: jax.Array, action: jax.Array) -> jax.Array:
        """Q_θ1 alone (half the work of the twin): obs (B, S+E), action (B, A) -> (B,) or (B, N, A) -> (B, N)."""
        return first_critic_apply(critic, critic_params, obs, action)

    def candidates(vae_params: dict, actor_params: dict, obs: jax.Array, key: jax.Array, num: int,
                   hp: ContinuousBCQHyperparams) -> jax.Array:
        """num perturbed decoded candidates per state: obs (B, S+E) -> (B, num, A)."""
        z = sample_latent(key, (obs.shape[0], num, latent_dim), hp.latent_clip)
        decoded = vae.apply(vae_params, obs, z, method=ConditionalVAE.decode)
        return actor.apply(actor_params, obs, decoded, hp.max_perturbation)

    def default_hp(spec_: Spec) -> ContinuousBCQHyperparams:
        f = jnp.float32
        return ContinuousBCQHyperparams(
            actor_lr=f(1e-3), critic_lr=f(1e-3), vae_lr=f(1e-3), gamma=f(0.99), tau=f(0.005), lmbda=f(0.75),
            max_perturbation=f(0.05), kl_weight=f(0.5), latent_clip=f(0.5))

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: ContinuousBCQHyperparams) -> ContinuousBCQState:
        vae_key, actor_key, critic_key = jax.random.split(key, 3)
        obs = jnp.zeros((1, spec_.obs_dim), jnp.float32)
        action = jnp.zeros((1, spec_.action_dim), jnp.float32)
        vae_params = vae.init(vae_key, obs, action, jnp.zeros((1, latent_dim), jnp.float32))
        actor_params = actor.init(actor_key, obs, action, hp.max_perturbation)
        critic_params = critic.init(critic_key, obs, action)
        return ContinuousBCQState(
            vae_params=vae_params, actor_params=actor_params, critic_params=critic_params,
            actor_target=actor_params, critic_target=critic_params, vae_opt=adam(hp.vae_lr).init(vae_params),
            actor_opt=adam(hp.actor_lr).init(actor_params), critic_opt=adam(hp.critic_lr).init(critic_params),
            step=jnp.zeros((), jnp.int32), stats=stats)

    def update(state: ContinuousBCQState, batch: Batch, key: jax.Array, hp: ContinuousBCQHyperparams,
               data: Datasets) -> tuple[ContinuousBCQState, dict[str, jax.Array]]:
        """VAE, critic and perturbation steps, then both targets (module docstring, continuous BCQ).

        Metrics (pre-update batch means): loss (= critic_loss), critic_loss, actor_loss, vae_loss,
        reconstruction_loss, kl, q1_data, target_q.
        """
        noise_key, target_key, actor_key = jax.random.split(key, 3)
        b = batch.reward.shape[0]
        obs = state.stats.observation(batch.observation)
        next_obs = state.stats.observation(batch.next_observation)

        def vae_loss_fn(params):
            noise = jax.random.normal(noise_key, (b, latent_dim), jnp.float32)
            reconstruction, mean, log_std = vae.apply(params, obs, batch.action, noise)
            return vae_loss(reconstruction, batch.action, mean, log_std, hp.kl_weight)

        v_grads, v_metrics = jax.grad(vae_loss_fn, has_aux=True)(state.vae_params)
        vae_params, vae_opt = adam_step(state.vae_params, v_grads, state.vae_opt)

        n = config.target_samples
        next_actions = candidates(vae_params, state.actor_target, next_obs, target_key, n, hp)  # (B, N, A)
        q_next = critic.apply(state.critic_target, next_obs, next_actions)  # (2, B, N): states encoded once
        next_value = soft_clipped_double_q(q_next, hp.lmbda)
        target = jax.lax.stop_gradient(td_target(batch.reward, batch.terminal, next_value, hp.gamma))

        def critic_loss_fn(params):
            q = critic.apply(params, obs, batch.action)
            return twin_critic_loss(q, target), q

        (c_loss, q_data), c_grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(state.critic_params)
        critic_params, critic_opt = adam_step(state.critic_params, c_grads, state.critic_opt)

        z = sample_latent(actor_key, (b, latent_dim), hp.latent_clip)
        sampled = jax.lax.stop_gradient(vae.apply(vae_params, obs, z, method=ConditionalVAE.decode))

        def actor_loss_fn(params):
            return -q1(critic_params, obs, actor.apply(params, obs, sampled, hp.max_perturbation)).mean()

        a_loss, a_grads = jax.value_and_grad(actor_loss_fn)(state.actor_params)
        actor_params, actor_opt = adam_step(state.actor_params, a_grads, state.actor_opt)
        new_state = ContinuousBCQState(
            vae_params=vae_params, actor_params=actor_params, critic_params=critic_params,
            actor_target=polyak_update(state.actor_target, actor_params, hp.tau),
            critic_target=polyak_update(state.critic_target, critic_params, hp.tau),
            vae_opt=vae_opt, actor_opt=actor_opt, critic_opt=critic_opt, step=state.step + 1, stats=state.stats)
        metrics = {"loss": c_loss, "critic_loss": c_loss, "actor_loss": a_loss, **v_metrics,
                   "q1_data": q_data[0].mean(), "target_q": target.mean()}
        return new_state, metrics

    def act(state: ContinuousBCQState, obs: jax.Array, key: jax.Array, hp: ContinuousBCQHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) raw -> (B, A) float32: the best of ``act_samples`` perturbed VAE candidates by Q_θ1.

        ``deterministic`` has no effect: the candidates are drawn with ``key`` in both modes.
        """
        del deterministic
        obs = state.stats.observation(obs)
        n = config.act_samples
        cands = candidates(state.vae_params, state.actor_params, obs, key, n, hp)  # (B, N, A)
        return select_by_q(cands, q1(state.critic_params, obs, cands))

    return Algorithm(name="bcq_continuous", init=init, update=update, act=act, default_hp=default_hp)
