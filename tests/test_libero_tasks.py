"""LIBERO-style tasks: the task table and instructions per level, every success predicate on hand-built 44-d
states (each just inside and just outside its BENCHMARK §2.4 threshold), the shaped reward against hand-computed
values, the "a then b" order, and legality."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.envs.libero import instructions as instr
from imaginejax.envs.libero import model as M
from imaginejax.envs.libero import tasks
from imaginejax.envs.libero.tasks import Progress

CAN, CHEESE, BOTTLE = 0, 1, 2
BASKET_XY = np.array([0.55, 0.25])


def make_state(objects: dict[int, tuple[float, float, float]] | None = None, *, eef_at: np.ndarray | None = None,
               fingers: float = 0.04, basket_xy: np.ndarray = BASKET_XY) -> jnp.ndarray:
    """A 44-d state: the arm at home (eef from the forward kinematics, or overridden by ``eef_at``), objects
    upright at their resting heights far apart unless given, the basket at ``basket_xy``."""
    pos = {CAN: (0.40, -0.20, M.REST_Z[0]), CHEESE: (0.50, -0.20, M.REST_Z[1]), BOTTLE: (0.60, -0.20, M.REST_Z[2])}
    pos.update(objects or {})
    qpos = np.zeros(M.NQ)
    qpos[:7] = M.HOME_QPOS
    qpos[7:9] = fingers
    for k in range(3):
        qpos[9 + 7 * k: 12 + 7 * k] = pos[k]
        qpos[12 + 7 * k] = 1.0
    qpos[30:33] = (basket_xy[0], basket_xy[1], 0.0)
    qpos[33] = 1.0
    state = np.array(tasks.state_from_qpos(jnp.asarray(qpos, jnp.float32)))
    if eef_at is not None:
        state[7:10] = eef_at
    return jnp.asarray(state)


def goal_of(name: str) -> jnp.ndarray:
    spec = tasks.TASKS[tasks.TASK_INDEX[name]]
    return jnp.asarray([tasks.TASK_INDEX[name], spec.kind, spec.a, spec.b, spec.layout], jnp.int32)


def ok(name: str, state: jnp.ndarray, progress: Progress | None = None) -> bool:
    return bool(tasks.success(state, goal_of(name), progress))


def test_task_counts_and_goal_tables() -> None:
    assert [len(tasks.LEVEL_TASKS[lv]) for lv in tasks.LEVELS] == [6, 6, 12, 13]
    assert len(tasks.TASKS) == 31 and len(set(t.name for t in tasks.TASKS)) == 31
    goals = tasks.level_goals("hard")
    assert goals.shape == (13, tasks.GOAL_DIM)
    assert sorted(goals[:, 1].tolist()) == sorted([tasks.SEQ_BASKET] * 6 + [tasks.ASIDE] * 3 + [tasks.ALL_BASKET]
                                                  + [tasks.OUT_OF_BASKET] * 3)
    with pytest.raises(ValueError, match="valid levels"):
        tasks.level_goals("medium")


def test_instructions_per_level() -> None:
    train = [instr.task_instructions(n, "train") for n in tasks.LEVEL_TASKS["train"]]
    rephrase = [instr.task_instructions(n, "rephrase") for n in tasks.LEVEL_TASKS["train"]]
    assert all(len(p) == 40 for p in train) and all(len(p) == 20 for p in rephrase)
    assert not set().union(*map(set, train)) & set().union(*map(set, rephrase))
    for level in ("easy", "hard"):
        for name in tasks.LEVEL_TASKS[level]:
            phrasings = instr.task_instructions(name, level)
            want = 22 if name == "all-in-basket" else 20
            assert len(phrasings) == want and len(set(phrasings)) == want, name
    # every phrasing of a pick task names its object (one of the object's names)
    for name, phrasings in zip(tasks.LEVEL_TASKS["train"], train):
        obj = tasks.TASKS[tasks.TASK_INDEX[name]].a
        assert all(any(n in p for n in instr.NAMES[obj]) for p in phrasings), name
    strings, ids, counts = instr.level_instruction_table("train")
    assert ids.shape == (6, 40) and counts.tolist() == [40] * 6 and len(strings) == 240


def test_level_params() -> None:
    from imaginejax.envs.libero.env import make_params

    for level, count in zip(tasks.LEVELS, (6, 6, 12, 13)):
        params = make_params(level, embed=False)
        assert params.num_tasks == count and params.max_steps == 500 and params.level == level
        assert params.instruction_embeddings.shape[1] == 0
        ids = np.asarray(params.phrasing_ids)
        assert (ids[np.arange(count), np.asarray(params.phrasing_counts) - 1] >= 0).all()


def test_state_vector_layout() -> None:
    state = make_state({CAN: (0.45, 0.1, M.REST_Z[0])})
    tcp, quat, _, _ = M.fk(jnp.asarray(M.HOME_QPOS, jnp.float32))
    np.testing.assert_allclose(state[7:10], tcp, atol=1e-6)
    assert abs(abs(float(jnp.dot(state[10:14], quat))) - 1.0) < 1e-6 and float(state[10]) >= 0.0
    np.testing.assert_allclose(state[16:19], (0.45, 0.1, M.REST_Z[0]), atol=1e-6)
    np.testing.assert_allclose(state[37:40], (*BASKET_XY, 0.0), atol=1e-6)
    assert state.shape == (tasks.STATE_DIM,)


def test_reach_and_pick_predicates() -> None:
    can = np.array([0.45, 0.0, M.REST_Z[0]])
    assert ok("reach-soup_can", make_state({CAN: tuple(can)}, eef_at=can + [0.0, 0.0, 0.049]))
    assert not ok("reach-soup_can", make_state({CAN: tuple(can)}, eef_at=can + [0.0, 0.0, 0.051]))
    # pick: near and lifted more than LIFT = 0.03 above its resting height
    up = can + [0.0, 0.0, 0.031]
    assert ok("pick-soup_can", make_state({CAN: tuple(up)}, eef_at=up, fingers=0.033))
    low = can + [0.0, 0.0, 0.029]
    assert not ok("pick-soup_can", make_state({CAN: tuple(low)}, eef_at=low, fingers=0.033))
    assert not ok("pick-soup_can", make_state({CAN: tuple(up)}, eef_at=up + [0.0, 0.051, 0.0]))
    # the other objects do not count
    assert not ok("pick-cream_cheese", make_state({CAN: tuple(up)}, eef_at=up))


@pytest.mark.parametrize("obj,z_limit", [(CAN, 0.155), (CHEESE, 0.155), (BOTTLE, 0.22)])
def test_in_basket_thresholds(obj: int, z_limit: float) -> None:
    name = f"place-{('soup_can', 'cream_cheese', 'salad_dressing')[obj]}-in-basket"

    def at(dx: float, z: float) -> jnp.ndarray:
        return make_state({obj: (BASKET_XY[0] + dx, BASKET_XY[1], z)})

    assert ok(name, at(0.139, 0.05)) and not ok(name, at(0.141, 0.05))
    assert ok(name, at(0.0, z_limit - 0.002)) and not ok(name, at(0.0, z_limit + 0.002))
    assert ok(f"pick-place-{name.split('-')[1]}-in-basket", at(0.0, 0.05))


def test_on_predicate() -> None:
    b = np.array([0.5, 0.0, M.REST_Z[CHEESE]])
    assert ok("place-soup_can-on-cream_cheese", make_state({CHEESE: tuple(b), CAN: tuple(b + [0.099, 0.0, 0.07])}))
    assert not ok("place-soup_can-on-cream_cheese", make_state({CHEESE: tuple(b), CAN: tuple(b + [0.101, 0.0, 0.07])}))
    assert not ok("place-soup_can-on-cream_cheese", make_state({CHEESE: tuple(b), CAN: tuple(b + [0.0, 0.0, 0.221])}))
    # beside b (bottom below b's top) is not on b (ours): the bottle's origin is high, its bottom on the floor
    assert not ok("place-salad_dressing-on-cream_cheese",
                  make_state({CHEESE: tuple(b), BOTTLE: (b[0] + 0.09, b[1], M.REST_Z[BOTTLE])}))
    assert ok("place-salad_dressing-on-cream_cheese",
              make_state({CHEESE: tuple(b), BOTTLE: (b[0] + 0.09, b[1], M.REST_Z[BOTTLE] + 0.036)}))
    # still held (near the fingertips, fingers closed on it) is not placed (ours)
    on_top = b + [0.0, 0.0, 0.07]
    assert not ok("place-soup_can-on-cream_cheese",
                  make_state({CHEESE: tuple(b), CAN: tuple(on_top)}, eef_at=on_top, fingers=0.033))
    assert ok("place-soup_can-on-cream_cheese", make_state({CHEESE: tuple(b), CAN: tuple(on_top)}, eef_at=on_top))
    # below b is not on b (ours), and the reverse pair is a different task
    assert not ok("place-soup_can-on-cream_cheese", make_state({CAN: tuple(b), CHEESE: tuple(b + [0.0, 0.0, 0.07])}))
    assert ok("place-cream_cheese-on-soup_can", make_state({CAN: tuple(b), CHEESE: tuple(b + [0.0, 0.0, 0.07])}))


def test_aside_needs_the_start() -> None:
    start = make_state()
    moved = make_state({CHEESE: (0.50 + 0.071, -0.20, M.REST_Z[1])})
    short = make_state({CHEESE: (0.50 + 0.069, -0.20, M.REST_Z[1])})
    progress = Progress.initial(start)
    assert ok("move-cream_cheese-aside", moved, progress)
    assert not ok("move-cream_cheese-aside", short, progress)
    assert not ok("move-soup_can-aside", moved, progress)
    assert not ok("move-cream_cheese-aside", moved, None)  # documented: no start, no "aside"


def test_out_of_basket_threshold() -> None:
    far = make_state({BOTTLE: (BASKET_XY[0], BASKET_XY[1] - 0.351, M.REST_Z[2])})
    near = make_state({BOTTLE: (BASKET_XY[0], BASKET_XY[1] - 0.349, M.REST_Z[2])})
    assert ok("fire-take-salad_dressing-out", far) and not ok("fire-take-salad_dressing-out", near)


def in_basket_state(*objs: int) -> jnp.ndarray:
    place = {k: (BASKET_XY[0] + tasks.BASKET_SLOTS[k], BASKET_XY[1], M.REST_Z[k] + 0.01) for k in objs}
    return make_state(place)


def test_sequence_order_and_all_in_basket() -> None:
    goal = goal_of("basket-soup_can-then-cream_cheese")
    progress = Progress.initial(make_state())
    # the right order: can first (stage 1), then the cheese
    p1 = tasks.update_progress(progress, in_basket_state(CAN), goal)
    assert int(p1.stage) == 1
    both = in_basket_state(CAN, CHEESE)
    assert bool(tasks.success(both, goal, tasks.update_progress(p1, both, goal)))
    # the wrong order: cheese first, then the can -> never stage 1, never success
    q1 = tasks.update_progress(progress, in_basket_state(CHEESE), goal)
    q2 = tasks.update_progress(q1, both, goal)
    assert int(q2.stage) == 0 and not bool(tasks.success(both, goal, q2))
    # the reverse task succeeds on that order
    rev = goal_of("basket-cream_cheese-then-soup_can")
    r2 = tasks.update_progress(tasks.update_progress(progress, in_basket_state(CHEESE), rev), both, rev)
    assert bool(tasks.success(both, rev, r2))
    assert ok("all-in-basket", in_basket_state(CAN, CHEESE, BOTTLE))
    assert not ok("all-in-basket", in_basket_state(CAN, BOTTLE))


def test_reward_matches_hand_computed_values() -> None:
    can = np.array([0.45, 0.0, M.REST_Z[0]])
    goal = goal_of("reach-soup_can")
    prev = make_state({CAN: tuple(can)}, eef_at=can + [0.0, 0.0, 0.20])
    nxt = make_state({CAN: tuple(can)}, eef_at=can + [0.0, 0.0, 0.15])
    progress = Progress.initial(prev)
    # reach: 20 · (0.20 - 0.15) = 1.0, no event
    np.testing.assert_allclose(float(tasks.reward(prev, nxt, goal, progress)), 1.0, atol=1e-4)
    # without a progress the episode is taken to start at prev (generated data)
    np.testing.assert_allclose(float(tasks.reward(prev, nxt, goal)), 1.0, atol=1e-4)
    # reaching it: 20 · 0.11 + 1 (placement event: near) + 1 (success)
    done = make_state({CAN: tuple(can)}, eef_at=can + [0.0, 0.0, 0.04])
    np.testing.assert_allclose(float(tasks.reward(nxt, done, goal, progress)), 20 * 0.11 + 2.0, atol=1e-4)
    # pick: closing the fingers on the can at the grasp pose is a grasp event (+1); lifting 0.02 is 20 · 0.02
    pick = goal_of("pick-soup_can")
    at = make_state({CAN: tuple(can)}, eef_at=can, fingers=0.04)
    held = make_state({CAN: tuple(can)}, eef_at=can, fingers=0.033)
    np.testing.assert_allclose(float(tasks.reward(at, held, pick, progress)), 1.0, atol=1e-4)
    lifted = make_state({CAN: tuple(can + [0, 0, 0.02])}, eef_at=can + [0, 0, 0.02], fingers=0.033)
    np.testing.assert_allclose(float(tasks.reward(held, lifted, pick, progress)), 20 * 0.02, atol=1e-4)
    # a sub-goal's distance is taken for the sub-goal of prev: finishing the first object of "a then b"
    # does not charge the distance to b
    seq = goal_of("basket-soup_can-then-cream_cheese")
    start = make_state()
    p0 = Progress.initial(start)
    target = np.asarray(tasks.basket_slot(start, jnp.asarray(CAN)))
    before = make_state({CAN: tuple(target + [0, 0, 0.02])}, eef_at=target + [0, 0, 0.02], fingers=0.033)
    after = make_state({CAN: tuple(target)}, eef_at=target, fingers=0.033)
    p_before = tasks.update_progress(p0, before, seq)  # already in the basket region: stage 1 reached
    assert int(p_before.stage) == 1
    r = float(tasks.reward(before, after, seq, Progress.initial(start)))
    np.testing.assert_allclose(r, 20 * 0.02, atol=1e-4)


def test_legal() -> None:
    state = make_state()
    assert bool(tasks.legal(state))
    assert not bool(tasks.legal(state.at[7].add(0.05)))          # eef not where the joints put it
    assert not bool(tasks.legal(state.at[16 + 3].set(0.5)))      # non-unit quaternion
    assert not bool(tasks.legal(state.at[20].set(jnp.nan)))      # non-finite
    assert not bool(tasks.legal(state.at[3].set(0.5)))           # joint 4 beyond its upper limit (-0.07)
    assert not bool(tasks.legal(state.at[14].set(0.06)))         # finger beyond its travel
    batch = jnp.stack([state, state.at[0].set(9.0)])
    assert np.asarray(tasks.legal(batch)).tolist() == [True, False]
