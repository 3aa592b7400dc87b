"""A probabilistic dynamics ensemble (Chua et al. 2018; MBPO/MOPO/COMBO), trained inside the compiled update.

N Gaussian MLPs map x = s̃ ⊕ e(ℓ) ⊕ a (one-hot a if discrete) to a diagonal Gaussian over y = ((s' − s)/σ, r),
the log-variance soft-clamped between learned bounds. One Adam step per update on the batch:

    L = Σ_m Σ_i w_mi mean_d[(μ_mid − y_id)² e^{−log v_mid} + log v_mid] / Σ_i w_mi
        + c_b Σ_m Σ_d (max_lv_md − min_lv_md) + λ ½ Σ ‖W‖²,        w_mi ~ Poisson(1) (online bootstrap)

A transition is held out iff a hash of its bits falls below ``holdout_fraction``; a moving average of each
member's held-out MSE ranks them, and rollouts draw a random elite per row. Notes: docs/algorithms/combo.md.
"""

from __future__ import annotations

import dataclasses

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.common import DataStats, adam, adam_step

MAX_LOGVAR_INIT = 0.5
MIN_LOGVAR_INIT = -10.0


@dataclasses.dataclass(frozen=True)
class DynamicsConfig:
    """Static shapes and constants: N members, K elites, swish widths, held-out share, decay of the
    held-out average, c_b."""

    ensemble_size: int = 7
    num_elites: int = 5
    hidden: tuple[int, ...] = (200, 200, 200, 200)
    holdout_fraction: float = 0.2
    validation_decay: float = 0.99
    logvar_bound_coef: float = 0.01

    def __post_init__(self):
        if self.ensemble_size < 1:
            raise ValueError(f"DynamicsConfig.ensemble_size must be >= 1, got {self.ensemble_size}")
        if not 1 <= self.num_elites <= self.ensemble_size:
            raise ValueError(f"DynamicsConfig.num_elites must be in [1, ensemble_size={self.ensemble_size}], "
                             f"got {self.num_elites}")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise ValueError(f"DynamicsConfig.holdout_fraction must be in [0, 1), got {self.holdout_fraction}")
        if not 0.0 <= self.validation_decay < 1.0:
            raise ValueError(f"DynamicsConfig.validation_decay must be in [0, 1), got {self.validation_decay}")


def soft_clamp_logvar(raw: jax.Array, min_logvar: jax.Array, max_logvar: jax.Array) -> jax.Array:
    """Smoothly bounds a raw log-variance between ``min_logvar`` and ``max_logvar`` (broadcasting)."""
    logvar = max_logvar - jax.nn.softplus(max_logvar - raw)
    return min_logvar + jax.nn.softplus(logvar - min_logvar)


class GaussianMLP(nn.Module):
    """One member: x (..., D_in) -> (mean (..., D_out), log-variance (..., D_out)), learned bounds."""

    hidden: tuple[int, ...]
    out_dim: int

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        for i, width in enumerate(self.hidden):
            x = nn.swish(nn.Dense(width, name=f"hidden_{i}")(x))
        out = nn.Dense(2 * self.out_dim, name="out")(x)
        mean, raw = jnp.split(out, 2, axis=-1)
        max_logvar = self.param("max_logvar", nn.initializers.constant(MAX_LOGVAR_INIT), (self.out_dim,))
        min_logvar = self.param("min_logvar", nn.initializers.constant(MIN_LOGVAR_INIT), (self.out_dim,))
        return mean, soft_clamp_logvar(raw, min_logvar, max_logvar)


class GaussianEnsemble(nn.Module):
    """N independent :class:`GaussianMLP` members (stacked params, leading axis N).

    x (B, D_in), shared by all members -> mean, log-variance (N, B, D_out).
    """

    hidden: tuple[int, ...]
    out_dim: int
    size: int

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        members = nn.vmap(GaussianMLP, variable_axes={"params": 0}, split_rngs={"params": True},
                          in_axes=None, out_axes=0, axis_size=self.size)
        return members(self.hidden, self.out_dim, name="members")(x)


@struct.dataclass
class DynamicsState:
    """Ensemble parameters (leading axis N), Adam state, the un-normalised moving average (N,) of the
    held-out MSE and its weight sum (estimate = val_ema / val_norm), the elites (K,) int32."""

    params: dict
    opt_state: optax.OptState
    val_ema: jax.Array
    val_norm: jax.Array
    elites: jax.Array


def make_ensemble(config: DynamicsConfig, state_dim: int) -> GaussianEnsemble:
    """The ensemble module predicting (Δs̃, r): S + 1 outputs."""
    return GaussianEnsemble(config.hidden, state_dim + 1, config.ensemble_size)


def init_dynamics(ensemble: GaussianEnsemble, config: DynamicsConfig, key: jax.Array,
                  input_dim: int, learning_rate: jax.Array) -> DynamicsState:
    """Fresh parameters (independent per member), zero statistics, elites 0..K−1."""
    params = ensemble.init(key, jnp.zeros((1, input_dim), jnp.float32))
    return DynamicsState(params=params, opt_state=adam(learning_rate).init(params),
                         val_ema=jnp.zeros((config.ensemble_size,), jnp.float32),
                         val_norm=jnp.zeros((), jnp.float32),
                         elites=jnp.arange(config.num_elites, dtype=jnp.int32))


def dynamics_inputs(state: jax.Array, embedding: jax.Array, action: jax.Array, normalizer: DataStats,
                    num_actions: int | None) -> jax.Array:
    """x = s̃ ⊕ e ⊕ a: (B, S), (B, E), (B, A) float or (B,) int with ``num_actions`` n -> (B, S + E + A|n)."""
    if num_actions is not None:
        chex.assert_rank(action, 1)
        action = jax.nn.one_hot(action, num_actions, dtype=jnp.float32)
    chex.assert_rank([state, embedding, action], 2)
    return jnp.concatenate([normalizer(state), embedding, action.astype(jnp.float32)], axis=-1)


def dynamics_targets(state: jax.Array, next_state: jax.Array, reward: jax.Array,
                     normalizer: DataStats) -> jax.Array:
    """y = ((s' − s)/σ, r): state, next_state (B, S), reward (B,) -> (B, S + 1)."""
    chex.assert_equal_shape([state, next_state])
    return jnp.concatenate([(next_state - state) / normalizer.std, reward[:, None]], axis=-1)


def next_state_from_delta(state: jax.Array, delta: jax.Array, normalizer: DataStats) -> jax.Array:
    """s' = s + σ Δs̃ (the inverse of the target's state part): (B, S), (B, S) -> (B, S)."""
    return state + normalizer.std * delta


def gaussian_nll(mean: jax.Array, logvar: jax.Array, target: jax.Array, weights: jax.Array) -> jax.Array:
    """(N,) L_m = Σ_i w_mi mean_d[(μ − y)² e^{−log v} + log v] / max(Σ_i w_mi, 1e-8): mean, logvar (N, B, D),
    target (B, D), weights (N, B)."""
    chex.assert_equal_shape([mean, logvar])
    chex.assert_shape(weights, mean.shape[:2])
    per_row = jnp.mean(jnp.square(mean - target[None]) * jnp.exp(-logvar) + logvar, axis=-1)  # (N, B)
    return jnp.sum(weights * per_row, axis=-1) / jnp.maximum(jnp.sum(weights, axis=-1), 1e-8)


def _mix32(x: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser (a bijective avalanche mix) on uint32 arrays."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def transition_hash(state: jax.Array, action: jax.Array, reward: jax.Array, next_state: jax.Array) -> jax.Array:
    """A deterministic uint32 hash of each transition's bits: (B, S), (B,)|(B, A), (B,), (B, S) -> (B,)."""
    b = state.shape[0]
    fields = [state, action.reshape(b, -1).astype(jnp.float32), reward[:, None], next_state]
    bits = jnp.concatenate([jax.lax.bitcast_convert_type(f.astype(jnp.float32), jnp.uint32) for f in fields],
                           axis=-1)
    position = jnp.arange(bits.shape[-1], dtype=jnp.uint32) * jnp.uint32(0x9E3779B9)
    h = jnp.uint32(0x811C9DC5)
    # Order-dependent fold: h ← mix(h ⊕ mix(bits_j + position_j)), column by column.
    for j in range(bits.shape[-1]):
        h = _mix32(h ^ _mix32(bits[:, j] + position[j]))
    return h


def holdout_mask(state: jax.Array, action: jax.Array, reward: jax.Array, next_state: jax.Array,
                 fraction: float) -> jax.Array:
    """(B,) bool: True for the transitions of the validation split (a ``fraction`` of all, by hash)."""
    h = transition_hash(state, action, reward, next_state)
    uniform = (h >> 8).astype(jnp.float32) / float(1 << 24)  # the top 24 bits as a number in [0, 1)
    return uniform < fraction


def select_elites(validation_mse: jax.Array, num_elites: int) -> jax.Array:
    """Indices (K,) int32 of the ``num_elites`` members with the lowest validation MSE (ties: lower index)."""
    return jnp.argsort(validation_mse, stable=True)[:num_elites].astype(jnp.int32)


def dynamics_step(ensemble: GaussianEnsemble, config: DynamicsConfig, dyn: DynamicsState, inputs: jax.Array,
                  targets: jax.Array, train_weight: jax.Array, holdout: jax.Array, key: jax.Array,
                  weight_decay: jax.Array | float
                  ) -> tuple[DynamicsState, dict[str, jax.Array]]:
    """One Adam step on inputs (B, D_in) and targets (B, S + 1) with training weights (B,) (held-out rows
    excluded), then the held-out MSE averages and the elites. Metrics: model_nll, model_val_mse (elites),
    model_holdout (held-out rows)."""
    n = config.ensemble_size
    chex.assert_shape([train_weight, holdout], (inputs.shape[0],))
    bootstrap = jax.random.poisson(key, 1.0, (n, inputs.shape[0])).astype(jnp.float32)
    weights = bootstrap * (train_weight * (~holdout))[None]

    def loss_fn(params):
        mean, logvar = ensemble.apply(params, inputs)
        nll = gaussian_nll(mean, logvar, targets, weights)
        members = params["params"]["members"]
        bounds = jnp.sum(members["max_logvar"]) - jnp.sum(members["min_logvar"])
        decay = 0.5 * sum(jnp.sum(jnp.square(leaf)) for path, leaf in
                          jax.tree_util.tree_leaves_with_path(members) if path[-1].key == "kernel")
        loss = jnp.sum(nll) + config.logvar_bound_coef * bounds + weight_decay * decay
        return loss, (nll, mean)

    (_, (nll, mean)), grads = jax.value_and_grad(loss_fn, has_aux=True)(dyn.params)
    params, opt_state = adam_step(dyn.params, grads, dyn.opt_state)

    val = holdout.astype(jnp.float32)
    count = jnp.sum(val)
    mse = jnp.sum(jnp.mean(jnp.square(mean - targets[None]), axis=-1) * val[None], axis=-1) / jnp.maximum(count, 1.0)
    seen = count > 0
    d = config.validation_decay
    val_ema = jnp.where(seen, d * dyn.val_ema + (1.0 - d) * mse, dyn.val_ema)
    val_norm = jnp.where(seen, d * dyn.val_norm + (1.0 - d), dyn.val_norm)
    estimate = val_ema / jnp.maximum(val_norm, 1e-12)
    elites = select_elites(estimate, config.num_elites)
    new = DynamicsState(params=params, opt_state=opt_state, val_ema=val_ema, val_norm=val_norm, elites=elites)
    return new, {"model_nll": nll.mean(), "model_val_mse": estimate[elites].mean(), "model_holdout": count}


def sample_elite_step(ensemble: GaussianEnsemble, params: dict, elites: jax.Array, inputs: jax.Array,
                      key: jax.Array) -> jax.Array:
    """y ~ N(μ, v) of a random elite per row: inputs (B, D_in) -> (B, S + 1) sampled (Δs̃, r)."""
    k_member, k_noise = jax.random.split(key)
    b = inputs.shape[0]
    member = elites[jax.random.randint(k_member, (b,), 0, elites.shape[0])]
    mean, logvar = ensemble.apply(params, inputs)  # (N, B, D); all members, then one per row
    rows = jnp.arange(b)
    mean, logvar = mean[member, rows], logvar[member, rows]
    return mean + jnp.exp(0.5 * logvar) * jax.random.normal(k_noise, mean.shape, mean.dtype)

