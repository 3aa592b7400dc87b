"""Soft actor-critic pieces (Haarnoja et al. 2018) shared by continuous CQL and continuous COMBO.

* **Tanh-squashed Gaussian actor.** With o = s̃ ⊕ e(ℓ) (normalised state ⊕ instruction embedding), one
  network (language encoder → ReLU head, 2A outputs) gives the mean μ_φ(o) and log-std log σ_φ(o) ∈
  [−20, 2] (clipped, as rlkit's ``TanhGaussianPolicy`` that the CQL code builds on). An action is
  a = tanh(u), u = μ + σ ⊙ ε, ε ~ N(0, I), so a ∈ (−1, 1)^A, and by the change of variables

      log π(a|o) = Σ_j [ log N(u_j; μ_j, σ_j²) − log(1 − tanh²(u_j)) ],
      log(1 − tanh² u) = 2 (log 2 − u − softplus(−2u))            (the overflow-free form)

  The deterministic action (evaluation) is tanh(μ).

* **Actor loss** (reparameterised): L(φ) = E_o[ α · log π_φ(ã|o) − min_i Q_θi(o, ã) ], ã ~ π_φ(·|o).

* **Automatic entropy temperature**: α = exp(log α) with the loss
  L(log α) = −log α · E_o[ log π(ã|o) + H̄ ] (no gradient through log π), target entropy H̄ = −A.
  When the policy's entropy −E log π is below H̄ the gradient raises α, otherwise lowers it.

Every expectation over the batch is a weighted sum Σ_b w_b (·) with weights that sum to 1: uniform
1/B for a plain batch, the real/model mixing weights in COMBO (see :class:`imaginejax.algos.cql.RowWeights`).
"""

from __future__ import annotations

import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from imaginejax.algos.networks import EncodedMLP, NetConfig

LOG_STD_MIN = -20.0
LOG_STD_MAX = 2.0

# The CQL paper's networks: 3 hidden layers of 256 for actor and critics, after the language encoder.
SAC_NET = NetConfig(hidden=(256, 256, 256))


class TanhGaussianActor(nn.Module):
    """obs (..., S+E) -> (mean (..., A), log_std (..., A)) of the pre-tanh Gaussian.

    One :class:`~imaginejax.algos.networks.EncodedMLP` with 2A outputs; log_std is clipped to
    [LOG_STD_MIN, LOG_STD_MAX].
    """

    config: NetConfig
    action_dim: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = EncodedMLP(self.config, 2 * self.action_dim)(obs)
        mean, log_std = jnp.split(out, 2, axis=-1)
        return mean, jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)


def tanh_gaussian_log_prob(pre_tanh: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
    """log π(tanh u | o) for pre-tanh values u: pre_tanh (..., A), mean/log_std broadcastable -> (...,)."""
    z = (pre_tanh - mean) * jnp.exp(-log_std)
    gaussian = jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * math.log(2.0 * math.pi), axis=-1)
    log_det = jnp.sum(2.0 * (math.log(2.0) - pre_tanh - jax.nn.softplus(-2.0 * pre_tanh)), axis=-1)
    return gaussian - log_det


def sample_tanh_gaussian(key: jax.Array, mean: jax.Array, log_std: jax.Array,
                         num_samples: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Reparameterised samples a = tanh(μ + σ ε) and their log-densities.

    Args:
      key: PRNG key for ε.
      mean, log_std: (B, A) Gaussian parameters.
      num_samples: None draws one action per row; K draws K per row.

    Returns:
      actions (B, A) or (B, K, A) in (−1, 1), and log π (B,) or (B, K). Both are differentiable in
      mean and log_std (the caller stops gradients where they must not flow).
    """
    chex.assert_equal_shape([mean, log_std])
    if num_samples is not None:
        mean, log_std = mean[:, None, :], log_std[:, None, :]
        shape = (mean.shape[0], num_samples, mean.shape[-1])
    else:
        shape = mean.shape
    pre_tanh = mean + jnp.exp(log_std) * jax.random.normal(key, shape, mean.dtype)
    return jnp.tanh(pre_tanh), tanh_gaussian_log_prob(pre_tanh, mean, log_std)


def weighted_mean(x: jax.Array, weights: jax.Array | None) -> jax.Array:
    """Σ_b w_b x_b for weights (B,) summing to 1, or the plain mean when ``weights`` is None. x (B,) -> ()."""
    if weights is None:
        return x.mean()
    chex.assert_equal_shape([x, weights])
    return jnp.sum(weights * x)


def sac_actor_loss(q_pi: jax.Array, log_prob: jax.Array, temperature: jax.Array | float,
                   weights: jax.Array | None = None) -> jax.Array:
    """E_w[α · log π(ã|o) − Q(o, ã)]: q_pi (B,) = min_i Q_i(o, ã), log_prob (B,), α () -> ()."""
    chex.assert_equal_shape([q_pi, log_prob])
    return weighted_mean(temperature * log_prob - q_pi, weights)


def temperature_loss(log_temperature: jax.Array, log_prob: jax.Array, target_entropy: jax.Array | float,
                     weights: jax.Array | None = None) -> jax.Array:
    """−log α · E_w[log π + H̄] with no gradient through log π: log_temperature (), log_prob (B,) -> ()."""
    return -log_temperature * weighted_mean(jax.lax.stop_gradient(log_prob) + target_entropy, weights)
