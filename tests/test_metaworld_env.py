"""Meta-World port: the 91-d layout, the fixture-as-mocap models, episode semantics, batching, rewards and
collection (parity with the metaworld package itself is tests/test_metaworld_parity.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from imaginejax.envs.metaworld import scenes, tasks
from imaginejax.envs.metaworld.env import MetaWorld, make_params


@pytest.fixture(scope="module")
def env() -> MetaWorld:
    return MetaWorld()


@pytest.fixture(scope="module")
def params():
    return make_params("train", embed=False)


B = 10  # every batched test uses this batch size, so reset and step compile once for the module


@pytest.fixture(scope="module")
def fns(env):
    return jax.jit(env.reset_to_task_batch), jax.jit(env.step_batch)


def _keys(seed: int) -> jax.Array:
    return jax.random.split(jax.random.key(seed), B)


def test_state_layout_on_a_hand_checked_state() -> None:
    """Sensors of a button-press state written by hand → the 91-d vector, entry by entry."""
    sl = scenes.sensor_slices()
    sensors = np.zeros(scenes.SENSOR_DIM, np.float32)
    sensors[sl["hand"]] = (0.6, 0.61, 0.2)            # x beyond the hand space: clipped to 0.525
    sensors[sl["rclaw"]] = (0.0, 0.63, 0.1)
    sensors[sl["lclaw"]] = (0.0, 0.57, 0.1)           # 0.06 apart → opening 0.6
    sensors[sl["obj"]] = (0.05, 0.9, 0.12)            # button body; Meta-World observes it 0.193 closer
    sensors[sl["obj_quat"]] = (1.0, 0.0, 0.0, 0.0)
    task = tasks.TASK_INDEX["button-press"]
    vec = np.asarray(tasks.state_from_sensors(jnp.asarray(sensors), jnp.asarray(task), jnp.array([0.05, 0.8, 0.12])))
    assert vec.shape == (tasks.STATE_DIM,) == (91,)
    np.testing.assert_allclose(vec[0:3], [0.525, 0.61, 0.2], atol=1e-7)
    np.testing.assert_allclose(vec[3], 0.6, atol=1e-6)
    np.testing.assert_allclose(vec[4:7], [0.05, 0.8, 0.12], atol=1e-7)
    button = 7 + 7 * tasks.ENTITIES.index("button")     # slot 1 → [14:21]
    assert button == 14
    np.testing.assert_allclose(vec[14:21], [0.05, 0.707, 0.12, 1.0, 0.0, 0.0, 0.0], atol=1e-6)
    others = np.delete(np.arange(7, 91), np.arange(14 - 7, 21 - 7))
    assert not vec[others].any()
    # main_object reads the task's slot back
    np.testing.assert_allclose(np.asarray(tasks.main_object(jnp.asarray(vec), jnp.asarray(task))), [0.05, 0.707, 0.12],
                               atol=1e-6)


def test_fixtures_as_mocap_leave_the_dynamics_unchanged() -> None:
    """A fixture moved by writing model.body_pos (Meta-World) == the same fixture as a mocap body (the port):
    identical qpos and contact counts, bit for bit, while the hand sweeps into the fixture."""
    rng = np.random.default_rng(0)
    for name in ("button-press", "door-open", "faucet-open"):
        spec = tasks.TASKS[tasks.TASK_INDEX[name]]
        original = scenes.build_model(spec.scene, with_sensors=False, fixtures_as_mocap=False)
        mocap = scenes.build_model(spec.scene, with_sensors=False)
        pos = 0.5 * (np.array(spec.rand_low[:3]) + np.array(spec.rand_high[:3]))
        for f in spec.scene.fixtures:
            original.body(f).pos = pos
        d0, d1 = mujoco.MjData(original), mujoco.MjData(mocap)
        hand0, (fix,) = scenes.mocap_ids(mocap, spec.scene)
        d1.mocap_pos[fix] = pos
        h0 = original.body_mocapid[original.body("mocap").id]
        target = np.array(spec.hand_init)
        touched = 0
        for _ in range(150):
            aim = pos + np.array([0.0, -0.12, 0.02])
            target = np.clip(target + 0.01 * np.clip((aim - target) / 0.01, -1, 1) + rng.normal(0, 0.003, 3),
                             spec.hand_low, spec.hand_high)
            for d, m, h in ((d0, original, h0), (d1, mocap, hand0)):
                d.mocap_pos[h] = target
                d.mocap_quat[h] = (1, 0, 1, 0)
                d.ctrl[:] = (1.0, -1.0)
                mujoco.mj_step(m, d, 5)
            np.testing.assert_array_equal(d0.qpos, d1.qpos, err_msg=name)
            assert d0.ncon == d1.ncon, name
            touched = max(touched, d0.ncon)
        assert touched > 0, f"{name}: the sweep never made contact"


def test_reset_is_a_pure_function_of_the_key(fns, params) -> None:
    reset, _ = fns
    obs_a, a = reset(_keys(3), params, jnp.arange(B))
    obs_b, b = reset(_keys(3), params, jnp.arange(B))
    np.testing.assert_array_equal(np.asarray(obs_a), np.asarray(obs_b))
    np.testing.assert_array_equal(np.asarray(a.phys), np.asarray(b.phys))
    obs_c, _ = reset(_keys(4), params, jnp.arange(B))
    assert not np.array_equal(np.asarray(obs_a), np.asarray(obs_c))


def test_reset_draws_metaworld_reset_space_and_one_distractor(env, fns, params) -> None:
    n = B
    _, state = fns[0](_keys(5), params, jnp.arange(n) % params.num_tasks)
    rand = np.asarray(state.reset_vector)
    tid = np.asarray(params.goals[np.asarray(state.task), 0])
    vec = np.asarray(state.vec)
    for i in range(n):
        spec = tasks.TASKS[tid[i]]
        r = rand[i, : len(spec.rand_low)]
        assert np.all(r >= np.array(spec.rand_low, np.float32)) and np.all(r <= np.array(spec.rand_high, np.float32))
        if spec.min_xy_gap:
            assert np.linalg.norm(r[0:2] - r[3:5]) >= spec.min_xy_gap
        slots = vec[i, 7:].reshape(12, 7)
        filled = np.flatnonzero(np.any(slots != 0, axis=1))
        used = np.flatnonzero(tasks.SLOT_USED[tid[i]])
        distractor = int(state.distractor[i])
        assert distractor not in used
        assert set(filled) == set(used) | {distractor}, spec.name
        np.testing.assert_allclose(np.linalg.norm(slots[distractor, 3:]), 1.0, atol=1e-5)
    assert np.all(np.asarray(env.legal(state.vec)))


def test_step_semantics_success_terminal_and_frozen_rows(env, fns, params) -> None:
    """Reach: drive the tcp onto the target with a proportional controller; the success step pays 10 and
    ends the episode; the finished row is frozen and no longer simulated (row 0 reaches, the others do
    not move in y)."""
    task = tasks.TASK_INDEX["reach"]
    reset, step = fns
    _, state = reset(_keys(11), params, jnp.full((B,), task))
    host = env.host
    ended_at, rewards = None, []
    for t in range(100):
        target = state.vec[:, 4:7]
        tcp = env.extras(state).tcp
        move = jnp.clip((target - tcp) / 0.01, -1.0, 1.0)
        action = jnp.concatenate([move.at[1:, 1].set(0.0), jnp.zeros((B, 1))], -1)
        rows_before, live = host.stepper.rows, int((~state.done).sum())
        _, state, reward, done, info = step(_keys(100 + t), state, action, params)
        rewards.append(np.asarray(reward))
        assert host.stepper.rows - rows_before == live  # finished rows are not simulated
        if ended_at is not None:
            assert float(reward[0]) == 0.0 and not bool(info["success"][0])
            np.testing.assert_array_equal(np.asarray(state.vec[0]), frozen)
        if ended_at is None and bool(info["success"][0]):
            ended_at = t
            assert float(reward[0]) == 10.0 and bool(done[0]) and bool(state.success[0])
            frozen = np.asarray(state.vec[0])
        if ended_at is not None and t > ended_at + 3:
            break
    assert ended_at is not None, "the proportional controller never reached the target"
    # before success the reward is the change of the dense reward (which rises as the tcp approaches)
    assert sum(r[0] for r in rewards[:ended_at]) > 0.0


def test_time_limit_truncates_at_100_steps(fns, params) -> None:
    reset, step = fns
    _, state = reset(_keys(2), params, jnp.arange(B))
    for t in range(100):
        _, state, _, done, info = step(_keys(t), state, jnp.zeros((B, 4)), params)
        np.testing.assert_array_equal(np.asarray(info["truncated"]), t == 99)  # nothing succeeds standing still
        np.testing.assert_array_equal(np.asarray(done), t == 99)
    assert np.all(np.asarray(state.t) == 100) and not bool(state.success.any())


def test_vmapped_runs_equal_separate_batches(env, fns, params) -> None:
    """A run axis vmapped over step_batch (as the engine does) == each run stepped on its own: one host call
    per step for all runs, identical results."""
    reset1, step1 = fns
    keys = jnp.stack([_keys(9), _keys(10)])
    tasks_ = jnp.stack([jnp.arange(B), jnp.arange(B)[::-1]])
    _, states = jax.jit(jax.vmap(env.reset_to_task_batch, in_axes=(0, None, 0)))(keys, params, tasks_)
    actions = jax.random.uniform(jax.random.key(1), (2, B, 4), minval=-1, maxval=1)
    step_keys = jnp.stack([_keys(11), _keys(12)])
    calls = env.host.stepper.calls
    _, after, reward, _, _ = jax.jit(jax.vmap(env.step_batch, in_axes=(0, 0, 0, None)))(step_keys, states, actions, params)
    assert env.host.stepper.calls - calls == 1
    for run in range(2):
        _, single = reset1(keys[run], params, tasks_[run])
        # XLA may fuse the reset's arithmetic differently with and without vmap (last-bit differences)
        np.testing.assert_allclose(np.asarray(single.vec), np.asarray(states.vec[run]), atol=1e-5)
        single = jax.tree.map(lambda x: x[run], states)
        _, one, r, _, _ = step1(step_keys[run], single, actions[run], params)
        np.testing.assert_array_equal(np.asarray(one.vec), np.asarray(after.vec[run]))
        np.testing.assert_array_equal(np.asarray(one.phys), np.asarray(after.phys[run]))
        np.testing.assert_array_equal(np.asarray(r), np.asarray(reward[run]))


def test_single_environment_views(env, params) -> None:
    key = jax.random.key(21)
    obs, state = env.reset_to_task(key, params, 2)
    assert obs.shape == (91,) and state.vec.shape == (91,)
    obs2, state2, reward, done, info = env.step(key, state, jnp.array([0.0, 0.0, 0.5, 1.0]), params)
    assert obs2.shape == (91,) and reward.shape == () and done.shape == ()
    assert int(state2.t) == 1


def test_tolerance_and_hamacher_against_hand_values() -> None:
    # inside the bounds → 1; one margin outside → 0.1 for both sigmoids; margin 0 outside → 0
    assert float(tasks.tolerance(0.3, 0.0, 0.5, 0.2)) == 1.0
    np.testing.assert_allclose(float(tasks.tolerance(0.7, 0.0, 0.5, 0.2)), 0.1, rtol=1e-6)
    np.testing.assert_allclose(float(tasks.tolerance(-0.2, 0.0, 0.5, 0.2, "gaussian")), 0.1, rtol=1e-6)
    # long tail at half a margin: 1 / (1 + (3 · 0.5)²) = 1 / 3.25
    np.testing.assert_allclose(float(tasks.tolerance(0.6, 0.0, 0.5, 0.2)), 1 / 3.25, rtol=1e-6)
    np.testing.assert_allclose(float(tasks.tolerance(0.6, 0.0, 0.5, 0.2, "gaussian")), math.exp(-0.5 * 0.25 * 2 * math.log(10)), rtol=1e-6)
    assert float(tasks.tolerance(0.6, 0.0, 0.5, 0.0)) == 0.0
    np.testing.assert_allclose(float(tasks.hamacher(jnp.float32(0.5), jnp.float32(0.5))), 0.25 / 0.75, rtol=1e-6)
    assert float(tasks.hamacher(jnp.float32(0.0), jnp.float32(0.0))) == 0.0


def test_reach_dense_reward_and_success_by_hand() -> None:
    """reach: 10 · tolerance(|tcp - target|, (0, 0.05), margin |hand_init - target|, long tail)."""
    target = np.array([0.1, 0.8, 0.2], np.float32)
    tcp = np.array([0.1, 0.8, 0.35], np.float32)  # 0.15 away: 0.1 beyond the bound
    state = np.zeros(91, np.float32)
    state[0:3] = tcp
    state[4:7] = target
    margin = float(np.linalg.norm(np.array([0.0, 0.6, 0.2]) - target))
    want = 10.0 / (1.0 + (3.0 * 0.1 / margin) ** 2)
    extras = tasks.Extras(tcp=jnp.asarray(tcp), lpad=jnp.zeros(3), rpad=jnp.zeros(3), joint=jnp.zeros(1),
                          consts=jnp.zeros(tasks.CONST_DIM))
    task = jnp.asarray(tasks.TASK_INDEX["reach"])
    np.testing.assert_allclose(float(tasks.dense_reward(jnp.asarray(state), task, jnp.zeros(4), extras)), want, rtol=1e-5)
    assert not bool(tasks.success_from(jnp.asarray(state), task, extras))
    near = extras.replace(tcp=jnp.asarray(target + np.array([0.0, 0.0, 0.049], np.float32)))
    assert bool(tasks.success_from(jnp.asarray(state), task, near))
    # the step reward: 10 on success, otherwise the change of the dense reward
    assert float(tasks.step_reward(jnp.float32(3.0), jnp.float32(4.5), jnp.bool_(False))) == 1.5
    assert float(tasks.step_reward(jnp.float32(3.0), jnp.float32(10.0), jnp.bool_(True))) == 10.0


def test_public_predicates_on_state_vectors(env, fns, params) -> None:
    _, state = fns[0](_keys(1), params, jnp.arange(B))
    goal = env.goal_of(state, params)
    assert goal.shape == (params.num_tasks, tasks.GOAL_DIM)
    ok = env.success(state.vec, goal)
    assert ok.shape == (params.num_tasks,) and not bool(ok.any())  # nothing is solved at reset
    r = env.reward(state.vec, jnp.zeros((params.num_tasks, 4)), state.vec, goal)
    np.testing.assert_allclose(np.asarray(r), 0.0, atol=1e-6)  # no change, no success → 0
    bad = state.vec.at[0, 0].set(jnp.nan).at[1, 3].set(1.5).at[2, 10].set(3.0)  # NaN; opening > 1; bad quaternion
    legal = np.asarray(env.legal(bad))
    assert not legal[0] and not legal[1] and not legal[2] and legal[3:].all()


def test_collect_writes_a_valid_dataset(env, params) -> None:
    from imaginejax.data.collect import collect

    def policy(key, obs, state, params_):
        return jax.random.uniform(key, (obs.shape[0], 4), minval=-1.0, maxval=1.0)

    rows = np.array([0, 3, 7])
    ds = collect(env, params, policy, jax.random.key(0), 3, chunk_size=3, task_indices=rows, progress=False)
    assert ds.states.shape == (3, 101, 91) and ds.actions.shape == (3, 100, 4)
    assert ds.env == "metaworld" and not ds.discrete
    np.testing.assert_array_equal(ds.goals[:, 0], np.asarray(params.goals[rows, 0]))
    # random actions rarely succeed: full-length episodes, truncated (not terminal) at the cap
    lengths = ds.mask.sum(1)
    assert np.all((lengths == 100) == ds.truncations[:, -1])
    assert np.all(ds.terminals.any(1) | ds.truncations.any(1))


def test_bad_level_is_named() -> None:
    with pytest.raises(ValueError, match="valid levels"):
        make_params("medium", embed=False)


def test_levels_tasks_and_instructions() -> None:
    """22 tasks over the four levels (BENCHMARK §2.2), 20 phrasings per task, rephrasings new words."""
    from imaginejax.envs.metaworld import instructions

    assert tasks.LEVEL_TASKS["train"] == ("reach", "push", "pick-place", "button-press", "door-unlock", "door-open",
                                          "window-open", "faucet-open", "coffee-push", "coffee-button")
    assert tasks.LEVEL_TASKS["rephrase"] == tasks.LEVEL_TASKS["train"]
    assert tasks.LEVEL_TASKS["easy"] == ("reach-wall", "push-wall", "pick-place-wall", "button-press-wall",
                                         "door-lock", "door-close", "window-close", "faucet-close")
    assert tasks.LEVEL_TASKS["hard"] == ("make-coffee", "locked-door-open", "hammer", "soccer")
    seen: dict[str, set[str]] = {}
    for level in tasks.LEVELS:
        p = make_params(level, embed=False)
        assert p.max_steps == 100 and p.num_tasks == len(tasks.LEVEL_TASKS[level])
        np.testing.assert_array_equal(np.asarray(p.phrasing_counts), 20)
        table = instructions.level_instructions(level)
        assert len(table) == 20 * p.num_tasks == len(set(table))  # unique within the level
        seen[level] = set(table)
    assert not seen["train"] & seen["rephrase"]
    assert not (seen["train"] | seen["rephrase"]) & (seen["easy"] | seen["hard"])


def test_locked_door_latch_holds_until_unlocked(env, fns, params) -> None:
    """locked-door-open: pulling the handle of the locked door does not move it; after the lock is turned
    (the expert's unlock motion) the same door swings open. (The train table with its first row turned into
    locked-door-open keeps the shapes, so the module's compiled reset and step serve.)"""
    from imaginejax.envs.metaworld import expert

    reset, step = fns
    locked = params.replace(goals=params.goals.at[0].set(jnp.array([tasks.TASK_INDEX["locked-door-open"], 0])))
    _, state = reset(_keys(4), locked, jnp.zeros((B,), jnp.int32))
    handle0 = np.asarray(tasks.slot_of(state.vec, "handle")[:, :3])
    moved = np.zeros(B)
    first_half = (jnp.arange(B) < B // 2)[:, None]

    @jax.jit
    def act(vec: jax.Array) -> jax.Array:
        pull_only = expert._door_open(vec)  # rows 0-4: pull without unlocking
        full = expert.expert_action(vec, jnp.full((B,), tasks.TASK_INDEX["locked-door-open"]))  # rows 5-9
        return jnp.where(first_half, pull_only, full)

    for t in range(100):
        _, state, _, _, _ = step(_keys(200 + t), state, act(state.vec), locked)
        handle = np.asarray(tasks.slot_of(state.vec, "handle")[:, :3])
        moved = np.maximum(moved, np.linalg.norm(handle - handle0, axis=-1))
    assert moved[: B // 2].max() < 0.01, f"a locked door moved by {moved[: B // 2].max():.3f}"
    assert moved[B // 2:].min() > 0.1, f"an unlocked door moved only {moved[B // 2:].min():.3f}"
