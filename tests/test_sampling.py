"""Flattening to transitions and the real / imaginary mixing sampler."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.data import (
    DatasetError,
    TrajectoryDataset,
    Transitions,
    concat_transitions,
    num_imaginary,
    placeholder_like,
    sample_mixed,
    sample_uniform,
    to_transitions,
)

# --------------------------------------------------------------------------------------- to_transitions


def hand_built_dataset() -> TrajectoryDataset:
    """Two trajectories, T = 4: row 0 succeeds (terminal) after 3 steps, row 1 hits a time limit after 2."""
    f = np.float32
    states = np.array([
        [[0, 0], [1, 10], [2, 20], [3, 30], [0, 0]],
        [[5, 50], [6, 60], [7, 70], [0, 0], [0, 0]],
    ], dtype=f)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=bool)
    return TrajectoryDataset(
        states=states,
        actions=np.array([[3, 1, 4, 0], [1, 5, 0, 0]], dtype=np.int32),
        rewards=np.array([[0.5, 0.25, 1.0, 0], [-1, 2, 0, 0]], dtype=f),
        mask=mask,
        terminals=np.array([[0, 0, 1, 0], [0, 0, 0, 0]], dtype=bool),
        truncations=np.array([[0, 0, 0, 0], [0, 1, 0, 0]], dtype=bool),
        instruction_ids=np.array([1, 0], dtype=np.int32),
        goals=np.array([[7, 8, 9], [4, 5, 6]], dtype=np.int32),
        instructions=("go left", "go right"),
        instruction_embeddings=np.array([[1, 2], [3, 4]], dtype=f),
        env="clevr",
        level="train",
        source="real",
        discrete=True,
    )


def test_to_transitions_matches_hand_computation() -> None:
    t = to_transitions(hand_built_dataset())
    expected = {
        "state": [[0, 0], [1, 10], [2, 20], [5, 50], [6, 60]],
        "next_state": [[1, 10], [2, 20], [3, 30], [6, 60], [7, 70]],
        "action": [3, 1, 4, 1, 5],
        "reward": [0.5, 0.25, 1.0, -1, 2],
        # The time-limit truncation at the end of row 1 is NOT terminal: its next state is bootstrapped.
        "terminal": [0, 0, 1, 0, 0],
        "instruction": [1, 1, 1, 0, 0],
        "goal": [[7, 8, 9]] * 3 + [[4, 5, 6]] * 2,
        "embeddings": [[1, 2], [3, 4]],
    }
    dtypes = {"action": jnp.int32, "instruction": jnp.int32, "goal": jnp.int32}
    for field, value in expected.items():
        got = getattr(t, field)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(value), err_msg=field)
        assert got.dtype == dtypes.get(field, jnp.float32), field
    assert t.size == 5


def test_to_transitions_continuous_and_validates() -> None:
    ds = hand_built_dataset()
    cont = TrajectoryDataset(**{**ds.__dict__, "discrete": False,
                                "actions": np.arange(16, dtype=np.float32).reshape(2, 4, 2)})
    t = to_transitions(cont)
    np.testing.assert_array_equal(np.asarray(t.action), [[0, 1], [2, 3], [4, 5], [8, 9], [10, 11]])
    bad_rewards = ds.rewards.copy()
    bad_rewards[1, 1] = np.nan  # an imaginer's NaN on a valid step
    with pytest.raises(DatasetError, match="field 'rewards'"):
        to_transitions(TrajectoryDataset(**{**ds.__dict__, "rewards": bad_rewards}))


def test_concat_transitions_offsets_instruction_ids() -> None:
    a = to_transitions(hand_built_dataset())
    b = a.replace(embeddings=a.embeddings + 100.0)
    both = concat_transitions([a, b])
    assert both.size == 10 and both.embeddings.shape == (4, 2)
    np.testing.assert_array_equal(np.asarray(both.instruction), [1, 1, 1, 0, 0, 3, 3, 3, 2, 2])
    emb = np.asarray(both.embeddings)[np.asarray(both.instruction)]
    np.testing.assert_array_equal(emb[5:], np.asarray(b.embeddings)[np.asarray(b.instruction)])
    with pytest.raises(ValueError, match="same spaces"):
        concat_transitions([a, a.replace(state=jnp.zeros((5, 3)), next_state=jnp.zeros((5, 3)))])


def test_placeholder_like_has_one_zero_row_of_the_same_spaces() -> None:
    real = to_transitions(hand_built_dataset())
    ph = placeholder_like(real)
    for field in ("state", "action", "reward", "next_state", "terminal", "instruction", "goal", "embeddings"):
        x, y = getattr(real, field), getattr(ph, field)
        assert y.shape == (1,) + x.shape[1:] and y.dtype == x.dtype, field
        assert not np.asarray(y).any(), field


# ------------------------------------------------------------------------------------------- sampling


def make_buffer(k: int, m: int, *, offset: float, discrete: bool = True, e: int = 3) -> Transitions:
    """A buffer whose row j is recognisable: ``state[j] = (offset + j, -j)``; instruction ``j % m``;
    table row ``i`` is ``offset + 0.5 * i`` everywhere."""
    j = jnp.arange(k)
    return Transitions(
        state=jnp.stack([offset + j, -j], axis=1).astype(jnp.float32),
        action=(j % 4).astype(jnp.int32) if discrete else jnp.stack([j, j], 1).astype(jnp.float32),
        reward=(offset + j).astype(jnp.float32),
        next_state=jnp.stack([offset + j + 0.25, -j], axis=1).astype(jnp.float32),
        terminal=(j % 2).astype(jnp.float32),
        instruction=(j % m).astype(jnp.int32),
        goal=jnp.zeros((k, 1), jnp.int32),
        embeddings=jnp.broadcast_to(offset + 0.5 * jnp.arange(m)[:, None], (m, e)).astype(jnp.float32),
    )


REAL_K, IMAG_K = 7, 5
REAL = make_buffer(REAL_K, 3, offset=0.0)
IMAG = make_buffer(IMAG_K, 2, offset=1000.0)

RATIOS = [0.0, 1.0, 0.5, 0.1, 1 / 3, 2 / 3, 0.7, 0.29, 0.123456, 0.999, 0.001, 0.125, 0.375, 0.05]
BATCH_SIZES = [1, 3, 5, 7, 10, 64, 100, 256, 1000]


# One compiled sampler shared by the tests (eager calls would compile every primitive separately).
SAMPLE = jax.jit(sample_mixed, static_argnums=3)


def expected_count(ratio: float, b: int) -> int:
    """The documented rule, computed independently in NumPy: round_half_even(float32(ratio) * B)."""
    return int(np.round(np.float32(ratio) * np.float32(b)))


def test_count_rule_on_hand_picked_cases() -> None:
    cases = {(0.5, 5): 2, (0.5, 7): 4, (0.5, 3): 2, (0.125, 4): 0, (0.375, 4): 2, (0.1, 256): 26,
             (1 / 3, 3): 1, (0.7, 10): 7, (0.29, 100): 29, (0.0, 9): 0, (1.0, 9): 9, (0.05, 10): 0}
    for (ratio, b), n in cases.items():
        assert int(num_imaginary(ratio, b)) == n == expected_count(ratio, b), (ratio, b)


def assert_batch_consistent(batch, n: int, b: int) -> None:
    """Rows [0, n) come from IMAG and [n, B) from REAL, each with its own embedding table."""
    batch = jax.tree.map(np.asarray, batch)
    state = np.asarray(batch.state)
    imaginary = np.asarray(batch.imaginary)
    assert imaginary.shape == (b,) and imaginary.dtype == bool
    assert imaginary.sum() == n
    np.testing.assert_array_equal(imaginary, np.arange(b) < n)
    np.testing.assert_array_equal(state[:, 0] >= 1000, imaginary)
    j = -state[:, 1].astype(int)
    m = np.where(imaginary, j % 2, j % 3)
    offset = np.where(imaginary, 1000.0, 0.0)
    np.testing.assert_array_equal(np.asarray(batch.embedding), np.broadcast_to((offset + 0.5 * m)[:, None], (b, 3)))
    np.testing.assert_array_equal(np.asarray(batch.reward), state[:, 0])
    np.testing.assert_array_equal(np.asarray(batch.next_state)[:, 0], state[:, 0] + 0.25)
    np.testing.assert_array_equal(np.asarray(batch.action), j % 4)
    np.testing.assert_array_equal(np.asarray(batch.terminal), j % 2)


@pytest.mark.parametrize("b", BATCH_SIZES)
def test_exact_count_under_jit(b: int) -> None:
    for i, ratio in enumerate(RATIOS):
        batch = SAMPLE(jax.random.key(i), REAL, IMAG, b, jnp.float32(ratio))
        assert_batch_consistent(batch, expected_count(ratio, b), b)


@pytest.mark.parametrize("b", [7, 256])
def test_exact_count_under_vmap_over_ratios_and_keys(b: int) -> None:
    ratios = jnp.asarray(RATIOS + list(np.linspace(0, 1, 41)), jnp.float32)
    keys = jax.random.split(jax.random.key(b), ratios.shape[0])
    sample = jax.jit(jax.vmap(functools.partial(sample_mixed, real=REAL, imag=IMAG, batch_size=b)))
    batches = sample(keys, ratio=ratios)
    counts = np.asarray(batches.imaginary.sum(axis=1))
    np.testing.assert_array_equal(counts, [expected_count(r, b) for r in np.asarray(ratios)])
    host = jax.tree.map(np.asarray, batches)
    for row, ratio in enumerate(np.asarray(ratios)):
        assert_batch_consistent(jax.tree.map(lambda x: x[row], host), expected_count(ratio, b), b)


def test_seeds_by_ratios_grid_in_one_call() -> None:
    ratios = jnp.asarray(RATIOS, jnp.float32)
    keys = jax.random.split(jax.random.key(0), 3)
    grid = jax.jit(jax.vmap(jax.vmap(sample_mixed, in_axes=(0, None, None, None, None)),
                            in_axes=(None, None, None, None, 0)), static_argnums=3)
    out = grid(keys, REAL, IMAG, 10, ratios)
    assert out.imaginary.shape == (len(RATIOS), 3, 10)
    np.testing.assert_array_equal(np.asarray(out.imaginary.sum(-1)),
                                  np.repeat([[expected_count(r, 10)] for r in RATIOS], 3, axis=1))


def test_indices_are_uniform_within_each_buffer() -> None:
    keys = jax.random.split(jax.random.key(0), 2000)
    batches = jax.jit(jax.vmap(lambda k: sample_mixed(k, REAL, IMAG, 64, 0.5)))(keys)
    state = np.asarray(batches.state).reshape(-1, 2)
    imaginary = np.asarray(batches.imaginary).reshape(-1)
    for chosen, k in ((~imaginary, REAL_K), (imaginary, IMAG_K)):
        counts = np.bincount(-state[chosen, 1].astype(int), minlength=k)
        assert counts.shape == (k,)
        expected = chosen.sum() / k
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < {7: 22.46, 5: 18.47}[k], (counts, chi2)  # chi-square critical values at p = 0.001
    uniform = jax.jit(jax.vmap(lambda k: sample_uniform(k, REAL, 64)))(keys)
    counts = np.bincount(-np.asarray(uniform.state)[..., 1].astype(int).reshape(-1), minlength=REAL_K)
    expected = counts.sum() / REAL_K
    assert float(((counts - expected) ** 2 / expected).sum()) < 22.46, counts
    assert not np.asarray(uniform.imaginary).any()


def test_ratio_zero_never_draws_from_imag() -> None:
    poisoned = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan) if x.dtype == jnp.float32 else x, IMAG)
    for imag in (poisoned, placeholder_like(REAL)):
        for seed in range(5):
            batch = SAMPLE(jax.random.key(seed), REAL, imag, 64, 0.0)
            assert not np.asarray(batch.imaginary).any()
            assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(batch))
            assert_batch_consistent(batch, 0, 64)
    # The batch does not depend on the imaginary buffer at all: same rows with either stand-in.
    with_poison, with_placeholder = (SAMPLE(jax.random.key(7), REAL, imag, 64, 0.0)
                                     for imag in (poisoned, placeholder_like(REAL)))
    for x, y in zip(jax.tree.leaves(with_poison), jax.tree.leaves(with_placeholder)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    ratios = jnp.array([0.0, 0.0, 0.5])
    batches = jax.jit(jax.vmap(lambda r: sample_mixed(jax.random.key(1), REAL, poisoned, 32, r)))(ratios)
    assert np.isfinite(np.asarray(batches.state[:2])).all()
    assert np.isnan(np.asarray(batches.state[2, :16])).all()


def test_ratio_one_is_all_imaginary_and_real_rows_are_common_across_ratios() -> None:
    key = jax.random.key(3)
    batch = SAMPLE(key, REAL, IMAG, 16, 1.0)
    assert np.asarray(batch.imaginary).all()
    base = SAMPLE(key, REAL, IMAG, 16, 0.0)
    mixed = SAMPLE(key, REAL, IMAG, 16, 0.25)
    np.testing.assert_array_equal(np.asarray(mixed.state[4:]), np.asarray(base.state[4:]))
    np.testing.assert_array_equal(np.asarray(mixed.state[:4]), np.asarray(batch.state[:4]))


def test_continuous_actions_and_sample_uniform_flag() -> None:
    real = make_buffer(6, 2, offset=0.0, discrete=False)
    imag = make_buffer(4, 1, offset=1000.0, discrete=False)
    batch = SAMPLE(jax.random.key(0), real, imag, 8, 0.5)
    assert batch.action.shape == (8, 2) and batch.action.dtype == jnp.float32
    assert batch.observation.shape == (8, 5)
    flagged = jax.jit(sample_uniform, static_argnums=2, static_argnames="imaginary")(
        jax.random.key(0), imag, 8, imaginary=True)
    assert np.asarray(flagged.imaginary).all()
    assert (np.asarray(flagged.state[:, 0]) >= 1000).all()


def test_bad_arguments_are_refused() -> None:
    key = jax.random.key(0)
    for ratio in (-0.1, 1.5, float("nan"), np.float32(2.0)):
        with pytest.raises(ValueError, match=r"ratio must be in \[0, 1\]"):
            sample_mixed(key, REAL, IMAG, 8, ratio)
    for b in (0, 2.0, True):
        with pytest.raises(ValueError, match="batch_size"):
            sample_mixed(key, REAL, IMAG, b, 0.5)
    with pytest.raises(ValueError, match="imag.action"):
        sample_mixed(key, REAL, make_buffer(4, 1, offset=1000.0, discrete=False), 8, 0.5)
    with pytest.raises(ValueError, match="imag.embeddings"):
        sample_mixed(key, REAL, make_buffer(4, 1, offset=1000.0, e=2), 8, 0.5)
    with pytest.raises(DatasetError, match="placeholder_like"):
        sample_mixed(key, REAL, jax.tree.map(lambda x: x[:0], IMAG), 8, 0.0)
    with pytest.raises(AssertionError):
        sample_mixed(key, REAL, IMAG, 8, jnp.array([0.5, 0.5]))
    # Traced values outside [0, 1] cannot raise: they are clipped (NaN counts as 0).
    clipped = jax.jit(lambda r: num_imaginary(r, 10))
    assert [int(clipped(r)) for r in (-1.0, 2.0, jnp.nan)] == [0, 10, 0]
