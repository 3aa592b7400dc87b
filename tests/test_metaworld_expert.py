"""Scripted Meta-World experts: success rate of every task within the 100-step cap (one compiled rollout for
all 22 tasks, mixed in one batch), and expert data collected into the dataset format.

Here every task runs :data:`EPISODES` episodes and must succeed in at least 90 % of them. Measured over 200
episodes per task (one batch of all 22 tasks, seed 7, the episode's own 100-step cap): 100 % on every task
except pick-place-wall 99 % and locked-door-open 99 % -- the latter needs the locked door's panel at
doorlockB's size, as scenes.py builds it (with Meta-World's own, 4 mm longer panel the door meets the safe's
wall at ~0.62 rad and locked-door-open is 0 %; :func:`test_locked_door_swings_open` guards the swing).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from imaginejax.envs.base import instruction_table, make_level_params
from imaginejax.envs.metaworld import scenes, tasks
from imaginejax.envs.metaworld.env import MetaWorld, make_params
from imaginejax.envs.metaworld.expert import expert_action, expert_policy

EPISODES = 20  # per task
ALL = tuple(t.name for t in tasks.TASKS)
# The locked door must open about 1.38 rad for the predicate (|handle x - target x| <= 0.08).
OPEN_ANGLE = 1.38


def _widest_swing(task: str, torque: float = -5.0, steps: int = 2000) -> float:
    """How far (rad) the task's door swings under a constant opening torque with its latch released (the
    hand stays at its reset pose, out of the way)."""
    model = scenes.build_model(tasks.TASKS[tasks.TASK_INDEX[task]].scene)
    data = mujoco.MjData(model)
    mujoco.mj_resetData(model, data)
    for i in range(model.neq):
        if model.equality(i).name == scenes.LOCKED_DOOR_HOLD:
            data.eq_active[i] = 0
    dof = model.joint("doorjoint").dofadr.item()
    for _ in range(steps):
        data.qfrc_applied[dof] = torque
        mujoco.mj_step(model, data)
    return -float(data.qpos[model.joint("doorjoint").qposadr.item()])


@pytest.fixture(scope="module")
def rates() -> dict[str, float]:
    env = MetaWorld()
    goals = np.array([[tasks.TASK_INDEX[n], i] for i, n in enumerate(ALL)], np.int32)
    params = make_level_params("train", goals, instruction_table([(n,) for n in ALL]), tasks.MAX_STEPS,
                               embed=False, reset_tries=16)
    batch = len(ALL) * EPISODES
    rows = jnp.repeat(jnp.arange(len(ALL)), EPISODES)

    @jax.jit
    def run(key):
        _, state = env.reset_to_task_batch(jax.random.split(key, batch), params, rows)

        def body(state, t):
            action = expert_action(state.vec, params.goals[state.task, 0])
            _, state, _, _, _ = env.step_batch(jax.random.split(jax.random.fold_in(key, t), batch), state, action, params)
            return state, None

        state, _ = jax.lax.scan(body, state, jnp.arange(tasks.MAX_STEPS))
        return state.success

    success = np.asarray(run(jax.random.key(2024))).reshape(len(ALL), EPISODES)
    out = {name: float(success[i].mean()) for i, name in enumerate(ALL)}
    print("\n" + "\n".join(f"{n:18s} {r:.2f}" for n, r in out.items()))
    return out


@pytest.mark.parametrize("name", ALL)
def test_expert_success_at_least_90_percent(rates, name) -> None:
    assert rates[name] >= 0.9, f"{name}: expert success {rates[name]:.2f} over {EPISODES} episodes"


def test_locked_door_swings_open() -> None:
    """The composed locked door (Meta-World's lockable door given its openable door's hinge) must swing as
    far as door-open's door, past the angle its success predicate needs. The lockable door's panel box is
    4 mm longer towards the hinge than the openable door's and would meet the safe's side wall at ~0.62 rad,
    which made locked-door-open unsolvable; scenes.py gives the panel doorlockB's size."""
    reference = _widest_swing("door-open")
    assert reference > OPEN_ANGLE - 0.1  # door-open's own door: ~1.32 rad against the wall under this torque
    assert _widest_swing("locked-door-open") == pytest.approx(reference, abs=0.02)


def test_pull_round_steps_along_the_opening_tangent() -> None:
    """The pull primitive: 10 cm along the clockwise tangent round the hinge, plus half the radius error
    along the radius (hand-computed for hands at 0.3 m from the hinge at several angles)."""
    from imaginejax.envs.metaworld.expert import _pull_round

    hinge = jnp.array([0.1, 0.7, 0.15])
    theta = jnp.linspace(-1.5, 0.5, 5)
    unit = jnp.stack([jnp.cos(theta), jnp.sin(theta)], -1)
    hand = jnp.concatenate([hinge[:2] + 0.3 * unit, jnp.full((5, 1), 0.12)], -1)
    z = jnp.full((5, 1), 0.1)
    clockwise = jnp.stack([jnp.sin(theta), -jnp.cos(theta)], -1)
    on_radius = _pull_round(hand, hinge, 0.3, z)
    np.testing.assert_allclose(on_radius[:, :2] - hand[:, :2], 0.1 * clockwise, atol=1e-6)
    np.testing.assert_allclose(on_radius[:, 2], 0.1)
    outward = _pull_round(hand, hinge, 0.35, z)  # 5 cm short of the radius: half of it outwards
    np.testing.assert_allclose(outward[:, :2] - on_radius[:, :2], 0.025 * unit, atol=1e-6)


def test_grasp_approach_descends_along_a_cone() -> None:
    """The grasp primitive heads for a point over the grip height: ``above`` over it by default, with a cone
    ``cone`` times the horizontal distance (at most ``above``); the gripper stays open while far."""
    from imaginejax.envs.metaworld.expert import _grasp_then

    obj = jnp.array([[0.0, 0.7, 0.02]] * 2)
    state = jnp.zeros((2, tasks.STATE_DIM)).at[:, 3].set(1.0)
    state = state.at[0, 0:3].set(jnp.array([0.1, 0.7, 0.2])).at[1, 0:3].set(jnp.array([0.04, 0.7, 0.2]))
    grip_z = 0.02 + 0.025  # the hand's target height when gripping (fingertips 2 cm below the top)
    straight = _grasp_then(state, obj, obj, lift_first=0.0, gain=1.0)
    coned = _grasp_then(state, obj, obj, lift_first=0.0, gain=1.0, cone=1.5)
    hand = state[:, 0:3]
    np.testing.assert_allclose(straight[:, :3], jnp.array([0.0, 0.7, grip_z + 0.12]) - hand, atol=1e-6)
    heights = jnp.minimum(0.12, 1.5 * jnp.array([0.1, 0.04]))  # 0.12 (capped) and 0.06
    np.testing.assert_allclose(coned[:, 2], grip_z + heights - hand[:, 2], atol=1e-6)
    np.testing.assert_array_equal(coned[:, 3], -1.0)


def test_expert_actions_are_bounded_and_task_specific() -> None:
    state = jnp.zeros((2, tasks.STATE_DIM)).at[:, 4:7].set(jnp.array([0.1, 0.8, 0.2]))
    a = expert_action(state, jnp.array([tasks.TASK_INDEX["reach"], tasks.TASK_INDEX["button-press"]]))
    assert a.shape == (2, 4) and bool(jnp.all(jnp.abs(a) <= 1.0))
    # reach heads for the target with an open gripper; button-press keeps it closed
    assert float(a[0, 3]) == -1.0 and float(a[1, 3]) == 1.0
    assert float(a[0, 0]) > 0 and float(a[0, 1]) > 0


def test_expert_collection_gives_successful_trajectories() -> None:
    from imaginejax.data.collect import collect

    env = MetaWorld()
    params = make_params("train", embed=False)
    ds = collect(env, params, expert_policy(), jax.random.key(3), 4, chunk_size=4,
                 task_indices=np.array([0, 2, 3, 9]), policy_name="metaworld-expert", progress=False)
    assert ds.terminals.any(axis=1).all()  # reach, pick-place, button-press, coffee-button all solved
    lengths = ds.mask.sum(1)
    np.testing.assert_array_equal(ds.terminals[np.arange(4), lengths - 1], True)
    # the last reward of a successful episode is the success reward
    np.testing.assert_array_equal(ds.rewards[np.arange(4), lengths - 1], tasks.SUCCESS_REWARD)
