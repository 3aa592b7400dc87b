"""BabyAI goals, predicates, potentials, rewards, legality and instructions on hand-built states."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai import instructions as instr
from imaginejax.envs.babyai import tasks as T

RED, GREEN, BLUE, PURPLE, YELLOW, GREY = range(6)
ANY = T.ANY_COLOUR


def state(*, ball=(RED, 2, 2), box=(GREEN, 5, 5), key=(BLUE, 2, 5), door=(YELLOW, 3, G.CLOSED), agent=(3, 3),
          carried=(G.NOTHING, 0)) -> np.ndarray:
    """A (17,) float32 state vector; object arguments are (colour, x, y), door (colour, y, state)."""
    return np.asarray(G.to_vector(G.make_grid(ball=ball, box=box, key=key, door=door, agent=agent, carried=carried)))


def ok(s: np.ndarray, goal: np.ndarray) -> bool:
    return bool(T.success(jnp.asarray(s), 0, jnp.asarray(s), jnp.asarray(goal)))


def phi(s: np.ndarray, goal: np.ndarray) -> int:
    return int(T.potential(jnp.asarray(s), jnp.asarray(goal)))


def rew(prev: np.ndarray, nxt: np.ndarray, goal: np.ndarray, t: int) -> float:
    return float(T.reward(jnp.asarray(prev), 0, jnp.asarray(nxt), jnp.asarray(goal), t))


def go_to(obj, colour):
    return T.encode_goal(T.KIND_GO_TO, object_a=obj, colour_a=colour)


def pick_up(obj, colour):
    return T.encode_goal(T.KIND_PICK_UP, object_a=obj, colour_a=colour)


def put_next(a, ca, b, cb):
    return T.encode_goal(T.KIND_PUT_NEXT, object_a=a, colour_a=ca, object_b=b, colour_b=cb)


def open_door(colour):
    return T.encode_goal(T.KIND_OPEN, door_colour=colour)


# --------------------------------------------------------------------------------------------- tables
def test_goal_tables():
    train, rephrase, easy, hard = (T.level_goals(level) for level in T.LEVELS)
    np.testing.assert_array_equal(train, rephrase)
    for table, size in ((train, 78), (easy, 42), (hard, 3)):
        assert table.shape == (size, T.GOAL_DIM) and table.dtype == np.int32
        assert len({tuple(g) for g in table}) == size
    kinds = lambda table: {T.KIND_NAMES[k]: int((table[:, 0] == k).sum()) for k in np.unique(table[:, 0])}  # noqa: E731
    assert kinds(train) == {"go_to": 18, "open": 6, "pick_up": 18, "put_next": 36}
    assert kinds(easy) == {"open_go_to": 18, "open_pick_up": 18, "go_to_wall": 5, "go_to_centre": 1}
    assert kinds(hard) == {"unlock": 1, "line": 1, "pile": 1}
    # Interleaved: the first 4 train tasks (and the first 4 easy ones) cover all four templates.
    assert set(train[:4, 0]) == set(T.LEVEL_KINDS["train"])
    assert set(easy[:4, 0]) == set(T.LEVEL_KINDS["easy"])
    # Every colour is named for X and for Y in each ordered pair of put-next.
    put = train[train[:, 0] == T.KIND_PUT_NEXT]
    for a, b in T.OBJECT_PAIRS:
        rows = put[(put[:, 1] == a) & (put[:, 3] == b)]
        assert sorted(rows[:, 2]) == list(range(6)) and sorted(rows[:, 4]) == list(range(6))
    np.testing.assert_array_equal(T.train_goals(), train)  # deterministic
    assert T.describe_goal(put[0]).startswith("put ")
    with pytest.raises(ValueError, match="valid levels"):
        T.level_goals("real")


def test_instruction_tables():
    counts = {"train": 40, "rephrase": 10, "easy": 10, "hard": 10}
    tables = {}
    for level, per_task in counts.items():
        table, ids, n = instr.level_instruction_table(level)
        goals = T.level_goals(level)
        assert ids.shape == (len(goals), per_task) and (n == per_task).all()
        assert len(table) == len(goals) * per_task  # no string shared between two tasks
        assert len(set(table)) == len(table)
        tables[level] = set(table)
        for goal, row in zip(goals, ids):
            words = []
            if goal[0] in T.KINDS_WITH_OBJECT_A:
                words += [G.OBJECT_NAMES[goal[1]], G.COLOURS[goal[2]]]
            for m in row:
                text = table[m].lower()
                assert all(w in text for w in words), (text, words)
    assert not tables["train"] & tables["rephrase"]
    # Every template family has >= 40 training phrasings and 10 different rephrasings.
    for kind in T.LEVEL_KINDS["train"]:
        assert len(set(instr.TEMPLATES["train"][kind])) >= 40
        assert len(set(instr.TEMPLATES["rephrase"][kind])) == 10
        assert not set(instr.TEMPLATES["train"][kind]) & set(instr.TEMPLATES["rephrase"][kind])
    assert instr.goal_instructions(go_to(G.BALL, RED), "train")[0] == "Go to the red ball."
    assert instr.goal_instructions(T.encode_goal(T.KIND_GO_TO_WALL, side=T.SIDE_ANY), "easy")[0] == "Go to a wall."
    with pytest.raises(ValueError, match="no goal of kind"):
        instr.goal_instructions(go_to(G.BALL, RED), "hard")


# --------------------------------------------------------------------------------------------- predicates
def test_go_to():
    goal = go_to(G.BALL, RED)  # the red ball is at (2, 2)
    assert ok(state(agent=(2, 2)), goal)  # on its cell
    for a in ((1, 2), (3, 2), (2, 1), (2, 3)):
        assert ok(state(agent=a), goal)  # 4-neighbours
    for a in ((3, 3), (1, 1), (4, 2), (2, 4)):
        assert not ok(state(agent=a), goal)  # diagonal / distance 2
    assert not ok(state(agent=(2, 2), ball=(RED, 0, 0), carried=(G.BALL, RED)), goal)  # carried
    assert not ok(state(agent=(2, 2)), go_to(G.BALL, BLUE))  # another colour named
    assert ok(state(agent=(2, 2)), go_to(G.BALL, ANY))
    assert not ok(state(agent=(2, 2)), go_to(G.BOX, GREEN))


def test_open():
    assert ok(state(door=(YELLOW, 3, G.OPEN)), open_door(YELLOW))
    assert ok(state(door=(YELLOW, 3, G.OPEN)), open_door(ANY))
    assert not ok(state(door=(YELLOW, 3, G.OPEN)), open_door(RED))
    assert not ok(state(door=(YELLOW, 3, G.CLOSED)), open_door(YELLOW))
    assert not ok(state(door=(YELLOW, 3, G.LOCKED)), open_door(YELLOW))


def test_pick_up():
    goal = pick_up(G.KEY, BLUE)
    assert ok(state(key=(BLUE, 0, 0), carried=(G.KEY, BLUE)), goal)
    assert not ok(state(agent=(2, 5)), goal)  # standing on it is not carrying it
    assert not ok(state(ball=(RED, 0, 0), carried=(G.BALL, RED)), goal)
    assert not ok(state(key=(BLUE, 0, 0), carried=(G.KEY, BLUE)), pick_up(G.KEY, RED))


def test_put_next():
    goal = put_next(G.BALL, RED, G.BOX, GREEN)
    assert ok(state(ball=(RED, 4, 5)), goal)  # box at (5, 5)
    assert ok(state(ball=(RED, 5, 4)), goal)
    assert ok(state(ball=(RED, 5, 6)), goal)
    assert not ok(state(ball=(RED, 4, 4)), goal)  # diagonal
    assert not ok(state(ball=(RED, 3, 5)), goal)  # distance 2
    assert not ok(state(ball=(RED, 0, 0), agent=(4, 5), carried=(G.BALL, RED)), goal)  # still carried
    assert not ok(state(ball=(RED, 4, 5)), put_next(G.BALL, RED, G.BOX, BLUE))
    assert ok(state(ball=(RED, 4, 5)), put_next(G.BOX, GREEN, G.BALL, RED))  # adjacency is symmetric


def test_open_then_go_to_and_open_then_pick_up():
    go = T.encode_goal(T.KIND_OPEN_GO_TO, object_a=G.BOX, colour_a=GREEN, door_colour=ANY)
    assert ok(state(agent=(5, 4), door=(YELLOW, 3, G.OPEN)), go)
    assert not ok(state(agent=(5, 4), door=(YELLOW, 3, G.CLOSED)), go)
    assert not ok(state(agent=(6, 3), door=(YELLOW, 3, G.OPEN)), go)
    pick = T.encode_goal(T.KIND_OPEN_PICK_UP, object_a=G.BOX, colour_a=GREEN, door_colour=ANY)
    holding = dict(box=(GREEN, 0, 0), carried=(G.BOX, GREEN), agent=(6, 3))
    assert ok(state(door=(YELLOW, 3, G.OPEN), **holding), pick)  # can succeed (the reference's cannot)
    assert not ok(state(door=(YELLOW, 3, G.CLOSED), **holding), pick)
    assert not ok(state(door=(YELLOW, 3, G.OPEN), agent=(5, 5)), pick)


@pytest.mark.parametrize("side, cells", [
    (T.SIDE_WEST, {(1, y) for y in range(1, 7)}),
    (T.SIDE_EAST, {(6, y) for y in range(1, 7)}),
    (T.SIDE_NORTH, {(x, 1) for x in range(1, 7)}),
    (T.SIDE_SOUTH, {(x, 6) for x in range(1, 7)}),
    (T.SIDE_ANY, {(x, y) for x in range(1, 7) for y in range(1, 7) if x in (1, 6) or y in (1, 6)}),
])
def test_go_to_wall(side, cells):
    goal = T.encode_goal(T.KIND_GO_TO_WALL, side=side)
    for x, y in itertools.product(range(1, 7), repeat=2):
        assert ok(state(agent=(x, y)), goal) == ((x, y) in cells), (x, y)


def test_go_to_centre():
    goal = T.encode_goal(T.KIND_GO_TO_CENTRE)
    hits = {(x, y) for x, y in itertools.product(range(1, 7), repeat=2) if ok(state(agent=(x, y)), goal)}
    assert hits == {(3, 3), (3, 4), (4, 3), (4, 4)}


def test_unlock():
    goal = T.encode_goal(T.KIND_UNLOCK, door_colour=ANY)
    key_held = dict(key=(YELLOW, 0, 0), carried=(G.KEY, YELLOW), agent=(6, 3))
    assert ok(state(door=(YELLOW, 3, G.OPEN), **key_held), goal)
    assert not ok(state(door=(YELLOW, 3, G.LOCKED), **key_held), goal)
    assert not ok(state(door=(YELLOW, 3, G.OPEN), key=(YELLOW, 2, 5)), goal)  # key not carried
    assert not ok(state(door=(YELLOW, 3, G.OPEN), key=(BLUE, 0, 0), carried=(G.KEY, BLUE)), goal)


def _three(cells) -> np.ndarray:
    (bx, by), (xx, xy), (kx, ky) = cells
    return state(ball=(RED, bx, by), box=(GREEN, xx, xy), key=(BLUE, kx, ky), agent=(1, 1))


def test_line_and_pile_hand_built():
    line, pile = T.encode_goal(T.KIND_LINE), T.encode_goal(T.KIND_PILE)
    assert ok(_three([(1, 4), (3, 4), (6, 4)]), line)  # a shared row, gaps allowed
    assert ok(_three([(2, 1), (2, 2), (2, 6)]), line)  # a shared column
    assert not ok(_three([(1, 4), (3, 4), (6, 5)]), line)
    assert ok(_three([(3, 3), (3, 4), (4, 4)]), pile)  # an L
    assert ok(_three([(5, 6), (6, 6), (6, 5)]), pile)
    assert not ok(_three([(3, 3), (4, 3), (5, 3)]), pile)  # straight: collinear
    assert not ok(_three([(3, 3), (4, 4), (5, 5)]), pile)  # diagonal: no adjacent pair
    assert not ok(_three([(3, 3), (4, 3), (6, 6)]), pile)  # one adjacent pair only
    carried = state(ball=(RED, 0, 0), box=(GREEN, 3, 4), key=(BLUE, 4, 4), agent=(3, 3), carried=(G.BALL, RED))
    assert not ok(carried, pile)  # the held ball is where the agent is, but not on the floor
    assert not ok(state(ball=(RED, 0, 0), box=(GREEN, 3, 4), key=(BLUE, 3, 5), agent=(3, 3),
                        carried=(G.BALL, RED)), line)


def test_line_and_pile_exhaustively_match_their_definitions():
    """All 7140 placements of the three objects on distinct cells: line ⇔ shared row or column;
    pile ⇔ at least two 4-adjacent pairs and not collinear."""
    cells = list(itertools.product(range(1, 7), repeat=2))
    triples = list(itertools.combinations(cells, 3))
    base = _three([(1, 1), (2, 1), (3, 1)])
    states = np.repeat(base[None], len(triples), axis=0)
    cells_xy = np.asarray(triples, np.float32)  # (7140, 3, 2)
    for slot in range(3):
        states[:, 3 * slot + 1 : 3 * slot + 3] = cells_xy[:, slot]
    line = np.asarray(T.state_satisfied(jnp.asarray(states), jnp.asarray(T.encode_goal(T.KIND_LINE))))
    pile = np.asarray(T.state_satisfied(jnp.asarray(states), jnp.asarray(T.encode_goal(T.KIND_PILE))))
    for t, is_line, is_pile in zip(triples, line, pile):
        xs, ys = {c[0] for c in t}, {c[1] for c in t}
        collinear = len(xs) == 1 or len(ys) == 1
        adjacent = sum(abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1 for a, b in itertools.combinations(t, 2))
        assert is_line == collinear, t
        assert is_pile == (adjacent >= 2 and not collinear), t
    assert line.sum() == 12 * 20 and pile.sum() == 25 * 4


# --------------------------------------------------------------------------------------------- potentials and rewards
def test_potentials_hand_computed():
    s = state(agent=(5, 1))  # ball (2,2), box (5,5), key (2,5), door row 3 closed
    assert phi(s, go_to(G.BALL, RED)) == 4 - 1  # d = 3 + 1 = 4
    assert phi(s, pick_up(G.BOX, GREEN)) == 4 + 1  # walk 4, pick up
    assert phi(s, open_door(YELLOW)) == (2 + 2 - 1) + 1  # to the cell in front, toggle
    # put the ball next to the box: walk 4 to the ball, pick, carry d(ball, box) - 1 = 5, drop.
    assert phi(s, put_next(G.BALL, RED, G.BOX, GREEN)) == 4 + 1 + 5 + 1
    holding = state(agent=(3, 3), ball=(RED, 0, 0), carried=(G.BALL, RED))
    assert phi(holding, put_next(G.BALL, RED, G.BOX, GREEN)) == (4 - 1) + 1
    assert phi(holding, go_to(G.BALL, RED)) == 1  # must drop it
    assert phi(holding, pick_up(G.KEY, BLUE)) == 3 + 1 + 1  # drop, walk 3, pick
    open_go = T.encode_goal(T.KIND_OPEN_GO_TO, object_a=G.KEY, colour_a=BLUE, door_colour=ANY)
    # door: (2 + 2 - 1) + 1 = 4; then from (6, 3) to near the key (2, 5): 6 - 1 = 5.
    assert phi(s, open_go) == 4 + 5
    assert phi(state(agent=(5, 1), door=(YELLOW, 3, G.OPEN)), open_go) == 3 + 4 - 1
    open_pick = T.encode_goal(T.KIND_OPEN_PICK_UP, object_a=G.KEY, colour_a=BLUE, door_colour=ANY)
    assert phi(s, open_pick) == 4 + 6 + 1
    assert phi(s, T.encode_goal(T.KIND_GO_TO_WALL, side=T.SIDE_SOUTH)) == 5
    any_wall = T.encode_goal(T.KIND_GO_TO_WALL, side=T.SIDE_ANY)
    assert ok(s, any_wall) and phi(s, any_wall) == 0  # (5, 1) is on the north wall
    assert phi(s, T.encode_goal(T.KIND_GO_TO_CENTRE)) == 1 + 2
    locked = state(agent=(5, 1), door=(YELLOW, 3, G.LOCKED), key=(YELLOW, 2, 5))
    unlock = T.encode_goal(T.KIND_UNLOCK, door_colour=ANY)
    # walk 3 + 4 = 7 to the key, pick up, carry to the door (d(key, door) - 1 = 5 + 2 - 1 = 6), toggle.
    assert phi(locked, unlock) == 7 + 1 + 6 + 1
    # line: x-extent 3 (2..5), y-extent 3 (2..5) → 3; pile: |3-1| + |3-1| = 4.
    assert phi(s, T.encode_goal(T.KIND_LINE)) == 3
    assert phi(s, T.encode_goal(T.KIND_PILE)) == 4
    # Holding the ball at (3, 3): effective cells (3,3), (5,5), (2,5): W = 3, H = 2; one object carried.
    assert phi(holding, T.encode_goal(T.KIND_LINE)) == 2 + 1
    assert phi(holding, T.encode_goal(T.KIND_PILE)) == 2 + 1 + 1
    # Success states have potential 0.
    assert phi(state(agent=(2, 3)), go_to(G.BALL, RED)) == 0


def test_rewards_hand_computed():
    goal = go_to(G.BALL, RED)  # ball at (2, 2)
    far, nearer = state(agent=(5, 1)), state(agent=(4, 1))
    assert rew(far, nearer, goal, t=1) == pytest.approx(0.1)  # φ 3 → 2
    assert rew(nearer, far, goal, t=2) == pytest.approx(-0.1)
    assert rew(far, far, goal, t=3) == pytest.approx(0.0)  # bumped into a wall
    arrived = state(agent=(3, 2))
    assert rew(state(agent=(4, 2)), arrived, goal, t=10) == pytest.approx(1 - 0.9 * 10 / 128)
    assert rew(state(agent=(4, 2)), arrived, goal, t=128) == pytest.approx(0.1)
    # Picking up (φ 1 → 0 is success) and the time-scaled success reward of the public API.
    pick = pick_up(G.BOX, GREEN)
    on_box = state(agent=(5, 5))
    holding = state(agent=(5, 5), box=(GREEN, 0, 0), carried=(G.BOX, GREEN))
    assert rew(on_box, holding, pick, t=64) == pytest.approx(1 - 0.45)
    # Picking up X in "put X next to Y" is progress: φ = 0 + 1 + (3 - 1) + 1 = 4 → (3 - 1) + 1 = 3.
    put = put_next(G.BOX, GREEN, G.KEY, BLUE)  # box (5,5), key (2,5)
    assert phi(on_box, put) == 0 + 1 + 2 + 1 and phi(holding, put) == 2 + 1
    assert rew(on_box, holding, put, t=5) == pytest.approx(0.1)
    # Batched: broadcasting over leading dims.
    prev = jnp.stack([jnp.asarray(far), jnp.asarray(nearer)])
    nxt = jnp.stack([jnp.asarray(nearer), jnp.asarray(far)])
    out = T.reward(prev, jnp.zeros(2, jnp.int32), nxt, jnp.asarray(goal)[None].repeat(2, 0), jnp.array([1, 2]))
    np.testing.assert_allclose(np.asarray(out), [0.1, -0.1], rtol=1e-6)


# --------------------------------------------------------------------------------------------- legality
def test_legal():
    good = state()
    assert bool(T.legal(jnp.asarray(good)))
    assert bool(T.legal(jnp.asarray(state(ball=(RED, 0, 0), carried=(G.BALL, RED)))))
    bad = {
        "carried object not at (0, 0)": state(carried=(G.BALL, RED)),
        "floor object at (0, 0)": state(ball=(RED, 0, 0)),
        "carried colour mismatch": state(ball=(RED, 0, 0), carried=(G.BALL, GREEN)),
        "empty hands with a colour": state(carried=(G.NOTHING, GREEN)),
        "two objects on one cell": state(ball=(RED, 5, 5)),
        "object in the wall": state(ball=(RED, 7, 2)),
        "agent in the wall": state(agent=(0, 3)),
        "colour 6": state(ball=(6, 2, 2)),
        "door state 3": state(door=(YELLOW, 3, 3)),
        "door row 0": state(door=(YELLOW, 0, G.OPEN)),
    }
    for name, s in bad.items():
        assert not bool(T.legal(jnp.asarray(s))), name
    moved_door = good.copy()
    moved_door[G.DOOR_X_INDEX] = 6
    half = good.copy()
    half[G.AGENT_X] = 2.5
    nan = good.copy()
    nan[0] = np.nan
    for s in (moved_door, half, nan):
        assert not bool(T.legal(jnp.asarray(s)))
    both = T.legal(jnp.stack([jnp.asarray(good), jnp.asarray(nan)]))
    assert both.tolist() == [True, False]
