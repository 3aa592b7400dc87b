"""CLEVR-Robot goals, predicates and instructions on hand-built states (no physics rollouts)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.envs.clevr import instructions as instr
from imaginejax.envs.clevr import physics
from imaginejax.envs.clevr import tasks

RED, BLUE, GREEN, PURPLE, CYAN = range(5)
BEHIND, LEFT, FRONT, RIGHT = tasks.BEHIND, tasks.LEFT, tasks.FRONT, tasks.RIGHT
AXIS_ANGLE = {BEHIND: 90.0, LEFT: 180.0, FRONT: -90.0, RIGHT: 0.0}

# Far-apart "parking" spots for balls a test does not place (pairwise > 0.5 apart, inside the bench).
PARK = np.array([[-0.8, -0.6], [0.8, -0.6], [-0.8, 0.8], [0.8, 0.8], [0.0, 0.85]], np.float32)


def state_with(**placed: tuple[float, float]) -> np.ndarray:
    """A (10,) state: named balls at the given spots, the others parked in their own corners."""
    names = ("red", "blue", "green", "purple", "cyan")
    balls = PARK.copy()
    for name, xy in placed.items():
        balls[names.index(name)] = xy
    return balls.reshape(10)


def polar(centre: tuple[float, float], radius: float, degrees: float) -> tuple[float, float]:
    return (centre[0] + radius * math.cos(math.radians(degrees)), centre[1] + radius * math.sin(math.radians(degrees)))


def rel_goal(*clauses: tuple[int, int, int]) -> np.ndarray:
    return tasks.encode_goal(tasks.KIND_RELATIONAL, tuple(clauses))


def ok(prev: np.ndarray, action: int, nxt: np.ndarray, goal: np.ndarray) -> bool:
    return bool(tasks.success(jnp.asarray(prev), jnp.asarray(action), jnp.asarray(nxt), jnp.asarray(goal)))


def rew(prev: np.ndarray, action: int, nxt: np.ndarray, goal: np.ndarray) -> float:
    return float(tasks.reward(jnp.asarray(prev), jnp.asarray(action), jnp.asarray(nxt), jnp.asarray(goal)))


# --------------------------------------------------------------------------------------------- tables
def test_goal_tables_sizes_and_determinism():
    train, rephrase, easy, hard = (tasks.level_goals(level) for level in tasks.LEVELS)
    assert train.shape == (80, tasks.GOAL_DIM) and train.dtype == np.int32
    np.testing.assert_array_equal(train, rephrase)
    assert len({tuple(g) for g in train}) == 80
    assert easy.shape == (20, tasks.GOAL_DIM) and (easy[:, 0] == tasks.KIND_PUSH).all()
    assert hard.shape == (82, tasks.GOAL_DIM)
    assert len({tuple(g) for g in hard}) == 82
    kinds, counts = hard[:, 0], hard[:, 1]
    assert ((kinds == tasks.KIND_RELATIONAL) & (counts == 2)).sum() == 40
    assert ((kinds == tasks.KIND_RELATIONAL) & (counts == 3)).sum() == 40
    assert (kinds == tasks.KIND_LINE).sum() == 1 and (kinds == tasks.KIND_GATHER).sum() == 1
    # Deterministic: rebuilding gives the same table.
    np.testing.assert_array_equal(tasks.hard_goals(), hard)
    # Every conjunction is a forest over distinct pairs (no contradiction like A left of B & B left of A).
    for goal in hard[:80]:
        _, _, clauses = tasks.decode_goal(goal)
        assert tasks._is_forest(clauses)
        assert all(a != b for a, b, _ in clauses)


def test_encode_decode_roundtrip():
    goal = rel_goal((RED, BLUE, LEFT), (GREEN, CYAN, FRONT))
    assert list(goal) == [0, 2, 0, 1, 1, 2, 4, 2, 0, 0, 0]
    assert tasks.decode_goal(goal) == (0, 2, ((0, 1, 1), (2, 4, 2)))
    assert tasks.describe_goal(goal) == "red left of blue & green front of cyan"


# --------------------------------------------------------------------------------------------- relations
@pytest.mark.parametrize("direction", [BEHIND, LEFT, FRONT, RIGHT])
def test_relation_sector_boundaries_and_distance(direction: int):
    goal = rel_goal((RED, BLUE, direction))
    b = (0.0, 0.1)
    axis = AXIS_ANGLE[direction]
    far = state_with(red=polar(b, 0.8, axis + 180.0), blue=b)
    cases = [
        (0.30, axis, True),
        (0.30, axis + 44.0, True),
        (0.30, axis - 44.0, True),
        (0.30, axis + 46.0, False),
        (0.30, axis - 46.0, False),
        (0.30, axis + 180.0, False),
        (0.385, axis, True),
        (0.395, axis, False),
        (0.385, axis + 40.0, True),
        (0.395, axis + 40.0, False),
    ]
    for radius, degrees, expected in cases:
        nxt = state_with(red=polar(b, radius, degrees), blue=b)
        assert ok(far, 0, nxt, goal) is expected, (radius, degrees)
        satisfied, valid = tasks.subconditions(jnp.asarray(nxt), jnp.asarray(goal))
        assert list(np.asarray(valid)) == [True, False, False, False]
        assert bool(satisfied[0]) is expected


def test_relation_is_ordered_and_coincident_balls_fail():
    goal = rel_goal((RED, BLUE, RIGHT))
    s = state_with(red=(0.3, 0.0), blue=(0.0, 0.0))
    assert ok(s, 0, s, goal)
    assert not ok(s, 0, s, rel_goal((BLUE, RED, RIGHT)))
    assert ok(s, 0, s, rel_goal((BLUE, RED, LEFT)))
    same = state_with(red=(0.0, 0.0), blue=(0.0, 0.0))
    assert not ok(same, 0, same, goal)


def test_relational_reward_is_ten_times_distance_decrease():
    goal = rel_goal((RED, BLUE, RIGHT))
    prev = state_with(red=(-0.5, 0.0), blue=(0.1, 0.0))  # |A-B| = 0.6
    nxt = state_with(red=(-0.15, 0.0), blue=(0.1, 0.0))  # |A-B| = 0.25
    assert rew(prev, 0, nxt, goal) == pytest.approx(3.5, abs=1e-5)
    assert rew(nxt, 0, prev, goal) == pytest.approx(-3.5, abs=1e-5)
    assert rew(prev, 17, prev, goal) == 0.0
    # Success reads the next state only: not the previous one.
    sat = state_with(red=(0.4, 0.0), blue=(0.1, 0.0))
    assert ok(prev, 0, sat, goal) and not ok(sat, 0, prev, goal)


def test_conjunction_needs_every_clause_and_count_reward():
    goal = rel_goal((RED, BLUE, RIGHT), (GREEN, BLUE, BEHIND), (CYAN, PURPLE, FRONT))
    blue, purple = (0.0, 0.0), (0.5, 0.5)
    none = state_with(blue=blue, purple=purple)
    one = state_with(red=(0.3, 0.0), blue=blue, purple=purple)
    two = state_with(red=(0.3, 0.0), green=(0.0, 0.3), blue=blue, purple=purple)
    three = state_with(red=(0.3, 0.0), green=(0.0, 0.3), blue=blue, purple=purple, cyan=(0.5, 0.2))
    counts = [int(tasks.num_satisfied(jnp.asarray(s), jnp.asarray(goal))) for s in (none, one, two, three)]
    assert counts == [0, 1, 2, 3]
    assert [ok(none, 0, s, goal) for s in (none, one, two, three)] == [False, False, False, True]
    # 10 × (change of the number of satisfied clauses) on this very transition: no one-step lag.
    assert rew(none, 0, one, goal) == 10.0
    assert rew(one, 0, three, goal) == 20.0
    assert rew(three, 0, one, goal) == -20.0
    assert rew(two, 0, two, goal) == 0.0
    assert rew(none, 0, three, goal) == 30.0


# --------------------------------------------------------------------------------------------- push
def test_push_goal_compatibility_table_and_reward():
    table = {BEHIND: {1, 4, 5}, LEFT: {2, 5, 7}, FRONT: {3, 6, 7}, RIGHT: {0, 4, 6}}
    goals, actions, expected = [], [], []
    for ball in range(5):
        for direction, allowed in table.items():
            for action in range(40):
                goals.append(tasks.encode_goal(tasks.KIND_PUSH, ((ball, 0, direction),)))
                actions.append(action)
                expected.append(action // 8 == ball and action % 8 in allowed)
    n = len(goals)
    prev = jnp.broadcast_to(jnp.asarray(state_with()), (n, 10))
    nxt = jnp.broadcast_to(jnp.asarray(state_with(red=(0.0, 0.0))), (n, 10))  # the state does not matter
    goals_j, actions_j = jnp.asarray(np.stack(goals)), jnp.asarray(actions)
    np.testing.assert_array_equal(np.asarray(tasks.success(prev, actions_j, nxt, goals_j)), expected)
    np.testing.assert_array_equal(np.asarray(tasks.reward(prev, actions_j, nxt, goals_j)), np.asarray(expected, np.float32))
    assert sum(expected) == 5 * 4 * 3
    # Direction vectors of the compatible pushes really point into the relation's half plane.
    for direction, allowed in table.items():
        axis = tasks.RELATION_VECTORS[direction]
        for d in range(8):
            assert (float(physics.DIRECTIONS[d] @ axis) > 0) == (d in allowed)


def test_push_goal_is_never_satisfied_by_a_state():
    goal = jnp.asarray(tasks.encode_goal(tasks.KIND_PUSH, ((RED, 0, RIGHT),)))
    assert not bool(tasks.state_satisfied(jnp.asarray(state_with()), goal))


# --------------------------------------------------------------------------------------------- line
def line_state(angles: list[float], spacing: float = 0.3) -> np.ndarray:
    """Balls red..cyan placed one after another, ball i+1 at ``angles[i]`` degrees from ball i."""
    points = [(-0.6, 0.1)]
    for a in angles:
        points.append(polar(points[-1], spacing, a))
    return np.asarray(points, np.float32).reshape(10)


def test_line_goal():
    goal = tasks.level_goals("hard")[80]
    assert goal[0] == tasks.KIND_LINE
    straight = line_state([0, 0, 0, 0])
    assert ok(straight, 0, straight, goal)
    wavy = line_state([29, -29, 29, -29])
    assert ok(straight, 0, wavy, goal)
    one_off = line_state([0, 31, 0, 0])
    assert not ok(straight, 0, one_off, goal)
    assert int(tasks.num_satisfied(jnp.asarray(one_off), jnp.asarray(goal))) == 3
    reversed_line = line_state([180, 180, 180, 180])
    assert int(tasks.num_satisfied(jnp.asarray(reversed_line), jnp.asarray(goal))) == 0
    # Hard reward: +10 per newly satisfied pair, on this transition.
    assert rew(one_off, 0, straight, goal) == 10.0
    assert rew(straight, 0, reversed_line, goal) == -40.0
    # The line has no distance limit: long gaps are fine.
    assert ok(straight, 0, line_state([0, 0, 0, 0], spacing=0.6), goal)


# --------------------------------------------------------------------------------------------- gather
def test_gather_goal():
    goal = tasks.level_goals("hard")[81]
    assert goal[0] == tasks.KIND_GATHER and goal[2] == GREEN
    g = (0.0, 0.1)
    tight = state_with(green=g, red=polar(g, 0.3, 0), blue=polar(g, 0.3, 90), purple=polar(g, 0.3, 180), cyan=polar(g, 0.3, 270))
    assert ok(tight, 0, tight, goal)
    loose = state_with(green=g, red=polar(g, 0.33, 0), blue=polar(g, 0.3, 90), purple=polar(g, 0.3, 180), cyan=polar(g, 0.3, 270))
    assert not ok(tight, 0, loose, goal)
    assert int(tasks.num_satisfied(jnp.asarray(loose), jnp.asarray(goal))) == 3
    assert rew(loose, 0, tight, goal) == 10.0
    spread = state_with(green=g)
    assert int(tasks.num_satisfied(jnp.asarray(spread), jnp.asarray(goal))) == 0
    assert rew(tight, 0, spread, goal) == -40.0


# --------------------------------------------------------------------------------------------- legal
def test_legal():
    layouts = physics.sample_layout(jax.random.PRNGKey(0), 256).reshape(256, 10)
    assert bool(tasks.legal(layouts).all())
    base = state_with(red=(0.0, 0.0), blue=(0.27, 0.0))
    assert bool(tasks.legal(jnp.asarray(base)))
    slight = state_with(red=(0.0, 0.0), blue=(0.26 - 0.01, 0.0))  # within the tolerance
    assert bool(tasks.legal(jnp.asarray(slight)))
    overlap = state_with(red=(0.0, 0.0), blue=(0.2, 0.0))
    assert not bool(tasks.legal(jnp.asarray(overlap)))
    out_x = state_with(red=(tasks.WORKBENCH_HIGH[0] + 0.01, 0.0))
    out_y = state_with(red=(0.0, tasks.WORKBENCH_LOW[1] - 0.01))
    assert not bool(tasks.legal(jnp.asarray(out_x))) and not bool(tasks.legal(jnp.asarray(out_y)))
    nan = base.copy()
    nan[3] = np.nan
    assert not bool(tasks.legal(jnp.asarray(nan)))
    batch = jnp.stack([jnp.asarray(s) for s in (base, overlap, out_x)])
    assert list(np.asarray(tasks.legal(batch))) == [True, False, False]


# --------------------------------------------------------------------------------------------- batching
def test_predicates_broadcast_jit_and_vmap_agree():
    key = jax.random.PRNGKey(3)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    n = 64
    goals = jnp.asarray(np.concatenate([tasks.level_goals(level) for level in ("train", "easy", "hard")]))
    goal = goals[jax.random.randint(k1, (n,), 0, goals.shape[0])]
    prev = jax.random.uniform(k2, (n, 10), minval=-0.6, maxval=0.6)
    nxt = prev + 0.2 * jax.random.normal(k3, (n, 10))
    action = jax.random.randint(k4, (n,), 0, 40)
    for fn in (tasks.success, tasks.reward):
        batched = jax.jit(fn)(prev, action, nxt, goal)
        mapped = jax.vmap(fn)(prev, action, nxt, goal)
        single = jnp.stack([fn(prev[i], action[i], nxt[i], goal[i]) for i in range(4)])
        np.testing.assert_allclose(np.asarray(batched), np.asarray(mapped), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(batched[:4]), np.asarray(single), rtol=1e-6)
        assert batched.shape == (n,)
    np.testing.assert_array_equal(np.asarray(jax.jit(tasks.legal)(prev)), np.asarray(jax.vmap(tasks.legal)(prev)))


# --------------------------------------------------------------------------------------------- instructions
def test_instruction_counts_and_disjoint_rephrasings():
    assert len(instr.TRAIN_TEMPLATES) >= 18 and len(set(instr.TRAIN_TEMPLATES)) == len(instr.TRAIN_TEMPLATES)
    assert len(instr.REPHRASE_TEMPLATES) == 40 and len(set(instr.REPHRASE_TEMPLATES)) == 40
    assert not set(instr.TRAIN_TEMPLATES) & set(instr.REPHRASE_TEMPLATES)
    for templates in (instr.EASY_TEMPLATES, instr.CONJUNCTION_TEMPLATES, instr.LINE_TEMPLATES, instr.GATHER_TEMPLATES):
        assert len(set(templates)) >= 8
    train = instr.level_instructions("train")
    rephrase = instr.level_instructions("rephrase")
    assert not set(train) & set(rephrase)
    for level, per_task in (("train", 18), ("rephrase", 40), ("easy", 8), ("hard", 8)):
        table, ids, counts = instr.level_instruction_table(level)
        assert len(set(table)) == len(table)  # unique strings
        assert ids.shape[0] == len(tasks.level_goals(level)) and (counts >= per_task).all()
        valid = np.arange(ids.shape[1])[None] < counts[:, None]
        assert ((ids >= 0) & (ids < len(table)))[valid].all() and (ids[~valid] == -1).all()
        # Each id belongs to exactly one task.
        assert len(set(ids[valid].tolist())) == int(valid.sum())


def test_instructions_name_the_goal():
    goal = tasks.level_goals("train")[0]  # red behind blue
    for text in instr.goal_instructions(goal, "train") + instr.goal_instructions(goal, "rephrase"):
        assert "red" in text and "blue" in text
        assert text.index("red") < text.index("blue") or text.startswith(("The blue", "Find the blue", "Next to the blue"))
    easy = tasks.level_goals("easy")[5]  # blue, left
    for text in instr.goal_instructions(easy, "easy"):
        assert "blue" in text and "left" in text
    hard = tasks.level_goals("hard")
    for text in instr.goal_instructions(hard[80], "hard"):
        assert "red" in text and "cyan" in text
    for text in instr.goal_instructions(hard[81], "hard"):
        assert "green" in text
    with pytest.raises(ValueError, match="single-clause"):
        instr.goal_instructions(hard[0], "train")
    with pytest.raises(ValueError, match="valid levels"):
        instr.level_instruction_table("nope")
    # Deterministic order.
    assert instr.goal_instructions(goal, "train")[0] == "Move the red ball behind the blue ball."
