"""BabyAI goals, goal encoding, task tables and the pure success / reward / legality predicates, on state
vectors (..., 17) (:mod:`grid` layout) or :class:`grid.Grid` fields, elementwise over leading dims.

Goal vector (GOAL_DIM = 7) int32 ``[kind, object_a, colour_a, object_b, colour_b, door_colour, wall_side]``;
colours 0..5 or ``ANY_COLOUR``; wall sides west, east, north, south, any; unread slots 0. Success on the
reached state (X = object_a of colour_a, Y = object_b of colour_b, d Manhattan):
train GO_TO (X on the floor, d(agent, X) <= 1), OPEN, PICK_UP (carrying X), PUT_NEXT (X, Y on the floor,
d(X, Y) = 1); easy OPEN_GO_TO, OPEN_PICK_UP, GO_TO_WALL, GO_TO_CENTRE; hard UNLOCK (door open, carrying its
key), LINE (the three objects in a row or column), PILE (in one 2 × 2 block).

Reward at step t (1-based) of T = 128: ``1 - 0.9 t / T`` on success, else ``0.1 (φ(s) - φ(s'))`` with φ
the task's Manhattan distance to go (:func:`potential_grid`). Full table: docs/envs.md, "BabyAI".
"""

from __future__ import annotations

import functools
from typing import Final, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.envs.base import cached_level_goals, check_level
from imaginejax.envs.babyai import grid as G

STATE_DIM: Final[int] = G.STATE_DIM
NUM_ACTIONS: Final[int] = G.NUM_ACTIONS
ENV_TITLE: Final[str] = "BabyAI"  # in error messages
LEVELS: Final[tuple[str, ...]] = ("train", "rephrase", "easy", "hard")
MAX_STEPS: Final[int] = 128
SUCCESS_REWARD: Final[float] = 1.0
SUCCESS_TIME_PENALTY: Final[float] = 0.9
SHAPING_SCALE: Final[float] = 0.1

# ---------------------------------------------------------------------------------------------------
# Goal encoding
# ---------------------------------------------------------------------------------------------------
(
    KIND_GO_TO,
    KIND_OPEN,
    KIND_PICK_UP,
    KIND_PUT_NEXT,
    KIND_OPEN_GO_TO,
    KIND_OPEN_PICK_UP,
    KIND_GO_TO_WALL,
    KIND_GO_TO_CENTRE,
    KIND_UNLOCK,
    KIND_LINE,
    KIND_PILE,
) = range(11)
KIND_NAMES: Final[tuple[str, ...]] = (
    "go_to", "open", "pick_up", "put_next", "open_go_to", "open_pick_up",
    "go_to_wall", "go_to_centre", "unlock", "line", "pile",
)
NUM_KINDS: Final[int] = len(KIND_NAMES)
LEVEL_KINDS: Final[dict[str, tuple[int, ...]]] = {
    "train": (KIND_GO_TO, KIND_OPEN, KIND_PICK_UP, KIND_PUT_NEXT),
    "rephrase": (KIND_GO_TO, KIND_OPEN, KIND_PICK_UP, KIND_PUT_NEXT),
    "easy": (KIND_OPEN_GO_TO, KIND_OPEN_PICK_UP, KIND_GO_TO_WALL, KIND_GO_TO_CENTRE),
    "hard": (KIND_UNLOCK, KIND_LINE, KIND_PILE),
}

GOAL_DIM: Final[int] = 7
SLOT_KIND, SLOT_OBJECT_A, SLOT_COLOUR_A, SLOT_OBJECT_B, SLOT_COLOUR_B, SLOT_DOOR_COLOUR, SLOT_SIDE = range(GOAL_DIM)
ANY_COLOUR: Final[int] = G.NUM_COLOURS  # 6
SIDE_WEST, SIDE_EAST, SIDE_NORTH, SIDE_SOUTH, SIDE_ANY = range(5)
SIDE_NAMES: Final[tuple[str, ...]] = ("west", "east", "north", "south", "any")
CENTRE_CELLS: Final[tuple[int, int]] = (3, 4)  # x and y of the 2 × 2 centre block

# Kinds that name object X / object Y / the door's colour / need the door closed (or locked) at reset.
KINDS_WITH_OBJECT_A: Final[tuple[int, ...]] = (KIND_GO_TO, KIND_PICK_UP, KIND_PUT_NEXT, KIND_OPEN_GO_TO, KIND_OPEN_PICK_UP)
KINDS_WITH_OBJECT_B: Final[tuple[int, ...]] = (KIND_PUT_NEXT,)
KINDS_WITH_DOOR: Final[tuple[int, ...]] = (KIND_OPEN, KIND_OPEN_GO_TO, KIND_OPEN_PICK_UP, KIND_UNLOCK)


def encode_goal(
    kind: int,
    *,
    object_a: int = 0,
    colour_a: int = 0,
    object_b: int = 0,
    colour_b: int = 0,
    door_colour: int = 0,
    side: int = 0,
) -> np.ndarray:
    """One goal vector, (GOAL_DIM,) int32 (slots in the module docstring)."""
    if not 0 <= kind < NUM_KINDS:
        raise ValueError(f"unknown goal kind {kind}; valid kinds are 0..{NUM_KINDS - 1} ({', '.join(KIND_NAMES)})")
    return np.array([kind, object_a, colour_a, object_b, colour_b, door_colour, side], np.int32)


def describe_goal(goal: np.ndarray) -> str:
    """A canonical, human-readable description of a goal vector (for logs; not an instruction)."""
    kind, oa, ca, ob, cb, dc, side = (int(v) for v in np.asarray(goal))
    colour = lambda c: "any-colour" if c == ANY_COLOUR else G.COLOURS[c]  # noqa: E731
    x = f"{colour(ca)} {G.OBJECT_NAMES[oa]}"
    door = f"{colour(dc)} door"
    return {
        KIND_GO_TO: f"go to {x}",
        KIND_OPEN: f"open {door}",
        KIND_PICK_UP: f"pick up {x}",
        KIND_PUT_NEXT: f"put {x} next to {colour(cb)} {G.OBJECT_NAMES[ob]}",
        KIND_OPEN_GO_TO: f"open {door}, then go to {x}",
        KIND_OPEN_PICK_UP: f"open {door}, then pick up {x}",
        KIND_GO_TO_WALL: f"go to {SIDE_NAMES[side]} wall",
        KIND_GO_TO_CENTRE: "go to the centre",
        KIND_UNLOCK: f"pick up the key, then open the locked {door}",
        KIND_LINE: "put the three objects in a line",
        KIND_PILE: "gather the three objects into a pile",
    }[kind]


# ---------------------------------------------------------------------------------------------------
# Task tables (deterministic)
# ---------------------------------------------------------------------------------------------------
OBJECT_PAIRS: Final[tuple[tuple[int, int], ...]] = tuple((a, b) for a in G.OBJECTS for b in G.OBJECTS if a != b)


def _interleave(groups: list[list[np.ndarray]]) -> np.ndarray:
    """Round-robin over the groups (one per template), so that any prefix of the table — round-robin
    evaluation with fewer episodes than tasks — covers every template evenly."""
    out: list[np.ndarray] = []
    for i in range(max(len(g) for g in groups)):
        out.extend(g[i] for g in groups if i < len(g))
    return np.stack(out)


def _objects_by_colour() -> list[tuple[int, int]]:
    """(object, colour) for every colour and object, colour-major: 18 pairs."""
    return [(o, c) for c in range(G.NUM_COLOURS) for o in G.OBJECTS]


def train_goals() -> np.ndarray:
    """The 78 train / rephrase goals, (78, GOAL_DIM) int32, interleaved over the templates: go to X 18, open
    the door 6, pick up X 18, put X next to Y 36 (Y's colour ``(colour_X + 1 + pair) mod 6``)."""
    go_to = [encode_goal(KIND_GO_TO, object_a=o, colour_a=c) for o, c in _objects_by_colour()]
    open_ = [encode_goal(KIND_OPEN, door_colour=c) for c in range(G.NUM_COLOURS)]
    pick = [encode_goal(KIND_PICK_UP, object_a=o, colour_a=c) for o, c in _objects_by_colour()]
    put = [
        encode_goal(KIND_PUT_NEXT, object_a=a, colour_a=ca, object_b=b, colour_b=(ca + 1 + p) % G.NUM_COLOURS)
        for ca in range(G.NUM_COLOURS)
        for p, (a, b) in enumerate(OBJECT_PAIRS)
    ]
    return _interleave([go_to, open_, pick, put])


def easy_goals() -> np.ndarray:
    """The 42 easy goals, (42, GOAL_DIM) int32, interleaved over the templates: open the door then go to
    X 18, open the door then pick up X 18, go to a wall 5, go to the centre 1."""
    open_go = [encode_goal(KIND_OPEN_GO_TO, object_a=o, colour_a=c, door_colour=ANY_COLOUR) for o, c in _objects_by_colour()]
    open_pick = [encode_goal(KIND_OPEN_PICK_UP, object_a=o, colour_a=c, door_colour=ANY_COLOUR) for o, c in _objects_by_colour()]
    wall = [encode_goal(KIND_GO_TO_WALL, side=s) for s in range(len(SIDE_NAMES))]
    centre = [encode_goal(KIND_GO_TO_CENTRE)]
    return _interleave([open_go, open_pick, wall, centre])


def hard_goals() -> np.ndarray:
    """The 3 hard goals, (3, GOAL_DIM) int32: pick up the key then open the locked door (any colour; the
    key has the door's colour), put the three objects in a line, gather them into a pile."""
    return np.stack([
        encode_goal(KIND_UNLOCK, door_colour=ANY_COLOUR),
        encode_goal(KIND_LINE),
        encode_goal(KIND_PILE),
    ])


# level_goals(level) -> the goal table of a level, (K, GOAL_DIM) int32 (read-only; cached). train and
# rephrase share goals.
level_goals = cached_level_goals(ENV_TITLE, {"train": train_goals, "rephrase": train_goals, "easy": easy_goals,
                                             "hard": hard_goals})


def level_max_steps(level: str) -> int:
    """Episode cap of a level: 128 steps at every level."""
    check_level(ENV_TITLE, level, LEVELS)
    return MAX_STEPS


# ---------------------------------------------------------------------------------------------------
# Goal fields and shared quantities
# ---------------------------------------------------------------------------------------------------
class Goal(NamedTuple):
    """The slots of goal vectors as separate int32 arrays (...)."""

    kind: jax.Array
    object_a: jax.Array
    colour_a: jax.Array
    object_b: jax.Array
    colour_b: jax.Array
    door_colour: jax.Array
    side: jax.Array


def goal_fields(goal: jax.Array) -> Goal:
    """(..., GOAL_DIM) int goal vectors → :class:`Goal` of (...) int32 fields."""
    goal = jnp.asarray(goal, jnp.int32)
    if goal.ndim == 0 or goal.shape[-1] != GOAL_DIM:
        raise ValueError(f"BabyAI goal vectors have {GOAL_DIM} entries, got shape {goal.shape}")
    return Goal(*(goal[..., i] for i in range(GOAL_DIM)))


def _colour_ok(colour: jax.Array, wanted: jax.Array) -> jax.Array:
    return (wanted == ANY_COLOUR) | (colour == wanted)


def is_kind(kind: jax.Array, kinds: tuple[int, ...]) -> jax.Array:
    out = kind == kinds[0]
    for k in kinds[1:]:
        out = out | (kind == k)
    return out


class _Parts(NamedTuple):
    """Per-state quantities shared by the predicates and potentials (all (...))."""

    a_floor: jax.Array  # X not carried
    a_held: jax.Array  # X carried (and of the right colour)
    a_colour_ok: jax.Array
    d_agent_a: jax.Array  # d(agent, X_eff)
    b_floor: jax.Array
    b_colour_ok: jax.Array
    d_agent_b: jax.Array  # d(agent, Y_eff)
    d_a_b: jax.Array  # d(X_eff, Y_eff)
    carrying_other_a: jax.Array  # carrying something that is not X
    door_open: jax.Array  # open and of the right colour
    door_colour_ok: jax.Array
    d_agent_door: jax.Array
    d_door_a: jax.Array  # d(cell in front of the door, X_eff)
    extent_w: jax.Array  # x-extent of the three objects (effective positions)
    extent_h: jax.Array
    n_carried: jax.Array  # 0 or 1
    distinct: jax.Array  # the three effective cells are distinct


def _parts(g: G.Grid, goal: Goal) -> _Parts:
    ex, ey = zip(*(G.effective_position(g, s) for s in range(G.NUM_OBJECTS)))
    ax, ay = g.agent_x, g.agent_y
    xa, ya = G.select_object(ex, goal.object_a), G.select_object(ey, goal.object_a)
    xb, yb = G.select_object(ex, goal.object_b), G.select_object(ey, goal.object_b)
    a_colour_ok = _colour_ok(G.select_object(g.colour, goal.object_a), goal.colour_a)
    b_colour_ok = _colour_ok(G.select_object(g.colour, goal.object_b), goal.colour_b)
    door_colour_ok = _colour_ok(g.door_colour, goal.door_colour)
    front_x = g.door_x - 1  # the interior cell in front of the door
    w = jnp.maximum(jnp.maximum(ex[0], ex[1]), ex[2]) - jnp.minimum(jnp.minimum(ex[0], ex[1]), ex[2])
    h = jnp.maximum(jnp.maximum(ey[0], ey[1]), ey[2]) - jnp.minimum(jnp.minimum(ey[0], ey[1]), ey[2])
    same = lambda i, j: (ex[i] == ex[j]) & (ey[i] == ey[j])  # noqa: E731
    return _Parts(
        a_floor=g.carried != goal.object_a,
        a_held=(g.carried == goal.object_a) & a_colour_ok,
        a_colour_ok=a_colour_ok,
        d_agent_a=G.manhattan(ax, ay, xa, ya),
        b_floor=g.carried != goal.object_b,
        b_colour_ok=b_colour_ok,
        d_agent_b=G.manhattan(ax, ay, xb, yb),
        d_a_b=G.manhattan(xa, ya, xb, yb),
        carrying_other_a=(g.carried != G.NOTHING) & (g.carried != goal.object_a),
        door_open=(g.door_state == G.OPEN) & door_colour_ok,
        door_colour_ok=door_colour_ok,
        d_agent_door=G.manhattan(ax, ay, g.door_x, g.door_y),
        d_door_a=G.manhattan(front_x, g.door_y, xa, ya),
        extent_w=w,
        extent_h=h,
        n_carried=(g.carried != G.NOTHING).astype(jnp.int32),
        distinct=~(same(0, 1) | same(0, 2) | same(1, 2)),
    )


def _select_kind(kind: jax.Array, values: tuple[jax.Array, ...]) -> jax.Array:
    """values[kind] elementwise (a select chain; values has NUM_KINDS entries of shape (...))."""
    out = values[-1]
    for k in range(NUM_KINDS - 2, -1, -1):
        out = jnp.where(kind == k, values[k], out)
    return out


# ---------------------------------------------------------------------------------------------------
# Predicates on Grid fields (used by the environment kernel and the expert)
# ---------------------------------------------------------------------------------------------------
def success_grid(g: G.Grid, goal: Goal) -> jax.Array:
    """Whether state ``g`` satisfies ``goal``: (...) bool."""
    p = _parts(g, goal)
    ax, ay = g.agent_x, g.agent_y
    near_a = p.a_floor & p.a_colour_ok & (p.d_agent_a <= 1)
    all_floor = g.carried == G.NOTHING
    walls = (ax == G.ROOM_MIN, ax == G.ROOM_MAX, ay == G.ROOM_MIN, ay == G.ROOM_MAX)
    on_wall = jnp.where(
        goal.side == SIDE_WEST, walls[0],
        jnp.where(goal.side == SIDE_EAST, walls[1],
                  jnp.where(goal.side == SIDE_NORTH, walls[2],
                            jnp.where(goal.side == SIDE_SOUTH, walls[3], walls[0] | walls[1] | walls[2] | walls[3]))))
    lo, hi = CENTRE_CELLS
    centre = (ax >= lo) & (ax <= hi) & (ay >= lo) & (ay <= hi)
    key_held = (g.carried == G.KEY) & (g.colour[2] == g.door_colour)
    values = (
        near_a,  # GO_TO
        p.door_open,  # OPEN
        p.a_held,  # PICK_UP
        p.a_floor & p.b_floor & p.a_colour_ok & p.b_colour_ok & (p.d_a_b == 1),  # PUT_NEXT
        p.door_open & near_a,  # OPEN_GO_TO
        p.door_open & p.a_held,  # OPEN_PICK_UP
        on_wall,  # GO_TO_WALL
        centre,  # GO_TO_CENTRE
        p.door_open & key_held,  # UNLOCK
        all_floor & p.distinct & ((p.extent_w == 0) | (p.extent_h == 0)),  # LINE
        all_floor & p.distinct & (p.extent_w <= 1) & (p.extent_h <= 1),  # PILE
    )
    return _select_kind(goal.kind, values) & (goal.kind >= 0) & (goal.kind < NUM_KINDS)


def potential_grid(g: G.Grid, goal: Goal) -> jax.Array:
    """Task-specific Manhattan distance to go φ, with a carried object where the agent is: (...) int32, >= 0,
    0 on success."""
    p = _parts(g, goal)
    ax, ay = g.agent_x, g.agent_y
    relu = lambda v: jnp.maximum(v, 0)  # noqa: E731
    carry_other = p.carrying_other_a.astype(jnp.int32)
    a_held = (~p.a_floor).astype(jnp.int32)
    door_closed = (g.door_state != G.OPEN).astype(jnp.int32)

    go_to = relu(p.d_agent_a - 1) + a_held
    door_term = door_closed * (relu(p.d_agent_door - 1) + 1)
    pick = jnp.where(p.a_floor, p.d_agent_a + 1 + carry_other, 0)
    carrying_b = (~p.b_floor).astype(jnp.int32)
    put = carrying_b + jnp.where(
        p.a_floor,
        p.d_agent_a + 1 + relu(p.d_a_b - 1) + 1 + ((g.carried != G.NOTHING) & p.b_floor).astype(jnp.int32),
        relu(p.d_agent_b - 1) + 1,
    )
    open_go = jnp.where(door_closed == 1, door_term + relu(p.d_door_a - 1) + a_held, go_to)
    open_pick = jnp.where(door_closed == 1, door_term + jnp.where(p.a_floor, p.d_door_a + 1 + carry_other, 0), pick)
    west, east = ax - G.ROOM_MIN, G.ROOM_MAX - ax
    north, south = ay - G.ROOM_MIN, G.ROOM_MAX - ay
    wall = jnp.where(
        goal.side == SIDE_WEST, west,
        jnp.where(goal.side == SIDE_EAST, east,
                  jnp.where(goal.side == SIDE_NORTH, north,
                            jnp.where(goal.side == SIDE_SOUTH, south,
                                      jnp.minimum(jnp.minimum(west, east), jnp.minimum(north, south))))))
    lo, hi = CENTRE_CELLS
    centre = relu(lo - ax) + relu(ax - hi) + relu(lo - ay) + relu(ay - hi)
    kx, ky = G.effective_position(g, 2)
    holding_key = g.carried == G.KEY
    other_than_key = ((g.carried != G.NOTHING) & ~holding_key).astype(jnp.int32)
    d_key = G.manhattan(ax, ay, kx, ky)
    d_key_door = G.manhattan(kx, ky, g.door_x, g.door_y)
    unlock = jnp.where(holding_key, 0, d_key + 1 + other_than_key) + door_closed * (relu(d_key_door - 1) + 1)
    line = jnp.minimum(p.extent_w, p.extent_h) + p.n_carried
    pile = jnp.abs(p.extent_w - 1) + jnp.abs(p.extent_h - 1) + p.n_carried
    values = (go_to, door_term, pick, put, open_go, open_pick, wall, centre, unlock, line, pile)
    phi = _select_kind(goal.kind, tuple(jnp.asarray(v, jnp.int32) for v in values))
    return jnp.where(success_grid(g, goal), 0, phi).astype(jnp.int32)


def reward_grid(prev: G.Grid, nxt: G.Grid, goal: Goal, t: jax.Array, max_steps: int = MAX_STEPS) -> jax.Array:
    """Reward of ``prev → nxt`` at step ``t`` (1-based): ``1 - 0.9 t / T`` on success, else
    ``SHAPING_SCALE (φ(prev) - φ(nxt))``; (...) float32."""
    succeeded = success_grid(nxt, goal)
    on_success = SUCCESS_REWARD - SUCCESS_TIME_PENALTY * jnp.asarray(t, jnp.float32) / float(max_steps)
    shaped = SHAPING_SCALE * (potential_grid(prev, goal) - potential_grid(nxt, goal)).astype(jnp.float32)
    return jnp.where(succeeded, on_success, shaped).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------------
# Public predicates on state vectors (broadcast over leading dims "...")
# ---------------------------------------------------------------------------------------------------
def success(prev_state: jax.Array, action: jax.Array, next_state: jax.Array, goal: jax.Array) -> jax.Array:
    """Task success of the transition (prev_state, action) → next_state (..., 17), goal (..., GOAL_DIM) ->
    (...) bool; only the reached state matters."""
    del prev_state, action
    return success_grid(G.from_vector(next_state), goal_fields(goal))


def state_satisfied(state: jax.Array, goal: jax.Array) -> jax.Array:
    """Whether a state satisfies a goal: (..., 17), (..., GOAL_DIM) → (...) bool."""
    return success_grid(G.from_vector(state), goal_fields(goal))


def potential(state: jax.Array, goal: jax.Array) -> jax.Array:
    """Task-specific distance to go φ: (..., 17), (..., GOAL_DIM) → (...) int32."""
    return potential_grid(G.from_vector(state), goal_fields(goal))


def reward(
    prev_state: jax.Array,
    action: jax.Array,
    next_state: jax.Array,
    goal: jax.Array,
    t: jax.Array,
    max_steps: int = MAX_STEPS,
) -> jax.Array:
    """Reward of the transition (prev_state, action) → next_state taken as step ``t`` of an episode.

    Args:
      prev_state, next_state: (..., 17).
      action: (...) int (unused).
      goal: (..., GOAL_DIM) int32.
      t: (...) int, steps taken including this one (1 for the first step of an episode).
      max_steps: T, the episode cap (128).
    Returns: (...) float32.
    """
    del action
    return reward_grid(G.from_vector(prev_state), G.from_vector(next_state), goal_fields(goal), t, max_steps)


def violations(states: jax.Array) -> dict[str, jax.Array]:
    """Why BabyAI states are illegal: (..., 17) -> {category: (...) bool}.

    The rules a state must keep, one mask per cause (:func:`legal` is their conjunction): ``non-finite or
    non-integer``; ``colour, carried type or door state out of range``; ``carried object not at (0, 0)``;
    ``carried colour not the carried object's``; ``floor object outside the interior`` (an object not
    carried off the cells [ROOM_MIN, ROOM_MAX]²); ``two floor objects on one cell``; ``nothing carried,
    colour not 0``; ``agent or door off its cells`` (agent outside the interior, door not at x = DOOR_X
    with y in [ROOM_MIN, ROOM_MAX]). The relational causes are judged on the rounded fields, as ``legal``
    does; a non-finite state is only counted as non-finite.
    """
    states = jnp.asarray(states)
    if jnp.issubdtype(states.dtype, jnp.floating):
        finite = jnp.all(jnp.isfinite(states), axis=-1)
        integral = jnp.all(jnp.abs(states - jnp.round(states)) < 1e-4, axis=-1)
        states = jnp.where(jnp.isfinite(states), states, 0.0)
    else:
        finite = integral = jnp.ones(states.shape[:-1], bool)
    g = G.from_vector(jnp.clip(states, -1e6, 1e6))
    any_of = lambda masks: functools.reduce(jnp.logical_or, masks)  # noqa: E731
    colour_off = lambda c: (c < 0) | (c >= G.NUM_COLOURS)  # noqa: E731
    held = [g.carried == obj for obj in G.OBJECTS]
    pairs = [(i, j) for i in range(G.NUM_OBJECTS) for j in range(i + 1, G.NUM_OBJECTS)]
    causes = {
        "colour, carried type or door state out of range": any_of(
            [colour_off(c) for c in (g.door_colour, *g.colour)]
            + [(g.carried < G.NOTHING) | (g.carried > G.KEY), (g.door_state < G.OPEN) | (g.door_state > G.LOCKED)]),
        "carried object not at (0, 0)": any_of(
            [h & ((x != 0) | (y != 0)) for h, x, y in zip(held, g.x, g.y)]),
        "carried colour not the carried object's": any_of(
            [h & (g.carried_colour != c) for h, c in zip(held, g.colour)]),
        "floor object outside the interior": any_of(
            [~h & ~G.in_room(x, y) for h, x, y in zip(held, g.x, g.y)]),
        "two floor objects on one cell": any_of(
            [~held[i] & ~held[j] & (g.x[i] == g.x[j]) & (g.y[i] == g.y[j]) for i, j in pairs]),
        "nothing carried, colour not 0": (g.carried == G.NOTHING) & (g.carried_colour != 0),
        "agent or door off its cells": (
            ~G.in_room(g.agent_x, g.agent_y) | (g.door_x != G.DOOR_X)
            | (g.door_y < G.ROOM_MIN) | (g.door_y > G.ROOM_MAX)),
    }
    return {"non-finite or non-integer": ~(finite & integral)} | {
        name: finite & mask for name, mask in causes.items()}


def legal(state: jax.Array) -> jax.Array:
    """Whether a state vector describes a reachable-looking world: (..., 17) → (...) bool. Integral finite
    values, colours 0..5, each object on an interior cell or (exactly the carried one) at (0, 0), floor
    objects on distinct cells, carried colour consistent, door at x = 7 with y ∈ [1, 6], agent interior:
    no cause of :func:`violations`."""
    return ~functools.reduce(jnp.logical_or, violations(state).values())


