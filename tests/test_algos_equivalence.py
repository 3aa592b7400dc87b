"""The cheaper update paths compute what the plain ones did.

* Critics scoring K actions per state encode each state once (``MLP``'s joined input, a split first
  layer): equal, on random parameters, to an independent float64 NumPy forward pass of the tiled
  observations, with the parameters (names, shapes, initial values) of the concatenating layer; the
  matmul FLOPs counted on the jaxpr equal the hand count of the broadcast network.
* Continuous CQL's critic objective (value and gradient) equals the tiled formulation it replaced.
* ``first_critic_apply`` equals row 0 of the twin critics (continuous and discrete).
* PRDC is TD3+BC with another behaviour-cloning target: when the neighbour is the batch row itself,
  a PRDC update equals the TD3+BC update bit for bit (continuous and discrete).
"""

from __future__ import annotations

import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.algos.base import Spec
from imaginejax.algos.common import DataStats, Datasets, RowWeights
from imaginejax.algos.cql import continuous_cql_critic_objective
from imaginejax.algos.networks import (MLP, LanguageEncoder, NetConfig, TwinCritic, TwinDiscreteCritic,
                                       first_critic_apply)
from imaginejax.algos.prdc import make_prdc
from imaginejax.algos.prdc_discrete import make_prdc_discrete
from imaginejax.algos.td3bc import make_td3bc
from imaginejax.algos.td3bc_discrete import make_td3bc_discrete
from imaginejax.data.types import Batch, Transitions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "benchmarks"))
from matmul_peak import matmul_flops  # noqa: E402

NET = NetConfig(encoder_width=16, hidden=(12, 10))
S, E, A = 3, 4, 2


class ConcatHead(nn.Module):
    """The ReLU head as it was written before the joined input: nn.Dense layers on one input."""

    hidden: tuple[int, ...]

    @nn.compact
    def __call__(self, x):
        for i, width in enumerate(self.hidden):
            x = nn.relu(nn.Dense(width, name=f"hidden_{i}")(x))
        return nn.Dense(1, name="out")(x)


class ConcatCritic(nn.Module):
    """The critic as it was written before the broadcast path: head(enc(o) ⊕ a)."""

    config: NetConfig

    @nn.compact
    def __call__(self, obs, action):
        h = LanguageEncoder(self.config.encoder_width, self.config.encoder_layers)(obs)
        return ConcatHead(self.config.hidden, name="MLP_0")(jnp.concatenate([h, action], axis=-1))[..., 0]


class ConcatTwin(nn.Module):
    config: NetConfig

    @nn.compact
    def __call__(self, obs, action):
        twin = nn.vmap(ConcatCritic, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=None, out_axes=0, axis_size=2)
        return twin(self.config, name="critics")(obs, action)


def _numpy_critic(params: dict, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
    """Float64 forward pass of one critic on rows (P, S+E), (P, A) -> (P,): tanh encoder, ReLU head."""
    f = lambda x: np.asarray(x, np.float64)
    x = f(obs)
    enc = params["LanguageEncoder_0"]
    for i in range(NET.encoder_layers):
        x = np.tanh(x @ f(enc[f"encoder_{i}"]["kernel"]) + f(enc[f"encoder_{i}"]["bias"]))
    x = np.concatenate([x, f(action)], -1)
    head = params["MLP_0"]
    for i in range(len(NET.hidden)):
        x = np.maximum(x @ f(head[f"hidden_{i}"]["kernel"]) + f(head[f"hidden_{i}"]["bias"]), 0.0)
    return (x @ f(head["out"]["kernel"]) + f(head["out"]["bias"]))[:, 0]


def _setup(seed: int = 0, b: int = 5, k: int = 7):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    obs = jax.random.normal(keys[0], (b, S + E))
    actions = jax.random.uniform(keys[1], (b, k, A), minval=-1.0, maxval=1.0)
    params = TwinCritic(NET).init(keys[2], obs, actions[:, 0])
    return params, obs, actions


def test_parameters_are_those_of_the_concatenating_critic():
    # Same key -> the same names, shapes and initial values as nn.Dense on the concatenation, whichever
    # input (one action or K per state) the critic is initialised with.
    obs, action = jnp.ones((3, S + E)), jnp.ones((3, A))
    old = ConcatTwin(NET).init(jax.random.PRNGKey(4), obs, action)
    for act in (action, jnp.ones((3, 5, A))):
        new = TwinCritic(NET).init(jax.random.PRNGKey(4), obs, act)
        assert jax.tree.structure(new) == jax.tree.structure(old)
        for x, y in zip(jax.tree.leaves(new), jax.tree.leaves(old)):
            np.testing.assert_array_equal(x, y)


def test_k_actions_per_state_equal_the_tiled_numpy_forward_pass():
    params, obs, actions = _setup()
    b, k, _ = actions.shape
    q = TwinCritic(NET).apply(params, obs, actions)
    assert q.shape == (2, b, k)
    tiled_obs, flat_actions = np.repeat(np.asarray(obs), k, axis=0), np.asarray(actions).reshape(b * k, A)
    for i in range(2):
        one = jax.tree.map(lambda x: x[i], params["params"]["critics"])
        expected = _numpy_critic(one, tiled_obs, flat_actions).reshape(b, k)
        np.testing.assert_allclose(q[i], expected, rtol=2e-5, atol=2e-6)
    # The one-action path is unchanged: equal to the concatenating module bit for bit.
    np.testing.assert_array_equal(TwinCritic(NET).apply(params, obs, actions[:, 0]),
                                  ConcatTwin(NET).apply(params, obs, actions[:, 0]))


def test_broadcast_critic_flops_are_the_hand_count():
    params, obs, actions = _setup(b=8, k=30)
    b, k, _ = actions.shape
    w, (h1, h2), d = NET.encoder_width, NET.hidden, S + E
    # Per critic: encoder once per state; first head layer split into the state part (once per state)
    # and the action part (per action); the rest per action. 2 FLOPs per multiply-add, 2 critics.
    per_state = d * w + w * w + w * h1
    per_action = A * h1 + h1 * h2 + h2 * 1
    expected = 2 * 2 * (b * per_state + b * k * per_action)
    count = matmul_flops(lambda p, o, a: TwinCritic(NET).apply(p, o, a), params, obs, actions)
    assert count.flops == expected
    # The tiled evaluation costs the whole network per action.
    tiled = matmul_flops(lambda p, o, a: TwinCritic(NET).apply(p, o, a), params,
                         jnp.repeat(obs, k, axis=0), actions.reshape(b * k, A))
    assert tiled.flops == 2 * 2 * b * k * (d * w + w * w + (w + A) * h1 + h1 * h2 + h2)
    assert count.flops < tiled.flops / 2


def test_mlp_rejects_a_joined_input_of_the_wrong_shape():
    mlp = MLP((4,), 1)
    with pytest.raises(ValueError, match="joined"):
        mlp.init(jax.random.PRNGKey(0), jnp.ones((3, 5)), jnp.ones((2, 4, 2)))


def _tiled_objective(critic_apply, params, obs, action, target, sample_actions, log_density, weights, alpha):
    """Continuous CQL's critic loss as it was computed before: observations tiled M times, one flat pass."""
    n, m, a_dim = sample_actions.shape
    obs_all = jnp.concatenate([obs, jnp.repeat(obs, m, axis=0)], axis=0)
    act_all = jnp.concatenate([action, sample_actions.reshape(n * m, a_dim)], axis=0)
    q_all = critic_apply(params, obs_all, act_all)
    q_data, q_samples = q_all[:, :n], q_all[:, n:].reshape(2, n, m)
    td = jnp.sum(jnp.square(q_data - target[None]) @ weights.td)
    lse = jax.nn.logsumexp(q_samples - log_density[None], axis=-1)
    reg = lse @ weights.push_down - q_data @ weights.push_up
    return td + jnp.sum(alpha * reg)


def test_cql_objective_and_gradient_equal_the_tiled_formulation():
    params, obs, actions = _setup(seed=3, b=6, k=31)
    action, samples = actions[:, 0], actions[:, 1:]
    keys = jax.random.split(jax.random.PRNGKey(9), 3)
    target = jax.random.normal(keys[0], (6,))
    log_density = jax.random.normal(keys[1], (6, 30))
    w = jax.nn.softmax(jax.random.normal(keys[2], (3, 6)), axis=-1)
    weights = RowWeights(td=w[0], push_down=w[1], push_up=w[2], actor=w[0])
    apply = TwinCritic(NET).apply
    new = lambda p: continuous_cql_critic_objective(apply, p, obs, action, target, samples, log_density, weights,
                                                    5.0)[0]
    old = lambda p: _tiled_objective(apply, p, obs, action, target, samples, log_density, weights, 5.0)
    (v_new, g_new), (v_old, g_old) = jax.value_and_grad(new)(params), jax.value_and_grad(old)(params)
    assert float(v_new) == pytest.approx(float(v_old), rel=1e-5)
    for x, y in zip(jax.tree.leaves(g_new), jax.tree.leaves(g_old)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5 * float(np.max(np.abs(y))) + 1e-7)


def test_first_critic_apply_equals_row_0_of_the_twin():
    params, obs, actions = _setup(seed=5)
    critic = TwinCritic(NET)
    np.testing.assert_allclose(first_critic_apply(critic, params, obs, actions[:, 0]),
                               critic.apply(params, obs, actions[:, 0])[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(first_critic_apply(critic, params, obs, actions),
                               critic.apply(params, obs, actions)[0], rtol=1e-6, atol=1e-7)
    discrete = TwinDiscreteCritic(NET, 6)
    d_params = discrete.init(jax.random.PRNGKey(1), obs)
    np.testing.assert_allclose(first_critic_apply(discrete, d_params, obs), discrete.apply(d_params, obs)[0],
                               rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="TwinCritic"):
        first_critic_apply(MLP((4,), 1), params, obs)


# --------------------------------------------------------------------------------------------------
# PRDC = TD3+BC with the neighbour's action as the BC target
# --------------------------------------------------------------------------------------------------
def _data(discrete: bool, n_act: int, k: int = 64) -> Transitions:
    rng = np.random.default_rng(0)
    f = lambda x: jnp.asarray(x, jnp.float32)
    action = (jnp.asarray(rng.integers(0, n_act, k), jnp.int32) if discrete
              else f(rng.uniform(-1, 1, (k, n_act))))
    return Transitions(state=f(rng.normal(size=(k, S))), action=action, reward=f(rng.normal(size=k)),
                       next_state=f(rng.normal(size=(k, S))), terminal=f(rng.uniform(size=k) < 0.2),
                       instruction=jnp.asarray(rng.integers(0, 3, k), jnp.int32), goal=jnp.zeros((k, 1), jnp.float32),
                       embeddings=f(rng.normal(size=(3, E))))


@pytest.mark.parametrize("discrete", [False, True])
def test_prdc_with_the_row_itself_as_neighbour_is_td3bc_bit_for_bit(discrete):
    """β = 1000 makes the state term dominate the search, so each batch row (a dataset row) is its own
    neighbour: PRDC's BC target is then the batch action, and its update must be TD3+BC's exactly."""
    n_act = 4 if discrete else A
    spec = Spec(S, E, discrete, n_act)
    real = _data(discrete, n_act)
    rows = np.arange(0, 64, 2)
    batch = Batch(state=real.state[rows], embedding=real.embeddings[real.instruction[rows]], action=real.action[rows],
                  reward=real.reward[rows], next_state=real.next_state[rows], terminal=real.terminal[rows],
                  imaginary=jnp.zeros((len(rows),), bool))
    td3bc = (make_td3bc_discrete if discrete else make_td3bc)(spec, NET)
    prdc = (make_prdc_discrete if discrete else make_prdc)(spec, NET, chunk=64)
    hp_t = td3bc.default_hp(spec).replace(policy_freq=jnp.int32(1))
    hp_p = prdc.default_hp(spec).replace(policy_freq=jnp.int32(1), beta=jnp.float32(1e3))
    data = Datasets.of(real, jax.tree.map(lambda x: x[:1], real))
    stats = DataStats.identity(S)
    s_t = td3bc.init(jax.random.PRNGKey(2), spec, stats, hp_t)
    s_p = prdc.init(jax.random.PRNGKey(2), spec, stats, hp_p)
    step_t, step_p = jax.jit(td3bc.update), jax.jit(prdc.update)
    for i in range(3):
        key = jax.random.PRNGKey(10 + i)
        s_t, m_t = step_t(s_t, batch, key, hp_t, None)
        s_p, m_p = step_p(s_p, batch, key, hp_p, data)
        # Every neighbour is the row itself: the BC term to it is the one to the batch's own action ...
        np.testing.assert_array_equal(m_p["data_cross_entropy" if discrete else "data_mse"],
                                      m_p["cross_entropy" if discrete else "bc_mse"])
        # ... and then every metric and the whole state are TD3+BC's.
        for name, value in m_t.items():
            np.testing.assert_array_equal(m_p[name], value, err_msg=name)
        for x, y in zip(jax.tree.leaves(s_p), jax.tree.leaves(s_t)):
            np.testing.assert_array_equal(x, y)
