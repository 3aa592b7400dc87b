"""Pieces shared by the value-based algorithms (CQL, BCQ, TD3+BC, and later PRDC, COMBO).

Every function is pure and works on traced hyperparameters, so it runs unchanged under ``vmap`` over
runs (seeds × hyperparameters):

* one-step TD target, with the discount taken from ``hp`` and the bootstrap cut on *true* terminations
  only (a time-limit truncation still bootstraps; the reference's effective γ = 1 is not reproduced):

      y = r + γ · (1 − d) · V(s'),                   d = 1 only if the episode truly ended at s'

* Huber loss (δ = 1) used by the discrete Q-learners:  h(x) = ½x² if |x| ≤ 1, else |x| − ½;
  the twin-critic squared error Σ_i E[(Q_i(s, a) − y)²] of TD3-style learners;

* target networks updated by one *periodic Polyak* rule, counting updates k = 1, 2, …:

      θ' ← (1 − τ) θ' + τ θ    if k mod N = 0,    else θ' unchanged

  N = 1, τ = 0.005 is the usual soft update; N = 8000, τ = 1 the DQN hard copy. N and τ are traced
  (``jnp.where`` on the step counter, no Python branching), so both vmap;

* Adam with a traced learning rate: ``optax.scale_by_adam`` gives the direction u, and the step
  θ ← θ − η·u is applied by hand so that η lives in ``hp`` (as in :mod:`imaginejax.algos.bc`);

* the state normaliser s̃ = (s − μ) / σ with μ, σ from the *real* buffer (σ includes ε = 1e-3, as in
  TD3+BC). Only the state part of the observation is normalised; the instruction embedding is not.
  It is carried in ``hp`` (see :class:`StateNormalizer` for why);

* twin critics: Q_{1,2}(s, a) = MLP_i(enc_i(s ⊕ e) ⊕ a) for continuous actions, Q_{1,2}(s, ·) =
  MLP_i(enc_i(s ⊕ e)) ∈ R^n for n discrete ones: two independent networks, each with its own language
  encoder, evaluated in one call (``nn.vmap`` over stacked params).
"""

from __future__ import annotations

from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.networks import EncodedMLP, LanguageEncoder, MLP, NetConfig
from imaginejax.data.types import Transitions

PyTree = Any




# ---------------------------------------------------------------------------------------------------
# Targets and losses
# ---------------------------------------------------------------------------------------------------
def td_target(reward: jax.Array, terminal: jax.Array, next_value: jax.Array,
              gamma: jax.Array | float) -> jax.Array:
    """One-step TD target y = r + γ · (1 − terminal) · V(s').

    Args:
      reward: (B,) rewards r.
      terminal: (B,) float 1.0 on true terminations only (never a time limit); 0.0 bootstraps.
      next_value: (B,) value of the next state V(s') (already stop-gradient'ed by the caller).
      gamma: () discount γ, traced (from ``hp``).

    Returns:
      (B,) targets.
    """
    chex.assert_equal_shape([reward, terminal, next_value])
    return reward + gamma * (1.0 - terminal) * next_value


def twin_critic_loss(q: jax.Array, target: jax.Array) -> jax.Array:
    """Σ_i mean_B (Q_i − y)² for twin critics: q (2, B) values at the data actions, target (B,) -> ()."""
    chex.assert_shape(q, (2,) + target.shape)
    return jnp.square(q - target[None]).mean(axis=-1).sum()


def huber(x: jax.Array, delta: float = 1.0) -> jax.Array:
    """Elementwise Huber loss: ½x² for |x| ≤ δ, else δ(|x| − ½δ). Same shape as ``x``."""
    abs_x = jnp.abs(x)
    quadratic = jnp.minimum(abs_x, delta)
    return 0.5 * jnp.square(quadratic) + delta * (abs_x - quadratic)


# ---------------------------------------------------------------------------------------------------
# Target networks
# ---------------------------------------------------------------------------------------------------
def polyak_update(target: PyTree, online: PyTree, tau: jax.Array | float) -> PyTree:
    """Soft update θ' ← (1 − τ) θ' + τ θ, leaf by leaf (τ = 1 copies ``online`` exactly)."""
    return jax.tree.map(lambda t, o: (1.0 - tau) * t + tau * o, target, online)


def periodic_polyak_update(target: PyTree, online: PyTree, count: jax.Array, interval: jax.Array | int,
                           tau: jax.Array | float) -> PyTree:
    """Polyak update applied only on every ``interval``-th update (vmappable: ``jnp.where``).

    Args:
      target: target parameters θ'.
      online: online parameters θ (same structure).
      count: () int, number of updates done *including* the current one (1 after the first update).
      interval: () int N >= 1 (traced); values below 1 are treated as 1.
      tau: () float τ in [0, 1] (traced); τ = 1 with N = 8000 is DQN's hard copy, N = 1 with τ = 0.005
        the per-step soft update.

    Returns:
      θ' after the (possibly skipped) update.
    """
    due = (count % jnp.maximum(jnp.asarray(interval, jnp.int32), 1)) == 0
    moved = polyak_update(target, online, tau)
    return jax.tree.map(lambda new, old: jnp.where(due, new, old), moved, target)


# ---------------------------------------------------------------------------------------------------
# Optimisation
# ---------------------------------------------------------------------------------------------------
def adam(learning_rate: jax.Array | float) -> optax.GradientTransformation:
    """Adam whose learning rate η is a number in its state (``opt_state.hyperparams``), written at
    ``init`` from ``hp``: traced, so it vmaps over runs like a seed."""
    # β1, β2, ε stay Python constants (static): traced, their f32 arithmetic would differ in the last bit.
    return optax.inject_hyperparams(optax.adam, static_args=("b1", "b2", "eps", "eps_root"))(learning_rate=learning_rate)


def adam_step(params: PyTree, grads: PyTree, opt_state: optax.OptState) -> tuple[PyTree, optax.OptState]:
    """θ ← θ − η · Adam(g) with the η stored in ``opt_state`` (see :func:`adam`)."""
    updates, opt_state = adam(0.0).update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def masked_step(do: jax.Array, new: PyTree, old: PyTree) -> PyTree:
    """``new`` where ``do`` else ``old``, leaf by leaf (a vmappable stand-in for ``lax.cond``).

    Under ``vmap`` with a per-run predicate, ``lax.cond`` lowers to this select anyway, so both
    branches are computed either way; the select makes it explicit and keeps skipped steps bit-exact.
    """
    return jax.tree.map(lambda n, o: jnp.where(do, n, o), new, old)


# ---------------------------------------------------------------------------------------------------
# State normalisation
# ---------------------------------------------------------------------------------------------------
@struct.dataclass
class DataStats:
    """Statistics of the real dataset that an algorithm's ``init`` writes into its state.

    The state normaliser s̃ = (s − mean) / std (σ includes ε = 1e-3, as TD3+BC): only the state part of an
    observation is normalised, never the instruction embedding. Imaginary states may be illegal, so the
    statistics come from the real buffer alone.

    Attributes:
      mean: (S,) float32 μ.
      std: (S,) float32 σ + ε.
    """

    mean: jax.Array
    std: jax.Array

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
        """(..., S+E) -> (..., S+E): normalises the first S columns, leaves the embedding as is."""
        s = self.mean.shape[-1]
        return jnp.concatenate([self(obs[..., :s]), obs[..., s:]], axis=-1)


@struct.dataclass
class Datasets:
    """The interval's training data, for updates that read more than their batch (PRDC's search).

    They are arguments of the engine's compiled call, shared (unbatched) by all vmapped runs.

    Attributes:
      real: the real transitions.
      imag: the imaginary transitions (a one-row placeholder when there are none).
      imag_rows: (2,) int32 (start, count): the run's own rows of ``imag``.
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


# ---------------------------------------------------------------------------------------------------
# Continuous critics
# ---------------------------------------------------------------------------------------------------
class EncodedCritic(nn.Module):
    """Q(s, a) = MLP(enc(s ⊕ e) ⊕ a): obs (B, S+E) with action (B, A) -> (B,), or K actions per state,
    action (B, K, A) -> (B, K).

    The language encoder sees state ⊕ instruction embedding only (BENCHMARK.md §4); the action joins
    the ReLU head. With K actions per state the state is encoded once and only the action-dependent
    part is evaluated per action (:class:`~imaginejax.algos.networks.MLP`'s joined input): the same
    values as tiling the observation K times, at a fraction of the cost.
    """

    config: NetConfig

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        h = LanguageEncoder(self.config.encoder_width, self.config.encoder_layers)(obs)
        return MLP(self.config.hidden, 1)(h, action)[..., 0]


class TwinCritic(nn.Module):
    """Two independent :class:`EncodedCritic` networks (stacked params, leading axis 2).

    obs (B, S+E), action (B, A) -> (2, B): row i is Q_i(s, a); action (B, K, A) -> (2, B, K).
    """

    config: NetConfig

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        twin = nn.vmap(EncodedCritic, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=None, out_axes=0, axis_size=2)
        return twin(self.config, name="critics")(obs, action)


class TwinDiscreteCritic(nn.Module):
    """Two independent Q-networks over n discrete actions (stacked params, leading axis 2).

    obs (B, S+E) -> (2, B, n): entry [i, b, a] is Q_i(o_b, a); each network is an
    :class:`~imaginejax.algos.networks.EncodedMLP` with its own language encoder.
    """

    config: NetConfig
    num_actions: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        twin = nn.vmap(EncodedMLP, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=None, out_axes=0, axis_size=2)
        return twin(self.config, self.num_actions, name="critics")(obs)


def first_critic(critic_params: dict) -> dict:
    """The parameters of Q_θ1 alone from the twin's stacked ones (leading axis 2 dropped): variables of
    one :class:`EncodedCritic` (from a :class:`TwinCritic`) or one EncodedMLP (from a :class:`TwinDiscreteCritic`)."""
    return {"params": jax.tree.map(lambda x: x[0], critic_params["params"]["critics"])}


def first_critic_apply(critic: TwinCritic | TwinDiscreteCritic, critic_params: dict, *inputs: jax.Array) -> jax.Array:
    """Q_θ1 alone, for losses that use only the first critic (TD3+BC's actor, BCQ's perturbation and act).

    Evaluating the twin and keeping row 0 would compute Q_θ2 for nothing (and its backward pass); this
    runs one network, half the work, with the same values.

    Args:
      critic: the twin module; critic_params: its stacked parameters.
      inputs: the twin's inputs: (obs (B, S+E), action (B, A) or (B, K, A)) for :class:`TwinCritic`,
        (obs (B, S+E),) for :class:`TwinDiscreteCritic`.

    Returns:
      The twin's output without its leading axis: (B,) / (B, K), or (B, n) for discrete critics.
    """
    if isinstance(critic, TwinCritic):
        single: nn.Module = EncodedCritic(critic.config)
    elif isinstance(critic, TwinDiscreteCritic):
        single = EncodedMLP(critic.config, critic.num_actions)
    else:
        raise ValueError(f"first_critic_apply needs a TwinCritic or TwinDiscreteCritic, got {type(critic).__name__}")
    return single.apply(first_critic(critic_params), *inputs)
