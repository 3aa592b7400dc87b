"""LIBERO's MJX backend against MuJoCo C on the same MJCF: the backend choice, the reset on MJX, and the two
backends over a short horizon of the scripted expert's actions (approach, close on the soup can, lift).

Compile dominates. Measured on this 2-core machine at load ~3-4: one jitted ``mjx.step`` compiles in 29 s and
a call (``mjx.Data`` in and out) takes 70-90 ms; with ``compiler_options={"xla_backend_optimization_level": 0}``
it compiles in 24 s but a call takes ~1 s, so the default level is kept. The MJX physics step (``FRAME_SKIP`` substeps in a
``fori_loop``) is compiled once — it is a ``jax.jit`` inside :class:`MjxPhysics`, shared by reset and step
for one batch size — and the environment code around it runs eagerly. The whole file: 43 s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from imaginejax.envs.libero import model as M
from imaginejax.envs.libero import tasks
from imaginejax.envs.libero.env import Libero, make_params
from imaginejax.envs.libero.expert import expert_action

mjx = pytest.importorskip("mujoco.mjx")

TASK = "pick-soup_can"
HORIZON = 14      # env steps (280 MuJoCo steps): approach, the fingers close on the can at step 7, the lift
# Tolerances of |MJX (float32) - MuJoCo C (float64)| on the 44-d state, same model, same actions.
# Measured (key 0, pick-soup_can): <= 5e-7 before the grasp; see the test for the grasp phase.
FREE_TOL = 1e-4   # before any finger-object contact
GRASP_TOL = 2e-2  # m / quaternion units from the grasp on (measured worst 1.1e-2: can quaternion, fingers 7.8e-3)


@pytest.fixture(scope="module")
def envs():
    params = make_params("train", embed=False)
    row = int(np.flatnonzero(np.asarray(params.goals[:, 0]) == tasks.TASK_INDEX[TASK])[0])
    return Libero(backend="mujoco", nthread=1), Libero(backend="mjx"), params, row


def test_backend_choice_and_unknown_backend_is_named() -> None:
    assert Libero().backend == ("mujoco" if jax.default_backend() == "cpu" else "mjx")
    assert Libero(backend="mjx").backend == "mjx"
    with pytest.raises(ValueError, match="valid backends: auto, mujoco, mjx"):
        Libero(backend="warp")
    with pytest.raises(ValueError, match="Libero\\(backend='mjx'\\)"):
        Libero(backend="mujoco").mjx


def test_model_is_accepted_by_mjx_with_the_substituted_cone() -> None:
    """One MJCF for both backends: MJX takes it as it is; the friction cone is pyramidal (MJX's elliptic cone
    blew the grasp up, see :mod:`imaginejax.envs.libero.model`)."""
    model = M.load_model()
    assert model.opt.cone == mujoco.mjtCone.mjCONE_PYRAMIDAL
    mx = mjx.put_model(model)
    assert mx.opt.cone == mujoco.mjtCone.mjCONE_PYRAMIDAL


def test_mjx_reset_is_legal_and_equals_the_host_reset(envs) -> None:
    host, mj, params, row = envs
    keys = jax.random.split(jax.random.key(0), 1)
    task = jnp.array([row])
    _, hs = host.reset_to_task_batch(keys, params, task)
    _, ms = mj.reset_to_task_batch(keys, params, task)
    assert bool(jnp.all(tasks.legal(ms.vec)))
    assert np.all(np.asarray(ms.lo) == 0.0)  # MJX carries float32 state, no low part
    # the same sampled layout and one settle step: the same state to float32 precision
    np.testing.assert_allclose(np.asarray(ms.vec), np.asarray(hs.vec), atol=FREE_TOL)
    np.testing.assert_array_equal(np.asarray(ms.ctrl), np.asarray(hs.ctrl))


def test_mjx_agrees_with_mujoco_c_over_the_experts_grasp(envs) -> None:
    """From the host's reset state, the host expert's actions drive both backends (open loop) for HORIZON
    steps: the state agrees to FREE_TOL before the fingers touch the can and to GRASP_TOL during the grasp
    and the lift; and the can was actually grasped and lifted on both."""
    host, mj, params, row = envs
    keys = jax.random.split(jax.random.key(0), 1)
    _, hs = host.reset_to_task_batch(keys, params, jnp.array([row]))
    ms = hs.replace(hi=hs.hi + hs.lo, lo=jnp.zeros_like(hs.lo))
    host_step = jax.jit(host.step_batch)
    start_z = float(hs.vec[0, 18])
    worst_free, worst_grasp, closed_at = 0.0, 0.0, None
    for t in range(HORIZON):
        action = expert_action(hs.vec, params.goals[hs.task], hs.progress)
        if closed_at is None and float(action[0, 6]) > 0:
            closed_at = t
        # done rows would freeze (pick succeeds once the can moves with the hand): keep both running
        _, hs, _, _, _ = host_step(keys, hs.replace(done=jnp.zeros(1, bool)), action, params)
        _, ms, reward, _, _ = mj.step_batch(keys, ms.replace(done=jnp.zeros(1, bool)), action, params)
        err = float(np.abs(np.asarray(ms.vec) - np.asarray(hs.vec)).max())
        if closed_at is None:
            worst_free = max(worst_free, err)
            assert err < FREE_TOL, f"step {t}: {err}"
        else:
            worst_grasp = max(worst_grasp, err)
            assert err < GRASP_TOL, f"step {t}: {err}"
        assert np.isfinite(float(reward[0]))
    print(f"max |MJX - MuJoCo C|: {worst_free:.1e} before the grasp, {worst_grasp:.1e} from step {closed_at}")
    assert closed_at is not None and closed_at < HORIZON - 3  # the horizon covers the grasp and a lift
    for s in (hs, ms):  # the can rose with the closed gripper on both backends
        assert float(s.vec[0, 18]) > start_z + 0.02
        assert float(np.linalg.norm(s.vec[0, 16:19] - s.vec[0, 7:10])) < 0.05


def test_mjx_step_freezes_done_rows(envs) -> None:
    _, mj, params, row = envs
    keys = jax.random.split(jax.random.key(1), 1)
    _, state = mj.reset_to_task_batch(keys, params, jnp.array([row]))
    state = state.replace(done=jnp.array([True]))
    _, after, reward, done, _ = mj.step_batch(keys, state, jnp.ones((1, 7)), params)
    np.testing.assert_array_equal(np.asarray(after.hi), np.asarray(state.hi))
    assert float(reward[0]) == 0.0 and bool(done[0])
