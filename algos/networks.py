"""Networks shared by all algorithms (flax.linen).

Every network starts with the reference's language encoder: two tanh layers over the policy input
state ⊕ instruction embedding (BENCHMARK.md §4: width 256, 64 for BabyAI), followed by a ReLU MLP head.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class NetConfig:
    """Static network shapes (changing them recompiles).

    Attributes:
      encoder_width: width of each of the two tanh language-encoder layers.
      encoder_layers: number of tanh layers in front of every network.
      hidden: widths of the ReLU head after the encoder.
    """

    encoder_width: int = 256
    encoder_layers: int = 2
    hidden: tuple[int, ...] = (256, 256)


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
    """The dense layer of ``nn.Dense(features)`` applied to x ⊕ p[k] for K per-sample inputs p[k]:
    x (..., D), p (..., K, P) -> (..., K, features).

    Parameters are those of ``nn.Dense(features)`` on a (D + P)-wide input (kernel (D + P, features)
    with Dense's initialiser, bias (features,)), so a module may use either under the same name. The
    kernel is split into its rows for x and for p: y_k = x W_x + b + p[k] W_p, so the product with the
    shared x is computed once instead of K times (equal to the concatenated product up to float
    rounding).
    """

    features: int

    @nn.compact
    def __call__(self, x: jax.Array, per_sample: jax.Array) -> jax.Array:
        d = x.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (d + per_sample.shape[-1], self.features),
                            jnp.float32)
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
        shared = x @ kernel[:d] + bias  # (..., features): once per x
        return per_sample @ kernel[d:] + shared[..., None, :]


class MLP(nn.Module):
    """ReLU MLP with a linear output: (..., D) -> (..., out), optionally on a joined input.

    ``mlp(x, joined)`` is the MLP of x ⊕ joined:

    * joined (..., P) (same rank as x): concatenated, output (..., out);
    * joined (..., K, P) (one rank more): K inputs per x, output (..., K, out), row k the MLP of
      x ⊕ joined[..., k, :]. x is not tiled: the first layer is a :class:`JoinedDense` (x's product
      computed once), the layers after it see K rows per x as they must. Same parameters either way.
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
    """Language encoder followed by an MLP head: obs (..., S+E) -> (..., out).

    Used as a discrete policy (``out`` = number of actions, logits), a deterministic continuous policy
    (``squash=True``: tanh to [-1, 1]) or a Q-network.
    """

    config: NetConfig
    out: int
    squash: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        h = LanguageEncoder(self.config.encoder_width, self.config.encoder_layers)(obs)
        y = MLP(self.config.hidden, self.out)(h)
        return jnp.tanh(y) if self.squash else y
