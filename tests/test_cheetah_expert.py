"""HalfCheetah SAC expert: features, the replay contents of a training chunk, checkpoint round trip,
and the policy inside data collection (a tiny configuration; learning itself is measured by
``python -m imaginejax.envs.cheetah.expert``, not here)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.algos.networks import NetConfig
from imaginejax.data.collect import collect
from imaginejax.envs.cheetah import expert as E
from imaginejax.envs.cheetah import tasks
from imaginejax.envs.cheetah.env import HalfCheetah, make_params

TINY = E.ExpertConfig(envs_per_task=1, updates_per_step=2, batch_size=8, buffer_size=64, warmup_steps=2,
                      steps_per_chunk=3, net=NetConfig(encoder_width=16, encoder_layers=2, hidden=(16,)))


def test_features_by_hand():
    state = np.zeros((2, 18), np.float32)
    state[:, 0] = [0.1, -0.2]
    progress = tasks.Progress.zeros((2,)).replace(sigma=jnp.asarray([50.0, -5.0]),
                                                  forward_done_at=jnp.asarray([40.0, 0.0]))
    goal = jnp.asarray([[tasks.KIND_FORWARD_BACKWARD, 1], [tasks.KIND_JUMP, -1]], jnp.int32)
    f = np.asarray(E.expert_features(jnp.asarray(state), progress, jnp.asarray([100, 20]), goal))
    assert f.shape == (2, E.FEATURE_DIM) == (2, 28)
    np.testing.assert_array_equal(f[:, :18], state)
    np.testing.assert_array_equal(f[:, 18:23], [[0, 0, 0, 1, 0], [0, 0, 1, 0, 0]])
    np.testing.assert_allclose(f[:, 23:], [[1, 0.5, 1, 0, 3.0], [-1, 0.1, 0, 0, -0.5]])


def test_training_chunk_fills_the_buffer_with_env_transitions():
    trainer = E.init_trainer(jax.random.PRNGKey(0), TINY)
    chunk = E.make_train_chunk(TINY)
    trainer, metrics = chunk(trainer)
    n = TINY.num_envs
    assert int(trainer.size) == 3 * n and int(trainer.vector_steps) == 3 and int(trainer.sac.step) == 2
    assert np.isfinite(float(metrics["critic_loss"]))
    buf = jax.device_get(trainer.buffer)
    # consecutive steps of one environment chain: next features of step 1 = features of step 2
    np.testing.assert_array_equal(buf["next_features"][:n], buf["features"][n:2 * n])
    # stored rewards are the task rewards of the stored transitions (run tasks: ±v − control cost)
    goal = E.ALL_GOALS[np.arange(3 * n) % n]
    run = goal[:, 0] == tasks.KIND_RUN
    prev, nxt = buf["features"][:3 * n, :18], buf["next_features"][:3 * n, :18]
    want = tasks.reward(jnp.asarray(prev), jnp.asarray(buf["action"][:3 * n]), jnp.asarray(nxt), jnp.asarray(goal),
                        tasks.Progress.zeros((3 * n,)))
    np.testing.assert_allclose(buf["reward"][:3 * n][run], np.asarray(want)[run], rtol=1e-5, atol=1e-5)
    assert np.abs(buf["action"][:3 * n]).max() <= 1.0


def test_checkpoint_round_trip_and_policy_in_collect(tmp_path):
    sac = E.init_sac(jax.random.PRNGKey(1), TINY)
    path = E.save_expert(tmp_path, sac, TINY, step=1)
    loaded = E.load_expert(path, TINY)
    for a, b in zip(jax.tree.leaves(sac), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    params = make_params("hard", embed=False)
    ds = collect(HalfCheetah("mujoco"), params, E.make_policy(loaded.actor_params, TINY), jax.random.PRNGKey(2), 3,
                 task_indices=np.arange(3), chunk_size=3, progress=False)
    assert ds.actions.shape == (3, 200, 6) and np.abs(ds.actions).max() <= 1.0
    # deterministic policy: the same key gives the same data
    again = collect(HalfCheetah("mujoco"), params, E.make_policy(loaded.actor_params, TINY), jax.random.PRNGKey(2), 3,
                    task_indices=np.arange(3), chunk_size=3, progress=False)
    np.testing.assert_array_equal(ds.actions, again.actions)
