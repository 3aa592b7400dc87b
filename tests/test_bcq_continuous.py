"""Continuous BCQ (Fujimoto et al. 2019): losses, target and action selection against hand-computed values,
the reference's defects (γ < 1, truncations bootstrap), vmapped seeds, and learning through the engine.

Hand-computable networks: with empty head widths every head is one Dense layer over
(language encoding ⊕ action or latent), so setting its kernel rows makes an exactly known function —
Q_1(o, a) = w·a, Q_2(o, a) = −w·a, decoder D(o, z) = tanh(z[:A]), no perturbation — or, with a zero
kernel, a constant (its bias).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import toy_continuous_env as reach

from imaginejax.algos.base import Spec
from imaginejax.algos.bcq import ContinuousBCQConfig, make_bcq, select_by_q, soft_clipped_double_q, vae_loss
from imaginejax.algos.bcq_discrete import make_bcq_discrete
from imaginejax.algos.common import DataStats
from imaginejax.algos.networks import NetConfig
from imaginejax.data.transitions import to_transitions
from imaginejax.data.types import Batch
from imaginejax.training.kernel import EngineConfig, broadcast_runs
from imaginejax.training.loop import make_train

S, E, A = 2, 3, 2
WIDTH = 8
NET = NetConfig(encoder_width=WIDTH, hidden=(8,))
LINEAR = ContinuousBCQConfig(vae_hidden=(), perturbation_hidden=(), critic_hidden=())
SPEC = Spec(S, E, False, A)
# One algorithm and its compiled functions for all the unit tests (one compilation each).
ALGO = make_bcq(SPEC, NET, LINEAR)
UPDATE = jax.jit(ALGO.update)
ID = DataStats.identity(S)  # no state normalisation
ACT = jax.jit(ALGO.act, static_argnums=4)


def _batch(reward, terminal=None, seed: int = 0) -> Batch:
    reward = jnp.asarray(reward, jnp.float32)
    b = reward.shape[0]
    terminal = jnp.zeros((b,)) if terminal is None else terminal
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    return Batch(state=jax.random.normal(k[0], (b, S)), embedding=jax.random.normal(k[1], (b, E)),
                 action=jax.random.uniform(k[2], (b, A), minval=-1.0, maxval=1.0), reward=reward,
                 next_state=jax.random.normal(k[3], (b, S)), terminal=jnp.asarray(terminal, jnp.float32),
                 imaginary=jnp.zeros((b,), bool))


def _copy(tree):
    return jax.tree.map(lambda x: x, tree)


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# --------------------------------------------------------------------------------------------------
# pure pieces
# --------------------------------------------------------------------------------------------------
def test_vae_loss_hand_computed():
    recon, action = jnp.asarray([[0.5, -0.5]]), jnp.asarray([[0.0, 0.5]])
    mean, log_std = jnp.asarray([[1.0, 0.0]]), jnp.asarray([[0.0, np.log(2.0)]])
    loss, m = vae_loss(recon, action, mean, log_std, 0.5)
    # Reconstruction: mean of (0.25, 1.0) = 0.625.
    # KL per latent dim −½(1 + 2 log σ − μ² − σ²): dim 0 (μ 1, σ 1): 0.5; dim 1 (μ 0, σ 2):
    # −½(1 + 2 ln 2 − 4) = 0.80685282; mean 0.65342641.  Loss 0.625 + 0.5 · 0.65342641 = 0.95171321.
    assert m["reconstruction_loss"] == pytest.approx(0.625, rel=1e-6)
    assert m["kl"] == pytest.approx(0.65342641, rel=1e-6)
    assert float(loss) == pytest.approx(0.95171321, rel=1e-6)
    # The KL term vanishes, with zero gradient, at the prior μ = 0, σ = 1.
    kl = lambda mu, ls: vae_loss(action, action, mu, ls, 1.0)[0]
    zeros = jnp.zeros((1, 2))
    assert float(kl(zeros, zeros)) == 0.0
    for g in jax.grad(kl, argnums=(0, 1))(zeros, zeros):
        np.testing.assert_allclose(g, 0.0, atol=1e-7)


def test_soft_clipped_double_q_hand_computed():
    # Twin values of 3 candidates for one state: Q1 = (1, 4, 0), Q2 = (3, 2, −1).
    q = jnp.asarray([[[1.0, 4.0, 0.0]], [[3.0, 2.0, -1.0]]])
    # min = (1, 2, −1), max = (3, 4, 0); λ = 0.75: (1.5, 2.5, −0.75) → max over candidates 2.5.
    assert float(soft_clipped_double_q(q, 0.75)[0]) == pytest.approx(2.5)
    assert float(soft_clipped_double_q(q, 1.0)[0]) == pytest.approx(2.0)  # TD3's clipped minimum
    assert float(soft_clipped_double_q(q, 0.0)[0]) == pytest.approx(4.0)  # plain max


def test_select_by_q():
    cands = jnp.asarray([[[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], [[-1.0, 1.0], [0.0, 0.0], [1.0, -1.0]]])
    q1 = jnp.asarray([[0.0, 2.0, 1.0], [5.0, -1.0, 4.9]])
    np.testing.assert_array_equal(select_by_q(cands, q1), np.asarray([[0.3, 0.4], [-1.0, 1.0]], np.float32))


def test_refuses_discrete_spec_and_keeps_discrete_bcq():
    with pytest.raises(ValueError, match="continuous"):
        make_bcq(Spec(S, E, True, 4), NET)
    with pytest.raises(ValueError, match="latent_dim"):
        make_bcq(SPEC, NET, ContinuousBCQConfig(latent_dim=0))
    assert make_bcq_discrete(Spec(S, E, True, 4), NET).name == "bcq_discrete"


# --------------------------------------------------------------------------------------------------
# the update and act with known networks
# --------------------------------------------------------------------------------------------------
def _linear_state(algo, w=(1.0, 1.0)):
    """Q1 = w·a, Q2 = −w·a, D(o, z) = tanh(z[:A]), ξ ≡ 0 (see the module docstring)."""
    state = algo.init(jax.random.PRNGKey(0), SPEC, ID, algo.default_hp(SPEC))
    critic = _copy(state.critic_params)
    out = critic["params"]["critics"]["MLP_0"]["out"]
    kernel = np.zeros(out["kernel"].shape, np.float32)  # (2, WIDTH + A, 1)
    kernel[0, WIDTH:, 0], kernel[1, WIDTH:, 0] = w, -np.asarray(w)
    out["kernel"], out["bias"] = jnp.asarray(kernel), jnp.zeros_like(out["bias"])
    vae = _copy(state.vae_params)
    dec = vae["params"]["decoder_head"]["out"]
    kernel = np.zeros(dec["kernel"].shape, np.float32)  # (WIDTH + L, A)
    kernel[WIDTH + np.arange(A), np.arange(A)] = 1.0
    dec["kernel"], dec["bias"] = jnp.asarray(kernel), jnp.zeros_like(dec["bias"])
    actor = _copy(state.actor_params)
    pert = actor["params"]["MLP_0"]["out"]
    pert["kernel"], pert["bias"] = jnp.zeros_like(pert["kernel"]), jnp.zeros_like(pert["bias"])
    return state.replace(critic_params=critic, critic_target=critic, vae_params=vae, actor_params=actor,
                         actor_target=actor)


def test_act_is_the_argmax_of_q1_over_clipped_prior_samples():
    hp = ALGO.default_hp(SPEC)
    state = _linear_state(ALGO)
    obs = _batch(jnp.zeros(6)).observation
    action = ACT(state, obs, jax.random.PRNGKey(1), hp, True)
    # Candidates are tanh(clip(z, −0.5, 0.5)); Q1 = a_0 + a_1 is largest where both latents hit the clip
    # (each does with probability 0.31, so among 100 draws almost surely): a = (tanh 0.5, tanh 0.5).
    # Ranking by min(Q1, Q2) = −|a_0 + a_1| would pick a candidate near a_0 = −a_1 instead.
    np.testing.assert_allclose(action, np.full((6, A), np.tanh(0.5)), rtol=1e-6)
    # c = 0.2 bounds every candidate, hence the chosen action, by tanh 0.2.
    tight = ACT(state, obs, jax.random.PRNGKey(1), hp.replace(latent_clip=jnp.float32(0.2)), True)
    np.testing.assert_allclose(tight, np.full((6, A), np.tanh(0.2)), rtol=1e-6)


def test_perturbation_is_bounded_by_phi_and_clipped():
    hp = ALGO.default_hp(SPEC)
    state = _linear_state(ALGO)
    actor = _copy(state.actor_params)
    actor["params"]["MLP_0"]["out"]["bias"] = jnp.asarray([30.0, -30.0])  # tanh saturates: ξ = (Φ, −Φ)
    state = state.replace(actor_params=actor)
    # With ξ = (+Φ, −Φ) every candidate moves by (+0.05, −0.05) and is clipped to [−1, 1]; the best by
    # Q1 = a_0 + a_1 is still the doubly clipped latent: (tanh 0.5 + 0.05, tanh 0.5 − 0.05).
    obs = _batch(jnp.zeros(6)).observation
    out = ACT(state, obs, jax.random.PRNGKey(2), hp, True)
    np.testing.assert_allclose(out, np.tile([np.tanh(0.5) + 0.05, np.tanh(0.5) - 0.05], (6, 1)), rtol=1e-6)
    # Φ = 0.6 would push a_0 = tanh 0.5 + 0.6 > 1: clipped to exactly 1.
    big = ACT(state, obs, jax.random.PRNGKey(2), hp.replace(max_perturbation=jnp.float32(0.6)), True)
    np.testing.assert_allclose(big[:, 0], 1.0)
    np.testing.assert_allclose(big[:, 1], np.tanh(0.5) - 0.6, rtol=1e-6)


def _constant_critics(algo, values=(5.0, 3.0)):
    """Q_i ≡ values[i] for every (o, a)."""
    state = algo.init(jax.random.PRNGKey(0), SPEC, ID, algo.default_hp(SPEC))
    critic = _copy(state.critic_params)
    out = critic["params"]["critics"]["MLP_0"]["out"]
    out["kernel"] = jnp.zeros_like(out["kernel"])
    out["bias"] = jnp.asarray(values, jnp.float32)[:, None]
    return state.replace(critic_params=critic, critic_target=critic)


@pytest.mark.parametrize("gamma", [0.5, 0.99])
def test_target_soft_clipped_discounted_and_truncation_bootstraps(gamma):
    """Target critics ≡ (5, 3): soft clipped value 0.75 · 3 + 0.25 · 5 = 3.5 for every candidate."""
    state = _constant_critics(ALGO)
    hp = ALGO.default_hp(SPEC).replace(gamma=jnp.float32(gamma))
    # Row 0: r = 1, truncated (d = 0) → 1 + γ · 3.5; row 1: r = −1, terminal → −1.
    _, m = UPDATE(state, _batch([1.0, -1.0], [0.0, 1.0]), jax.random.PRNGKey(1), hp, None)
    y = np.asarray([1.0 + gamma * 3.5, -1.0])
    assert m["target_q"] == pytest.approx(y.mean(), rel=1e-6)
    # (the reference's γ = 1 with every end terminal would give y = (1, −1))
    assert m["critic_loss"] == pytest.approx(np.mean((5.0 - y) ** 2) + np.mean((3.0 - y) ** 2), rel=1e-5)
    # The actor maximises Q1 (≡ 5 here; not the minimum 3) through the just-updated critic; its loss is
    # −Q1 of the perturbed samples: 5 moved by one Adam step of 1e-3 on the head (at most 1e-3 per
    # parameter: |ΔQ1| ≤ 1e-3 · (1 + Σ|h| + Σ|a|) ≤ 0.011 with 8 tanh features and 2 actions).
    assert m["actor_loss"] == pytest.approx(-5.0, abs=0.011)
    assert m["q1_data"] == pytest.approx(5.0)


def test_one_update_moves_every_network_and_polyak_targets():
    hp = ALGO.default_hp(SPEC)
    state0 = ALGO.init(jax.random.PRNGKey(0), SPEC, ID, hp)
    state1, m = UPDATE(state0, _batch([1.0, -1.0], [0.0, 1.0]), jax.random.PRNGKey(1), hp, None)
    for name in ("vae_params", "actor_params", "critic_params"):
        assert not _same(getattr(state1, name), getattr(state0, name)), name
    # θ' ← 0.995 θ' + 0.005 θ and φ' ← 0.995 φ' + 0.005 φ on every update (no delay in BCQ).
    for target, online in (("actor_target", "actor_params"), ("critic_target", "critic_params")):
        for t1, t0, p in zip(jax.tree.leaves(getattr(state1, target)), jax.tree.leaves(getattr(state0, target)),
                             jax.tree.leaves(getattr(state1, online))):
            np.testing.assert_allclose(t1, 0.995 * t0 + 0.005 * p, rtol=1e-6, atol=1e-7)
    assert int(state1.step) == 1
    # L = 2·A latent: the encoder emits μ and log σ, 2L = 8 numbers.
    assert state0.vae_params["params"]["encoder_head"]["out"]["bias"].shape == (4 * A,)
    assert np.isfinite([float(v) for v in m.values()]).all()


def test_vmapped_seeds_equal_sequential_updates():
    hp = ALGO.default_hp(SPEC)
    batch = _batch([1.0, -1.0], [0.0, 1.0])

    def run(key):
        def step(state, k):
            return ALGO.update(state, batch, k, hp, None)

        return jax.lax.scan(step, ALGO.init(key, SPEC, ID, hp), jax.random.split(key, 3))  # 3 updates

    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    together = jax.jit(jax.vmap(run))(keys)
    single = jax.jit(run)
    for r in range(3):
        alone = single(keys[r])
        for a, b in zip(jax.tree.leaves(alone), jax.tree.leaves(together)):
            np.testing.assert_allclose(a, np.asarray(b)[r], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# learning through the engine
# --------------------------------------------------------------------------------------------------
def test_learns_continuous_reach_through_the_engine():
    """Noisy reach data (random success ≈ 1.8 %, the data itself ≈ 7 %), 800 updates at batch 64."""
    real = to_transitions(reach.noisy_expert_dataset(1024))
    spec = Spec(reach.STATE_DIM, reach.NUM_TASKS, False, reach.ACTION_DIM)
    algo = make_bcq(spec, NetConfig(encoder_width=32),
                    ContinuousBCQConfig(vae_hidden=(64, 64), perturbation_hidden=(32,), critic_hidden=(32,)))
    env = reach.ContinuousReachEnv()
    cfg = EngineConfig(batch_size=64, updates_per_interval=200, num_intervals=4, eval_episodes=128)
    trainer = make_train(algo, spec, cfg, {"train": (env, env.default_params())})
    result = trainer.train(jax.random.split(jax.random.PRNGKey(4), 2), broadcast_runs(algo.default_hp(spec), 2),
                           real, log=None)
    assert result.success["train"][-1].min() > 0.6, result.success["train"]
    # The critic fits r = −‖a − a*‖² (one-step episodes: y = r), mean ≈ −0.26 on this data.
    np.testing.assert_allclose(result.metrics["target_q"][-1], -0.26, atol=0.03)
