"""envs/mujoco_host.py: the generic batched MuJoCo C stepper and its pure_callback wrapper.

The reference is MuJoCo itself driven step by step from Python (``mj_setState`` / ``mj_step`` /
``mj_forward`` on one MjData per row): the stepper must reproduce it bit for bit, directly, under ``jit``,
``vmap`` and ``lax.scan``, for two scenes of different sizes mixed in one batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from imaginejax.envs import mujoco_host as mh

FRAME_SKIP = 4
# Scene A: a hinged arm with a motor and a free box falling onto a plane (contacts), a mocap target body,
# position/velocity sensors. Scene B: a slider only (different state, control and sensor widths).
SCENE_A = """
<mujoco>
  <option timestep="0.004"/>
  <worldbody>
    <geom type="plane" size="2 2 .1"/>
    <body name="target" mocap="true" pos="0.2 0 0.3"><geom type="sphere" size="0.05" contype="0" conaffinity="0"/></body>
    <body name="arm" pos="0 0 0.5">
      <joint name="hinge" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03"/>
      <site name="tip" pos="0.3 0 0"/>
    </body>
    <body name="box" pos="0.5 0 0.06">
      <freejoint/>
      <geom type="box" size="0.05 0.05 0.05"/>
    </body>
  </worldbody>
  <actuator><motor joint="hinge" gear="2"/></actuator>
  <sensor>
    <framepos objtype="site" objname="tip"/>
    <framepos objtype="body" objname="target"/>
    <framequat objtype="xbody" objname="box"/>
    <jointvel joint="hinge"/>
  </sensor>
</mujoco>
"""
SCENE_B = """
<mujoco>
  <worldbody>
    <body name="cart"><joint name="slide" type="slide" axis="1 0 0"/><geom type="box" size="0.1 0.1 0.1"/></body>
  </worldbody>
  <actuator><motor joint="slide"/></actuator>
  <sensor><jointpos joint="slide"/></sensor>
</mujoco>
"""
CONTROL_SPEC = int(mujoco.mjtState.mjSTATE_CTRL) | int(mujoco.mjtState.mjSTATE_MOCAP_POS)


@pytest.fixture(scope="module")
def models() -> tuple[mujoco.MjModel, mujoco.MjModel]:
    return mujoco.MjModel.from_xml_string(SCENE_A), mujoco.MjModel.from_xml_string(SCENE_B)


@pytest.fixture(scope="module")
def stepper(models) -> mh.HostStepper:
    s = mh.HostStepper(models, FRAME_SKIP, control_spec=CONTROL_SPEC, nthread=2, readout=True)
    yield s
    s.close()


def _initial(models, scene: np.ndarray, rng: np.random.Generator, width: int) -> np.ndarray:
    """Padded FULLPHYSICS states: each scene's default state with perturbed qpos/qvel."""
    out = np.zeros((scene.size, width))
    for i, g in enumerate(scene):
        m = models[g]
        d = mujoco.MjData(m)
        d.qpos[:] = m.qpos0
        d.qpos[0] += rng.uniform(-0.5, 0.5)
        d.qvel[:] = rng.normal(0.0, 0.3, m.nv)
        size = mujoco.mj_stateSize(m, mh.FULLPHYSICS)
        state = np.empty(size)
        mujoco.mj_getState(m, d, state, mh.FULLPHYSICS)
        out[i, :size] = state
    return out


def _controls(models, scene: np.ndarray, rng: np.random.Generator, width: int) -> np.ndarray:
    out = np.zeros((scene.size, width))
    for i, g in enumerate(scene):
        m = models[g]
        size = mujoco.mj_stateSize(m, CONTROL_SPEC)
        out[i, :m.nu] = rng.uniform(-1, 1, m.nu)
        out[i, m.nu:size] = rng.uniform(-0.3, 0.3, size - m.nu)  # mocap position (scene A only)
    return out


def _direct(models, state: np.ndarray, control: np.ndarray, scene: np.ndarray, width: int, sensor_width: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """Reference: per row, MjData + mj_step × FRAME_SKIP from a zero warm start, then mj_forward."""
    out_state = np.zeros((scene.size, width))
    out_sensor = np.zeros((scene.size, sensor_width))
    for i, g in enumerate(scene):
        m = models[g]
        d = mujoco.MjData(m)
        size = mujoco.mj_stateSize(m, mh.FULLPHYSICS)
        mujoco.mj_setState(m, d, state[i, :size], mh.FULLPHYSICS)
        mujoco.mj_setState(m, d, control[i, :mujoco.mj_stateSize(m, CONTROL_SPEC)], CONTROL_SPEC)
        d.qacc_warmstart[:] = 0.0
        for _ in range(FRAME_SKIP):
            mujoco.mj_step(m, d)
        mujoco.mj_getState(m, d, out_state[i, :size], mh.FULLPHYSICS)
        mujoco.mj_forward(m, d)
        out_sensor[i, :m.nsensordata] = d.sensordata
    return out_state, out_sensor


def test_state_layout_matches_mj_getState(models) -> None:
    m = models[0]
    d = mujoco.MjData(m)
    d.qpos[:] = np.arange(m.nq) + 0.5
    d.qvel[:] = -np.arange(m.nv) - 0.25
    d.time = 3.0
    state = np.empty(mujoco.mj_stateSize(m, mh.FULLPHYSICS))
    mujoco.mj_getState(m, d, state, mh.FULLPHYSICS)
    layout = mh.state_layout(m)
    np.testing.assert_array_equal(state[layout["time"]], [3.0])
    np.testing.assert_array_equal(state[layout["qpos"]], d.qpos)
    np.testing.assert_array_equal(state[layout["qvel"]], d.qvel)
    control_layout = mh.state_layout(m, CONTROL_SPEC)
    assert control_layout["ctrl"] == slice(0, m.nu) and control_layout["mocap_pos"] == slice(m.nu, m.nu + 3)


def test_split_join_round_trip() -> None:
    x = np.random.default_rng(0).normal(size=1000) * 10.0 ** np.random.default_rng(1).integers(-6, 3, 1000)
    hi, lo = mh.split64(x)
    assert hi.dtype == np.float32 and lo.dtype == np.float32
    np.testing.assert_array_equal(hi, x.astype(np.float32))
    assert np.max(np.abs(mh.join64(hi, lo) - x) / np.abs(x)) <= 2.0 ** -47


def test_step64_equals_direct_mujoco_bit_for_bit(models, stepper) -> None:
    rng = np.random.default_rng(0)
    scene = np.array([0, 1, 0, 0, 1, 0, 1])
    state = _initial(models, scene, rng, stepper.state_width)
    for _ in range(6):  # several steps so that the box lands and contacts are active
        control = _controls(models, scene, rng, stepper.control_width)
        got_state, got_sensor = stepper.step64(state, control, scene)
        want_state, want_sensor = _direct(models, state, control, scene, stepper.state_width, stepper.sensor_width)
        np.testing.assert_array_equal(got_state, want_state)
        np.testing.assert_array_equal(got_sensor, want_sensor)
        state = got_state
    assert stepper.sensor_width == models[0].nsensordata == 3 + 3 + 4 + 1
    # the box fell onto the plane: the comparison covered contact dynamics too
    d = mujoco.MjData(models[0])
    mujoco.mj_setState(models[0], d, state[0, :mujoco.mj_stateSize(models[0], mh.FULLPHYSICS)], mh.FULLPHYSICS)
    mujoco.mj_forward(models[0], d)
    assert d.ncon > 0


def test_sensors64_is_forward_on_the_given_state(models, stepper) -> None:
    rng = np.random.default_rng(1)
    scene = np.array([0, 1])
    state = _initial(models, scene, rng, stepper.state_width)
    control = _controls(models, scene, rng, stepper.control_width)
    got = stepper.sensors64(state, control, scene)
    for i, g in enumerate(scene):
        m = models[g]
        d = mujoco.MjData(m)
        mujoco.mj_setState(m, d, state[i, :mujoco.mj_stateSize(m, mh.FULLPHYSICS)], mh.FULLPHYSICS)
        mujoco.mj_setState(m, d, control[i, :mujoco.mj_stateSize(m, CONTROL_SPEC)], CONTROL_SPEC)
        mujoco.mj_forward(m, d)
        np.testing.assert_array_equal(got[i, :m.nsensordata], d.sensordata)
    # the mocap target's position sensor reads the control's mocap position
    np.testing.assert_array_equal(got[0, 3:6], control[0, 1:4])


def test_callback_under_jit_vmap_scan_equals_direct_stepping(models, stepper) -> None:
    """A jitted lax.scan over a vmapped host_step == a Python loop over step64 with the same hi/lo rounding."""
    rng = np.random.default_rng(2)
    runs, batch, steps = 2, 3, 5
    scene = np.array([[0, 1, 0], [1, 0, 0]])
    state0 = _initial(models, scene.reshape(-1), rng, stepper.state_width).reshape(runs, batch, -1)
    controls = np.stack([_controls(models, scene.reshape(-1), rng, stepper.control_width).reshape(runs, batch, -1)
                         for _ in range(steps)])  # (T, runs, batch, C)
    hi0, lo0 = mh.split64(state0)

    def rollout(hi, lo, ctrl, sc):
        def body(carry, u):
            h, l = carry
            h, l, sens = mh.host_step(stepper, h, l, u, sc)
            return (h, l), (h, sens)
        return jax.lax.scan(body, (hi, lo), ctrl)

    vmapped = jax.jit(jax.vmap(rollout, in_axes=(0, 0, 1, 0), out_axes=((0, 0), (1, 1))))
    calls_before = stepper.calls
    (hi_t, lo_t), (his, sens) = vmapped(jnp.asarray(hi0), jnp.asarray(lo0), jnp.asarray(controls, jnp.float32),
                                       jnp.asarray(scene))
    assert stepper.calls - calls_before == steps  # vmapped: one host call per step for the whole batch

    state = mh.join64(hi0, lo0).reshape(runs * batch, -1)
    for t in range(steps):
        u = controls[t].reshape(runs * batch, -1).astype(np.float32).astype(np.float64)
        new, sensor = stepper.step64(state, u, scene.reshape(-1))
        h, l = mh.split64(new)
        np.testing.assert_array_equal(np.asarray(his[t]).reshape(runs * batch, -1), h)
        np.testing.assert_array_equal(np.asarray(sens[t]).reshape(runs * batch, -1), sensor.astype(np.float32))
        state = mh.join64(h, l)
    np.testing.assert_array_equal(np.asarray(hi_t).reshape(runs * batch, -1), h)
    np.testing.assert_array_equal(np.asarray(lo_t).reshape(runs * batch, -1), l)


def test_host_sensors_callback(models, stepper) -> None:
    rng = np.random.default_rng(3)
    scene = np.array([0, 1, 0])
    state = _initial(models, scene, rng, stepper.state_width)
    control = _controls(models, scene, rng, stepper.control_width)
    hi, lo = mh.split64(state)
    got = jax.jit(lambda h, l, u, s: mh.host_sensors(stepper, h, l, u, s))(hi, lo, control.astype(np.float32), scene)
    want = stepper.sensors64(mh.join64(hi, lo), control.astype(np.float32).astype(np.float64), scene)
    np.testing.assert_array_equal(np.asarray(got), want.astype(np.float32))


def test_non_finite_rows_are_nan_and_do_not_touch_others(models, stepper) -> None:
    rng = np.random.default_rng(4)
    scene = np.array([0, 0, 1])
    state = _initial(models, scene, rng, stepper.state_width)
    control = _controls(models, scene, rng, stepper.control_width)
    bad = state.copy()
    bad[1, 2] = np.nan
    got, sensors = stepper.step64(bad, control, scene)
    want, _ = stepper.step64(state, control, scene)
    assert np.isnan(got[1]).all() and np.isnan(sensors[1]).all()
    np.testing.assert_array_equal(got[[0, 2]], want[[0, 2]])


def test_bad_input_errors(models, stepper) -> None:
    with pytest.raises(ValueError, match="state must be"):
        stepper.step64(np.zeros((2, stepper.state_width + 1)), np.zeros((2, stepper.control_width)))
    with pytest.raises(ValueError, match="scene indices"):
        stepper.step64(np.zeros((1, stepper.state_width)), np.zeros((1, stepper.control_width)), np.array([2]))
    with pytest.raises(ValueError, match="control must be"):
        mh.host_step(stepper, jnp.zeros((2, stepper.state_width)), jnp.zeros((2, stepper.state_width)),
                     jnp.zeros((2, stepper.control_width + 1)))
    with pytest.raises(ValueError, match="control_spec"):
        mh.HostStepper(models[1], 1, control_spec=int(mujoco.mjtState.mjSTATE_QPOS))
    with pytest.raises(ValueError, match="frame_skip"):
        mh.HostStepper(models[1], 0)
    accel = mujoco.MjModel.from_xml_string(SCENE_B.replace("<jointpos joint=\"slide\"/>", "<accelerometer site=\"s\"/>")
                                           .replace("<geom type=\"box\" size=\"0.1 0.1 0.1\"/>",
                                                    "<geom type=\"box\" size=\"0.1 0.1 0.1\"/><site name=\"s\"/>"))
    with pytest.raises(ValueError, match="position/velocity sensors"):
        mh.HostStepper(accel, 1, readout=True)


def test_pack_unpack_is_bit_exact() -> None:
    x = np.random.default_rng(5).normal(size=(3, 7)) * 1e3
    bits = mh.pack64(x)
    assert bits.dtype == np.uint32 and bits.shape == (3, 7, 2)
    np.testing.assert_array_equal(mh.unpack64(bits), x)
    with pytest.raises(ValueError, match="2 uint32 words"):
        mh.unpack64(np.zeros((3, 4), np.uint32))


def test_trajectory_and_sensors_before_last(models, stepper) -> None:
    """trajectory64 returns every intermediate state; its sensors are those MuJoCo computed at the start of
    each step, i.e. on the previous state; run64(sensors_before_last=True) returns the last of them."""
    rng = np.random.default_rng(6)
    scene = np.array([0, 1])
    state = _initial(models, scene, rng, stepper.state_width)
    control = _controls(models, scene, rng, stepper.control_width)
    states, sensors = stepper.trajectory64(state, control, scene, nstep=3)
    assert states.shape == (2, 3, stepper.state_width) and sensors.shape == (2, 3, stepper.sensor_width)
    np.testing.assert_array_equal(sensors[:, 1], stepper.sensors64(states[:, 0], control, scene))
    np.testing.assert_array_equal(sensors[:, 0], stepper.sensors64(state, control, scene))
    last, before = stepper.run64(state, control, scene, nstep=3, sensors_before_last=True)
    np.testing.assert_array_equal(last, states[:, 2])
    np.testing.assert_array_equal(before, sensors[:, 2])


def test_control_low_parts_reach_the_host(models, stepper) -> None:
    """A control carried as hi + lo float32 arrives in float64 as their exact sum."""
    rng = np.random.default_rng(7)
    scene = np.array([0])
    state = _initial(models, scene, rng, stepper.state_width)
    control = _controls(models, scene, rng, stepper.control_width) + 1e-9  # not a float32 number
    c_hi, c_lo = mh.split64(control)
    hi, lo = mh.split64(state)
    got_hi, got_lo, _ = mh.host_step(stepper, jnp.asarray(hi), jnp.asarray(lo), jnp.asarray(c_hi), scene,
                                     control_lo=jnp.asarray(c_lo))
    want, _ = stepper.step64(mh.join64(hi, lo), mh.join64(c_hi, c_lo), scene)
    np.testing.assert_array_equal(mh.join64(np.asarray(got_hi), np.asarray(got_lo)),
                                  mh.join64(*mh.split64(want)))
