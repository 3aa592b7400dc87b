"""Behaviour cloning, language-conditioned, for discrete and continuous actions (BENCHMARK.md §4).

    discrete:   L(θ) = E_D[−log softmax(f_θ(s ⊕ e(ℓ)))_a]            (cross-entropy)
    continuous: L(θ) = E_D[‖tanh f_θ(s ⊕ e(ℓ)) − a‖²]                 (squared error summed over action dims)

One Adam step per update (lr 1e-3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import struct

from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import DataStats, Datasets, adam, adam_step
from imaginejax.algos.networks import EncodedMLP, NetConfig
from imaginejax.data.types import Batch


@struct.dataclass
class BCHyperparams:
    """Traced hyperparameters: the Adam step size."""

    learning_rate: jax.Array


@struct.dataclass
class BCState:
    """Policy parameters, Adam state, updates done."""

    params: dict
    opt_state: optax.OptState
    step: jax.Array


def bc_loss(logits_or_actions: jax.Array, target: jax.Array, discrete: bool) -> jax.Array:
    """(B,) cross-entropy of logits (B, n) to actions (B,), or squared error of actions (B, A) summed over A."""
    if discrete:
        return optax.softmax_cross_entropy_with_integer_labels(logits_or_actions, target)
    return jnp.sum(jnp.square(logits_or_actions - target), axis=-1)


def make_bc(spec: Spec, net: NetConfig = NetConfig()) -> Algorithm:
    """BC for ``spec`` (either action space) with a policy of shapes ``net``."""
    model = EncodedMLP(net, out=spec.action_dim, squash=not spec.discrete)

    def default_hp(spec_: Spec) -> BCHyperparams:
        return BCHyperparams(learning_rate=jnp.asarray(1e-3, jnp.float32))

    def init(key: jax.Array, spec_: Spec, stats: DataStats, hp: BCHyperparams) -> BCState:
        params = model.init(key, jnp.zeros((1, spec_.obs_dim), jnp.float32))
        return BCState(params=params, opt_state=adam(hp.learning_rate).init(params), step=jnp.zeros((), jnp.int32))

    def loss_fn(params: dict, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        out = model.apply(params, batch.observation)
        per_sample = bc_loss(out, batch.action, spec.discrete)
        metrics = {"loss": per_sample.mean()}
        if spec.discrete:
            metrics["accuracy"] = (out.argmax(-1) == batch.action).mean()
        return per_sample.mean(), metrics

    def update(state: BCState, batch: Batch, key: jax.Array, hp: BCHyperparams,
               data: Datasets) -> tuple[BCState, dict[str, jax.Array]]:
        grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, batch)
        params, opt_state = adam_step(state.params, grads, state.opt_state)
        return BCState(params=params, opt_state=opt_state, step=state.step + 1), metrics

    def act(state: BCState, obs: jax.Array, key: jax.Array, hp: BCHyperparams,
            deterministic: bool = True) -> jax.Array:
        """obs (B, S+E) -> (B,) int32 (argmax or sampled) or (B, A) float32."""
        out = model.apply(state.params, obs)
        if not spec.discrete:
            return out
        if deterministic:
            return out.argmax(-1).astype(jnp.int32)
        return jax.random.categorical(key, out).astype(jnp.int32)

    return Algorithm(name="bc", init=init, update=update, act=act, default_hp=default_hp)
