"""BabyAI datasets collected with the scripted expert through the generic collector pass validation."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from imaginejax.envs.babyai import expert as X
from imaginejax.envs.babyai import tasks as T
from imaginejax.envs.babyai.env import BabyAI, make_params

ENV = BabyAI()


@pytest.mark.parametrize("level", T.LEVELS)
def test_collected_datasets_validate(level):
    from imaginejax.data.collect import collect
    from imaginejax.data.validate import validate_dataset

    p = make_params(level, embed=False)
    n = 32
    ds = collect(ENV, p, X.make_policy(X.ExpertConfig(epsilon=0.1)), jax.random.PRNGKey(6), n,
                 task_indices=np.arange(n) % p.num_tasks, chunk_size=n, policy_name="babyai-expert", progress=False)
    validate_dataset(ds, num_actions=7)
    assert ds.env == "babyai" and ds.level == level and ds.discrete
    assert ds.states.shape == (n, 129, 17) and ds.goals.shape == (n, T.GOAL_DIM)
    assert ds.terminals.any(1).mean() >= 0.9
    lengths = ds.mask.sum(1)
    rows = np.flatnonzero(ds.terminals.any(1))
    np.testing.assert_allclose(ds.rewards[rows, lengths[rows] - 1], 1 - 0.9 * lengths[rows] / 128, rtol=1e-5)
    # Every stored valid state is legal, and the success predicate holds exactly at the terminal state.
    legal, hit = jax.jit(lambda s, g: (T.legal(s), T.state_satisfied(s[:, 1:], g[:, None])))(ds.states, ds.goals)
    valid_state = np.arange(129)[None] <= lengths[:, None]
    assert np.asarray(legal)[valid_state].all()
    np.testing.assert_array_equal(np.asarray(hit) & ds.mask, ds.terminals)
