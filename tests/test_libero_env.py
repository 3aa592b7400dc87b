"""LIBERO-style environment on MuJoCo C: the JAX kinematics against MuJoCo's, the delta-pose controller's
tracking error, grasp physics (a grasped object rises with the gripper and falls when released), the reset
distribution, and the environment contract (shapes, frozen finished rows, registry-style construction)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from imaginejax.envs.base import instruction_table, make_level_params
from imaginejax.envs.libero import model as M
from imaginejax.envs.libero import tasks
from imaginejax.envs.libero.env import RESET_TRIES, Libero, make_params
from imaginejax.envs.libero.expert import expert_action

# Tracking bound of the controller (measured: mean 3.9 mm, max 9.2 mm after one step over 30 random
# translations of up to 5 cm per axis from the home posture).
TRACKING_BOUND_ONE_STEP = 0.012
TRACKING_BOUND_SETTLED = 0.010


def params_for(names: list[str]):
    goals = np.array([[tasks.TASK_INDEX[n], tasks.TASKS[tasks.TASK_INDEX[n]].kind, tasks.TASKS[tasks.TASK_INDEX[n]].a,
                       tasks.TASKS[tasks.TASK_INDEX[n]].b, tasks.TASKS[tasks.TASK_INDEX[n]].layout] for n in names],
                     np.int32)
    return make_level_params("train", goals, instruction_table([(n,) for n in names]), tasks.MAX_STEPS, embed=False,
                             reset_tries=RESET_TRIES)


@pytest.fixture(scope="module")
def env() -> Libero:
    return Libero(backend="mujoco")


def test_fk_and_jacobian_match_mujoco() -> None:
    model = M.load_model()
    data = mujoco.MjData(model)
    site = model.site("tcp").id
    rng = np.random.default_rng(0)
    fk = jax.jit(M.fk)
    jac = jax.jit(M.jacobian)
    for _ in range(8):
        q = rng.uniform(M.JOINT_LOW, M.JOINT_HIGH)
        data.qpos[:7] = q
        mujoco.mj_forward(model, data)
        tcp, quat, _, _ = fk(jnp.asarray(q, jnp.float32))
        np.testing.assert_allclose(np.asarray(tcp), data.site_xpos[site], atol=2e-6)
        mat = np.zeros(9)
        mujoco.mju_quat2Mat(mat, np.asarray(quat, np.float64))
        np.testing.assert_allclose(mat, data.site_xmat[site], atol=2e-6)
        jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
        mujoco.mj_jacSite(model, data, jacp, jacr, site)
        np.testing.assert_allclose(np.asarray(jac(jnp.asarray(q, jnp.float32))), np.concatenate([jacp, jacr])[:, :7],
                                   atol=2e-5)


def test_model_layout_and_mjx_supported_pairs() -> None:
    model = M.load_model()
    assert (model.nq, model.nv, model.nu) == (M.NQ, M.NV, M.CTRL_DIM)
    assert model.opt.timestep * M.FRAME_SKIP == pytest.approx(0.05)  # 20 Hz
    colliding = {int(model.geom_type[g]) for g in range(model.ngeom) if model.geom_contype[g] or model.geom_conaffinity[g]}
    allowed = {int(mujoco.mjtGeom.mjGEOM_PLANE), int(mujoco.mjtGeom.mjGEOM_BOX), int(mujoco.mjtGeom.mjGEOM_CAPSULE)}
    assert colliding <= allowed  # every collision pair is one MJX implements
    # object masses as stated
    for k, name in enumerate(M.OBJECTS[:3]):
        assert model.body(name).mass[0] == pytest.approx(M.OBJECT_MASS[k])


def test_controller_tracking_error_is_bounded(env: Libero) -> None:
    names = ["reach-soup_can"]
    params = params_for(names)
    batch = 24
    keys = jax.random.split(jax.random.key(3), batch)
    _, state = env.reset_to_task_batch(keys, params, jnp.zeros(batch, jnp.int32))
    move = jax.random.uniform(jax.random.key(4), (batch, 3), minval=-1.0, maxval=1.0)
    action = jnp.concatenate([move, jnp.zeros((batch, 3)), -jnp.ones((batch, 1))], -1)
    hold = jnp.zeros((batch, 7)).at[:, 6].set(-1.0)
    step = jax.jit(env.step_batch)
    start = state.vec[:, 7:10]
    _, s1, _, _, _ = step(keys, state, action, params)
    _, s2, _, _, _ = step(keys, s1, hold, params)
    _, s3, _, _, _ = step(keys, s2, hold, params)
    want = start + M.POS_SCALE * move
    err1 = np.linalg.norm(np.asarray(s1.vec[:, 7:10] - want), axis=-1)
    err3 = np.linalg.norm(np.asarray(s3.vec[:, 7:10] - want), axis=-1)
    print(f"\ntracking error after one step: mean {err1.mean():.4f} max {err1.max():.4f}; "
          f"after two more held steps: mean {err3.mean():.4f} max {err3.max():.4f}")
    assert err1.max() < TRACKING_BOUND_ONE_STEP
    assert err3.max() < TRACKING_BOUND_SETTLED
    # a pure rotation command turns the hand by ROT_SCALE about the world z axis and barely moves the tcp
    spin = jnp.zeros((batch, 7)).at[:, 5].set(1.0).at[:, 6].set(-1.0)
    _, r1, _, _, _ = step(keys, state, spin, params)
    _, r2, _, _, _ = step(keys, r1, hold, params)
    turned = np.asarray(M.yaw_of(r2.vec[:, 10:14]) - M.yaw_of(state.vec[:, 10:14]))
    turned = (turned + np.pi) % (2 * np.pi) - np.pi
    np.testing.assert_allclose(turned, M.ROT_SCALE, atol=0.03)
    assert np.linalg.norm(np.asarray(r2.vec[:, 7:10] - start), axis=-1).max() < TRACKING_BOUND_SETTLED


def test_grasped_object_lifts_with_the_gripper_and_falls_when_released(env: Libero) -> None:
    names = ["pick-soup_can", "pick-cream_cheese", "pick-salad_dressing"]
    params = params_for(names)
    per = 2
    batch = 3 * per
    obj = np.repeat(np.arange(3), per)
    keys = jax.random.split(jax.random.key(10), batch)
    _, state = env.reset_to_task_batch(keys, params, jnp.asarray(obj, jnp.int32))
    goal = params.goals[state.task]

    @jax.jit
    def pick(state):
        def body(state, _):
            action = expert_action(state.vec, goal, state.progress)
            _, state, _, _, _ = env.step_batch(keys, state, action, params)
            return state, None
        return jax.lax.scan(body, state, None, 60)[0]

    state = pick(state)
    assert np.asarray(state.success).all(), "the expert did not pick every object up"
    step = jax.jit(env.step_batch)

    def run(state, action, n):
        for _ in range(n):  # the pick predicate keeps holding: keep the rows running
            _, state, _, _, _ = step(keys, state.replace(done=jnp.zeros(batch, bool)), action, params)
        return state

    rows = np.arange(batch)
    pos = lambda s: np.asarray(tasks.object_pos(s.vec, jnp.asarray(obj)))  # noqa: E731
    before = pos(state)
    # keep lifting 6 cm with the gripper closed: the object follows the fingertips
    state = run(state, jnp.zeros((batch, 7)).at[:, 2].set(0.4).at[:, 6].set(1.0), 3)
    after, eef = pos(state), np.asarray(state.vec[:, 7:10])
    assert (after[:, 2] - before[:, 2] > 0.045).all(), (before, after)
    assert (np.linalg.norm(after - eef, axis=-1) < tasks.NEAR).all()
    # open the gripper and hold still: it falls back to the floor while the hand stays up
    state = run(state, jnp.zeros((batch, 7)).at[:, 6].set(-1.0), 12)
    dropped = pos(state)
    assert (dropped[:, 2] < np.asarray(M.REST_Z)[obj] + 0.01).all(), dropped
    assert (np.asarray(state.vec[rows, 9]) > eef[:, 2] - 0.01).all()
    assert np.asarray(tasks.legal(state.vec)).all()


def test_reset_distribution_and_layouts(env: Libero) -> None:
    names = ["pick-soup_can", "place-salad_dressing-in-basket", "fire-take-cream_cheese-out"]
    params = params_for(names)
    batch = 48
    rows = jnp.arange(batch) % 3
    obs, state = jax.jit(env.reset_to_task_batch)(jax.random.split(jax.random.key(0), batch), params, rows)
    vec = np.asarray(state.vec)
    assert obs.shape == (batch, tasks.STATE_DIM) and np.asarray(tasks.legal(state.vec)).all()
    rows = np.asarray(rows)
    floor = rows == 0
    # on the floor: every object at rest height (within 3 mm), upright, centres at least 0.12 apart
    for k in range(3):
        np.testing.assert_allclose(vec[floor, 16 + 7 * k + 2], M.REST_Z[k], atol=0.003)
        tilt = 1 - 2 * (vec[floor, 16 + 7 * k + 4] ** 2 + vec[floor, 16 + 7 * k + 5] ** 2)  # z axis · world z
        assert (tilt > 0.99).all()
    xy = vec[floor][:, [16, 17, 23, 24, 30, 31]].reshape(-1, 3, 2)
    gaps = np.linalg.norm(xy[:, :, None] - xy[:, None], axis=-1) + 10 * np.eye(3)
    assert gaps.min() > 0.12
    # held: the bottle between the fingers, above the floor
    held = vec[rows == 1]
    assert (np.linalg.norm(held[:, 30:33] - held[:, 7:10], axis=-1) < 0.02).all()
    assert (held[:, 32] > 0.2).all() and (held[:, 14] + held[:, 15] < 0.06).all()
    # in the basket: the cheese inside it
    inside = state.vec[rows == 2]
    assert np.asarray(tasks.in_basket(inside, 1)).all()
    # no task is already solved at reset
    goal = params.goals[state.task]
    assert not np.asarray(tasks.success(state.vec, goal, state.progress)).any()


def test_contract_frozen_rows_and_params(env: Libero) -> None:
    params = make_params("train", embed=False)
    assert params.num_tasks == 6 and params.max_steps == 500
    obs, state = env.reset(jax.random.key(1), params)
    assert obs.shape == (44,)
    obs, state2, reward, done, info = env.step(jax.random.key(2), state, jnp.zeros(7), params)
    assert obs.shape == (44,) and reward.shape == () and not bool(done)
    assert set(info) == {"success", "truncated"}
    # a finished row is frozen: same physics, reward 0
    frozen = state2.replace(done=jnp.asarray(True))
    _, state3, reward3, done3, _ = env.step(jax.random.key(3), frozen, jnp.ones(7), params)
    np.testing.assert_array_equal(np.asarray(state3.vec), np.asarray(state2.vec))
    assert float(reward3) == 0.0 and bool(done3)
    with pytest.raises(ValueError, match="action must have shape"):
        env.step_batch(jax.random.split(jax.random.key(0), 1), jax.tree.map(lambda x: x[None], state), jnp.zeros((1, 6)),
                       params)
    with pytest.raises(ValueError, match="valid backends"):
        Libero(backend="mjx-gpu")
