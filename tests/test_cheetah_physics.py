"""HalfCheetah physics: both backends against Gymnasium's HalfCheetah-v5, batching through the host
callback, reset distribution, model facts.

Two comparisons with Gymnasium from the same (qpos, qvel) under the same actions (in [-1.5, 1.5], so
MuJoCo's clamping is exercised), max |ours - Gymnasium| over the 17-d observation:

* one step from each of Gymnasium's states along a 60-step trajectory (teacher forcing: no chaos);
* free running for 50 (MuJoCo C) / 15 (MJX) steps. HalfCheetah is chaotic once its feet hit the
  floor: a 1e-15 difference grows ~10x every few steps, so the free-running error at step 50 depends on
  the trajectory (measured 6e-10 .. 7e-6 for MuJoCo C here). The MuJoCo C backend differs from
  Gymnasium only by the float32 hi/lo carry of the float64 state (<= 2^-48 relative) and the solver's
  zero warm start (Gymnasium keeps the last solution).

Measured on this machine (seeds of the tests) / asserted:
  MuJoCo C, one step:      <= 2.1e-12                        / < 1e-10
  MuJoCo C, free running:  steps 1-10 <= 1.8e-13, step 50 5e-6 / steps 1-10 < 1e-10, 1-50 < 1e-3
  MJX (float32), one step: <= 3.1e-5                         / < 2e-3
  MJX, free running:       step 1 3.2e-6, step 15 8.9e-3     / step 1 < 1e-4, 1-15 < 5e-2
"""

from __future__ import annotations

import functools

import gymnasium
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from imaginejax.envs.cheetah import backends, model as M, tasks
from imaginejax.envs.cheetah.backends import Physics, physics_step
from imaginejax.envs.cheetah.env import HalfCheetah, RESET_NOISE_SCALE, make_params

PARITY_STEPS_C = 60
PARITY_CHECKED_C = 50
PARITY_STEPS_MJX = 15


def gym_env():
    env = gymnasium.make("HalfCheetah-v5").unwrapped
    env.reset(seed=0)
    return env


def gym_rollout(qpos: np.ndarray, qvel: np.ndarray, actions: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gymnasium from (qpos, qvel) float64 under actions (T, 6).

    Returns observations (T, 17), x velocity (T,), reward (T,), and the float64 qpos, qvel (T+1, 9)
    of the trajectory (the start state first).
    """
    env = gym_env()
    env.set_state(qpos, qvel)
    obs, xvel, rew, qposes, qvels = [], [], [], [qpos.copy()], [qvel.copy()]
    for a in actions:
        o, r, terminated, truncated, info = env.step(np.asarray(a, np.float64))
        assert not terminated and not truncated
        obs.append(o)
        xvel.append(info["x_velocity"])
        rew.append(r)
        qposes.append(env.data.qpos.copy())
        qvels.append(env.data.qvel.copy())
    return np.asarray(obs), np.asarray(xvel), np.asarray(rew), np.asarray(qposes), np.asarray(qvels)


def start_states(batch: int, seed: int) -> Physics:
    env, params = HalfCheetah("mujoco"), make_params("train", embed=False)
    _, state = env.reset_batch(jax.random.split(jax.random.PRNGKey(seed), batch), params)
    return state.physics


def scan_physics(backend: str):
    """jit(lax.scan) of physics_step: (Physics (B, 9), actions (T, B, 6)) → (Physics (T, B, 9), dx (T, B))."""

    def run(physics: Physics, actions: jax.Array):
        def body(p, a):
            p, dx = physics_step(p, a, backend)
            return p, (p, dx)

        return jax.lax.scan(body, physics, actions)[1]

    return jax.jit(run)


STEP_C = jax.jit(functools.partial(physics_step, backend="mujoco"))


def observation64(physics: Physics) -> np.ndarray:
    """(…, 17) float64 Gymnasium observation [qpos[1:], qvel] from hi + lo."""
    qpos, qvel = physics.as_float64()
    return np.concatenate([qpos[..., 1:], qvel], axis=-1)


# ---------------------------------------------------------------------------------------------------
def test_model_facts_match_gymnasium():
    env = gym_env()
    model = M.load_model()
    assert env.frame_skip == M.FRAME_SKIP and env.dt == pytest.approx(M.DT)
    assert model.opt.timestep == env.model.opt.timestep == M.TIMESTEP
    np.testing.assert_array_equal(model.actuator_gear[:, 0], M.GEAR)
    np.testing.assert_array_equal(model.actuator_ctrlrange, np.tile([-1.0, 1.0], (M.NU, 1)))
    np.testing.assert_allclose(model.jnt_range[3:], M.LEG_JOINT_RANGE, atol=1e-6)
    np.testing.assert_array_equal(model.body_mass, env.model.body_mass)  # same compiled masses
    assert env.observation_space.shape == (tasks.STATE_DIM - 1,)
    assert env.action_space.shape == (tasks.ACTION_DIM,)
    np.testing.assert_array_equal(env.init_qpos, np.zeros(M.NQ))  # the reset noise is around zero
    np.testing.assert_array_equal(env.init_qvel, np.zeros(M.NV))
    assert env._reset_noise_scale == RESET_NOISE_SCALE


def one_step_errors(backend: str, qposes: np.ndarray, qvels: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Teacher forcing: one step of ours from each Gymnasium state (T+1, 9) under actions (T, 6);
    returns the max abs error against Gymnasium's next observation, (T,)."""
    start = Physics.from_float64(qposes[:-1], qvels[:-1])
    step = STEP_C if backend == "mujoco" else jax.jit(functools.partial(physics_step, backend=backend))
    after, _ = step(start, jnp.asarray(actions))
    want = np.concatenate([qposes[1:, 1:], qvels[1:]], axis=-1)
    return np.abs(observation64(after) - want).max(axis=-1)


def test_mujoco_backend_matches_gymnasium():
    batch = 3
    physics = start_states(batch, seed=1)
    actions = np.random.default_rng(1).uniform(-1.5, 1.5, (PARITY_STEPS_C, batch, 6)).astype(np.float32)
    traj, dx = scan_physics("mujoco")(physics, jnp.asarray(actions))
    ours = observation64(traj)  # (T, B, 17)
    qpos0, qvel0 = physics.as_float64()
    free = np.zeros(PARITY_STEPS_C)
    forced = np.zeros(PARITY_STEPS_C)
    for b in range(batch):
        obs, xvel, _, qposes, qvels = gym_rollout(qpos0[b], qvel0[b], actions[:, b])
        free = np.maximum(free, np.abs(ours[:, b] - obs).max(axis=1))
        forced = np.maximum(forced, one_step_errors("mujoco", qposes, qvels, actions[:, b]))
        # x displacement of every step = Gymnasium's x velocity × dt (float32 rounding of a float64 value)
        np.testing.assert_allclose(np.asarray(dx[:10, b], np.float64), xvel[:10] * M.DT, rtol=1e-6, atol=1e-9)
    print(f"\nMuJoCo C vs Gymnasium: one step max {forced.max():.1e}; free running max at steps "
          f"1/10/20/50/60: {free[0]:.1e} {free[9]:.1e} {free[19]:.1e} {free[49]:.1e} {free[59]:.1e}")
    assert forced.max() < 1e-10
    assert free[:10].max() < 1e-10
    assert free[:PARITY_CHECKED_C].max() < 1e-3


def test_x_displacement_is_float64_difference_of_x():
    physics = start_states(4, seed=2)
    actions = jnp.asarray(np.random.default_rng(2).uniform(-1, 1, (4, 6)), jnp.float32)
    after, dx = STEP_C(physics, actions)
    x0 = physics.as_float64()[0][:, 0]
    x1 = after.as_float64()[0][:, 0]
    np.testing.assert_allclose(np.asarray(dx, np.float64), x1 - x0, rtol=1e-7, atol=0)
    assert np.all(np.abs(np.asarray(dx)) > 0)


def test_mjx_backend_matches_gymnasium():
    """One compiled MJX step (batch 2) serves both the free-running and the teacher-forced comparison
    (MJX compiles slowly on a CPU)."""
    batch = 2
    physics = start_states(batch, seed=3)
    actions = np.random.default_rng(3).uniform(-1.5, 1.5, (PARITY_STEPS_MJX, batch, 6)).astype(np.float32)
    step = jax.jit(functools.partial(physics_step, backend="mjx"))
    qpos0, qvel0 = physics.as_float64()
    gym = [gym_rollout(qpos0[b], qvel0[b], actions[:, b]) for b in range(batch)]
    free = np.zeros(PARITY_STEPS_MJX)
    forced = np.zeros(PARITY_STEPS_MJX)
    p = physics
    for t in range(PARITY_STEPS_MJX):
        p, dx = step(p, jnp.asarray(actions[t]))
        assert p.qpos.dtype == jnp.float32 and not np.any(np.asarray(p.qpos_lo))
        gym_obs = np.stack([g[0][t] for g in gym])
        free[t] = np.abs(observation64(p) - gym_obs).max()
        np.testing.assert_allclose(np.asarray(dx), [g[1][t] * M.DT for g in gym], atol=2e-3)
        start = Physics.from_float64(np.stack([g[3][t] for g in gym]), np.stack([g[4][t] for g in gym]))
        forced[t] = np.abs(observation64(step(start, jnp.asarray(actions[t]))[0]) - gym_obs).max()
    print(f"\nMJX vs Gymnasium: one step max {forced.max():.1e}; free running max at steps 1/5/10/15: "
          f"{free[0]:.1e} {free[4]:.1e} {free[9]:.1e} {free[14]:.1e}")
    assert forced.max() < 2e-3
    assert free[0] < 1e-4
    assert free.max() < 5e-2


def test_vmapped_step_is_one_host_call_with_the_same_result():
    runs, batch = 3, 4
    physics = jax.tree.map(lambda x: x.reshape(runs, batch, -1), start_states(runs * batch, seed=4))
    actions = jnp.asarray(np.random.default_rng(4).uniform(-1, 1, (runs, batch, 6)), jnp.float32)
    runner = backends.get_runner()
    step = jax.jit(jax.vmap(lambda p, a: physics_step(p, a, "mujoco")))
    jax.block_until_ready(step(physics, actions))
    calls, rows = runner.calls, runner.rows
    out, dx = step(physics, actions)
    jax.block_until_ready(out)
    assert runner.calls == calls + 1 and runner.rows == rows + runs * batch
    # the same rows stepped one by one (unbatched calls) give bitwise the same numbers
    single = STEP_C
    for r, b in [(0, 0), (1, 2), (2, 3)]:
        one, dx_one = single(jax.tree.map(lambda x: x[r, b], physics), actions[r, b])
        for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(one)):
            np.testing.assert_array_equal(np.asarray(got[r, b]), np.asarray(want))
        assert float(dx[r, b]) == float(dx_one)


def test_scan_makes_one_host_call_per_step():
    steps, batch = 7, 5
    physics = start_states(batch, seed=5)
    actions = jnp.asarray(np.random.default_rng(5).uniform(-1, 1, (steps, batch, 6)), jnp.float32)
    run = scan_physics("mujoco")
    jax.block_until_ready(run(physics, actions))
    runner = backends.get_runner()
    calls = runner.calls
    traj, _ = run(physics, actions)
    jax.block_until_ready(traj)
    assert runner.calls == calls + steps
    # stepping in a Python loop gives the same trajectory
    step = STEP_C
    p = physics
    for t in range(steps):
        p, _ = step(p, actions[t])
    np.testing.assert_array_equal(np.asarray(p.qvel), np.asarray(traj.qvel[-1]))


def test_inactive_and_nonfinite_rows():
    physics = start_states(4, seed=6)
    actions = np.random.default_rng(6).uniform(-1, 1, (4, 6)).astype(np.float32)
    actions[2, 3] = np.nan
    active = jnp.asarray([True, False, True, True])
    runner = backends.get_runner()
    step = lambda p, a, m: STEP_C(p, a, active=m)
    jax.block_until_ready(step(physics, jnp.asarray(actions), active))
    rows = runner.rows
    out, dx = step(physics, jnp.asarray(actions), active)
    jax.block_until_ready(out)
    assert runner.rows == rows + 2  # the inactive row and the non-finite row are not simulated
    for got, was in zip(jax.tree.leaves(out), jax.tree.leaves(physics)):
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(was[1]))  # inactive: unchanged
    assert float(dx[1]) == 0.0
    assert np.all(np.isnan(np.asarray(out.qpos[2]))) and np.isnan(float(dx[2]))
    assert np.all(np.isfinite(np.asarray(out.qpos)[[0, 3]]))


def test_actions_are_clamped_like_gymnasium():
    physics = start_states(2, seed=7)
    base = np.random.default_rng(7).uniform(-1, 1, (2, 6)).astype(np.float32)
    big = base.copy()
    big[:, 0], big[:, 3] = 3.0, -5.0  # beyond ctrlrange: MuJoCo clamps to ±1
    clamped = np.clip(big, -1.0, 1.0)
    step = STEP_C
    out_big, _ = step(physics, jnp.asarray(big))
    out_clamped, _ = step(physics, jnp.asarray(clamped))
    np.testing.assert_array_equal(np.asarray(out_big.qvel), np.asarray(out_clamped.qvel))
    assert not np.array_equal(np.asarray(out_big.qvel), np.asarray(step(physics, jnp.asarray(base))[0].qvel))


def test_reset_distribution_is_gymnasium_v5():
    env, params = HalfCheetah("mujoco"), make_params("train", embed=False)
    n = 4096
    reset = jax.jit(env.reset_batch)
    obs, state = reset(jax.random.split(jax.random.PRNGKey(8), n), params)
    qpos = np.asarray(state.physics.qpos)
    qvel = np.asarray(state.physics.qvel)
    # qpos ~ U[-0.1, 0.1]: range, mean 0, std 0.2/sqrt(12); qvel ~ 0.1 N(0, 1)
    assert qpos.min() >= -0.1 and qpos.max() <= 0.1 and qpos.max() > 0.099 and qpos.min() < -0.099
    np.testing.assert_allclose(qpos.mean(0), 0.0, atol=0.004)
    np.testing.assert_allclose(qpos.std(0), 0.2 / np.sqrt(12), rtol=0.05)
    np.testing.assert_allclose(qvel.mean(0), 0.0, atol=0.008)
    np.testing.assert_allclose(qvel.std(0), 0.1, rtol=0.05)
    kurtosis = ((qvel / qvel.std(0)) ** 4).mean(0)  # 3 for a normal, 1.8 for a uniform
    np.testing.assert_allclose(kurtosis, 3.0, atol=0.4)
    # no correlation between coordinates (independent draws)
    corr = np.corrcoef(np.concatenate([qpos, qvel], 1).T) - np.eye(18)
    assert np.abs(corr).max() < 0.08
    assert not np.any(np.asarray(state.physics.qpos_lo)) and not np.any(np.asarray(state.dx))
    np.testing.assert_array_equal(np.asarray(obs[:, 1:9]), qpos[:, 1:])
    assert not np.any(np.asarray(obs[:, 0]))
    counts = np.bincount(np.asarray(state.task), minlength=params.num_tasks)
    assert counts.min() > n / params.num_tasks * 0.85
    # different keys → different states; the same key → the same state
    _, again = reset(jax.random.split(jax.random.PRNGKey(8), n), params)
    np.testing.assert_array_equal(np.asarray(again.physics.qvel), qvel)


def test_rest_height_constant():
    physics = Physics.from_qpos_qvel(jnp.zeros((1, 9)), jnp.zeros((1, 9)))
    run = scan_physics("mujoco")
    traj, _ = run(physics, jnp.zeros((100, 1, 6)))
    rootz = np.asarray(traj.qpos[-10:, 0, 1])
    np.testing.assert_allclose(rootz, tasks.REST_HEIGHT, atol=0.01)
    state = tasks.state_vector(jnp.zeros(()), traj.qpos[-1, 0], traj.qvel[-1, 0])
    assert float(tasks.hop_height(state)) < 0.01 and bool(tasks.legal(state))


def test_random_policy_states_are_legal():
    batch, steps = 8, 100
    physics = start_states(batch, seed=9)
    actions = jnp.asarray(np.sign(np.random.default_rng(9).uniform(-1, 1, (steps, batch, 6))), jnp.float32)
    traj, dx = scan_physics("mujoco")(physics, actions)
    states = tasks.state_vector(dx, traj.qpos, traj.qvel)
    assert bool(tasks.legal(states).all())


def test_unknown_backend_and_bad_shapes():
    with pytest.raises(ValueError, match="valid backends"):
        HalfCheetah("cuda")
    physics = start_states(2, seed=0)
    with pytest.raises(ValueError, match="action must have shape"):
        physics_step(physics, jnp.zeros((2, 5)), "mujoco")
    with pytest.raises(ValueError, match="qpos must be"):
        Physics.from_qpos_qvel(jnp.zeros((2, 8)), jnp.zeros((2, 9)))
    assert backends.resolve_backend("auto") == ("mujoco" if jax.default_backend() == "cpu" else "mjx")


@pytest.mark.parametrize("rows", [5, 2 * backends.SERIAL_BELOW])
def test_runner_float64_step_matches_plain_mj_step(rows):
    """The batched rollout (serial below SERIAL_BELOW rows, the thread pool above) equals a plain
    ``mj_step`` loop from a fresh ``MjData`` (zero warm start), bit for bit."""
    runner = backends.get_runner()
    rng = np.random.default_rng(rows)
    qpos, qvel = rng.uniform(-.1, .1, (rows, 9)), rng.normal(0, .1, (rows, 9))
    act = rng.uniform(-1, 1, (rows, 6))
    q1, v1 = runner.step64(qpos, qvel, act)
    model = M.load_model()
    data = mujoco.MjData(model)
    for i in range(rows):
        mujoco.mj_resetData(model, data)
        data.qpos[:], data.qvel[:], data.ctrl[:] = qpos[i], qvel[i], act[i]
        mujoco.mj_step(model, data, nstep=M.FRAME_SKIP)
        np.testing.assert_array_equal(q1[i], data.qpos)
        np.testing.assert_array_equal(v1[i], data.qvel)
