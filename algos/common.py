"""Small pieces shared by the algorithms: the data they see, TD targets, target networks, Adam.

    y = r + γ (1 − d) V(s')                       d = 1 only on true terminations (a time limit bootstraps)
    θ' ← (1 − τ) θ' + τ θ   if k mod N = 0        (N = 1, τ = 0.005: soft update; N = 8000, τ = 1: DQN's copy)

Every function is pure and takes traced hyperparameters, so it runs unchanged under ``vmap`` over runs.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.data.types import Transitions

PyTree = Any


@struct.dataclass
class DataStats:
    """Statistics of the real dataset that ``init`` puts in the state: s̃ = (s − mean) / std.

    Imaginary states may be illegal, so the statistics are the real buffer's; std includes ε = 1e-3 (as
    TD3+BC). Only the state part of an observation is normalised, never the instruction embedding.
    """

    mean: jax.Array  # (S,)
    std: jax.Array  # (S,)

    @classmethod
    def identity(cls, state_dim: int) -> "DataStats":
        """μ = 0, σ = 1: no normalisation."""
        return cls(mean=jnp.zeros((state_dim,), jnp.float32), std=jnp.ones((state_dim,), jnp.float32))

    @classmethod
    def from_transitions(cls, real: Transitions, eps: float = 1e-3) -> "DataStats":
        """μ, σ + ε of the states (K, S) of the real buffer."""
        states = jnp.asarray(real.state, jnp.float32)
        return cls(mean=states.mean(0), std=states.std(0) + eps)

    def __call__(self, state: jax.Array) -> jax.Array:
        """(..., S) -> (..., S) normalised states."""
        return (state - self.mean) / self.std

    def observation(self, obs: jax.Array) -> jax.Array:
        """(..., S+E) -> (..., S+E): the first S columns normalised, the embedding as is."""
        s = self.mean.shape[-1]
        return jnp.concatenate([self(obs[..., :s]), obs[..., s:]], axis=-1)


@struct.dataclass
class Datasets:
    """The interval's datasets (arguments of the engine's compiled call, shared by all vmapped runs).

    imag_rows (2,) int32 (start, count) are the run's own rows of ``imag``; ``imag`` is a one-row
    placeholder when there is no imaginary data.
    """

    real: Transitions
    imag: Transitions
    imag_rows: jax.Array

    @classmethod
    def of(cls, real: Transitions, imag: Transitions, imag_rows: jax.Array | None = None) -> "Datasets":
        """``imag_rows`` None: every row of ``imag``."""
        if imag_rows is None:
            imag_rows = jnp.array([0, imag.state.shape[0]], jnp.int32)
        return cls(real=real, imag=imag, imag_rows=jnp.asarray(imag_rows, jnp.int32))


@struct.dataclass
class RowWeights:
    """Per-row weights (N,) of the expectations of a CQL-style loss, each summing to 1 (or all 0): the TD
    loss, the push-down (logsumexp) and push-up (data Q) terms, the actor and temperature losses."""

    td: jax.Array
    push_down: jax.Array
    push_up: jax.Array
    actor: jax.Array

    @classmethod
    def uniform(cls, num_rows: int) -> "RowWeights":
        """1/N on every row for every expectation: plain minibatch means."""
        w = jnp.full((num_rows,), 1.0 / num_rows, jnp.float32)
        return cls(td=w, push_down=w, push_up=w, actor=w)


def td_target(reward: jax.Array, terminal: jax.Array, next_value: jax.Array,
              gamma: jax.Array | float) -> jax.Array:
    """y = r + γ (1 − d) V(s'): reward, terminal, next_value (B,) -> (B,)."""
    chex.assert_equal_shape([reward, terminal, next_value])
    return reward + gamma * (1.0 - terminal) * next_value


def twin_critic_loss(q: jax.Array, target: jax.Array) -> jax.Array:
    """Σ_i mean_B (Q_i − y)²: q (2, B) at the data actions, target (B,) -> ()."""
    chex.assert_shape(q, (2,) + target.shape)
    return jnp.square(q - target[None]).mean(axis=-1).sum()


def huber(x: jax.Array, delta: float = 1.0) -> jax.Array:
    """½x² for |x| ≤ δ, else δ(|x| − ½δ), elementwise."""
    abs_x = jnp.abs(x)
    quadratic = jnp.minimum(abs_x, delta)
    return 0.5 * jnp.square(quadratic) + delta * (abs_x - quadratic)


def take_action_values(q: jax.Array, action: jax.Array) -> jax.Array:
    """Q(o, a) from all action values: q (B, n), action (B,) int -> (B,)."""
    return jnp.take_along_axis(q, action[:, None].astype(jnp.int32), axis=-1)[:, 0]


def masked_step(do: jax.Array, new: PyTree, old: PyTree) -> PyTree:
    """``new`` where ``do`` else ``old``, leaf by leaf: a skipped step leaves the state bit for bit."""
    return jax.tree.map(lambda n, o: jnp.where(do, n, o), new, old)


def polyak_update(target: PyTree, online: PyTree, tau: jax.Array | float) -> PyTree:
    """θ' ← (1 − τ) θ' + τ θ, leaf by leaf."""
    return jax.tree.map(lambda t, o: (1.0 - tau) * t + tau * o, target, online)


def periodic_polyak_update(target: PyTree, online: PyTree, count: jax.Array, interval: jax.Array | int,
                           tau: jax.Array | float) -> PyTree:
    """:func:`polyak_update` on the ``count``-th update (1 after the first) when count mod N = 0 (N ≥ 1)."""
    due = (count % jnp.maximum(jnp.asarray(interval, jnp.int32), 1)) == 0
    return masked_step(due, polyak_update(target, online, tau), target)


def adam(learning_rate: jax.Array | float) -> optax.GradientTransformation:
    """Adam whose learning rate lives in its state (written at ``init`` from ``hp``, so it vmaps)."""
    # β1, β2, ε stay Python constants: traced, their f32 arithmetic would differ in the last bit.
    static = ("b1", "b2", "eps", "eps_root")
    return optax.inject_hyperparams(optax.adam, static_args=static)(learning_rate=learning_rate)


def adam_step(params: PyTree, grads: PyTree, opt_state: optax.OptState) -> tuple[PyTree, optax.OptState]:
    """θ ← θ − η · Adam(g), with the η in ``opt_state``."""
    updates, opt_state = adam(0.0).update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
