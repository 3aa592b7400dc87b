"""Losses and targets of discrete CQL, discrete BCQ, TD3+BC and discrete TD3+BC against hand-computed
values.

Two kinds of check: the pure loss functions on given Q-values / logits, and the full ``update`` of each
algorithm with its output layers fixed by construction (kernel 0, bias b ⇒ the network outputs b for
every observation), so the metrics of a real update can be worked out by hand as well.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.algos.base import Spec
from imaginejax.algos.bcq_discrete import action_filter, bcq_loss, filtered_argmax, make_bcq_discrete
from imaginejax.algos.common import (DataStats, huber, periodic_polyak_update,
                                     td_target, twin_critic_loss)
from imaginejax.algos.cql_discrete import cql_loss, make_cql_discrete, next_state_value
from imaginejax.algos.networks import NetConfig, TwinCritic
from imaginejax.algos.td3bc import actor_loss, make_td3bc, smoothed_target_action
from imaginejax.algos.td3bc_discrete import discrete_actor_loss, expected_next_value, make_td3bc_discrete
from imaginejax.data.types import Batch, Transitions

NET = NetConfig(encoder_width=8, hidden=(8,))
S, E = 2, 3


def _batch(action, reward, terminal, seed: int = 0) -> Batch:
    """A batch of B = len(reward) transitions with random states/embeddings (irrelevant when the
    network's output layer is constant)."""
    reward = jnp.asarray(reward, jnp.float32)
    b = reward.shape[0]
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    return Batch(state=jax.random.normal(k1, (b, S)), embedding=jax.random.normal(k2, (b, E)),
                 action=jnp.asarray(action), reward=reward, next_state=jax.random.normal(k3, (b, S)),
                 terminal=jnp.asarray(terminal, jnp.float32), imaginary=jnp.zeros((b,), bool))


def _constant_head(params: dict, path: tuple[str, ...], bias) -> dict:
    """Sets the Dense layer at ``path`` to kernel 0, bias ``bias``: the network then outputs ``bias``."""
    params = jax.tree.map(lambda x: x, params)  # copy the nested dicts
    layer = params
    for name in path:
        layer = layer[name]
    layer["kernel"] = jnp.zeros_like(layer["kernel"])
    layer["bias"] = jnp.broadcast_to(jnp.asarray(bias, jnp.float32), layer["bias"].shape)
    return params


# --------------------------------------------------------------------------------------------------
# common
# --------------------------------------------------------------------------------------------------
def test_td_target_discounts_and_cuts_only_true_terminations():
    # y = r + γ(1 − d)V':  row 0 terminal: 1;  row 1 truncated (d = 0) bootstraps: 1 + 0.9·10 = 10;
    # row 2: 0.5 + 0.9·(−2) = −1.3.
    r, d, v = jnp.asarray([1.0, 1.0, 0.5]), jnp.asarray([1.0, 0.0, 0.0]), jnp.asarray([10.0, 10.0, -2.0])
    np.testing.assert_allclose(td_target(r, d, v, 0.9), [1.0, 10.0, -1.3], rtol=1e-6)
    # γ = 0.99 is honoured (the reference's effective γ = 1 would give 11 and −1.5).
    np.testing.assert_allclose(td_target(r, d, v, jnp.float32(0.99)), [1.0, 10.9, -1.48], rtol=1e-6)


def test_huber():
    # ½x² inside |x| ≤ 1, |x| − ½ outside.
    np.testing.assert_allclose(huber(jnp.asarray([0.5, -2.0, 1.0, 0.0])), [0.125, 1.5, 0.5, 0.0])


def test_periodic_polyak_is_hard_or_soft_and_vmaps_over_the_interval():
    target, online = {"w": jnp.zeros(2)}, {"w": jnp.ones(2)}
    hard = [periodic_polyak_update(target, online, jnp.int32(k), 3, 1.0)["w"][0] for k in (1, 2, 3, 6)]
    assert [float(x) for x in hard] == [0.0, 0.0, 1.0, 1.0]
    soft = periodic_polyak_update(target, online, jnp.int32(1), 1, 0.25)["w"]
    np.testing.assert_allclose(soft, [0.25, 0.25])
    # Three intervals in one vmapped call, at update count 2: due for N = 1, 2, not for N = 3.
    out = jax.vmap(lambda n: periodic_polyak_update(target, online, jnp.int32(2), n, 1.0)["w"][0])(
        jnp.asarray([1, 2, 3], jnp.int32))
    np.testing.assert_array_equal(out, [1.0, 1.0, 0.0])


def test_state_normalizer_uses_real_statistics_and_leaves_the_embedding():
    real = Transitions(state=jnp.asarray([[0.0, 1.0], [2.0, 1.0]]), action=jnp.zeros((2,), jnp.int32),
                       reward=jnp.zeros(2), next_state=jnp.zeros((2, 2)), terminal=jnp.zeros(2),
                       instruction=jnp.zeros((2,), jnp.int32), goal=jnp.zeros((2, 1), jnp.int32),
                       embeddings=jnp.ones((1, 3)))
    norm = DataStats.from_transitions(real)
    # mean (1, 1); std (1, 0) + 1e-3.
    np.testing.assert_allclose(norm.mean, [1.0, 1.0])
    np.testing.assert_allclose(norm.std, [1.001, 0.001], rtol=1e-6)
    obs = jnp.asarray([[3.0, 1.002, 7.0, 8.0, 9.0]])
    np.testing.assert_allclose(norm.observation(obs), [[2.0 / 1.001, 2.0, 7.0, 8.0, 9.0]], rtol=1e-4)


def test_twin_critics_are_independent_networks():
    critic = TwinCritic(NET)
    params = critic.init(jax.random.PRNGKey(0), jnp.zeros((1, S + E)), jnp.zeros((1, 2)))
    kernel = params["params"]["critics"]["LanguageEncoder_0"]["encoder_0"]["kernel"]
    assert kernel.shape == (2, S + E, 8)
    assert not np.allclose(kernel[0], kernel[1])
    q = critic.apply(params, jnp.ones((5, S + E)), jnp.zeros((5, 2)))
    assert q.shape == (2, 5) and not np.allclose(q[0], q[1])


# --------------------------------------------------------------------------------------------------
# discrete CQL
# --------------------------------------------------------------------------------------------------
def test_cql_loss_hand_computed():
    q = jnp.asarray([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    action, target = jnp.asarray([0, 2]), jnp.asarray([1.5, 2.0])
    loss, m = cql_loss(q, action, target, 10.0)
    # Q(s,a) = (1, 0); TD errors (−0.5, −2) → Huber (0.125, 1.5) → mean 0.8125.
    assert m["td_loss"] == pytest.approx(0.8125, rel=1e-6)
    # logsumexp row 0 = 3 + log(1 + e⁻¹ + e⁻²) = 3.40760596; row 1 = log 3 = 1.09861229 (all 3 actions).
    assert m["logsumexp"] == pytest.approx((3.40760596 + 1.09861229) / 2, rel=1e-6)
    # conservative = mean(3.40760596 − 1, 1.09861229 − 0) = 1.75310913; loss = 0.8125 + 10 · that.
    assert m["conservative_loss"] == pytest.approx(1.75310913, rel=1e-6)
    assert float(loss) == pytest.approx(18.3435913, rel=1e-6)


def test_cql_logsumexp_covers_all_40_actions():
    # 40 equal action values: logsumexp = log 40 = 3.68887945, not log 3 (a shrink to 3 values).
    loss, m = cql_loss(jnp.zeros((2, 40)), jnp.asarray([0, 39]), jnp.zeros(2), 1.0)
    assert m["logsumexp"] == pytest.approx(3.68887945, rel=1e-6)
    assert float(loss) == pytest.approx(3.68887945, rel=1e-6)


def test_double_q_and_max_next_values():
    online, target = jnp.asarray([[1.0, 5.0, 2.0]]), jnp.asarray([[3.0, 0.0, 4.0]])
    # double DQN: a* = argmax online = 1 → target value 0; plain max of the target network: 4.
    assert float(next_state_value(online, target, True)[0]) == 0.0
    assert float(next_state_value(online, target, False)[0]) == 4.0


def test_cql_update_with_fixed_q_values_40_actions():
    """Q ≡ b for every observation, b = 0 except b_7 = 2, n = 40 (CLEVR's action count)."""
    spec = Spec(S, E, True, 40)
    algo = make_cql_discrete(spec, NET)
    bias = jnp.zeros(40).at[7].set(2.0)
    state = algo.init(jax.random.PRNGKey(0), spec, DataStats.identity(S), algo.default_hp(spec))
    params = _constant_head(state.params, ("params", "MLP_0", "out"), bias)
    state = state.replace(params=params, target_params=params)
    # Row 0: a = 7, r = 1, truncated (d = 0) → bootstraps; row 1: a = 3, r = 0.5, terminal.
    batch = _batch([7, 3], [1.0, 0.5], [0.0, 1.0])
    update = jax.jit(algo.update)
    for gamma, y0 in ((0.9, 1.0 + 0.9 * 2.0), (0.99, 1.0 + 0.99 * 2.0)):
        hp = algo.default_hp(spec).replace(gamma=jnp.float32(gamma))
        _, m = update(state, batch, jax.random.PRNGKey(1), hp, None)
        # V' = Q'(s', argmax Q(s', ·)) = b_7 = 2 → y = (1 + γ·2, 0.5).
        assert m["target_q"] == pytest.approx((y0 + 0.5) / 2, rel=1e-6)
        # Q(s, a) = (2, 0): Huber(2 − y0) and Huber(0 − 0.5) = 0.125.
        assert m["td_loss"] == pytest.approx((float(huber(jnp.float32(2.0 - y0))) + 0.125) / 2, rel=1e-5)
    # logsumexp over all 40 values: log(39 + e²) = 3.83706357; conservative = mean(L − 2, L − 0) = L − 1.
    assert m["logsumexp"] == pytest.approx(3.83706357, rel=1e-6)
    assert m["conservative_loss"] == pytest.approx(2.83706357, rel=1e-6)
    assert m["loss"] == pytest.approx(float(m["td_loss"]) + 10.0 * 2.83706357, rel=1e-6)


def test_cql_hard_target_update_interval():
    spec = Spec(S, E, True, 4)
    algo = make_cql_discrete(spec, NET)
    hp = algo.default_hp(spec).replace(target_update_interval=jnp.int32(3), learning_rate=jnp.float32(1e-2))
    state = algo.init(jax.random.PRNGKey(0), spec, DataStats.identity(S), hp)
    batch = _batch([0, 1], [1.0, 0.0], [1.0, 0.0])
    update = jax.jit(algo.update)
    first = lambda tree: np.asarray(jax.tree.leaves(tree)[0])
    start = first(state.target_params)
    for k in range(1, 4):
        state, _ = update(state, batch, jax.random.PRNGKey(k), hp, None)
        if k < 3:
            np.testing.assert_array_equal(first(state.target_params), start)
    # After the 3rd update θ' = θ exactly.
    for a, b in zip(jax.tree.leaves(state.target_params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------------------
# discrete BCQ
# --------------------------------------------------------------------------------------------------
LOG_PB = jnp.log(jnp.asarray([[0.5, 0.2, 0.1, 0.2]]))  # π_b(·|s); ratios to the max: 1, 0.4, 0.2, 0.4
Q_BCQ = jnp.asarray([[1.0, 3.0, 10.0, 2.0]])


def test_bcq_action_filter_and_filtered_argmax():
    # τ = 0.3 keeps ratios > 0.3: actions 0, 1, 3; action 2 (ratio 0.2) is out although Q is largest.
    np.testing.assert_array_equal(action_filter(LOG_PB, 0.3), [[True, True, False, True]])
    assert int(filtered_argmax(Q_BCQ, LOG_PB, 0.3)[0]) == 1
    assert int(filtered_argmax(Q_BCQ, LOG_PB, 0.0)[0]) == 2  # τ = 0: plain argmax
    assert int(filtered_argmax(Q_BCQ, LOG_PB, 0.45)[0]) == 0  # only the mode survives


def test_bcq_loss_hand_computed():
    loss, m = bcq_loss(Q_BCQ, LOG_PB, jnp.asarray([1]), jnp.asarray([2.5]), 1e-2)
    # TD: Huber(3 − 2.5) = 0.125; NLL: −log 0.2 = 1.60943791;
    # logits² mean: (log²0.5 + 2·log²0.2 + log²0.1)/4
    #             = (0.48045301 + 2·2.59029039 + 5.30189811)/4 = 2.74073298.
    assert m["td_loss"] == pytest.approx(0.125, rel=1e-6)
    assert m["imitation_loss"] == pytest.approx(1.60943791, rel=1e-6)
    assert m["logit_penalty"] == pytest.approx(2.74073298, rel=1e-6)
    assert float(loss) == pytest.approx(0.125 + 1.60943791 + 1e-2 * 2.74073298, rel=1e-6)


@pytest.mark.parametrize("share_encoder", [True, False])
def test_bcq_target_and_action_use_the_filter(share_encoder):
    """Q ≡ (1, 3, 10, 2), π_b ≡ (0.5, 0.2, 0.1, 0.2): the target bootstraps from Q(s', 1) = 3, not 10."""
    spec = Spec(S, E, True, 4)
    algo = make_bcq_discrete(spec, NET, share_encoder=share_encoder)
    hp = algo.default_hp(spec).replace(gamma=jnp.float32(0.9))
    state = algo.init(jax.random.PRNGKey(0), spec, DataStats.identity(S), hp)
    params = _constant_head(state.params, ("params", "q_head", "out"), Q_BCQ[0])
    params = _constant_head(params, ("params", "imitation_head", "out"), LOG_PB[0])
    state = state.replace(params=params, target_params=params)
    # Row 0 truncated (d = 0): y = 0 + 0.9 · 3 = 2.7; row 1 terminal: y = 1.
    batch = _batch([1, 0], [0.0, 1.0], [0.0, 1.0])
    _, m = jax.jit(algo.update)(state, batch, jax.random.PRNGKey(1), hp, None)
    assert m["target_q"] == pytest.approx((2.7 + 1.0) / 2, rel=1e-6)
    assert m["allowed_actions"] == pytest.approx(3.0)
    # Q(s, a) = (3, 1): Huber(3 − 2.7) = 0.045, Huber(1 − 1) = 0.
    assert m["td_loss"] == pytest.approx(0.045 / 2, rel=1e-5)
    obs = batch.observation
    np.testing.assert_array_equal(algo.act(state, obs, jax.random.PRNGKey(2), hp, True), [1, 1])
    sampled = algo.act(state, jnp.repeat(obs, 50, 0), jax.random.PRNGKey(3), hp, False)
    assert not bool(jnp.any(sampled == 2))  # sampling also respects the filter


# --------------------------------------------------------------------------------------------------
# TD3+BC
# --------------------------------------------------------------------------------------------------
def test_smoothed_target_action():
    # σ ε = (0.2, −1.0) → clipped to ±0.5: (0.2, −0.5); π' + noise = (1.1, −0.7) → clipped to [−1, 1].
    out = smoothed_target_action(jnp.asarray([[0.9, -0.2]]), jnp.asarray([[1.0, -5.0]]), 0.2, 0.5)
    np.testing.assert_allclose(out, [[1.0, -0.7]], rtol=1e-6)


def test_td3bc_critic_loss_hand_computed():
    # Q1 errors (−0.5, −0.5) → 0.25; Q2 errors (−1.5, 0.5) → (2.25 + 0.25)/2 = 1.25; sum 1.5.
    q = jnp.asarray([[1.0, 2.0], [0.0, 3.0]])
    assert float(twin_critic_loss(q, jnp.asarray([1.5, 2.5]))) == pytest.approx(1.5, rel=1e-6)


def test_td3bc_actor_loss_hand_computed_and_lambda_is_not_differentiated():
    q1_pi = jnp.asarray([2.0, -4.0])
    pi, a = jnp.asarray([[0.5, 0.0], [0.0, 0.0]]), jnp.asarray([[0.0, 0.0], [0.0, 1.0]])
    loss, m = actor_loss(q1_pi, pi, a, 2.5)
    # λ = 2.5 / mean(2, 4) = 0.8333; −λ · mean Q = −0.8333 · (−1) = 0.8333;
    # BC = mean over batch and action dims of (0.25, 0, 0, 1) = 0.3125; loss = 1.1458333.
    assert m["lambda"] == pytest.approx(2.5 / 3.0, rel=1e-6)
    assert m["bc_mse"] == pytest.approx(0.3125, rel=1e-6)
    assert float(loss) == pytest.approx(2.5 / 3.0 + 0.3125, rel=1e-6)
    # ∂loss/∂Q1 = −λ / B = −0.4166667 for both rows: no gradient through mean|Q|.
    grad = jax.grad(lambda q: actor_loss(q, pi, a, 2.5)[0])(q1_pi)
    np.testing.assert_allclose(grad, [-2.5 / 3.0 / 2] * 2, rtol=1e-6)


def _td3bc(spec: Spec):
    algo = make_td3bc(spec, NET)
    return algo, jax.jit(algo.update)


def test_td3bc_target_with_fixed_critics_gamma_and_truncation():
    """Both target critics output constant c = (5, 3): min = 3, so y = r + γ(1 − d)·3."""
    spec = Spec(S, E, False, 2)
    algo, update = _td3bc(spec)
    state = algo.init(jax.random.PRNGKey(0), spec, DataStats.identity(S), algo.default_hp(spec))
    critic = _constant_head(state.critic_params, ("params", "critics", "MLP_0", "out"), 0.0)
    critic["params"]["critics"]["MLP_0"]["out"]["bias"] = jnp.asarray([[5.0], [3.0]])
    state = state.replace(critic_params=critic, critic_target=critic)
    # Row 0: r = 1, truncated → 1 + γ·3; row 1: r = −1, terminal → −1.
    batch = _batch(jnp.zeros((2, 2)), [1.0, -1.0], [0.0, 1.0])
    for gamma in (0.5, 0.99):
        hp = algo.default_hp(spec).replace(gamma=jnp.float32(gamma))
        _, m = update(state, batch, jax.random.PRNGKey(1), hp, None)
        assert m["target_q"] == pytest.approx((1.0 + gamma * 3.0 - 1.0) / 2, rel=1e-6)
        # Q1 ≡ 5, Q2 ≡ 3: Σ_i mean (Q_i − y)².
        y = np.asarray([1.0 + gamma * 3.0, -1.0])
        expected = np.mean((5.0 - y) ** 2) + np.mean((3.0 - y) ** 2)
        assert m["critic_loss"] == pytest.approx(expected, rel=1e-5)


def test_td3bc_delayed_actor_update_leaves_actor_unchanged_on_odd_steps():
    spec = Spec(S, E, False, 2)
    algo, update = _td3bc(spec)
    hp = algo.default_hp(spec).replace(actor_lr=jnp.float32(1e-2), critic_lr=jnp.float32(1e-2))
    state0 = algo.init(jax.random.PRNGKey(0), spec, DataStats.identity(S), hp)
    batch = _batch(jnp.full((4, 2), 0.3), [1.0, 0.0, 0.5, 0.2], [1.0, 0.0, 0.0, 1.0])
    same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    state1, m1 = update(state0, batch, jax.random.PRNGKey(1), hp, None)  # update 1 (odd): critic only
    assert float(m1["actor_updated"]) == 0.0
    assert same(state1.actor_params, state0.actor_params)
    assert same(state1.actor_opt, state0.actor_opt)  # Adam moments untouched too
    assert same(state1.actor_target, state0.actor_target)
    assert same(state1.critic_target, state0.critic_target)
    assert not same(state1.critic_params, state0.critic_params)

    state2, m2 = update(state1, batch, jax.random.PRNGKey(2), hp, None)  # update 2 (even): actor + targets
    assert float(m2["actor_updated"]) == 1.0
    assert not same(state2.actor_params, state1.actor_params)
    # φ' = (1 − τ)φ'_old + τ φ_new, τ = 0.005.
    for t_new, t_old, p in zip(jax.tree.leaves(state2.actor_target), jax.tree.leaves(state1.actor_target),
                               jax.tree.leaves(state2.actor_params)):
        np.testing.assert_allclose(t_new, 0.995 * t_old + 0.005 * p, rtol=1e-6, atol=1e-7)

    state3, _ = update(state2, batch, jax.random.PRNGKey(3), hp, None)  # update 3 (odd) again: frozen
    assert same(state3.actor_params, state2.actor_params)

    # policy_freq is traced: with 1 the actor moves on the first update.
    state1b, _ = update(state0, batch, jax.random.PRNGKey(1), hp.replace(policy_freq=jnp.int32(1)), None)
    assert not same(state1b.actor_params, state0.actor_params)


def test_td3bc_acts_on_normalised_states():
    spec = Spec(S, E, False, 2)
    algo = make_td3bc(spec, NET)
    hp = algo.default_hp(spec)
    state = algo.init(jax.random.PRNGKey(0), spec, DataStats.identity(S), hp)
    obs = jnp.asarray([[3.0, -1.0, 1.0, 0.0, 0.0]])
    shifted = state.replace(stats=DataStats(mean=jnp.asarray([1.0, 1.0]), std=jnp.asarray([2.0, 2.0])))
    # (3, −1) normalised by μ = 1, σ = 2 is (1, −1): the same action as the raw obs (1, −1) unnormalised.
    np.testing.assert_allclose(algo.act(shifted, obs, jax.random.PRNGKey(0), hp, True),
                               algo.act(state, obs.at[0, :2].set(jnp.asarray([1.0, -1.0])),
                                        jax.random.PRNGKey(0), hp, True), rtol=1e-6)
    noisy = algo.act(state, jnp.repeat(obs, 64, 0), jax.random.PRNGKey(1), hp, False)
    assert noisy.shape == (64, 2) and float(jnp.abs(noisy).max()) <= 1.0


def test_make_functions_refuse_the_wrong_action_space():
    with pytest.raises(ValueError, match="discrete"):
        make_cql_discrete(Spec(S, E, False, 2), NET)
    with pytest.raises(ValueError, match="discrete"):
        make_bcq_discrete(Spec(S, E, False, 2), NET)
    with pytest.raises(ValueError, match="continuous"):
        make_td3bc(Spec(S, E, True, 4), NET)
    with pytest.raises(ValueError, match="discrete"):
        make_td3bc_discrete(Spec(S, E, False, 2), NET)


# --------------------------------------------------------------------------------------------------
# discrete TD3+BC (our extension)
# --------------------------------------------------------------------------------------------------
def test_discrete_td3bc_actor_loss_and_gradient_hand_computed():
    logits = jnp.log(jnp.asarray([[0.5, 0.25, 0.25]]))  # π = (0.5, 0.25, 0.25)
    q1, action = jnp.asarray([[2.0, 0.0, -2.0]]), jnp.asarray([1])
    loss, m = discrete_actor_loss(logits, q1, action, 2.5)
    # V^π = 0.5·2 + 0.25·0 + 0.25·(−2) = 0.5; λ = 2.5 / 0.5 = 5; CE = −log 0.25 = 1.38629436;
    # loss = −5 · 0.5 + 1.38629436 = −1.11370564.
    assert m["expected_q"] == pytest.approx(0.5, rel=1e-6)
    assert m["lambda"] == pytest.approx(5.0, rel=1e-6)
    assert float(loss) == pytest.approx(-1.11370564, rel=1e-6)
    # ∂L/∂z_b = −λ π_b (Q_b − V) + π_b − 1[b = a]:
    #   b0: −5·0.5·1.5 + 0.5 = −3.25;  b1: −5·0.25·(−0.5) + 0.25 − 1 = −0.125;
    #   b2: −5·0.25·(−2.5) + 0.25 = 3.375.
    grad = jax.grad(lambda z: discrete_actor_loss(z, q1, action, 2.5)[0])(logits)
    np.testing.assert_allclose(grad, [[-3.25, -0.125, 3.375]], rtol=1e-5, atol=1e-6)


def test_discrete_td3bc_expected_next_value():
    # π' = (0.5, 0.5); min over twins of ((1, 4), (2, 3)) = (1, 3); V' = 2.
    v = expected_next_value(jnp.zeros((1, 2)), jnp.asarray([[[1.0, 4.0]], [[2.0, 3.0]]]))
    assert float(v[0]) == pytest.approx(2.0)


def test_discrete_td3bc_delayed_actor_update():
    spec = Spec(S, E, True, 4)
    algo = make_td3bc_discrete(spec, NET)
    hp = algo.default_hp(spec).replace(actor_lr=jnp.float32(1e-2), critic_lr=jnp.float32(1e-2))
    state0 = algo.init(jax.random.PRNGKey(0), spec, DataStats.identity(S), hp)
    batch = _batch(jnp.asarray([0, 1, 2]), [1.0, 0.0, 0.5], [1.0, 0.0, 0.0])
    update = jax.jit(algo.update)
    same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    state1, _ = update(state0, batch, jax.random.PRNGKey(1), hp, None)
    assert same(state1.actor_params, state0.actor_params) and same(state1.actor_opt, state0.actor_opt)
    assert not same(state1.critic_params, state0.critic_params)
    state2, _ = update(state1, batch, jax.random.PRNGKey(2), hp, None)
    assert not same(state2.actor_params, state1.actor_params)
    assert algo.act(state2, batch.observation, jax.random.PRNGKey(3), hp, True).shape == (3,)
