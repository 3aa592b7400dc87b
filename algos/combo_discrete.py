"""Discrete COMBO: COMBO (Yu et al. 2021) on discrete CQL, our extension to discrete actions.

With the entropy-regularised ρ of CQL(H), max_ρ E_ρ[Q(s, a)] + H(ρ) = log Σ_a exp Q(s, a) is exact over n
actions (Gibbs: ρ* = softmax Q), so the regulariser needs no sampling:

    R(θ) = E_{s~d_M^π}[log Σ_a exp Q_θ(s, a)] − E_{(s,a)~D}[Q_θ(s, a)]

The rollout policy is ρ* itself (a ~ softmax Q(s, ·)); the dynamics see the one-hot action; the critic is
discrete CQL's (:func:`~imaginejax.algos.cql_discrete.discrete_cql_step`). Steps, buffer and weights as
continuous COMBO (:mod:`imaginejax.algos.combo`). Derivation: docs/algorithms/combo.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.combo import ComboConfig, ComboState, check_terminal_fn, model_defaults
from imaginejax.algos.common import DataStats, Datasets
from imaginejax.algos.cql_discrete import act_discrete_q, discrete_cql_step, init_discrete_q
from imaginejax.algos.dynamics import (dynamics_inputs, dynamics_step, dynamics_targets, holdout_mask, init_dynamics,
                                       make_ensemble, next_state_from_delta, sample_elite_step)
from imaginejax.algos.networks import EncodedMLP, NetConfig
from imaginejax.algos.rollouts import (TerminalFn, combo_weights, concat_rows, init_model_buffer, model_rollout,
                                       sample_model_rows, write_model_rows)
from imaginejax.data.types import Batch


@struct.dataclass
class DiscreteComboHyperparams:
    """Discrete CQL's traced hyperparameters (β in place of α) and the model's."""

    learning_rate: jax.Array
    gamma: jax.Array
    target_update_interval: jax.Array
    target_tau: jax.Array
    beta: jax.Array
    real_fraction: jax.Array
    rho_data_weight: jax.Array
    model_lr: jax.Array
    model_weight_decay: jax.Array
    imaginary_model_weight: jax.Array
    model_warmup: jax.Array


def make_combo_discrete(spec: Spec, net: NetConfig = NetConfig(), config: ComboConfig = ComboConfig(),
                        terminal_fn: TerminalFn | None = None, double_q: bool = True) -> Algorithm:
    """Discrete COMBO for a discrete ``spec``: Q-network ``net``, model settings ``config`` (K unused),
    termination predicate for model rollouts (None: never terminal), double-DQN target or plain max."""
    if not spec.discrete:
        raise ValueError("make_combo_discrete needs a discrete action space (spec.discrete=True); for continuous "
                         "actions use imaginejax.algos.combo.make_combo")
    check_terminal_fn(terminal_fn)
    model = EncodedMLP(net, out=spec.action_dim)
    ensemble = make_ensemble(config.dynamics, spec.state_dim)
    n = spec.action_dim

    def default_hp(spec_: Spec) -> DiscreteComboHyperparams:
        f = jnp.float32
        return DiscreteComboHyperparams(learning_rate=f(6.25e-5), gamma=f(0.99), target_update_interval=jnp.int32(8000),
                                        target_tau=f(1.0), **model_defaults())

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: DiscreteComboHyperparams) -> ComboState:
        agent_key, model_key = jax.random.split(key)
        return ComboState(agent=init_discrete_q(model, agent_key, spec_, hp.learning_rate),
                          dynamics=init_dynamics(ensemble, config.dynamics, model_key,
                                                 spec_.obs_dim + spec_.action_dim, hp.model_lr),
                          buffer=init_model_buffer(spec_, config.buffer_capacity), stats=stats)

    def update(state: ComboState, batch: Batch, key: jax.Array, hp: DiscreteComboHyperparams,
               data: Datasets) -> tuple[ComboState, dict[str, jax.Array]]:
        del data
        b, norm, agent = batch.reward.shape[0], state.stats, state.agent
        k_dyn, k_start, k_roll, k_model, _ = jax.random.split(key, 5)  # the fifth: continuous COMBO's agent key

        # 1. The dynamics on the batch.
        holdout = holdout_mask(batch.state, batch.action, batch.reward, batch.next_state,
                               config.dynamics.holdout_fraction)
        dyn, metrics = dynamics_step(ensemble, config.dynamics, state.dynamics,
                                     dynamics_inputs(batch.state, batch.embedding, batch.action, norm, n),
                                     dynamics_targets(batch.state, batch.next_state, batch.reward, norm),
                                     jnp.where(batch.imaginary, hp.imaginary_model_weight, 1.0), holdout, k_dyn,
                                     hp.model_weight_decay)

        # 2. Rollouts of the Boltzmann policy softmax Q(s, ·) from batch states.
        def policy(s, e, k):
            return act_discrete_q(model, agent.params, jnp.concatenate([s, e], axis=-1), k, deterministic=False)

        def model_step(s, e, a, k):
            y = sample_elite_step(ensemble, dyn.params, dyn.elites, dynamics_inputs(s, e, a, norm, n), k)
            return next_state_from_delta(s, y[:, :-1], norm), y[:, -1]

        start = jax.random.randint(k_start, (config.starts_per_update,), 0, b)
        rows, valid = model_rollout(k_roll, batch.state[start], batch.embedding[start], policy, model_step,
                                    terminal_fn, config.horizon)
        valid = valid & (agent.step >= hp.model_warmup)
        buffer = write_model_rows(state.buffer, rows, valid)

        # 3. Model rows; 4. discrete CQL on dataset ⊕ model rows.
        model_rows, model_valid = sample_model_rows(buffer, k_model, config.model_batch or b)
        weights = combo_weights(b, model_valid, hp.real_fraction, hp.rho_data_weight)
        agent, agent_metrics = discrete_cql_step(model, agent, concat_rows(batch, model_rows), weights, hp, hp.beta,
                                                 double_q)

        v = valid.astype(jnp.float32)
        n_valid = jnp.maximum(jnp.sum(v), 1.0)
        metrics.update(agent_metrics)
        metrics.update({"model_fraction": jnp.sum(weights.td[b:]), "model_rows_valid": jnp.mean(model_valid),
                        "rollout_reward": jnp.sum(rows.reward * v) / n_valid,
                        "rollout_terminal": jnp.sum(rows.terminal * v) / n_valid,
                        "buffer_filled": buffer.filled.astype(jnp.float32) / buffer.valid.shape[0]})
        return ComboState(agent=agent, dynamics=dyn, buffer=buffer, stats=state.stats), metrics

    def act(state: ComboState, obs: jax.Array, key: jax.Array, hp: DiscreteComboHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) -> (B,) int32: argmax_a Q(o, a), or a ~ softmax(Q(o, ·))."""
        return act_discrete_q(model, state.agent.params, obs, key, deterministic)

    return Algorithm(name="combo_discrete", init=init, update=update, act=act, default_hp=default_hp)
