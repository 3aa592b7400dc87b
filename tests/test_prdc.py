"""PRDC (Ran et al. 2023), continuous and discrete, and its in-graph nearest-neighbour search.

* The chunked search against a float64 NumPy brute force on random data: the same rows (exact index
  match) and distances, across chunk boundaries, for sizes that are not a multiple of the chunk, smaller
  than one block, with the embedding distance folded into the product or gathered, continuous and
  one-hot actions, ties, and the real/imaginary selection.
* The updates with a constant actor (so π is known): the regulariser's target is the NumPy neighbour's
  action; invariants that hold whenever the batch rows are dataset rows (the neighbour is at least as
  close as the row itself): MSE to the neighbour ≤ MSE to the data action, CE to it ≤ CE to the data.
* TD3+BC's defect checks on PRDC's critic (γ < 1, a truncation bootstraps).
* Learning through the engine, three α values in one call each (continuous reach, discrete toy with a
  wrong majority action), and vmapped seeds against sequential runs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import toy_continuous_env as reach
from toy_env import NUM_TASKS, STATE_DIM, ToyEnv, expert_dataset

from imaginejax.algos import neighbors
from imaginejax.algos.base import Spec
from imaginejax.algos.common import Datasets, DataStats
from imaginejax.algos.neighbors import nearest_neighbor, nearest_row
from imaginejax.algos.networks import NetConfig
from imaginejax.algos.prdc import make_prdc
from imaginejax.algos.prdc_discrete import make_prdc_discrete
from imaginejax.data.transitions import to_transitions
from imaginejax.data.types import Batch, Transitions
from imaginejax.training.kernel import EngineConfig, broadcast_runs
from imaginejax.training.loop import make_train

S, E, A, N_ACT = 3, 4, 2, 4
NET = NetConfig(encoder_width=8, hidden=(8,))
SMALL = NetConfig(encoder_width=32, hidden=(32,))


# --------------------------------------------------------------------------------------------------
# helpers: random buffers and the float64 brute-force reference
# --------------------------------------------------------------------------------------------------
def _buffer(rng: np.random.Generator, k: int, m: int, discrete: bool) -> Transitions:
    action = (rng.integers(0, N_ACT, k).astype(np.int32) if discrete
              else rng.uniform(-1, 1, (k, A)).astype(np.float32))
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return Transitions(state=f32(rng.normal(size=(k, S))), action=jnp.asarray(action), reward=f32(rng.normal(size=k)),
                       next_state=f32(rng.normal(size=(k, S))), terminal=jnp.zeros((k,), jnp.float32),
                       instruction=jnp.asarray(rng.integers(0, m, k), jnp.int32), goal=jnp.zeros((k, 1), jnp.float32),
                       embeddings=f32(rng.normal(size=(m, E))))


def _normalizer(rng: np.random.Generator) -> DataStats:
    return DataStats(mean=jnp.asarray(rng.normal(size=S), jnp.float32),
                           std=jnp.asarray(rng.uniform(0.5, 2.0, S), jnp.float32))


def _reference(qs, qe, qa, data: Transitions, norm: DataStats, beta: float,
               discrete: bool) -> tuple[np.ndarray, np.ndarray]:
    """Float64 brute force: (all distances (B, K), argmin (B,)) of
    ‖(β s̃, β e, α) − (β s̃_j, β e_j, φ(a_j))‖²."""
    f = lambda x: np.asarray(x, np.float64)
    mu, sd = f(norm.mean), f(norm.std)
    a = f(np.eye(N_ACT)[np.asarray(data.action)]) if discrete else f(data.action)
    embedding = f(data.embeddings)[np.asarray(data.instruction)]
    keys = np.concatenate([beta * (f(data.state) - mu) / sd, beta * embedding, a], -1)
    query = np.concatenate([beta * (f(qs) - mu) / sd, beta * f(qe), f(qa)], -1)
    d = ((query[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    return d, d.argmin(1)


def _queries(rng: np.random.Generator, data: Transitions, b: int, discrete: bool):
    """B queries; the first few sit exactly on dataset rows (distance 0 to them)."""
    qs = rng.normal(size=(b, S)).astype(np.float32)
    qe = rng.normal(size=(b, E)).astype(np.float32)
    if discrete:
        qa = rng.dirichlet(np.ones(N_ACT), b).astype(np.float32)
    else:
        qa = rng.uniform(-1, 1, (b, A)).astype(np.float32)
    rows = rng.integers(0, data.state.shape[0], 3)
    qs[:3] = np.asarray(data.state)[rows]
    qe[:3] = np.asarray(data.embeddings)[np.asarray(data.instruction)[rows]]
    qa[:3] = np.eye(N_ACT)[np.asarray(data.action)[rows]] if discrete else np.asarray(data.action)[rows]
    return jnp.asarray(qs), jnp.asarray(qe), jnp.asarray(qa)


# --------------------------------------------------------------------------------------------------
# the search
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k, chunk, m, discrete", [
    (1000, 128, 5, False),   # 7 full chunks + a last one shifted back (1000 = 7·128 + 104)
    (1024, 256, 5, True),    # a multiple of the chunk; one-hot actions
    (40, 4096, 5, False),    # fewer rows than one block
    (700, 100, 80, True),    # chunk rounded to 64; 80 instructions: embedding distance gathered, not folded
    (129, 64, 3, False),     # one row past two chunks
])
def test_nearest_row_matches_numpy_brute_force(k, chunk, m, discrete):
    rng = np.random.default_rng(k)
    data, norm = _buffer(rng, k, m, discrete), _normalizer(rng)
    qs, qe, qa = _queries(rng, data, 37, discrete)
    search = jax.jit(lambda *a: nearest_row(*a, chunk=chunk, num_actions=N_ACT if discrete else None))
    distance, index = search(qs, qe, qa, data, norm, jnp.float32(2.0))
    d_ref, i_ref = _reference(qs, qe, qa, data, norm, 2.0, discrete)
    np.testing.assert_array_equal(index, i_ref)
    np.testing.assert_allclose(distance, d_ref.min(1), rtol=1e-5, atol=1e-5)
    assert float(distance[:3].max()) < 1e-5  # queries placed on dataset rows find them


def test_ties_resolve_to_the_lowest_row_across_chunks():
    rng = np.random.default_rng(0)
    data = _buffer(rng, 300, 2, False)
    # Rows 10, 150 and 290 identical (in three different chunks of 64, 290 in the shifted last chunk).
    copy = lambda x: x.at[150].set(x[10]).at[290].set(x[10])
    data = data.replace(state=copy(data.state), action=copy(data.action), instruction=copy(data.instruction))
    qs = data.state[10][None] + 1e-3
    qe = data.embeddings[data.instruction[10]][None]
    _, index = nearest_row(qs, qe, data.action[10][None], data, DataStats.identity(S), 2.0, chunk=64)
    assert int(index[0]) == 10


def test_nearest_neighbor_searches_only_the_allowed_buffers():
    rng = np.random.default_rng(1)
    real, imag = _buffer(rng, 500, 4, False), _buffer(rng, 300, 6, False)
    norm = _normalizer(rng)
    qs, qe, qa = _queries(rng, imag, 29, False)  # the first 3 sit on imaginary rows
    data = Datasets.of(real, imag)
    search = jax.jit(lambda ur, ui: nearest_neighbor(qs, qe, qa, data, norm, 2.0, chunk=128, use_real=ur, use_imag=ui))
    d_r, i_r = _reference(qs, qe, qa, real, norm, 2.0, False)
    d_i, i_i = _reference(qs, qe, qa, imag, norm, 2.0, False)
    both = search(True, True)
    from_imag = d_i.min(1) < d_r.min(1)
    np.testing.assert_array_equal(both.imaginary, from_imag)
    assert from_imag[:3].all() and not from_imag.all()  # a real mix of both buffers
    np.testing.assert_array_equal(both.index, np.where(from_imag, i_i, i_r))
    np.testing.assert_allclose(both.distance, np.minimum(d_r.min(1), d_i.min(1)), rtol=1e-5, atol=1e-5)
    expected_action = np.where(from_imag[:, None], np.asarray(imag.action)[i_i], np.asarray(real.action)[i_r])
    np.testing.assert_array_equal(both.action, expected_action)
    real_only, imag_only = search(True, False), search(False, True)
    assert not bool(real_only.imaginary.any()) and bool(imag_only.imaginary.all())
    np.testing.assert_array_equal(real_only.index, i_r)
    np.testing.assert_array_equal(imag_only.index, i_i)


def test_subset_search_is_exact_within_the_drawn_rows():
    rng = np.random.default_rng(10)
    real, imag = _buffer(rng, 600, 3, False), _buffer(rng, 50, 2, False)
    norm = _normalizer(rng)
    qs, qe, qa = _queries(rng, real, 21, False)
    data, key = Datasets.of(real, imag), jax.random.PRNGKey(3)
    approx = nearest_neighbor(qs, qe, qa, data, norm, 2.0, chunk=64, use_imag=False, subset=100, key=key)
    _, rows = neighbors.random_rows(jax.random.split(key)[0], real, 100)
    d, j = _reference(qs, qe, qa, real, norm, 2.0, False)
    rows = np.asarray(rows)
    np.testing.assert_array_equal(approx.index, rows[d[:, rows].argmin(1)])
    assert (np.asarray(approx.distance) >= d.min(1) - 1e-5).all()  # never better than the exact neighbour
    # A subset at least as large as a buffer searches all of it: exact.
    exact = nearest_neighbor(qs, qe, qa, data, norm, 2.0, chunk=64, use_real=False, subset=50, key=key)
    np.testing.assert_array_equal(exact.index, _reference(qs, qe, qa, imag, norm, 2.0, False)[1])
    with pytest.raises(ValueError, match="key"):
        nearest_neighbor(qs, qe, qa, data, norm, 2.0, chunk=64, subset=10)
    # With the queries' own rows as extra candidates (PRDC passes its batch), the result is never farther
    # than the own row, and a winning candidate reports index −1 and the candidate's source flag.
    rows = np.arange(21) * 7
    own = neighbors.rows_as_buffer(real.state[rows], real.embeddings[real.instruction[rows]], real.action[rows])
    flags = jnp.asarray(np.arange(21) % 2 == 0)
    qs_own, qe_own = real.state[rows], real.embeddings[real.instruction[rows]]
    qa_own = real.action[rows] + 0.05  # the policy near the data action
    mixed = nearest_neighbor(qs_own, qe_own, qa_own, data, norm, 2.0, chunk=64, use_imag=False, subset=20, key=key,
                             candidates=(own, flags))
    own_distance = np.sum(0.05 ** 2 * np.ones((21, A)), -1)
    assert (np.asarray(mixed.distance) <= own_distance + 1e-6).all()
    from_batch = np.asarray(mixed.index) == -1
    assert from_batch.any()
    np.testing.assert_array_equal(np.asarray(mixed.imaginary)[from_batch], np.asarray(flags)[from_batch])
    d_own, _ = _reference(qs_own, qe_own, qa_own, real, norm, 2.0, False)
    assert (np.asarray(mixed.distance) >= d_own.min(1) - 1e-5).all()


def test_search_rejects_bad_arguments():
    rng = np.random.default_rng(2)
    data = _buffer(rng, 50, 2, True)
    qs, qe, qa = _queries(rng, data, 4, True)
    with pytest.raises(ValueError, match="num_actions"):
        nearest_row(qs, qe, qa, data, DataStats.identity(S), 2.0, chunk=16)  # discrete data, no n
    with pytest.raises(ValueError, match="chunk"):
        nearest_row(qs, qe, qa, data, DataStats.identity(S), 2.0, chunk=0, num_actions=N_ACT)
    with pytest.raises(ValueError, match="chunk"):
        make_prdc(Spec(S, E, False, A), NET, chunk=0)
    with pytest.raises(ValueError, match="subset"):
        make_prdc_discrete(Spec(S, E, True, N_ACT), NET, subset=0)


def test_memory_is_per_chunk_not_per_dataset():
    """The compiled search holds no (B, K) array: its largest temporary is O(B · chunk)."""
    rng = np.random.default_rng(3)
    data = _buffer(rng, 20000, 3, False)
    qs, qe, qa = _queries(rng, data, 64, False)
    args = (qs, qe, qa, data, DataStats.identity(S), jnp.float32(2.0))
    compiled = jax.jit(lambda *a: nearest_row(*a, chunk=512)).lower(*args).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp < 64 * 20000 * 4 / 4, temp  # well below one (B, K) float32 matrix (5.1 MB)


# --------------------------------------------------------------------------------------------------
# the updates with a known policy
# --------------------------------------------------------------------------------------------------
def _dataset_batch(data: Transitions, rows: np.ndarray, imaginary: bool = False) -> Batch:
    """A batch made of dataset rows (so each row is itself a candidate neighbour)."""
    return Batch(state=data.state[rows], embedding=data.embeddings[data.instruction[rows]], action=data.action[rows],
                 reward=data.reward[rows], next_state=data.next_state[rows], terminal=data.terminal[rows],
                 imaginary=jnp.full((len(rows),), imaginary))


def _constant_actor(state, bias):
    params = jax.tree.map(lambda x: x, state.actor_params)
    out = params["params"]["MLP_0"]["out"]
    out["kernel"] = jnp.zeros_like(out["kernel"])
    out["bias"] = jnp.asarray(bias, jnp.float32)
    return state.replace(actor_params=params)


# One continuous PRDC, buffer and compiled update shared by the update tests (one compilation).
C_SPEC = Spec(S, E, False, A)
C_ALGO = make_prdc(C_SPEC, NET, chunk=128)
C_UPDATE = jax.jit(C_ALGO.update)
C_REAL = _buffer(np.random.default_rng(4), 700, 3, False)
C_PLACEHOLDER = jax.tree.map(lambda x: jnp.zeros((1,) + x.shape[1:], x.dtype), C_REAL)


def test_prdc_regularises_towards_the_numpy_neighbour():
    algo, spec, real = C_ALGO, C_SPEC, C_REAL
    rng = np.random.default_rng(4)
    norm = DataStats.from_transitions(real)
    hp = algo.default_hp(spec).replace(beta=jnp.float32(1.5))
    state = _constant_actor(algo.init(jax.random.PRNGKey(0), spec, norm, hp), [0.3, -0.8])  # π ≡ tanh(0.3, −0.8)
    batch = _dataset_batch(real, rng.integers(0, 700, 32))
    with pytest.raises(TypeError, match="data"):
        algo.update(state, batch, jax.random.PRNGKey(1), hp)  # the datasets are a required argument
    _, m = C_UPDATE(state, batch, jax.random.PRNGKey(1), hp, Datasets.of(real, C_PLACEHOLDER))
    pi = np.tanh(np.asarray([[0.3, -0.8]] * 32))
    d, nn = _reference(batch.state, batch.embedding, pi, real, norm, 1.5, False)
    a_nn = np.asarray(real.action)[nn]
    assert m["bc_mse"] == pytest.approx(np.mean((pi - a_nn) ** 2), rel=1e-5)
    assert m["nn_distance"] == pytest.approx(d.min(1).mean(), rel=1e-5)
    assert m["data_mse"] == pytest.approx(np.mean((pi - np.asarray(batch.action)) ** 2), rel=1e-5)
    assert m["bc_mse"] <= m["data_mse"]  # each batch row is itself a candidate
    assert float(m["nn_imaginary"]) == 0.0


def test_discrete_prdc_cross_entropy_to_the_numpy_neighbour_and_its_target():
    spec = Spec(S, E, True, N_ACT)
    algo = make_prdc_discrete(spec, NET, chunk=64)
    rng = np.random.default_rng(5)
    real, imag = _buffer(rng, 300, 3, True), _buffer(rng, 200, 2, True)
    hp, norm = algo.default_hp(spec), DataStats.from_transitions(real)
    logits = np.asarray([1.0, 0.0, -1.0, 0.5], np.float32)
    state = _constant_actor(algo.init(jax.random.PRNGKey(0), spec, norm, hp), logits)
    p = np.exp(logits) / np.exp(logits).sum()
    update = jax.jit(algo.update)
    both = Datasets.of(real, imag)
    # A real batch searches the real buffer only; an imaginary batch the imaginary buffer only.
    for data, imaginary in ((real, False), (imag, True)):
        batch = _dataset_batch(data, rng.integers(0, data.state.shape[0], 16), imaginary)
        _, m = update(state, batch, jax.random.PRNGKey(1), hp, both)
        _, nn = _reference(batch.state, batch.embedding, np.tile(p, (16, 1)), data, norm, 2.0, True)
        a_nn = np.asarray(data.action)[nn]
        assert m["cross_entropy"] == pytest.approx(-np.log(p[a_nn]).mean(), rel=1e-5)
        assert m["policy_accuracy"] == pytest.approx(np.mean(a_nn == 0))  # argmax π = action 0
        assert m["cross_entropy"] <= m["data_cross_entropy"] + 1e-6
        assert float(m["nn_imaginary"]) == float(imaginary)

    # The critic is discrete TD3+BC's: with target critics ≡ Q1 = (1, 2, 3, 4), Q2 = (2, 1, 5, 0) and the
    # target policy π' ≡ p, V' = Σ_a p_a min(Q1, Q2)_a; y = r + γ (1 − d) V' with γ = 0.9 (not 1) and the
    # bootstrap cut only on terminal rows (truncated rows bootstrap).
    critic = jax.tree.map(lambda x: x, state.critic_params)
    out = critic["params"]["critics"]["MLP_0"]["out"]
    out["kernel"] = jnp.zeros_like(out["kernel"])
    out["bias"] = jnp.asarray([[1.0, 2.0, 3.0, 4.0], [2.0, 1.0, 5.0, 0.0]])
    state = state.replace(critic_params=critic, critic_target=critic, actor_target=state.actor_params)
    reward, terminal = np.linspace(-1, 1, 16), (np.arange(16) % 3 == 0).astype(np.float32)
    batch = _dataset_batch(real, np.arange(16)).replace(reward=jnp.asarray(reward, jnp.float32),
                                                         terminal=jnp.asarray(terminal))
    _, m = update(state, batch, jax.random.PRNGKey(2), hp.replace(gamma=jnp.float32(0.9)), both)
    y = reward + 0.9 * (1.0 - terminal) * float(p @ np.asarray([1.0, 1.0, 3.0, 0.0]))
    assert m["target_q"] == pytest.approx(y.mean(), rel=1e-5)


@pytest.mark.parametrize("gamma", [0.5, 0.99])
def test_prdc_critic_target_discounts_and_bootstraps_truncations(gamma):
    """Target critics ≡ (5, 3): y = r + γ (1 − d) · 3, with d = 1 only on the terminal row."""
    algo, spec, real = C_ALGO, C_SPEC, C_REAL
    hp = algo.default_hp(spec).replace(gamma=jnp.float32(gamma))
    state = algo.init(jax.random.PRNGKey(0), spec, DataStats.identity(S), hp)
    critic = jax.tree.map(lambda x: x, state.critic_params)
    out = critic["params"]["critics"]["MLP_0"]["out"]
    out["kernel"], out["bias"] = jnp.zeros_like(out["kernel"]), jnp.asarray([[5.0], [3.0]])
    state = state.replace(critic_params=critic, critic_target=critic)
    # 32 dataset rows; r = ±1 alternating, every 4th row terminal, the others truncated or mid-episode.
    reward, terminal = np.tile([1.0, -1.0], 16), (np.arange(32) % 4 == 0).astype(np.float32)
    batch = _dataset_batch(real, np.arange(32)).replace(reward=jnp.asarray(reward, jnp.float32),
                                                         terminal=jnp.asarray(terminal))
    _, m = C_UPDATE(state, batch, jax.random.PRNGKey(1), hp, Datasets.of(real, C_PLACEHOLDER))
    y = reward + gamma * (1.0 - terminal) * 3.0
    assert m["target_q"] == pytest.approx(y.mean(), rel=1e-6)
    assert m["critic_loss"] == pytest.approx(np.mean((5.0 - y) ** 2) + np.mean((3.0 - y) ** 2), rel=1e-5)


def test_vmapped_seeds_equal_sequential_updates():
    spec = Spec(S, E, False, A)
    algo = make_prdc(spec, NET, chunk=64)
    rng = np.random.default_rng(7)
    real = _buffer(rng, 200, 2, False)
    hp = algo.default_hp(spec).replace(actor_lr=jnp.float32(1e-2))
    batch = _dataset_batch(real, rng.integers(0, 200, 16))

    def run(key):
        def step(state, k):
            return algo.update(state, batch, k, hp, Datasets.of(real, real))

        state = algo.init(key, spec, DataStats.identity(S), hp)
        return jax.lax.scan(step, state, jax.random.split(key, 4))  # 2 actor steps

    keys = jax.random.split(jax.random.PRNGKey(8), 3)
    together = jax.jit(jax.vmap(run))(keys)
    single = jax.jit(run)
    for r in range(3):
        for a, b in zip(jax.tree.leaves(single(keys[r])), jax.tree.leaves(together)):
            np.testing.assert_allclose(a, np.asarray(b)[r], rtol=1e-5, atol=1e-6)


def test_make_functions_refuse_the_wrong_action_space():
    with pytest.raises(ValueError, match="continuous"):
        make_prdc(Spec(S, E, True, N_ACT), NET)
    with pytest.raises(ValueError, match="discrete"):
        make_prdc_discrete(Spec(S, E, False, A), NET)


# --------------------------------------------------------------------------------------------------
# learning through the engine, three α per call
# --------------------------------------------------------------------------------------------------
def test_prdc_three_alphas_on_continuous_reach():
    """α = 0 is the dataset constraint alone: π(s) only moves to the nearest dataset action, which here
    (noisy data all around a*) keeps it near where it started; α = 2.5 and 40 follow Q to a*.
    The neighbours come from the real and the imaginary buffer (both in the batches' support)."""
    spec = Spec(reach.STATE_DIM, reach.NUM_TASKS, False, reach.ACTION_DIM)
    real = to_transitions(reach.noisy_expert_dataset(1024))
    algo = make_prdc(spec, SMALL)
    env = reach.ContinuousReachEnv()
    cfg = EngineConfig(batch_size=64, updates_per_interval=200, num_intervals=4, eval_episodes=128)
    trainer = make_train(algo, spec, cfg, {"train": (env, env.default_params())})
    hp = broadcast_runs(algo.default_hp(spec).replace(actor_lr=jnp.float32(1e-3), critic_lr=jnp.float32(1e-3)), 3)
    hp = hp.replace(alpha=jnp.asarray([0.0, 2.5, 40.0], jnp.float32))
    keys = jnp.stack([jax.random.PRNGKey(4)] * 3)  # same seed: only α differs
    with pytest.raises(ValueError, match="imaginary"):
        trainer.train(keys, hp, real, ratio=0.5, log=None)
    # A second buffer of the same task as "imaginary" data, a quarter of every batch: the engine's own
    # imag argument is what the search sees.
    imag = to_transitions(dataclasses.replace(reach.noisy_expert_dataset(512, seed=1), source="imaginary"))
    result = trainer.train(keys, hp, real, imag, ratio=0.25, log=None)
    success = result.success["train"][-1]
    assert success[1] > 0.6 and success[2] > 0.6 and success[0] < 0.5, result.success["train"]
    m = {k: v[-1] for k, v in result.metrics.items()}
    assert (m["bc_mse"] <= m["data_mse"]).all(), m  # the neighbour is never farther than the row itself
    assert ((m["nn_imaginary"] > 0.05) & (m["nn_imaginary"] < 0.95)).all(), m  # both buffers searched
    np.testing.assert_allclose(m["lambda"][0], 0.0)


def test_discrete_prdc_three_alphas_with_a_wrong_majority():
    """60 % of the data takes the wrong action task + 1 (reward 0), 40 % the right one (reward 1).

    α = 2.5 and 40 use the reward. α = 0 is the constraint alone: the neighbour of (s, π(·|s)) is the
    data action at s that π already prefers, so π stays on one of the two actions the data took for the
    instruction (never an unseen one) but does not prefer the rewarded one.
    """
    spec = Spec(STATE_DIM, NUM_TASKS, True, NUM_TASKS)
    ds = expert_dataset(512)
    wrong = np.random.default_rng(1).random(512) < 0.6
    actions = np.where(wrong[:, None], (ds.actions + 1) % NUM_TASKS, ds.actions).astype(np.int32)
    rewards = (actions == ds.instruction_ids[:, None]).astype(np.float32)
    real = to_transitions(dataclasses.replace(ds, actions=actions, rewards=rewards))
    algo = make_prdc_discrete(spec, SMALL)
    env = ToyEnv()
    cfg = EngineConfig(batch_size=32, updates_per_interval=100, num_intervals=4, eval_episodes=128)
    trainer = make_train(algo, spec, cfg, {"train": (env, env.default_params())})
    hp = algo.default_hp(spec).replace(actor_lr=jnp.float32(1e-3), critic_lr=jnp.float32(1e-3))
    hp = broadcast_runs(hp, 3).replace(alpha=jnp.asarray([0.0, 2.5, 40.0], jnp.float32))
    result = trainer.train(jnp.stack([jax.random.PRNGKey(4)] * 3), hp, real, log=None)
    success = result.success["train"][-1]
    assert success[1] > 0.8 and success[2] > 0.8, result.success["train"]
    m = {k: v[-1] for k, v in result.metrics.items()}
    assert (m["cross_entropy"] <= m["data_cross_entropy"]).all(), m
    # α = 0: on fresh states of every task, the greedy action is one the data took for that task.
    obs, env_state = env.reset_to_task_batch(jax.random.split(jax.random.PRNGKey(9), 400), env.default_params(),
                                             jnp.arange(400) % NUM_TASKS)
    run0 = jax.tree.map(lambda x: x[0], result.state.algo)
    action = np.asarray(algo.act(run0, obs, jax.random.PRNGKey(0), jax.tree.map(lambda x: x[0], hp), True))
    task = np.asarray(env_state.task)
    assert np.isin(action - task, [0, 1, 1 - NUM_TASKS]).mean() > 0.95
    assert success[0] < 0.6
