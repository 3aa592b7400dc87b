"""Discrete conservative Q-learning (Kumar et al. 2020, CQL(H) on a DQN), language-conditioned.

With o = s ⊕ e(ℓ) the observation (state ⊕ instruction embedding), a Q-network Q_θ(o, ·) ∈ R^n and a
target copy θ', one update on a batch (o, a, r, o', d) minimises

    L(θ) = E[ h(Q_θ(o, a) − y) ]  +  α · E[ log Σ_{b=1..n} exp Q_θ(o, b)  −  Q_θ(o, a) ]
           └── TD (Huber, δ = 1) ──┘      └──── conservative term: full logsumexp over all n actions ───┘

    y = r + γ · (1 − d) · Q_θ'(o', a*),   a* = argmax_b Q_θ(o', b)        (double DQN, default)
                                      or  y = r + γ · (1 − d) · max_b Q_θ'(o', b)   (``double_q=False``)

where d = 1 only on true terminations (a time-limit truncation bootstraps) and γ comes from ``hp``.
The logsumexp runs over every one of the n actions of each state (the reference's reshape that shrank
it to 3 values per state is not reproduced). Optimiser: Adam with a traced learning rate. The target
network follows the periodic Polyak rule of :mod:`imaginejax.algos.common` (reference: hard copy every
8000 updates, i.e. N = 8000, τ = 1). Acting: a = argmax_b Q_θ(o, b) (sampled from softmax(Q) when not
deterministic).

Choices, with the reference they follow:

* **Huber TD loss**: d3rlpy's ``DiscreteCQL`` (the reference implementation used by ImagineBench) is a
  DoubleDQN whose discrete Q-function error is the Huber loss with δ = 1; so is DQN's.
* **Double-DQN target**: the same d3rlpy class subclasses DoubleDQN (the paper's Atari experiments
  used a QR-DQN/DQN backbone). Selecting a* with the online network and evaluating it with the target
  network reduces the max-operator's over-estimation, which matters most on the unseen actions an
  offline learner must not trust; it costs one extra forward pass. ``double_q=False`` gives the plain
  max for comparison.
* Reference hyperparameters (BENCHMARK.md §4): lr 6.25e-5, batch 32 (an engine setting), α = 10,
  target update every 8000 updates, γ = 0.99.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import adam_init, adam_step, huber, periodic_polyak_update, td_target
from imaginejax.algos.networks import EncodedMLP, NetConfig
from imaginejax.data.types import Batch


@struct.dataclass
class CQLHyperparams:
    """Traced hyperparameters (all () arrays).

    Attributes:
      learning_rate: Adam step size (reference 6.25e-5).
      alpha: weight α of the conservative term (reference 10).
      gamma: discount γ (0.99).
      target_update_interval: N, target update every N updates (reference 8000), int32.
      target_tau: τ of the periodic Polyak update (1.0 = hard copy).
    """

    learning_rate: jax.Array
    alpha: jax.Array
    gamma: jax.Array
    target_update_interval: jax.Array
    target_tau: jax.Array


@struct.dataclass
class CQLState:
    """params / target_params: Q-network θ and θ'; opt_state: Adam; step: () int32 updates done."""

    params: dict
    target_params: dict
    opt_state: optax.OptState
    step: jax.Array


def take_action_values(q: jax.Array, action: jax.Array) -> jax.Array:
    """Q(o, a) from all action values: q (B, n), action (B,) int -> (B,)."""
    return jnp.take_along_axis(q, action[:, None].astype(jnp.int32), axis=-1)[:, 0]


def next_state_value(q_next_online: jax.Array, q_next_target: jax.Array, double_q: bool) -> jax.Array:
    """Bootstrap value V(o') from the next-state action values.

    Args:
      q_next_online: (B, n) Q_θ(o', ·) (used only when ``double_q``).
      q_next_target: (B, n) Q_θ'(o', ·).
      double_q: static; True → Q_θ'(o', argmax Q_θ(o', ·)), False → max Q_θ'(o', ·).

    Returns:
      (B,) values (the caller stops gradients).
    """
    if double_q:
        return take_action_values(q_next_target, jnp.argmax(q_next_online, axis=-1))
    return jnp.max(q_next_target, axis=-1)


def cql_loss(q: jax.Array, action: jax.Array, target: jax.Array,
             alpha: jax.Array | float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The discrete CQL loss on given action values.

    Args:
      q: (B, n) Q_θ(o, ·) for every action.
      action: (B,) int dataset actions a.
      target: (B,) TD targets y (no gradient flows into them).
      alpha: () conservative weight α.

    Returns:
      (loss, metrics): loss = mean h(Q(o,a) − y) + α · mean(logsumexp_b Q(o,b) − Q(o,a)), with the
      logsumexp over all n actions; metrics td_loss, conservative_loss, q_data, logsumexp (batch means).
    """
    chex.assert_rank(q, 2)
    chex.assert_shape([action, target], (q.shape[0],))
    q_data = take_action_values(q, action)
    td = huber(q_data - target).mean()
    logsumexp = jax.nn.logsumexp(q, axis=-1)  # (B,): over the full action axis
    conservative = (logsumexp - q_data).mean()
    loss = td + alpha * conservative
    return loss, {"loss": loss, "td_loss": td, "conservative_loss": conservative,
                  "q_data": q_data.mean(), "logsumexp": logsumexp.mean()}


def make_cql(spec: Spec, net: NetConfig = NetConfig(), double_q: bool = True) -> Algorithm:
    """Builds discrete CQL for ``spec`` (must be discrete) with static network shapes ``net``.

    Args:
      spec: environment interface; ``spec.action_dim`` is the number of actions n.
      net: static network shapes of the Q-network (language encoder + ReLU head, n outputs).
      double_q: static; double-DQN target (default, as the d3rlpy reference) or plain max.
    """
    if not spec.discrete:
        raise ValueError("make_cql is discrete CQL: spec.discrete must be True (continuous CQL is a "
                         "separate SAC-based algorithm)")
    model = EncodedMLP(net, out=spec.action_dim)

    def default_hp(spec_: Spec) -> CQLHyperparams:
        del spec_
        return CQLHyperparams(learning_rate=jnp.float32(6.25e-5), alpha=jnp.float32(10.0),
                              gamma=jnp.float32(0.99), target_update_interval=jnp.int32(8000),
                              target_tau=jnp.float32(1.0))

    def init(key: jax.Array, spec_: Spec, hp: CQLHyperparams) -> CQLState:
        del hp
        params = model.init(key, jnp.zeros((1, spec_.obs_dim), jnp.float32))
        return CQLState(params=params, target_params=params, opt_state=adam_init(params),
                        step=jnp.zeros((), jnp.int32))

    def update(state: CQLState, batch: Batch, key: jax.Array,
               hp: CQLHyperparams) -> tuple[CQLState, dict[str, jax.Array]]:
        """One gradient step on a batch of B transitions; metrics are pre-update batch means."""
        del key
        next_obs = batch.next_observation
        q_next_target = model.apply(state.target_params, next_obs)
        q_next_online = model.apply(state.params, next_obs) if double_q else q_next_target
        next_value = jax.lax.stop_gradient(next_state_value(q_next_online, q_next_target, double_q))
        target = td_target(batch.reward, batch.terminal, next_value, hp.gamma)

        def loss_fn(params):
            return cql_loss(model.apply(params, batch.observation), batch.action, target, hp.alpha)

        grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
        params, opt_state = adam_step(state.params, grads, state.opt_state, hp.learning_rate)
        count = state.step + 1
        target_params = periodic_polyak_update(state.target_params, params, count,
                                               hp.target_update_interval, hp.target_tau)
        metrics["target_q"] = target.mean()
        return CQLState(params=params, target_params=target_params, opt_state=opt_state,
                        step=count), metrics

    def act(state: CQLState, obs: jax.Array, key: jax.Array, hp: CQLHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) -> (B,) int32: argmax_a Q(o, a), or a ~ softmax(Q(o, ·))."""
        del hp
        q = model.apply(state.params, obs)
        if deterministic:
            return jnp.argmax(q, axis=-1).astype(jnp.int32)
        return jax.random.categorical(key, q).astype(jnp.int32)

    return Algorithm(name="cql", init=init, update=update, act=act, default_hp=default_hp)
