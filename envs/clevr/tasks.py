"""CLEVR-Robot goals, goal encoding, and the pure success / reward / legality predicates on state vectors
(..., 10), the (x, y) of each ball in colour order, broadcasting over leading dims.

"A is <dir> of B" (behind +y, left -x, front -y, right +x) holds iff ``0 < |A - B| < 0.39`` and the angle
of ``A - B`` is within ±45° of the axis. Goal vector (GOAL_DIM = 11) int32
``[kind, n, a0, b0, d0, a1, b1, d1, a2, b2, d2]``, unused slots 0:

* ``KIND_RELATIONAL``: n in 1..3 clauses "ball a_i is d_i of ball b_i" (n = 1: train / rephrase);
* ``KIND_PUSH`` (easy): "push ball a0 d0", success from the action alone;
* ``KIND_LINE``: ball i+1 within ±30° of +x from ball i for the four consecutive pairs;
* ``KIND_GATHER``: every ball other than the centre a0 within 0.325 of it.

Rewards: :func:`reward`. The design of the levels: docs/envs.md.
"""

from __future__ import annotations

import itertools
import math
from typing import Final

import chex
import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.envs.base import cached_level_goals, check_level
from imaginejax.envs.clevr import physics

N_BALLS: Final[int] = physics.N_BALLS
STATE_DIM: Final[int] = 2 * N_BALLS
NUM_DIRECTIONS: Final[int] = int(physics.DIRECTIONS.shape[0])
NUM_ACTIONS: Final[int] = N_BALLS * NUM_DIRECTIONS
BALL_RADIUS: Final[float] = float(physics.BALL_RADIUS)

# ---------------------------------------------------------------------------------------------------
# Relations and thresholds
# ---------------------------------------------------------------------------------------------------
RELATIONS: Final[tuple[str, ...]] = ("behind", "left", "front", "right")
BEHIND, LEFT, FRONT, RIGHT = 0, 1, 2, 3
RELATION_VECTORS: Final[np.ndarray] = np.array([[0.0, 1.0], [-1.0, 0.0], [0.0, -1.0], [1.0, 0.0]], np.float32)
SECTOR_HALF_ANGLE: Final[float] = math.pi / 4  # ±45° around the relation's axis
RELATION_MAX_DISTANCE: Final[float] = 0.39  # three radii
LINE_HALF_ANGLE: Final[float] = math.pi / 6  # ±30° around +x
GATHER_RADIUS: Final[float] = 0.325
GATHER_CENTRE: Final[int] = 2  # the green ball
RELATIONAL_REWARD_SCALE: Final[float] = 10.0
SUBCONDITION_REWARD_SCALE: Final[float] = 10.0

# Push directions (indices into physics.DIRECTIONS) compatible with each relation direction.
PUSH_COMPATIBLE: Final[np.ndarray] = np.zeros((len(RELATIONS), NUM_DIRECTIONS), bool)
for _rel, _dirs in ((BEHIND, (1, 4, 5)), (LEFT, (2, 5, 7)), (FRONT, (3, 6, 7)), (RIGHT, (0, 4, 6))):
    PUSH_COMPATIBLE[_rel, list(_dirs)] = True
PUSH_COMPATIBLE.setflags(write=False)

# ---------------------------------------------------------------------------------------------------
# Legality ("workbench"): the layout distribution x ~ U[-0.5, 0.5], y ~ U[-0.3, 0.5] widened by a margin,
# and no two balls interpenetrating by more than a tolerance.
# ---------------------------------------------------------------------------------------------------
LAYOUT_LOW: Final[tuple[float, float]] = (-0.5, -0.3)
LAYOUT_HIGH: Final[tuple[float, float]] = (0.5, 0.5)
WORKBENCH_MARGIN: Final[float] = 0.4
WORKBENCH_LOW: Final[tuple[float, float]] = (LAYOUT_LOW[0] - WORKBENCH_MARGIN, LAYOUT_LOW[1] - WORKBENCH_MARGIN)
WORKBENCH_HIGH: Final[tuple[float, float]] = (LAYOUT_HIGH[0] + WORKBENCH_MARGIN, LAYOUT_HIGH[1] + WORKBENCH_MARGIN)
PENETRATION_TOLERANCE: Final[float] = 0.02  # allowed overlap of two balls (centre distance >= 2R - tol)

# ---------------------------------------------------------------------------------------------------
# Goal encoding
# ---------------------------------------------------------------------------------------------------
KIND_RELATIONAL, KIND_PUSH, KIND_LINE, KIND_GATHER = 0, 1, 2, 3
KIND_NAMES: Final[tuple[str, ...]] = ("relational", "push", "line", "gather")
MAX_CLAUSES: Final[int] = 3
GOAL_DIM: Final[int] = 2 + 3 * MAX_CLAUSES
MAX_SUBCONDITIONS: Final[int] = 4
ENV_TITLE: Final[str] = "CLEVR-Robot"  # in error messages
LEVELS: Final[tuple[str, ...]] = ("train", "rephrase", "easy", "hard")
NUM_HARD_TWO_CLAUSE: Final[int] = 40
NUM_HARD_THREE_CLAUSE: Final[int] = 40


def encode_goal(kind: int, clauses: tuple[tuple[int, int, int], ...] = (), n: int | None = None) -> np.ndarray:
    """One goal vector, (GOAL_DIM,) int32.

    Args:
      kind: one of the ``KIND_*`` constants.
      clauses: up to :data:`MAX_CLAUSES` triples ``(a, b, d)`` (for push: ``(ball, 0, direction)``; for
        gather: ``(centre, 0, 0)``).
      n: number of clauses / sub-conditions; defaults to ``len(clauses)`` (4 for line and gather).
    """
    if len(clauses) > MAX_CLAUSES:
        raise ValueError(f"at most {MAX_CLAUSES} clauses, got {len(clauses)}")
    if n is None:
        n = MAX_SUBCONDITIONS if kind in (KIND_LINE, KIND_GATHER) else len(clauses)
    goal = np.zeros(GOAL_DIM, np.int32)
    goal[0], goal[1] = kind, n
    for i, (a, b, d) in enumerate(clauses):
        goal[2 + 3 * i : 5 + 3 * i] = (a, b, d)
    return goal


def decode_goal(goal: np.ndarray) -> tuple[int, int, tuple[tuple[int, int, int], ...]]:
    """Inverse of :func:`encode_goal` on the host: ``(kind, n, clauses)`` (clauses of relational goals only
    up to ``n``; for push / gather the single stored triple)."""
    goal = np.asarray(goal)
    kind, n = int(goal[0]), int(goal[1])
    stored = {KIND_RELATIONAL: n, KIND_PUSH: 1, KIND_LINE: 0, KIND_GATHER: 1}[kind]
    clauses = tuple(tuple(int(v) for v in goal[2 + 3 * i : 5 + 3 * i]) for i in range(stored))
    return kind, n, clauses  # type: ignore[return-value]


def describe_goal(goal: np.ndarray) -> str:
    """A canonical, human-readable description of a goal vector (for logs; not an instruction)."""
    colours = physics.COLOURS
    kind, _, clauses = decode_goal(goal)
    if kind == KIND_RELATIONAL:
        return " & ".join(f"{colours[a]} {RELATIONS[d]} of {colours[b]}" for a, b, d in clauses)
    if kind == KIND_PUSH:
        return f"push {colours[clauses[0][0]]} {RELATIONS[clauses[0][2]]}"
    if kind == KIND_LINE:
        return "line " + "→".join(colours)
    return f"gather around {colours[clauses[0][0]]}"


# ---------------------------------------------------------------------------------------------------
# Task tables (deterministic)
# ---------------------------------------------------------------------------------------------------
def relational_goals() -> np.ndarray:
    """The 80 train / rephrase goals, (80, GOAL_DIM) int32: ordered pairs (a, b), a != b, × 4 directions,
    in the order a, b, d."""
    goals = [
        encode_goal(KIND_RELATIONAL, ((a, b, d),))
        for a in range(N_BALLS)
        for b in range(N_BALLS)
        if a != b
        for d in range(len(RELATIONS))
    ]
    return np.stack(goals)


def push_goals() -> np.ndarray:
    """The 20 easy goals "push ball a d", (20, GOAL_DIM) int32, in the order a, d."""
    return np.stack([encode_goal(KIND_PUSH, ((a, 0, d),)) for a in range(N_BALLS) for d in range(len(RELATIONS))])


def _is_forest(clauses: tuple[tuple[int, int, int], ...]) -> bool:
    """True when the clauses' undirected ball graph has no repeated pair and no cycle."""
    parent = list(range(N_BALLS))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for a, b, _ in clauses:
        ra, rb = find(a), find(b)
        if ra == rb:
            return False
        parent[ra] = rb
    return True


def _robustly_satisfiable(clauses: tuple[tuple[int, int, int], ...], tries: int = 400) -> bool:
    """Whether a forest of clauses has a satisfying layout *with slack* (angles within ±35°, distances in
    [0.29, 0.35], pairs >= 0.29 apart, in the layout box widened by 0.2; deterministic): goals that fit
    only with balls squeezed at the limits are rejected, since no expert could reach them reliably."""
    rng = np.random.default_rng(12345)
    for _ in range(tries):
        pos: dict[int, np.ndarray] = {}
        pending = list(clauses)
        while pending:
            ready = [c for c in pending if (c[0] in pos) != (c[1] in pos)]
            if not ready:  # start a new tree component
                pos[pending[0][1]] = rng.uniform((-0.3, -0.1), (0.3, 0.3))
                continue
            a, b, d = clause = ready[0]
            angle = math.atan2(RELATION_VECTORS[d, 1], RELATION_VECTORS[d, 0]) + rng.uniform(-0.61, 0.61)
            offset = rng.uniform(0.29, 0.35) * np.array([math.cos(angle), math.sin(angle)])
            if b in pos:
                pos[a] = pos[b] + offset
            else:
                pos[b] = pos[a] - offset
            pending.remove(clause)
        points = np.stack(list(pos.values()))
        gaps = np.linalg.norm(points[:, None] - points[None], axis=-1) + np.eye(len(points)) * 9.0
        inside = np.all(points >= np.array(LAYOUT_LOW) - 0.2) and np.all(points <= np.array(LAYOUT_HIGH) + 0.2)
        if gaps.min() >= 0.29 and inside:
            return True
    return False


def _spread_pick(candidates: list, count: int, stride: int, accept) -> list:
    """Deterministically picks ``count`` accepted candidates visiting them in the order i·stride mod n."""
    n = len(candidates)
    if math.gcd(stride, n) != 1:
        raise ValueError("stride must be coprime with the number of candidates")
    chosen = []
    for i in range(n):
        cand = candidates[(i * stride + 7) % n]
        if accept(cand):
            chosen.append(cand)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"only {len(chosen)} of {count} candidates accepted")


def hard_goals() -> np.ndarray:
    """The hard goals, (82, GOAL_DIM) int32: 40 two-clause and 40 three-clause relational conjunctions
    (forests, robustly satisfiable), then "line" and "gather". Deterministic."""
    clauses = [(a, b, d) for a in range(N_BALLS) for b in range(N_BALLS) if a != b for d in range(len(RELATIONS))]
    two = [c for c in itertools.combinations(clauses, 2) if _is_forest(c)]
    three = [c for c in itertools.combinations(clauses, 3) if _is_forest(c)]

    def accept(c: tuple) -> bool:
        return _robustly_satisfiable(c)

    stride_two = next(s for s in range(997, 5000) if math.gcd(s, len(two)) == 1)
    stride_three = next(s for s in range(7919, 20000) if math.gcd(s, len(three)) == 1)
    chosen_two = _spread_pick(two, NUM_HARD_TWO_CLAUSE, stride_two, accept)
    chosen_three = _spread_pick(three, NUM_HARD_THREE_CLAUSE, stride_three, accept)
    goals = [encode_goal(KIND_RELATIONAL, c) for c in chosen_two + chosen_three]
    goals.append(encode_goal(KIND_LINE))
    goals.append(encode_goal(KIND_GATHER, ((GATHER_CENTRE, 0, 0),)))
    return np.stack(goals)


# level_goals(level) -> the goal table of a level, (K, GOAL_DIM) int32 (read-only; cached). train and
# rephrase share goals.
level_goals = cached_level_goals(ENV_TITLE, {"train": relational_goals, "rephrase": relational_goals,
                                             "easy": push_goals, "hard": hard_goals})


def level_max_steps(level: str) -> int:
    """Episode cap of a level: 1 for easy (one push), 50 otherwise."""
    check_level(ENV_TITLE, level, LEVELS)
    return 1 if level == "easy" else 50


# ---------------------------------------------------------------------------------------------------
# Pure predicates (broadcast over leading dims "...")
# ---------------------------------------------------------------------------------------------------
def balls_of(state: jax.Array) -> jax.Array:
    """(..., 10) state → (..., 5, 2) ball positions."""
    chex.assert_axis_dimension(state, -1, STATE_DIM)
    return state.reshape(state.shape[:-1] + (N_BALLS, 2))


def select_ball(balls: jax.Array, index: jax.Array) -> jax.Array:
    """Position of ball ``index``: balls (..., 5, 2), index (...) int → (..., 2).

    Uses a masked sum rather than a gather, so a non-finite value in another ball does not leak in.
    """
    onehot = jnp.arange(N_BALLS) == jnp.asarray(index)[..., None]
    return jnp.where(onehot[..., None], balls, 0.0).sum(axis=-2)


def relation_holds(a_pos: jax.Array, b_pos: jax.Array, direction: jax.Array) -> jax.Array:
    """"A is <direction> of B": positions (..., 2), direction (...) int in [0, 4) → (...) bool.

    True iff ``0 < |A - B| < 0.39`` and the angle of ``A - B`` is within ±45° (inclusive) of the axis.
    """
    delta = a_pos - b_pos
    dist = jnp.linalg.norm(delta, axis=-1)
    axis = jnp.asarray(RELATION_VECTORS)[direction]
    along = (delta * axis).sum(-1)
    in_sector = along >= dist * math.cos(SECTOR_HALF_ANGLE) * (1.0 - 1e-6)
    return in_sector & (dist > 0.0) & (dist < RELATION_MAX_DISTANCE)


def clause_fields(goal: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """goal (..., G) → a, b, d each (..., MAX_CLAUSES) int32."""
    clauses = goal[..., 2:].reshape(goal.shape[:-1] + (MAX_CLAUSES, 3))
    return clauses[..., 0], clauses[..., 1], clauses[..., 2]


def clause_distances(state: jax.Array, goal: jax.Array) -> jax.Array:
    """|A_i - B_i| for each relational clause slot: state (..., 10), goal (..., G) → (..., MAX_CLAUSES)."""
    balls = balls_of(state)
    a, b, _ = clause_fields(goal)
    balls_c = balls[..., None, :, :]
    return jnp.linalg.norm(select_ball(balls_c, a) - select_ball(balls_c, b), axis=-1)


def subconditions(state: jax.Array, goal: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Sub-conditions of a state-based goal: state (..., 10), goal (..., G) →
    (satisfied (..., 4) bool, valid (..., 4) bool).

    relational: the n clauses; line: the 4 consecutive pairs; gather: the 4 non-centre balls; push: none
    (success of a push goal depends on the action, see :func:`success`).
    """
    chex.assert_axis_dimension(goal, -1, GOAL_DIM)
    balls = balls_of(state)
    kind, n = goal[..., 0], goal[..., 1]
    slots = jnp.arange(MAX_SUBCONDITIONS)

    # Relational clauses (3 slots, padded to 4).
    a, b, d = clause_fields(goal)
    balls_c = balls[..., None, :, :]
    rel = relation_holds(select_ball(balls_c, a), select_ball(balls_c, b), d)
    rel = jnp.concatenate([rel, jnp.zeros(rel.shape[:-1] + (1,), bool)], axis=-1)

    # Line: ball i+1 within ±30° of +x from ball i.
    step = balls[..., 1:, :] - balls[..., :-1, :]
    step_len = jnp.linalg.norm(step, axis=-1)
    line = (step[..., 0] >= step_len * math.cos(LINE_HALF_ANGLE) * (1.0 - 1e-6)) & (step_len > 0.0)

    # Gather: each non-centre ball within GATHER_RADIUS of the centre ball.
    centre = goal[..., 2]
    others = slots + (slots >= centre[..., None]).astype(slots.dtype)  # (..., 4) indices != centre
    centre_pos = select_ball(balls, centre)[..., None, :]
    other_pos = select_ball(balls[..., None, :, :], others)
    gather = jnp.linalg.norm(other_pos - centre_pos, axis=-1) < GATHER_RADIUS

    k = kind[..., None]
    satisfied = jnp.where(k == KIND_RELATIONAL, rel, jnp.where(k == KIND_LINE, line, jnp.where(k == KIND_GATHER, gather, False)))
    valid = jnp.where(k == KIND_PUSH, False, slots < n[..., None])
    return satisfied & valid, valid


def num_satisfied(state: jax.Array, goal: jax.Array) -> jax.Array:
    """Number of satisfied sub-conditions: state (..., 10), goal (..., G) → (...) int32."""
    satisfied, _ = subconditions(state, goal)
    return satisfied.sum(-1).astype(jnp.int32)


def state_satisfied(state: jax.Array, goal: jax.Array) -> jax.Array:
    """Whether a state alone satisfies a state-based goal (always False for push goals): (...) bool."""
    satisfied, valid = subconditions(state, goal)
    return jnp.all(satisfied | ~valid, axis=-1) & (goal[..., 0] != KIND_PUSH)


def push_matches(action: jax.Array, goal: jax.Array) -> jax.Array:
    """Easy-goal predicate: action (...) int in [0, 40), goal (..., G) → (...) bool: the pushed ball is
    ``a0`` and the push direction is compatible with ``d0`` (see :data:`PUSH_COMPATIBLE`)."""
    ball, direction = physics.decode_action(jnp.asarray(action))
    compatible = jnp.asarray(PUSH_COMPATIBLE)[goal[..., 4], direction]
    return (ball == goal[..., 2]) & compatible


def success(prev_state: jax.Array, action: jax.Array, next_state: jax.Array, goal: jax.Array) -> jax.Array:
    """Task success of the transition (prev_state (..., 10), action (...), next_state (..., 10), goal (..., G))
    -> (...) bool: push goals :func:`push_matches`; every other kind: all sub-conditions hold in ``next_state``."""
    del prev_state
    is_push = goal[..., 0] == KIND_PUSH
    return jnp.where(is_push, push_matches(action, goal), state_satisfied(next_state, goal))


def reward(prev_state: jax.Array, action: jax.Array, next_state: jax.Array, goal: jax.Array) -> jax.Array:
    """Reward of the transition (prev_state, action) → next_state, (...) float32.

    * relational, one clause (train / rephrase): ``10 · (|A-B|(prev) - |A-B|(next))``;
    * push (easy): 1.0 on success, else 0.0;
    * relational with 2–3 clauses, line, gather (hard): ``10 · (#satisfied(next) - #satisfied(prev))``,
      computed on this very transition (no lag).
    """
    chex.assert_axis_dimension(prev_state, -1, STATE_DIM)
    kind, n = goal[..., 0], goal[..., 1]
    dist_prev = clause_distances(prev_state, goal)[..., 0]
    dist_next = clause_distances(next_state, goal)[..., 0]
    distance_reward = RELATIONAL_REWARD_SCALE * (dist_prev - dist_next)
    count_reward = SUBCONDITION_REWARD_SCALE * (num_satisfied(next_state, goal) - num_satisfied(prev_state, goal)).astype(jnp.float32)
    push_reward = push_matches(action, goal).astype(jnp.float32)
    out = jnp.where(
        kind == KIND_PUSH, push_reward, jnp.where((kind == KIND_RELATIONAL) & (n == 1), distance_reward, count_reward)
    )
    return out.astype(jnp.float32)


def legal(state: jax.Array) -> jax.Array:
    """Physical plausibility of a state: (..., 10) → (...) bool.

    True iff every coordinate is finite, every ball lies in the workbench
    ``[WORKBENCH_LOW, WORKBENCH_HIGH]`` (the layout box widened by :data:`WORKBENCH_MARGIN`), and no two
    balls overlap by more than :data:`PENETRATION_TOLERANCE` (centre distance >= 2R - tol).
    """
    balls = balls_of(state)
    finite = jnp.all(jnp.isfinite(state), axis=-1)
    low, high = jnp.asarray(WORKBENCH_LOW), jnp.asarray(WORKBENCH_HIGH)
    inside = jnp.all((balls >= low) & (balls <= high), axis=(-2, -1))
    gaps = jnp.linalg.norm(balls[..., :, None, :] - balls[..., None, :, :], axis=-1)
    gaps = gaps + jnp.eye(N_BALLS) * 1e3
    separated = jnp.all(gaps >= 2 * BALL_RADIUS - PENETRATION_TOLERANCE, axis=(-2, -1))
    return finite & inside & separated
