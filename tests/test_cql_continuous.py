"""Continuous CQL (SAC backbone): the SAC pieces and the CQL(H) critic loss against hand-computed values and
independent formulas, the reference's defects (γ, truncations, a stop-gradient on half the regulariser, a
logsumexp shrunk to 3 values), and learning on the one-step reach task through the engine with three α
in one call.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import toy_continuous_env as reach

from imaginejax.algos.base import Spec
from imaginejax.algos.common import DataStats, RowWeights, twin_critic_loss
from imaginejax.algos.cql import (continuous_cql_critic_objective, continuous_cql_regularizer, cql_action_samples,
                                  make_cql, sac_actor_loss, temperature_loss)
from imaginejax.algos.networks import SAC_NET, NetConfig, TwinCritic, sample_tanh_gaussian, tanh_gaussian_log_prob
from imaginejax.data.transitions import to_transitions
from imaginejax.data.types import Batch
from imaginejax.training.kernel import EngineConfig, broadcast_runs
from imaginejax.training.loop import make_train

NET = NetConfig(encoder_width=8, hidden=(8,))
SMALL = NetConfig(encoder_width=32, hidden=(32,))
S, E, A = 2, 3, 2
SPEC = Spec(S, E, False, A)
ALGO = make_cql(SPEC, NET)
UPDATE = jax.jit(ALGO.update)  # one compilation shared by the update tests
ID = DataStats.identity(S)  # no state normalisation


def _batch(reward, terminal, seed: int = 0, action=None) -> Batch:
    reward = jnp.asarray(reward, jnp.float32)
    b = reward.shape[0]
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    if action is None:
        action = jax.random.uniform(k[3], (b, A), minval=-1.0, maxval=1.0)
    return Batch(state=jax.random.normal(k[0], (b, S)), embedding=jax.random.normal(k[1], (b, E)),
                 action=jnp.asarray(action, jnp.float32), reward=reward,
                 next_state=jax.random.normal(k[2], (b, S)), terminal=jnp.asarray(terminal, jnp.float32),
                 imaginary=jnp.zeros((b,), bool))


# --------------------------------------------------------------------------------------------------
# SAC pieces
# --------------------------------------------------------------------------------------------------
def test_tanh_gaussian_log_prob_is_the_change_of_variables_density():
    mean, log_std = np.asarray([0.3, -1.0]), np.asarray([-0.5, 0.2])
    u = np.asarray([0.1, -2.5])
    # p_a(a) = N(u; μ, σ²) / (1 − tanh²u), summed over the two dimensions in log space.
    sigma = np.exp(log_std)
    expected = np.sum(-0.5 * ((u - mean) / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi)
                      - np.log(1.0 - np.tanh(u) ** 2))
    got = tanh_gaussian_log_prob(jnp.asarray(u, jnp.float32), jnp.asarray(mean, jnp.float32),
                                 jnp.asarray(log_std, jnp.float32))
    assert float(got) == pytest.approx(expected, rel=1e-5)
    # A density on (−1, 1): ∫ π(a) da = 1 (1-d, μ = 0.4, σ = 0.7; midpoint rule in u = atanh a, da = (1 − a²) du).
    grid = np.linspace(-12.0, 12.0, 200_001)
    log_p = np.asarray(tanh_gaussian_log_prob(jnp.asarray(grid, jnp.float32)[:, None], jnp.float32(0.4),
                                              jnp.log(jnp.float32(0.7))))
    integral = np.sum(np.exp(log_p) * (1.0 - np.tanh(grid) ** 2)) * (grid[1] - grid[0])
    assert integral == pytest.approx(1.0, abs=1e-4)


def test_sample_tanh_gaussian_is_reparameterised_and_bounded():
    mean, log_std = jnp.asarray([[0.5, -0.2]]), jnp.asarray([[-1.0, 0.0]])
    actions, log_prob = sample_tanh_gaussian(jax.random.PRNGKey(0), mean, log_std, num_samples=1000)
    assert actions.shape == (1, 1000, 2) and log_prob.shape == (1, 1000)
    assert float(jnp.abs(actions).max()) < 1.0
    # a = tanh(μ + σ ε): atanh a recovers pre-tanh values whose mean and std match μ, σ.
    pre = np.arctanh(np.asarray(actions[0], np.float64))
    np.testing.assert_allclose(pre.mean(0), [0.5, -0.2], atol=0.08)
    np.testing.assert_allclose(pre.std(0), [np.exp(-1.0), 1.0], rtol=0.08)
    # d a / d μ = 1 − tanh²(u) > 0: gradients flow through the sample.
    grad = jax.grad(lambda m: sample_tanh_gaussian(jax.random.PRNGKey(1), m, log_std)[0].sum())(mean)
    assert bool(jnp.all(grad > 0))


def test_sac_actor_and_temperature_losses_hand_computed():
    q_pi, log_prob = jnp.asarray([1.0, -2.0]), jnp.asarray([0.5, -1.5])
    # α = 0.2: mean(0.2·0.5 − 1, 0.2·(−1.5) + 2) = mean(−0.9, 1.7) = 0.4.
    assert float(sac_actor_loss(q_pi, log_prob, 0.2)) == pytest.approx(0.4, rel=1e-6)
    # Weighted (0.75, 0.25): −0.675 + 0.425 = −0.25.
    assert float(sac_actor_loss(q_pi, log_prob, 0.2, jnp.asarray([0.75, 0.25]))) == pytest.approx(-0.25, rel=1e-6)
    # L(log α) = −log α · mean(log π + H̄), H̄ = −2: mean(−1.5, −3.5) = −2.5 → ∂L/∂log α = 2.5 > 0, so a
    # gradient step lowers α: the policy's entropy (≈ 0.5) exceeds the target (−2).
    loss, grad = jax.value_and_grad(temperature_loss)(jnp.float32(0.3), log_prob, -2.0)
    assert float(loss) == pytest.approx(0.75, rel=1e-6) and float(grad) == pytest.approx(2.5, rel=1e-6)
    # No gradient flows into log π.
    assert float(jnp.abs(jax.grad(lambda lp: temperature_loss(jnp.float32(0.3), lp, -2.0))(log_prob)).sum()) == 0.0


# --------------------------------------------------------------------------------------------------
# The CQL(H) regulariser
# --------------------------------------------------------------------------------------------------
def test_regularizer_hand_computed_logsumexp_over_all_samples():
    rng = np.random.default_rng(0)
    q_samples = rng.normal(size=(2, 3, 6)).astype(np.float32)  # 2 critics, 3 states, 3 sources × K = 2
    log_density = rng.normal(size=(3, 6)).astype(np.float32)
    q_data = rng.normal(size=(2, 3)).astype(np.float32)
    w_down, w_up = np.asarray([0.5, 0.25, 0.25], np.float32), np.asarray([0.2, 0.3, 0.5], np.float32)
    reg, parts = continuous_cql_regularizer(jnp.asarray(q_samples), jnp.asarray(log_density), jnp.asarray(q_data),
                                            jnp.asarray(w_down), jnp.asarray(w_up))
    x = q_samples - log_density[None]
    lse = x.max(-1) + np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1))  # over all 6 samples of a state
    np.testing.assert_allclose(parts["logsumexp"], lse, rtol=1e-5)
    np.testing.assert_allclose(reg, lse @ w_down - q_data @ w_up, rtol=1e-5)


def test_logsumexp_covers_all_30_samples_not_3():
    # Equal Q = c at all 3·10 proposals with log μ = 0: LSE = c + log 30 = c + 3.40119738. A reshape that
    # took the logsumexp over the 3 sources only would give c + log 3 = c + 1.09861229.
    q_samples = jnp.full((2, 4, 30), 1.5)
    reg, parts = continuous_cql_regularizer(q_samples, jnp.zeros((4, 30)), jnp.full((2, 4), 1.5),
                                            jnp.full((4,), 0.25), jnp.full((4,), 0.25))
    np.testing.assert_allclose(parts["logsumexp"], 1.5 + 3.40119738, rtol=1e-6)
    np.testing.assert_allclose(reg, [3.40119738] * 2, rtol=1e-6)


def test_action_samples_sources_and_importance_weights():
    mean, log_std = jnp.zeros((5, A)), jnp.full((5, A), -1.0)
    next_mean, next_log_std = jnp.full((5, A), 2.0), jnp.full((5, A), -3.0)
    actions, log_density = cql_action_samples(jax.random.PRNGKey(0), mean, log_std, next_mean, next_log_std, 10)
    assert actions.shape == (5, 30, A) and log_density.shape == (5, 30)
    # Uniform samples on [−1, 1]^2: density 0.5^2, log −2 log 2.
    np.testing.assert_allclose(log_density[:, :10], -2 * math.log(2.0), rtol=1e-6)
    # π(·|o) samples near tanh(0) = 0, π(·|o') samples near tanh(2) = 0.964 (σ = e⁻³), each scored by its
    # own policy's log-density.
    assert float(jnp.abs(actions[:, 10:20]).mean()) < 0.5
    np.testing.assert_allclose(actions[:, 20:], np.tanh(2.0), atol=0.01)
    pre = jnp.arctanh(actions[:, 20:])
    np.testing.assert_allclose(log_density[:, 20:], tanh_gaussian_log_prob(pre, next_mean[:, None], next_log_std[:, None]),
                               rtol=1e-3)


def _objective_setup(seed: int = 0):
    critic = TwinCritic(NET)
    params = critic.init(jax.random.PRNGKey(seed), jnp.zeros((1, S + E)), jnp.zeros((1, A)))
    k = jax.random.split(jax.random.PRNGKey(seed + 1), 4)
    obs = jax.random.normal(k[0], (4, S + E))
    action = jax.random.uniform(k[1], (4, A), minval=-1, maxval=1)
    sample_actions = jax.random.uniform(k[2], (4, 30, A), minval=-1, maxval=1)
    log_density = jax.random.normal(k[3], (4, 30))
    return critic, params, obs, action, sample_actions, log_density


def test_td_part_equals_twin_critic_loss_and_terms_add_up():
    critic, params, obs, action, sample_actions, log_density = _objective_setup()
    target = jnp.asarray([0.5, -1.0, 2.0, 0.0])
    w = RowWeights.uniform(4)
    loss, m = continuous_cql_critic_objective(critic.apply, params, obs, action, target, sample_actions, log_density,
                                              w, 0.0)
    # With α = 0 and uniform weights: Σ_i mean (Q_i − y)², as common.twin_critic_loss.
    assert float(loss) == pytest.approx(float(twin_critic_loss(critic.apply(params, obs, action), target)), rel=1e-5)
    loss5, m5 = continuous_cql_critic_objective(critic.apply, params, obs, action, target, sample_actions,
                                                log_density, w, 5.0)
    # loss = td + α Σ_i R_i = td + 2α · mean_i R_i.
    assert float(loss5) == pytest.approx(float(m5["td_loss"]) + 10.0 * float(m5["conservative_loss"]), rel=1e-5)
    # Lagrangian: α'(α R_i − τ_gap) summed over the two critics.
    loss_l, _ = continuous_cql_critic_objective(critic.apply, params, obs, action, target, sample_actions,
                                                log_density, w, 5.0, 0.5, 10.0)
    expected = float(m5["td_loss"]) + 0.5 * (10.0 * float(m5["conservative_loss"]) - 20.0)
    assert float(loss_l) == pytest.approx(expected, rel=1e-5)


def test_both_regulariser_halves_carry_gradient():
    critic, params, obs, action, sample_actions, log_density = _objective_setup(3)
    quarter, zero = jnp.full((4,), 0.25), jnp.zeros((4,))
    target = jnp.zeros(4)

    def grad_of(push_down, push_up):
        w = RowWeights(td=zero, push_down=push_down, push_up=push_up, actor=quarter)
        return jax.grad(lambda p: continuous_cql_critic_objective(critic.apply, p, obs, action, target, sample_actions,
                                                                  log_density, w, 1.0)[0])(params)

    flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])
    full, down, up = flat(grad_of(quarter, quarter)), flat(grad_of(quarter, zero)), flat(grad_of(zero, quarter))
    # Each half moves the critics, and the full gradient is neither half alone.
    assert np.linalg.norm(down) > 1e-3 and np.linalg.norm(up) > 1e-3
    assert np.linalg.norm(full - down) > 1e-3 and np.linalg.norm(full - up) > 1e-3
    # Independent of autodiff: a central finite difference of the regulariser along the full gradient
    # equals |g|² (a stop-gradient on either half would make the autodiff gradient disagree).
    w = RowWeights(td=zero, push_down=quarter, push_up=quarter, actor=quarter)
    f = lambda p: float(continuous_cql_critic_objective(critic.apply, p, obs, action, target, sample_actions,
                                                        log_density, w, 1.0)[0])
    g = grad_of(quarter, quarter)
    eps = 1e-2 / np.linalg.norm(full)
    shifted = lambda s: jax.tree.map(lambda p, d: p + s * eps * d, params, g)
    fd = (f(shifted(1.0)) - f(shifted(-1.0))) / (2 * eps)
    assert fd == pytest.approx(float(np.dot(full, full)), rel=2e-2)


# --------------------------------------------------------------------------------------------------
# The update
# --------------------------------------------------------------------------------------------------
def _constant_critics(state, values):
    """Critic output layers with kernel 0 and bias ``values`` (one per critic): Q_i ≡ values[i]."""
    critic = jax.tree.map(lambda x: x, state.critic_params)
    out = critic["params"]["critics"]["MLP_0"]["out"]
    out["kernel"] = jnp.zeros_like(out["kernel"])
    out["bias"] = jnp.asarray(values, jnp.float32)[:, None]
    return state.replace(critic_params=critic, critic_target=critic)


def test_update_target_discounts_with_gamma_and_bootstraps_truncations():
    state = _constant_critics(ALGO.init(jax.random.PRNGKey(0), SPEC, ID, ALGO.default_hp(SPEC)), [5.0, 3.0])
    # Row 0: r = 1, truncated (d = 0) → bootstraps; row 1: r = −1, terminal → −1 (and two more rows).
    batch = _batch([1.0, -1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0])
    for gamma in (0.5, 0.99):
        hp = ALGO.default_hp(SPEC).replace(gamma=jnp.float32(gamma))
        _, m = UPDATE(state, batch, jax.random.PRNGKey(1), hp, None)
        # V(o') = min(5, 3) = 3 for any action (no entropy backup by default): y = (1 + 3γ, −1).
        y = np.asarray([1.0 + 3.0 * gamma, -1.0, 0.0, 0.0])
        assert float(m["target_q"]) == pytest.approx(y.mean(), rel=1e-6)
        assert float(m["td_loss"]) == pytest.approx(np.mean((5.0 - y) ** 2) + np.mean((3.0 - y) ** 2), rel=1e-5)
        # Q ≡ c_i: push-up = mean_i c_i = 4, and R_i = LSE_i − c_i is the same for both critics.
        assert float(m["push_up"]) == pytest.approx(4.0, rel=1e-6)


def test_lagrange_multiplier_only_moves_when_enabled():
    hp = ALGO.default_hp(SPEC)
    state = ALGO.init(jax.random.PRNGKey(0), SPEC, ID, hp)
    batch = _batch([0.0, 1.0, 0.5, 0.2], [0.0, 0.0, 1.0, 0.0])
    off, m_off = UPDATE(state, batch, jax.random.PRNGKey(1), hp, None)
    assert float(off.log_alpha_prime) == 0.0 and float(m_off["alpha_prime"]) == 1.0
    # On, with a gap τ = 1e3 far above α·R: L(log α') = −α'·(α R − τ) has a positive gradient, so Adam's
    # first step lowers log α' by exactly its learning rate (3e-4).
    on, _ = UPDATE(state, batch, jax.random.PRNGKey(1),
                   hp.replace(with_lagrange=jnp.float32(1.0), target_action_gap=jnp.float32(1e3)), None)
    assert float(on.log_alpha_prime) == pytest.approx(-3e-4, rel=1e-3)


def test_make_cql_refuses_discrete_and_defaults_to_3x256():
    with pytest.raises(ValueError, match="continuous"):
        make_cql(Spec(S, E, True, 4))
    algo = make_cql(SPEC)
    hp = algo.default_hp(SPEC)
    assert (float(hp.actor_lr), float(hp.critic_lr), float(hp.alpha), float(hp.gamma), float(hp.tau)) == \
        pytest.approx((1e-4, 3e-4, 5.0, 0.99, 0.005))
    state = jax.eval_shape(lambda k: algo.init(k, SPEC, ID, hp), jax.random.PRNGKey(0))
    head = state.actor_params["params"]["EncodedMLP_0"]["MLP_0"]
    assert [head[f"hidden_{i}"]["kernel"].shape[-1] for i in range(3)] == list(SAC_NET.hidden) == [256] * 3
    assert state.critic_params["params"]["critics"]["MLP_0"]["hidden_2"]["kernel"].shape == (2, 256, 256)


def test_vmapped_seeds_equal_sequential_updates():
    hp = ALGO.default_hp(SPEC)
    batch = _batch([0.0, 1.0, 0.5, -0.5], [0.0, 0.0, 1.0, 0.0])
    keys = jax.random.split(jax.random.PRNGKey(7), 2)
    step_keys = jax.random.split(jax.random.PRNGKey(8), 3 * 2).reshape(3, 2, 2)
    # Two seeds vmapped, three updates ...
    together = jax.vmap(lambda k: ALGO.init(k, SPEC, ID, hp))(keys)
    vupdate = jax.jit(jax.vmap(ALGO.update, in_axes=(0, None, 0, None, None)))
    for k in step_keys:
        together, m_together = vupdate(together, batch, k, hp, None)
    # ... equal each seed alone.
    for r in range(2):
        alone = ALGO.init(keys[r], SPEC, ID, hp)
        for k in step_keys:
            alone, m_alone = UPDATE(alone, batch, k[r], hp, None)
        for a, b in zip(jax.tree.leaves((alone, m_alone)), jax.tree.leaves((together, m_together))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b)[r], rtol=2e-5, atol=1e-6)


def test_learns_reach_with_three_alphas_in_one_call():
    """Same seed, α ∈ {1, 5, 10} in one compiled call on the reach task (random success ≈ 1.8 %, the noisy
    behaviour data ≈ 7 %)."""
    real = to_transitions(reach.noisy_expert_dataset(1024))
    spec = Spec(reach.STATE_DIM, reach.NUM_TASKS, False, reach.ACTION_DIM)
    algo = make_cql(spec, SMALL)
    env = reach.ContinuousReachEnv()
    cfg = EngineConfig(batch_size=64, updates_per_interval=200, num_intervals=5, eval_episodes=128)
    trainer = make_train(algo, spec, cfg, {"train": (env, env.default_params())})
    hp = algo.default_hp(spec).replace(actor_lr=jnp.float32(1e-3),
                                       critic_lr=jnp.float32(1e-3), temperature_lr=jnp.float32(1e-3))
    hp = broadcast_runs(hp, 3).replace(alpha=jnp.asarray([1.0, 5.0, 10.0], jnp.float32))
    result = trainer.train(jnp.stack([jax.random.PRNGKey(4)] * 3), hp, real, log=None)
    success, returns = result.success["train"], result.returns["train"]
    # α = 1 solves most tasks (measured 0.88–0.93 for seeds 4 and 11); every α is far above random acting
    # and above the behaviour data on return E[−|a − a*|²]: uniform actions −1.23 (2 · (1/3 + 0.28)), the
    # data −0.32 (noise 0.4² per dimension); measured −0.01 to −0.06.
    assert success[-1, 0] > 0.6, success
    assert np.all(success[-2:].mean(0) > 0.08), success
    assert np.all(returns[-1] > -0.15), returns
    # The conservative gap E[LSE] − E[Q(s, a)] shrinks as α grows.
    gap = result.metrics["conservative_loss"][-1]
    assert gap[0] > gap[1] > gap[2], gap
