"""COMBO (Yu et al. 2021): conservative offline model-based policy optimisation, continuous actions.

CQL on batches that mix dataset rows with rollouts of a learned model, pushing Q down on model states:

    min_Q  β (E_{s~d_M^π, a~ρ}[Q(s, a)] − E_{(s,a)~D}[Q(s, a)]) + ½ E_{d_f}[(Q(s, a) − y)²],   d_f = f D + (1 − f) d_M^π

Each update, inside the compiled call: (1) one step of the dynamics ensemble on the batch; (2) rollouts
of the current policy from ⌈rollout_batch / rollout_interval⌉ batch states into a circular model buffer
(invalid until ``model_warmup``); (3) B_m model rows from the buffer; (4) one CQL step on SAC
(:func:`~imaginejax.algos.cql.continuous_cql_step`) on the B + B_m rows with the weights of
:func:`~imaginejax.algos.rollouts.combo_weights` (push-down on model rows, push-up on dataset rows).
Design notes and the amortised rollout schedule: docs/algorithms/combo.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import DataStats, Datasets
from imaginejax.algos.cql import act_tanh_gaussian, continuous_cql_step, init_continuous_cql
from imaginejax.algos.dynamics import (DynamicsConfig, DynamicsState, dynamics_inputs, dynamics_step,
                                       dynamics_targets, holdout_mask, init_dynamics, make_ensemble,
                                       next_state_from_delta, sample_elite_step)
from imaginejax.algos.networks import SAC_NET, NetConfig, TanhGaussianActor, TwinCritic, sample_tanh_gaussian
from imaginejax.algos.rollouts import (ModelBuffer, TerminalFn, combo_weights, concat_rows, init_model_buffer,
                                       model_rollout, sample_model_rows, write_model_rows)
from imaginejax.data.types import Batch


@dataclasses.dataclass(frozen=True)
class ComboConfig:
    """Static COMBO settings: the ensemble, rollout_batch start states per rollout_interval updates,
    horizon h, windows kept in the buffer, model rows per update (None: the batch size B), K samples."""

    dynamics: DynamicsConfig = DynamicsConfig()
    rollout_batch: int = 50_000
    rollout_interval: int = 1000
    horizon: int = 1
    retain_rollouts: int = 5
    model_batch: int | None = None
    num_action_samples: int = 10

    def __post_init__(self):
        for name in ("rollout_batch", "rollout_interval", "horizon", "retain_rollouts", "num_action_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"ComboConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.model_batch is not None and self.model_batch < 1:
            raise ValueError(f"ComboConfig.model_batch must be None or >= 1, got {self.model_batch}")

    @property
    def starts_per_update(self) -> int:
        return -(-self.rollout_batch // self.rollout_interval)

    @property
    def rows_per_update(self) -> int:
        return self.starts_per_update * self.horizon

    @property
    def buffer_capacity(self) -> int:
        return self.retain_rollouts * self.rollout_interval * self.rows_per_update


@struct.dataclass
class ComboHyperparams:
    """Continuous CQL's traced hyperparameters (β in place of α) and the model's."""

    actor_lr: jax.Array
    critic_lr: jax.Array
    temperature_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array
    beta: jax.Array
    init_temperature: jax.Array
    target_entropy: jax.Array
    backup_entropy: jax.Array
    with_lagrange: jax.Array
    target_action_gap: jax.Array
    alpha_prime_lr: jax.Array
    real_fraction: jax.Array
    rho_data_weight: jax.Array
    model_lr: jax.Array
    model_weight_decay: jax.Array
    imaginary_model_weight: jax.Array
    model_warmup: jax.Array


def model_defaults() -> dict[str, jax.Array]:
    """β = 2.5, f = 0.5, ρ_D = 0, model lr 1e-3, weight decay 5e-5, imaginary rows weight 1, warm-up 5000."""
    f = jnp.float32
    return dict(beta=f(2.5), real_fraction=f(0.5), rho_data_weight=f(0.0), model_lr=f(1e-3),
                model_weight_decay=f(5e-5), imaginary_model_weight=f(1.0), model_warmup=jnp.int32(5000))


@struct.dataclass
class ComboState:
    """The agent's CQL state, the dynamics ensemble, the model buffer, the real data's statistics."""

    agent: Any
    dynamics: DynamicsState
    buffer: ModelBuffer
    stats: DataStats


def check_terminal_fn(terminal_fn: TerminalFn | None) -> None:
    """Refuses a ``terminal_fn`` that is neither None nor callable."""
    if terminal_fn is not None and not callable(terminal_fn):
        raise ValueError("terminal_fn must be None or a pure function (state, action, next_state, embedding) -> "
                         "(n,) bool; see success_terminal_fn")


def make_combo(spec: Spec, net: NetConfig = SAC_NET, config: ComboConfig = ComboConfig(),
               terminal_fn: TerminalFn | None = None) -> Algorithm:
    """Continuous COMBO for a continuous ``spec``: SAC networks ``net``, model settings ``config``, the
    environment's termination predicate for model rollouts (None: never terminal)."""
    if spec.discrete:
        raise ValueError("make_combo is continuous COMBO (spec.discrete must be False); for discrete actions "
                         "use imaginejax.algos.combo_discrete.make_combo_discrete")
    check_terminal_fn(terminal_fn)
    actor, critic = TanhGaussianActor(net, spec.action_dim), TwinCritic(net)
    ensemble = make_ensemble(config.dynamics, spec.state_dim)

    def default_hp(spec_: Spec) -> ComboHyperparams:
        f = jnp.float32
        return ComboHyperparams(actor_lr=f(1e-4), critic_lr=f(3e-4), temperature_lr=f(1e-4), gamma=f(0.99),
                                tau=f(0.005), init_temperature=f(1.0), target_entropy=f(-spec_.action_dim),
                                backup_entropy=f(0.0), with_lagrange=f(0.0), target_action_gap=f(10.0),
                                alpha_prime_lr=f(3e-4), **model_defaults())

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: ComboHyperparams) -> ComboState:
        agent_key, model_key = jax.random.split(key)
        return ComboState(agent=init_continuous_cql(actor, critic, agent_key, spec_, stats, hp),
                          dynamics=init_dynamics(ensemble, config.dynamics, model_key,
                                                 spec_.obs_dim + spec_.action_dim, hp.model_lr),
                          buffer=init_model_buffer(spec_, config.buffer_capacity), stats=stats)

    def update(state: ComboState, batch: Batch, key: jax.Array, hp: ComboHyperparams,
               data: Datasets) -> tuple[ComboState, dict[str, jax.Array]]:
        del data
        b, norm, agent = batch.reward.shape[0], state.stats, state.agent
        k_dyn, k_start, k_roll, k_model, k_agent = jax.random.split(key, 5)

        # 1. The dynamics on the batch (imaginary rows weighted by imaginary_model_weight).
        holdout = holdout_mask(batch.state, batch.action, batch.reward, batch.next_state,
                               config.dynamics.holdout_fraction)
        dyn, metrics = dynamics_step(ensemble, config.dynamics, state.dynamics,
                                     dynamics_inputs(batch.state, batch.embedding, batch.action, norm, None),
                                     dynamics_targets(batch.state, batch.next_state, batch.reward, norm),
                                     jnp.where(batch.imaginary, hp.imaginary_model_weight, 1.0), holdout, k_dyn,
                                     hp.model_weight_decay)

        # 2. Rollouts of the current policy from batch states.
        def policy(s, e, k):
            mean, log_std = actor.apply(agent.actor_params, agent.stats.observation(jnp.concatenate([s, e], -1)))
            return sample_tanh_gaussian(k, mean, log_std)[0]

        def model_step(s, e, a, k):
            y = sample_elite_step(ensemble, dyn.params, dyn.elites, dynamics_inputs(s, e, a, norm, None), k)
            return next_state_from_delta(s, y[:, :-1], norm), y[:, -1]

        start = jax.random.randint(k_start, (config.starts_per_update,), 0, b)
        rows, valid = model_rollout(k_roll, batch.state[start], batch.embedding[start], policy, model_step,
                                    terminal_fn, config.horizon)
        valid = valid & (agent.step >= hp.model_warmup)
        buffer = write_model_rows(state.buffer, rows, valid)

        # 3. Model rows; 4. CQL on dataset ⊕ model rows.
        model_rows, model_valid = sample_model_rows(buffer, k_model, config.model_batch or b)
        weights = combo_weights(b, model_valid, hp.real_fraction, hp.rho_data_weight)
        agent, agent_metrics = continuous_cql_step(actor, critic, agent, concat_rows(batch, model_rows), weights,
                                                   k_agent, hp, hp.beta, config.num_action_samples)

        v = valid.astype(jnp.float32)
        n_valid = jnp.maximum(jnp.sum(v), 1.0)
        metrics.update(agent_metrics)
        metrics.update({"model_fraction": jnp.sum(weights.td[b:]), "model_rows_valid": jnp.mean(model_valid),
                        "rollout_reward": jnp.sum(rows.reward * v) / n_valid,
                        "rollout_terminal": jnp.sum(rows.terminal * v) / n_valid,
                        "buffer_filled": buffer.filled.astype(jnp.float32) / buffer.valid.shape[0]})
        return ComboState(agent=agent, dynamics=dyn, buffer=buffer, stats=state.stats), metrics

    def act(state: ComboState, obs: jax.Array, key: jax.Array, hp: ComboHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) raw -> (B, A): tanh(μ), or a sample of π."""
        return act_tanh_gaussian(actor, state.agent.actor_params, state.stats.observation(obs), key, deterministic)

    return Algorithm(name="combo", init=init, update=update, act=act, default_hp=default_hp)
