"""Meta-World's MJX backend: the MJX-friendly models (every scene accepted by ``mjx.put_model``, the
substitutions as documented) and MJX against MuJoCo C on those models over a short horizon.

MJX compiles slowly on a CPU (one environment step of reach: 258 s on a 2-core machine at load ~11), so the
MJX-vs-MuJoCo-C agreement of the physics (reset's 250 settling steps, then 10 environment steps) is checked on
one scene, ``reach`` (the Sawyer arm, fingers, a free puck on the table: every contact kind of the arm–object
scenes), with one compiled physics kernel shared by the reset and the step. Three more scenes (COVER_TASKS:
hammer, soccer, locked-door-open) step from MuJoCo C's reset state: with reach they hold every kind of contact
pair, joint and equality of the 22 scenes (checked by a test). Every scene is covered by the put_model, layout,
control and kinematics tests (mocap-placed fixtures; each task's reset writes on MuJoCo C's settled state, all 22
in one batch), and all 22 are compared over 20 expert steps by ``experiments/benchmarks/metaworld_mjx.py parity``
(table in docs/metaworld_mjx.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from imaginejax.envs.metaworld import mjx_model, scenes, tasks
from imaginejax.envs.metaworld.env import MetaWorld, make_params
from imaginejax.envs.metaworld.host import get_host
from imaginejax.envs.mujoco_host import FULLPHYSICS, state_layout

mjx = pytest.importorskip("mujoco.mjx")

PARITY_TASK = "reach"
HORIZON = 10          # environment steps (50 MuJoCo steps of 2.5 ms)
POS_TOL = 2e-3        # m: hand, fingers, pads, object (float32 MJX vs float64 MuJoCo C, same model)
RESET_POS_TOL = 1e-3  # m: the same and the task's constants after the reset's 250 steps (measured 4.5e-4)
ARM_TOL = 2e-2        # rad: the arm's joints after the reset (measured 7.5e-3)
QUAT_TOL = 1e-2       # object quaternion entries


def _scene_keys() -> dict[tuple[str, str | None], str]:
    """One task per distinct scene (file and edit)."""
    out: dict[tuple[str, str | None], str] = {}
    for t in tasks.TASKS:
        out.setdefault((t.scene.xml, t.scene.edit), t.name)
    return out


def _uniform_rand(ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(N, RAND_DIM) reset vectors drawn uniformly in each row's task range (``ids`` (N,) task ids)."""
    low, high = tasks.RAND_LOW[ids], tasks.RAND_HIGH[ids]
    return low + rng.uniform(size=low.shape) * (high - low)


@pytest.fixture(scope="module")
def friendly_host():
    return get_host(1, mjx_friendly=True)


def test_every_scene_is_accepted_by_put_model_and_the_originals_are_not() -> None:
    refused = 0
    for (xml, _), name in _scene_keys().items():
        scene = tasks.TASKS[tasks.TASK_INDEX[name]].scene
        try:
            mjx.put_model(scenes.build_model(scene))
        except NotImplementedError:
            refused += 1
        model = scenes.build_model(scene, mjx_friendly=True)
        mjx.put_model(model)  # raises NotImplementedError if a pair is unsupported
        assert not np.any(model.geom_type[(model.geom_contype | model.geom_conaffinity) != 0]
                          == mujoco.mjtGeom.mjGEOM_CYLINDER), xml
        coll = (model.geom_contype | model.geom_conaffinity) != 0
        assert np.all(model.geom_margin[coll] == 0) and np.all(model.geom_gap[coll] == 0), xml
    assert refused >= 10  # the transform is what makes them acceptable (measured: 14 of 16 scenes refused)


def test_transform_keeps_layouts_inertia_and_sensor_readings(friendly_host) -> None:
    original = get_host(1)
    for k, t in enumerate(tasks.TASKS):
        a, b = original.models[k], friendly_host.models[k]
        assert state_layout(a, FULLPHYSICS) == state_layout(b, FULLPHYSICS), t.name
        np.testing.assert_allclose(a.body_mass, b.body_mass, rtol=0, atol=1e-12)
        np.testing.assert_allclose(a.body_inertia, b.body_inertia, rtol=0, atol=1e-12)
    # the same reset (arm settling, task writes) reads the same observables to the contact-margin change
    rand = np.stack([0.5 * (tasks.RAND_LOW[k] + tasks.RAND_HIGH[k]) for k in range(len(tasks.TASKS))])
    ids = np.arange(len(tasks.TASKS))
    s0, s1 = original.reset64(ids, rand)["sensors"], friendly_host.reset64(ids, rand)["sensors"]
    np.testing.assert_allclose(s0, s1, atol=5e-3)


def test_cylinders_become_prisms_on_the_cylinder() -> None:
    """The puck (a cylinder of radius 2 cm, half-height 2 cm) becomes a 16-gon prism whose vertices lie on
    its rim, and sensors of its frame read the same pose."""
    scene = tasks.TASKS[tasks.TASK_INDEX["reach"]].scene
    before = scenes.build_model(scene)
    model = scenes.build_model(scene, mjx_friendly=True)
    g = before.geom("objGeom").id
    assert before.geom_type[g] == mujoco.mjtGeom.mjGEOM_CYLINDER
    assert model.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH
    mesh = model.geom_dataid[g]
    vert = model.mesh_vert[model.mesh_vertadr[mesh]:model.mesh_vertadr[mesh] + model.mesh_vertnum[mesh]]
    assert vert.shape == (2 * mjx_model.CYLINDER_SIDES, 3)
    # centred at the origin (the compiler may turn it to its principal axes): every vertex on the rim of
    # the 2 cm x 2 cm cylinder is at hypot(radius, half-height) from the centre
    np.testing.assert_allclose(np.linalg.norm(vert, axis=1), np.hypot(0.02, 0.02), atol=1e-7)
    np.testing.assert_allclose(vert.mean(0), 0.0, atol=1e-9)
    d0, d1 = mujoco.MjData(before), mujoco.MjData(model)
    mujoco.mj_forward(before, d0)
    mujoco.mj_forward(model, d1)
    np.testing.assert_allclose(d0.sensordata, d1.sensordata, atol=1e-12)


def test_substitutions_of_the_reach_scene_are_the_documented_ones() -> None:
    """reach: one colliding cylinder (the puck), four finger boxes with a 1 mm margin, the floor plane."""
    spec = mujoco.MjSpec.from_file(str(scenes.assets_dir() / "sawyer_xyz" / "sawyer_reach_v3.xml"))
    model, subs = mjx_model.mjx_friendly(spec)
    assert subs.cylinders == ("objGeom",)
    assert sorted(subs.margins) == ["leftclaw_it", "leftpad_geom", "rightclaw_it", "rightpad_geom"]
    assert subs.filtered == ("floor",)
    assert subs.inertia_kept == ("obj",)
    assert spec.geom("objGeom").type == mujoco.mjtGeom.mjGEOM_CYLINDER  # the input spec is not changed
    with pytest.raises(ValueError, match="sides"):
        mjx_model.mjx_friendly(spec, sides=4)


def test_contact_filter_drops_the_floor_and_moving_fixture_parts_against_the_table() -> None:
    """window-open: the sliding pane (windowb_a) keeps its contacts with the gripper and its own frame
    (the unnamed window body and windowb_b), loses those with the table and its walls; no floor pairs."""
    from mujoco.mjx._src.collision_driver import geom_pairs

    scene = tasks.TASKS[tasks.TASK_INDEX["window-open"]].scene
    model = scenes.build_model(scene, mjx_friendly=True)
    before = scenes.build_model(scene)

    def body_pairs(m):
        return {tuple(sorted((m.body(m.geom_bodyid[a]).name, m.body(m.geom_bodyid[b]).name)))
                for a, b, _ in geom_pairs(m)}

    now, was = body_pairs(model), body_pairs(before)
    gripper = {"right_hand", "rightclaw", "rightpad", "leftclaw", "leftpad"}
    assert {("leftpad", "windowb_a"), ("", "windowb_a"), ("windowb_a", "windowb_b")} <= now
    assert ("tablelink", "windowb_a") in was and ("tablelink", "windowb_a") not in now
    assert ("RetainingWall", "windowb_a") in was and ("RetainingWall", "windowb_a") not in now
    assert not any("world" in p for p in now) and any("world" in p for p in was)
    assert now <= was
    assert all(set(p) & gripper or "windowb_a" in p for p in now)
    assert all(p in now for p in was if set(p) & gripper and "world" not in p)  # the gripper keeps everything
    assert (mjx_model.candidate_pairs(before), mjx_model.candidate_pairs(model)) == (331, 260)


def test_jax_controls_equal_the_hosts(friendly_host) -> None:
    from imaginejax.envs.metaworld.mjx_backend import MjxPhysics, controls

    physics = MjxPhysics(friendly_host)
    n = len(tasks.TASKS)
    ids = np.arange(n)
    rand = np.stack([0.5 * (tasks.RAND_LOW[k] + tasks.RAND_HIGH[k]) for k in ids])
    out = friendly_host.reset64(ids, rand)
    state, control = out["state"], out["control"]
    lock = np.where(np.arange(n) == tasks.TASK_INDEX["locked-door-open"])[0][0]
    qpos = state_layout(friendly_host.models[lock], FULLPHYSICS)["qpos"].start
    lock_qpos = qpos + friendly_host.models[lock].jnt_qposadr[friendly_host.models[lock].body("lock_link").jntadr[0]]
    state[lock, lock_qpos] = 0.1  # unlocked: the latch must release
    rng = np.random.default_rng(0)
    for _ in range(3):
        action = rng.uniform(-1.5, 1.5, (n, 4)).astype(np.float32)
        want = friendly_host.controls64(control, action, ids, state)
        got = controls(physics, jnp.asarray(control, jnp.float32), jnp.asarray(action), jnp.asarray(ids),
                       jnp.asarray(state, jnp.float32))
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)
        control = want


def test_backend_choice_and_bad_options_are_named() -> None:
    assert MetaWorld().backend == ("mujoco" if jax.default_backend() == "cpu" else "mjx")
    with pytest.raises(ValueError, match="backend"):
        MetaWorld(backend="warp")
    with pytest.raises(ValueError, match="tasks"):
        MetaWorld(backend="mjx", tasks=("reach-the-moon",))
    with pytest.raises(ValueError, match="MuJoCo C"):
        MetaWorld(backend="mujoco", tasks=("reach",))
    with pytest.raises(ValueError, match="mjx_chunk"):
        MetaWorld(backend="mujoco", mjx_chunk=8)
    from imaginejax.envs.metaworld.mjx_backend import MjxPhysics

    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="chunk must be a positive number of rows"):
            MjxPhysics(get_host(1, mjx_friendly=True), ("reach",), chunk=bad)


def test_mocap_descendants_follow_the_mocap_pose(friendly_host) -> None:
    """mjx.kinematics leaves a mocap body's children at the file pose (mujoco-mjx 3.17); MjxPhysics's model of a
    row carries the row's mocap poses, so every body (door frame, door, lock) sits where MuJoCo C puts it."""
    from imaginejax.envs.metaworld.mjx_backend import MjxPhysics

    physics = MjxPhysics(friendly_host, ["door-open"])
    k = tasks.TASK_INDEX["door-open"]
    m = friendly_host.models[k]
    d = mujoco.MjData(m)
    door = friendly_host.fixture_mocaps[k][0]
    d.mocap_pos[door] = [0.07, 0.88, 0.15]
    d.mocap_quat[door] = [0.9, 0.0, 0.0, 0.3]  # unnormalised, turned about z
    d.qpos[:] = m.qpos0 + 0.1
    mujoco.mj_kinematics(m, d)
    ctrl = jnp.zeros(friendly_host.control_width, jnp.float32)
    cl = friendly_host.control_layouts[k]
    ctrl = ctrl.at[cl["mocap_pos"]].set(d.mocap_pos.reshape(-1)).at[cl["mocap_quat"]].set(d.mocap_quat.reshape(-1))
    phys = jnp.zeros(friendly_host.state_width, jnp.float32).at[friendly_host.state_layouts[k]["qpos"]].set(d.qpos)
    got = jax.jit(lambda p, c: mjx.kinematics(physics._model(0, c), physics._data(0, p, c)).xpos)(phys, ctrl)
    assert np.abs(d.xpos[m.body("door_link").id] - d.mocap_pos[door]).max() > 0.05  # a child, away from the mocap
    np.testing.assert_allclose(np.asarray(got), d.xpos, atol=1e-5)


def test_reset_writes_of_every_task_agree_with_mujoco_c(friendly_host) -> None:
    """The last step of the reset (each task's qpos/qvel writes, constants and first observation: TASK_RESETS)
    in JAX on MuJoCo C's settled state, for all 22 tasks in one batch: = MuJoCo C's reset64 (float32)."""
    from imaginejax.envs.metaworld.mjx_backend import MjxPhysics

    physics = MjxPhysics(friendly_host)
    ids = np.arange(len(tasks.TASKS))
    rand = _uniform_rand(ids, np.random.default_rng(4))
    settled = friendly_host.reset_settle64(ids, rand)
    want = friendly_host.reset64(ids, rand)
    phys, ctrl, consts, sensors = jax.jit(physics.reset_finish)(ids, *settled[:2], rand, *settled[2:])
    for name, got, tol in (("state", phys, 1e-5), ("control", ctrl, 1e-6), ("consts", consts, 1e-5),
                           ("sensors", sensors, 1e-5)):
        err = np.abs(np.asarray(got, np.float64) - want[name]).max(axis=1)
        assert err.max() < tol, f"{name}: {dict((tasks.TASKS[k].name, float(err[k])) for k in np.flatnonzero(err >= tol))}"


@pytest.fixture(scope="module")
def mjx_env():
    env = MetaWorld(nthread=1, backend="mjx", tasks=(PARITY_TASK,))
    params = make_params("train", embed=False)
    row = int(np.flatnonzero(np.asarray(params.goals[:, 0]) == tasks.TASK_INDEX[PARITY_TASK])[0])
    # Eager: the step's physics is MjxPhysics.kernel, jitted per batch size and shared with the reset (the
    # same compiled program runs the reset's 250 settling steps and each step's 5), one compile for both.
    return env, params, row, env.step_batch


def _actions(t: int, batch: int) -> np.ndarray:
    """Deterministic sweeping actions that move the hand and open then close the gripper."""
    i = np.arange(batch)[:, None]
    return np.concatenate([np.sin(0.4 * t + i + np.array([[0.0, 1.0, 2.0]])),
                           np.full((batch, 1), -1.0 if t < HORIZON // 2 else 1.0)], 1).astype(np.float32)


def test_mjx_reset_agrees_with_mujoco_c_and_steps_agree_from_it(mjx_env, friendly_host) -> None:
    """The reset in MJX against MuJoCo C's (reset64) from the same reset vector, then MJX (float32) and MuJoCo C
    (float64) on the MJX-friendly reach model from the MJX reset state under the same actions: every observable
    position within POS_TOL m over HORIZON steps."""
    env, params, row, step = mjx_env
    batch = 2
    keys = jax.random.split(jax.random.key(3), batch)
    obs, state = env.reset_to_task_batch(keys, params, jnp.full((batch,), row))
    k = tasks.TASK_INDEX[PARITY_TASK]
    out = friendly_host.reset64(np.full(batch, k), np.asarray(state.reset_vector, np.float64))
    sl = scenes.sensor_slices()
    pos = np.r_[sl["hand"], sl["rclaw"], sl["lclaw"], sl["ree"], sl["lee"], sl["lpad"], sl["rpad"], sl["obj"]]
    # After the 250 settling steps: the hand and everything it carries within RESET_POS_TOL; the controls and
    # the object's write exactly (rounded); the arm's joints within ARM_TOL (they are the null space of the
    # hand's mocap weld, fixed only by the solver's convergence: float64 MJX differs as much, 2026-11-22).
    np.testing.assert_allclose(np.asarray(state.ctrl), out["control"], atol=1e-6)
    np.testing.assert_allclose(np.asarray(state.sensors)[:, pos], out["sensors"][:, pos], atol=RESET_POS_TOL)
    np.testing.assert_allclose(np.asarray(state.consts), out["consts"], atol=RESET_POS_TOL)
    qpos = friendly_host.state_layouts[k]["qpos"]
    got_q, want_q = np.asarray(state.phys)[:, qpos], out["state"][:, qpos]
    np.testing.assert_allclose(got_q[:, :7], want_q[:, :7], atol=ARM_TOL)
    np.testing.assert_allclose(got_q[:, 7:12], want_q[:, 7:12], atol=1e-5)  # fingers, the puck's written position
    np.testing.assert_allclose(got_q[:, 12:], want_q[:, 12:], atol=QUAT_TOL)  # its quaternion: it settled (yaw drift)
    print(f"reset: max |MJX - MuJoCo C| observables {np.abs(np.asarray(state.sensors)[:, pos] - out['sensors'][:, pos]).max():.2e} m, "
          f"arm joints {np.abs(got_q[:, :7] - want_q[:, :7]).max():.2e} rad")
    # The steps from the same (the MJX reset) state.
    c_state, c_control = np.asarray(state.phys, np.float64), np.asarray(state.ctrl, np.float64)
    worst = 0.0
    for t in range(HORIZON):
        action = _actions(t, batch)
        obs, state, reward, done, info = step(jax.random.split(jax.random.key(t), batch), state, jnp.asarray(action),
                                              params)
        c_state, c_control, c_sensors = friendly_host.step64(c_state, c_control, action, np.full(batch, k))
        got = np.asarray(state.sensors)
        worst = max(worst, float(np.abs(got[:, pos] - c_sensors[:, pos]).max()))
        np.testing.assert_allclose(got[:, pos], c_sensors[:, pos], atol=POS_TOL, err_msg=f"step {t}")
        np.testing.assert_allclose(got[:, sl["obj_quat"]], c_sensors[:, sl["obj_quat"]], atol=QUAT_TOL)
        np.testing.assert_allclose(np.asarray(state.ctrl), c_control, atol=1e-6)  # Meta-World's control
    moved = np.abs(np.asarray(state.sensors)[:, sl["hand"]] - np.asarray(out["sensors"])[:, sl["hand"]]).max()
    assert moved > 0.02  # the horizon exercised the arm (hand moved > 2 cm)
    assert np.isfinite(np.asarray(obs)).all() and np.isfinite(np.asarray(reward)).all()
    print(f"max |MJX - MuJoCo C| over {HORIZON} steps: {worst:.2e} m")


def test_mjx_env_freezes_done_rows_and_marks_rows_of_other_tasks(mjx_env) -> None:
    env, params, row, step = mjx_env
    other = int(np.flatnonzero(np.asarray(params.goals[:, 0]) == tasks.TASK_INDEX["push"])[0])
    keys = jax.random.split(jax.random.key(5), 2)
    _, state = env.reset_to_task_batch(keys, params, jnp.array([row, other]))
    state = state.replace(done=jnp.array([True, False]))
    _, after, reward, _, _ = step(keys, state, jnp.ones((2, 4)), params)
    np.testing.assert_array_equal(np.asarray(after.phys[0]), np.asarray(state.phys[0]))  # frozen row
    assert float(reward[0]) == 0.0
    assert np.isnan(np.asarray(after.phys[1])).all()  # push is not compiled into this env's MJX step
    assert not bool(tasks.legal(after.vec[1]))  # and its state is flagged as illegal


def _contact_kinds(model: mujoco.MjModel) -> set[tuple]:
    """What a scene asks of MJX's physics: the geom-type pairs MJX collides (its static candidate pairs), the
    joint kinds (type, limited) and the equality kinds."""
    from mujoco.mjx._src import collision_driver  # the enumeration put_model uses

    kinds = {("pair", int(model.geom_type[g1]), int(model.geom_type[g2]))
             for g1, g2, _ in collision_driver.geom_pairs(model)}
    kinds |= {("joint", int(model.jnt_type[j]), bool(model.jnt_limited[j])) for j in range(model.njnt)}
    return kinds | {("eq", int(model.eq_type[e])) for e in range(model.neq)}


# reach (tested above) and these three hold every kind of contact, joint and equality of the 22 scenes:
# hammer (capsule–box/mesh: the fingers' capsules and the hammer, a free body of prisms resting on the table;
# the largest MJX–C object gap of the parity table), soccer (sphere–box/mesh: the ball), locked-door-open (the
# latch's joint equality, the door on its frame). test_contact_kinds_of_every_scene_are_covered checks the claim.
COVER_TASKS = ("hammer", "soccer", "locked-door-open")
COVER_STEPS = 4  # environment steps (20 MuJoCo steps) from MuJoCo C's reset state


def test_contact_kinds_of_every_scene_are_covered(friendly_host) -> None:
    covered = set().union(*(_contact_kinds(friendly_host.models[tasks.TASK_INDEX[n]])
                            for n in (PARITY_TASK,) + COVER_TASKS))
    for t in tasks.TASKS:
        missing = _contact_kinds(friendly_host.models[tasks.TASK_INDEX[t.name]]) - covered
        assert not missing, f"{t.name} has physics no MJX parity test steps: {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("name", COVER_TASKS)
def test_mjx_steps_agree_with_mujoco_c_on_every_contact_kind(friendly_host, name) -> None:
    """From MuJoCo C's reset state (objects resting on the table, the door on its frame, the latch engaged),
    MJX (float32) and MuJoCo C (float64) step the MJX-friendly model under the same actions: every observable
    position within POS_TOL m. Three rows in chunks of two (``chunk``: rows 0–1 vmapped together, row 2 alone),
    so each row's agreement with its own MuJoCo C row also checks that chunking keeps rows apart."""
    from imaginejax.envs.metaworld.mjx_backend import MjxPhysics

    physics = MjxPhysics(friendly_host, (name,), chunk=2)
    k = tasks.TASK_INDEX[name]
    batch = 3
    rand = _uniform_rand(np.full(batch, k), np.random.default_rng(11))
    out = friendly_host.reset64(np.full(batch, k), rand)
    c_state, c_control = out["state"], out["control"]
    phys, ctrl = jnp.asarray(c_state, jnp.float32), jnp.asarray(c_control, jnp.float32)
    task, active = jnp.full(batch, k), jnp.ones(batch, bool)
    sl = scenes.sensor_slices()
    pos = np.r_[sl["hand"], sl["rclaw"], sl["lclaw"], sl["ree"], sl["lee"], sl["lpad"], sl["rpad"], sl["obj"],
                sl["obj2"], sl["extra"]]
    step = jax.jit(physics.step)
    worst = 0.0
    for t in range(COVER_STEPS):
        action = _actions(t, batch)
        phys, ctrl, sensors = step(phys, ctrl, jnp.asarray(action), task, active)
        c_state, c_control, c_sensors = friendly_host.step64(c_state, c_control, action, np.full(batch, k))
        got = np.asarray(sensors, np.float64)
        worst = max(worst, float(np.abs(got[:, pos] - c_sensors[:, pos]).max()))
        np.testing.assert_allclose(got[:, pos], c_sensors[:, pos], atol=POS_TOL, err_msg=f"{name}, step {t}")
        np.testing.assert_allclose(np.asarray(ctrl), c_control, atol=1e-6)
    assert len({tuple(np.round(r, 6)) for r in np.asarray(sensors)[:, pos]}) == batch  # rows differ
    print(f"{name}: max |MJX - MuJoCo C| over {COVER_STEPS} steps: {worst:.2e} m")
