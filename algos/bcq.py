"""Continuous batch-constrained Q-learning (Fujimoto et al. 2019, "Off-policy deep RL without exploration").

On o = s̃ ⊕ e(ℓ): a conditional VAE of the behaviour policy (E_ω(o, a) = (μ, log σ), D_ω(o, z)), a
perturbation ξ_φ with ã = clip(a + Φ tanh(·), −1, 1), twin critics Q_θ1, Q_θ2 and targets φ', θ'.
Samples â = D_ω(o, z), z ~ clip(N(0, I), −c, c). One update, in the reference's order:

    L(ω) = E[(D_ω(o, μ + σ ε) − a)²] + κ E[−½ (1 + log σ² − μ² − σ²)]
    y = r + γ (1 − d) max_k [λ min_i Q_θi'(o', ã'_k) + (1 − λ) max_i Q_θi'(o', ã'_k)],   N = 10 candidates
    L(θ) = Σ_i E[(Q_θi(o, a) − y)²],     L(φ) = −E[Q_θ1(o, ξ_φ(o, â))] at the new critic
    φ' ← (1 − τ) φ' + τ φ,   θ' ← (1 − τ) θ' + τ θ

Acting: the best of 100 perturbed candidates by Q_θ1 (random in both modes). Choices (one language
encoder per network, head widths): docs/algorithms/bcq.md.
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
from imaginejax.algos.common import DataStats, Datasets, adam, adam_step, polyak_update, td_target, twin_critic_loss
from imaginejax.algos.networks import LanguageEncoder, MLP, NetConfig, TwinCritic, first_critic_apply
from imaginejax.data.types import Batch

LOG_STD_RANGE = (-4.0, 15.0)  # log σ of the VAE encoder, as the authors' implementation


@dataclasses.dataclass(frozen=True)
class ContinuousBCQConfig:
    """Static shapes (the reference's): ReLU widths of VAE, perturbation and critic heads, latent width L
    (None: 2·A), candidates per next state in the target and per state when acting."""

    vae_hidden: tuple[int, ...] = (750, 750)
    perturbation_hidden: tuple[int, ...] = (400, 300)
    critic_hidden: tuple[int, ...] = (400, 300)
    latent_dim: int | None = None
    target_samples: int = 10
    act_samples: int = 100


class ConditionalVAE(nn.Module):
    """VAE of the behaviour policy conditioned on o; encoder and decoder each have a language encoder."""

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
        """obs (B, S+E), action (B, A) -> μ, log σ (B, L)."""
        out = self.encoder_head(self.encoder_language(obs), action)
        mean, log_std = jnp.split(out, 2, axis=-1)
        return mean, jnp.clip(log_std, *LOG_STD_RANGE)

    def decode(self, obs: jax.Array, latent: jax.Array) -> jax.Array:
        """obs (B, S+E), latent (B, L) or (B, N, L) -> actions (B, A) or (B, N, A) in (−1, 1)."""
        return jnp.tanh(self.decoder_head(self.decoder_language(obs), latent))

    def __call__(self, obs: jax.Array, action: jax.Array, noise: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(D(o, μ + σ ε), μ, log σ) for noise ε (B, L)."""
        mean, log_std = self.encode(obs, action)
        return self.decode(obs, mean + jnp.exp(log_std) * noise), mean, log_std


class Perturbation(nn.Module):
    """ã = clip(a + Φ tanh(head(enc(o) ⊕ a)), −1, 1): action (B, A) or (B, N, A) -> same shape."""

    net: NetConfig
    hidden: tuple[int, ...]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array, max_perturbation: jax.Array | float) -> jax.Array:
        h = LanguageEncoder(self.net.encoder_width, self.net.encoder_layers)(obs)
        xi = MLP(self.hidden, action.shape[-1])(h, action)
        return jnp.clip(action + max_perturbation * jnp.tanh(xi), -1.0, 1.0)


@struct.dataclass
class ContinuousBCQHyperparams:
    """Traced hyperparameters: lr 1e-3 each, γ, τ, λ = 0.75, Φ = 0.05, κ = 0.5, c = 0.5."""

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
    """VAE ω, perturbation φ, twin critics θ (stacked), targets φ', θ', Adam states, updates, data statistics."""

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
    """mean_{B,A} (â − a)² + κ mean_{B,L} −½ (1 + 2 log σ − μ² − σ²) -> (loss, metrics vae_loss,
    reconstruction_loss, kl)."""
    chex.assert_equal_shape([reconstruction, action])
    chex.assert_equal_shape([mean, log_std])
    reconstruction_loss = jnp.square(reconstruction - action).mean()
    kl = (-0.5 * (1.0 + 2.0 * log_std - jnp.square(mean) - jnp.exp(2.0 * log_std))).mean()
    loss = reconstruction_loss + kl_weight * kl
    return loss, {"vae_loss": loss, "reconstruction_loss": reconstruction_loss, "kl": kl}


def soft_clipped_double_q(q: jax.Array, lmbda: jax.Array | float) -> jax.Array:
    """max_k [λ min_i Q_i + (1 − λ) max_i Q_i]: q (2, B, N) -> (B,)."""
    chex.assert_rank(q, 3)
    chex.assert_axis_dimension(q, 0, 2)
    return jnp.max(lmbda * jnp.min(q, axis=0) + (1.0 - lmbda) * jnp.max(q, axis=0), axis=-1)


def sample_latent(key: jax.Array, shape: tuple[int, ...], latent_clip: jax.Array | float) -> jax.Array:
    """z ~ clip(N(0, I), −c, c) of ``shape``."""
    return jnp.clip(jax.random.normal(key, shape, jnp.float32), -latent_clip, latent_clip)


def select_by_q(candidates: jax.Array, q1: jax.Array) -> jax.Array:
    """The candidate with the largest Q_θ1: candidates (B, N, A), q1 (B, N) -> (B, A)."""
    chex.assert_shape(q1, candidates.shape[:2])
    return jnp.take_along_axis(candidates, jnp.argmax(q1, axis=1)[:, None, None], axis=1)[:, 0]


def make_bcq(spec: Spec, net: NetConfig = NetConfig(),
             config: ContinuousBCQConfig = ContinuousBCQConfig()) -> Algorithm:
    """Continuous BCQ for a continuous ``spec``: language encoders of shapes ``net`` (``net.hidden`` unused),
    heads, latent width and candidate counts from ``config``."""
    if spec.discrete:
        raise ValueError("make_bcq needs a continuous action space (spec.discrete=False); for "
                         "discrete actions use make_bcq_discrete (discrete BCQ, with its action filter)")
    for field in ("target_samples", "act_samples"):
        if getattr(config, field) < 1:
            raise ValueError(f"ContinuousBCQConfig.{field} must be >= 1, got {getattr(config, field)}")
    latent_dim = 2 * spec.action_dim if config.latent_dim is None else config.latent_dim
    if latent_dim < 1:
        raise ValueError(f"ContinuousBCQConfig.latent_dim must be >= 1 (or None for 2·A), got {latent_dim}")
    vae = ConditionalVAE(net, tuple(config.vae_hidden), spec.action_dim, latent_dim)
    actor = Perturbation(net, tuple(config.perturbation_hidden))
    critic = TwinCritic(dataclasses.replace(net, hidden=tuple(config.critic_hidden)))

    def candidates(vae_params: dict, actor_params: dict, obs: jax.Array, key: jax.Array, num: int,
                   hp: ContinuousBCQHyperparams) -> jax.Array:
        """num perturbed decoded candidates per state: obs (B, S+E) -> (B, num, A)."""
        decoded = vae.apply(vae_params, obs, sample_latent(key, (obs.shape[0], num, latent_dim), hp.latent_clip),
                            method=ConditionalVAE.decode)
        return actor.apply(actor_params, obs, decoded, hp.max_perturbation)

    def default_hp(spec_: Spec) -> ContinuousBCQHyperparams:
        f = jnp.float32
        return ContinuousBCQHyperparams(actor_lr=f(1e-3), critic_lr=f(1e-3), vae_lr=f(1e-3), gamma=f(0.99),
                                        tau=f(0.005), lmbda=f(0.75), max_perturbation=f(0.05), kl_weight=f(0.5),
                                        latent_clip=f(0.5))

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

        next_actions = candidates(vae_params, state.actor_target, next_obs, target_key, config.target_samples, hp)
        q_next = critic.apply(state.critic_target, next_obs, next_actions)  # (2, B, N)
        target = jax.lax.stop_gradient(td_target(batch.reward, batch.terminal, soft_clipped_double_q(q_next, hp.lmbda),
                                                 hp.gamma))

        def critic_loss_fn(params):
            q = critic.apply(params, obs, batch.action)  # (2, B)
            return twin_critic_loss(q, target), q

        (c_loss, q_data), c_grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(state.critic_params)
        critic_params, critic_opt = adam_step(state.critic_params, c_grads, state.critic_opt)

        z = sample_latent(actor_key, (b, latent_dim), hp.latent_clip)
        sampled = jax.lax.stop_gradient(vae.apply(vae_params, obs, z, method=ConditionalVAE.decode))
        a_loss, a_grads = jax.value_and_grad(lambda params: -first_critic_apply(
            critic, critic_params, obs, actor.apply(params, obs, sampled, hp.max_perturbation)).mean())(
            state.actor_params)
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
        """obs (B, S+E) raw -> (B, A): the best of ``act_samples`` candidates by Q_θ1 (key draws them always)."""
        obs = state.stats.observation(obs)
        cands = candidates(state.vae_params, state.actor_params, obs, key, config.act_samples, hp)
        return select_by_q(cands, first_critic_apply(critic, state.critic_params, obs, cands))

    return Algorithm(name="bcq", init=init, update=update, act=act, default_hp=default_hp)

