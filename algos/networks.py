"""Networks shared by all algorithms (flax.linen).

Every network starts with the reference's language encoder, tanh layers over state ⊕ instruction
embedding (BENCHMARK.md §4: width 256, 64 for BabyAI), followed by a ReLU MLP head. An action, when the
network takes one, joins after the encoder.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class NetConfig:
    """Static network shapes (changing them recompiles): width and depth of the tanh encoder, ReLU widths."""

    encoder_width: int = 256
    encoder_layers: int = 2
    hidden: tuple[int, ...] = (256, 256)


# The CQL paper's networks: 3 hidden layers of 256 for actor and critics, after the language encoder.
SAC_NET = NetConfig(hidden=(256, 256, 256))


class LanguageEncoder(nn.Module):
    """Tanh layers over state ⊕ instruction embedding: (..., S+E) -> (..., width)."""

    width: int
    layers: int = 2

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs
        for i in range(self.layers):
            x = jnp.tanh(nn.Dense(self.width, name=f"encoder_{i}")(x))
        return x


class JoinedDense(nn.Module):
    """``nn.Dense(features)`` of x ⊕ p[k] for K inputs p[k] per x: x (..., D), p (..., K, P) -> (..., K, features).

    The parameters are those of ``nn.Dense`` on a (D + P)-wide input; y_k = x W_x + b + p[k] W_p computes
    the product with the shared x once instead of K times.
    """

    features: int

    @nn.compact
    def __call__(self, x: jax.Array, per_sample: jax.Array) -> jax.Array:
        d = x.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (d + per_sample.shape[-1], self.features),
                            jnp.float32)
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
        shared = x @ kernel[:d] + bias
        return per_sample @ kernel[d:] + shared[..., None, :]


class MLP(nn.Module):
    """ReLU MLP with a linear output, ``mlp(x, joined)`` the MLP of x ⊕ joined: x (..., D) -> (..., out).

    joined (..., P) is concatenated; joined (..., K, P) gives K rows per x, (..., K, out), with the first
    layer a :class:`JoinedDense` (same parameters either way).
    """

    hidden: Sequence[int]
    out: int

    @nn.compact
    def __call__(self, x: jax.Array, joined: jax.Array | None = None) -> jax.Array:
        per_sample = joined is not None and joined.ndim == x.ndim + 1
        if joined is not None:
            lead = joined.shape[:-2] if per_sample else joined.shape[:-1]
            if joined.ndim not in (x.ndim, x.ndim + 1) or lead != x.shape[:-1]:
                raise ValueError(f"MLP joined input of shape {joined.shape} does not fit x of shape {x.shape}: "
                                 f"pass joined with the leading dims {x.shape[:-1]} of x, then either one feature "
                                 "axis (..., P) or a sample axis and a feature axis (..., K, P)")
            if not per_sample:
                x = jnp.concatenate([x, joined], axis=-1)
        widths = [(f"hidden_{i}", width) for i, width in enumerate(self.hidden)] + [("out", self.out)]
        for i, (name, width) in enumerate(widths):
            x = JoinedDense(width, name=name)(x, joined) if i == 0 and per_sample else nn.Dense(width, name=name)(x)
            if name != "out":
                x = nn.relu(x)
        return x


class EncodedMLP(nn.Module):
    """Language encoder then MLP head: obs (..., S+E) -> (..., out); ``squash`` applies tanh (actions in [-1, 1])."""

    config: NetConfig
    out: int
    squash: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        h = LanguageEncoder(self.config.encoder_width, self.config.encoder_layers)(obs)
        y = MLP(self.config.hidden, self.out)(h)
        return jnp.tanh(y) if self.squash else y


class EncodedCritic(nn.Module):
    """Q(o, a) = MLP(enc(o) ⊕ a): action (B, A) -> (B,), or K actions per state (B, K, A) -> (B, K)."""

    config: NetConfig

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        h = LanguageEncoder(self.config.encoder_width, self.config.encoder_layers)(obs)
        return MLP(self.config.hidden, 1)(h, action)[..., 0]


class TwinCritic(nn.Module):
    """Two independent :class:`EncodedCritic` (stacked params, leading axis 2): -> (2, B) or (2, B, K)."""

    config: NetConfig

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        twin = nn.vmap(EncodedCritic, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=None, out_axes=0, axis_size=2)
        return twin(self.config, name="critics")(obs, action)


class TwinDiscreteCritic(nn.Module):
    """Two independent Q-networks over n actions (:class:`EncodedMLP`, stacked): obs (B, S+E) -> (2, B, n)."""

    config: NetConfig
    num_actions: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        twin = nn.vmap(EncodedMLP, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=None, out_axes=0, axis_size=2)
        return twin(self.config, self.num_actions, name="critics")(obs)


def first_critic_apply(critic: TwinCritic | TwinDiscreteCritic, critic_params: dict, *inputs: jax.Array) -> jax.Array:
    """Q_θ1 alone (half the twin's work): the twin's output without its leading axis."""
    if isinstance(critic, TwinCritic):
        single: nn.Module = EncodedCritic(critic.config)
    elif isinstance(critic, TwinDiscreteCritic):
        single = EncodedMLP(critic.config, critic.num_actions)
    else:
        raise ValueError(f"first_critic_apply needs a TwinCritic or TwinDiscreteCritic, got {type(critic).__name__}")
    return single.apply({"params": jax.tree.map(lambda x: x[0], critic_params["params"]["critics"])}, *inputs)


# ---------------------------------------------------------------------------------------------------
# Tanh-squashed Gaussian actor (SAC)
# ---------------------------------------------------------------------------------------------------
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


class TanhGaussianActor(nn.Module):
    """obs (..., S+E) -> (μ, log σ) (..., A) of the pre-tanh Gaussian, log σ clipped to [−20, 2]."""

    config: NetConfig
    action_dim: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = EncodedMLP(self.config, 2 * self.action_dim)(obs)
        mean, log_std = jnp.split(out, 2, axis=-1)
        return mean, jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)


def tanh_gaussian_log_prob(pre_tanh: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
    """log π(tanh u) = Σ_j log N(u_j; μ_j, σ_j²) − log(1 − tanh² u_j): (..., A) -> (...,).

    log(1 − tanh² u) = 2 (log 2 − u − softplus(−2u)) does not overflow.
    """
    z = (pre_tanh - mean) * jnp.exp(-log_std)
    gaussian = jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * math.log(2.0 * math.pi), axis=-1)
    log_det = jnp.sum(2.0 * (math.log(2.0) - pre_tanh - jax.nn.softplus(-2.0 * pre_tanh)), axis=-1)
    return gaussian - log_det


def sample_tanh_gaussian(key: jax.Array, mean: jax.Array, log_std: jax.Array,
                         num_samples: int | None = None) -> tuple[jax.Array, jax.Array]:
    """a = tanh(μ + σ ε) and log π(a): mean, log_std (B, A) -> (B, A), (B,); or (B, K, A), (B, K) for K samples."""
    chex.assert_equal_shape([mean, log_std])
    if num_samples is not None:
        mean, log_std = mean[:, None, :], log_std[:, None, :]
        shape = (mean.shape[0], num_samples, mean.shape[-1])
    else:
        shape = mean.shape
    pre_tanh = mean + jnp.exp(log_std) * jax.random.normal(key, shape, mean.dtype)
    return jnp.tanh(pre_tanh), tanh_gaussian_log_prob(pre_tanh, mean, log_std)
