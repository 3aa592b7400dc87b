"""HalfCheetah expert: features, the two-leg composition by hand, the acting network against the training
actor, packaged-weight loading (with its integrity check), the packaged expert's success on all nine
tasks with the MuJoCo C backend, and the trainer of experiments/experts/cheetah_sac.py (the replay
contents of a training chunk, checkpoint round trips; learning itself is measured by running it)."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.algos.networks import NetConfig, TanhGaussianActor
from imaginejax.core.checkpoint import CheckpointError
from imaginejax.data.collect import collect
from imaginejax.envs.cheetah import expert as E
from imaginejax.envs.cheetah import tasks
from imaginejax.envs.cheetah.env import HalfCheetah, make_params

TRAINER_FILE = Path(__file__).resolve().parents[1] / "experiments" / "experts" / "cheetah_sac.py"


def _load_trainer():
    spec = importlib.util.spec_from_file_location("cheetah_sac", TRAINER_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["cheetah_sac"] = module
    spec.loader.exec_module(module)
    return module


T = _load_trainer()
TINY = T.ExpertConfig(envs_per_task=1, updates_per_step=2, batch_size=8, buffer_size=64, warmup_steps=2,
                      steps_per_chunk=3, net=NetConfig(encoder_width=16, encoder_layers=2, hidden=(16,)))
EPISODES_PER_TASK = 40  # success >= 90 % means at most 4 failures of 40 per task
MIN_SUCCESS = 0.9


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


def test_skill_inputs_compose_the_two_leg_tasks_by_hand():
    fb, run, jump = tasks.KIND_FORWARD_BACKWARD, tasks.KIND_RUN, tasks.KIND_JUMP
    goal = jnp.asarray([[fb, 1], [fb, 1], [fb, -1], [fb, -1], [run, 1]], jnp.int32)
    t = jnp.asarray([20, 70, 10, 120, 150], jnp.int32)
    progress = tasks.Progress.zeros((5,)).replace(
        sigma=jnp.asarray([1.0, 2.5, -0.5, -1.0, 8.0]),
        forward_sum=jnp.asarray([1.1, 4.0, 0.1, 2.0, 8.0]),
        backward_sum=jnp.asarray([-0.1, -1.5, -0.6, -3.0, 0.0]),
        forward_done_at=jnp.asarray([0.0, 40.0, 0.0, 0.0, 35.0]),
        backward_done_at=jnp.asarray([0.0, 0.0, 0.0, 50.0, 0.0]))
    leg_progress, leg_t, leg_goal = E.skill_inputs(progress, t, goal)
    # rows: forward-then-backward before / after its forward leg, backward-then-forward before / after its
    # backward leg, and a run goal (passed through untouched, done flags included)
    np.testing.assert_array_equal(leg_goal, [[jump, 1], [run, -1], [jump, -1], [run, 1], [run, 1]])
    np.testing.assert_array_equal(leg_t, [20, 70 - 40, 10, 120 - 50, 150])
    np.testing.assert_allclose(leg_progress.sigma, [1.0, -1.5, -0.5, 2.0, 8.0])
    np.testing.assert_array_equal(leg_progress.forward_done_at, [0, 0, 0, 0, 35])
    np.testing.assert_array_equal(leg_progress.backward_done_at, [0, 0, 0, 0, 0])
    np.testing.assert_array_equal(leg_progress.forward_steps, progress.forward_steps)


def test_training_chunk_fills_the_buffer_with_env_transitions():
    trainer = T.init_trainer(jax.random.PRNGKey(0), TINY)
    chunk = T.make_train_chunk(TINY)
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
    sac = T.init_sac(jax.random.PRNGKey(1), TINY)
    path = T.save_expert(tmp_path, sac, TINY, step=1)
    loaded = T.load_expert(path, TINY)
    for a, b in zip(jax.tree.leaves(sac), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # load_actor finds the latest checkpoint of a training directory, and reads an exported actor file
    newer = sac.replace(actor_params=jax.tree.map(lambda x: x + 1.0, sac.actor_params))
    T.save_expert(tmp_path, newer, TINY, step=2)
    digest = T.save_actor(tmp_path / "actor.npz", newer.actor_params)
    assert digest == hashlib.sha256((tmp_path / "actor.npz").read_bytes()).hexdigest()
    assert T.save_actor(tmp_path / "again.npz", newer.actor_params) == digest  # byte-reproducible export
    for loaded_actor in (T.load_actor(tmp_path, TINY), T.load_actor(tmp_path / "actor.npz", TINY),
                         E.load_actor(tmp_path / "actor.npz")):
        for a, b in zip(jax.tree.leaves(newer.actor_params), jax.tree.leaves(loaded_actor)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(CheckpointError, match="no HalfCheetah expert checkpoint"):
        T.load_actor(tmp_path / "empty-dir-that-does-not-exist", TINY)
    with pytest.raises(E.ExpertWeightsError, match="--export-from"):
        E.load_actor(tmp_path)  # envs read actor files only; checkpoints are the trainer's

    params = make_params("hard", embed=False)
    policy = E.make_policy(loaded.actor_params)
    ds = collect(HalfCheetah("mujoco"), params, policy, jax.random.PRNGKey(2), 3,
                 task_indices=np.arange(3), chunk_size=3, progress=False)
    assert ds.actions.shape == (3, 200, 6) and np.abs(ds.actions).max() <= 1.0
    # deterministic policy: the same key gives the same data
    again = collect(HalfCheetah("mujoco"), params, policy, jax.random.PRNGKey(2), 3,
                    task_indices=np.arange(3), chunk_size=3, progress=False)
    np.testing.assert_array_equal(ds.actions, again.actions)
    # Gaussian action noise: different actions, still inside the action box
    noisy = collect(HalfCheetah("mujoco"), params, E.make_policy(loaded.actor_params, noise=0.3),
                    jax.random.PRNGKey(2), 3, task_indices=np.arange(3), chunk_size=3, progress=False)
    assert np.abs(noisy.actions).max() <= 1.0 and not np.array_equal(noisy.actions[:, 0], ds.actions[:, 0])
    with pytest.raises(ValueError, match="noise"):
        E.make_policy(loaded.actor_params, noise=-0.1)


def test_acting_network_is_the_training_actor():
    """envs' plain forward pass equals the training actor's (algos' TanhGaussianActor) mean, on the shipped
    weights and on a tiny random actor."""
    features = jax.random.normal(jax.random.PRNGKey(3), (5, E.FEATURE_DIM)) * jnp.asarray(E.FEATURE_SCALE)
    shipped = TanhGaussianActor(NetConfig(E.ENCODER_WIDTH, E.ENCODER_LAYERS, E.HIDDEN), tasks.ACTION_DIM)
    tiny = TanhGaussianActor(TINY.net, tasks.ACTION_DIM)
    random_tiny = tiny.init(jax.random.PRNGKey(4), features)
    for module, params in ((shipped, E.load_actor()), (tiny, random_tiny)):
        want = module.apply(params, features / jnp.asarray(E.FEATURE_SCALE))[0]
        np.testing.assert_allclose(E.actor_mean(params, features), want, rtol=1e-5, atol=1e-6)


def test_actor_file_of_another_network_is_refused(tmp_path):
    params = TanhGaussianActor(NetConfig(8, 1, (8,)), tasks.ACTION_DIM + 1).init(
        jax.random.PRNGKey(0), jnp.zeros((1, E.FEATURE_DIM)))
    T.save_actor(tmp_path / "wide.npz", params)
    with pytest.raises(E.ExpertWeightsError, match="another network"):
        E.load_actor(tmp_path / "wide.npz")


def test_packaged_weights_are_small_and_match_their_checksum():
    data = E.PACKAGED_ACTOR.read_bytes()
    assert len(data) <= 1_500_000
    assert hashlib.sha256(data).hexdigest() == E.PACKAGED_SHA256
    actor = E.load_actor()
    assert all(np.asarray(x).dtype == np.float32 and np.all(np.isfinite(x)) for x in jax.tree.leaves(actor))


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "missing"])
def test_damaged_packaged_weights_name_the_file_and_the_retrain_command(tmp_path, damage):
    copy = tmp_path / E.PACKAGED_ACTOR.name
    shutil.copyfile(E.PACKAGED_ACTOR, copy)
    data = copy.read_bytes()
    if damage == "truncated":
        copy.write_bytes(data[: len(data) // 2])
    elif damage == "flipped byte":
        middle = len(data) // 2
        copy.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    else:
        copy.unlink()
    with pytest.raises(E.ExpertWeightsError) as error:
        E.load_actor_file(copy, E.PACKAGED_SHA256)
    message = str(error.value)
    assert str(copy) in message and "python experiments/experts/cheetah_sac.py" in message
    assert ("missing" if damage == "missing" else "truncated or corrupted") in message


def test_packaged_expert_succeeds_on_every_task():
    """All nine tasks (train, easy and hard goals) in one batched collection with MuJoCo C: success in at
    least 90 % of EPISODES_PER_TASK episodes each, and every success the environment reports is also
    the task predicate evaluated afresh on the recorded state trajectory."""
    env = HalfCheetah("mujoco")
    names, rates = [], []
    for level in ("train", "easy", "hard"):
        params = make_params(level, embed=False)
        k = params.num_tasks
        n = EPISODES_PER_TASK * k
        task = np.arange(n) % k
        ds = collect(env, params, E.expert_policy(), jax.random.PRNGKey(2024), n, task_indices=task, chunk_size=n,
                     progress=False)
        ended_in_success = ds.terminals.any(axis=1)
        # independent check: re-derive success from the states (tasks.trajectory_success_and_reward)
        acts = np.where(ds.mask[..., None], ds.actions, 0.0)
        recomputed, _ = tasks.trajectory_success_and_reward(jnp.asarray(ds.states), jnp.asarray(acts),
                                                            jnp.asarray(ds.goals))
        last = ds.mask.sum(axis=1) - 1
        np.testing.assert_array_equal(np.asarray(recomputed)[np.arange(n), last], ended_in_success)
        for t in range(k):
            names.append(tasks.describe_goal(np.asarray(params.goals)[t]))
            rates.append(float(ended_in_success[task == t].mean()))
    assert len(names) == 9
    failing = {name: rate for name, rate in zip(names, rates) if rate < MIN_SUCCESS}
    assert not failing, f"expert below {MIN_SUCCESS:.0%} success: {failing} (all: {dict(zip(names, rates))})"
