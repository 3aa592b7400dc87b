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


class MLP(nn.Module):
    """ReLU MLP with a linear output: (..., D) -> (..., out)."""

    hidden: Sequence[int]
    out: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for i, width in enumerate(self.hidden):
            x = nn.relu(nn.Dense(width, name=f"hidden_{i}")(x))
        return nn.Dense(self.out, name="out")(x)


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
