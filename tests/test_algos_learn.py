"""CQL, BCQ, TD3+BC and discrete TD3+BC learn through the engine; hyperparameters and seeds vmap.

Discrete: the one-step toy task of ``toy_env`` (4 tasks, random success 25 %) with a dataset whose
*most frequent* action is wrong: 60 % of transitions take task + 1 (reward 0), 40 % the right action
(reward 1). Imitation picks the wrong action; the reward has to be used.
Continuous: the one-step reach task of ``toy_continuous_env`` (random success ≈ 1.8 %, the noisy
behaviour data ≈ 7 %).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import toy_continuous_env as reach
from toy_env import NUM_TASKS, STATE_DIM, ToyEnv, expert_dataset

from imaginejax.algos.base import Spec
from imaginejax.algos.bcq_discrete import make_bcq_discrete
from imaginejax.algos.cql_discrete import make_cql_discrete
from imaginejax.algos.networks import NetConfig
from imaginejax.algos.td3bc import make_td3bc
from imaginejax.algos.td3bc_discrete import make_td3bc_discrete
from imaginejax.data.transitions import to_transitions
from imaginejax.training.kernel import EngineConfig, broadcast_runs
from imaginejax.training.loop import make_train

DISCRETE = Spec(state_dim=STATE_DIM, embed_dim=NUM_TASKS, discrete=True, action_dim=NUM_TASKS)
CONTINUOUS = Spec(state_dim=reach.STATE_DIM, embed_dim=reach.NUM_TASKS, discrete=False,
                  action_dim=reach.ACTION_DIM)
SMALL = NetConfig(encoder_width=32, hidden=(32,))


@pytest.fixture(scope="module")
def wrong_majority():
    """Toy transitions: 60 % wrong action (task + 1 mod K, reward 0), 40 % right (reward 1)."""
    ds = expert_dataset(512)
    wrong = np.random.default_rng(1).random(512) < 0.6
    actions = np.where(wrong[:, None], (ds.actions + 1) % NUM_TASKS, ds.actions).astype(np.int32)
    rewards = (actions == ds.instruction_ids[:, None]).astype(np.float32)
    return to_transitions(dataclasses.replace(ds, actions=actions, rewards=rewards))


def _discrete_trainer(algo, intervals: int = 4, updates: int = 100):
    env = ToyEnv()
    cfg = EngineConfig(batch_size=32, updates_per_interval=updates, num_intervals=intervals,
                       eval_episodes=128)
    return make_train(algo, DISCRETE, cfg, {"train": (env, env.default_params())})


def test_cql_three_alphas_in_one_call(wrong_majority):
    algo = make_cql_discrete(DISCRETE, SMALL)
    hp = broadcast_runs(algo.default_hp(DISCRETE).replace(
        learning_rate=jnp.float32(1e-3), target_update_interval=jnp.int32(50)), 3)
    hp = hp.replace(alpha=jnp.asarray([0.0, 1.0, 10.0], jnp.float32))
    keys = jnp.stack([jax.random.PRNGKey(2)] * 3)  # same seed: only α differs
    result = _discrete_trainer(algo).train(keys, hp, wrong_majority, log=None)
    success = result.success["train"][-1]
    # α = 0 (double DQN) and α = 1 use the reward; α = 10 pushes Q towards log-frequencies, i.e.
    # imitation of the (wrong) majority action, and falls below random.
    assert success[0] > 0.8 and success[1] > 0.6 and success[2] < 0.4, success
    # The conservative gap E[logsumexp Q − Q(s, a)] shrinks as α grows.
    gap = result.metrics["conservative_loss"][-1]
    assert gap[0] > gap[1] > gap[2], gap


def test_bcq_learns_beyond_imitation(wrong_majority):
    algo = make_bcq_discrete(DISCRETE, SMALL)
    hp = broadcast_runs(algo.default_hp(DISCRETE).replace(
        learning_rate=jnp.float32(1e-3), target_update_interval=jnp.int32(50)), 2)
    result = _discrete_trainer(algo).train(jax.random.split(jax.random.PRNGKey(3), 2), hp,
                                           wrong_majority, log=None)
    # τ = 0.3 keeps both observed actions (0.4 / 0.6 > 0.3) and Q picks the rewarded one.
    assert result.success["train"][-1].min() > 0.7, result.success["train"]
    assert result.metrics["allowed_actions"][-1].max() < 2.5  # the two unseen actions are filtered


def test_discrete_td3bc_learns_beyond_imitation(wrong_majority):
    algo = make_td3bc_discrete(DISCRETE, SMALL)
    hp = broadcast_runs(algo.default_hp(DISCRETE).replace(
        actor_lr=jnp.float32(1e-3), critic_lr=jnp.float32(1e-3)), 2)
    result = _discrete_trainer(algo).train(jax.random.split(jax.random.PRNGKey(6), 2), hp,
                                           wrong_majority, log=None)
    # The stationary actor π(b|s) = p(b|s) / (1 − λ(Q(s,b) − V)) puts ≈ 0.83 on the rewarded action.
    assert result.success["train"][-1].min() > 0.7, result.success["train"]


@pytest.fixture(scope="module")
def reach_setup():
    """TD3+BC on the reach task: one trainer (4 intervals of 200 updates), shared by both tests so
    that its R = 2 interval compiles once."""
    real = to_transitions(reach.noisy_expert_dataset(1024))
    algo = make_td3bc(CONTINUOUS, SMALL)
    env = reach.ContinuousReachEnv()
    cfg = EngineConfig(batch_size=64, updates_per_interval=200, num_intervals=4, eval_episodes=128)
    trainer = make_train(algo, CONTINUOUS, cfg, {"train": (env, env.default_params())})
    hp = algo.default_hp(CONTINUOUS)
    return trainer, hp.replace(actor_lr=jnp.float32(1e-3), critic_lr=jnp.float32(1e-3)), real


def test_td3bc_learns_continuous_reach(reach_setup):
    trainer, hp, real = reach_setup
    result = trainer.train(jax.random.split(jax.random.PRNGKey(4), 2), broadcast_runs(hp, 2), real,
                           log=None)
    assert result.success["train"][-1].min() > 0.6, result.success["train"]
    np.testing.assert_array_equal(result.metrics["actor_updated"][-1], 0.5)  # every 2nd update


def test_td3bc_vmapped_seeds_equal_sequential_runs(reach_setup):
    # One interval (200 updates, actor on every 2nd) of 2 runs together vs each alone. Over many more
    # Adam steps, last-bit differences between batched and unbatched kernels grow chaotically
    # (measured: 1 update identical, 200 updates ≤ 1.2e-7, 800 updates 2e-3), hence one interval.
    trainer, hp, real = reach_setup
    keys = jax.random.split(jax.random.PRNGKey(5), 2)

    def one_interval(run_keys):
        r = int(run_keys.shape[0])
        run_hp = broadcast_runs(hp, r)
        run, metrics, results = trainer.interval(trainer.init(run_keys, run_hp, real), run_hp,
                                                 jnp.zeros((r,), jnp.float32), real, real)
        return run, metrics, results["train"]

    together = one_interval(keys)
    for r in range(2):
        alone = one_interval(keys[r:r + 1])
        for a, b in zip(jax.tree.leaves(alone[0].algo), jax.tree.leaves(together[0].algo)):
            np.testing.assert_allclose(np.asarray(a)[0], np.asarray(b)[r], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(alone[1]["critic_loss"][0], together[1]["critic_loss"][r], rtol=1e-5)
        np.testing.assert_array_equal(alone[2].success_rate[0], together[2].success_rate[r])
